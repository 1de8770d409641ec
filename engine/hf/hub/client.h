#pragma once
// The Hub client: search, repository info and downloads into the cache huggingface_hub uses
// (cache.h). Torch-free; the CLI and the studio link it.
//
// Downloads: the file list comes from /api/{models,datasets}/REPO/revision/REV; each file's
// etag, commit and size from a HEAD on /REPO/resolve/COMMIT/PATH (Accept-Encoding: identity,
// relative redirects followed, an absolute one is where the bytes are). The bytes go to
// blobs/<etag>.incomplete under the blob's lock, resumed with Range after a dropped
// connection or a cancel, retried with backoff on 5xx / 429 (Retry-After honoured), the
// SHA-256 of LFS files checked while streaming, then fsync + rename and a snapshot symlink.
// On error: tessera::Error naming the repository, file or URL, with a hint; the token is never
// part of a message.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "hf/hub/cache.h"
#include "hf/hub/datasets.h"
#include "hf/hub/names.h"
#include "hf/hub/settings.h"

namespace tessera::hf::hub {

struct SearchQuery {
  RepoType type = RepoType::Model;
  std::string text;                  // free text ("qwen"); empty lists everything
  std::string sort = "downloads";    // downloads | likes | recent
  int limit = 20;                    // results wanted (pages are followed up to this many)
  std::vector<std::string> filters;  // Hub tags: "text-generation", "license:mit", "transformers"
  std::string page_url;              // a SearchPage::next_page_url, to continue a search
};

struct SearchHit {
  std::string id;
  std::int64_t downloads = 0;
  std::int64_t likes = 0;
  std::string last_modified;  // ISO 8601, when the Hub says
  std::string pipeline_tag;
  std::string library;
  std::vector<std::string> tags;
  bool is_private = false;
  std::string gated;  // "" (open), "auto" or "manual"
};

struct SearchPage {
  std::vector<SearchHit> hits;
  std::string next_page_url;  // empty: no more results
};

struct RepoInfo {
  std::string id;
  RepoType type = RepoType::Model;
  std::string sha;  // the commit the revision is at
  bool is_private = false;
  std::string gated;  // "" (open), "auto" or "manual"
  std::int64_t downloads = 0;
  std::int64_t likes = 0;
  std::string license;
  std::string pipeline_tag;
  std::string library;
  std::vector<RepoFile> files;  // every file, names validated
};

struct DownloadProgress {
  std::string file;              // the file that moved ("" for the final report)
  std::int64_t done_bytes = 0;   // of all selected files, including what was already here
  std::int64_t total_bytes = 0;  // of all selected files
  int files_done = 0;
  int files_total = 0;
};

// Download options; defaults are what the CLI uses.
struct DownloadParams {
  RepoType type = RepoType::Model;
  std::string revision = "main";
  // Glob patterns (fnmatch, '*' crosses '/'; "dir/" means "dir/*") applied to the files the
  // client would fetch; empty: all of them.
  std::vector<std::string> include;
  int parallel_files = 8;        // files transferred at once
  int max_attempts = 8;          // per request, on 5xx / 429 / a dropped connection
  double backoff_first_s = 0.5;  // then doubled per attempt ...
  double backoff_max_s = 20.0;   // ... up to this; a Retry-After header wins
  // Called from worker threads, one call at a time, at most every ~100 ms per file.
  std::function<void(const DownloadProgress&)> on_progress;
  // Set it to stop: partial files stay as blobs/<etag>.incomplete and the next call resumes.
  const std::atomic<bool>* cancel = nullptr;
};

struct DownloadResult {
  std::string commit;
  std::filesystem::path snapshot;     // snapshots/<commit>: the folder to load
  std::vector<std::string> files;     // selected files, all present in the snapshot
  std::int64_t downloaded_bytes = 0;  // received in this call
  std::int64_t present_bytes = 0;     // already complete in the cache before the call
};

// Thrown when DownloadParams::cancel stopped a download.
class DownloadCancelled : public Error {
 public:
  explicit DownloadCancelled(std::string message) : Error(ErrorKind::Io, std::move(message)) {}
};

// What Tessera fetches of a repository, or why it refuses it. Models: top-level *.safetensors
// (+ index), config.json, generation_config.json, tokenizer and chat-template files; refused
// when its only weights are pickle (.bin/.pt/.pth/.ckpt). Datasets: the files is_data_file
// names (datasets.h) and README.md (the card names configs and splits).
struct Selection {
  std::vector<RepoFile> files;
  std::string refusal;  // non-empty: nothing may be downloaded, and this says why
  std::string hint;
};
Selection select_files(const std::string& repo_id, RepoType type,
                       const std::vector<RepoFile>& files, const std::vector<std::string>& include);

// The paths that match any of `patterns` (fnmatch, '*' crosses '/'; "dir/" is "dir/*"); none
// when `patterns` is empty.
std::vector<std::string> matching(const std::vector<std::string>& paths,
                                  const std::vector<std::string>& patterns);

class Client {
 public:
  explicit Client(Settings settings);

  const Settings& settings() const { return settings_; }

  SearchPage search(const SearchQuery& query);
  RepoInfo info(const std::string& repo_id, RepoType type, const std::string& revision);
  // The repository's card (README.md at `revision`, Markdown with its YAML header), not cached;
  // nullopt when the repository has none.
  std::optional<std::string> card(const std::string& repo_id, RepoType type,
                                  const std::string& revision);

  // Makes the selected files of `repo_id` at params.revision present in the cache, fetching
  // what is missing; in offline mode (Settings::offline) this is from_cache().
  DownloadResult download(const std::string& repo_id, const DownloadParams& params);

  // The snapshot from the cache alone; throws naming the files that are missing (from the
  // cached file list when there is one), or the revision the cache does not know.
  DownloadResult from_cache(const std::string& repo_id, const DownloadParams& params) const;

  // The configs and splits of dataset `repo_id` at `revision` (datasets.h says from where).
  // README.md is fetched into the cache like any file, so that offline (Settings::offline) the
  // layout comes from the cache alone; what the cache lacks is named in the error.
  DatasetLayout dataset_layout(const std::string& repo_id, const std::string& revision);

  // Up to `max_rows` first rows of one split before downloading it: the Hub's dataset viewer
  // (Settings::viewer_endpoint) for the main branch; without it, the complete lines of the
  // first 1 MiB of the split's first JSONL / JSON-lines / CSV / TSV file (a Range request, or
  // the cached file offline). An empty `config` is the default config (else the first
  // listed), an empty `split` is "train" when there is one, else the first. Throws when no preview
  // is offered (Parquet without the viewer: download the dataset to see its rows).
  RowPreview preview_rows(const std::string& repo_id, const std::string& revision,
                          const std::string& config, const std::string& split, int max_rows);

 private:
  // info(); a revision (or repository) the Hub does not have is nullopt when `missing_ok`.
  std::optional<RepoInfo> info_if_exists(const std::string& repo_id, RepoType type,
                                         const std::string& revision, bool missing_ok);
  // download() of the selected files of `repo`, the listing of params.revision.
  DownloadResult download_listed(const std::string& repo_id, const RepoInfo& repo,
                                 const DownloadParams& params);

  Settings settings_;
};

}  // namespace tessera::hf::hub
