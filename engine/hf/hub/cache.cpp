#include "hf/hub/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/files.h"
#include "core/temporaries.h"

namespace tessera::hf::hub {
namespace {

// ".tmp.<pid>.<digits>": core/temporaries.h's name for a file written atomically, so that a
// later write into the same folder removes those of a process that was killed.
std::string unique_suffix() {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  std::string suffix = ".tmp.";
  suffix += std::to_string(::getpid());
  suffix += '.';
  suffix += std::to_string(rd());
  suffix += std::to_string(counter++);
  return suffix;
}

void make_dirs(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw_io(dir.string() + ": cannot create the folder: " + ec.message(),
             "check that the Hub cache folder (HF_HUB_CACHE / HF_HOME) is writable");
}

}  // namespace

void write_small_file_atomic(const std::filesystem::path& path, const std::string& contents) {
  make_dirs(path.parent_path());
  const std::filesystem::path tmp = path.string() + unique_suffix();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw_io(tmp.string() + ": cannot create: " + std::strerror(errno));
  bool ok = ::write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size());
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw_io(path.string() + ": cannot write: " + why);
  }
}

CacheRepo::CacheRepo(std::filesystem::path cache_dir, std::string repo_id, RepoType type)
    : cache_dir_(std::move(cache_dir)), repo_id_(std::move(repo_id)), type_(type) {
  validate_repo_id(repo_id_);
  dir_ = cache_dir_ / repo_folder_name(repo_id_, type_);
}

std::filesystem::path CacheRepo::blob_path(const std::string& etag) const {
  return dir_ / "blobs" / normalize_etag(etag, "etag");
}

std::filesystem::path CacheRepo::snapshot_dir(const std::string& commit) const {
  if (!is_commit_hash(commit)) throw_invalid("\"" + commit + "\" is not a commit hash");
  return dir_ / "snapshots" / commit;
}

std::filesystem::path CacheRepo::pointer_path(const std::string& commit,
                                              const std::string& file) const {
  validate_repo_path(file, "the file list of " + repo_id_);
  return snapshot_dir(commit) / file;
}

std::filesystem::path CacheRepo::lock_path(const std::string& etag) const {
  return cache_dir_ / ".locks" / repo_folder_name(repo_id_, type_) /
         (normalize_etag(etag, "etag") + ".lock");
}

std::optional<std::string> CacheRepo::resolve(const std::string& revision) const {
  if (is_commit_hash(revision)) return revision;
  validate_revision(revision);
  std::ifstream in(dir_ / "refs" / revision);
  if (!in) return std::nullopt;
  std::string commit;
  std::getline(in, commit);
  while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back())))
    commit.pop_back();
  if (!is_commit_hash(commit)) return std::nullopt;
  return commit;
}

void CacheRepo::write_ref(const std::string& revision, const std::string& commit) const {
  if (revision == commit) return;
  validate_revision(revision);
  // A download killed while writing a ref left its temporary: gone with its process.
  core::remove_dead_temporaries((dir_ / "refs" / revision).parent_path());
  if (resolve(revision) == commit) return;  // unchanged: a read-only cache stays usable
  write_small_file_atomic(dir_ / "refs" / revision, commit);
}

void CacheRepo::link(const std::string& commit, const std::string& file,
                     const std::string& etag) const {
  const std::filesystem::path pointer = pointer_path(commit, file);
  const std::filesystem::path blob = blob_path(etag);
  make_dirs(pointer.parent_path());
  core::remove_dead_temporaries(pointer.parent_path());
  const std::filesystem::path target = blob.lexically_relative(pointer.parent_path());
  const std::filesystem::path tmp = pointer.string() + unique_suffix();
  std::error_code ec;
  std::filesystem::create_symlink(target, tmp, ec);
  if (!ec) std::filesystem::rename(tmp, pointer, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw_io(pointer.string() + ": cannot link to " + blob.string() + ": " + ec.message());
  }
}

void CacheRepo::write_tree(const std::string& commit, const std::vector<RepoFile>& files) const {
  const std::filesystem::path path = dir_ / "trees" / (commit + ".json");
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return;
  nlohmann::json listing = nlohmann::json::object();
  for (const auto& f : files) {
    if (f.blob_id.empty() || f.size < 0) return;  // incomplete listing: write none
    nlohmann::json entry{{"size", f.size}, {"blob_id", f.blob_id}};
    if (!f.lfs_sha256.empty()) {
      entry["lfs_sha256"] = f.lfs_sha256;
      entry["lfs_size"] = f.size;
    }
    listing[f.path] = entry;
  }
  (void)snapshot_dir(commit);  // validates the commit
  write_small_file_atomic(path, nlohmann::json{{"format_version", 1}, {"files", listing}}.dump(2));
}

std::vector<RepoFile> CacheRepo::listed_files(const std::string& commit) const {
  if (auto tree = read_tree(commit)) return std::move(*tree);
  std::vector<RepoFile> files;
  const std::filesystem::path snapshot = snapshot_dir(commit);
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(snapshot, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory()) continue;
    RepoFile f;
    f.path = it->path().lexically_relative(snapshot).generic_string();
    std::error_code size_error;
    f.size = static_cast<std::int64_t>(it->file_size(size_error));
    if (size_error) f.size = -1;
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(),
            [](const RepoFile& a, const RepoFile& b) { return a.path < b.path; });
  return files;
}

std::optional<std::vector<RepoFile>> CacheRepo::read_tree(const std::string& commit) const {
  const std::filesystem::path path = dir_ / "trees" / (commit + ".json");
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json doc = nlohmann::json::parse(in);
    if (doc.value("format_version", 0) != 1) return std::nullopt;
    std::vector<RepoFile> files;
    for (const auto& [name, entry] : doc.at("files").items()) {
      validate_repo_path(name, path.string());
      RepoFile f;
      f.path = name;
      f.size = entry.value("size", std::int64_t{-1});
      f.blob_id = entry.value("blob_id", std::string());
      if (entry.contains("lfs_sha256") && entry["lfs_sha256"].is_string()) {
        f.lfs_sha256 = entry["lfs_sha256"].get<std::string>();
        f.size = entry.value("lfs_size", f.size);
      }
      files.push_back(std::move(f));
    }
    return files;
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(path.string() + ": not a valid tree listing: " + e.what(),
                  "delete the file; the next download writes it again");
  }
}

BlobLock::BlobLock(const std::filesystem::path& path, const std::atomic<bool>* cancel) {
  make_dirs(path.parent_path());
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0664);
  if (fd_ < 0) throw_io(path.string() + ": cannot open the lock file: " + std::strerror(errno));
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const std::string why = std::strerror(errno);
      ::close(fd_);
      throw_io(path.string() + ": cannot lock: " + why);
    }
    if (cancel != nullptr && cancel->load()) {
      ::close(fd_);
      throw_io("cancelled while waiting for " + path.string() +
               " (another process is downloading this file)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

BlobLock::~BlobLock() {
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
}

}  // namespace tessera::hf::hub
