#pragma once
// A dataset repository's configs and splits as the Hub defines them, and a preview of its first
// rows before anything is downloaded. Client::dataset_layout and Client::preview_rows
// (client.h) fill these; card_configs parses a card without a server.
//
// Where the layout comes from, in this order:
//   "card"                the README.md YAML header's `configs:` list (config_name, default,
//                         data_files as a glob, a list of globs, or a list of {split, path};
//                         data_dir), globs over the repository's files ('*' stays inside a
//                         folder, '**' crosses folders)
//   "file names"          one config "default" whose splits are named by the files, as the
//                         Hub's viewer names them (dataset_split_files)
//   "parquet conversion"  when the revision has no file Tessera reads: the Hub's conversion
//                         branch refs/convert/parquet, {config}/{split}/NNNN.parquet (or the
//                         older {config}/{name}-{split}.parquet); configs are its folders
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::hf::hub {

inline constexpr const char* kParquetConversionRevision = "refs/convert/parquet";

struct DatasetSplit {
  std::string name;
  std::vector<std::string> files;   // repository paths at the config's revision
  std::vector<std::int64_t> sizes;  // bytes of each file, parallel to `files`; -1 when unknown
};

struct DatasetConfig {
  std::string name;
  bool is_default = false;  // the config used when none is named
  std::string revision;     // where its files are: the revision asked for, or refs/convert/parquet
  std::vector<DatasetSplit> splits;
};

struct DatasetLayout {
  std::string commit;                  // of the revision asked for
  std::string source;                  // "card", "file names" or "parquet conversion"
  std::vector<DatasetConfig> configs;  // the default first
};

// The configs a card declares (an empty list when its YAML header has no `configs:`), with
// each split's files matched among `repo_paths`. A malformed header or configs entry throws
// InvalidInput naming `repo_id`, README.md and the line.
std::vector<DatasetConfig> card_configs(const std::string& card_markdown,
                                        const std::vector<std::string>& repo_paths,
                                        const std::string& repo_id);

// The splits the file names define among `repo_paths` (the data files Tessera reads; README.md
// and the Hub's metadata files are left out), as the Hub's viewer defines them: first
// data/{split}-NNNNN-of-NNNNN.* (any split name); else a folder word train / training,
// validation / valid / val / dev, test / testing / eval / evaluation; else a file-name word;
// else everything is "train". Words are delimited by '-', '_', '.', ' ', '/' or digits. Splits
// come train, validation, test, then the others by name; a split with no file is left out.
std::vector<DatasetSplit> dataset_split_files(const std::vector<std::string>& repo_paths);

// The configs of the conversion branch from its file list: {config}/{split}/NNNN.parquet
// ("partial-{split}" folders too), or the older {config}/{name}-{split}[-NNNNN-of-NNNNN].parquet.
std::vector<DatasetConfig> parquet_conversion_configs(const std::vector<std::string>& repo_paths);

// '/'-aware glob as the Hub's dataset loader matches data_files: '*' and '?' stay inside one
// path segment, '**' spans any number of segments, [...] as fnmatch.
bool glob_match(const std::string& pattern, const std::string& path);

// The paths among `repo_paths` that a card's data_files `pattern` names (glob_match), sorted.
// As on the Hub, hidden files and folders ('.x'), "__x" folders and the metadata files
// (README.md, dataset_info.json, …) count only when the pattern names them.
std::vector<std::string> resolve_data_files(const std::string& pattern,
                                            const std::vector<std::string>& repo_paths);

// A file Tessera's dataset readers take, by its extension: JSON, JSONL (.ndjson), CSV, TSV
// (.tab), text (.txt, .text) and Parquet (.pq); the Hub's metadata files are not data.
bool is_data_file(const std::string& path);

struct RowPreview {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;  // cells as display text (strings unquoted, other
                                               // values as JSON)
  std::string source;   // "dataset viewer" or the file read ("data/train.jsonl, first 1 MiB")
  bool partial = true;  // more rows exist than shown
};

class Client;  // dataset_layout and preview_rows are Client members (client.h)

}  // namespace tessera::hf::hub
