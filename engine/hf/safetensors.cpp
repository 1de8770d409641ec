#include "hf/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string_view>

#include "core/error.h"

namespace tessera::hf {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Same bound as the reference (Rust) implementation: a header larger than this is a
// corrupt or hostile file, not a model.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// Deeper nesting than this has no meaning in a header or an index; refusing it early keeps
// the parser's memory bounded.
constexpr int kMaxJsonDepth = 64;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kIndexSuffix = ".safetensors.index.json";
constexpr const char* kSafetensorsSuffix = ".safetensors";

struct DTypeEntry {
  DType dtype;
  const char* name;
  std::size_t size;
};
constexpr std::array<DTypeEntry, 10> kDTypes{{
    {DType::F64, "F64", 8},
    {DType::F32, "F32", 4},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::I64, "I64", 8},
    {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
}};

// Dtypes the format defines that Tessera does not handle (yet): a valid file, so they are
// reported as unsupported rather than corrupt.
constexpr std::array<std::string_view, 10> kOtherFormatDTypes{
    "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};

std::string supported_dtype_list() {
  std::string out;
  for (const auto& e : kDTypes) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Messages may quote bytes from a hostile file; keep them printable ASCII so that the
// event stream (JSON) and terminals can always carry them.
std::string printable(std::string_view s, std::size_t max_len = 200) {
  std::string out;
  for (char c : s.substr(0, max_len)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (s.size() > max_len) out += "...";
  return out;
}

std::string quote_name(std::string_view s) {
  std::string out(1, '\'');
  out += printable(s);
  out.push_back('\'');
  return out;
}

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

// Product of the dims times the element size, or nullopt when it does not fit in 64 bits.
std::optional<std::uint64_t> byte_length(DType dtype, const std::vector<std::int64_t>& shape) {
  std::uint64_t n = dtype_size(dtype);
  for (std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (!checked_mul(n, static_cast<std::uint64_t>(d), n)) return std::nullopt;
  }
  return n;
}

std::string shape_text(const std::vector<std::int64_t>& shape, const char* separator = ", ") {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += separator;
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Parses JSON text and refuses duplicate keys at any level (nlohmann would silently keep the
// last one, so a file could show one tensor to us and another to a different reader).
// `what` names the document in messages ("<file>: header").
json parse_json_strict(std::string_view text, const std::string& what, const std::string& hint) {
  std::vector<std::set<std::string>> keys_per_object;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    if (depth > kMaxJsonDepth) {
      throw_invalid(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels",
                    hint);
    }
    switch (event) {
      case json::parse_event_t::object_start:
        keys_per_object.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys_per_object.empty()) keys_per_object.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_per_object.empty() && parsed.is_string() &&
            !keys_per_object.back().insert(parsed.get<std::string>()).second) {
          throw_invalid(what + ": duplicate key " + quote_name(parsed.get<std::string>()) +
                            " (a name may appear only once)",
                        hint);
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    throw_invalid(what + ": not valid UTF-8 JSON: " + printable(e.what()), hint);
  }
}

const char* kCorruptHint =
    "the file is damaged or not a safetensors file; download or export it again";

std::uint64_t read_le_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::uint64_t json_offset(const json& value, const std::string& where) {
  if (!value.is_number_unsigned()) {
    throw_invalid(where + " must be a non-negative integer, got " + printable(value.dump()),
                  kCorruptHint);
  }
  return value.get<std::uint64_t>();
}

TensorInfo parse_tensor_entry(const std::string& file, const std::string& name, const json& entry) {
  const std::string where = file + ": tensor " + quote_name(name);
  if (!entry.is_object()) {
    throw_invalid(where + ": entry must be an object with dtype, shape and data_offsets",
                  kCorruptHint);
  }
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) throw_invalid(where + ": missing \"dtype\"", kCorruptHint);
  if (!dtype_it->is_string()) throw_invalid(where + ": \"dtype\" must be a string", kCorruptHint);
  const auto& dtype_text = dtype_it->get_ref<const std::string&>();
  auto dtype = dtype_from_name(dtype_text);
  if (!dtype) {
    bool known_to_format = std::find(kOtherFormatDTypes.begin(), kOtherFormatDTypes.end(),
                                     dtype_text) != kOtherFormatDTypes.end();
    if (known_to_format) {
      throw_unsupported(where + ": dtype " + quote_name(dtype_text) +
                            " is not supported (supported: " + supported_dtype_list() + ")",
                        "convert the checkpoint to a supported dtype, e.g. F32 or BF16");
    }
    throw_invalid(where + ": unknown dtype " + quote_name(dtype_text) +
                      " (known: " + supported_dtype_list() + ")",
                  kCorruptHint);
  }
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) throw_invalid(where + ": missing \"shape\"", kCorruptHint);
  if (!shape_it->is_array()) throw_invalid(where + ": \"shape\" must be an array", kCorruptHint);
  for (std::size_t i = 0; i < shape_it->size(); ++i) {
    std::uint64_t dim = json_offset((*shape_it)[i], where + ": shape[" + std::to_string(i) + "]");
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw_invalid(
          where + ": shape[" + std::to_string(i) + "] = " + std::to_string(dim) + " is too large",
          kCorruptHint);
    }
    info.shape.push_back(static_cast<std::int64_t>(dim));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) throw_invalid(where + ": missing \"data_offsets\"", kCorruptHint);
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    throw_invalid(where + ": \"data_offsets\" must be an array [begin, end]", kCorruptHint);
  }
  info.begin = json_offset((*offsets_it)[0], where + ": data_offsets[0]");
  info.end = json_offset((*offsets_it)[1], where + ": data_offsets[1]");
  if (info.begin > info.end) {
    throw_invalid(where + ": data_offsets begin " + std::to_string(info.begin) + " > end " +
                      std::to_string(info.end),
                  kCorruptHint);
  }
  auto expected = byte_length(info.dtype, info.shape);
  if (!expected) {
    throw_invalid(where + ": shape " + shape_text(info.shape) + " of " + dtype_text +
                      " overflows 64-bit byte size",
                  kCorruptHint);
  }
  if (*expected != info.end - info.begin) {
    throw_invalid(where + ": dtype " + dtype_text + " x shape " + shape_text(info.shape) +
                      " needs " + std::to_string(*expected) + " bytes but data_offsets [" +
                      std::to_string(info.begin) + ", " + std::to_string(info.end) + "] span " +
                      std::to_string(info.end - info.begin),
                  kCorruptHint);
  }
  return info;
}

// A name beside `path` for the temporary file it is written through, unique to this process
// and this call.
fs::path temporary_path(const fs::path& path) {
  std::random_device rd;
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  return tmp;
}

// The index of a sharded save: every tensor's shard, and the totals transformers writes.
void write_shard_index(const fs::path& index_path, const json& weight_map, std::uint64_t parameters,
                       std::uint64_t total_bytes) {
  json index = {{"metadata", {{"total_parameters", parameters}, {"total_size", total_bytes}}},
                {"weight_map", weight_map}};
  core::write_file_atomic(index_path, index.dump(2) + "\n");
}

// Writes a file atomically from several buffers without joining them in memory; calls
// `after_part(i)` once part i is written (so a caller can release its memory).
void write_buffers_atomic(const fs::path& path,
                          const std::vector<std::span<const std::uint8_t>>& parts,
                          const std::function<void(std::size_t)>& after_part = {}) {
  const fs::path tmp = temporary_path(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw_io(path.string() + ": cannot create temporary file: " + std::strerror(errno),
             "check that the folder exists and is writable");
  }
  auto fail = [&](const std::string& what) {
    std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw_io(path.string() + ": " + what + ": " + why,
             "check free disk space; the previous file (if any) is untouched");
  };
  for (std::size_t index = 0; index < parts.size(); ++index) {
    const std::span<const std::uint8_t> part = parts[index];
    const std::uint8_t* p = part.data();
    std::size_t left = part.size();
    while (left > 0) {
      // Bounded chunks: some kernels refuse single writes above ~2 GiB.
      ssize_t n = ::write(fd, p, std::min<std::size_t>(left, std::size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("write failed");
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    if (after_part) after_part(index);
  }
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw_io(path.string() + ": close failed: " + why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw_io(path.string() + ": rename failed: " + why);
  }
  core::fsync_directory(path.parent_path());
}

struct PreparedTensor {
  const TensorToWrite* tensor;
  std::uint64_t begin;
  std::uint64_t end;
};

void check_tensors_to_write(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                            bool check_bytes = true) {
  std::set<std::string_view> seen;
  for (const auto& t : tensors) {
    const std::string where = path.string() + ": tensor " + quote_name(t.name);
    if (t.name == kMetadataKey) throw_invalid(where + ": the name is reserved by the format");
    if (!seen.insert(t.name).second) throw_invalid(where + ": written twice");
    auto expected = byte_length(t.dtype, t.shape);
    if (!expected) {
      throw_invalid(where + ": shape " + shape_text(t.shape) +
                    " has a negative dim or overflows 64-bit byte size");
    }
    if (check_bytes && *expected != t.bytes.size()) {
      throw_invalid(where + ": " + dtype_name(t.dtype) + " x " + shape_text(t.shape) + " needs " +
                    std::to_string(*expected) + " bytes, got " + std::to_string(t.bytes.size()));
    }
  }
}

std::string json_string(const std::string& s, const std::string& where) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    throw_invalid(where + ": " + quote_name(s) + " is not valid UTF-8");
  }
}

std::string shard_name(const std::string& base, std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu", i, n);
  return base + buf + kSafetensorsSuffix;
}

bool is_pickle_name(const std::string& filename) {
  for (const char* ext : {".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"}) {
    if (ends_with(filename, ext)) return true;
  }
  return ends_with(filename, ".bin.index.json");
}

// PyTorch's zip container ("PK\3\4") or a bare pickle stream (PROTO opcode 0x80).
bool looks_like_pickle(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  unsigned char head[4] = {0, 0, 0, 0};
  ssize_t n = ::read(fd, head, sizeof head);
  ::close(fd);
  if (n >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) return true;
  return n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5;
}

bool is_within(const fs::path& inner, const fs::path& root) {
  // Both paths are canonical: compare whole components, so /a/bc is not inside /a/b.
  auto [root_end, _] = std::mismatch(root.begin(), root.end(), inner.begin(), inner.end());
  return root_end == root.end();
}

// Resolves a weight_map entry to a file inside `dir`, refusing anything that could read
// outside the model folder. In the HuggingFace cache layout
// (<repo>/snapshots/<revision>/file -> ../../blobs/<hash>) the snapshot's files are symlinks
// into <repo>/blobs, which is allowed too.
fs::path resolve_shard(const fs::path& dir, const std::string& shard, const fs::path& index_path) {
  const std::string where = index_path.string() + ": weight_map names shard " + quote_name(shard);
  const char* hint = "an index may only name files inside its own folder; fix or regenerate it";
  fs::path rel(shard);
  if (shard.empty() || rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    throw_invalid(where + ", which is not a relative path inside the model folder", hint);
  }
  for (const auto& part : rel) {
    if (part == "..") throw_invalid(where + ", which uses '..' to leave the model folder", hint);
  }
  fs::path candidate = dir / rel;
  std::error_code ec;
  if (!fs::exists(candidate, ec)) {
    throw_invalid(where + ", but " + candidate.string() + " does not exist",
                  "download the missing shard, or regenerate the index");
  }
  fs::path real = fs::canonical(candidate, ec);
  if (ec) throw_io(candidate.string() + ": cannot resolve: " + ec.message());
  fs::path real_dir = fs::canonical(dir, ec);
  if (ec) throw_io(dir.string() + ": cannot resolve: " + ec.message());
  bool inside = is_within(real, real_dir);
  if (!inside && real_dir.parent_path().filename() == "snapshots") {
    fs::path blobs = fs::canonical(real_dir.parent_path().parent_path() / "blobs", ec);
    inside = !ec && is_within(real, blobs);
  }
  if (!inside) {
    throw_invalid(where + ", which resolves (through a symlink) to " + real.string() +
                      ", outside the model folder " + real_dir.string(),
                  hint);
  }
  return candidate;
}

std::vector<fs::path> list_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) out.push_back(it->path());
  }
  if (ec) throw_io(dir.string() + ": cannot list folder: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::string names_of(const std::vector<fs::path>& files) {
  std::string out;
  for (const auto& f : files) {
    if (!out.empty()) out += ", ";
    out += f.filename().string();
  }
  return out;
}

}  // namespace

// ---- dtypes -------------------------------------------------------------------------------

const char* dtype_name(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return std::nullopt;
}

std::size_t dtype_size(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

std::uint64_t TensorInfo::numel() const {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || !checked_mul(n, static_cast<std::uint64_t>(d), n)) {
      return std::numeric_limits<std::uint64_t>::max();  // unreachable for a validated file
    }
  }
  return n;
}

// ---- SafetensorsFile ----------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  auto file = std::make_shared<SafetensorsFile>();
  file->file_ = core::MappedFile(path);
  const std::string name = path.string();
  const std::uint64_t size = file->file_.size();
  const std::uint8_t* data = file->file_.data();

  if (size < 8) {
    throw_invalid(name + ": file is " + std::to_string(size) +
                      " bytes, too short for the 8-byte header length of a safetensors file",
                  kCorruptHint);
  }
  const std::uint64_t header_len = read_le_u64(data);
  if (header_len > kMaxHeaderBytes) {
    throw_invalid(name + ": header length " + std::to_string(header_len) +
                      " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes",
                  kCorruptHint);
  }
  if (header_len > size - 8) {
    throw_invalid(name + ": header length " + std::to_string(header_len) +
                      " runs past the end of the file (" + std::to_string(size) +
                      " bytes); the file is truncated or corrupt",
                  kCorruptHint);
  }
  if (header_len == 0 || data[8] != '{') {
    throw_invalid(name + ": header is not a JSON object (it must start with '{')", kCorruptHint);
  }
  std::string_view header_text(reinterpret_cast<const char*>(data + 8), header_len);
  json header = parse_json_strict(header_text, name + ": header", kCorruptHint);
  if (!header.is_object()) throw_invalid(name + ": header is not a JSON object", kCorruptHint);

  file->data_begin_ = 8 + header_len;
  const std::uint64_t buffer_size = size - file->data_begin_;

  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        throw_invalid(name + ": __metadata__ must be an object of strings", kCorruptHint);
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          throw_invalid(name + ": __metadata__ value of " + quote_name(mkey) + " must be a string",
                        kCorruptHint);
        }
        file->metadata_[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    file->tensors_.push_back(parse_tensor_entry(name, key, value));
  }

  // The data buffer must be exactly tiled by the tensors: sorted by offset, each starts
  // where the previous ended, the first at 0 and the last at the end of the file.
  std::stable_sort(file->tensors_.begin(), file->tensors_.end(),
                   [](const TensorInfo& a, const TensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  std::uint64_t cursor = 0;
  const TensorInfo* previous = nullptr;
  for (const auto& t : file->tensors_) {
    const std::string where = name + ": tensor " + quote_name(t.name);
    if (t.end > buffer_size) {
      throw_invalid(where + ": data_offsets [" + std::to_string(t.begin) + ", " +
                        std::to_string(t.end) + "] run past the data buffer (" +
                        std::to_string(buffer_size) + " bytes); the file is truncated or corrupt",
                    kCorruptHint);
    }
    if (t.begin < cursor) {
      throw_invalid(where + ": data_offsets [" + std::to_string(t.begin) + ", " +
                        std::to_string(t.end) + "] overlap tensor " + quote_name(previous->name) +
                        " (which ends at " + std::to_string(cursor) + ")",
                    kCorruptHint);
    }
    if (t.begin > cursor) {
      throw_invalid(where + ": gap in the data buffer: bytes [" + std::to_string(cursor) + ", " +
                        std::to_string(t.begin) + ") belong to no tensor",
                    kCorruptHint);
    }
    cursor = t.end;
    previous = &t;
  }
  if (cursor != buffer_size) {
    throw_invalid(name + ": " + std::to_string(buffer_size - cursor) +
                      " trailing bytes after the last tensor (data buffer is " +
                      std::to_string(buffer_size) + " bytes, tensors cover " +
                      std::to_string(cursor) + ")",
                  kCorruptHint);
  }
  for (std::size_t i = 0; i < file->tensors_.size(); ++i) {
    file->by_name_.emplace(file->tensors_[i].name, i);
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  // Offsets were validated against the mapping in open(); recheck cheaply in case the caller
  // passes a TensorInfo of another file.
  const std::uint64_t buffer_size = file_.size() - data_begin_;
  if (info.begin > info.end || info.end > buffer_size) {
    throw Error(ErrorKind::Internal, path().string() + ": tensor " + quote_name(info.name) +
                                         " does not belong to this file");
  }
  return TensorView{&info, {file_.data() + data_begin_ + info.begin, info.end - info.begin}};
}

// ---- SafetensorsCheckpoint ----------------------------------------------------------------

void refuse_pickle_checkpoint(const fs::path& path) {
  throw Error(ErrorKind::InvalidInput,
              path.string() +
                  ": this is a pickle checkpoint (PyTorch .bin/.pt/.pth/.ckpt); loading pickle can "
                  "execute arbitrary code, so Tessera never unpickles it. Convert it to "
                  "safetensors first.",
              "in Python: AutoModel.from_pretrained(dir).save_pretrained(dir, "
              "safe_serialization=True), or for a bare state dict: "
              "safetensors.torch.save_file(torch.load(f, weights_only=True), "
              "\"model.safetensors\")");
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const fs::path& model_dir_or_file) {
  const fs::path& input = model_dir_or_file;
  std::error_code ec;
  auto status = fs::status(input, ec);
  if (ec || !fs::exists(status)) {
    throw_invalid(input.string() + ": no such file or folder",
                  "pass a model folder or a .safetensors file");
  }

  SafetensorsCheckpoint ckpt;
  fs::path index_path;
  std::vector<fs::path> single_files;

  if (fs::is_directory(status)) {
    auto files = list_files(input);
    auto with_suffix = [&](std::string_view suffix) {
      std::vector<fs::path> out;
      for (const auto& f : files) {
        if (ends_with(f.filename().string(), suffix)) out.push_back(f);
      }
      return out;
    };
    auto indexes = with_suffix(kIndexSuffix);
    auto weights = with_suffix(kSafetensorsSuffix);
    if (fs::exists(input / "model.safetensors.index.json")) {
      index_path = input / "model.safetensors.index.json";
    } else if (indexes.size() == 1) {
      index_path = indexes.front();
    } else if (indexes.size() > 1) {
      throw_invalid(input.string() + ": several safetensors indexes (" + names_of(indexes) +
                        ") and no model.safetensors.index.json",
                    "pass the index file you mean instead of the folder");
    } else if (fs::exists(input / "model.safetensors")) {
      single_files.push_back(input / "model.safetensors");
    } else if (weights.size() == 1) {
      single_files.push_back(weights.front());
    } else if (weights.size() > 1) {
      throw_invalid(input.string() + ": several .safetensors files (" + names_of(weights) +
                        ") but no model.safetensors.index.json saying which tensors each holds",
                    "pass the file you mean instead of the folder");
    } else {
      for (const auto& f : files) {
        if (is_pickle_name(f.filename().string())) refuse_pickle_checkpoint(f);
      }
      throw_invalid(input.string() +
                        ": no weights found: looked for model.safetensors.index.json, "
                        "*.safetensors.index.json, model.safetensors and *.safetensors (and "
                        "pickle checkpoints pytorch_model.bin, *.bin, *.pt, *.pth, *.ckpt, which "
                        "would be refused)",
                    "pass the folder that holds the model's weights");
    }
  } else {
    const std::string filename = input.filename().string();
    if (ends_with(filename, kIndexSuffix)) {
      index_path = input;
    } else if (is_pickle_name(filename) ||
               (!ends_with(filename, kSafetensorsSuffix) && looks_like_pickle(input))) {
      refuse_pickle_checkpoint(input);
    } else {
      single_files.push_back(input);
    }
  }

  std::vector<fs::path> shards;                   // in order of first mention
  std::map<std::string, std::size_t> shard_slot;  // shard name in the index -> shards[i]
  std::map<std::string, std::string> weight_map;  // tensor -> shard name in the index
  if (!index_path.empty()) {
    const std::string where = index_path.string();
    const char* hint = "the index is damaged; download or export the model again";
    std::error_code size_ec;
    const auto index_size = fs::file_size(index_path, size_ec);
    if (!size_ec && index_size > kMaxHeaderBytes) {
      throw_invalid(where + ": index is " + std::to_string(index_size) + " bytes, above the " +
                        std::to_string(kMaxHeaderBytes) + "-byte limit for an index",
                    hint);
    }
    json index = parse_json_strict(core::read_text_file(index_path), where, hint);
    if (!index.is_object()) throw_invalid(where + ": not a JSON object", hint);
    auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) {
      throw_invalid(where + ": missing \"weight_map\" object (tensor name -> shard file)", hint);
    }
    const fs::path dir =
        index_path.parent_path().empty() ? fs::path(".") : index_path.parent_path();
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string()) {
        throw_invalid(where + ": weight_map entry " + quote_name(tensor) +
                          " must name a shard file (a string)",
                      hint);
      }
      const auto& shard_name_text = shard.get_ref<const std::string&>();
      if (!shard_slot.count(shard_name_text)) {
        shard_slot[shard_name_text] = shards.size();
        shards.push_back(resolve_shard(dir, shard_name_text, index_path));
      }
      weight_map[tensor] = shard_name_text;
    }
    if (shards.empty()) throw_invalid(where + ": weight_map is empty", hint);
  }

  for (const auto& f : single_files) ckpt.files_.push_back(SafetensorsFile::open(f));
  for (const auto& path : shards) ckpt.files_.push_back(SafetensorsFile::open(path));

  for (std::size_t i = 0; i < ckpt.files_.size(); ++i) {
    for (const auto& t : ckpt.files_[i]->tensors()) {
      auto [it, inserted] = ckpt.index_.emplace(t.name, std::make_pair(i, &t));
      if (!inserted) {
        throw_invalid((index_path.empty() ? input : index_path).string() + ": tensor " +
                          quote_name(t.name) + " is stored in both " +
                          ckpt.files_[it->second.first]->path().string() + " and " +
                          ckpt.files_[i]->path().string(),
                      "the shards do not belong together; download or export the model again");
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    auto it = ckpt.index_.find(tensor);
    const std::size_t shard_file = single_files.size() + shard_slot.at(shard);
    if (it == ckpt.index_.end() || it->second.first != shard_file) {
      throw_invalid(index_path.string() + ": weight_map puts tensor " + quote_name(tensor) +
                        " in " + quote_name(shard) + ", but that shard does not hold it",
                    "the index and the shards do not match; download or export the model again");
    }
  }
  return ckpt;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, _] : index_) out.push_back(name);
  return out;
}

bool SafetensorsCheckpoint::contains(const std::string& name) const {
  return index_.count(name) != 0;
}

const TensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    std::string where =
        files_.empty() ? std::string("checkpoint") : files_.front()->path().string();
    throw_invalid(where + ": no tensor named " + quote_name(name) + " in the checkpoint");
  }
  return *it->second.second;
}

TensorView SafetensorsCheckpoint::view(const std::string& name) const {
  const TensorInfo& t = info(name);
  return files_[index_.at(name).first]->view(t);
}

std::uint64_t SafetensorsCheckpoint::total_bytes() const {
  std::uint64_t total = 0;
  for (const auto& [_, entry] : index_) total += entry.second->end - entry.second->begin;
  return total;
}

std::uint64_t SafetensorsCheckpoint::parameter_count() const {
  std::uint64_t total = 0;
  for (const auto& [_, entry] : index_) total += entry.second->numel();
  return total;
}

void SafetensorsCheckpoint::release_resident_pages() const {
  for (const auto& file : files_) file->release_resident_pages();
}

void SafetensorsCheckpoint::release_resident_pages(const std::string& name) const {
  files_[index_.at(name).first]->release_resident_pages(info(name));
}

std::pair<std::filesystem::path, std::uint64_t> SafetensorsCheckpoint::location(
    const std::string& name) const {
  const SafetensorsFile& file = *files_[index_.at(name).first];
  return {file.path(), file.file_offset(info(name))};
}

void SafetensorsFile::release_resident_pages(const TensorInfo& info) const {
  const TensorView v = view(info);
  file_.release_resident_pages(v.bytes.data(), v.bytes.size());
}

// ---- writer -------------------------------------------------------------------------------

namespace {

// A file's layout as the reference writer makes it: the 8-byte length, the header, then the
// tensors in `order`, tensor order[i] at data offset offsets[i].
struct FileLayout {
  std::array<std::uint8_t, 8> length_bytes{};
  std::string header;
  std::vector<std::size_t> order;      // indices into the tensors, in file order
  std::vector<std::uint64_t> offsets;  // by tensor index, from the start of the data buffer
};

FileLayout lay_out_file(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        bool check_bytes = true) {
  check_tensors_to_write(path, tensors, check_bytes);
  // Larger elements first, then by name, in the reference writer's order (so our files are
  // byte-identical to Python's save_file): with the data buffer 8-aligned, every tensor then
  // starts aligned to its element size.
  auto rank = [](DType d) {
    constexpr DType kWriteOrder[] = {DType::I64, DType::F64, DType::F32, DType::I32, DType::BF16,
                                     DType::F16, DType::I16, DType::I8,  DType::U8,  DType::BOOL};
    return std::find(std::begin(kWriteOrder), std::end(kWriteOrder), d) - std::begin(kWriteOrder);
  };
  FileLayout layout;
  for (std::size_t i = 0; i < tensors.size(); ++i) layout.order.push_back(i);
  std::sort(layout.order.begin(), layout.order.end(), [&](std::size_t a, std::size_t b) {
    if (rank(tensors[a].dtype) != rank(tensors[b].dtype))
      return rank(tensors[a].dtype) < rank(tensors[b].dtype);
    return tensors[a].name < tensors[b].name;
  });

  const std::string where = path.string();
  std::string& header = layout.header;
  header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ",";
      first = false;
      header += json_string(k, where + ": metadata key") + ":" +
                json_string(v, where + ": metadata value");
    }
    header += "}";
  }
  layout.offsets.assign(tensors.size(), 0);
  std::uint64_t offset = 0;
  for (std::size_t i : layout.order) {
    const TensorToWrite& t = tensors[i];
    if (header.size() > 1) header += ",";
    const std::uint64_t end = offset + *byte_length(t.dtype, t.shape);
    header += json_string(t.name, where + ": tensor name") + ":{\"dtype\":\"" +
              dtype_name(t.dtype) + "\",\"shape\":" + shape_text(t.shape, ",") +
              ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    layout.offsets[i] = offset;
    offset = end;
  }
  header += "}";
  // Spaces (valid JSON whitespace) pad the header so the data buffer starts 8-aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxHeaderBytes) {
    throw_invalid(where + ": header would be " + std::to_string(header.size()) +
                  " bytes, above the format's limit of " + std::to_string(kMaxHeaderBytes) +
                  "; write fewer tensors per file");
  }
  for (int i = 0; i < 8; ++i) {
    layout.length_bytes[static_cast<std::size_t>(i)] =
        static_cast<std::uint8_t>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  }
  return layout;
}

// Tensors grouped into shards greedily in the caller's order, as HuggingFace does: a tensor
// that does not fit in the current shard starts a new one; one larger than the limit gets a
// shard of its own.
std::vector<std::vector<std::size_t>> group_into_shards(const std::vector<TensorToWrite>& tensors,
                                                        std::uint64_t max_shard_bytes) {
  std::vector<std::vector<std::size_t>> groups;
  std::uint64_t current = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t n = *byte_length(tensors[i].dtype, tensors[i].shape);
    const bool fits = current <= max_shard_bytes && n <= max_shard_bytes - current;
    if (groups.empty() || (current > 0 && !fits)) {
      groups.emplace_back();
      current = 0;
    }
    groups.back().push_back(i);
    current += n;
  }
  if (groups.empty()) groups.emplace_back();
  return groups;
}

}  // namespace

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(std::size_t)>& written) {
  const FileLayout layout = lay_out_file(path, tensors, metadata);
  std::vector<std::span<const std::uint8_t>> parts;
  parts.reserve(tensors.size() + 2);
  parts.emplace_back(layout.length_bytes.data(), layout.length_bytes.size());
  parts.emplace_back(reinterpret_cast<const std::uint8_t*>(layout.header.data()),
                     layout.header.size());
  for (std::size_t i : layout.order) parts.push_back(tensors[i].bytes);
  write_buffers_atomic(path, parts, [&](std::size_t part) {
    // Parts 0 and 1 are the length and the header.
    if (part >= 2 && written) written(layout.order[part - 2]);
  });
}

std::vector<fs::path> write_safetensors_sharded(const fs::path& dir,
                                                const std::vector<TensorToWrite>& tensors,
                                                std::uint64_t max_shard_bytes,
                                                const std::map<std::string, std::string>& metadata,
                                                const std::string& base_name) {
  if (max_shard_bytes == 0) throw_invalid(dir.string() + ": maximum shard size must be > 0");
  if (base_name.empty() || base_name.find('/') != std::string::npos) {
    throw_invalid(dir.string() + ": invalid checkpoint base name " + quote_name(base_name));
  }
  check_tensors_to_write(dir / (base_name + kSafetensorsSuffix), tensors);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_io(dir.string() + ": cannot create folder: " + ec.message());

  std::vector<std::vector<TensorToWrite>> groups;
  std::uint64_t total = 0;
  std::uint64_t parameters = 0;
  for (const auto& shard : group_into_shards(tensors, max_shard_bytes)) {
    groups.emplace_back();
    for (std::size_t i : shard) {
      groups.back().push_back(tensors[i]);
      total += tensors[i].bytes.size();
      parameters += tensors[i].bytes.size() / dtype_size(tensors[i].dtype);
    }
  }

  const fs::path single = dir / (base_name + kSafetensorsSuffix);
  const fs::path index_path = dir / (base_name + kIndexSuffix);
  // Removes shards of an earlier save that this one did not write, so a reader never mixes
  // two saves.
  auto remove_stale = [&](const std::set<fs::path>& keep) {
    const std::string prefix = base_name + "-";
    for (const auto& f : list_files(dir)) {
      const std::string fname = f.filename().string();
      if (fname.rfind(prefix, 0) == 0 && ends_with(fname, kSafetensorsSuffix) &&
          fname.find("-of-") != std::string::npos && !keep.count(f)) {
        fs::remove(f, ec);
      }
    }
  };

  if (groups.size() == 1) {
    write_safetensors(single, groups.front(), metadata);
    fs::remove(index_path, ec);
    remove_stale({});
    return {single};
  }

  std::vector<fs::path> written;
  json weight_map = json::object();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string fname = shard_name(base_name, i + 1, groups.size());
    write_safetensors(dir / fname, groups[i], metadata);
    for (const auto& t : groups[i]) weight_map[t.name] = fname;
    written.push_back(dir / fname);
  }
  write_shard_index(index_path, weight_map, parameters, total);
  written.push_back(index_path);
  fs::remove(single, ec);
  remove_stale(std::set<fs::path>(written.begin(), written.end()));
  return written;
}

namespace {

void write_at(int fd, const fs::path& path, std::uint64_t offset,
              std::span<const std::uint8_t> bytes) {
  const std::uint8_t* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    // Bounded chunks: some kernels refuse single writes above ~2 GiB.
    const ssize_t n = ::pwrite(fd, p, std::min<std::size_t>(left, std::size_t{1} << 30),
                               static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(path.string() + ": write failed: " + std::strerror(errno),
               "check free disk space; the previous file (if any) is untouched");
    }
    p += n;
    offset += static_cast<std::uint64_t>(n);
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace

struct StreamingSafetensorsWriter::State {
  struct Shard {
    fs::path path;
    fs::path tmp;
    int fd = -1;
    std::uint64_t data_start = 0;  // file offset of the data buffer
    std::vector<TensorToWrite> tensors;
    FileLayout layout;
  };
  struct Slot {
    std::size_t shard = 0;
    std::size_t index = 0;  // in the shard's tensors
    bool written = false;
  };
  // Until finish() renamed them, the temporaries go with the writer (or a constructor that
  // failed half-way).
  ~State() {
    if (finished) return;
    for (Shard& shard : shards) {
      if (shard.fd >= 0) ::close(shard.fd);
      ::unlink(shard.tmp.c_str());
    }
  }
  fs::path dir;
  std::string base_name;
  std::vector<Shard> shards;
  std::map<std::string, Slot> slot;  // by tensor name
  std::uint64_t total = 0;
  std::uint64_t parameters = 0;
  bool finished = false;
};

StreamingSafetensorsWriter::StreamingSafetensorsWriter(
    const fs::path& dir, std::vector<TensorToWrite> tensors, std::uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata, const std::string& base_name)
    : state_(std::make_unique<State>()) {
  if (max_shard_bytes == 0) throw_invalid(dir.string() + ": maximum shard size must be > 0");
  check_tensors_to_write(dir / (base_name + kSafetensorsSuffix), tensors, /*check_bytes=*/false);
  State& st = *state_;
  st.dir = dir;
  st.base_name = base_name;
  const auto groups = group_into_shards(tensors, max_shard_bytes);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    State::Shard shard;
    shard.path = dir / (groups.size() == 1 ? base_name + kSafetensorsSuffix
                                           : shard_name(base_name, g + 1, groups.size()));
    for (std::size_t i : groups[g]) {
      st.slot[tensors[i].name] = {g, shard.tensors.size(), false};
      const std::uint64_t n = *byte_length(tensors[i].dtype, tensors[i].shape);
      st.total += n;
      st.parameters += n / dtype_size(tensors[i].dtype);
      shard.tensors.push_back(tensors[i]);
    }
    shard.layout = lay_out_file(shard.path, shard.tensors, metadata, /*check_bytes=*/false);
    shard.data_start = 8 + shard.layout.header.size();
    shard.tmp = temporary_path(shard.path);
    st.shards.push_back(std::move(shard));
  }
  for (State::Shard& shard : st.shards) {
    shard.fd = ::open(shard.tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (shard.fd < 0)
      throw_io(shard.path.string() + ": cannot create temporary file: " + std::strerror(errno),
               "check that the folder exists and is writable");
    write_at(shard.fd, shard.path, 0,
             {shard.layout.length_bytes.data(), shard.layout.length_bytes.size()});
    write_at(shard.fd, shard.path, 8,
             {reinterpret_cast<const std::uint8_t*>(shard.layout.header.data()),
              shard.layout.header.size()});
  }
}

StreamingSafetensorsWriter::~StreamingSafetensorsWriter() = default;

void StreamingSafetensorsWriter::write(const std::string& name,
                                       std::span<const std::uint8_t> bytes) {
  State& st = *state_;
  auto it = st.slot.find(name);
  if (it == st.slot.end())
    throw_invalid(st.dir.string() + ": tensor " + quote_name(name) + " is not in the layout");
  State::Slot& slot = it->second;
  const State::Shard& shard = st.shards[slot.shard];
  const TensorToWrite& t = shard.tensors[slot.index];
  const std::uint64_t expected = *byte_length(t.dtype, t.shape);
  if (bytes.size() != expected)
    throw_invalid(shard.path.string() + ": tensor " + quote_name(name) + ": " +
                  dtype_name(t.dtype) + " x " + shape_text(t.shape) + " needs " +
                  std::to_string(expected) + " bytes, got " + std::to_string(bytes.size()));
  write_at(shard.fd, shard.path, shard.data_start + shard.layout.offsets[slot.index], bytes);
  slot.written = true;
}

std::vector<fs::path> StreamingSafetensorsWriter::finish() {
  State& st = *state_;
  for (const auto& [name, slot] : st.slot)
    if (!slot.written)
      throw_invalid(st.shards[slot.shard].path.string() + ": tensor " + quote_name(name) +
                    " was never written");
  std::vector<fs::path> out;
  json weight_map = json::object();
  for (State::Shard& shard : st.shards) {
    if (::fsync(shard.fd) != 0 || ::close(shard.fd) != 0) {
      const std::string why = std::strerror(errno);
      throw_io(shard.path.string() + ": fsync failed: " + why, "check free disk space");
    }
    shard.fd = -1;
    if (::rename(shard.tmp.c_str(), shard.path.c_str()) != 0)
      throw_io(shard.path.string() + ": rename failed: " + std::strerror(errno));
    for (const auto& t : shard.tensors) weight_map[t.name] = shard.path.filename().string();
    out.push_back(shard.path);
  }
  core::fsync_directory(st.dir);
  if (st.shards.size() > 1) {
    // The index last, so a reader never sees an index naming missing shards.
    const fs::path index_path = st.dir / (st.base_name + kIndexSuffix);
    write_shard_index(index_path, weight_map, st.parameters, st.total);
    out.push_back(index_path);
  }
  st.finished = true;
  return out;
}

}  // namespace tessera::hf
