#pragma once
// File access: read-only memory maps, whole-file reads, and atomic writes
// (temporary file, fsync, rename, directory fsync) so a crash never leaves a torn file.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace tessera::core {

// An open file descriptor, closed when this goes (-1: none).
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path);  // throws tessera::Error
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }
  // Drops the mapped pages from the process's resident set (madvise DONTNEED); the mapping stays
  // valid, and a later read faults them in again from the page cache or the file.
  void release_resident_pages() const;
  // The same for the pages holding [begin, begin + length) of the mapping (whole pages: a
  // neighbour's bytes on a page at either end are faulted in again when read).
  void release_resident_pages(const std::uint8_t* begin, std::size_t length) const;

 private:
  std::filesystem::path path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

std::string read_text_file(const std::filesystem::path& path);  // throws tessera::Error

// Writes `contents` to `path` atomically: nothing is visible at `path` until the whole
// file is on disk.
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// Makes `folder` (and its parents) for output and checks that a file can be written in it, so a
// place that cannot be written is refused before any work: tessera::Error InvalidInput (exit 2)
// naming the folder and the reason (read-only file system, permission, a file in the way, a full
// disk), with `what` — how the user chose it, e.g. "--out" — in the hint.
void create_output_folder(const std::filesystem::path& folder, const std::string& what);

// `path` made absolute, or its nearest existing parent where it does not exist yet (a folder made
// on first use: its filesystem's free space is that parent's).
std::filesystem::path nearest_existing(const std::filesystem::path& path);

// fsync a directory so a rename inside it is durable.
void fsync_directory(const std::filesystem::path& dir);

std::string human_bytes(std::uint64_t bytes);

}  // namespace tessera::core
