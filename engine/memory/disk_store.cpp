#include "memory/disk_store.h"

#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/files.h"

namespace tessera::memory {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFolderPrefix = "tessera-offload-";

// Removes the scratch folders of processes that are gone (kill -9 leaves them behind).
void remove_dead_folders(const fs::path& offload_folder) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(offload_folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kFolderPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + std::strlen(kFolderPrefix), nullptr, 10);
    if (pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive
    fs::remove_all(entry.path(), ec);
  }
}

}  // namespace

void PageUnmap::operator()(void* p) const {
  ::munmap(p, bytes);
}

AlignedBuffer::AlignedBuffer(std::size_t bytes) : bytes_(bytes) {
  // Straight from the kernel: page-aligned, zero-filled, and returned to it on destruction (the
  // heap would keep freed chunk buffers, and the memory a tier reports would not drop).
  const std::size_t mapped = std::max<std::size_t>(io_size(bytes), kIoAlignment);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  data_ = std::unique_ptr<void, PageUnmap>(p, PageUnmap{mapped});
}

std::uint64_t io_size(std::uint64_t bytes) {
  return (bytes + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
}

// With a host budget the user set, what the process holds resident is that budget. glibc raises its
// mmap threshold up to 32 MiB as large blocks are freed, after which buffers of a few MiB (the
// update's slices, gradients widened to float32) come from the heap and their memory stays resident
// once freed: a 1.36B bf16 llama all on disk was OOM-killed in a 1.75 GiB cgroup without this and
// peaks at 1.31 GiB with it. A fixed threshold (which also ends the adjustment) gives larger blocks
// back at once; 4 MiB rather than 1 because every block above it is a fresh mapping, page-faulted
// anew: at 1 MiB gpt2-small's step all on disk took 6.5 s instead of 5.7 (bench_gemini), at 4
// MiB 5.6.
void bound_heap_retention() {
#if defined(__GLIBC__)
  constexpr int kLargeBlockBytes = 4 << 20;
  mallopt(M_MMAP_THRESHOLD, kLargeBlockBytes);
  mallopt(M_TRIM_THRESHOLD, kLargeBlockBytes);
#endif
}

DiskStore::DiskStore(const fs::path& offload_folder, int io_threads) {
  std::error_code ec;
  created_parent_ = !fs::exists(offload_folder, ec);
  fs::create_directories(offload_folder, ec);
  // A folder the user may not write, or a path through a file, is the spec's fault (exit 2, as
  // for output.dir); anything else is the system refusing (exit 1).
  if (ec == std::errc::permission_denied || ec == std::errc::read_only_file_system ||
      ec == std::errc::not_a_directory || ec == std::errc::operation_not_permitted ||
      ec == std::errc::no_such_file_or_directory)
    throw_invalid("strategy.options.offload_dir: cannot create the offload folder " +
                      offload_folder.string() + " (" + ec.message() + ")",
                  "give a folder this user can write (strategy.options.offload_dir), or leave "
                  "it out to use the run folder's offload/");
  if (ec)
    throw_io(
        "offload folder " + offload_folder.string() + ": cannot create it (" + ec.message() + ")",
        "choose another strategy.options.offload_dir");
  remove_dead_folders(offload_folder);
  folder_ = offload_folder / (kFolderPrefix + std::to_string(::getpid()));
  fs::remove_all(folder_, ec);
  fs::create_directory(folder_, ec);
  if (ec)
    throw_io("offload folder " + folder_.string() + ": cannot create it (" + ec.message() + ")",
             "choose another strategy.options.offload_dir");
  if (const char* delay = std::getenv(kSlowDiskVariable))
    test_delay_ = std::chrono::milliseconds(std::strtol(delay, nullptr, 10));
  for (int i = 0; i < std::max(io_threads, 1); ++i)
    workers_.emplace_back([this] { worker_loop(); });
}

DiskStore::~DiskStore() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  for (Region& r : regions_)
    if (r.fd >= 0) ::close(r.fd);
  std::error_code ec;
  fs::remove_all(folder_, ec);
  // The offload folder too when this store made it and nothing else is left in it (removing a
  // non-empty folder fails, which is what we want).
  if (created_parent_) fs::remove(folder_.parent_path(), ec);
}

std::size_t DiskStore::add_region(const std::string& name, std::uint64_t bytes) {
  std::lock_guard lock(regions_mutex_);
  const std::size_t id = regions_.size();
  const fs::path path = folder_ / ("region-" + std::to_string(id) + ".bin");
  int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = direct_io_ ? ::open(path.c_str(), flags | O_DIRECT, 0600) : -1;
  if (fd < 0) {
    // tmpfs and some other filesystems refuse O_DIRECT (EINVAL): go buffered from then on.
    direct_io_ = false;
    fd = ::open(path.c_str(), flags, 0600);
  }
  if (fd < 0)
    throw_io("offload folder " + folder_.string() + ": cannot create " + path.filename().string() +
                 " (" + std::strerror(errno) + ")",
             "choose another strategy.options.offload_dir");
  regions_.push_back({name, io_size(bytes), fd, false});
  return id;
}

std::uint64_t DiskStore::region_bytes(std::size_t id) const {
  std::lock_guard lock(regions_mutex_);
  return regions_.at(id).bytes;
}

fs::path DiskStore::region_path(std::size_t id) const {
  return folder_ / ("region-" + std::to_string(id) + ".bin");
}

std::uint64_t DiskStore::bytes_on_disk() const {
  std::lock_guard lock(regions_mutex_);
  std::uint64_t total = 0;
  for (const Region& r : regions_)
    if (r.written) total += r.bytes;
  return total;
}

std::future<void> DiskStore::write(std::size_t id, const void* buffer) {
  return submit([this, id, buffer] { transfer(id, const_cast<void*>(buffer), true); });
}

std::future<void> DiskStore::read(std::size_t id, void* buffer) {
  return submit([this, id, buffer] { transfer(id, buffer, false); });
}

std::future<void> DiskStore::write_range(std::size_t id, std::uint64_t offset, std::uint64_t bytes,
                                         const void* buffer) {
  return submit([this, id, offset, bytes, buffer] {
    transfer(id, const_cast<void*>(buffer), true, offset, bytes, false);
  });
}

std::future<void> DiskStore::read_range(std::size_t id, std::uint64_t offset, std::uint64_t bytes,
                                        void* buffer) {
  return submit(
      [this, id, offset, bytes, buffer] { transfer(id, buffer, false, offset, bytes, false); });
}

std::future<void> DiskStore::submit(std::function<void()> work) {
  std::packaged_task<void()> task(std::move(work));
  std::future<void> done = task.get_future();
  {
    std::lock_guard lock(queue_mutex_);
    queue_.push_back(std::move(task));
  }
  queue_cv_.notify_one();
  return done;
}

void DiskStore::worker_loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (test_delay_.count() > 0) std::this_thread::sleep_for(test_delay_);
    task();  // exceptions are stored in the future
  }
}

void DiskStore::transfer(std::size_t id, void* buffer, bool is_write, std::uint64_t offset,
                         std::uint64_t bytes, bool whole_region) {
  int fd = -1;
  std::string name;
  bool written = false;
  {
    std::lock_guard lock(regions_mutex_);
    const Region& r = regions_.at(id);
    fd = r.fd;
    if (whole_region) bytes = r.bytes;
    name = r.name;
    written = r.written;
    if (!whole_region &&
        (offset % kIoAlignment != 0 || bytes % kIoAlignment != 0 || offset + bytes > r.bytes))
      throw Error(ErrorKind::Internal, "offload: range of " + std::to_string(bytes) + " bytes at " +
                                           std::to_string(offset) + " of region " + name +
                                           " is not aligned or not inside it");
  }
  if (!written && (!is_write || !whole_region))
    throw Error(ErrorKind::Internal, "offload: region " + name + " used before it was written");
  auto* bytes_ptr = static_cast<char*>(buffer);
  std::uint64_t done = 0;
  while (done < bytes) {
    const auto at = static_cast<off_t>(offset + done);
    const ssize_t n = is_write ? ::pwrite(fd, bytes_ptr + done, bytes - done, at)
                               : ::pread(fd, bytes_ptr + done, bytes - done, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      const std::string what = std::string(is_write ? "writing " : "reading ") + name + " (" +
                               core::human_bytes(bytes) + ") in " + folder_.string() +
                               " failed: " + std::strerror(err);
      if (err == ENOSPC || err == EDQUOT)
        throw_io("offload folder " + folder_.parent_path().string() + " is full: " + what,
                 "free space there, or choose another strategy.options.offload_dir, or offload "
                 "less (offload_optim_frac)");
      throw_io("offload: " + what, "check the disk under strategy.options.offload_dir");
    }
    done += static_cast<std::uint64_t>(n);
  }
  (is_write ? bytes_written_ : bytes_read_) += bytes;
  if (is_write && whole_region) {
    std::lock_guard lock(regions_mutex_);
    regions_[id].written = true;
  }
}

}  // namespace tessera::memory
