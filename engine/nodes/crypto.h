#pragma once
// The cryptography of LAN nodes, on OpenSSL's libcrypto: X25519 key agreement, SHA-256,
// HMAC-SHA256, HKDF-SHA256, random bytes, hex, and a constant-time comparison.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::nodes {

using Bytes = std::vector<std::uint8_t>;

Bytes random_bytes(std::size_t count);  // from the OS's CSPRNG (RAND_bytes)
std::string to_hex(std::span<const std::uint8_t> bytes);
// Throws tessera::Error (InvalidInput) naming `what` for text that is not even-length hex.
Bytes from_hex(std::string_view hex, const std::string& what);
std::span<const std::uint8_t> as_bytes(std::string_view text);

Bytes sha256(std::span<const std::uint8_t> data);
Bytes hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data);
// RFC 5869: extract with `salt`, expand with `info` to `length` bytes.
Bytes hkdf_sha256(std::span<const std::uint8_t> secret, std::span<const std::uint8_t> salt,
                  std::string_view info, std::size_t length);
// Same length and same bytes, in time that does not depend on where they differ.
bool equal_constant_time(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b);

// A fresh X25519 key pair, used for one pairing and then dropped.
class X25519Key {
 public:
  X25519Key();
  ~X25519Key();
  X25519Key(const X25519Key&) = delete;
  X25519Key& operator=(const X25519Key&) = delete;
  Bytes public_key() const;  // 32 bytes
  // The ECDH secret with the peer's 32-byte public key; throws InvalidInput for a bad key
  // (wrong length, or one that gives the all-zero secret).
  Bytes shared_secret(std::span<const std::uint8_t> peer_public) const;

 private:
  void* key_;  // EVP_PKEY, kept out of this header
};

}  // namespace tessera::nodes
