// The device tier's factory and the simulated device (device_tier.h).
#include "train/device_tier.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/files.h"
#include "cuda/runtime.h"
#include "train/host_block_pool.h"
#include "train/plugin.h"

namespace tessera::train {

DeviceTierMemory device_tier_memory_of(const DeviceTier& tier, const MemoryByCategory& held) {
  DeviceTierMemory d;
  d.device = tier.name();
  d.simulated = tier.simulated();
  d.used = tier.used();
  d.peak = tier.peak();
  d.total = tier.total();
  d.by_category = held;
  const DeviceTraffic traffic = tier.traffic();
  d.bytes_to_device = traffic.bytes_to_device;
  d.bytes_to_host = traffic.bytes_to_host;
  return d;
}

namespace {

// Copies to the device and copies to the host run on two streams, as a GPU's two copy engines
// do: nothing orders one direction's copies after the other's.
constexpr int kUp = 0, kDown = 1, kCopyStreams = 2;

// The copy streams' positions: done once each stream's thread has finished its `sequence`. An
// event of the compute has no copies to wait for (sequences 0) and counts the compute points
// recorded (`compute_point`, from 1), which memory first written by compute checks its copies
// against.
class SimulatedEvent : public DeviceEvent {
 public:
  explicit SimulatedEvent(std::array<std::uint64_t, kCopyStreams> sequence,
                          std::uint64_t compute_point = 0,
                          std::array<std::uint64_t, kCopyStreams> compute_after = {})
      : sequence(sequence), compute_point(compute_point), compute_after(compute_after) {}
  std::array<std::uint64_t, kCopyStreams> sequence;
  std::uint64_t compute_point;
  // An event of the compute: the copies (each stream's sequence) the compute had waited for when
  // it was recorded; copies ordered after this event are ordered after those too.
  std::array<std::uint64_t, kCopyStreams> compute_after;
};

class SimulatedDevice : public DeviceTier {
 public:
  explicit SimulatedDevice(std::uint64_t budget) : DeviceTier(budget) {
    // Tests of what follows an out-of-memory: allocation number N fails as if the budget were
    // full (TESSERA_SIMULATED_DEVICE_FAIL_AT=N), counting only those whose use names
    // TESSERA_SIMULATED_DEVICE_FAIL_WHAT where it is set ("for its update": the update's).
    if (const char* at = std::getenv("TESSERA_SIMULATED_DEVICE_FAIL_AT"))
      fail_at_ = std::stoull(at);
    if (const char* what = std::getenv("TESSERA_SIMULATED_DEVICE_FAIL_WHAT")) fail_what_ = what;
    for (int s = 0; s < kCopyStreams; ++s)
      streams_[s].copier = std::thread([this, s] { copy_loop(s); });
  }
  ~SimulatedDevice() override {
    end_lifetime();  // a block released from now on is freed at once (the copies drain below)
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_cv_.notify_all();
    for (Stream& stream : streams_) stream.copier.join();
  }

  std::string name() const override { return "simulated"; }
  c10::Device tensor_device() const override { return c10::kCPU; }
  bool simulated() const override { return true; }

  c10::DataPtr allocate(std::size_t bytes, const std::string& what,
                        FirstWriter first_writer) override {
    if ((fail_what_.empty() || what.find(fail_what_) != std::string::npos) &&
        ++allocations_ == fail_at_)
      throw DeviceOutOfMemory(name(), bytes, used(), total(), what);
    accounts_.reserve(bytes, name(), what);
    auto* block = new Block{lifetime_, bytes, std::unique_ptr<float[]>(new float[floats(bytes)]),
                            what, first_writer};
    poison(block->memory.get(), bytes);  // device memory starts undefined
    {
      std::lock_guard<std::mutex> lock(mutex_);
      block->covered_from = compute_points_ + 1;
      live_[reinterpret_cast<const char*>(block->memory.get())] = block;
    }
    return {block->memory.get(), block, &SimulatedDevice::free_block, c10::Device(c10::kCPU)};
  }

  // Host memory is host memory here; what the copies may touch is known (check_page_locked).
  // Buffers that come and go are taken from a pool as a GPU's tier takes them (reused once the
  // copies queued before their release are done: its events, here the copy threads' progress);
  // memory that stays is freed in stream order.
  c10::DataPtr allocate_host(std::size_t bytes) override { return pooled(bytes); }
  c10::DataPtr allocate_host_resident(std::size_t bytes) override { return page_locked(bytes); }
  c10::DataPtr allocate_host_io(std::size_t bytes) override { return pooled(bytes); }
  std::size_t release_cached_host() override { return host_pool_->release_kept(); }

  void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) override {
    enqueue_copy(device_dst, host_src, bytes, /*to_device=*/true);
  }
  void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) override {
    enqueue_copy(host_dst, device_src, bytes, /*to_device=*/false);
  }

  // What a GPU's collective stream would do: start once the copies queued so far are done.
  void issue_after_copies(const std::function<void()>& issue) override {
    wait_for(*record_copies_up(), Waiter::collective);
    issue();
  }

  std::shared_ptr<DeviceEvent> record_copies() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::make_shared<SimulatedEvent>(
        std::array<std::uint64_t, kCopyStreams>{streams_[kUp].queued, streams_[kDown].queued});
  }
  std::shared_ptr<DeviceEvent> record_copies_up() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::make_shared<SimulatedEvent>(
        std::array<std::uint64_t, kCopyStreams>{streams_[kUp].queued, 0});
  }
  // Compute runs on the calling thread, so what it queued is done when it returns.
  std::shared_ptr<DeviceEvent> record_compute() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::make_shared<SimulatedEvent>(std::array<std::uint64_t, kCopyStreams>{},
                                            ++compute_points_, compute_after_);
  }
  // Compute is the host thread: ordering it after a copy is waiting for the copy.
  void compute_waits(const DeviceEvent& event) override { wait_for(event, Waiter::compute); }
  // The copy thread runs copies in order after the compute that queued them: nothing to wait,
  // but what a GPU's copies would now be ordered after is kept, to check copies against it.
  void copies_wait(const DeviceEvent& event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Stream& stream : streams_) stream_waits(stream, event);
  }
  void copies_down_wait(const DeviceEvent& event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_waits(streams_[kDown], event);
  }
  void host_waits(const DeviceEvent& event) override { wait_for(event, Waiter::host); }
  bool done(const DeviceEvent& event) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& sequence = sequence_of(event);
    for (int s = 0; s < kCopyStreams; ++s)
      if (streams_[s].completed < sequence[s]) return false;
    return true;
  }

 private:
  struct Block {
    std::shared_ptr<TierLifetime> lifetime;
    std::size_t bytes;
    std::unique_ptr<float[]> memory;
    std::string what;
    FirstWriter first_writer;
    // The first compute point recorded after the allocation: copies into or out of memory that
    // compute writes first are ordered after one at least this late.
    std::uint64_t covered_from = 0;
  };
  // Host memory the tier gave (what a GPU's would page-lock), aligned for disk I/O: its own, or
  // a block of the pool (given back, not freed).
  struct HostBlock {
    HostBlock(std::shared_ptr<TierLifetime> lifetime, std::size_t bytes)
        : lifetime(std::move(lifetime)),
          bytes(bytes),
          memory(std::aligned_alloc(kHostIoAlignment,
                                    (std::max<std::size_t>(bytes, 1) + kHostIoAlignment - 1) /
                                        kHostIoAlignment * kHostIoAlignment)) {
      if (memory == nullptr) throw std::bad_alloc();
    }
    HostBlock(std::shared_ptr<TierLifetime> lifetime, std::size_t bytes,
              std::shared_ptr<HostBlockPool> pool)
        : lifetime(std::move(lifetime)),
          bytes(bytes),
          memory(pool->take(bytes)),
          pool(std::move(pool)) {}
    ~HostBlock() {
      if (!pool) std::free(memory);
    }
    HostBlock(const HostBlock&) = delete;
    HostBlock& operator=(const HostBlock&) = delete;
    std::shared_ptr<TierLifetime> lifetime;
    std::size_t bytes;
    void* memory;
    std::shared_ptr<HostBlockPool> pool;
  };
  // Memory released while copies were queued: freed once every stream that had some has run
  // them (its entry in each of those streams' queues).
  struct PendingFree {
    Block* block = nullptr;
    HostBlock* host = nullptr;
    int streams = 0;  // entries not yet reached
  };
  struct Copy {
    void* dst;
    const void* src;
    std::size_t bytes;
    std::uint64_t sequence;
    // The source's bytes when the copy was queued, unless a copy queued before writes them.
    std::optional<std::uint64_t> source_hash;
    bool to_device = false;
    std::shared_ptr<PendingFree> to_free;  // a free in stream order, not a copy
    bool frees() const { return static_cast<bool>(to_free); }
  };
  // A copy's memory, kept (run or not) until it is ordered before everything queued later. A
  // side whose memory was released is forgotten (null): its next use is ordered after the copy
  // by the free; the other side still races with unordered copies.
  struct Touched {
    std::uint64_t sequence;
    const char* dst;
    const char* src;
    std::size_t bytes;
  };
  struct Stream {
    std::deque<Copy> copies;
    std::uint64_t queued = 0;         // sequence of the last copy queued
    std::uint64_t completed = 0;      // sequence of the last copy done
    std::uint64_t released = 0;       // copies up to this sequence may run
    std::uint64_t after_compute = 0;  // the latest compute point the copies waited for
    // Each stream's copies up to these sequences come before this stream's later ones: through
    // copies_wait() on compute that had waited for them (compute_waits), or an event of them.
    std::array<std::uint64_t, kCopyStreams> ordered_after{};
    // The host waited for these: everything queued later comes after them.
    std::uint64_t host_waited = 0;
    std::deque<Touched> touched;  // copies not yet ordered before everything (host_waited)
    std::thread copier;
  };

  // `stream`'s later copies come after `event` (mutex_ held).
  static void stream_waits(Stream& stream, const DeviceEvent& event) {
    const auto& e = static_cast<const SimulatedEvent&>(event);
    stream.after_compute = std::max(stream.after_compute, e.compute_point);
    for (int o = 0; o < kCopyStreams; ++o)
      stream.ordered_after[o] =
          std::max({stream.ordered_after[o], e.compute_after[o], e.sequence[o]});
  }

  // Memory released: its copies are done before it is reused (the free waits for them, as a
  // GPU's allocators wait for the streams that used a block), so a copy into its next use does
  // not race with them. mutex_ held.
  void forget_touched(const void* memory, std::size_t bytes) {
    const auto* begin = static_cast<const char*>(memory);
    const auto within = [&](const char* p) {
      return p != nullptr && p >= begin && p < begin + bytes;
    };
    for (Stream& stream : streams_) {
      for (Touched& t : stream.touched) {
        if (within(t.dst)) t.dst = nullptr;
        if (within(t.src)) t.src = nullptr;
      }
      std::erase_if(stream.touched,
                    [](const Touched& t) { return t.dst == nullptr && t.src == nullptr; });
    }
  }

  // Queues the release of `pending`'s memory ([memory, memory + bytes)) behind the copies each
  // stream has not run yet (mutex_ held); false when there are none: free it now.
  bool free_after_copies(const std::shared_ptr<PendingFree>& pending, const void* memory,
                         std::size_t bytes) {
    forget_touched(memory, bytes);
    for (Stream& stream : streams_) {
      if (stream.completed >= stream.queued) continue;
      ++pending->streams;
      stream.copies.push_back({nullptr, nullptr, 0, ++stream.queued, std::nullopt, false, pending});
    }
    if (pending->streams == 0) return false;
    queued_cv_.notify_all();
    return true;
  }

  c10::DataPtr page_locked(std::size_t bytes) {
    return live_host(new HostBlock(lifetime_, bytes), &SimulatedDevice::free_host_block);
  }

  // `block`'s memory, known to the copies (check_page_locked) until `free` releases it.
  c10::DataPtr live_host(HostBlock* block, c10::DeleterFnPtr free) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      host_live_[static_cast<const char*>(block->memory)] = block;
    }
    return {block->memory, block, free, c10::Device(c10::kCPU)};
  }

  c10::DataPtr pooled(std::size_t bytes) {
    return live_host(new HostBlock(lifetime_, bytes, host_pool_), &SimulatedDevice::free_pooled);
  }

  // Back to the pool at once, reused once the copies queued so far are done, as a GPU's tier
  // gives its buffers back with events on its copy streams. (Not in stream order through the
  // copy threads: those free under mutex_, and the pool asks the device under its own lock.)
  static void free_pooled(void* context) {
    std::unique_ptr<HostBlock> block(static_cast<HostBlock*>(context));
    const std::shared_ptr<TierLifetime> lifetime = block->lifetime;
    std::shared_ptr<DeviceEvent> after;
    {
      std::lock_guard<std::mutex> alive(lifetime->mutex);
      if (auto* device = static_cast<SimulatedDevice*>(lifetime->tier)) {
        {
          std::lock_guard<std::mutex> lock(device->mutex_);
          device->host_live_.erase(static_cast<const char*>(block->memory));
          device->forget_touched(block->memory, block->bytes);
        }
        after = device->record_copies();
      }
    }
    std::function<bool()> copies_done = [] { return true; };  // the tier gone: its copies ran
    if (after)
      copies_done = [lifetime, after] {
        std::lock_guard<std::mutex> alive(lifetime->mutex);
        const auto* device = static_cast<const SimulatedDevice*>(lifetime->tier);
        return device == nullptr || device->done(*after);
      };
    block->pool->give_back(block->memory, std::move(copies_done));
  }

  // As free_block: once the copies queued before the release are done.
  static void free_host_block(void* context) {
    auto* block = static_cast<HostBlock*>(context);
    const std::shared_ptr<TierLifetime> lifetime = block->lifetime;
    std::lock_guard<std::mutex> alive(lifetime->mutex);
    auto* device = static_cast<SimulatedDevice*>(lifetime->tier);
    if (device != nullptr) {
      std::lock_guard<std::mutex> lock(device->mutex_);
      device->host_live_.erase(static_cast<const char*>(block->memory));
      auto pending = std::make_shared<PendingFree>();
      pending->host = block;
      if (device->free_after_copies(pending, block->memory, block->bytes)) return;
    }
    delete block;
  }

  // A copy's host side must be memory the tier gave: on a GPU, a copy from or to pageable memory
  // runs synchronously (the host waits for it, nothing overlaps). Called with mutex_ held.
  void check_page_locked(const void* host, std::size_t bytes, bool to_device) const {
    const auto* begin = static_cast<const char*>(host);
    auto it = host_live_.upper_bound(begin);
    if (it != host_live_.begin() &&
        begin + bytes <= std::prev(it)->first + std::prev(it)->second->bytes)
      return;
    throw Error(
        ErrorKind::Internal,
        std::string("simulated: a copy ") +
            (to_device ? "to the device reads" : "to the host writes") +
            " host memory that no allocate_host* of the tier gave (" + std::to_string(bytes) +
            " bytes): on a GPU it would be pageable, and the copy would hold the host until done");
  }

  // Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (a null `a`: a forgotten side).
  static bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
    const auto* x = static_cast<const char*>(a);
    const auto* y = static_cast<const char*>(b);
    return x != nullptr && x < y + b_bytes && y < x + a_bytes;
  }

  // FNV-1a over the bytes: the check that a copy's source did not change while it waited.
  static std::uint64_t hash_of(const void* memory, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(memory);
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }

  static std::size_t floats(std::size_t bytes) { return std::max<std::size_t>(1, (bytes + 3) / 4); }
  static void poison(void* memory, std::size_t bytes) {
    std::fill_n(static_cast<float*>(memory), bytes / 4, std::numeric_limits<float>::quiet_NaN());
  }
  static const std::array<std::uint64_t, kCopyStreams>& sequence_of(const DeviceEvent& event) {
    return static_cast<const SimulatedEvent&>(event).sequence;
  }

  // Memory goes once the copies queued before its release are done, as a stream-ordered free:
  // queued behind them when there are any, so the host never waits. Its bytes leave the budget
  // at once, as the CUDA tier's do (the caching allocator reuses the block only after those
  // copies).
  static void free_block(void* context) {
    auto* block = static_cast<Block*>(context);
    const std::shared_ptr<TierLifetime> lifetime = block->lifetime;
    std::lock_guard<std::mutex> alive(lifetime->mutex);
    auto* device = static_cast<SimulatedDevice*>(lifetime->tier);
    if (device == nullptr) {  // the device is gone (its copies done): memory outliving it
      delete block;
      return;
    }
    device->accounts_.release(block->bytes);
    {
      std::lock_guard<std::mutex> lock(device->mutex_);
      device->live_.erase(reinterpret_cast<const char*>(block->memory.get()));
      auto pending = std::make_shared<PendingFree>();
      pending->block = block;
      if (device->free_after_copies(pending, block->memory.get(), block->bytes)) return;
    }
    delete block;
  }

  void enqueue_copy(void* dst, const void* src, std::size_t bytes, bool to_device) {
    std::lock_guard<std::mutex> lock(mutex_);
    Stream& own = streams_[to_device ? kUp : kDown];
    const Stream& other = streams_[to_device ? kDown : kUp];
    check_ordered_after_compute(static_cast<const char*>(to_device ? dst : src), own);
    check_page_locked(to_device ? src : dst, bytes, to_device);
    // Whether a copy queued on `stream`, not run yet, has its source (`side` &Copy::src) or
    // destination (&Copy::dst) overlapping [memory, memory + bytes).
    const auto pending_overlap = [&](const Stream& stream, const void* memory, auto side) {
      return std::any_of(stream.copies.begin(), stream.copies.end(), [&](const Copy& c) {
        return !c.frees() && overlap(c.*side, c.bytes, memory, bytes);
      });
    };
    // A copy the other way that nothing orders before this one (host_waits, or compute_waits
    // then copies_wait on compute recorded after it), run here or not (a GPU's may not have):
    // memory it writes, or reads where this one writes, races with this one on a GPU.
    const int o = to_device ? kDown : kUp;
    const std::uint64_t ordered = std::max(other.host_waited, own.ordered_after[o]);
    if (std::any_of(other.touched.begin(), other.touched.end(), [&](const Touched& t) {
          return t.sequence > ordered &&
                 (overlap(t.dst, t.bytes, src, bytes) || overlap(t.dst, t.bytes, dst, bytes) ||
                  overlap(t.src, t.bytes, dst, bytes));
        }))
      throw Error(ErrorKind::Internal,
                  std::string("simulated: a copy ") +
                      (to_device ? "to the device" : "to the host") + " (" + std::to_string(bytes) +
                      " bytes) touches memory that a copy " +
                      (to_device ? "to the host" : "to the device") +
                      " queued before it, and not waited for, writes or reads: the two "
                      "directions run on separate copy streams, with no order between them");
    // Until the copy thread runs, the destination holds nothing usable (unless a copy queued
    // before reads it: stream order lets that one see the old values).
    if (bytes % 4 == 0 && !pending_overlap(own, dst, &Copy::src)) poison(dst, bytes);
    // A source that a queued copy writes is read in stream order, after it: not checked.
    const bool written_by_pending = pending_overlap(own, src, &Copy::dst);
    own.touched.push_back(
        {own.queued + 1, static_cast<const char*>(dst), static_cast<const char*>(src), bytes});
    own.copies.push_back({dst, src, bytes, ++own.queued,
                          written_by_pending ? std::nullopt : std::optional(hash_of(src, bytes)),
                          to_device, nullptr});
    accounts_.count_copy(bytes, to_device);
    queued_cv_.notify_all();
  }

  // On a GPU, memory compute writes first comes from the compute stream's pool, where its block
  // may still be in use by kernels queued for its previous tensor: a copy may touch it only
  // after copies_wait() on compute recorded since it was allocated. Refused here, where nothing
  // would race, so that the tests find such a copy. Called with mutex_ held.
  void check_ordered_after_compute(const char* device_memory, const Stream& stream) const {
    auto it = live_.upper_bound(device_memory);
    if (it == live_.begin()) return;
    const Block& block = *std::prev(it)->second;
    if (device_memory >= std::prev(it)->first + block.bytes) return;  // not device memory
    if (block.first_writer != FirstWriter::compute || stream.after_compute >= block.covered_from)
      return;
    throw Error(ErrorKind::Internal,
                "simulated: a copy touches " + block.what +
                    ", memory allocated for compute to write first, before the copies waited "
                    "for compute recorded after its allocation: on a GPU its block may still be "
                    "in use by kernels queued for the tensor it held before");
  }

  // Copies run only once something waits for them (or the device goes): a GPU's copy may run
  // any time before that, so whatever the host does between queuing a copy and waiting for it
  // is checked against the copy having run last.
  // Who waits: the host (counted; everything it queues later comes after), the compute (what
  // it orders: compute events recorded later carry it to copies_wait), or a collective.
  enum class Waiter { host, compute, collective };
  void wait_for(const DeviceEvent& event, Waiter waiter) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto sequence = sequence_of(event);
    const auto reached = [&] {
      for (int s = 0; s < kCopyStreams; ++s)
        if (streams_[s].completed < sequence[s]) return false;
      return true;
    };
    if (waiter == Waiter::host && !reached()) accounts_.count_host_wait();
    for (int s = 0; s < kCopyStreams; ++s)
      streams_[s].released = std::max(streams_[s].released, sequence[s]);
    queued_cv_.notify_all();
    done_cv_.wait(lock, reached);
    for (int s = 0; s < kCopyStreams; ++s) {
      Stream& stream = streams_[s];
      if (waiter == Waiter::compute) compute_after_[s] = std::max(compute_after_[s], sequence[s]);
      if (waiter != Waiter::host) continue;
      stream.host_waited = std::max(stream.host_waited, sequence[s]);
      while (!stream.touched.empty() && stream.touched.front().sequence <= stream.host_waited)
        stream.touched.pop_front();
    }
    if (!violation_.empty()) throw Error(ErrorKind::Internal, violation_);
  }

  void copy_loop(int s) {
    Stream& stream = streams_[s];
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      queued_cv_.wait(lock, [&] {
        return stopping_ ||
               (!stream.copies.empty() && stream.copies.front().sequence <= stream.released);
      });
      if (stream.copies.empty()) return;  // stopping, nothing left
      const Copy copy = stream.copies.front();
      stream.copies.pop_front();
      if (copy.frees()) {
        // The last stream to pass the release frees the memory.
        if (--copy.to_free->streams == 0) {
          delete copy.to_free->block;
          delete copy.to_free->host;
        }
      } else {
        lock.unlock();
        const bool changed = copy.source_hash && hash_of(copy.src, copy.bytes) != *copy.source_hash;
        std::memcpy(copy.dst, copy.src, copy.bytes);
        lock.lock();
        if (changed && violation_.empty())
          violation_ = std::string("simulated: the ") + (copy.to_device ? "host" : "device") +
                       " memory a copy " + (copy.to_device ? "to the device" : "to the host") +
                       " reads (" + std::to_string(copy.bytes) +
                       " bytes) changed after the copy was queued and before anything waited "
                       "for it: on a GPU the copy may run that late and copy the new values";
      }
      stream.completed = copy.sequence;
      done_cv_.notify_all();
    }
  }

  std::uint64_t fail_at_ = 0;  // 0: never
  std::string fail_what_;      // empty: every allocation counts
  std::uint64_t allocations_ = 0;
  mutable std::mutex mutex_;  // guards everything below but the thread
  std::condition_variable queued_cv_;
  std::condition_variable done_cv_;
  std::array<Stream, kCopyStreams> streams_;  // copies to the device, copies to the host
  std::uint64_t compute_points_ = 0;          // compute events recorded
  // The copies (each stream's sequence) the compute has waited for (compute_waits).
  std::array<std::uint64_t, kCopyStreams> compute_after_{};
  std::map<const char*, Block*> live_;           // allocations by their first byte
  std::map<const char*, HostBlock*> host_live_;  // host memory the tier gave, by its first byte
  // Buffers that come and go (pooled): plain host memory, released when the pool goes.
  std::shared_ptr<HostBlockPool> host_pool_ = std::make_shared<HostBlockPool>(
      [](std::size_t bytes) {
        void* memory = std::aligned_alloc(HostBlockPool::kPage, bytes);
        if (memory == nullptr) throw std::bad_alloc();
        return memory;
      },
      [](void* memory, std::size_t, bool) { std::free(memory); });
  std::string violation_;  // the first copy whose source changed under it
  bool stopping_ = false;
};

}  // namespace

at::Tensor tensor_over(c10::DataPtr data, std::int64_t numel, c10::ScalarType dtype) {
  const torch::Device where = data.device();
  c10::Storage storage(c10::Storage::use_byte_size_t(),
                       static_cast<std::size_t>(numel) * c10::elementSize(dtype), std::move(data),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return torch::empty({0}, torch::TensorOptions().dtype(dtype).device(where))
      .set_(storage, 0, {numel}, {1});
}

std::unique_ptr<DeviceTier> make_device_tier(const std::string& device, std::uint64_t budget,
                                             const std::string& field) {
  if (device == "simulated") {
    const char* allowed = std::getenv(kSimulatedDeviceVariable);
    if (allowed == nullptr || std::string(allowed) != "1")
      throw_invalid(field + ": \"simulated\" is the test suite's stand-in for a GPU",
                    "use \"cuda\" on a machine with a GPU, or \"cpu\"");
    if (budget == 0)
      throw_invalid(field +
                    ": the simulated device needs a budget (strategy.options.device_budget)");
    return std::make_unique<SimulatedDevice>(budget);
  }
  int index = 0;
  if (device.rfind("cuda:", 0) == 0) {
    try {
      std::size_t used = 0;
      index = std::stoi(device.substr(5), &used);
      if (used != device.size() - 5 || index < 0) throw std::invalid_argument("index");
    } catch (const std::exception&) {
      throw_invalid(field + ": \"" + device + "\" is not a device", "use cuda or cuda:N");
    }
  } else if (device != "cuda") {
    throw_invalid(field + ": \"" + device + "\" is not a device with memory of its own",
                  "use cuda or cuda:N");
  }
  if (!torch::cuda::is_available())
    throw_unsupported(
        field + ": \"" + device + "\": this machine has no CUDA GPU" + cuda::runtime_note(),
        "use device cpu");
  if (index >= static_cast<int>(torch::cuda::device_count()))
    throw_invalid(field + ": \"" + device + "\": this machine has " +
                  std::to_string(torch::cuda::device_count()) + " GPU(s)");
  std::unique_ptr<DeviceTier> cuda = make_cuda_device_tier(index, budget);
  if (!cuda)
    throw_unsupported(field + ": Tessera's CUDA module is " + cuda::runtime_status(),
                      "build with the CUDA toolkit present (TESSERA_WITH_CUDA)");
  return cuda;
}

std::unique_ptr<DeviceTier> make_cuda_device_tier(int index, std::uint64_t budget) {
  const cuda::Runtime* runtime = cuda::runtime();
  return runtime != nullptr ? runtime->make_device_tier(index, budget) : nullptr;
}

}  // namespace tessera::train
