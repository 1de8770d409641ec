#include "hf/hub/client.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/files.h"
#include "hf/hub/http.h"
#include "hf/hub/requests.h"

namespace tessera::hf::hub {
namespace {

using namespace detail;  // the request helpers (requests.h)

using Clock = std::chrono::steady_clock;

// SHA-256 over OpenSSL's EVP interface (uses the CPU's SHA extensions where present).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { reset(); }
  void reset() {
    if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      throw Error(ErrorKind::Internal, "OpenSSL: cannot start a SHA-256");
  }
  void update(const void* data, std::size_t size) { EVP_DigestUpdate(ctx_.get(), data, size); }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(ctx_.get(), digest, &length);
    static const char* kHex = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < length; ++i) {
      out += kHex[digest[i] >> 4];
      out += kHex[digest[i] & 15];
    }
    return out;
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

std::string errno_text() {
  return std::strerror(errno);
}

std::string gated_of(const nlohmann::json& j) {
  if (!j.contains("gated")) return {};
  const auto& g = j["gated"];
  if (g.is_string()) return g.get<std::string>();
  if (g.is_boolean() && g.get<bool>()) return "auto";
  return {};
}

std::string str(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}
// A count or size as the server wrote it; nullopt for anything else, a fraction included, or
// a number no int64 holds (converting such a double is undefined behaviour).
std::optional<std::int64_t> integer(const nlohmann::json& value) {
  if (value.is_number_integer()) return value.get<std::int64_t>();
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (std::isfinite(v) && v == std::trunc(v) && v >= -9.2e18 && v <= 9.2e18)
      return static_cast<std::int64_t>(v);
  }
  return std::nullopt;
}
std::int64_t num(const nlohmann::json& j, const char* key) {
  return j.contains(key) ? integer(j[key]).value_or(0) : 0;
}
// A server's flag; anything but true is false (j.value() would throw on a non-boolean).
bool flag(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
}

// Serializes and throttles progress reports from the worker threads.
class Progress {
 public:
  Progress(const DownloadParams& params, std::int64_t total, int files)
      : callback_(params.on_progress) {
    state_.total_bytes = total;
    state_.files_total = files;
  }
  void add(const std::string& file, std::int64_t bytes, bool force = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    state_.done_bytes += bytes;
    const auto now = Clock::now();
    if (callback_ && (force || now - last_ >= std::chrono::milliseconds(100))) {
      last_ = now;
      state_.file = file;
      callback_(state_);
    }
  }
  void file_done(const std::string& file) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++state_.files_done;
    if (callback_) {
      state_.file = file;
      callback_(state_);
    }
  }

 private:
  std::function<void(const DownloadProgress&)> callback_;
  std::mutex mutex_;
  DownloadProgress state_;
  Clock::time_point last_{};
};

struct FileMeta {
  std::string commit;
  std::string etag;
  std::int64_t size = -1;
  std::string location;  // where the bytes are (the resolve URL, or a CDN it redirects to)
};

class Downloader {
 public:
  Downloader(const Settings& settings, const CacheRepo& cache, const std::string& commit,
             const DownloadParams& params, Progress& progress)
      : settings_(settings), cache_(cache), commit_(commit), params_(params), progress_(progress) {}

  // Makes one file present in the snapshot; returns the bytes received.
  std::int64_t fetch(HttpSession& session, const RepoFile& file) {
    const std::filesystem::path pointer = cache_.pointer_path(commit_, file.path);
    std::error_code ec;
    if (std::filesystem::exists(pointer, ec)) {  // follows the symlink: the blob is there
      progress_.add(file.path, std::max<std::int64_t>(0, file.size), true);
      progress_.file_done(file.path);
      return 0;
    }
    const std::string url =
        settings_.endpoint + (cache_.type() == RepoType::Dataset ? "/datasets/" : "/") +
        cache_.repo_id() + "/resolve/" + commit_ + "/" + url_encode(file.path, true);
    Context c{&settings_, cache_.repo_id(), cache_.type(), commit_, file.path};
    const FileMeta meta = head(session, url, c);
    if (!file.lfs_sha256.empty() && meta.etag != file.lfs_sha256)
      throw_invalid(url + ": the server names the file by " + meta.etag +
                        " but its file list gives the SHA-256 " + file.lfs_sha256,
                    "the repository changed during the download? run again");
    const std::int64_t size = meta.size >= 0 ? meta.size : file.size;
    const std::filesystem::path blob = cache_.blob_path(meta.etag);
    std::int64_t received = 0;
    {
      BlobLock lock(cache_.lock_path(meta.etag), params_.cancel);
      if (!std::filesystem::exists(blob, ec)) {
        received = fetch_blob(session, meta, size, blob, file.path, c);
      } else {
        progress_.add(file.path, std::max<std::int64_t>(0, size), true);
      }
      cache_.link(commit_, file.path, meta.etag);
    }
    progress_.file_done(file.path);
    return received;
  }

 private:
  FileMeta head(HttpSession& session, std::string url, const Context& c) {
    const std::string first_url = url;
    for (int hop = 0; hop < 10; ++hop) {
      HttpResponse r;
      for (int attempt = 1;; ++attempt) {
        HttpRequest request;
        request.method = HttpRequest::Method::Head;
        request.url = url;
        request.headers = auth_headers(settings_, url);
        request.headers.push_back("Accept-Encoding: identity");  // the real size, not gzip's
        try {
          r = session.perform(request);
        } catch (const TransportError& e) {
          if (e.retryable && attempt < params_.max_attempts &&
              wait_before_retry(attempt, nullptr, params_, settings_, url, e.message))
            continue;
          if (cancelled(params_.cancel)) throw DownloadCancelled("download cancelled");
          throw_io(url + ": " + e.message,
                   "check the network (or HF_ENDPOINT); run again to resume");
        }
        if (is_retryable_status(r.status) && attempt < params_.max_attempts &&
            wait_before_retry(attempt, &r, params_, settings_, url))
          continue;
        break;
      }
      const bool redirect = r.status >= 300 && r.status < 400;
      if (!redirect && (r.status < 200 || r.status >= 300)) throw_http(r, url, c);
      FileMeta meta;
      const std::string* location = r.header("location");
      if (redirect) {
        if (location == nullptr)
          throw_io(url + ": HTTP " + std::to_string(r.status) + " without a Location");
        if (location->starts_with("/")) {  // the Hub's own (a renamed repository): follow
          url = url_origin(url) + *location;
          continue;
        }
        meta.location = *location;  // another host (a CDN): the bytes are there
      } else {
        meta.location = url;
      }
      const std::string* commit = r.header("x-repo-commit");
      if (commit == nullptr)
        throw_invalid(first_url + ": the response has no X-Repo-Commit header",
                      "is HF_ENDPOINT a Hub-compatible server? check proxies and firewalls");
      meta.commit = *commit;
      const std::string* etag = r.header("x-linked-etag");
      if (etag == nullptr) etag = r.header("etag");
      if (etag == nullptr)
        throw_invalid(first_url + ": the response has no ETag",
                      "is HF_ENDPOINT a Hub-compatible server?");
      meta.etag = normalize_etag(*etag, first_url);
      const std::string* size = r.header("x-linked-size");
      if (size == nullptr && !redirect) size = r.header("content-length");
      if (size != nullptr) meta.size = std::strtoll(size->c_str(), nullptr, 10);
      return meta;
    }
    throw_io(first_url + ": too many redirects");
  }

  // Downloads into blobs/<etag>.incomplete (resuming what is there), verifies, renames.
  std::int64_t fetch_blob(HttpSession& session, const FileMeta& meta, std::int64_t size,
                          const std::filesystem::path& blob, const std::string& file,
                          const Context& c) {
    const std::filesystem::path incomplete = blob.string() + ".incomplete";
    const bool verify_sha = is_sha256_hex(meta.etag);
    core::FileDescriptor fd(::open(incomplete.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw_io(incomplete.string() + ": cannot open: " + errno_text());
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
      throw_io(incomplete.string() + ": cannot stat: " + errno_text());
    std::int64_t offset = st.st_size;
    Sha256 sha;
    auto restart = [&] {
      if (::ftruncate(fd.get(), 0) != 0) throw_io(incomplete.string() + ": " + errno_text());
      progress_.add(file, -offset);
      offset = 0;
      sha.reset();
    };
    progress_.add(file, offset, true);
    if (size >= 0 && offset > size) restart();
    if (verify_sha && offset > 0) {  // the hash covers the bytes kept from an earlier try
      std::vector<char> buffer(1 << 20);
      for (std::int64_t at = 0; at < offset;) {
        const ssize_t n = ::pread(fd.get(), buffer.data(),
                                  static_cast<std::size_t>(std::min<std::int64_t>(
                                      static_cast<std::int64_t>(buffer.size()), offset - at)),
                                  at);
        if (n <= 0) throw_io(incomplete.string() + ": cannot read: " + errno_text());
        sha.update(buffer.data(), static_cast<std::size_t>(n));
        at += n;
      }
    }
    std::int64_t received = 0;
    for (int attempt = 1;; ++attempt) {
      HttpRequest request;
      request.url = meta.location;
      request.follow_redirects = true;
      request.headers = auth_headers(settings_, meta.location);
      if (offset > 0) request.headers.push_back("Range: bytes=" + std::to_string(offset) + "-");
      bool first_chunk = true;
      std::string write_error;
      request.sink = [&](const HttpResponse& head, std::span<const char> chunk) {
        if (first_chunk) {
          first_chunk = false;
          if (offset > 0) {
            const std::string* range = head.header("content-range");
            std::int64_t start = -1;
            if (head.status == 206 && range != nullptr && range->starts_with("bytes "))
              start = std::strtoll(range->c_str() + 6, nullptr, 10);
            if (start != offset) restart();  // the server ignored the Range: start over
          }
          if (::lseek(fd.get(), offset, SEEK_SET) < 0) {
            write_error = errno_text();
            return false;
          }
        }
        for (std::size_t done = 0; done < chunk.size();) {
          const ssize_t n = ::write(fd.get(), chunk.data() + done, chunk.size() - done);
          if (n < 0) {
            if (errno == EINTR) continue;
            write_error = errno_text();
            return false;
          }
          done += static_cast<std::size_t>(n);
        }
        if (verify_sha) sha.update(chunk.data(), chunk.size());
        offset += static_cast<std::int64_t>(chunk.size());
        received += static_cast<std::int64_t>(chunk.size());
        progress_.add(file, static_cast<std::int64_t>(chunk.size()));
        return !cancelled(params_.cancel);
      };
      HttpResponse r;
      try {
        r = session.perform(request);
      } catch (const TransportError& e) {
        if (!write_error.empty())
          throw_io(incomplete.string() + ": cannot write: " + write_error,
                   "free some space in the cache folder, then run again to resume");
        if (cancelled(params_.cancel))
          throw DownloadCancelled("download of " + file + " cancelled; " + std::to_string(offset) +
                                  " bytes kept in " + incomplete.string() + " for the next run");
        if (e.retryable && attempt < params_.max_attempts &&
            wait_before_retry(attempt, nullptr, params_, settings_, meta.location, e.message))
          continue;
        if (cancelled(params_.cancel)) throw DownloadCancelled("download cancelled");
        throw_io(meta.location + ": " + e.message + " (after " + std::to_string(attempt) +
                     " attempts; " + std::to_string(offset) + " bytes kept)",
                 "check the network; run again to resume");
      }
      if (r.status == 416 && size >= 0 && offset == size) break;  // it was all here
      if (r.status == 416) {
        restart();
        continue;
      }
      if (r.status >= 200 && r.status < 300) {
        if (size >= 0 && offset < size) {  // closed early without an error from curl
          if (attempt < params_.max_attempts &&
              wait_before_retry(attempt, nullptr, params_, settings_, meta.location,
                                "the transfer ended at " + std::to_string(offset) + " of " +
                                    std::to_string(size) + " bytes"))
            continue;
          throw_io(meta.location + ": the transfer ended at " + std::to_string(offset) + " of " +
                   std::to_string(size) + " bytes");
        }
        break;
      }
      if (is_retryable_status(r.status) && attempt < params_.max_attempts &&
          wait_before_retry(attempt, &r, params_, settings_, meta.location))
        continue;
      if (cancelled(params_.cancel)) throw DownloadCancelled("download cancelled");
      throw_http(r, meta.location, c);
    }
    auto discard = [&](const std::string& message) {
      ::unlink(incomplete.c_str());
      progress_.add(file, -offset);
      throw_invalid(message,
                    "nothing was kept; run again, and if it repeats the server or a "
                    "proxy alters the file");
    };
    if (size >= 0 && offset != size)
      discard(meta.location + ": received " + std::to_string(offset) + " bytes of " + file +
              ", expected " + std::to_string(size));
    if (verify_sha) {
      const std::string got = sha.hex();
      if (got != meta.etag)
        discard(meta.location + ": " + file + " has SHA-256 " + got + ", expected " + meta.etag +
                ": the download is corrupt and was discarded");
    }
    if (::fsync(fd.get()) != 0) throw_io(incomplete.string() + ": fsync: " + errno_text());
    ::close(fd.release());
    if (::rename(incomplete.c_str(), blob.c_str()) != 0)
      throw_io(blob.string() + ": cannot rename the download into place: " + errno_text());
    core::fsync_directory(blob.parent_path());
    return received;
  }

  const Settings& settings_;
  const CacheRepo& cache_;
  const std::string& commit_;
  const DownloadParams& params_;
  Progress& progress_;
};

void check_free_space(const std::filesystem::path& dir, std::int64_t needed) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) return;  // unknown: the writes will tell
  const auto available =
      static_cast<std::int64_t>(vfs.f_bavail) * static_cast<std::int64_t>(vfs.f_frsize);
  // Left free beside the download: a disk filled to the last byte fails whatever writes next.
  const std::int64_t margin = 64ll << 20;
  if (needed + margin > available)
    throw_io(
        dir.string() + ": " + core::human_bytes(static_cast<std::uint64_t>(needed)) +
            " to download and " + core::human_bytes(static_cast<std::uint64_t>(margin)) +
            " to keep free beside it, and only " +
            core::human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(0, available))) +
            " free",
        "free some space, or point HF_HUB_CACHE at a larger disk");
}

}  // namespace

Client::Client(Settings settings) : settings_(std::move(settings)) {}

SearchPage Client::search(const SearchQuery& query) {
  require_online(settings_, "searching");
  std::string url = query.page_url;
  if (url.empty()) {
    const char* sort = query.sort == "likes"    ? "likes"
                       : query.sort == "recent" ? "lastModified"
                                                : "downloads";
    if (query.sort != "likes" && query.sort != "recent" && query.sort != "downloads")
      throw_invalid("sort \"" + query.sort + "\" is not one of downloads, likes, recent");
    url = settings_.endpoint + (query.type == RepoType::Dataset ? "/api/datasets" : "/api/models") +
          "?search=" + url_encode(query.text, false) + "&sort=" + sort +
          "&direction=-1&limit=" + std::to_string(std::clamp(query.limit, 1, 1000));
    for (const auto& f : query.filters) url += "&filter=" + url_encode(f, false);
  } else if (url_origin(url) != url_origin(settings_.endpoint)) {
    throw_invalid("the next-page URL " + url + " is not on " + settings_.endpoint);
  }
  HttpSession session(settings_.download_timeout_s);
  Context c{&settings_, "", query.type, "", ""};
  DownloadParams retry;
  retry.max_attempts = 4;
  SearchPage page;
  while (true) {
    std::string next;
    const nlohmann::json list = get_json(session, url, c, retry, &next);
    if (!list.is_array()) throw_invalid(url + ": expected a JSON list of repositories");
    for (const auto& j : list) {
      SearchHit hit;
      hit.id = str(j, "id");
      hit.downloads = num(j, "downloads");
      hit.likes = num(j, "likes");
      hit.last_modified = str(j, "lastModified");
      if (hit.last_modified.empty()) hit.last_modified = str(j, "createdAt");
      hit.pipeline_tag = str(j, "pipeline_tag");
      hit.library = str(j, "library_name");
      if (j.contains("tags") && j["tags"].is_array())
        for (const auto& t : j["tags"])
          if (t.is_string()) hit.tags.push_back(t.get<std::string>());
      hit.is_private = flag(j, "private");
      hit.gated = gated_of(j);
      page.hits.push_back(std::move(hit));
    }
    page.next_page_url = next;
    if (next.empty() || static_cast<int>(page.hits.size()) >= query.limit || list.empty()) break;
    if (url_origin(next) != url_origin(settings_.endpoint)) break;
    url = next;
  }
  if (static_cast<int>(page.hits.size()) > query.limit)
    page.hits.resize(static_cast<std::size_t>(query.limit));
  return page;
}

std::optional<std::string> Client::card(const std::string& repo_id, RepoType type,
                                        const std::string& revision) {
  validate_repo_id(repo_id);
  validate_revision(revision);
  require_online(settings_, "the repository card");
  const std::string url = settings_.endpoint + (type == RepoType::Dataset ? "/datasets/" : "/") +
                          repo_id + "/resolve/" + url_encode(revision, false) + "/README.md";
  HttpSession session(settings_.download_timeout_s);
  Context c{&settings_, repo_id, type, revision, "README.md"};
  DownloadParams retry;
  retry.max_attempts = 4;
  return get_body(session, url, c, retry, "text/markdown, text/plain, */*", nullptr,
                  /*missing_ok=*/true);
}

RepoInfo Client::info(const std::string& repo_id, RepoType type, const std::string& revision) {
  return *info_if_exists(repo_id, type, revision, /*missing_ok=*/false);
}

std::optional<RepoInfo> Client::info_if_exists(const std::string& repo_id, RepoType type,
                                               const std::string& revision, bool missing_ok) {
  validate_repo_id(repo_id);
  validate_revision(revision);
  require_online(settings_, "repository info");
  const std::string url = settings_.endpoint +
                          (type == RepoType::Dataset ? "/api/datasets/" : "/api/models/") +
                          repo_id + "/revision/" + url_encode(revision, false) + "?blobs=true";
  HttpSession session(settings_.download_timeout_s);
  Context c{&settings_, repo_id, type, revision, ""};
  DownloadParams retry;
  retry.max_attempts = 4;
  const std::optional<std::string> body =
      get_body(session, url, c, retry, "application/json", nullptr, missing_ok);
  if (!body) return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*body);
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(url + ": the response is not JSON (" + std::string(e.what()) + ")",
                  "is HF_ENDPOINT a Hub-compatible server?");
  }
  RepoInfo info;
  info.id = str(j, "id");
  if (info.id.empty()) info.id = repo_id;
  info.type = type;
  info.sha = str(j, "sha");
  if (!is_commit_hash(info.sha))
    throw_invalid(url + ": the response has no commit hash (\"sha\")",
                  "is HF_ENDPOINT a Hub-compatible server?");
  info.is_private = flag(j, "private");
  info.gated = gated_of(j);
  info.downloads = num(j, "downloads");
  info.likes = num(j, "likes");
  info.pipeline_tag = str(j, "pipeline_tag");
  info.library = str(j, "library_name");
  if (j.contains("cardData") && j["cardData"].is_object()) {
    const auto& card = j["cardData"];
    if (card.contains("license") && card["license"].is_string())
      info.license = card["license"].get<std::string>();
  }
  if (info.license.empty() && j.contains("tags") && j["tags"].is_array())
    for (const auto& t : j["tags"])
      if (t.is_string() && t.get<std::string>().starts_with("license:"))
        info.license = t.get<std::string>().substr(8);
  const std::string source = "the file list of " + repo_id + " at " + revision + " (" + url + ")";
  if (j.contains("siblings") && j["siblings"].is_array()) {
    for (const auto& s : j["siblings"]) {
      RepoFile f;
      f.path = str(s, "rfilename");
      validate_repo_path(f.path, source);
      f.size = s.contains("size") ? integer(s["size"]).value_or(-1) : -1;
      f.blob_id = str(s, "blobId");
      if (s.contains("lfs") && s["lfs"].is_object()) {
        const auto& lfs = s["lfs"];
        f.lfs_sha256 = str(lfs, "sha256");
        if (f.lfs_sha256.empty()) f.lfs_sha256 = str(lfs, "oid");
        if (!is_sha256_hex(f.lfs_sha256))
          throw_invalid(source + ": " + f.path + " has no valid LFS SHA-256");
        if (lfs.contains("size")) f.size = integer(lfs["size"]).value_or(f.size);
      }
      info.files.push_back(std::move(f));
    }
  }
  return info;
}

DownloadResult Client::download(const std::string& repo_id, const DownloadParams& params) {
  validate_repo_id(repo_id);
  validate_revision(params.revision);
  if (settings_.offline) return from_cache(repo_id, params);
  return download_listed(repo_id, info(repo_id, params.type, params.revision), params);
}

DownloadResult Client::download_listed(const std::string& repo_id, const RepoInfo& repo,
                                       const DownloadParams& params) {
  const Selection selection = select_files(repo_id, params.type, repo.files, params.include);
  if (!selection.refusal.empty()) throw_unsupported(selection.refusal, selection.hint);

  CacheRepo cache(settings_.cache_dir, repo_id, params.type);
  cache.write_ref(params.revision, repo.sha);
  cache.write_tree(repo.sha, repo.files);

  std::int64_t total = 0;
  std::int64_t missing = 0;
  std::int64_t present = 0;
  for (const auto& f : selection.files) {
    const std::int64_t size = std::max<std::int64_t>(0, f.size);
    total += size;
    std::error_code ec;
    if (std::filesystem::exists(cache.pointer_path(repo.sha, f.path), ec)) {
      present += size;
      continue;
    }
    const std::string etag = f.lfs_sha256.empty() ? f.blob_id : f.lfs_sha256;
    std::int64_t partial = 0;
    if (!etag.empty()) {
      const auto blob = cache.blob_path(etag);
      if (std::filesystem::exists(blob, ec)) {  // another revision's: linked, not fetched
        present += size;
        continue;
      }
      const auto size_partial = std::filesystem::file_size(blob.string() + ".incomplete", ec);
      if (!ec) partial = static_cast<std::int64_t>(size_partial);
    }
    missing += std::max<std::int64_t>(0, size - partial);
  }
  std::error_code ec;
  std::filesystem::create_directories(cache.dir() / "blobs", ec);
  if (ec)
    throw_io((cache.dir() / "blobs").string() + ": cannot create: " + ec.message(),
             "check that the Hub cache folder (HF_HUB_CACHE / HF_HOME) is writable");
  check_free_space(cache.dir() / "blobs", missing);

  Progress progress(params, total, static_cast<int>(selection.files.size()));
  // After a failure no new file is started; files in flight finish (or stop at the caller's
  // cancel), so the cache keeps all that could be completed.
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> received{0};
  std::mutex error_mutex;
  std::exception_ptr first_error;  // guarded by error_mutex
  auto worker = [&] {
    try {
      HttpSession session(settings_.download_timeout_s);
      Downloader downloader(settings_, cache, repo.sha, params, progress);
      while (!stop.load() && !cancelled(params.cancel)) {
        const std::size_t i = next++;
        if (i >= selection.files.size()) break;
        received += downloader.fetch(session, selection.files[i]);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      // A cancel reported by one file does not hide another file's real failure.
      bool replace = !first_error;
      if (!replace) {
        try {
          std::rethrow_exception(first_error);
        } catch (const DownloadCancelled&) {
          replace = true;
        } catch (...) {
        }
      }
      if (replace) first_error = std::current_exception();
      stop = true;
    }
  };
  const int threads = std::clamp<int>(
      params.parallel_files, 1, static_cast<int>(std::max<std::size_t>(1, selection.files.size())));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
  if (cancelled(params.cancel)) throw DownloadCancelled("download of " + repo_id + " cancelled");

  DownloadResult result;
  result.commit = repo.sha;
  result.snapshot = cache.snapshot_dir(repo.sha);
  for (const auto& f : selection.files) result.files.push_back(f.path);
  result.downloaded_bytes = received.load();
  result.present_bytes = present;
  return result;
}

// The download command that fetches what `params` asks for (its kind, revision and patterns).
static std::string download_command(const std::string& repo_id, const DownloadParams& params) {
  std::string command = "tessera-cli hub download " + repo_id;
  if (params.type == RepoType::Dataset) command += " --dataset";
  if (params.revision != "main") command += " --revision " + params.revision;
  for (const std::string& pattern : params.include) command += " --include " + pattern;
  return command;
}

DownloadResult Client::from_cache(const std::string& repo_id, const DownloadParams& params) const {
  validate_repo_id(repo_id);
  CacheRepo cache(settings_.cache_dir, repo_id, params.type);
  const std::string what = std::string(repo_type_name(params.type)) + " " + repo_id;
  const auto commit = cache.resolve(params.revision);
  if (!commit)
    throw_invalid(what + " at revision \"" + params.revision + "\" is not in the cache " +
                      settings_.cache_dir.string() +
                      (settings_.offline ? " (" + settings_.offline_variable + " is set)" : ""),
                  "download it first with `" + download_command(repo_id, params) + "`" +
                      (settings_.offline ? " without " + settings_.offline_variable : ""));
  const std::filesystem::path snapshot = cache.snapshot_dir(*commit);
  const std::vector<RepoFile> listed = cache.listed_files(*commit);
  const Selection selection = select_files(repo_id, params.type, listed, params.include);
  if (!selection.refusal.empty()) throw_unsupported(selection.refusal, selection.hint);
  DownloadResult result;
  result.commit = *commit;
  result.snapshot = snapshot;
  std::vector<std::string> missing;
  for (const auto& f : selection.files) {
    std::error_code ec;
    if (std::filesystem::exists(cache.pointer_path(*commit, f.path), ec)) {
      result.files.push_back(f.path);
      result.present_bytes += std::max<std::int64_t>(0, f.size);
    } else {
      missing.push_back(f.path);
    }
  }
  if (!missing.empty()) {
    std::string names;
    for (std::size_t i = 0; i < missing.size() && i < 5; ++i) names += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) names += ", … (" + std::to_string(missing.size()) + " in all)";
    throw_invalid(what + " at " + params.revision + " is incomplete in the cache " +
                      snapshot.string() + ": missing " + names,
                  "run `" + download_command(repo_id, params) + "` with network access" +
                      (settings_.offline ? " (unset " + settings_.offline_variable + ")" : ""));
  }
  return result;
}

}  // namespace tessera::hf::hub
