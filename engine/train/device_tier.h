#pragma once
// The memory of the device a plugin computes on, as Gemini's device tier uses it: allocate and
// free device memory within a budget, copy between it and host buffers on two copy streams (to
// the device, to the host) that run beside the compute, and order them with events — never a
// device-wide synchronize. Two implementations: a CUDA GPU (cuda/module/device_tier_cuda.cpp, in
// the CUDA module), and a simulated device for tests: host memory with a byte budget, a copy
// thread per stream and its own
// accounting, named "simulated" in every message, and refused unless TESSERA_SIMULATED_DEVICE=1
// (which only the tests set). It makes races visible: fresh allocations and the destination of a
// copy are filled with NaN until the copy thread has run, so compute that does not wait for a
// copy's event reads NaN; a copy runs only once something waits for it, and the wait fails
// (Internal) if its source changed after it was queued; a copy touching memory that compute
// writes first, before the copies waited for compute since its allocation, is refused, and so
// is a copy whose memory a copy the other way, not yet waited for, touches; a copy's host side
// must be memory the tier gave (page-locked on a GPU).
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/error.h"

namespace at {
class Tensor;
}  // namespace at

namespace tessera::train {

// The device tier could not give `asked` bytes: its budget (or the card) is full. Exit 2: the
// plan must change (a smaller share on the device, a smaller batch).
class DeviceOutOfMemory : public Error {
 public:
  DeviceOutOfMemory(const std::string& device, std::uint64_t asked, std::uint64_t used,
                    std::uint64_t total, const std::string& what);
  std::uint64_t asked() const { return asked_; }
  // What the tier would have held with it: in use, and asked.
  std::uint64_t needed() const { return used_ + asked_; }

 private:
  std::uint64_t asked_ = 0;
  std::uint64_t used_ = 0;
};

// A point on one of the device's streams; done once everything queued before it has run.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

struct DeviceTraffic {
  std::uint64_t bytes_to_device = 0;
  std::uint64_t bytes_to_host = 0;
  std::uint64_t copies = 0;
  std::uint64_t host_waits = 0;  // times the host blocked on an event
};

// The budget and counters of a device tier, kept the same way by both implementations.
class TierAccounts {
 public:
  explicit TierAccounts(std::uint64_t budget) : budget_(budget) {}
  // Counts `bytes` as allocated, or throws DeviceOutOfMemory naming `device` and `what`.
  void reserve(std::size_t bytes, const std::string& device, const std::string& what);
  void release(std::size_t bytes);
  void count_copy(std::size_t bytes, bool to_device);
  void count_host_wait();
  std::uint64_t used() const;
  std::uint64_t peak() const;
  void reset_peak();
  std::uint64_t budget() const { return budget_; }
  DeviceTraffic traffic() const;

 private:
  const std::uint64_t budget_;
  mutable std::mutex mutex_;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
  DeviceTraffic traffic_;
};

class DeviceTier;

// Which stream writes a new allocation first. On a GPU the caching allocator hands a block freed
// on stream S to the next allocation on S at once (S's later work runs after the old tensor's),
// so a block written first by the other stream could still be in use by work queued for its
// previous tensor: the block comes from the pool of the stream that writes it first, and its
// release waits for both.
enum class FirstWriter {
  compute,  // kernels on the compute stream (or a collective queued after them)
  copies,   // copy_to_device on the copies-up stream
};

// Memory from a tier can outlive it: a model's parameters are views of Gemini's chunk memory and
// are freed after the plugin that owns the tier. Each allocation's release reaches the tier
// through this, which the tier ends first thing in its destructor; after that a release only
// frees the memory.
struct TierLifetime {
  std::mutex mutex;
  DeviceTier* tier = nullptr;  // null once the tier is going
};

class DeviceTier {
 public:
  virtual ~DeviceTier() { end_lifetime(); }
  // "cuda:0", "simulated".
  virtual std::string name() const = 0;
  // Where tensors over this tier's memory live: the GPU, or the CPU for the simulated device.
  virtual c10::Device tensor_device() const = 0;
  virtual bool simulated() const { return false; }

  // Device memory, freed when the DataPtr goes (after the copies and compute queued so far that
  // may use it). Throws DeviceOutOfMemory past the budget; `what` names the use in that message.
  // Memory first written by compute is copied to or from only after copies_wait() on a
  // compute event recorded after it was allocated (the simulated device refuses otherwise).
  virtual c10::DataPtr allocate(std::size_t bytes, const std::string& what,
                                FirstWriter first_writer) = 0;
  // Host memory to copy from and to (page-locked on a GPU, so copies are asynchronous), for
  // buffers that come and go: on a GPU from the tier's pool (host_block_pool.h: reused at its
  // size rounded to a page, once the copies queued before its release are done).
  virtual c10::DataPtr allocate_host(std::size_t bytes) = 0;
  // Host memory that stays, such as a parameter shard's home: page-locked on a GPU at its own
  // size (registered with the driver, not rounded up); its release waits for the copies queued
  // before it.
  virtual c10::DataPtr allocate_host_resident(std::size_t bytes) = 0;
  // Host memory that disk I/O reads into or writes from as well (O_DIRECT): as allocate_host's,
  // its address aligned to kHostIoAlignment; `bytes` is what the I/O moves (the disk store's
  // rounded size).
  virtual c10::DataPtr allocate_host_io(std::size_t bytes) = 0;
  static constexpr std::size_t kHostIoAlignment = 4096;
  // Gives back to the system the host buffers kept for reuse (a GPU's pool) whose copies are
  // done, where a phase is over (training's buffers before the export, a staging replaced);
  // returns their bytes.
  virtual std::size_t release_cached_host() { return 0; }

  // Queued on the copy stream of its direction, behind what it already has; returns at once.
  // Copies to the device and copies to the host run on two streams with no order between them
  // (a GPU's two copy engines): a copy that touches memory a copy the other way touches is
  // queued after waiting for that one (the simulated device refuses it otherwise). Neither
  // buffer may be touched until an event recorded after the copy is done. The host buffer is memory
  // from the allocate_host* functions above (on a GPU a copy from other memory would hold the host
  // until it is done; the simulated device refuses it).
  virtual void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) = 0;

  // Runs `issue` (a collective's launch) so that its work waits for the copies queued so far
  // instead of the compute: on a GPU with the copies-up stream current (NCCL's stream waits for the
  // current stream at launch), on the simulated device once those copies are done. The memory
  // the collective writes must come from the copies' pool (FirstWriter::copies).
  virtual void issue_after_copies(const std::function<void()>& issue) = 0;

  // Events after what the copy streams (both), or the compute, have queued so far.
  virtual std::shared_ptr<DeviceEvent> record_copies() = 0;
  // After the copies to the device queued so far only: what compute waits for before it reads
  // what came up (waiting for both streams would hold it behind copies down that wait for it).
  virtual std::shared_ptr<DeviceEvent> record_copies_up() = 0;
  virtual std::shared_ptr<DeviceEvent> record_compute() = 0;
  // Orderings without blocking the host: later compute after `event`, later copies after it.
  virtual void compute_waits(const DeviceEvent& event) = 0;
  virtual void copies_wait(const DeviceEvent& event) = 0;
  // Only the copies to the host wait (before copying down what compute wrote): the copies up
  // queued later may still run ahead of `event`, prefetching.
  virtual void copies_down_wait(const DeviceEvent& event) = 0;
  // Blocks the host until `event` is done (to read a host buffer a copy filled).
  virtual void host_waits(const DeviceEvent& event) = 0;
  virtual bool done(const DeviceEvent& event) const = 0;

  // Bytes allocated through allocate() and alive, their peak since reset_peak(), and the budget.
  std::uint64_t used() const { return accounts_.used(); }
  std::uint64_t peak() const { return accounts_.peak(); }
  // Everything the device held at most since reset_peak(): on a GPU the caching allocator's
  // peak (activations and workspace too); on the simulated device its own peak (nothing else
  // allocates there: activations are host memory).
  virtual std::uint64_t measured_peak() const { return peak(); }
  virtual void reset_peak() { accounts_.reset_peak(); }
  std::uint64_t total() const { return accounts_.budget(); }
  // What the tier can hold at most now: its budget, or on a GPU less what others took from the
  // card since the budget was set (NCCL's buffers made at the first collective, another process):
  // the caching allocator's reserved bytes and the driver's free memory.
  virtual std::uint64_t capacity() const { return total(); }
  DeviceTraffic traffic() const { return accounts_.traffic(); }

 protected:
  explicit DeviceTier(std::uint64_t budget)
      : accounts_(budget), lifetime_(std::make_shared<TierLifetime>()) {
    lifetime_->tier = this;
  }
  // Releases that come later free their memory without reaching this tier.
  void end_lifetime() {
    std::lock_guard<std::mutex> lock(lifetime_->mutex);
    lifetime_->tier = nullptr;
  }
  TierAccounts accounts_;
  std::shared_ptr<TierLifetime> lifetime_;
};

// The environment variable that allows the simulated device (tests only).
inline constexpr const char* kSimulatedDeviceVariable = "TESSERA_SIMULATED_DEVICE";

// `device`: "simulated", "cuda" or "cuda:N"; `budget`: bytes the tier may allocate (0: the
// card's free memory now; required for the simulated device). `field` names the option in
// errors. Throws InvalidInput for an unknown name or a simulated device outside the tests, and
// Unsupported for CUDA in a build or on a machine without it.
std::unique_ptr<DeviceTier> make_device_tier(const std::string& device, std::uint64_t budget,
                                             const std::string& field);

// A flat tensor of `numel` elements of `dtype` over memory a tier gave (device memory, or host
// memory for its copies), on the device the DataPtr names; the memory goes with the last tensor
// over it.
at::Tensor tensor_over(c10::DataPtr data, std::int64_t numel, c10::ScalarType dtype);

// The CUDA implementation, from the CUDA module (cuda/runtime.h); null where it is not loaded.
std::unique_ptr<DeviceTier> make_cuda_device_tier(int index, std::uint64_t budget);

}  // namespace tessera::train
