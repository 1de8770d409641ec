#pragma once
// The GGUF container (version 3, little-endian), as llama.cpp's ggml/docs/gguf.md specifies it:
//
//   header        "GGUF", u32 version = 3, u64 tensor count, u64 metadata count
//   metadata      per entry: string key, u32 value type, value (strings are u64 length + bytes;
//                 arrays are u32 element type, u64 count, elements)
//   tensor infos  per tensor: string name, u32 dimension count, u64 dims (innermost first, the
//                 reverse of PyTorch's shape), u32 tensor type, u64 offset into the data section
//   padding       to `general.alignment` (default 32)
//   data          each tensor at its offset, every offset a multiple of the alignment
//
// Torch-free: the writer (gguf.cpp) encodes tensors itself (gguf_quant.h); this file lays out and
// reads back the header, so the export can compare what it meant to write with what is on disk.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::exporter::gguf {

enum class ValueType : std::uint32_t {
  UInt8 = 0,
  Int8 = 1,
  UInt16 = 2,
  Int16 = 3,
  UInt32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  UInt64 = 10,
  Int64 = 11,
  Float64 = 12,
};

// ggml's type numbers for the ones we write.
enum class TensorType : std::uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, BF16 = 30 };

constexpr std::uint32_t kVersion = 3;
constexpr std::uint32_t kDefaultAlignment = 32;
constexpr std::int64_t kQ8BlockSize = 32;       // values per q8_0 block
constexpr std::int64_t kQ8BlockBytes = 34;      // f16 scale + 32 int8
const char* tensor_type_name(TensorType type);  // "F32", "F16", "Q8_0", "BF16"

// One metadata entry, its value kept encoded as it sits in the file (after the type field).
struct Entry {
  std::string key;
  ValueType type = ValueType::UInt32;
  ValueType array_type = ValueType::UInt32;  // element type when type == Array
  std::uint64_t count = 1;                   // elements when type == Array
  std::string value;                         // encoded bytes

  // Typed reads; each throws tessera::Error (Internal) when the entry is of another type.
  std::string as_string() const;
  std::uint32_t as_u32() const;
  float as_f32() const;
  bool as_bool() const;
  std::vector<std::string> as_strings() const;
  bool operator==(const Entry&) const = default;
};

// The metadata in the order it is written. Keys are unique (adding one twice is a bug).
class Metadata {
 public:
  void add_string(std::string key, std::string_view value);
  void add_u32(std::string key, std::uint32_t value);
  void add_f32(std::string key, float value);
  void add_bool(std::string key, bool value);
  void add_strings(std::string key, std::span<const std::string> values);
  void add_i32s(std::string key, std::span<const std::int32_t> values);
  void add_f32s(std::string key, std::span<const float> values);

  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(std::string_view key) const;

 private:
  void add(Entry entry);
  std::vector<Entry> entries_;
};

struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> dims;  // innermost (contiguous) first
  TensorType type = TensorType::F32;
  std::uint64_t offset = 0;  // from the start of the data section
  std::uint64_t elements() const;
  // Bytes of the data; throws tessera::Error (Internal) for a q8_0 row that is not whole blocks.
  std::uint64_t bytes() const;
  bool operator==(const TensorInfo&) const = default;
};

// Everything before the tensor data, with each tensor's offset assigned.
struct Layout {
  std::string header;  // magic … tensor infos, padded to the alignment
  std::vector<TensorInfo> tensors;
  std::uint64_t data_bytes = 0;  // the data section, each tensor padded to the alignment
  std::uint32_t alignment = kDefaultAlignment;
};

// Assigns offsets in order and encodes the header. The alignment is the one the metadata's
// general.alignment says (kDefaultAlignment without it).
Layout lay_out(const Metadata& metadata, std::vector<TensorInfo> tensors);

// What a GGUF file says about itself, read back without its tensor data.
struct FileContents {
  std::uint32_t version = 0;
  std::vector<Entry> metadata;
  std::vector<TensorInfo> tensors;
  std::uint32_t alignment = kDefaultAlignment;
  std::uint64_t data_offset = 0;  // where the data section starts in the file
  std::uint64_t file_bytes = 0;
};

// Parses the header of `bytes` (the whole file). Throws tessera::Error (InvalidInput) naming
// `source` and the byte offset of the first thing that is not GGUF v3 as we write it, or a
// tensor whose data would lie outside the file.
FileContents read_contents(std::span<const std::uint8_t> bytes, const std::string& source);
FileContents read_file(const std::filesystem::path& path);

}  // namespace tessera::exporter::gguf
