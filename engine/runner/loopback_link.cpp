#include "runner/loopback_link.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <thread>

#include "core/error.h"
#include "nodes/link/link_test.h"

namespace tessera::runner {
namespace {

// A port free on the loopback now (bound to port 0, read back, closed): the rendezvous store's.
std::uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_io("cannot open a socket to find a free port for the loopback link test");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  if (!ok) throw_io("cannot bind a socket on 127.0.0.1 for the loopback link test");
  return ntohs(address.sin_port);
}

}  // namespace

plan::LinkInfo measure_loopback_link(std::uint64_t bytes) {
  const std::uint16_t port = free_loopback_port();
  const auto timeout = std::chrono::seconds(30);
  std::exception_ptr peer_error;
  std::thread peer([&] {
    try {
      nodes::run_link_test(1, "127.0.0.1", port, bytes, timeout);
    } catch (...) {
      peer_error = std::current_exception();
    }
  });
  nodes::LinkMeasurement m;
  try {
    m = nodes::run_link_test(0, "127.0.0.1", port, bytes, timeout);
  } catch (...) {
    peer.join();
    throw;
  }
  peer.join();
  if (peer_error) std::rethrow_exception(peer_error);
  plan::LinkInfo link;
  link.measured = true;
  link.bandwidth_bytes_per_s = m.bandwidth_mb_s * 1e6;
  link.latency_s = m.latency_ms / 1e3;
  link.test_bytes = m.bytes;
  link.method = "two local ranks on 127.0.0.1 (c10d Gloo): median of " +
                std::to_string(m.large_runs) + " all_reduces of " + std::to_string(m.bytes >> 20) +
                " MiB for the bandwidth, of " + std::to_string(m.small_runs) +
                " of 4 bytes for the latency";
  return link;
}

}  // namespace tessera::runner
