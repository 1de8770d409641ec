// A dataset's splits from its file names and from the Parquet conversion branch, and the
// data_files globs of cards (datasets.h). The rules are the Hub's (its `datasets` library's
// data_files module); the code is ours.
#include <fnmatch.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <set>
#include <string_view>

#include "hf/hub/datasets.h"

namespace tessera::hf::hub {
namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

std::vector<std::string> segments(std::string_view path) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    out.emplace_back(path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string basename(std::string_view path) {
  const auto slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

bool match_segments(const std::vector<std::string>& pattern, std::size_t p,
                    const std::vector<std::string>& path, std::size_t s) {
  if (p == pattern.size()) return s == path.size();
  if (pattern[p] == "**") {
    for (std::size_t k = s; k <= path.size(); ++k)
      if (match_segments(pattern, p + 1, path, k)) return true;
    return false;
  }
  if (s == path.size()) return false;
  std::string segment_pattern = pattern[p];
  // '**' beside other characters in a segment is '*' (as Python's glob).
  for (std::size_t at; (at = segment_pattern.find("**")) != std::string::npos;)
    segment_pattern.erase(at, 1);
  if (::fnmatch(segment_pattern.c_str(), path[s].c_str(), 0) != 0) return false;
  return match_segments(pattern, p + 1, path, s + 1);
}

// The Hub's loader skips these unless a pattern names them.
constexpr std::array kMetadataFiles = {"README.md",          "config.json",    "dataset_info.json",
                                       "dataset_infos.json", "dummy_data.zip", "dataset_dict.json"};

bool is_metadata_file(std::string_view name) {
  return std::find(kMetadataFiles.begin(), kMetadataFiles.end(), name) != kMetadataFiles.end();
}

// How many parts start with '.' (hidden) and how many folders with "__" (special): a path
// matched by a pattern counts only when the pattern names as many.
std::pair<int, int> hidden_and_special(std::string_view path) {
  const std::vector<std::string> parts = segments(path);
  int hidden = 0;
  int special = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    if (part.starts_with('.') && part.find_first_not_of('.') != std::string::npos) ++hidden;
    if (i + 1 < parts.size() && part.starts_with("__")) ++special;
  }
  return {hidden, special};
}

// Split words: "train", "validation", "test" and their synonyms, as the Hub's viewer reads them.
struct SplitWords {
  const char* split;
  std::vector<std::string_view> words;
};
const std::array<SplitWords, 3>& split_words() {
  static const std::array<SplitWords, 3> kWords = {{
      {"train", {"train", "training"}},
      {"validation", {"validation", "valid", "dev", "val"}},
      {"test", {"test", "testing", "eval", "evaluation"}},
  }};
  return kWords;
}

bool is_word_separator(char c) {
  return c == '-' || c == '.' || c == '_' || c == ' ' || (c >= '0' && c <= '9');
}

// `word` inside `part`, with a separator (or the part's edge, where `edge_ok`) on each side.
bool has_word(std::string_view part, std::string_view word, bool start_edge_ok, bool end_edge_ok) {
  for (std::size_t at = part.find(word); at != std::string_view::npos;
       at = part.find(word, at + 1)) {
    const std::size_t end = at + word.size();
    const bool before = at == 0 ? start_edge_ok : is_word_separator(part[at - 1]);
    const bool after = end == part.size() ? end_edge_ok : is_word_separator(part[end]);
    if (before && after) return true;
  }
  return false;
}

// A folder of `path` names the word ("train/", "my-train-set/").
bool folder_names(const std::string& path, std::string_view word) {
  const std::vector<std::string> parts = segments(path);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i)
    if (has_word(parts[i], word, true, true)) return true;
  return false;
}

// The file name starts with the word, or holds it, followed by a separator ("train.jsonl",
// "x_train-0.csv"); a name that is only the word does not count (it has no extension).
bool file_name_names(const std::string& path, std::string_view word) {
  return has_word(basename(path), word, true, false);
}

// data/{split}-NNNNN-of-NNNNN*.*: the split name, or "" when `path` is not such a shard.
std::string sharded_split(const std::string& path) {
  if (!path.starts_with("data/") || path.find('/', 5) != std::string::npos) return {};
  const std::string name = path.substr(5);
  for (std::size_t dash = name.find('-'); dash != std::string::npos;
       dash = name.find('-', dash + 1)) {
    // "-00000-of-00002"
    if (name.size() < dash + 15) break;
    bool digits = true;
    for (std::size_t i : {1, 2, 3, 4, 5, 10, 11, 12, 13, 14})
      digits = digits && std::isdigit(static_cast<unsigned char>(name[dash + i])) != 0;
    if (!digits || name.compare(dash + 6, 4, "-of-") != 0) continue;
    if (name.find('.', dash + 15) == std::string::npos) return {};
    const std::string split = name.substr(0, dash);
    // A split name is word characters, dots between (the Hub refuses others).
    bool ok = !split.empty() && split.front() != '.' && split.back() != '.';
    for (char c : split)
      ok = ok && (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.');
    return ok ? split : std::string();
  }
  return {};
}

int split_rank(const std::string& name) {
  if (name == "train") return 0;
  if (name == "validation") return 1;
  if (name == "test") return 2;
  return 3;
}

std::vector<DatasetSplit> ordered(std::map<std::string, std::vector<std::string>> by_split) {
  std::vector<DatasetSplit> out;
  for (auto& [name, files] : by_split) {
    if (files.empty()) continue;
    DatasetSplit split;
    split.name = name;
    split.files = std::move(files);
    split.sizes.assign(split.files.size(), -1);
    out.push_back(std::move(split));
  }
  std::stable_sort(out.begin(), out.end(), [](const DatasetSplit& a, const DatasetSplit& b) {
    return split_rank(a.name) < split_rank(b.name);
  });
  return out;
}

}  // namespace

bool is_data_file(const std::string& path) {
  for (std::string_view ext :
       {".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".tab", ".txt", ".text", ".parquet", ".pq"})
    if (ends_with(path, ext)) return !is_metadata_file(basename(path));
  return false;
}

bool glob_match(const std::string& pattern, const std::string& path) {
  std::string_view p = pattern;
  while (p.starts_with("./")) p.remove_prefix(2);
  return match_segments(segments(p), 0, segments(path), 0);
}

std::vector<std::string> resolve_data_files(const std::string& pattern,
                                            const std::vector<std::string>& repo_paths) {
  std::vector<std::string> out;
  const auto [pattern_hidden, pattern_special] = hidden_and_special(pattern);
  const bool names_metadata = is_metadata_file(basename(pattern));
  for (const std::string& path : repo_paths) {
    if (!glob_match(pattern, path)) continue;
    if (is_metadata_file(basename(path)) && !names_metadata) continue;
    const auto [hidden, special] = hidden_and_special(path);
    if (hidden != pattern_hidden || special != pattern_special) continue;
    out.push_back(path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<DatasetSplit> dataset_split_files(const std::vector<std::string>& repo_paths) {
  std::vector<std::string> data;
  for (const std::string& path : repo_paths) {
    const auto [hidden, special] = hidden_and_special(path);
    if (hidden == 0 && special == 0 && is_data_file(path)) data.push_back(path);
  }
  std::sort(data.begin(), data.end());
  // 1. data/{split}-00000-of-00002.parquet names its split, whatever the name.
  std::map<std::string, std::vector<std::string>> by_split;
  for (const std::string& path : data)
    if (std::string split = sharded_split(path); !split.empty()) by_split[split].push_back(path);
  if (!by_split.empty()) return ordered(std::move(by_split));
  // 2. A folder named by a split word, else 3. a file name; a file may land in several splits,
  // as on the Hub.
  for (auto names : {folder_names, file_name_names}) {
    for (const SplitWords& s : split_words())
      for (const std::string& path : data)
        if (std::any_of(s.words.begin(), s.words.end(),
                        [&](std::string_view w) { return names(path, w); }))
          by_split[s.split].push_back(path);
    if (!by_split.empty()) return ordered(std::move(by_split));
  }
  // 4. No split named: everything is training data.
  if (!data.empty()) by_split["train"] = data;
  return ordered(std::move(by_split));
}

std::vector<DatasetConfig> parquet_conversion_configs(const std::vector<std::string>& repo_paths) {
  std::map<std::string, std::map<std::string, std::vector<std::string>>> configs;
  for (const std::string& path : repo_paths) {
    if (!ends_with(path, ".parquet")) continue;
    const std::vector<std::string> parts = segments(path);
    std::string split;
    if (parts.size() == 3) {  // {config}/{split}/0000.parquet; big splits: partial-{split}
      split = parts[1];
      if (split.starts_with("partial-")) split = split.substr(8);
    } else if (parts.size() == 2) {  // {config}/{name}-{split}[-00000-of-00002].parquet
      std::string stem = parts[1].substr(0, parts[1].size() - 8);
      const auto of = stem.rfind("-of-");
      if (of != std::string::npos && of >= 6 && stem[of - 6] == '-') stem = stem.substr(0, of - 6);
      const auto dash = stem.rfind('-');
      if (dash == std::string::npos) continue;
      split = stem.substr(dash + 1);
    }
    if (split.empty()) continue;
    configs[parts[0]][split].push_back(path);
  }
  std::vector<DatasetConfig> out;
  for (auto& [name, splits] : configs) {
    for (auto& [split, files] : splits) std::sort(files.begin(), files.end());
    DatasetConfig config;
    config.name = name;
    config.revision = kParquetConversionRevision;
    config.splits = ordered(std::move(splits));
    config.is_default = name == "default" || configs.size() == 1;
    out.push_back(std::move(config));
  }
  std::stable_partition(out.begin(), out.end(),
                        [](const DatasetConfig& c) { return c.is_default; });
  return out;
}

}  // namespace tessera::hf::hub
