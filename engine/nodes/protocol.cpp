#include "nodes/protocol.h"

#include <cctype>

#include "core/error.h"

namespace tessera::nodes {

namespace {

Bytes concat(std::initializer_list<std::span<const std::uint8_t>> parts) {
  Bytes out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// Length-prefixed, so no two different transcripts hash the same bytes.
void append_field(Bytes& out, std::span<const std::uint8_t> field) {
  const std::uint32_t size = static_cast<std::uint32_t>(field.size());
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<std::uint8_t>(size >> shift));
  out.insert(out.end(), field.begin(), field.end());
}

}  // namespace

std::string tessera_version() {
  return TESSERA_VERSION;
}

Bytes pairing_commitment(const Bytes& agent_public, const Bytes& client_public,
                         const Bytes& agent_nonce) {
  Bytes input = concat({as_bytes("tessera-pair-commit-v1")});
  append_field(input, agent_public);
  append_field(input, client_public);
  append_field(input, agent_nonce);
  return sha256(input);
}

Bytes transcript_hash(const PairingTranscript& t) {
  Bytes input = concat({as_bytes("tessera-pair-transcript-v1")});
  for (const auto& field :
       {std::span<const std::uint8_t>(t.client_public),
        std::span<const std::uint8_t>(t.agent_public),
        std::span<const std::uint8_t>(t.client_nonce), std::span<const std::uint8_t>(t.agent_nonce),
        as_bytes(t.client_id), as_bytes(t.node_id)})
    append_field(input, field);
  return sha256(input);
}

std::string pairing_code(const Bytes& hash) {
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | hash.at(static_cast<std::size_t>(i));
  std::string digits = std::to_string(value % 1000000);
  return std::string(6 - digits.size(), '0') + digits;
}

Bytes pairing_secret(const Bytes& ecdh_secret, const Bytes& hash) {
  return hkdf_sha256(ecdh_secret, hash, "tessera node pairing v1 request key", 32);
}

Bytes confirmation_proof(const Bytes& secret, const Bytes& hash, const std::string& who) {
  Bytes input = concat({as_bytes("tessera-pair-confirm-v1 " + who + "\n"), hash});
  return hmac_sha256(secret, input);
}

std::optional<std::string> normalise_code(const std::string& text) {
  std::string digits;
  for (char c : text) {
    if (std::isdigit(static_cast<unsigned char>(c)))
      digits.push_back(c);
    else if (c != ' ' && c != '-' && c != '\t' && c != '\r' && c != '\n')
      return std::nullopt;
  }
  if (digits.size() != 6) return std::nullopt;
  return digits;
}

std::string request_mac_input(const std::string& client_id, const std::string& nonce,
                              std::int64_t timestamp, const std::string& body) {
  return "tessera-nodes-request-v1\n" + client_id + "\n" + nonce + "\n" +
         std::to_string(timestamp) + "\n" + body;
}

std::string response_mac_input(const std::string& request_nonce, const std::string& body) {
  return "tessera-nodes-response-v1\n" + request_nonce + "\n" + body;
}

std::string stream_nonce(const std::string& request_nonce, const char* direction,
                         std::uint64_t sequence) {
  return request_nonce + "/" + direction + "/" + std::to_string(sequence);
}

std::int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

nlohmann::json sign_request(const std::string& client_id, const Bytes& secret,
                            const nlohmann::json& body) {
  const std::string nonce = to_hex(random_bytes(16));
  const std::int64_t timestamp = unix_seconds();
  const std::string text = body.dump();
  return {{"type", "request"},
          {"client_id", client_id},
          {"nonce", nonce},
          {"timestamp", timestamp},
          {"body", text},
          {"hmac", to_hex(hmac_sha256(
                       secret, as_bytes(request_mac_input(client_id, nonce, timestamp, text))))}};
}

nlohmann::json sign_response(const Bytes& secret, const std::string& request_nonce,
                             const nlohmann::json& body) {
  const std::string text = body.dump();
  return {{"body", text},
          {"hmac", to_hex(hmac_sha256(secret, as_bytes(response_mac_input(request_nonce, text))))}};
}

nlohmann::json error_message(const std::string& code, const std::string& message,
                             const std::string& hint) {
  return {{"error", {{"code", code}, {"message", message}, {"hint", hint}}}};
}

void throw_if_error(const nlohmann::json& message, const std::string& agent) {
  if (!message.contains("error")) return;
  const nlohmann::json& e = message["error"];
  throw Error(ErrorKind::Io,
              "the agent at " + agent +
                  " refused: " + e.value("message", std::string("no reason")) + " [" +
                  e.value("code", std::string("?")) + "]",
              e.value("hint", std::string()));
}

nlohmann::json open_response(const Bytes& secret, const std::string& request_nonce,
                             const nlohmann::json& envelope, const std::string& agent) {
  // Refusals before authentication (unknown client, bad HMAC, …) cannot be signed.
  throw_if_error(envelope, agent);
  if (!envelope.contains("body") || !envelope["body"].is_string() || !envelope.contains("hmac") ||
      !envelope["hmac"].is_string())
    throw_io("the answer from " + agent + " has no signed body (not a Tessera agent?)");
  const std::string body = envelope["body"].get<std::string>();
  const Bytes expected = hmac_sha256(secret, as_bytes(response_mac_input(request_nonce, body)));
  Bytes got;
  try {
    got = from_hex(envelope["hmac"].get<std::string>(), "the answer's hmac");
  } catch (const Error&) {
  }
  if (!equal_constant_time(expected, got))
    throw Error(ErrorKind::Io,
                "the answer from " + agent +
                    " does not carry a valid HMAC: it was altered on the "
                    "way, or comes from a machine that is not the paired agent",
                "pair again with `tessera-cli nodes add` if the node was reinstalled; otherwise "
                "check who answers at that address");
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object())
    throw_io("the signed answer from " + agent + " is not a JSON object");
  throw_if_error(parsed, agent);
  return parsed;
}

bool ReplayGuard::first_use(const std::string& client_id, const std::string& nonce,
                            std::int64_t now) {
  std::lock_guard lock(mutex_);
  for (auto it = seen_.begin(); it != seen_.end();)
    it = it->second < now ? seen_.erase(it) : std::next(it);
  // A nonce must be remembered as long as its timestamp could still pass the skew check.
  const auto [_, inserted] =
      seen_.emplace(client_id + "/" + nonce, now + 2 * kMaxClockSkew.count() + 1);
  return inserted;
}

}  // namespace tessera::nodes
