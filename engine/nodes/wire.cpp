#include "nodes/wire.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tessera::nodes {

namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text() {
  return std::strerror(errno);
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

sockaddr_in ipv4(const std::string& address, std::uint16_t port, const std::string& what) {
  sockaddr_in out{};
  out.sin_family = AF_INET;
  out.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &out.sin_addr) != 1)
    throw_invalid(what + " \"" + address + "\" is not an IPv4 address");
  return out;
}

std::string address_text(const in_addr& address) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address, text, sizeof text);
  return text;
}

// Waits until `fd` is ready for `events` or `deadline` passes; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, remaining_ms(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) throw_io("poll failed: " + errno_text());
  }
}

void send_all(const Socket& socket, const char* data, std::size_t size,
              Clock::time_point deadline) {
  while (size > 0) {
    if (!wait_for(socket.fd(), POLLOUT, deadline))
      throw_io("sending to " + socket.peer_address() + " timed out");
    const ssize_t sent = ::send(socket.fd(), data, size, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw_io("sending to " + socket.peer_address() + " failed: " + errno_text());
    }
    data += sent;
    size -= static_cast<std::size_t>(sent);
  }
}

namespace {

// "a.b.c.d:port" of a connected socket, for messages: several agents may answer on one address.
std::string peer_endpoint(const Socket& socket) {
  sockaddr_in address{};
  socklen_t length = sizeof address;
  if (::getpeername(socket.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0)
    return "the peer";
  return address_text(address.sin_addr) + ":" + std::to_string(ntohs(address.sin_port));
}

}  // namespace

void receive_exact(const Socket& socket, char* data, std::size_t size, Clock::time_point deadline) {
  while (size > 0) {
    if (!wait_for(socket.fd(), POLLIN, deadline))
      throw_io("no answer from " + peer_endpoint(socket) + " in time",
               "check that a tessera-cli agent (not another program) listens there, and that "
               "it is not stopped");
    const ssize_t got = ::recv(socket.fd(), data, size, 0);
    if (got == 0) throw_io(socket.peer_address() + " closed the connection");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw_io("receiving from " + socket.peer_address() + " failed: " + errno_text());
    }
    data += got;
    size -= static_cast<std::size_t>(got);
  }
}

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

std::uint16_t Socket::local_port() const {
  sockaddr_in address{};
  socklen_t length = sizeof address;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw_io("getsockname failed: " + errno_text());
  return ntohs(address.sin_port);
}

std::string Socket::peer_address() const {
  sockaddr_in address{};
  socklen_t length = sizeof address;
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "the peer";
  return address_text(address.sin_addr);
}

Socket tcp_listen(const std::string& address, std::uint16_t port) {
  const sockaddr_in where = ipv4(address, port, "the bind address");
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) throw_io("cannot create a TCP socket: " + errno_text());
  const int on = 1;
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&where), sizeof where) != 0)
    throw Error(ErrorKind::Io,
                "cannot listen on " + address + ":" + std::to_string(port) + ": " + errno_text(),
                errno == EADDRINUSE ? "another program (or agent) uses this port: pass --port"
                                    : "the address must be one of this machine's (ip -4 addr)");
  if (::listen(socket.fd(), 16) != 0) throw_io("listen failed: " + errno_text());
  return socket;
}

std::optional<Socket> tcp_accept(const Socket& listener, Milliseconds timeout) {
  if (!wait_for(listener.fd(), POLLIN, Clock::now() + timeout)) return std::nullopt;
  const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return std::nullopt;  // the peer gave up meanwhile, or EINTR: try again later
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  return Socket(fd);
}

Socket tcp_connect(const std::string& host, std::uint16_t port, Milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int status = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); status != 0)
    throw Error(ErrorKind::Io, "cannot resolve \"" + host + "\": " + ::gai_strerror(status),
                "give the node's IPv4 address");
  sockaddr_in where = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  where.sin_port = htons(port);
  const std::string target = host + ":" + std::to_string(port);
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!socket.valid()) throw_io("cannot create a TCP socket: " + errno_text());
  const std::string hint =
      "check that `tessera-cli agent` runs there, bound to this address and port, and that no "
      "firewall blocks the port";
  if (::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&where), sizeof where) != 0) {
    if (errno != EINPROGRESS)
      throw Error(ErrorKind::Io, "cannot connect to " + target + ": " + errno_text(), hint);
    if (!wait_for(socket.fd(), POLLOUT, Clock::now() + timeout))
      throw Error(ErrorKind::Io, "connecting to " + target + " timed out", hint);
    int error = 0;
    socklen_t length = sizeof error;
    ::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0)
      throw Error(ErrorKind::Io, "cannot connect to " + target + ": " + std::strerror(error), hint);
  }
  const int on = 1;
  ::setsockopt(socket.fd(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  return socket;
}

void send_message(const Socket& socket, const nlohmann::json& message, Milliseconds timeout) {
  const std::string body = message.dump();
  if (body.size() > kMaxMessageBytes)
    throw Error(ErrorKind::Internal, "message of " + std::to_string(body.size()) +
                                         " bytes is over the limit of " +
                                         std::to_string(kMaxMessageBytes));
  const std::uint32_t size = static_cast<std::uint32_t>(body.size());
  const char header[4] = {static_cast<char>(size >> 24), static_cast<char>(size >> 16),
                          static_cast<char>(size >> 8), static_cast<char>(size)};
  const auto deadline = Clock::now() + timeout;
  send_all(socket, header, 4, deadline);
  send_all(socket, body.data(), body.size(), deadline);
}

nlohmann::json receive_message(const Socket& socket, Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  unsigned char header[4];
  receive_exact(socket, reinterpret_cast<char*>(header), 4, deadline);
  const std::uint32_t size = (std::uint32_t{header[0]} << 24) | (std::uint32_t{header[1]} << 16) |
                             (std::uint32_t{header[2]} << 8) | std::uint32_t{header[3]};
  if (size > kMaxMessageBytes)
    throw_io("a message from " + socket.peer_address() + " announces " + std::to_string(size) +
             " bytes, over the limit of " + std::to_string(kMaxMessageBytes) +
             " (not a Tessera agent or client?)");
  std::string body(size, '\0');
  receive_exact(socket, body.data(), size, deadline);
  nlohmann::json message = nlohmann::json::parse(body, nullptr, false);
  if (message.is_discarded() || !message.is_object())
    throw_io("a message from " + socket.peer_address() + " is not a JSON object");
  return message;
}

bool readable(int fd, Milliseconds timeout) {
  return wait_for(fd, POLLIN, Clock::now() + timeout);
}

std::vector<Interface> ipv4_interfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw_io("cannot list the network interfaces: " + errno_text());
  std::vector<Interface> out;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0) continue;
    Interface item;
    item.name = entry->ifa_name;
    item.address = address_text(reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr);
    item.loopback = (entry->ifa_flags & IFF_LOOPBACK) != 0;
    if ((entry->ifa_flags & IFF_BROADCAST) != 0 && entry->ifa_broadaddr != nullptr)
      item.broadcast =
          address_text(reinterpret_cast<const sockaddr_in*>(entry->ifa_broadaddr)->sin_addr);
    out.push_back(std::move(item));
  }
  ::freeifaddrs(list);
  return out;
}

std::string choose_bind_address(const std::optional<std::string>& bind) {
  const std::vector<Interface> interfaces = ipv4_interfaces();
  auto listing = [&] {
    std::string text;
    for (const auto& i : interfaces)
      text += (text.empty() ? "" : ", ") + i.name + " " + i.address +
              (i.loopback ? " (loopback: this machine only)" : "");
    return text.empty() ? std::string("none") : text;
  };
  if (bind) {
    for (const auto& i : interfaces)
      if (i.address == *bind || i.name == *bind) return i.address;
    throw_invalid(
        "--bind " + *bind + " is neither an IPv4 address nor an interface of this machine",
        "this machine has: " + listing());
  }
  std::vector<const Interface*> lan;
  for (const auto& i : interfaces)
    if (!i.loopback) lan.push_back(&i);
  if (lan.size() == 1) return lan.front()->address;
  if (lan.empty())
    throw_invalid(
        "this machine has no network interface but loopback, so other machines "
        "cannot reach an agent here",
        "pass --bind 127.0.0.1 to serve this machine only");
  throw_invalid("this machine has several network interfaces (" + listing() +
                    "); which one should the agent listen on?",
                "pass --bind with the address or name of the interface on the trusted network "
                "the other nodes share (the agent listens on that one only)");
}

std::string interface_of(const std::string& address) {
  for (const auto& i : ipv4_interfaces())
    if (i.address == address) return i.name;
  return {};
}

std::string broadcast_address_of(const std::string& address) {
  for (const auto& i : ipv4_interfaces())
    if (i.address == address) return i.broadcast;
  return {};
}

std::string source_address_towards(const std::string& host, std::uint16_t port) {
  const sockaddr_in where = ipv4(host, port, "the node address");
  Socket socket(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) throw_io("cannot create a UDP socket: " + errno_text());
  // A UDP connect sends nothing: the kernel only chooses the route and its source address.
  if (::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&where), sizeof where) != 0)
    throw_io("no route from this machine to " + host + ": " + errno_text());
  sockaddr_in local{};
  socklen_t length = sizeof local;
  if (::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&local), &length) != 0)
    throw_io("cannot read the address of the route to " + host + ": " + errno_text());
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

Socket udp_sender(const std::string& address) {
  const sockaddr_in where = ipv4(address, 0, "the bind address");
  Socket socket(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) throw_io("cannot create a UDP socket: " + errno_text());
  const int on = 1;
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_BROADCAST, &on, sizeof on);
  if (::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&where), sizeof where) != 0)
    throw_io("cannot bind a UDP socket to " + address + ": " + errno_text());
  return socket;
}

void udp_send(const Socket& socket, const std::string& to, std::uint16_t port,
              const std::string& payload) {
  const sockaddr_in where = ipv4(to, port, "the announcement address");
  if (::sendto(socket.fd(), payload.data(), payload.size(), 0,
               reinterpret_cast<const sockaddr*>(&where), sizeof where) < 0)
    throw_io("cannot send an announcement to " + to + ":" + std::to_string(port) + ": " +
             errno_text());
}

Socket udp_listener(std::uint16_t port) {
  Socket socket(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) throw_io("cannot create a UDP socket: " + errno_text());
  const int on = 1;
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_port = htons(port);
  where.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&where), sizeof where) != 0)
    throw Error(
        ErrorKind::Io,
        "cannot listen for announcements on UDP port " + std::to_string(port) + ": " + errno_text(),
        "another program holds the port without sharing it; pass --discovery-port");
  return socket;
}

std::optional<Datagram> udp_receive(const Socket& socket, Milliseconds timeout) {
  if (!wait_for(socket.fd(), POLLIN, Clock::now() + timeout)) return std::nullopt;
  char buffer[65536];
  sockaddr_in from{};
  socklen_t length = sizeof from;
  const ssize_t got = ::recvfrom(socket.fd(), buffer, sizeof buffer, 0,
                                 reinterpret_cast<sockaddr*>(&from), &length);
  if (got < 0) return std::nullopt;
  return Datagram{address_text(from.sin_addr), std::string(buffer, static_cast<std::size_t>(got))};
}

std::uint16_t parse_port(const std::string& text, const std::string& what) {
  std::size_t used = 0;
  long value = -1;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < 1 || value > 65535)
    throw_invalid(what + " \"" + text + "\" is not a TCP/UDP port (1 .. 65535)");
  return static_cast<std::uint16_t>(value);
}

std::pair<std::string, std::uint16_t> parse_host_port(const std::string& text,
                                                      std::uint16_t default_port,
                                                      const std::string& what) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos) {
    if (text.empty()) throw_invalid(what + " is empty");
    return {text, default_port};
  }
  const std::string host = text.substr(0, colon);
  if (host.empty()) throw_invalid(what + " \"" + text + "\" has no host before the ':'");
  return {host, parse_port(text.substr(colon + 1), what + "'s port")};
}

}  // namespace tessera::nodes
