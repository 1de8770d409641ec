#pragma once
// Dataset readers: JSONL, JSON, CSV/TSV, plain text and Parquet, behind one row-access
// interface. Line-based files are indexed over a memory map (offsets only), so a file larger
// than RAM is read without loading it whole; Parquet is read one row group at a time. JSON
// (.json) is parsed whole: use JSONL for large data.
//
// Plain text (.txt): by default one row per non-blank line (as the HuggingFace `text`
// loader's sample_by="line", except that blank lines are dropped), or one row per
// blank-line-separated paragraph, or the whole file as one row. The column is "text".
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::data {

// One record: an object of column -> value (strings for CSV and text; any JSON value for
// JSON, JSONL and Parquet). Key order is the file's, which chat templates can observe.
using Row = nlohmann::ordered_json;

enum class TextSplit { Line, Paragraph, Document };

struct ReadOptions {
  // "jsonl", "json", "csv", "tsv", "text" or "parquet"; empty = from the file extension
  // (.jsonl/.ndjson, .json, .csv, .tsv/.tab, .txt/.text/.md, .parquet/.pq).
  std::string file_type;
  TextSplit text_split = TextSplit::Line;
  // Skip rows that do not parse (invalid JSON, wrong field count, invalid UTF-8) and report
  // them instead of failing. Faults that make the rest of the file unreadable still throw.
  bool skip_bad_rows = false;
  // For .json: the key whose value holds the records; empty = "data" when present.
  std::string json_field;
};

// What was skipped, with the first few reasons (each naming file and line or record).
struct SkipReport {
  static constexpr std::size_t kMaxReasons = 5;
  std::size_t count = 0;
  std::vector<std::string> first_reasons;
  void add(std::string reason);
  void merge(const SkipReport& other);
  std::string summary() const;  // "3 rows skipped: <reason>; <reason>…" or ""
};

class DatasetReader {
 public:
  virtual ~DatasetReader() = default;
  virtual std::size_t num_rows() const = 0;
  // Throws tessera::Error naming the file and line/record when the row cannot be read.
  // Thread-safe.
  virtual Row row(std::size_t index) const = 0;
  // Column names in first-seen order (JSON/JSONL: the union over all rows).
  const std::vector<std::string>& columns() const { return columns_; }
  // Where row `index` lives, for messages: "data.jsonl:12", "data.csv:7", "data.json record 3".
  virtual std::string row_location(std::size_t index) const = 0;
  const std::string& file_type() const { return file_type_; }
  const std::filesystem::path& path() const { return path_; }
  const SkipReport& skipped() const { return skipped_; }

 protected:
  std::filesystem::path path_;
  std::string file_type_;
  std::vector<std::string> columns_;
  SkipReport skipped_;
};

// Opens and indexes a dataset file. Throws tessera::Error (file, line, what to do) for a
// missing or unreadable file, an unknown type, a bad row (unless skipping), or no rows.
std::unique_ptr<DatasetReader> open_dataset(const std::filesystem::path& path,
                                            const ReadOptions& options = {});

// Several files read as one dataset, rows in the order of `paths` (columns: the union, first
// seen first); the files must be of one type. One path is open_dataset.
std::unique_ptr<DatasetReader> open_datasets(const std::vector<std::filesystem::path>& paths,
                                             const ReadOptions& options = {});

// What a binary file is by its first bytes ("PNG image", "JPEG image", "GIF image", "PDF
// document", "ZIP archive", "gzip archive", "Parquet file"), or "" for anything else.
// open_dataset refuses such a file (unless it reads Parquet) with this name.
std::string binary_file_kind(const std::filesystem::path& path);

// The file type open_dataset would use for `path` ("" when the extension is unknown).
std::string file_type_from_extension(const std::filesystem::path& path);

bool parquet_supported();

// Offset of the first byte that is not valid UTF-8 (overlong forms, surrogates and code
// points above U+10FFFF are invalid), or npos when `text` is valid.
std::size_t find_invalid_utf8(std::string_view text);

// A column value as display text: strings as is, anything else as compact JSON.
std::string value_to_text(const nlohmann::ordered_json& value);

}  // namespace tessera::data
