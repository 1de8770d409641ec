#include "nodes/client.h"

#include <map>

#include "core/error.h"
#include "nodes/crypto.h"
#include "nodes/protocol.h"
#include "nodes/wire.h"

namespace tessera::nodes {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// The agent's user may still be reading the code when ours answered.
constexpr Milliseconds kAgentConfirmTimeout = 130s;

std::string hex_field(const json& message, const char* name, std::size_t bytes,
                      const std::string& agent) {
  if (!message.contains(name) || !message[name].is_string() ||
      message[name].get<std::string>().size() != 2 * bytes)
    throw_io("the agent at " + agent + " sent no valid \"" + name +
             "\" (not a Tessera agent, or "
             "another version)");
  return message[name].get<std::string>();
}

}  // namespace

std::vector<Announcement> listen_for_agents(std::uint16_t port,
                                            std::chrono::milliseconds duration) {
  Socket socket = udp_listener(port);
  std::map<std::string, Announcement> heard;
  const auto deadline = std::chrono::steady_clock::now() + duration;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<Milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) break;
    const auto datagram = udp_receive(socket, left);
    if (!datagram) continue;
    const json message = json::parse(datagram->payload, nullptr, false);
    // Anything else on the port (another program's broadcasts) is not ours: skip it.
    if (message.is_discarded() || !message.is_object() ||
        message.value("tessera_node", 0) != kProtocolVersion)
      continue;
    try {
      Announcement a;
      a.name = message.at("name").get<std::string>();
      a.node_id = message.at("node_id").get<std::string>();
      a.address = message.at("address").get<std::string>();
      a.port = message.at("port").get<std::uint16_t>();
      a.version = message.value("version", std::string());
      a.pairing = message.value("pairing", std::string());
      a.paired_clients = message.value("paired_clients", std::size_t{0});
      a.seen_from = datagram->from;
      heard[a.node_id] = a;
    } catch (const json::exception&) {
      continue;
    }
  }
  std::vector<Announcement> out;
  for (auto& [_, a] : heard) out.push_back(std::move(a));
  return out;
}

std::string pair_with_agent(ClientStore& store, const std::string& host, std::uint16_t port,
                            const std::string& client_name, const PairingPrompt& prompt) {
  const std::string agent = host + ":" + std::to_string(port);
  if (store.client_id().empty()) store.save();  // makes this client's id
  Socket socket = tcp_connect(host, port, kMessageTimeout);
  X25519Key key;
  PairingTranscript transcript;
  transcript.client_id = store.client_id();
  transcript.client_public = key.public_key();
  transcript.client_nonce = random_bytes(16);
  send_message(socket,
               {{"type", "pair_start"},
                {"client_id", store.client_id()},
                {"client_name", client_name},
                {"client_public_key", to_hex(transcript.client_public)}},
               kMessageTimeout);
  const json offer = receive_message(socket, kMessageTimeout);
  throw_if_error(offer, agent);
  transcript.agent_public =
      from_hex(hex_field(offer, "agent_public_key", 32, agent), "agent_public_key");
  const Bytes commitment = from_hex(hex_field(offer, "commitment", 32, agent), "commitment");
  transcript.node_id = hex_field(offer, "node_id", 16, agent);
  const std::string node_name = offer.value("name", std::string("node"));
  // Our nonce goes out only now that the agent is bound to its own.
  send_message(socket, {{"type", "pair_nonce"}, {"client_nonce", to_hex(transcript.client_nonce)}},
               kMessageTimeout);
  const json reveal = receive_message(socket, kMessageTimeout);
  throw_if_error(reveal, agent);
  transcript.agent_nonce = from_hex(hex_field(reveal, "agent_nonce", 16, agent), "agent_nonce");
  if (!equal_constant_time(commitment,
                           pairing_commitment(transcript.agent_public, transcript.client_public,
                                              transcript.agent_nonce)))
    throw Error(ErrorKind::Io,
                "the agent at " + agent +
                    " revealed a nonce that does not match its commitment: "
                    "someone may be between this machine and the node; nothing was stored",
                "check the network path to the node and pair again");

  const Bytes hash = transcript_hash(transcript);
  const std::string code = pairing_code(hash);
  const Bytes secret = pairing_secret(key.shared_secret(transcript.agent_public), hash);
  if (prompt.print)
    prompt.print("pairing with \"" + node_name + "\" at " + agent + ": pairing code " + code);

  bool confirmed = false;
  std::string refusal;
  if (prompt.expected_code) {
    confirmed = *prompt.expected_code == code;
    if (!confirmed)
      refusal = "the code expected by --expect-code (" + *prompt.expected_code +
                ") is not this pairing's code (" + code + ")";
  } else {
    confirmed = prompt.confirm && prompt.confirm(code, node_name);
    if (!confirmed) refusal = "the code was not confirmed on this machine";
  }
  send_message(socket,
               {{"type", "pair_confirm"},
                {"confirmed", confirmed},
                {"proof", confirmed ? to_hex(confirmation_proof(secret, hash, "client")) : ""}},
               kMessageTimeout);
  if (!confirmed)
    throw Error(ErrorKind::Io,
                "pairing refused: " + refusal +
                    "; nothing was stored here or on "
                    "the agent",
                "compare the codes shown on both machines and pair again; codes that differ "
                "mean someone is between you and the node");
  const json done = receive_message(socket, kAgentConfirmTimeout);
  throw_if_error(done, agent);
  Bytes proof;
  try {
    proof = from_hex(done.value("proof", std::string()), "proof");
  } catch (const Error&) {
  }
  if (!done.value("ok", false) ||
      !equal_constant_time(proof, confirmation_proof(secret, hash, "agent")))
    throw_io("the agent at " + agent +
             " did not prove it derived the same secret; nothing was "
             "stored");
  PairedNode node{node_name, transcript.node_id, host, port, secret, utc_now_iso()};
  const std::string stored_as = store.put(std::move(node));
  store.save();
  return stored_as;
}

json request_node(const ClientStore& store, const PairedNode& node, const json& body,
                  std::chrono::milliseconds timeout) {
  const std::string agent = node.name + " (" + node.address + ":" + std::to_string(node.port) + ")";
  const json envelope = sign_request(store.client_id(), node.secret, body);
  Socket socket = tcp_connect(node.address, node.port, kMessageTimeout);
  send_message(socket, envelope, kMessageTimeout);
  const json answer = receive_message(socket, timeout);
  return open_response(node.secret, envelope["nonce"].get<std::string>(), answer, agent);
}

}  // namespace tessera::nodes
