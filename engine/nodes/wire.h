#pragma once
// The network underneath the agent: TCP with length-prefixed JSON messages (4-byte big-endian
// length, then UTF-8 JSON), UDP datagrams for the announcements, and the machine's IPv4
// interfaces. Every wait has a deadline; a closed, slow or malformed peer is a tessera::Error (Io)
// that says which.
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tessera::nodes {

using Milliseconds = std::chrono::milliseconds;
// How long either side of a link waits for the other's next protocol message.
inline constexpr Milliseconds kMessageTimeout{10'000};

constexpr std::size_t kMaxMessageBytes = 1 << 20;  // requests and answers are small

// An owned socket, closed when this goes.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  std::uint16_t local_port() const;
  std::string peer_address() const;  // "a.b.c.d" of a connected TCP socket

 private:
  int fd_ = -1;
};

// Listens on address:port (port 0: any free port; see local_port()). Throws Io naming the address.
Socket tcp_listen(const std::string& address, std::uint16_t port);
// Waits at most `timeout` for a connection; nullopt when none came.
std::optional<Socket> tcp_accept(const Socket& listener, Milliseconds timeout);
Socket tcp_connect(const std::string& host, std::uint16_t port, Milliseconds timeout);

void send_message(const Socket& socket, const nlohmann::json& message, Milliseconds timeout);
nlohmann::json receive_message(const Socket& socket, Milliseconds timeout);
// Whether `socket` has something to read (or was closed) within `timeout`.
bool readable(int fd, Milliseconds timeout);

struct Interface {
  std::string name;       // eth0
  std::string address;    // 192.168.1.20
  std::string broadcast;  // 192.168.1.255; empty when the interface has none
  bool loopback = false;
};
std::vector<Interface> ipv4_interfaces();

// The address to bind for `--bind VALUE` (an IPv4 address of this machine or an interface
// name); without one, the only non-loopback interface's address. Throws InvalidInput when the
// choice is ambiguous (naming every candidate) or the value is not this machine's.
std::string choose_bind_address(const std::optional<std::string>& bind);
// The broadcast address of the interface that holds `address` (empty: none, e.g. loopback).
std::string broadcast_address_of(const std::string& address);

// The address of this machine that packets to host:port leave from (the routing table's
// choice, found by connecting a UDP socket). Throws Io when there is no route.
std::string source_address_towards(const std::string& host, std::uint16_t port);
// The interface that holds `address` ("eth0"); empty when none does.
std::string interface_of(const std::string& address);

// UDP: a socket that may send broadcasts, bound to `address` (so they leave by that interface).
Socket udp_sender(const std::string& address);
void udp_send(const Socket& socket, const std::string& to, std::uint16_t port,
              const std::string& payload);
// A socket receiving datagrams sent to `port` on every address (SO_REUSEADDR, so several
// listeners on one machine can share the port).
Socket udp_listener(std::uint16_t port);
struct Datagram {
  std::string from;
  std::string payload;
};
std::optional<Datagram> udp_receive(const Socket& socket, Milliseconds timeout);

// "host", "host:port" → host and port (default_port when none). Throws InvalidInput naming `what`.
std::pair<std::string, std::uint16_t> parse_host_port(const std::string& text,
                                                      std::uint16_t default_port,
                                                      const std::string& what);
std::uint16_t parse_port(const std::string& text, const std::string& what);

}  // namespace tessera::nodes
