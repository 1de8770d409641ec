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

// This process's resident set now (/proc/self/statm) in bytes; 0 when unreadable.
std::uint64_t process_rss();
// This process's peak resident set (VmHWM of /proc/self/status) in bytes; 0 when unreadable.
std::uint64_t process_peak_rss();
// Starts the peak over from the current resident set (/proc/self/clear_refs "5"); false when
// the kernel does not allow it (the peak then keeps counting from the process's start).
bool reset_process_peak_rss();

}  // namespace tessera::core
