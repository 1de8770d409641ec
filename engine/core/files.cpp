#include "core/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "core/error.h"

namespace tessera::core {

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_io(path.string() + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_io(path.string() + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw_invalid(path.string() + ": not a regular file");
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ == 0) return;  // mmap of length 0 is invalid; an empty span is fine
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (p == MAP_FAILED) throw_io(path.string() + ": cannot map: " + errno_text());
  data_ = static_cast<const std::uint8_t*>(p);
}

void MappedFile::release_resident_pages() const {
  // Advice only: a failure leaves the pages resident, which is what happened without it.
  if (data_ != nullptr) ::madvise(const_cast<std::uint8_t*>(data_), size_, MADV_DONTNEED);
}

void MappedFile::release_resident_pages(const std::uint8_t* begin, std::size_t length) const {
  if (data_ == nullptr || length == 0 || begin < data_ || begin + length > data_ + size_) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t first = static_cast<std::size_t>(begin - data_) / page * page;
  const std::size_t end = std::min(size_, static_cast<std::size_t>(begin - data_) + length);
  ::madvise(const_cast<std::uint8_t*>(data_) + first, end - first, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

std::string read_text_file(const std::filesystem::path& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_io(path.string() + ": cannot open: " + errno_text());
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(path.string() + ": read failed: " + errno_text());
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

namespace {

// The nearest existing folder at or above `p` (for errors: where the path stops being a folder).
std::filesystem::path nearest_existing(std::filesystem::path p) {
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  return p;
}

[[noreturn]] void refuse_output_folder(const std::filesystem::path& folder, int error,
                                       const std::string& what) {
  std::string reason = std::strerror(error);
  if (error == ENOTDIR || error == EEXIST) {
    const std::filesystem::path blocker = nearest_existing(folder);
    reason = blocker.string() + " is a file, not a folder";
  } else if (error == ENOSPC || error == EDQUOT) {
    reason = "the disk is full (" + reason + ")";
  }
  const std::string hint = "choose a folder you can write with " + what;
  if (error == EIO) throw_io(folder.string() + ": cannot write the output folder: " + reason, hint);
  throw_invalid(folder.string() + ": cannot write the output folder: " + reason, hint);
}

}  // namespace

std::filesystem::path nearest_existing(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path existing = fs::absolute(path);
  std::error_code ec;
  while (!fs::exists(existing, ec) && existing.has_parent_path() &&
         existing != existing.parent_path())
    existing = existing.parent_path();
  return existing;
}

void create_output_folder(const std::filesystem::path& folder, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) refuse_output_folder(folder, ec.value(), what);
  if (!std::filesystem::is_directory(folder, ec)) refuse_output_folder(folder, ENOTDIR, what);
  // A folder can exist and still refuse files (read-only mount, permissions): try one.
  const std::filesystem::path probe =
      folder / (".tessera-write-check-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) refuse_output_folder(folder, errno, what);
  const char byte = 0;
  const bool written = ::write(fd, &byte, 1) == 1;
  const int write_error = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!written) refuse_output_folder(folder, write_error, what);
}

void fsync_directory(const std::filesystem::path& dir) {
  FileDescriptor fd(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_io(dir.string() + ": cannot open directory: " + errno_text());
  if (::fsync(fd.get()) != 0) throw_io(dir.string() + ": fsync failed: " + errno_text());
}

void write_file_atomic(const std::filesystem::path& path, std::string_view contents) {
  std::random_device rd;
  auto tmp = path;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  {
    FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw_io(tmp.string() + ": cannot create: " + errno_text());
    const char* p = contents.data();
    std::size_t left = contents.size();
    while (left > 0) {
      ssize_t n = ::write(fd.get(), p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        std::string why = errno_text();
        ::unlink(tmp.c_str());
        throw_io(path.string() + ": write failed: " + why,
                 "check free disk space; the previous file (if any) is untouched");
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) {
      std::string why = errno_text();
      ::unlink(tmp.c_str());
      throw_io(path.string() + ": fsync failed: " + why);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw_io(path.string() + ": rename failed: " + why);
  }
  fsync_directory(path.parent_path());
}

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace tessera::core
