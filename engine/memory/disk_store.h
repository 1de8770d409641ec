#pragma once
// The disk tier of Gemini: one scratch file per region (a chunk's optimizer state, say) in a
// folder of this process under the offload folder, read and written asynchronously by a small
// pool of I/O threads so that transfers overlap with compute. Files are opened with O_DIRECT
// where the filesystem allows it (no copy through the page cache; buffers 4 KiB-aligned), else
// buffered. The files are scratch: nothing is fsynced, and the folder is removed when the store
// goes (and by the next store over the same offload folder if this process died).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera::memory {

// Fixes glibc's mmap threshold so that freed blocks above a few MiB leave the resident set at once
// (the runner calls it for every run: the disk tier's host floor and the plan's peaks depend on
// it; LibTorch's large blocks, which would each be a fresh mapping, go through
// train/cpu_block_cache.h instead). No-op outside glibc.
void bound_heap_retention();

constexpr std::size_t kIoAlignment = 4096;

// Unmaps what AlignedBuffer mapped.
struct PageUnmap {
  std::size_t bytes = 0;
  void operator()(void* p) const;
};

// Page-aligned memory (as O_DIRECT needs) mapped from the kernel and unmapped on destruction.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t bytes);  // zero-filled; throws std::bad_alloc
  void* data() const { return data_.get(); }
  std::size_t size() const { return bytes_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  std::unique_ptr<void, PageUnmap> data_;
  std::size_t bytes_ = 0;
};

// Round up to the I/O alignment.
std::uint64_t io_size(std::uint64_t bytes);

// Set by tests to a number of milliseconds that every transfer of a disk store waits before it
// starts, so that whatever overlaps with the disk's I/O is seen to wait for it.
inline constexpr const char* kSlowDiskVariable = "TESSERA_TEST_SLOW_DISK_MS";

class DiskStore {
 public:
  // Creates `<offload_folder>/tessera-offload-<pid>/`, after removing the folders that dead
  // processes left there. Throws tessera::Error (Io) naming the folder when it cannot.
  DiskStore(const std::filesystem::path& offload_folder, int io_threads = 2);
  ~DiskStore();  // waits for pending I/O, removes the folder
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // A region of `bytes` (rounded up to kIoAlignment) named for errors; returns its id. Nothing
  // is written until write().
  std::size_t add_region(const std::string& name, std::uint64_t bytes);
  std::uint64_t region_bytes(std::size_t id) const;

  // Asynchronous transfers of a whole region from/to `buffer` (kIoAlignment-aligned, at least
  // region_bytes long, untouched until the future is ready). A failed write — a full disk,
  // say — surfaces from the future as tessera::Error (Io) naming the folder and the region.
  std::future<void> write(std::size_t id, const void* buffer);
  std::future<void> read(std::size_t id, void* buffer);
  // The same for `bytes` at `offset` inside the region (both multiples of kIoAlignment, within
  // region_bytes); a range may be written only once the region has been written whole.
  std::future<void> write_range(std::size_t id, std::uint64_t offset, std::uint64_t bytes,
                                const void* buffer);
  std::future<void> read_range(std::size_t id, std::uint64_t offset, std::uint64_t bytes,
                               void* buffer);

  const std::filesystem::path& folder() const { return folder_; }
  std::filesystem::path region_path(std::size_t id) const;
  bool direct_io() const { return direct_io_; }
  // Bytes of regions written at least once (what the tier holds on disk).
  std::uint64_t bytes_on_disk() const;
  // Traffic counters since the store was made.
  std::uint64_t bytes_read() const { return bytes_read_.load(); }
  std::uint64_t bytes_written() const { return bytes_written_.load(); }

 private:
  struct Region {
    std::string name;
    std::uint64_t bytes = 0;
    int fd = -1;
    bool written = false;
  };
  std::future<void> submit(std::function<void()> work);
  void worker_loop();
  // `bytes` at `offset`; whole_region: the region's own size from 0.
  void transfer(std::size_t id, void* buffer, bool is_write, std::uint64_t offset = 0,
                std::uint64_t bytes = 0, bool whole_region = true);

  std::filesystem::path folder_;
  bool created_parent_ = false;  // the offload folder did not exist before this store
  bool direct_io_ = true;
  mutable std::mutex regions_mutex_;  // guards regions_ (the vector; a Region's fd is fixed)
  std::vector<Region> regions_;
  std::atomic<std::uint64_t> bytes_read_{0};
  std::atomic<std::uint64_t> bytes_written_{0};

  std::mutex queue_mutex_;  // guards queue_ and stopping_
  std::condition_variable queue_cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  // Tests only (kSlowDiskVariable): each transfer starts this much later, as on a slow disk.
  std::chrono::milliseconds test_delay_{0};
  std::vector<std::thread> workers_;
};

}  // namespace tessera::memory
