// What reaches `tessera-cli agent` from the LAN, as the agent reads it: an agent serves on
// 127.0.0.1 in this process, with one paired client, and each input is one connection to it.
// Input byte 0 even: the rest is sent as is (the 4-byte length, then the message), as anyone on
// the network could. Odd: the rest is a request envelope (JSON) that the fuzzer signs with the
// paired client's secret (its "hmac" is set, its integer "timestamp" is an offset from now),
// so the request body and everything after authentication are read too.
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include "fuzz_support.h"
#include "nodes/agent.h"
#include "nodes/crypto.h"
#include "nodes/protocol.h"
#include "nodes/store.h"
#include "nodes/wire.h"

namespace {

using namespace std::chrono_literals;
namespace nodes = tessera::nodes;

constexpr const char* kClientId = "fuzz-client";
const nodes::Bytes kSecret(32, 0x5a);

std::uint16_t agent_port() {
  static const std::uint16_t port = [] {
    const auto state = tessera::fuzz::scratch_dir() / "agent";
    nodes::AgentStore store(state, "fuzz-node");
    store.put_client({kClientId, "fuzz", "127.0.0.1", kSecret, "2026-01-01T00:00:00Z"});
    nodes::AgentOptions options;
    options.bind_address = "127.0.0.1";
    options.broadcast = false;
    options.state_dir = state;
    options.accept_code = "000000";  // never the pairing's code: pairing is refused, not asked
    options.print = [](const std::string&) {};
    // Never destroyed: its serving threads are detached and run until the process exits, so a
    // static Agent's destructor at exit would free the state they still read.
    static nodes::Agent* const agent = new nodes::Agent(options);
    static std::atomic<bool> stop{false};
    std::thread([] { agent->serve(stop); }).detach();
    return agent->port();
  }();
  return port;
}

// The envelope signed as a paired client signs it, where its fields have the types to sign.
std::string signed_envelope(std::string_view text) {
  nlohmann::json envelope = nlohmann::json::parse(text, nullptr, false);
  if (!envelope.is_object()) return std::string(text);
  if (envelope.contains("timestamp") && envelope["timestamp"].is_number_integer()) {
    const std::int64_t offset = envelope["timestamp"].get<std::int64_t>();
    const std::int64_t now = nodes::unix_seconds();
    const bool near = offset > -(std::int64_t{1} << 40) && offset < (std::int64_t{1} << 40);
    envelope["timestamp"] = near ? now + offset : offset;  // far ones as given: the extremes
  }
  const auto* client_id = envelope.contains("client_id") ? &envelope["client_id"] : nullptr;
  const auto* nonce = envelope.contains("nonce") ? &envelope["nonce"] : nullptr;
  const auto* timestamp = envelope.contains("timestamp") ? &envelope["timestamp"] : nullptr;
  const auto* body = envelope.contains("body") ? &envelope["body"] : nullptr;
  if (client_id && client_id->is_string() && nonce && nonce->is_string() && timestamp &&
      timestamp->is_number_integer() && body && body->is_string()) {
    const std::string mac_input =
        nodes::request_mac_input(client_id->get<std::string>(), nonce->get<std::string>(),
                                 timestamp->get<std::int64_t>(), body->get<std::string>());
    envelope["hmac"] = nodes::to_hex(nodes::hmac_sha256(kSecret, nodes::as_bytes(mac_input)));
  }
  return envelope.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint16_t port = agent_port();
  std::string bytes(tessera::fuzz::as_text(data + 1, size - 1));
  if (data[0] % 2 == 1) {
    const std::string message = signed_envelope(bytes);
    const auto length = static_cast<std::uint32_t>(message.size());
    bytes = {static_cast<char>(length >> 24), static_cast<char>(length >> 16),
             static_cast<char>(length >> 8), static_cast<char>(length)};
    bytes += message;
  }
  // One connection: send, close our side (the agent sees the end of what it waits for), then
  // read whatever it answers until it closes.
  const nodes::Socket socket = nodes::tcp_connect("127.0.0.1", port, 5000ms);
  for (std::size_t sent = 0; sent < bytes.size();) {
    const ssize_t put = ::send(socket.fd(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (put <= 0) break;  // the agent closed first (a refused length)
    sent += static_cast<std::size_t>(put);
  }
  ::shutdown(socket.fd(), SHUT_WR);
  char answer[4096];
  while (nodes::readable(socket.fd(), 20000ms) &&
         ::recv(socket.fd(), answer, sizeof answer, 0) > 0) {
  }
  return 0;
}
