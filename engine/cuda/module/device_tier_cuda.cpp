// The device tier on a CUDA GPU (device_tier.h): memory from LibTorch's caching allocator (so
// the memory events' allocator figures include it), page-locked host buffers at their own sizes
// (host_block_pool.h), two copy streams from its pool (to the device, to the host), and CUDA
// events between them and the current (compute) stream. Part of the CUDA runtime module
// (cuda/runtime.h).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "cuda/module/module.h"
#include "train/device_tier.h"
#include "train/host_block_pool.h"

namespace tessera::cuda {
namespace {

using train::DeviceEvent;
using train::DeviceOutOfMemory;
using train::DeviceTier;
using train::TierLifetime;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorKind::Internal,
                std::string("CUDA: ") + what + ": " + cudaGetErrorString(status));
}

// A point on each of one or two streams (the compute's; or the two copy streams').
class CudaEvent : public DeviceEvent {
 public:
  // Created on the streams' device (an event records only on streams of the device current at
  // its creation), whichever device the calling thread has current.
  explicit CudaEvent(std::initializer_list<c10::cuda::CUDAStream> streams) {
    try {
      for (const c10::cuda::CUDAStream& stream : streams) {
        const c10::cuda::CUDAGuard guard(stream.device_index());
        cudaEvent_t event = nullptr;
        check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
        events.push_back(event);
        check(cudaEventRecord(event, stream.stream()), "cudaEventRecord");
      }
    } catch (...) {  // no destructor runs for a constructor that throws
      for (cudaEvent_t event : events) cudaEventDestroy(event);
      throw;
    }
  }
  ~CudaEvent() override {
    for (cudaEvent_t event : events) cudaEventDestroy(event);
  }
  std::vector<cudaEvent_t> events;
};

class CudaDeviceTier : public DeviceTier {
 public:
  CudaDeviceTier(int index, std::uint64_t budget)
      : DeviceTier(budget != 0 ? budget : free_memory(index)),
        index_(static_cast<c10::DeviceIndex>(index)),
        up_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_)),
        down_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_)),
        host_pool_(make_host_pool(index_, up_, down_)) {}
  ~CudaDeviceTier() override { end_lifetime(); }

  static std::uint64_t free_memory(int index) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
  }

  std::string name() const override { return "cuda:" + std::to_string(index_); }
  c10::Device tensor_device() const override { return {c10::kCUDA, index_}; }

  c10::DataPtr allocate(std::size_t bytes, const std::string& what,
                        train::FirstWriter first_writer) override {
    accounts_.reserve(bytes, name(), what);
    c10::cuda::CUDAGuard guard(index_);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(index_);
    c10::DataPtr inner;
    try {
      // The caching allocator takes the block from the current stream's pool.
      // (Copies that write device memory are copies up.)
      const c10::cuda::CUDAStreamGuard writer(first_writer == train::FirstWriter::copies ? up_
                                                                                         : compute);
      inner = c10::cuda::CUDACachingAllocator::get()->allocate(bytes);
    } catch (const c10::OutOfMemoryError&) {
      accounts_.release(bytes);
      throw DeviceOutOfMemory(name(), bytes, used(), total(), what);
    }
    void* data = inner.get();
    auto* owned = new Owned{lifetime_, up_, down_, compute, bytes, std::move(inner)};
    {
      // Known by address, so that a copy touching it marks it (copied_by).
      std::lock_guard<std::mutex> lock(live_mutex_);
      blocks_[static_cast<const char*>(data)] = owned;
    }
    return {data, owned, &CudaDeviceTier::free_device, tensor_device()};
  }

  // From the tier's pool (shared with each block, which may outlive the tier): page-aligned.
  c10::DataPtr allocate_host(std::size_t bytes) override {
    void* data = host_pool_->take(bytes);
    return {data, new HostHeld{host_pool_, up_, down_, data}, &CudaDeviceTier::free_host,
            c10::Device(c10::kCPU)};
  }
  c10::DataPtr allocate_host_io(std::size_t bytes) override {
    static_assert(train::HostBlockPool::kPage % kHostIoAlignment == 0);  // pages are multiples
    return allocate_host(bytes);
  }

  std::size_t release_cached_host() override { return host_pool_->release_kept(); }

  c10::DataPtr allocate_host_resident(std::size_t bytes) override {
    // Registered with this GPU's context (the thread may have another device current, or none:
    // the primary context of GPU 0 would be made for it).
    void* memory = page_locked(index_, host_pool_->rounded(bytes), host_pool_->page());
    return {memory, new Registered{index_, up_, down_, memory}, &CudaDeviceTier::free_registered,
            c10::Device(c10::kCPU)};
  }

  void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) override {
    const c10::cuda::CUDAGuard guard(index_);
    check(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, up_),
          "copy to the device");
    copied_by(device_dst, &Owned::copied_up);
    accounts_.count_copy(bytes, true);
  }
  void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) override {
    const c10::cuda::CUDAGuard guard(index_);
    check(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, down_),
          "copy to the host");
    copied_by(device_src, &Owned::copied_down);
    accounts_.count_copy(bytes, false);
  }

  void issue_after_copies(const std::function<void()>& issue) override {
    const c10::cuda::CUDAGuard device(index_);
    const c10::cuda::CUDAStreamGuard copies(up_);
    issue();
  }

  std::shared_ptr<DeviceEvent> record_copies() override {
    return std::make_shared<CudaEvent>(std::initializer_list<c10::cuda::CUDAStream>{up_, down_});
  }
  std::shared_ptr<DeviceEvent> record_copies_up() override {
    return std::make_shared<CudaEvent>(std::initializer_list<c10::cuda::CUDAStream>{up_});
  }
  std::shared_ptr<DeviceEvent> record_compute() override {
    return std::make_shared<CudaEvent>(
        std::initializer_list<c10::cuda::CUDAStream>{c10::cuda::getCurrentCUDAStream(index_)});
  }
  void compute_waits(const DeviceEvent& event) override {
    const c10::cuda::CUDAGuard guard(index_);
    for (cudaEvent_t e : of(event))
      check(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(index_).stream(), e, 0),
            "cudaStreamWaitEvent");
  }
  void copies_wait(const DeviceEvent& event) override {
    const c10::cuda::CUDAGuard guard(index_);
    for (cudaEvent_t e : of(event))
      for (const c10::cuda::CUDAStream& copies : {up_, down_})
        check(cudaStreamWaitEvent(copies.stream(), e, 0), "cudaStreamWaitEvent");
  }
  void copies_down_wait(const DeviceEvent& event) override {
    const c10::cuda::CUDAGuard guard(index_);
    for (cudaEvent_t e : of(event))
      check(cudaStreamWaitEvent(down_.stream(), e, 0), "cudaStreamWaitEvent");
  }
  void host_waits(const DeviceEvent& event) override {
    if (done(event)) return;
    accounts_.count_host_wait();
    for (cudaEvent_t e : of(event)) check(cudaEventSynchronize(e), "cudaEventSynchronize");
  }
  bool done(const DeviceEvent& event) const override {
    for (cudaEvent_t e : of(event))
      if (!finished(e)) return false;
    return true;
  }

  std::uint64_t measured_peak() const override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index_);
    return static_cast<std::uint64_t>(stats.allocated_bytes[0].peak);  // [0]: every pool
  }
  std::uint64_t capacity() const override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index_);
    const c10::cuda::CUDAGuard guard(index_);
    std::size_t free = 0, card = 0;
    if (cudaMemGetInfo(&free, &card) != cudaSuccess) {
      (void)cudaGetLastError();
      return total();
    }
    return std::min<std::uint64_t>(
        total(), static_cast<std::uint64_t>(stats.reserved_bytes[0].current) + free);
  }
  void reset_peak() override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(index_);
    DeviceTier::reset_peak();
  }

 private:
  struct Owned {
    std::shared_ptr<TierLifetime> lifetime;  // the tier's budget, while it lives
    c10::cuda::CUDAStream up;                // streams from the pool outlive every tier
    c10::cuda::CUDAStream down;
    c10::cuda::CUDAStream compute_stream;  // current when it was allocated
    std::size_t bytes;
    c10::DataPtr inner;
    // Which copy streams touched the block: its reuse waits for those (one no copy touched is
    // reused as soon as the compute stream passes its free).
    bool copied_up = false;
    bool copied_down = false;
  };

  // Marks the block holding `device_memory` (if the tier gave it) as touched by a copy stream.
  void copied_by(const void* device_memory, bool Owned::*stream) {
    const auto* address = static_cast<const char*>(device_memory);
    std::lock_guard<std::mutex> lock(live_mutex_);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return;
    --it;
    if (address < it->first + it->second->bytes) it->second->*stream = true;
  }

  struct Registered {
    c10::DeviceIndex device;
    c10::cuda::CUDAStream up;
    c10::cuda::CUDAStream down;
    void* memory;
  };

  // `bytes` (a multiple of `page`) of host memory aligned to `page` (the system's page size),
  // registered with GPU `device`'s context (the thread may have another device current, or none:
  // the primary context of GPU 0 would be made for it).
  static void* page_locked(c10::DeviceIndex device, std::size_t bytes, std::size_t page) {
    const c10::cuda::CUDAGuard guard(device);
    void* memory = std::aligned_alloc(page, bytes);
    if (memory == nullptr) throw std::bad_alloc();
    if (const cudaError_t status = cudaHostRegister(memory, bytes, cudaHostRegisterDefault);
        status != cudaSuccess) {
      std::free(memory);
      (void)cudaGetLastError();
      throw Error(ErrorKind::InvalidInput,
                  "cuda:" + std::to_string(device) + ": could not page-lock " +
                      std::to_string(bytes) + " bytes of host memory for copies to and from " +
                      "the GPU: " + cudaGetErrorString(status),
                  "free host memory, or keep less in host memory (strategy.options "
                  "host_param_frac, host_optim_frac)");
    }
    return memory;
  }

  // Released rarely (a shard that moves to the device, the end of a run, a phase's buffers): the
  // copies queued so far may still read or write it, so they are waited for unless known done;
  // errors are ignored at process exit, when the CUDA runtime may be gone.
  static void unlock(c10::DeviceIndex device, const c10::cuda::CUDAStream& up,
                     const c10::cuda::CUDAStream& down, void* memory, bool copies_done = false) {
    int current = 0;  // restored after: the caller's thread keeps its device
    if (cudaGetDevice(&current) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
      if (!copies_done) {
        cudaStreamSynchronize(up.stream());
        cudaStreamSynchronize(down.stream());
      }
      cudaHostUnregister(memory);
      cudaSetDevice(current);
    }
    (void)cudaGetLastError();
    std::free(memory);
  }
  static void free_registered(void* context) {
    auto* registered = static_cast<Registered*>(context);
    unlock(registered->device, registered->up, registered->down, registered->memory);
    delete registered;
  }

  // The pool of the tier's buffers: registered memory in the system's pages, released where a
  // phase ends (release_cached_host), where a new block is refused, and at the end of the run.
  static std::shared_ptr<train::HostBlockPool> make_host_pool(c10::DeviceIndex device,
                                                              c10::cuda::CUDAStream up,
                                                              c10::cuda::CUDAStream down) {
    const long system_page = sysconf(_SC_PAGESIZE);
    const std::size_t page = std::max<std::size_t>(
        train::HostBlockPool::kPage, system_page > 0 ? static_cast<std::size_t>(system_page) : 0);
    return std::make_shared<train::HostBlockPool>(
        [device, page](std::size_t bytes) { return page_locked(device, bytes, page); },
        [device, up, down](void* memory, std::size_t, bool copies_done) {
          unlock(device, up, down, memory, copies_done);
        },
        page);
  }

  // A buffer taken from the pool: back to it when freed, reused after the copies queued so far.
  struct HostHeld {
    std::shared_ptr<train::HostBlockPool> pool;
    c10::cuda::CUDAStream up;
    c10::cuda::CUDAStream down;
    void* memory;
  };

  // Whether the event has happened. "Not ready" is left as the thread's last CUDA error, which
  // the next kernel launch's check (ours, and LibTorch's) would report as its own failure: it is
  // cleared, as LibTorch's own queries do.
  static bool finished(cudaEvent_t event) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) check(status, "cudaEventQuery");
    (void)cudaGetLastError();
    return false;
  }

  // As finished(), for a pool's check (which must not throw): an error counts as not done.
  static bool finished_quietly(cudaEvent_t event) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    (void)cudaGetLastError();
    return false;
  }

  static const std::vector<cudaEvent_t>& of(const DeviceEvent& event) {
    return static_cast<const CudaEvent&>(event).events;
  }

  // The caching allocator reuses the block only after the compute and (where a copy touched it)
  // the copies queued so far (recordStream; the block's own stream is ordered already), so
  // freeing never waits on the host. A collective's stream is covered by the compute stream,
  // which waited for it.
  // A deleter must not throw, and the allocator's free records an event per recorded stream
  // (throwing if that fails): after a sticky CUDA error (a device-side fault, the runtime shutting
  // down) the uses are not recorded, and the block goes back without events.
  static void free_device(void* context) {
    auto* owned = static_cast<Owned*>(context);
    const std::shared_ptr<TierLifetime> lifetime = owned->lifetime;
    bool up = true, down = true;  // the tier gone: as if every copy had touched it
    {
      std::lock_guard<std::mutex> lock(lifetime->mutex);
      if (auto* tier = static_cast<CudaDeviceTier*>(lifetime->tier)) {
        tier->accounts_.release(owned->bytes);
        std::lock_guard<std::mutex> live(tier->live_mutex_);
        tier->blocks_.erase(static_cast<const char*>(owned->inner.get()));
        up = owned->copied_up;
        down = owned->copied_down;
      }
    }
    // (Recording the block's own stream, that of its pool, does nothing.)
    const cudaError_t state = cudaStreamQuery(owned->up.stream());
    if (state == cudaSuccess || state == cudaErrorNotReady) {
      try {
        if (up) c10::cuda::CUDACachingAllocator::recordStream(owned->inner, owned->up);
        if (down) c10::cuda::CUDACachingAllocator::recordStream(owned->inner, owned->down);
        c10::cuda::CUDACachingAllocator::recordStream(owned->inner, owned->compute_stream);
      } catch (...) {
      }
    }
    (void)cudaGetLastError();
    delete owned;
  }
  // A deleter must not throw: where the events cannot be made (a sticky CUDA error, the runtime
  // shutting down) the block is never reused.
  static void free_host(void* context) {
    auto* held = static_cast<HostHeld*>(context);
    std::function<bool()> copies_done = [] { return false; };
    try {
      auto after = std::make_shared<CudaEvent>(
          std::initializer_list<c10::cuda::CUDAStream>{held->up, held->down});
      copies_done = [after] {
        return std::all_of(after->events.begin(), after->events.end(), finished_quietly);
      };
    } catch (...) {
    }
    (void)cudaGetLastError();
    held->pool->give_back(held->memory, std::move(copies_done));
    delete held;
  }

  c10::DeviceIndex index_;
  // Copies to the device and copies to the host: a stream each, so that the two directions
  // run beside each other (a GPU has a copy engine for each) and neither waits behind the
  // other's copies waiting for the compute.
  c10::cuda::CUDAStream up_;
  c10::cuda::CUDAStream down_;
  // The live device blocks, by their first byte (copied_by).
  std::mutex live_mutex_;
  std::map<const char*, Owned*> blocks_;
  // Page-locked buffers (allocate_host, allocate_host_io), shared with each one taken.
  std::shared_ptr<train::HostBlockPool> host_pool_;
};

}  // namespace

std::unique_ptr<DeviceTier> make_device_tier(int index, std::uint64_t budget) {
  return std::make_unique<CudaDeviceTier>(index, budget);
}

}  // namespace tessera::cuda
