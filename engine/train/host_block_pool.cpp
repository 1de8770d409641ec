// Page-locked host blocks at their own sizes (host_block_pool.h). A file of its own: the CUDA
// runtime module (cuda/runtime.h) compiles it too, for its tier on the GPU.
#include "train/host_block_pool.h"

#include <algorithm>
#include <utility>

namespace tessera::train {

HostBlockPool::HostBlockPool(std::function<void*(std::size_t)> allocate,
                             std::function<void(void*, std::size_t, bool)> release,
                             std::size_t page)
    : allocate_(std::move(allocate)),
      release_(std::move(release)),
      page_((std::max(page, kPage) + kPage - 1) / kPage * kPage) {}

HostBlockPool::~HostBlockPool() {
  // Every kept block goes; release_ waits for the copies of those not known done.
  for (auto& [bytes, kept] : kept_) release_(kept.memory, bytes, kept.copies_done());
}

void* HostBlockPool::take(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The smallest fitting block first, so that a larger one stays for a larger request.
    for (auto it = kept_.lower_bound(size); it != kept_.end() && it->first <= size + size / 8;
         ++it) {
      if (!it->second.copies_done()) continue;
      void* memory = it->second.memory;
      taken_.emplace(memory, it->first);
      figures_.kept -= it->first;
      figures_.taken += it->first;
      kept_.erase(it);
      return memory;
    }
  }
  void* memory = nullptr;
  try {
    memory = allocate_(size);
  } catch (...) {
    // Locked memory is a limited resource (RLIMIT_MEMLOCK, the host's RAM): blocks of other
    // sizes kept from earlier phases make room.
    if (release_kept() == 0) throw;
    memory = allocate_(size);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  taken_.emplace(memory, size);
  figures_.taken += size;
  ++figures_.allocations;
  return memory;
}

bool HostBlockPool::give_back(void* memory, std::function<bool()> copies_done) {
  std::vector<std::pair<void*, std::size_t>> beyond;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = taken_.find(memory);
    if (it == taken_.end()) return false;  // not the pool's: nothing to keep
    const std::size_t size = it->second;
    taken_.erase(it);
    figures_.taken -= size;
    figures_.kept += size;
    kept_.emplace(size, Kept{memory, std::move(copies_done)});
    beyond = take_beyond_bound();
  }
  for (auto& [block, bytes] : beyond) release_(block, bytes, /*copies_done=*/true);
  return true;
}

void HostBlockPool::keep_at_most(std::size_t bytes) {
  std::vector<std::pair<void*, std::size_t>> beyond;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    keep_at_most_ = bytes;
    beyond = take_beyond_bound();
  }
  for (auto& [block, size] : beyond) release_(block, size, /*copies_done=*/true);
}

std::vector<std::pair<void*, std::size_t>> HostBlockPool::take_beyond_bound() {
  std::vector<std::pair<void*, std::size_t>> beyond;
  for (auto it = kept_.end(); figures_.kept > keep_at_most_ && it != kept_.begin();) {
    --it;
    if (!it->second.copies_done()) continue;
    beyond.emplace_back(it->second.memory, it->first);
    figures_.kept -= it->first;
    it = kept_.erase(it);
  }
  return beyond;
}

HostBlockPool::Figures HostBlockPool::figures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return figures_;
}

std::size_t HostBlockPool::release_kept() {
  std::multimap<std::size_t, Kept> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = kept_.begin(); it != kept_.end();) {
      if (!it->second.copies_done()) {
        ++it;
        continue;
      }
      figures_.kept -= it->first;
      done.insert(kept_.extract(it++));
    }
  }
  // Outside the lock: a release may be slow (the driver unlocks the pages), and other threads
  // give blocks back meanwhile.
  std::size_t released = 0;
  for (auto& [bytes, kept] : done) {
    release_(kept.memory, bytes, /*copies_done=*/true);
    released += bytes;
  }
  return released;
}

}  // namespace tessera::train
