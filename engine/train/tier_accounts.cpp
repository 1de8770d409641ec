// A device tier's budget and counters (device_tier.h). A file of its own: the CUDA runtime module
// (cuda/runtime.h) compiles it too, for its tier on the GPU.
#include <algorithm>
#include <mutex>

#include "core/files.h"
#include "train/device_tier.h"

namespace tessera::train {

DeviceOutOfMemory::DeviceOutOfMemory(const std::string& device, std::uint64_t asked,
                                     std::uint64_t used, std::uint64_t total,
                                     const std::string& what)
    : Error(ErrorKind::OutOfMemory,
            device + ": out of memory for " + what + ": asked " + core::human_bytes(asked) +
                " with " + core::human_bytes(used) + " of " + core::human_bytes(total) + " in use",
            "keep more in host memory (strategy.options.host_param_frac, host_optim_frac, or "
            "placement auto), give the chunks more device memory (device_budget), or lower the "
            "batch size"),
      asked_(asked),
      used_(used) {}

void TierAccounts::reserve(std::size_t bytes, const std::string& device, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (used_ + bytes > budget_) throw DeviceOutOfMemory(device, bytes, used_, budget_, what);
  used_ += bytes;
  peak_ = std::max(peak_, used_);
}

void TierAccounts::release(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= bytes;
}

void TierAccounts::count_copy(std::size_t bytes, bool to_device) {
  std::lock_guard<std::mutex> lock(mutex_);
  (to_device ? traffic_.bytes_to_device : traffic_.bytes_to_host) += bytes;
  ++traffic_.copies;
}

void TierAccounts::count_host_wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++traffic_.host_waits;
}

std::uint64_t TierAccounts::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

std::uint64_t TierAccounts::peak() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

void TierAccounts::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = used_;
}

DeviceTraffic TierAccounts::traffic() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return traffic_;
}

}  // namespace tessera::train
