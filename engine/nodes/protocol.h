#pragma once
// The agent's protocol (docs/nodes.md): messages, the pairing's arithmetic (commitment, the
// 6-digit code from the transcript hash, the shared secret by HKDF), and the authentication of
// every later request (HMAC-SHA256 over client id, nonce, timestamp and body; a replay guard).
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "nodes/crypto.h"

namespace tessera::nodes {

constexpr int kProtocolVersion = 1;
constexpr std::uint16_t kDefaultAgentPort = 47611;      // TCP, the agent's requests
constexpr std::uint16_t kDefaultDiscoveryPort = 47612;  // UDP, the announcements
constexpr std::chrono::seconds kMaxClockSkew{60};
// What every user of the agent must know, said by the agent, `nodes add` and docs/nodes.md.
inline constexpr const char* kC10dWarning =
    "c10d traffic between the ranks of a job (rendezvous store, Gloo/NCCL collectives) is "
    "neither authenticated nor encrypted: run jobs only on a trusted network. The pairing "
    "secret protects the requests to this agent, not the training traffic.";

std::string tessera_version();  // CMake's project version

// --- pairing -------------------------------------------------------------------------------
// The agent commits to its nonce before it sees the client's (as Bluetooth's numeric
// comparison does), so a man in the middle cannot search for keys that make both codes match:
// he gets one guess in a million per attempt, and a mismatch shows on the two screens.
struct PairingTranscript {
  Bytes client_public, agent_public, client_nonce, agent_nonce;
  std::string client_id, node_id;
};
Bytes pairing_commitment(const Bytes& agent_public, const Bytes& client_public,
                         const Bytes& agent_nonce);
Bytes transcript_hash(const PairingTranscript& transcript);
std::string pairing_code(const Bytes& transcript_hash);  // 6 digits, zero-padded
// HKDF-SHA256 of the X25519 secret, salted with the transcript hash: 32 bytes.
Bytes pairing_secret(const Bytes& ecdh_secret, const Bytes& transcript_hash);
// Key confirmation after both users said yes: proves each side derived the same secret.
Bytes confirmation_proof(const Bytes& secret, const Bytes& transcript_hash, const std::string& who);
// "123456" for a code typed as "123 456" or "123-456"; nullopt when it is not 6 digits.
std::optional<std::string> normalise_code(const std::string& text);

// --- authenticated requests ----------------------------------------------------------------
// The bytes an HMAC covers; see docs/nodes.md (tests/integration/test_nodes.py rebuilds them).
std::string request_mac_input(const std::string& client_id, const std::string& nonce,
                              std::int64_t timestamp, const std::string& body);
std::string response_mac_input(const std::string& request_nonce, const std::string& body);
nlohmann::json sign_request(const std::string& client_id, const Bytes& secret,
                            const nlohmann::json& body);
nlohmann::json sign_response(const Bytes& secret, const std::string& request_nonce,
                             const nlohmann::json& body);
// The body of a signed answer; throws Io when the HMAC does not verify (not our agent, or the
// answer was altered on the way) and passes on an error the agent sent.
nlohmann::json open_response(const Bytes& secret, const std::string& request_nonce,
                             const nlohmann::json& envelope, const std::string& agent);

// A spawn request's connection stays open: the agent streams the ranks' output and exits, the
// client may send signals. Each such message is signed as a response to the nonce
// "<request nonce>/agent/<n>" (agent to client) or "<request nonce>/client/<n>" (client to
// agent), n counting 1, 2, … per direction: a message cannot be replayed, reordered, dropped
// unnoticed, or reflected back to its sender.
std::string stream_nonce(const std::string& request_nonce, const char* direction,
                         std::uint64_t sequence);
// The torchrun variables a spawn sets; the agent passes on only these from the client's
// environment besides them.
inline constexpr const char* kSpawnForwardedVariables[] = {"TESSERA_DIST_TIMEOUT_S",
                                                           "TESSERA_DIST_RENDEZVOUS_TIMEOUT_S"};

// Refusals the agent sends: {"error": {"code", "message", "hint"}}.
nlohmann::json error_message(const std::string& code, const std::string& message,
                             const std::string& hint);
// Throws tessera::Error (Io) carrying the agent's message and hint when `message` is an error.
void throw_if_error(const nlohmann::json& message, const std::string& agent);

std::int64_t unix_seconds();

// Nonces seen in the last two clock-skew windows, per client: a request is accepted once.
class ReplayGuard {
 public:
  // True the first time (client, nonce) is seen within the window; false for a replay.
  bool first_use(const std::string& client_id, const std::string& nonce, std::int64_t now);

 private:
  std::mutex mutex_;
  std::map<std::string, std::int64_t> seen_;  // "client/nonce" → when it stops mattering
};

}  // namespace tessera::nodes
