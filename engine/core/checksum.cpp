#include "core/checksum.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/files.h"

namespace tessera::core {
namespace fs = std::filesystem;

namespace {

// Large sequential reads: one syscall per 4 MiB keeps the hash, not the kernel, the cost.
constexpr std::size_t kReadBlock = 4u << 20;

struct Xxh3StateFree {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

// Calls `consume(data, size)` for each block of `file`, read sequentially.
template <class Consume>
void read_blocks(const fs::path& file, Consume&& consume) {
  FileDescriptor fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_io(file.string() + ": cannot open to checksum: " + std::strerror(errno));
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<unsigned char> block(kReadBlock);
  for (;;) {
    const ssize_t got = ::read(fd.get(), block.data(), block.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_io(file.string() + ": cannot read to checksum: " + std::strerror(errno));
    }
    if (got == 0) break;
    consume(block.data(), static_cast<std::size_t>(got));
  }
}

}  // namespace

std::string xxh3_128_file(const fs::path& file) {
  std::unique_ptr<XXH3_state_t, Xxh3StateFree> state(XXH3_createState());
  if (!state || XXH3_128bits_reset(state.get()) != XXH_OK)
    throw Error(ErrorKind::Internal, "xxHash: cannot make an XXH3 state");
  read_blocks(file, [&](const unsigned char* data, std::size_t size) {
    XXH3_128bits_update(state.get(), data, size);
  });
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state.get()));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof canonical.digest);
  for (unsigned char byte : canonical.digest) {
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 15]);
  }
  return out;
}

std::string legacy_fnv_file(const fs::path& file) {
  std::uint64_t h = 1469598103934665603ULL;
  read_blocks(file, [&](const unsigned char* data, std::size_t size) {
    for (std::size_t i = 0; i < size; ++i) {
      h ^= data[i];
      h *= 1099511628211ULL;
    }
  });
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace tessera::core
