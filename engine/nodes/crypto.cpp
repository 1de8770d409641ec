#include "nodes/crypto.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <memory>

#include "core/error.h"

namespace tessera::nodes {

namespace {

[[noreturn]] void throw_openssl(const std::string& what) {
  char text[256] = "no detail";
  if (const unsigned long code = ERR_get_error(); code != 0)
    ERR_error_string_n(code, text, sizeof text);
  throw Error(ErrorKind::Internal, what + " failed in OpenSSL: " + text);
}

EVP_PKEY* pkey(void* key) {
  return static_cast<EVP_PKEY*>(key);
}

struct PkeyContextFree {
  void operator()(EVP_PKEY_CTX* context) const { EVP_PKEY_CTX_free(context); }
};
using PkeyContext = std::unique_ptr<EVP_PKEY_CTX, PkeyContextFree>;

}  // namespace

Bytes random_bytes(std::size_t count) {
  Bytes out(count);
  if (count > 0 && RAND_bytes(out.data(), static_cast<int>(count)) != 1)
    throw_openssl("random bytes");
  return out;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

Bytes from_hex(std::string_view hex, const std::string& what) {
  auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw_invalid(what + " is not hexadecimal (character '" + std::string(1, c) + "')");
  };
  if (hex.size() % 2 != 0) throw_invalid(what + " has an odd number of hex digits");
  Bytes out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::uint8_t>(digit(hex[2 * i]) * 16 + digit(hex[2 * i + 1]));
  return out;
}

std::span<const std::uint8_t> as_bytes(std::string_view text) {
  return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

Bytes sha256(std::span<const std::uint8_t> data) {
  Bytes out(32);
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), out.data(), &length, EVP_sha256(), nullptr) != 1)
    throw_openssl("SHA-256");
  return out;
}

Bytes hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data) {
  Bytes out(32);
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data.data(), data.size(),
           out.data(), &length) == nullptr)
    throw_openssl("HMAC-SHA256");
  return out;
}

Bytes hkdf_sha256(std::span<const std::uint8_t> secret, std::span<const std::uint8_t> salt,
                  std::string_view info, std::size_t length) {
  PkeyContext context(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  Bytes out(length);
  std::size_t out_length = length;
  if (!context || EVP_PKEY_derive_init(context.get()) != 1 ||
      EVP_PKEY_CTX_set_hkdf_md(context.get(), EVP_sha256()) != 1 ||
      EVP_PKEY_CTX_set1_hkdf_salt(context.get(), salt.data(), static_cast<int>(salt.size())) != 1 ||
      EVP_PKEY_CTX_set1_hkdf_key(context.get(), secret.data(), static_cast<int>(secret.size())) !=
          1 ||
      EVP_PKEY_CTX_add1_hkdf_info(context.get(),
                                  reinterpret_cast<const unsigned char*>(info.data()),
                                  static_cast<int>(info.size())) != 1 ||
      EVP_PKEY_derive(context.get(), out.data(), &out_length) != 1 || out_length != length)
    throw_openssl("HKDF-SHA256");
  return out;
}

bool equal_constant_time(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

X25519Key::X25519Key() : key_(nullptr) {
  PkeyContext context(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  EVP_PKEY* key = nullptr;
  if (!context || EVP_PKEY_keygen_init(context.get()) != 1 ||
      EVP_PKEY_keygen(context.get(), &key) != 1)
    throw_openssl("X25519 key generation");
  key_ = key;
}

X25519Key::~X25519Key() {
  EVP_PKEY_free(pkey(key_));
}

Bytes X25519Key::public_key() const {
  Bytes out(32);
  std::size_t length = out.size();
  if (EVP_PKEY_get_raw_public_key(pkey(key_), out.data(), &length) != 1 || length != 32)
    throw_openssl("X25519 public key");
  return out;
}

Bytes X25519Key::shared_secret(std::span<const std::uint8_t> peer_public) const {
  if (peer_public.size() != 32)
    throw_invalid("the peer's X25519 public key has " + std::to_string(peer_public.size()) +
                  " bytes, not 32");
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> peer(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_public.data(), 32),
      &EVP_PKEY_free);
  if (!peer) throw_invalid("the peer's X25519 public key is not a valid key");
  PkeyContext context(EVP_PKEY_CTX_new(pkey(key_), nullptr));
  Bytes out(32);
  std::size_t length = out.size();
  // OpenSSL refuses a small-order peer key (an all-zero secret) in EVP_PKEY_derive.
  if (!context || EVP_PKEY_derive_init(context.get()) != 1 ||
      EVP_PKEY_derive_set_peer(context.get(), peer.get()) != 1 ||
      EVP_PKEY_derive(context.get(), out.data(), &length) != 1 || length != 32)
    throw_invalid("X25519 with the peer's public key failed (a low-order or malformed key)");
  return out;
}

}  // namespace tessera::nodes
