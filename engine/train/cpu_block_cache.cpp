#include "train/cpu_block_cache.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <cstring>
#include <mutex>
#include <new>

#include "train/host_block_pool.h"

namespace tessera::train {
namespace {

void* map_block(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

class CpuBlockCache final : public c10::Allocator {
 public:
  CpuBlockCache()
      : small_(c10::GetCPUAllocator()),
        pool_(map_block, [](void* p, std::size_t bytes, bool) { ::munmap(p, bytes); }) {}

  c10::DataPtr allocate(std::size_t bytes) override {
    if (bytes < kLargeCpuBlockBytes) return small_->allocate(bytes);
    void* p = pool_.take(bytes);
    return {p, p, &CpuBlockCache::free, c10::Device(c10::DeviceType::CPU)};
  }
  // raw_allocate's memory (oneDNN's scratchpads, say) comes back through this, small or large.
  c10::DeleterFnPtr raw_deleter() const override { return &CpuBlockCache::free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  HostBlockPool& pool() { return pool_; }

  // Never destroyed: tensors may outlive anything that would own it.
  static CpuBlockCache* instance;

 private:
  static void free(void* p) {
    if (!instance->pool_.give_back(p, [] { return true; })) instance->small_->raw_deallocate(p);
  }

  c10::Allocator* small_;  // the allocator before this one, for everything smaller
  HostBlockPool pool_;
};

CpuBlockCache* CpuBlockCache::instance = nullptr;
std::mutex install_mutex;

}  // namespace

void install_cpu_block_cache(std::size_t keep_bytes) {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (!CpuBlockCache::instance) {
    CpuBlockCache::instance = new CpuBlockCache();
    // Above c10's own (0) and a test's counting wrapper (100), which then wraps this one.
    c10::SetCPUAllocator(CpuBlockCache::instance, /*priority=*/100);
  }
  CpuBlockCache::instance->pool().keep_at_most(keep_bytes);
}

CpuBlockCacheFigures cpu_block_cache_figures() {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (!CpuBlockCache::instance) return {};
  const HostBlockPool::Figures f = CpuBlockCache::instance->pool().figures();
  return {true, f.taken, f.kept, f.allocations};
}

}  // namespace tessera::train
