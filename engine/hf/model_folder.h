#pragma once
// A HuggingFace model folder read once for a whole run: config.json parsed, and the safetensors
// checkpoint (index and headers read, files mapped; a tensor's bytes are read only when it is
// used). The runner opens it once and hands it to each stage (plan, load, merge), so no stage
// reads config.json or opens the checkpoint again.
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>

#include "hf/config.h"
#include "hf/safetensors.h"

namespace tessera::hf {

class ModelFolder {
 public:
  // Parses `dir`/config.json (its errors are thrown now) and opens the checkpoint. A folder
  // without usable weights still opens — the planner works from config.json alone — and
  // weights() throws the checkpoint's error when a stage needs them.
  static ModelFolder open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  bool has_weights() const { return checkpoint_.has_value(); }
  const SafetensorsCheckpoint& weights() const;  // throws the checkpoint's error when none
  // Bytes of every tensor, and the floating-point tensors' element count (what transformers'
  // num_parameters() counts), from the headers; 0 and nullopt without weights.
  std::uint64_t checkpoint_bytes() const;
  std::optional<std::int64_t> checkpoint_parameters() const;
  // Drops the checkpoint's pages from this process's resident memory (they stay mapped and are
  // read again from the page cache or the disk if used): after loading, the run's RSS no longer
  // holds the weights twice.
  void release_resident_pages() const;

 private:
  std::filesystem::path dir_;
  ModelConfig config_;
  std::optional<SafetensorsCheckpoint> checkpoint_;
  std::exception_ptr checkpoint_error_;
};

}  // namespace tessera::hf
