#pragma once
// File checksums for checkpoint manifests. New manifests use XXH3-128 (xxHash, Debian's
// libxxhash), a standard hash any tool can recompute (`xxhsum -H2`, Python's `xxhash`) and fast
// enough that it runs at the speed the file is read. Manifests written before it carry the
// engine's old 64-bit FNV-1a variant, which is still checked so that existing runs resume.
#include <filesystem>
#include <string>
#include <string_view>

namespace tessera::core {

// The manifest field (and the algorithm's name) of each checksum.
inline constexpr std::string_view kXxh3Field = "xxh3_128";
inline constexpr std::string_view kLegacyFnvField = "fnv1a64";

// XXH3-128 of a file's bytes as 32 lowercase hex digits in xxHash's canonical (big-endian)
// order, as `xxhsum -H2` and Python's xxhash.xxh3_128_hexdigest print it. Throws tessera::Error
// (Io) naming the file when it cannot be read.
std::string xxh3_128_file(const std::filesystem::path& file);

// The checksum of manifests written before XXH3: FNV-1a 64 over the bytes, but started from
// 1469598103934665603 (a digit short of the standard offset basis), as 16 hex digits. Kept only to
// verify those manifests.
std::string legacy_fnv_file(const std::filesystem::path& file);

}  // namespace tessera::core
