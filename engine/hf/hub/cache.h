#pragma once
// The cache layout huggingface_hub uses, so both tools read and write one cache:
//   <cache>/models--org--name/blobs/<etag>                 file contents, named by etag
//   <cache>/models--org--name/snapshots/<commit>/<path>    relative symlinks into blobs/
//   <cache>/models--org--name/refs/<revision>              the commit a branch/tag was at
//   <cache>/models--org--name/trees/<commit>.json          the commit's file list
//   <cache>/.locks/models--org--name/<etag>.lock           flock(2): one writer per blob
// Datasets live under datasets--org--name. Every path is built from validated names.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hf/hub/names.h"

namespace tessera::hf::hub {

// One file of a repository at a commit, as the Hub lists it.
struct RepoFile {
  std::string path;        // inside the repository, validated
  std::int64_t size = -1;  // bytes; -1 when the listing did not say
  std::string blob_id;     // git object id
  std::string lfs_sha256;  // set for LFS files: the content's SHA-256 (and its blob name)
};

class CacheRepo {
 public:
  CacheRepo(std::filesystem::path cache_dir, std::string repo_id, RepoType type);

  const std::filesystem::path& dir() const { return dir_; }
  const std::string& repo_id() const { return repo_id_; }
  RepoType type() const { return type_; }

  std::filesystem::path blob_path(const std::string& etag) const;
  std::filesystem::path snapshot_dir(const std::string& commit) const;
  std::filesystem::path pointer_path(const std::string& commit, const std::string& file) const;
  std::filesystem::path lock_path(const std::string& etag) const;

  // The commit `revision` resolves to: itself when it is a commit hash, else refs/<revision>.
  std::optional<std::string> resolve(const std::string& revision) const;
  // refs/<revision> := commit (temporary file + rename); nothing when revision is the commit.
  void write_ref(const std::string& revision, const std::string& commit) const;
  // snapshots/<commit>/<file> → ../../blobs/<etag> (relative, replaced atomically).
  void link(const std::string& commit, const std::string& file, const std::string& etag) const;
  // trees/<commit>.json in huggingface_hub's format (written once; a commit never changes).
  void write_tree(const std::string& commit, const std::vector<RepoFile>& files) const;
  std::optional<std::vector<RepoFile>> read_tree(const std::string& commit) const;
  // The commit's files: its tree when cached, else what snapshots/<commit> holds (an older
  // huggingface_hub writes no tree), with sizes from the files; sorted by path.
  std::vector<RepoFile> listed_files(const std::string& commit) const;

 private:
  std::filesystem::path cache_dir_;
  std::string repo_id_;
  RepoType type_;
  std::filesystem::path dir_;
};

// An exclusive flock(2) on a lock file, held until destruction: huggingface_hub takes the same
// lock (filelock) on the same path, so neither tool writes a blob the other is writing.
class BlobLock {
 public:
  // Waits for the lock, polling `cancel` (may be null); throws when cancelled.
  BlobLock(const std::filesystem::path& path, const std::atomic<bool>* cancel);
  ~BlobLock();
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_ = -1;
};

// Writes `contents` to `path` through a temporary file in the same folder, fsync and rename.
void write_small_file_atomic(const std::filesystem::path& path, const std::string& contents);

}  // namespace tessera::hf::hub
