#pragma once
// The machine's memory as /proc/meminfo reports it. Torch-free: the hardware profile (plan/)
// and the trainer's `memory` events (train/) both read it.
#include <cstdint>

namespace tessera::core {

struct MemInfo {
  std::uint64_t total = 0;      // MemTotal
  std::uint64_t available = 0;  // MemAvailable
};

// MemTotal and MemAvailable of /proc/meminfo in bytes (0 when unreadable); no cgroup limit.
MemInfo read_meminfo();

}  // namespace tessera::core
