// Client::dataset_layout and Client::preview_rows (client.h, datasets.h).
#include "hf/hub/datasets.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "hf/hub/client.h"
#include "hf/hub/http.h"
#include "hf/hub/requests.h"

namespace tessera::hf::hub {
namespace {

using namespace detail;  // the request helpers (requests.h)

constexpr std::size_t kPreviewBytes = 1u << 20;  // what a preview without the viewer reads
constexpr std::size_t kViewerRows = 100;         // the viewer's /first-rows gives at most this

// A revision's files: from the Hub, or from what the cache kept.
struct Listing {
  std::string commit;
  std::vector<RepoFile> files;
};

std::vector<std::string> paths_of(const std::vector<RepoFile>& files) {
  std::vector<std::string> out;
  for (const RepoFile& f : files) out.push_back(f.path);
  return out;
}

bool lists(const std::vector<RepoFile>& files, const std::string& path) {
  return std::any_of(files.begin(), files.end(), [&](const RepoFile& f) { return f.path == path; });
}

void fill_sizes(std::vector<DatasetConfig>& configs, const std::vector<RepoFile>& files) {
  std::map<std::string, std::int64_t> size;
  for (const RepoFile& f : files) size[f.path] = f.size;
  for (DatasetConfig& config : configs)
    for (DatasetSplit& split : config.splits)
      for (std::size_t i = 0; i < split.files.size(); ++i) {
        const auto it = size.find(split.files[i]);
        split.sizes[i] = it == size.end() ? -1 : it->second;
      }
}

bool reads_any(const std::vector<DatasetConfig>& configs) {
  for (const DatasetConfig& config : configs)
    for (const DatasetSplit& split : config.splits)
      if (std::any_of(split.files.begin(), split.files.end(), is_data_file)) return true;
  return false;
}

// The listing the cache kept for `revision`: trees/<commit>.json (every file, downloaded or
// not), else what the snapshot holds (a cache huggingface_hub filled).
std::optional<Listing> cached_listing(const CacheRepo& cache, const std::string& revision) {
  const std::optional<std::string> commit = cache.resolve(revision);
  if (!commit) return std::nullopt;
  return Listing{*commit, cache.listed_files(*commit)};
}

std::string read_file_prefix(const std::filesystem::path& path, std::size_t max_bytes,
                             bool& whole) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_io(path.string() + ": cannot open");
  std::string data(max_bytes + 1, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<std::size_t>(in.gcount()));
  whole = data.size() <= max_bytes;
  if (!whole) data.resize(max_bytes);
  return data;
}

std::string names_of(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// -- Rows from the first bytes of a file -----------------------------------------------------

enum class LineFormat { None, JsonLines, Csv, Tsv, Text };

LineFormat line_format(const std::string& path) {
  const auto ends = [&](const char* ext) { return path.ends_with(ext); };
  if (ends(".jsonl") || ends(".ndjson") || ends(".json")) return LineFormat::JsonLines;
  if (ends(".csv")) return LineFormat::Csv;
  if (ends(".tsv") || ends(".tab")) return LineFormat::Tsv;
  if (ends(".txt") || ends(".text")) return LineFormat::Text;
  return LineFormat::None;
}

std::string cell_text(const nlohmann::ordered_json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// The complete lines of `data` (all of it when `whole`, else up to its last newline), with their
// 1-based line numbers; blank lines skipped.
std::vector<std::pair<std::size_t, std::string_view>> complete_lines(std::string_view data,
                                                                     bool whole) {
  if (!whole) {
    const auto last = data.rfind('\n');
    data = last == std::string_view::npos ? std::string_view() : data.substr(0, last + 1);
  }
  std::vector<std::pair<std::size_t, std::string_view>> out;
  std::size_t number = 0;
  for (std::size_t start = 0; start < data.size();) {
    std::size_t end = data.find('\n', start);
    if (end == std::string_view::npos) end = data.size();
    std::string_view line = data.substr(start, end - start);
    ++number;
    start = end + 1;
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.find_first_not_of(" \t") != std::string_view::npos) out.emplace_back(number, line);
  }
  return out;
}

// JSON lines: one object per line. A .json file that is not JSON lines (an array, or one
// pretty-printed object) cannot be read in part: that is "no preview", not a fault of the file.
void json_lines_rows(std::string_view data, bool whole, const std::string& file, int max_rows,
                     RowPreview& out) {
  const auto first = data.find_first_not_of(" \t\r\n");
  const bool jsonl = !file.ends_with(".json");
  const auto not_lines = [&](const std::string& why) {
    throw_unsupported(
        file + " is " + why + ", which a preview without the dataset viewer cannot read in part",
        "download the dataset to see its rows");
  };
  if (!jsonl && first != std::string_view::npos && data[first] == '[') not_lines("a JSON array");
  std::vector<nlohmann::ordered_json> rows;
  std::size_t available = 0;
  for (const auto& [number, line] : complete_lines(data, whole)) {
    ++available;
    if (static_cast<int>(rows.size()) >= max_rows) continue;
    nlohmann::ordered_json row;
    try {
      row = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      if (!jsonl) not_lines("not JSON lines (one object per line)");
      throw_invalid(file + " line " + std::to_string(number) + ": not JSON (" + e.what() + ")",
                    "each line of a JSONL file holds one JSON object");
    }
    if (!row.is_object()) {
      if (!jsonl) not_lines("not JSON lines (one object per line)");
      throw_invalid(file + " line " + std::to_string(number) + ": not a JSON object",
                    "each line of a JSONL file holds one JSON object");
    }
    for (const auto& [key, value] : row.items())
      if (std::find(out.columns.begin(), out.columns.end(), key) == out.columns.end())
        out.columns.push_back(key);
    rows.push_back(std::move(row));
  }
  for (const auto& row : rows) {
    std::vector<std::string> cells;
    for (const std::string& column : out.columns)
      cells.push_back(row.contains(column) ? cell_text(row[column]) : std::string());
    out.rows.push_back(std::move(cells));
  }
  out.partial = !whole || available > rows.size();
}

// CSV / TSV records (RFC 4180 quoting: a quoted field may hold the delimiter, newlines and
// doubled quotes); only records ended by a newline count unless the data is `whole`.
void delimited_rows(std::string_view data, bool whole, char delimiter, const std::string& file,
                    int max_rows, RowPreview& out) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::size_t> record_lines;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false;
  bool record_has_data = false;
  std::size_t line = 1;
  std::size_t record_line = 1;
  std::size_t available = 0;
  const auto end_record = [&] {
    record.push_back(std::move(field));
    field.clear();
    if (record_has_data || record.size() > 1 || !record.front().empty()) {
      ++available;
      if (records.size() <= static_cast<std::size_t>(max_rows)) {  // the header and max_rows
        records.push_back(std::move(record));
        record_lines.push_back(record_line);
      }
    }
    record.clear();
    record_has_data = false;
  };
  for (std::size_t i = 0; i < data.size(); ++i) {
    const char c = data[i];
    if (quoted) {
      if (c == '"' && i + 1 < data.size() && data[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
    } else if (c == '"' && field.empty()) {
      quoted = true;
      record_has_data = true;
    } else if (c == delimiter) {
      record.push_back(std::move(field));
      field.clear();
      record_has_data = true;
    } else if (c == '\n') {
      if (!field.empty() && field.back() == '\r') field.pop_back();
      end_record();
      record_line = ++line;
    } else {
      field += c;
    }
  }
  if (whole && (!field.empty() || !record.empty() || record_has_data)) end_record();
  if (records.empty()) return;
  out.columns = records.front();
  if (!out.columns.empty() && out.columns.front().starts_with("\xEF\xBB\xBF"))
    out.columns.front().erase(0, 3);
  for (std::size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != out.columns.size())
      throw_invalid(file + " line " + std::to_string(record_lines[r]) + ": " +
                        std::to_string(records[r].size()) + " fields, the header has " +
                        std::to_string(out.columns.size()),
                    "every row of a CSV/TSV file has as many fields as its header");
    out.rows.push_back(std::move(records[r]));
  }
  out.partial = !whole || available - 1 > out.rows.size();
}

void text_rows(std::string_view data, bool whole, int max_rows, RowPreview& out) {
  out.columns = {"text"};
  std::size_t available = 0;
  for (const auto& [number, line] : complete_lines(data, whole)) {
    ++available;
    if (static_cast<int>(out.rows.size()) < max_rows) out.rows.push_back({std::string(line)});
  }
  out.partial = !whole || available > out.rows.size();
}

// -- Requests --------------------------------------------------------------------------------

// The first `max_bytes` of a file by a Range request (redirects followed to the CDN). `whole`:
// the file ended within them.
std::string fetch_prefix(HttpSession& session, const std::string& url, const Context& c,
                         std::size_t max_bytes, bool& whole) {
  DownloadParams retry;
  retry.max_attempts = 4;
  for (int attempt = 1;; ++attempt) {
    std::string data;
    HttpRequest request;
    request.url = url;
    request.follow_redirects = true;
    request.headers = auth_headers(*c.settings, url);
    request.headers.push_back("Range: bytes=0-" + std::to_string(max_bytes - 1));
    request.headers.push_back("Accept-Encoding: identity");
    request.sink = [&](const HttpResponse&, std::span<const char> chunk) {
      data.append(chunk.data(), std::min(chunk.size(), max_bytes + 1 - data.size()));
      return data.size() <= max_bytes;  // a server that ignores the Range: stop after enough
    };
    HttpResponse r;
    try {
      r = session.perform(request);
    } catch (const TransportError& e) {
      if (e.aborted) {  // the sink stopped a longer body
        data.resize(max_bytes);
        whole = false;
        return data;
      }
      if (e.retryable && attempt < retry.max_attempts &&
          wait_before_retry(attempt, nullptr, retry, *c.settings, url, e.message))
        continue;
      throw_io(url + ": " + e.message,
               "check the network (or HF_ENDPOINT); set HF_HUB_OFFLINE=1 to use the cache only");
    }
    if (r.status == 416) {  // an empty file has no byte 0
      whole = true;
      return {};
    }
    if (r.status >= 200 && r.status < 300) {
      whole = data.size() <= max_bytes;
      if (r.status == 206) {  // "bytes 0-N/TOTAL": whole when TOTAL fit
        const std::string* range = r.header("content-range");
        const auto slash = range == nullptr ? std::string::npos : range->rfind('/');
        if (slash != std::string::npos && (*range)[slash + 1] != '*')
          whole = std::strtoull(range->c_str() + slash + 1, nullptr, 10) <= max_bytes;
        else
          whole = data.size() < max_bytes;
      }
      if (data.size() > max_bytes) data.resize(max_bytes);
      return data;
    }
    if (is_retryable_status(r.status) && attempt < retry.max_attempts &&
        wait_before_retry(attempt, &r, retry, *c.settings, url))
      continue;
    throw_http(r, url, c);
  }
}

// /first-rows of the dataset viewer; throws with the reason when it offers none.
RowPreview viewer_rows(const Settings& settings, const std::string& repo_id,
                       const std::string& config, const std::string& split, int max_rows) {
  const std::string url =
      settings.viewer_endpoint + "/first-rows?dataset=" + url_encode(repo_id, true) +
      "&config=" + url_encode(config, false) + "&split=" + url_encode(split, false);
  HttpSession session(settings.download_timeout_s);
  HttpRequest request;
  request.url = url;
  request.follow_redirects = true;
  request.headers = auth_headers(settings, url);
  request.headers.push_back("Accept: application/json");
  HttpResponse r;
  for (int attempt = 1;; ++attempt) {
    try {
      r = session.perform(request);
    } catch (const TransportError& e) {
      if (e.retryable && attempt < 2) continue;
      throw_io(url + ": " + e.message);
    }
    break;
  }
  if (r.status < 200 || r.status >= 300) {
    std::string detail;
    try {
      detail = nlohmann::json::parse(r.body).value("error", std::string());
    } catch (const nlohmann::json::exception&) {
    }
    throw_io(url + ": HTTP " + std::to_string(r.status) +
             (detail.empty() ? "" : " (" + detail + ")"));
  }
  RowPreview out;
  out.source = "dataset viewer";
  try {
    const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(r.body);
    for (const auto& feature : doc.at("features")) out.columns.push_back(feature.at("name"));
    const auto& rows = doc.at("rows");
    for (const auto& entry : rows) {
      if (static_cast<int>(out.rows.size()) >= max_rows) break;
      const auto& row = entry.at("row");
      if (out.columns.empty())
        for (const auto& [key, value] : row.items()) out.columns.push_back(key);
      std::vector<std::string> cells;
      for (const std::string& column : out.columns)
        cells.push_back(row.contains(column) ? cell_text(row[column]) : std::string());
      out.rows.push_back(std::move(cells));
    }
    // The viewer gives up to 100 rows, fewer when the split is shorter, unless it truncated them.
    out.partial = rows.size() > out.rows.size() || rows.size() >= kViewerRows ||
                  doc.value("truncated", false);
  } catch (const nlohmann::json::exception& e) {
    throw_io(url + ": not the dataset viewer's /first-rows answer (" + std::string(e.what()) + ")");
  }
  return out;
}

}  // namespace

DatasetLayout Client::dataset_layout(const std::string& repo_id, const std::string& revision) {
  validate_repo_id(repo_id);
  validate_revision(revision);
  const CacheRepo cache(settings_.cache_dir, repo_id, RepoType::Dataset);
  const std::string what = "dataset " + repo_id + " at " + revision;
  const std::string in_cache = " in the cache " + settings_.cache_dir.string() + " (" +
                               settings_.offline_variable + " is set)";
  const std::string online_hint = "run `tessera-cli hub info " + repo_id +
                                  " --dataset` with network access (unset " +
                                  settings_.offline_variable + ")";

  DatasetLayout layout;
  Listing listing;
  std::optional<RepoInfo> repo;  // online: the revision's info, for downloading README.md
  if (settings_.offline) {
    std::optional<Listing> cached = cached_listing(cache, revision);
    if (!cached) {
      const bool converted =
          revision != kParquetConversionRevision && cache.resolve(kParquetConversionRevision);
      throw_invalid(what + " is not" + in_cache,
                    converted ? "the cache has its Parquet conversion: ask for revision " +
                                    std::string(kParquetConversionRevision)
                              : online_hint);
    }
    listing = std::move(*cached);
  } else {
    repo = info(repo_id, RepoType::Dataset, revision);
    listing = {repo->sha, repo->files};
  }
  layout.commit = listing.commit;
  const std::vector<std::string> paths = paths_of(listing.files);

  if (revision == kParquetConversionRevision) {
    layout.source = "parquet conversion";
    layout.configs = parquet_conversion_configs(paths);
  } else {
    // The card's configs: README.md goes through the cache like any file, so that the layout
    // is the same offline.
    if (lists(listing.files, "README.md")) {
      std::filesystem::path card_path;
      if (repo) {
        DownloadParams readme;
        readme.type = RepoType::Dataset;
        readme.revision = revision;
        readme.include = {"README.md"};
        card_path = download_listed(repo_id, *repo, readme).snapshot / "README.md";
      } else {
        card_path = cache.pointer_path(listing.commit, "README.md");
        std::error_code ec;
        if (!std::filesystem::exists(card_path, ec))
          throw_invalid(
              what + ": its card README.md (which may declare its configs) is not" + in_cache,
              online_hint);
      }
      std::ifstream in(card_path, std::ios::binary);
      if (!in) throw_io(card_path.string() + ": cannot open");
      const std::string card((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      layout.configs = card_configs(card, paths, repo_id);
      layout.source = "card";
    }
    if (layout.configs.empty()) {
      std::vector<DatasetSplit> splits = dataset_split_files(paths);
      if (!splits.empty()) {
        DatasetConfig config;
        config.name = "default";
        config.is_default = true;
        config.splits = std::move(splits);
        layout.configs.push_back(std::move(config));
      }
      layout.source = "file names";
    }
    for (DatasetConfig& config : layout.configs) config.revision = revision;
  }
  fill_sizes(layout.configs, listing.files);
  if (reads_any(layout.configs)) return layout;

  // Nothing Tessera reads (a loading script, or files of other types): the Hub's Parquet
  // conversion of the dataset, when there is one.
  const bool card_named = layout.source == "card";
  if (revision != kParquetConversionRevision) {
    std::optional<Listing> converted;
    if (settings_.offline) {
      converted = cached_listing(cache, kParquetConversionRevision);
    } else if (auto branch = info_if_exists(repo_id, RepoType::Dataset, kParquetConversionRevision,
                                            /*missing_ok=*/true)) {
      converted = Listing{branch->sha, branch->files};
    }
    if (converted) {
      std::vector<DatasetConfig> configs = parquet_conversion_configs(paths_of(converted->files));
      fill_sizes(configs, converted->files);
      if (!configs.empty()) {
        layout.source = "parquet conversion";
        layout.configs = std::move(configs);
        return layout;
      }
    }
  }
  throw_unsupported(
      what +
          (card_named ? ": the configs its card (README.md) declares name no file"
                      : " has no file") +
          " Tessera reads (JSON, JSONL, CSV, TSV, text or Parquet), and no Parquet conversion (" +
          kParquetConversionRevision + ")" + (settings_.offline ? " is" + in_cache : ""),
      settings_.offline ? online_hint
                        : "see its files with `tessera-cli hub info " + repo_id + " --dataset`");
}

RowPreview Client::preview_rows(const std::string& repo_id, const std::string& revision,
                                const std::string& config_name, const std::string& split_name,
                                int max_rows) {
  if (max_rows < 1)
    throw_invalid("a preview shows at least 1 row, not " + std::to_string(max_rows));
  const DatasetLayout layout = dataset_layout(repo_id, revision);
  const DatasetConfig* config = &layout.configs.front();
  if (!config_name.empty()) {
    const auto it = std::find_if(layout.configs.begin(), layout.configs.end(),
                                 [&](const DatasetConfig& c) { return c.name == config_name; });
    if (it == layout.configs.end()) {
      std::vector<std::string> names;
      for (const DatasetConfig& c : layout.configs) names.push_back(c.name);
      throw_invalid("dataset " + repo_id + " has no config \"" + config_name + "\"",
                    "its configs: " + names_of(names));
    }
    config = &*it;
  }
  std::vector<std::string> split_names;
  for (const DatasetSplit& s : config->splits) split_names.push_back(s.name);
  const std::string wanted = !split_name.empty() ? split_name
                             : std::count(split_names.begin(), split_names.end(), "train") != 0
                                 ? std::string("train")
                             : split_names.empty() ? std::string()
                                                   : split_names.front();
  const auto split_it = std::find_if(config->splits.begin(), config->splits.end(),
                                     [&](const DatasetSplit& s) { return s.name == wanted; });
  if (split_it == config->splits.end() || split_it->files.empty())
    throw_invalid(
        "config \"" + config->name + "\" of dataset " + repo_id +
            (split_it == config->splits.end() ? " has no split \"" + wanted + "\""
                                              : ": split \"" + wanted + "\" has no files"),
        "its splits: " + names_of(split_names));
  const DatasetSplit& split = *split_it;

  // The viewer computes rows for the main branch only.
  std::string no_viewer;
  if (settings_.offline) {
    no_viewer = settings_.offline_variable + " is set";
  } else if (revision != "main") {
    no_viewer = "the dataset viewer shows the main branch only, not \"" + revision + "\"";
  } else {
    try {
      return viewer_rows(settings_, repo_id, config->name, split.name, max_rows);
    } catch (const Error& e) {
      no_viewer = std::string("the dataset viewer offers none: ") + e.what();
    }
  }

  const auto file_it = std::find_if(split.files.begin(), split.files.end(), [](const auto& f) {
    return line_format(f) != LineFormat::None;
  });
  if (file_it == split.files.end()) {
    const bool parquet = std::any_of(split.files.begin(), split.files.end(), [](const auto& f) {
      return f.ends_with(".parquet") || f.ends_with(".pq");
    });
    if (parquet)
      throw_unsupported(
          "preview needs the Hub's dataset viewer for Parquet files; download the dataset to "
          "see its rows",
          no_viewer);
    throw_unsupported("split \"" + split.name + "\" of dataset " + repo_id +
                          " has no JSONL, JSON-lines, CSV, TSV or text file to preview without "
                          "the dataset viewer",
                      no_viewer + "; download the dataset to see its rows");
  }
  const std::string& file = *file_it;

  // The file's first bytes: from the cache when it is there, else a Range request.
  const CacheRepo cache(settings_.cache_dir, repo_id, RepoType::Dataset);
  const std::optional<std::string> commit = config->revision == revision
                                                ? std::optional<std::string>(layout.commit)
                                                : cache.resolve(config->revision);
  bool whole = false;
  std::string data;
  std::error_code ec;
  if (commit && std::filesystem::exists(cache.pointer_path(*commit, file), ec)) {
    data = read_file_prefix(cache.pointer_path(*commit, file), kPreviewBytes, whole);
  } else if (settings_.offline) {
    throw_invalid("dataset " + repo_id + ": " + file + " (split \"" + split.name +
                      "\") is not in the cache " + settings_.cache_dir.string() + " (" +
                      settings_.offline_variable + " is set)",
                  "download it with network access: `tessera-cli hub download " + repo_id +
                      " --dataset --include " + file + "`");
  } else {
    const std::string at = config->revision == revision ? layout.commit : config->revision;
    const std::string url = settings_.endpoint + "/datasets/" + repo_id + "/resolve/" +
                            url_encode(at, false) + "/" + url_encode(file, true);
    HttpSession session(settings_.download_timeout_s);
    Context c{&settings_, repo_id, RepoType::Dataset, config->revision, file};
    data = fetch_prefix(session, url, c, kPreviewBytes, whole);
  }

  RowPreview out;
  switch (line_format(file)) {
    case LineFormat::JsonLines:
      json_lines_rows(data, whole, file, max_rows, out);
      break;
    case LineFormat::Csv:
      delimited_rows(data, whole, ',', file, max_rows, out);
      break;
    case LineFormat::Tsv:
      delimited_rows(data, whole, '\t', file, max_rows, out);
      break;
    case LineFormat::Text:
      text_rows(data, whole, max_rows, out);
      break;
    case LineFormat::None:
      break;
  }
  if (out.rows.empty() && !whole)
    throw_unsupported("the first row of " + file + " is longer than 1 MiB",
                      "download the dataset to see its rows");
  out.source = file + (whole ? "" : ", first 1 MiB");
  if (split.files.size() > 1) out.partial = true;  // the split's other files hold more rows
  return out;
}

}  // namespace tessera::hf::hub
