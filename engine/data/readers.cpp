// JSONL, JSON, CSV/TSV and plain-text readers (Parquet is in parquet_reader.cpp).
#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "core/error.h"
#include "core/files.h"
#include "core/text.h"
#include "data/dataset.h"
#include "data/reader_internal.h"

namespace tessera::data {

namespace {

constexpr const char* kUtf8Hint =
    "save the file as UTF-8 (for example: iconv -f latin1 -t utf-8 in.txt > out.txt)";

// A row's bytes in the mapped file and the 1-based line where it starts.
struct Span {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t line = 0;
};

std::size_t bom_length(std::string_view data) {
  return data.size() >= 3 && static_cast<unsigned char>(data[0]) == 0xEF &&
                 static_cast<unsigned char>(data[1]) == 0xBB &&
                 static_cast<unsigned char>(data[2]) == 0xBF
             ? 3
             : 0;
}

std::string_view strip_cr(std::string_view s) {
  if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
  return s;
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// "\r\n" -> "\n" inside multi-line rows.
std::string without_cr_before_lf(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') continue;
    out += s[i];
  }
  return out;
}

std::string_view view_of(const core::MappedFile& file) {
  return {reinterpret_cast<const char*>(file.data()), file.size()};
}

// Throws, or records the reason when the caller asked to skip bad rows.
void bad_row(bool skip, SkipReport& report, std::string reason, const char* hint = "") {
  if (!skip) throw_invalid(std::move(reason), hint);
  report.add(std::move(reason));
}

std::string utf8_reason(const std::string& where, std::size_t offset_in_line,
                        std::uint64_t file_offset) {
  return where + ": invalid UTF-8 at byte " + std::to_string(offset_in_line + 1) +
         " of the line (file offset " + std::to_string(file_offset) + ")";
}

// Calls fn(line_text_without_cr, begin_offset, line_number) for every line after the BOM.
template <typename Fn>
void for_each_line(std::string_view data, Fn&& fn) {
  std::size_t pos = bom_length(data);
  std::uint64_t line = 1;
  while (pos < data.size()) {
    const void* nl = std::memchr(data.data() + pos, '\n', data.size() - pos);
    const std::size_t end = nl ? static_cast<const char*>(nl) - data.data() : data.size();
    fn(strip_cr(data.substr(pos, end - pos)), pos, line);
    pos = end + 1;
    ++line;
  }
}

void add_column(std::vector<std::string>& columns, std::unordered_set<std::string>& seen,
                const std::string& name) {
  if (seen.insert(name).second) columns.push_back(name);
}

// ---------------------------------------------------------------- JSONL

std::string json_error_detail(const std::exception& e) {
  std::string what = e.what();
  // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..."
  auto col = what.find("column ");
  if (col != std::string::npos) return what.substr(col);
  auto bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

class JsonlReader : public DatasetReader {
 public:
  JsonlReader(const std::filesystem::path& path, const ReadOptions& options) : file_(path) {
    path_ = path;
    file_type_ = "jsonl";
    const std::string name = path.string();
    std::unordered_set<std::string> seen;
    for_each_line(view_of(file_), [&](std::string_view text, std::size_t begin,
                                      std::uint64_t line) {
      if (is_blank(text)) return;
      const std::string where = name + ":" + std::to_string(line);
      if (auto bad = find_invalid_utf8(text); bad != std::string_view::npos) {
        bad_row(options.skip_bad_rows, skipped_, utf8_reason(where, bad, begin + bad), kUtf8Hint);
        return;
      }
      Row value;
      try {
        value = Row::parse(text);
      } catch (const std::exception& e) {
        bad_row(options.skip_bad_rows, skipped_, where + ": invalid JSON: " + json_error_detail(e),
                "each line of a .jsonl file must be one complete JSON object");
        return;
      }
      if (!value.is_object()) {
        bad_row(options.skip_bad_rows, skipped_,
                where + ": expected a JSON object per line, found " + value.type_name(),
                "write one {\"column\": value, ...} object per line");
        return;
      }
      for (auto it = value.begin(); it != value.end(); ++it) add_column(columns_, seen, it.key());
      rows_.push_back({begin, begin + text.size(), line});
    });
  }
  std::size_t num_rows() const override { return rows_.size(); }
  Row row(std::size_t index) const override {
    const Span& s = rows_.at(index);
    return Row::parse(view_of(file_).substr(s.begin, s.end - s.begin));
  }
  std::string row_location(std::size_t index) const override {
    return path_.string() + ":" + std::to_string(rows_.at(index).line);
  }

 private:
  core::MappedFile file_;
  std::vector<Span> rows_;
};

// ---------------------------------------------------------------- JSON

std::pair<std::size_t, std::size_t> line_and_column(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

class JsonReader : public DatasetReader {
 public:
  JsonReader(const std::filesystem::path& path, const ReadOptions& options) {
    path_ = path;
    file_type_ = "json";
    const std::string name = path.string();
    const std::string text = core::read_text_file(path);
    const std::string_view body = std::string_view(text).substr(bom_length(text));
    if (auto bad = find_invalid_utf8(body); bad != std::string_view::npos) {
      auto [line, column] = line_and_column(body, bad);
      throw_invalid(name + ":" + std::to_string(line) + ":" + std::to_string(column) +
                        ": invalid UTF-8 (file offset " + std::to_string(bad + bom_length(text)) +
                        ")",
                    kUtf8Hint);
    }
    Row doc;
    try {
      doc = Row::parse(body);
    } catch (const nlohmann::json::parse_error& e) {
      auto [line, column] = line_and_column(body, e.byte > 0 ? e.byte - 1 : 0);
      std::string detail = e.what();
      auto pos = detail.find(": syntax error");
      detail = pos == std::string::npos ? json_error_detail(e) : detail.substr(pos + 2);
      throw_invalid(name + ":" + std::to_string(line) + ":" + std::to_string(column) +
                        ": invalid JSON: " + detail,
                    "fix the JSON, or use one object per line in a .jsonl file");
    } catch (const nlohmann::json::out_of_range& e) {  // a number beyond a double (1e400)
      throw_invalid(name + ": invalid JSON: " + json_error_detail(e),
                    "fix the JSON, or use one object per line in a .jsonl file");
    }
    Row records;
    if (doc.is_array()) {
      records = std::move(doc);
    } else if (doc.is_object()) {
      records = pick_records(doc, name, options);
    } else {
      throw_invalid(name + ": the top level is a " + std::string(doc.type_name()) +
                        "; expected an array of records or an object",
                    layout_hint());
    }
    std::unordered_set<std::string> seen;
    rows_.reserve(records.size());
    for (std::size_t i = 0; i < records.size(); ++i) {
      Row& record = records[i];
      if (!record.is_object()) {
        bad_row(options.skip_bad_rows, skipped_,
                name + " record " + std::to_string(i + 1) + ": expected an object, found " +
                    record.type_name(),
                layout_hint());
        continue;
      }
      for (auto it = record.begin(); it != record.end(); ++it) add_column(columns_, seen, it.key());
      rows_.push_back(std::move(record));
      record_numbers_.push_back(i + 1);
    }
  }
  std::size_t num_rows() const override { return rows_.size(); }
  Row row(std::size_t index) const override { return rows_.at(index); }
  std::string row_location(std::size_t index) const override {
    return path_.string() + " record " + std::to_string(record_numbers_.at(index));
  }

 private:
  static const char* layout_hint() {
    return "use [{\"col\": ...}, ...], {\"data\": [{...}, ...]} or {\"col\": [...], ...}";
  }

  static Row pick_records(Row& doc, const std::string& name, const ReadOptions& options) {
    if (!options.json_field.empty()) {
      auto it = doc.find(options.json_field);
      if (it == doc.end() || !it->is_array())
        throw_invalid(name + ": field '" + options.json_field + "' is " +
                          (it == doc.end() ? "missing" : std::string("not an array")),
                      layout_hint());
      return std::move(*it);
    }
    if (auto it = doc.find("data"); it != doc.end() && it->is_array()) return std::move(*it);
    // Columns: every value an array of the same length.
    bool columnar = !doc.empty();
    std::size_t length = 0;
    std::string first_key;
    for (auto it = doc.begin(); it != doc.end() && columnar; ++it) {
      if (!it->is_array()) {
        columnar = false;
      } else if (first_key.empty()) {
        first_key = it.key();
        length = it->size();
      } else if (it->size() != length) {
        throw_invalid(name + ": column '" + it.key() + "' has " + std::to_string(it->size()) +
                          " values but column '" + first_key + "' has " + std::to_string(length),
                      "every column of a column-oriented JSON file needs the same length");
      }
    }
    if (columnar) {
      // A single key holding records ({"train": [{...}]}) is records, not one column.
      if (doc.size() == 1 && length > 0 && doc.begin()->front().is_object())
        return std::move(*doc.begin());
      Row records = Row::array();
      for (std::size_t i = 0; i < length; ++i) {
        Row record = Row::object();
        for (auto it = doc.begin(); it != doc.end(); ++it) record[it.key()] = std::move((*it)[i]);
        records.push_back(std::move(record));
      }
      return records;
    }
    throw_invalid(name +
                      ": the top-level object is neither {\"data\": [...]} nor columns of "
                      "equal-length arrays",
                  layout_hint());
  }

  std::vector<Row> rows_;
  std::vector<std::size_t> record_numbers_;
};

// ---------------------------------------------------------------- CSV / TSV

struct RecordScan {
  std::size_t next = 0;        // offset just past the record and its line end
  std::uint64_t newlines = 0;  // line ends consumed, inside quotes and the final one
  std::string error;           // a fault that spoils this record only
  bool fatal = false;          // an unterminated quote: the rest of the file is unreadable
};

// One RFC 4180 record starting at `pos`: fields split on `delim`, double quotes around a
// field allow delimiters, line ends and doubled quotes ("") inside it; CRLF or LF ends it.
RecordScan scan_record(std::string_view data, std::size_t pos, char delim,
                       std::vector<std::string>* fields) {
  RecordScan r;
  const std::size_t n = data.size();
  std::size_t i = pos;
  std::string field;
  auto at_record_end = [&](std::size_t k) {
    return k >= n || data[k] == '\n' || (data[k] == '\r' && (k + 1 == n || data[k + 1] == '\n'));
  };
  while (true) {
    field.clear();
    if (i < n && data[i] == '"') {
      ++i;
      while (true) {
        if (i >= n) {
          r.error = "a quoted field opened on this line is never closed";
          r.fatal = true;
          r.next = n;
          return r;
        }
        const char c = data[i];
        if (c == '"') {
          if (i + 1 < n && data[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        if (c == '\n') ++r.newlines;
        field += c;
        ++i;
      }
      while (i < n && data[i] != delim && !at_record_end(i)) {
        if (r.error.empty())
          r.error = "text after a closing quote (a quote inside a quoted field is written \"\")";
        field += data[i++];
      }
    } else {
      while (i < n && data[i] != delim && !at_record_end(i)) field += data[i++];
    }
    if (fields) fields->push_back(field);
    if (i < n && data[i] == delim) {
      ++i;
      continue;
    }
    if (i < n && data[i] == '\r') ++i;
    if (i < n && data[i] == '\n') {
      ++i;
      ++r.newlines;
    }
    r.next = i;
    return r;
  }
}

class CsvReader : public DatasetReader {
 public:
  CsvReader(const std::filesystem::path& path, const ReadOptions& options, char delim)
      : file_(path), delim_(delim) {
    path_ = path;
    file_type_ = delim == '\t' ? "tsv" : "csv";
    const std::string name = path.string();
    const std::string_view data = view_of(file_);
    std::size_t pos = bom_length(data);
    std::uint64_t line = 1;
    bool have_header = false;
    std::vector<std::string> fields;
    while (pos < data.size()) {
      fields.clear();
      const RecordScan r = scan_record(data, pos, delim_, &fields);
      const std::string where = name + ":" + std::to_string(line);
      const std::string_view raw = data.substr(pos, r.next - pos);
      const std::uint64_t start_line = line;
      const std::size_t start = pos;
      pos = r.next;
      line += r.newlines;
      if (r.fatal)
        throw_invalid(where + ": " + r.error,
                      "close the quote, or double quotes that are part of the text (\"\")");
      // A blank line is no record (an unquoted single empty field).
      if (fields.size() == 1 && is_blank(fields[0]) && (raw.empty() || raw[0] != '"')) continue;
      if (auto bad = find_invalid_utf8(raw); bad != std::string_view::npos) {
        if (!have_header) throw_invalid(utf8_reason(where, bad, start + bad), kUtf8Hint);
        bad_row(options.skip_bad_rows, skipped_, utf8_reason(where, bad, start + bad), kUtf8Hint);
        continue;
      }
      if (!have_header) {
        if (!r.error.empty()) throw_invalid(where + " (header): " + r.error);
        std::unordered_set<std::string> seen;
        for (std::size_t k = 0; k < fields.size(); ++k) {
          std::string column = fields[k].empty() ? "column_" + std::to_string(k + 1) : fields[k];
          if (!seen.insert(column).second)
            throw_invalid(where + " (header): column '" + column + "' appears twice",
                          "give every column a distinct name");
          columns_.push_back(std::move(column));
        }
        have_header = true;
        continue;
      }
      if (!r.error.empty()) {
        bad_row(options.skip_bad_rows, skipped_, where + ": " + r.error);
        continue;
      }
      if (fields.size() != columns_.size()) {
        bad_row(options.skip_bad_rows, skipped_,
                where + ": " + std::to_string(fields.size()) + " fields, but the header has " +
                    std::to_string(columns_.size()),
                delim_ == '\t' ? "check for tabs inside values; quote such values"
                               : "quote values that contain commas or line breaks");
        continue;
      }
      rows_.push_back({start, r.next, start_line});
    }
    if (!have_header)
      throw_invalid(name + ": the file is empty (a header row and at least one row are needed)");
  }
  std::size_t num_rows() const override { return rows_.size(); }
  Row row(std::size_t index) const override {
    std::vector<std::string> fields;
    scan_record(view_of(file_), rows_.at(index).begin, delim_, &fields);
    Row out = Row::object();
    for (std::size_t k = 0; k < columns_.size() && k < fields.size(); ++k)
      out[columns_[k]] = without_cr_before_lf(fields[k]);
    return out;
  }
  std::string row_location(std::size_t index) const override {
    return path_.string() + ":" + std::to_string(rows_.at(index).line);
  }

 private:
  core::MappedFile file_;
  char delim_;
  std::vector<Span> rows_;
};

// ---------------------------------------------------------------- plain text

class TextReader : public DatasetReader {
 public:
  TextReader(const std::filesystem::path& path, const ReadOptions& options)
      : file_(path), split_(options.text_split) {
    path_ = path;
    file_type_ = "text";
    columns_ = {"text"};
    const std::string name = path.string();
    const std::string_view data = view_of(file_);
    Span paragraph;
    bool in_paragraph = false;
    bool paragraph_bad = false;
    auto close_paragraph = [&] {
      if (in_paragraph && !paragraph_bad) rows_.push_back(paragraph);
      in_paragraph = false;
      paragraph_bad = false;
    };
    for_each_line(data, [&](std::string_view text, std::size_t begin, std::uint64_t line) {
      const bool blank = is_blank(text);
      bool bad = false;
      if (auto off = find_invalid_utf8(text); off != std::string_view::npos) {
        bad = true;
        bad_row(options.skip_bad_rows, skipped_,
                utf8_reason(name + ":" + std::to_string(line), off, begin + off), kUtf8Hint);
      }
      if (split_ == TextSplit::Line) {
        if (!blank && !bad) rows_.push_back({begin, begin + text.size(), line});
      } else if (split_ == TextSplit::Paragraph) {
        if (blank) {
          close_paragraph();
          return;
        }
        if (!in_paragraph) {
          paragraph = {begin, begin + text.size(), line};
          in_paragraph = true;
        }
        paragraph.end = begin + text.size();
        paragraph_bad = paragraph_bad || bad;
      } else {
        if (!in_paragraph) paragraph = {begin, begin, 1};
        in_paragraph = true;
        if (!blank) paragraph.end = begin + text.size();
        paragraph_bad = paragraph_bad || bad;
      }
    });
    if (split_ == TextSplit::Document && in_paragraph &&
        is_blank(data.substr(paragraph.begin, paragraph.end - paragraph.begin)))
      in_paragraph = false;
    close_paragraph();
  }
  std::size_t num_rows() const override { return rows_.size(); }
  Row row(std::size_t index) const override {
    const Span& s = rows_.at(index);
    Row out = Row::object();
    out["text"] = without_cr_before_lf(view_of(file_).substr(s.begin, s.end - s.begin));
    return out;
  }
  std::string row_location(std::size_t index) const override {
    if (split_ == TextSplit::Document) return path_.string();
    return path_.string() + ":" + std::to_string(rows_.at(index).line);
  }

 private:
  core::MappedFile file_;
  TextSplit split_;
  std::vector<Span> rows_;
};

}  // namespace

void SkipReport::add(std::string reason) {
  ++count;
  if (first_reasons.size() < kMaxReasons) first_reasons.push_back(std::move(reason));
}

void SkipReport::merge(const SkipReport& other) {
  count += other.count;
  for (const auto& r : other.first_reasons)
    if (first_reasons.size() < kMaxReasons) first_reasons.push_back(r);
}

std::string SkipReport::summary() const {
  if (count == 0) return {};
  std::string out = std::to_string(count) + (count == 1 ? " row" : " rows") + " skipped";
  for (std::size_t i = 0; i < first_reasons.size(); ++i)
    out += (i == 0 ? ": " : "; ") + first_reasons[i];
  if (count > first_reasons.size()) out += "; …";
  return out;
}

std::size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string value_to_text(const nlohmann::ordered_json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return {};
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string file_type_from_extension(const std::filesystem::path& path) {
  const std::string ext = core::ascii_lower(path.extension().string());
  if (ext == ".jsonl" || ext == ".ndjson") return "jsonl";
  if (ext == ".json") return "json";
  if (ext == ".csv") return "csv";
  if (ext == ".tsv" || ext == ".tab") return "tsv";
  if (ext == ".txt" || ext == ".text" || ext == ".md") return "text";
  if (ext == ".parquet" || ext == ".pq") return "parquet";
  return {};
}

std::string binary_file_kind(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  in.read(head, sizeof head);
  const std::string_view bytes(head, static_cast<std::size_t>(in.gcount()));
  static constexpr std::pair<std::string_view, const char*> kSignatures[] = {
      {"\x89PNG\r\n\x1a\n", "PNG image"},
      {"\xff\xd8\xff", "JPEG image"},
      {"GIF87a", "GIF image"},
      {"GIF89a", "GIF image"},
      {"%PDF-", "PDF document"},
      {"PK\x03\x04", "ZIP archive"},
      {"\x1f\x8b", "gzip archive"},
      {"PAR1", "Parquet file"},
  };
  for (const auto& [magic, kind] : kSignatures)
    if (bytes.substr(0, magic.size()) == magic) return kind;
  return {};
}

std::unique_ptr<DatasetReader> open_dataset(const std::filesystem::path& path,
                                            const ReadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw_invalid(path.string() + ": no such file", "check the dataset path");
  if (std::filesystem::is_directory(path, ec))
    throw_invalid(path.string() + ": is a folder; give a dataset file",
                  "pass one .jsonl, .json, .csv, .tsv, .txt or .parquet file");
  std::string type = core::ascii_lower(options.file_type);
  if (type == "txt") type = "text";
  if (type.empty()) type = file_type_from_extension(path);
  if (type != "parquet") {
    // Say what a binary file is before its bytes are reported as bad UTF-8 line by line.
    if (const std::string kind = binary_file_kind(path); !kind.empty()) {
      if (kind == "Parquet file" && parquet_supported())
        throw_invalid(path.string() + ": not a text file (it looks like a " + kind + ")",
                      "give the file the .parquet extension, or choose the text dataset");
      throw_invalid(path.string() + ": not a text file (it looks like a " + kind + ")",
                    "choose the dataset itself: a .jsonl, .json, .csv, .tsv, .txt or .parquet "
                    "file");
    }
  }
  std::unique_ptr<DatasetReader> reader;
  if (type == "jsonl") {
    reader = std::make_unique<JsonlReader>(path, options);
  } else if (type == "json") {
    reader = std::make_unique<JsonReader>(path, options);
  } else if (type == "csv") {
    reader = std::make_unique<CsvReader>(path, options, ',');
  } else if (type == "tsv") {
    reader = std::make_unique<CsvReader>(path, options, '\t');
  } else if (type == "text") {
    reader = std::make_unique<TextReader>(path, options);
  } else if (type == "parquet") {
    reader = detail::open_parquet(path, options);
  } else if (options.file_type.empty()) {
    throw_invalid(path.string() + ": unknown dataset file type '" + path.extension().string() + "'",
                  "use .jsonl, .json, .csv, .tsv, .txt or .parquet, or name the type explicitly");
  } else {
    throw_invalid("unknown dataset file type '" + options.file_type + "' for " + path.string(),
                  "use jsonl, json, csv, tsv, text or parquet");
  }
  if (reader->num_rows() == 0) {
    if (reader->skipped().count > 0)
      throw_invalid(path.string() + ": no usable rows; " + reader->skipped().summary(),
                    "fix the rows above, or check that this is the right file");
    throw_invalid(path.string() + ": the dataset is empty (no rows)",
                  "check that this is the right file");
  }
  return reader;
}

}  // namespace tessera::data
