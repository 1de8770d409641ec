#pragma once
// safetensors: validated, memory-mapped reading (single file or sharded through
// model.safetensors.index.json) and a sharded writer. Format:
//   8-byte little-endian header length N, N bytes of JSON header, then the data buffer.
// Every rule of the format is checked; a bad file raises tessera::Error naming the file
// and the fault, never crashes.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/files.h"

namespace tessera::hf {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

const char* dtype_name(DType dtype);  // "F32", ...
std::optional<DType> dtype_from_name(std::string_view name);
std::size_t dtype_size(DType dtype);  // bytes per element

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // offsets into the data buffer (after the header)
  std::uint64_t end = 0;
  std::uint64_t numel() const;
};

// A tensor's bytes, valid while the file that owns them is alive.
struct TensorView {
  const TensorInfo* info = nullptr;
  std::span<const std::uint8_t> bytes;
};

class SafetensorsFile {
 public:
  // Opens, maps and validates `path`. Throws tessera::Error (InvalidInput) on any fault.
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  TensorView view(const TensorInfo& info) const;
  std::uint64_t file_size() const { return file_.size(); }
  void release_resident_pages() const { file_.release_resident_pages(); }
  void release_resident_pages(const TensorInfo& info) const;
  // Where a tensor's bytes start in the file, for reading them without the mapping.
  std::uint64_t file_offset(const TensorInfo& info) const { return data_begin_ + info.begin; }

 private:
  core::MappedFile file_;
  std::uint64_t data_begin_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder: `model.safetensors`, or the shards named by
// `model.safetensors.index.json` (any `*.safetensors.index.json`). Pickle checkpoints
// (`pytorch_model.bin`, `*.pt`, `*.pth`, `*.ckpt`) are refused with a conversion hint
// and never unpickled.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open(const std::filesystem::path& model_dir_or_file);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws if missing
  TensorView view(const std::string& name) const;         // throws if missing
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  std::uint64_t total_bytes() const;      // sum of tensor byte lengths
  std::uint64_t parameter_count() const;  // sum of numel
  // Every file's MappedFile::release_resident_pages: once the weights are copied out.
  void release_resident_pages() const;
  // Those of one tensor: a loader that copies tensors out one at a time keeps one resident.
  void release_resident_pages(const std::string& name) const;
  // The file holding tensor `name` and where its bytes start in it.
  std::pair<std::filesystem::path, std::uint64_t> location(const std::string& name) const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<std::size_t, const TensorInfo*>> index_;
};

// A tensor to write: its bytes must be dtype_size(dtype) * prod(shape) long.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::span<const std::uint8_t> bytes;
};

// Writes one safetensors file atomically (temporary file, fsync, rename). `written(i)`, when
// given, is called once tensors[i]'s bytes are in the file, so memory-mapped sources can be
// released one by one instead of all staying resident until the end.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::function<void(std::size_t)>& written = {});

// Writes `tensors` into `dir` as HuggingFace does: `model.safetensors` when everything fits
// in `max_shard_bytes`, else `model-0000i-of-0000n.safetensors` shards plus
// `model.safetensors.index.json` (metadata.total_size and weight_map). Returns the files
// written. The index is written last, so a reader never sees an index naming missing shards.
std::vector<std::filesystem::path> write_safetensors_sharded(
    const std::filesystem::path& dir, const std::vector<TensorToWrite>& tensors,
    std::uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {},
    const std::string& base_name = "model");

// Writes the files write_safetensors_sharded would (byte for byte) when the tensors' bytes
// arrive one at a time and in any order, so a model need never be in memory at once: the layout
// is fixed up front from `tensors`' names, dtypes and shapes (their bytes are ignored); write()
// puts a tensor's bytes straight at their place in its shard's temporary file; finish() checks
// that every tensor came, fsyncs and renames the shards and writes the index last. Without
// finish(), the temporaries are removed. For a folder of its own (stale shards are not swept).
class StreamingSafetensorsWriter {
 public:
  StreamingSafetensorsWriter(const std::filesystem::path& dir, std::vector<TensorToWrite> tensors,
                             std::uint64_t max_shard_bytes,
                             const std::map<std::string, std::string>& metadata = {},
                             const std::string& base_name = "model");
  ~StreamingSafetensorsWriter();
  StreamingSafetensorsWriter(const StreamingSafetensorsWriter&) = delete;
  StreamingSafetensorsWriter& operator=(const StreamingSafetensorsWriter&) = delete;

  void write(const std::string& name, std::span<const std::uint8_t> bytes);
  std::vector<std::filesystem::path> finish();  // the files written, the index last

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Throws the "pickle is refused" error for `path`, explaining how to convert.
[[noreturn]] void refuse_pickle_checkpoint(const std::filesystem::path& path);

}  // namespace tessera::hf
