#include "export/gguf_file.h"

#include <bit>
#include <cstring>

#include "core/error.h"
#include "core/files.h"

namespace tessera::exporter::gguf {
namespace {

// Little-endian encoding, whatever the host's order.
void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_string(std::string& out, std::string_view s) {
  put_u64(out, s.size());
  out.append(s);
}

std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<std::uint8_t>(p[i])) << (8 * i);
  return v;
}

// Bytes of one scalar of `type`; 0 for strings and arrays (variable).
std::uint64_t scalar_bytes(ValueType type) {
  switch (type) {
    case ValueType::UInt8:
    case ValueType::Int8:
    case ValueType::Bool:
      return 1;
    case ValueType::UInt16:
    case ValueType::Int16:
      return 2;
    case ValueType::UInt32:
    case ValueType::Int32:
    case ValueType::Float32:
      return 4;
    case ValueType::UInt64:
    case ValueType::Int64:
    case ValueType::Float64:
      return 8;
    case ValueType::String:
    case ValueType::Array:
      return 0;
  }
  return 0;
}

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::UInt8:
      return "uint8";
    case ValueType::Int8:
      return "int8";
    case ValueType::UInt16:
      return "uint16";
    case ValueType::Int16:
      return "int16";
    case ValueType::UInt32:
      return "uint32";
    case ValueType::Int32:
      return "int32";
    case ValueType::Float32:
      return "float32";
    case ValueType::Bool:
      return "bool";
    case ValueType::String:
      return "string";
    case ValueType::Array:
      return "array";
    case ValueType::UInt64:
      return "uint64";
    case ValueType::Int64:
      return "int64";
    case ValueType::Float64:
      return "float64";
  }
  return "unknown";
}

std::uint64_t align_up(std::uint64_t n, std::uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// Bounds-checked reading of the header; every failure names the source and the offset.
class Cursor {
 public:
  Cursor(std::span<const std::uint8_t> bytes, const std::string& source)
      : bytes_(bytes), source_(source) {}

  std::uint64_t offset() const { return at_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw_invalid(source_ + ": byte " + std::to_string(at_) + ": " + what,
                  "the file is not a complete GGUF v3 file; export it again");
  }
  const char* take(std::uint64_t n, const char* what) {
    if (n > bytes_.size() - at_)
      fail(std::string("the file ends inside ") + what + " (" + std::to_string(n) +
           " bytes needed, " + std::to_string(bytes_.size() - at_) + " left)");
    const char* p = reinterpret_cast<const char*>(bytes_.data() + at_);
    at_ += n;
    return p;
  }
  std::uint32_t u32(const char* what) { return get_u32(take(4, what)); }
  std::uint64_t u64(const char* what) {
    const char* p = take(8, what);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<std::uint8_t>(p[i])) << (8 * i);
    return v;
  }
  std::string string(const char* what) {
    const std::uint64_t n = u64(what);
    return std::string(take(n, what), n);
  }

 private:
  std::span<const std::uint8_t> bytes_;
  const std::string& source_;
  std::uint64_t at_ = 0;
};

ValueType value_type(Cursor& c, const char* what) {
  const std::uint32_t t = c.u32(what);
  if (t > static_cast<std::uint32_t>(ValueType::Float64))
    c.fail(std::string("unknown value type ") + std::to_string(t) + " in " + what);
  return static_cast<ValueType>(t);
}

// Steps over one scalar or string value of `type`.
void skip_value(Cursor& c, ValueType type, const std::string& key) {
  const std::string what = "the value of " + key;
  if (type == ValueType::String)
    c.take(c.u64(what.c_str()), what.c_str());
  else
    c.take(scalar_bytes(type), what.c_str());
}

}  // namespace

const char* tensor_type_name(TensorType type) {
  switch (type) {
    case TensorType::F32:
      return "F32";
    case TensorType::F16:
      return "F16";
    case TensorType::Q8_0:
      return "Q8_0";
    case TensorType::BF16:
      return "BF16";
  }
  return "unknown";
}

// ---- entries --------------------------------------------------------------------------------

namespace {

void expect_type(const Entry& e, ValueType type, ValueType array_type = ValueType::UInt32) {
  if (e.type != type || (type == ValueType::Array && e.array_type != array_type))
    throw Error(ErrorKind::Internal, "GGUF key " + e.key + " is " + value_type_name(e.type) +
                                         ", not " + value_type_name(type));
}

}  // namespace

std::string Entry::as_string() const {
  expect_type(*this, ValueType::String);
  return value.substr(8);
}

std::uint32_t Entry::as_u32() const {
  expect_type(*this, ValueType::UInt32);
  return get_u32(value.data());
}

float Entry::as_f32() const {
  expect_type(*this, ValueType::Float32);
  return std::bit_cast<float>(get_u32(value.data()));
}

bool Entry::as_bool() const {
  expect_type(*this, ValueType::Bool);
  return value[0] != 0;
}

std::vector<std::string> Entry::as_strings() const {
  expect_type(*this, ValueType::Array, ValueType::String);
  std::vector<std::string> out;
  out.reserve(count);
  std::size_t at = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint64_t n = 0;
    for (int b = 0; b < 8; ++b)
      n |= std::uint64_t(static_cast<std::uint8_t>(value[at + b])) << (8 * b);
    out.emplace_back(value.substr(at + 8, n));
    at += 8 + n;
  }
  return out;
}

namespace {

Entry entry(std::string key, ValueType type, ValueType array_type = ValueType::UInt32,
            std::uint64_t count = 1) {
  Entry e;
  e.key = std::move(key);
  e.type = type;
  e.array_type = array_type;
  e.count = count;
  return e;
}

}  // namespace

void Metadata::add(Entry added) {
  if (find(added.key) != nullptr)
    throw Error(ErrorKind::Internal, "GGUF key " + added.key + " written twice");
  entries_.push_back(std::move(added));
}

const Entry* Metadata::find(std::string_view key) const {
  for (const Entry& e : entries_)
    if (e.key == key) return &e;
  return nullptr;
}

void Metadata::add_string(std::string key, std::string_view value) {
  Entry e = entry(std::move(key), ValueType::String);
  put_string(e.value, value);
  add(std::move(e));
}

void Metadata::add_u32(std::string key, std::uint32_t value) {
  Entry e = entry(std::move(key), ValueType::UInt32);
  put_u32(e.value, value);
  add(std::move(e));
}

void Metadata::add_f32(std::string key, float value) {
  Entry e = entry(std::move(key), ValueType::Float32);
  put_u32(e.value, std::bit_cast<std::uint32_t>(value));
  add(std::move(e));
}

void Metadata::add_bool(std::string key, bool value) {
  Entry e = entry(std::move(key), ValueType::Bool);
  e.value.push_back(value ? 1 : 0);
  add(std::move(e));
}

void Metadata::add_strings(std::string key, std::span<const std::string> values) {
  Entry e = entry(std::move(key), ValueType::Array, ValueType::String, values.size());
  for (const std::string& v : values) put_string(e.value, v);
  add(std::move(e));
}

void Metadata::add_i32s(std::string key, std::span<const std::int32_t> values) {
  Entry e = entry(std::move(key), ValueType::Array, ValueType::Int32, values.size());
  for (std::int32_t v : values) put_u32(e.value, static_cast<std::uint32_t>(v));
  add(std::move(e));
}

void Metadata::add_f32s(std::string key, std::span<const float> values) {
  Entry e = entry(std::move(key), ValueType::Array, ValueType::Float32, values.size());
  for (float v : values) put_u32(e.value, std::bit_cast<std::uint32_t>(v));
  add(std::move(e));
}

// ---- tensors and layout ---------------------------------------------------------------------

std::uint64_t TensorInfo::elements() const {
  std::uint64_t n = 1;
  for (std::uint64_t d : dims) n *= d;
  return n;
}

std::uint64_t TensorInfo::bytes() const {
  switch (type) {
    case TensorType::F32:
      return elements() * 4;
    case TensorType::F16:
    case TensorType::BF16:
      return elements() * 2;
    case TensorType::Q8_0:
      if (dims.empty() || dims[0] % kQ8BlockSize != 0)
        throw Error(ErrorKind::Internal, "GGUF tensor " + name + ": q8_0 rows of " +
                                             std::to_string(dims.empty() ? 0 : dims[0]) +
                                             " values are not whole blocks of 32");
      return elements() / kQ8BlockSize * kQ8BlockBytes;
  }
  throw Error(ErrorKind::Internal, "GGUF tensor " + name + ": unknown type");
}

Layout lay_out(const Metadata& metadata, std::vector<TensorInfo> tensors) {
  Layout layout;
  if (const Entry* a = metadata.find("general.alignment")) layout.alignment = a->as_u32();
  if (layout.alignment == 0 || (layout.alignment & (layout.alignment - 1)) != 0)
    throw Error(ErrorKind::Internal, "general.alignment must be a power of two");
  std::string& h = layout.header;
  h.append("GGUF");
  put_u32(h, kVersion);
  put_u64(h, tensors.size());
  put_u64(h, metadata.entries().size());
  for (const Entry& e : metadata.entries()) {
    put_string(h, e.key);
    put_u32(h, static_cast<std::uint32_t>(e.type));
    if (e.type == ValueType::Array) {
      put_u32(h, static_cast<std::uint32_t>(e.array_type));
      put_u64(h, e.count);
    }
    h.append(e.value);
  }
  std::uint64_t offset = 0;
  for (TensorInfo& t : tensors) {
    t.offset = offset;
    offset = align_up(offset + t.bytes(), layout.alignment);
    put_string(h, t.name);
    put_u32(h, static_cast<std::uint32_t>(t.dims.size()));
    for (std::uint64_t d : t.dims) put_u64(h, d);
    put_u32(h, static_cast<std::uint32_t>(t.type));
    put_u64(h, t.offset);
  }
  h.resize(align_up(h.size(), layout.alignment), '\0');
  layout.data_bytes = offset;
  layout.tensors = std::move(tensors);
  return layout;
}

// ---- reading back ---------------------------------------------------------------------------

FileContents read_contents(std::span<const std::uint8_t> bytes, const std::string& source) {
  Cursor c(bytes, source);
  FileContents out;
  out.file_bytes = bytes.size();
  if (std::string_view(c.take(4, "the magic"), 4) != "GGUF") {
    Cursor at_start(bytes, source);
    at_start.fail("not a GGUF file (it does not start with \"GGUF\")");
  }
  out.version = c.u32("the version");
  if (out.version != kVersion) c.fail("GGUF version " + std::to_string(out.version) + ", not 3");
  const std::uint64_t tensor_count = c.u64("the tensor count");
  const std::uint64_t entry_count = c.u64("the metadata count");
  // Every entry and tensor info takes at least 12 bytes: counts beyond that cannot fit.
  if (entry_count > bytes.size() / 12 || tensor_count > bytes.size() / 12)
    c.fail("counts larger than the file can hold (" + std::to_string(entry_count) +
           " metadata entries, " + std::to_string(tensor_count) + " tensors)");
  for (std::uint64_t i = 0; i < entry_count; ++i) {
    Entry e;
    e.key = c.string("a metadata key");
    e.type = value_type(c, "a metadata value type");
    const std::uint64_t start = c.offset();
    if (e.type == ValueType::Array) {
      e.array_type = value_type(c, "an array's element type");
      if (e.array_type == ValueType::Array) c.fail("nested arrays in " + e.key);
      e.count = c.u64("an array's length");
      const std::uint64_t data_start = c.offset();
      if (e.array_type == ValueType::String) {
        for (std::uint64_t k = 0; k < e.count; ++k) c.string(("an element of " + e.key).c_str());
      } else {
        const std::uint64_t size = scalar_bytes(e.array_type);
        if (e.count > (bytes.size() - c.offset()) / size)
          c.fail("array " + e.key + " is longer than the file");
        c.take(size * e.count, e.key.c_str());
      }
      e.value.assign(reinterpret_cast<const char*>(bytes.data() + data_start),
                     c.offset() - data_start);
    } else {
      skip_value(c, e.type, e.key);
      e.value.assign(reinterpret_cast<const char*>(bytes.data() + start), c.offset() - start);
    }
    out.metadata.push_back(std::move(e));
  }
  for (const Entry& e : out.metadata)
    if (e.key == "general.alignment") {
      if (e.type != ValueType::UInt32) c.fail("general.alignment is not a uint32");
      out.alignment = e.as_u32();
      if (out.alignment == 0 || (out.alignment & (out.alignment - 1)) != 0)
        c.fail("general.alignment " + std::to_string(out.alignment) + " is not a power of two");
    }
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    t.name = c.string("a tensor name");
    const std::uint32_t n_dims = c.u32("a tensor's dimension count");
    if (n_dims == 0 || n_dims > 4)
      c.fail("tensor " + t.name + " has " + std::to_string(n_dims) + " dimensions (1 to 4)");
    for (std::uint32_t d = 0; d < n_dims; ++d) t.dims.push_back(c.u64("a tensor dimension"));
    const std::uint32_t type = c.u32("a tensor type");
    if (type != 0 && type != 1 && type != 8 && type != 30)
      c.fail("tensor " + t.name + " has ggml type " + std::to_string(type) +
             " (we write F32, F16, Q8_0 and BF16)");
    t.type = static_cast<TensorType>(type);
    t.offset = c.u64("a tensor offset");
    if (t.offset % out.alignment != 0)
      c.fail("tensor " + t.name + " is not aligned to " + std::to_string(out.alignment));
    out.tensors.push_back(std::move(t));
  }
  out.data_offset = align_up(c.offset(), out.alignment);
  for (const TensorInfo& t : out.tensors) {
    std::uint64_t size = 0;
    try {
      size = t.bytes();
    } catch (const Error& e) {
      c.fail(e.what());
    }
    if (out.data_offset > bytes.size() || t.offset > bytes.size() - out.data_offset ||
        size > bytes.size() - out.data_offset - t.offset)
      c.fail("tensor " + t.name + "'s data (" + std::to_string(size) + " bytes at " +
             std::to_string(out.data_offset + t.offset) + ") lies beyond the end of the file (" +
             std::to_string(bytes.size()) + " bytes)");
  }
  return out;
}

FileContents read_file(const std::filesystem::path& path) {
  core::MappedFile file(path);
  return read_contents(file.bytes(), path.string());
}

}  // namespace tessera::exporter::gguf
