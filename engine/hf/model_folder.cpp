#include "hf/model_folder.h"

#include "core/error.h"

namespace tessera::hf {

ModelFolder ModelFolder::open(const std::filesystem::path& dir) {
  ModelFolder folder;
  folder.dir_ = dir;
  folder.config_ = load_model_config(dir / "config.json");
  try {
    folder.checkpoint_ = SafetensorsCheckpoint::open(dir);
  } catch (const Error&) {
    folder.checkpoint_error_ = std::current_exception();
  }
  return folder;
}

const SafetensorsCheckpoint& ModelFolder::weights() const {
  if (!checkpoint_) std::rethrow_exception(checkpoint_error_);
  return *checkpoint_;
}

std::uint64_t ModelFolder::checkpoint_bytes() const {
  return checkpoint_ ? checkpoint_->total_bytes() : 0;
}

std::optional<std::int64_t> ModelFolder::checkpoint_parameters() const {
  if (!checkpoint_) return std::nullopt;
  std::uint64_t params = 0;
  for (const auto& name : checkpoint_->names()) {
    const auto& info = checkpoint_->info(name);
    if (info.dtype == DType::F64 || info.dtype == DType::F32 || info.dtype == DType::F16 ||
        info.dtype == DType::BF16)
      params += info.numel();
  }
  return static_cast<std::int64_t>(params);
}

void ModelFolder::release_resident_pages() const {
  if (checkpoint_) checkpoint_->release_resident_pages();
}

}  // namespace tessera::hf
