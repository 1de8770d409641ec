#pragma once
// Sizes the user writes: "2GiB", "512MiB", "1.5GB", "1000000" (bytes).
#include <cstdint>
#include <string>

namespace tessera::core {

// Binary units (KiB, MiB, GiB, TiB; also K, M, G, T) and decimal ones (kB, MB, GB, TB); a bare
// number is bytes. Throws tessera::Error (InvalidInput) naming `what` (the field) otherwise.
std::uint64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace tessera::core
