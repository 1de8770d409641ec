// Parquet through the Arrow/Parquet C++ libraries of the pyarrow wheel, one row group in
// memory at a time. Without them (TESSERA_HAVE_PARQUET unset) opening a .parquet file is a
// clear error.
#include "core/error.h"
#include "data/dataset.h"
#include "data/reader_internal.h"

#ifdef TESSERA_HAVE_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include <algorithm>
#include <mutex>
#endif

namespace tessera::data {

#ifndef TESSERA_HAVE_PARQUET

bool parquet_supported() {
  return false;
}

namespace detail {
std::unique_ptr<DatasetReader> open_parquet(const std::filesystem::path& path, const ReadOptions&) {
  throw_unsupported(path.string() + ": Parquet support was not built",
                    "install pyarrow in the venv (pip install pyarrow) and reconfigure, or "
                    "convert the file to JSONL");
}
}  // namespace detail

#else

bool parquet_supported() {
  return true;
}

namespace {

Row scalar_to_json(const arrow::Scalar& scalar);

Row array_to_json(const arrow::Array& array) {
  Row out = Row::array();
  for (std::int64_t i = 0; i < array.length(); ++i) {
    auto scalar = array.GetScalar(i);
    out.push_back(scalar.ok() ? scalar_to_json(**scalar) : Row());
  }
  return out;
}

// Arrow values as JSON: strings, numbers, booleans, lists and structs (chat messages are
// list<struct<role, content>>); anything else as its text form.
Row scalar_to_json(const arrow::Scalar& scalar) {
  if (!scalar.is_valid) return nullptr;
  using T = arrow::Type;
  switch (scalar.type->id()) {
    case T::STRING:
    case T::LARGE_STRING:
    case T::STRING_VIEW: {
      const auto& s = static_cast<const arrow::BaseBinaryScalar&>(scalar);
      return std::string(reinterpret_cast<const char*>(s.value->data()),
                         static_cast<std::size_t>(s.value->size()));
    }
    case T::BOOL:
      return static_cast<const arrow::BooleanScalar&>(scalar).value;
    case T::INT8:
      return static_cast<const arrow::Int8Scalar&>(scalar).value;
    case T::INT16:
      return static_cast<const arrow::Int16Scalar&>(scalar).value;
    case T::INT32:
      return static_cast<const arrow::Int32Scalar&>(scalar).value;
    case T::INT64:
      return static_cast<const arrow::Int64Scalar&>(scalar).value;
    case T::UINT8:
      return static_cast<const arrow::UInt8Scalar&>(scalar).value;
    case T::UINT16:
      return static_cast<const arrow::UInt16Scalar&>(scalar).value;
    case T::UINT32:
      return static_cast<const arrow::UInt32Scalar&>(scalar).value;
    case T::UINT64:
      return static_cast<const arrow::UInt64Scalar&>(scalar).value;
    case T::FLOAT:
      return static_cast<const arrow::FloatScalar&>(scalar).value;
    case T::DOUBLE:
      return static_cast<const arrow::DoubleScalar&>(scalar).value;
    case T::LIST:
    case T::LARGE_LIST:
    case T::FIXED_SIZE_LIST:
    case T::LIST_VIEW:
    case T::LARGE_LIST_VIEW:
      return array_to_json(*static_cast<const arrow::BaseListScalar&>(scalar).value);
    case T::STRUCT: {
      const auto& s = static_cast<const arrow::StructScalar&>(scalar);
      const auto& type = static_cast<const arrow::StructType&>(*scalar.type);
      Row out = Row::object();
      for (int f = 0; f < type.num_fields() && static_cast<std::size_t>(f) < s.value.size(); ++f)
        out[type.field(f)->name()] = scalar_to_json(*s.value[static_cast<std::size_t>(f)]);
      return out;
    }
    default:
      return scalar.ToString();
  }
}

class ParquetReader : public DatasetReader {
 public:
  ParquetReader(const std::filesystem::path& path, const ReadOptions&) {
    path_ = path;
    file_type_ = "parquet";
    const std::string name = path.string();
    try {
      auto input = arrow::io::ReadableFile::Open(name);
      if (!input.ok()) throw_io(name + ": cannot open: " + input.status().ToString());
      auto opened = parquet::arrow::OpenFile(*input, arrow::default_memory_pool());
      if (!opened.ok())
        throw_invalid(name + ": not a readable Parquet file: " + opened.status().ToString(),
                      "check that the file is complete (not truncated) and really Parquet");
      reader_ = std::move(*opened);
      std::shared_ptr<arrow::Schema> schema;
      auto status = reader_->GetSchema(&schema);
      if (!status.ok())
        throw_invalid(name + ": cannot read the Parquet schema: " + status.ToString());
      for (const auto& field : schema->fields()) columns_.push_back(field->name());
      const auto metadata = reader_->parquet_reader()->metadata();
      std::uint64_t total = 0;
      for (int g = 0; g < metadata->num_row_groups(); ++g) {
        const auto rows = metadata->RowGroup(g)->num_rows();
        if (rows < 0)
          throw_invalid(name + ": row group " + std::to_string(g) + " has a negative row count");
        // Every row puts at least one value (or null) in each column, so a row count above a
        // column's value count is a damaged footer; reading it would allocate for rows that
        // are not there (a 1 KB file claiming 55 billion rows took 8 GB before it was refused).
        const auto group_meta = metadata->RowGroup(g);
        for (int c = 0; c < group_meta->num_columns(); ++c) {
          const std::int64_t values = group_meta->ColumnChunk(c)->num_values();
          if (rows > values)
            throw_invalid(name + ": row group " + std::to_string(g) + " claims " +
                              std::to_string(rows) + " rows but its column " + std::to_string(c) +
                              " holds " + std::to_string(values) + " values",
                          "the file is damaged; write or download it again");
        }
        group_starts_.push_back(total);
        total += static_cast<std::uint64_t>(rows);
      }
      num_rows_ = total;
    } catch (const parquet::ParquetException& e) {
      throw_invalid(name + ": not a readable Parquet file: " + e.what(),
                    "check that the file is complete (not truncated) and really Parquet");
    }
  }
  std::size_t num_rows() const override { return num_rows_; }
  Row row(std::size_t index) const override {
    if (index >= num_rows_)
      throw_invalid(path_.string() + ": row " + std::to_string(index) + " is out of range");
    const auto it = std::upper_bound(group_starts_.begin(), group_starts_.end(), index);
    const int group = static_cast<int>(it - group_starts_.begin()) - 1;
    const std::int64_t local =
        static_cast<std::int64_t>(index - group_starts_[static_cast<std::size_t>(group)]);
    std::lock_guard lock(mutex_);
    if (group != cached_group_) {
      std::shared_ptr<arrow::Table> table;
      try {
        auto status = reader_->RowGroup(group)->ReadTable(&table);
        if (!status.ok())
          throw_invalid(path_.string() + ": cannot read row group " + std::to_string(group) + ": " +
                        status.ToString());
      } catch (const parquet::ParquetException& e) {
        throw_invalid(path_.string() + ": cannot read row group " + std::to_string(group) + ": " +
                      e.what());
      }
      cached_table_ = std::move(table);
      cached_group_ = group;
    }
    Row out = Row::object();
    for (int c = 0; c < cached_table_->num_columns(); ++c) {
      auto scalar = cached_table_->column(c)->GetScalar(local);
      out[cached_table_->field(c)->name()] = scalar.ok() ? scalar_to_json(**scalar) : Row();
    }
    return out;
  }
  std::string row_location(std::size_t index) const override {
    return path_.string() + " row " + std::to_string(index + 1);
  }

 private:
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  std::vector<std::uint64_t> group_starts_;
  std::size_t num_rows_ = 0;
  mutable std::mutex mutex_;
  mutable int cached_group_ = -1;
  mutable std::shared_ptr<arrow::Table> cached_table_;
};

}  // namespace

namespace detail {
std::unique_ptr<DatasetReader> open_parquet(const std::filesystem::path& path,
                                            const ReadOptions& options) {
  return std::make_unique<ParquetReader>(path, options);
}
}  // namespace detail

#endif

}  // namespace tessera::data
