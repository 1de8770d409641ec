#pragma once
// The tensors gemini manages, in use order: the model's parameters in registration order, then
// the trainable tensors the model does not own (LoRA adapters): the identity fields of the
// plugin's entries.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/files.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/quantized_linear.h"
#include "train/param_groups.h"
#include "train/plugin.h"

namespace tessera::plugins {

// Appends an Entry per tensor to `entries` (name: the checkpoint name for trainable tensors, the
// named_parameters() key otherwise; model_name: that key, empty for adapters; tensor; trainable;
// decays) and returns, for each tensor of `trainable`, the index of its entry. A quantized
// Linear's weight (QLoRA's frozen base) is held by its layer, beside the chunks: not an entry.
template <class Entry>
std::vector<std::size_t> collect_tensor_entries(model::PretrainedModel& model,
                                                const std::vector<train::NamedTensor>& trainable,
                                                std::vector<Entry>& entries) {
  const std::vector<bool> decays = train::decays_weight(model, trainable);
  std::unordered_map<const void*, std::size_t> trainable_index;
  for (std::size_t i = 0; i < trainable.size(); ++i)
    trainable_index[trainable[i].tensor.unsafeGetTensorImpl()] = i;
  std::vector<std::size_t> entry_of_trainable(trainable.size());
  const std::set<std::string> quantized = model::quantized_weight_names(model);
  for (auto& item : model.named_parameters()) {
    if (quantized.count(item.key())) continue;
    Entry e;
    e.name = e.model_name = item.key();
    e.tensor = item.value();
    auto it = trainable_index.find(e.tensor.unsafeGetTensorImpl());
    if (it != trainable_index.end()) {
      e.trainable = true;
      e.name = trainable[it->second].name;
      e.decays = decays[it->second];
      entry_of_trainable[it->second] = entries.size();
      trainable_index.erase(it);
    }
    entries.push_back(std::move(e));
  }
  for (std::size_t i = 0; i < trainable.size(); ++i) {  // adapters live outside the model
    if (!trainable_index.count(trainable[i].tensor.unsafeGetTensorImpl())) continue;
    Entry e;
    e.name = trainable[i].name;
    e.tensor = trainable[i].tensor;
    e.trainable = true;
    e.decays = decays[i];
    entry_of_trainable[i] = entries.size();
    entries.push_back(std::move(e));
  }
  return entry_of_trainable;
}

// The hook member of the engine's building blocks (model::ParameterUse); null for other modules.
inline std::shared_ptr<model::ParameterUse>* parameter_use_slot(torch::nn::Module& module) {
  if (auto* m = dynamic_cast<model::LinearImpl*>(&module)) return &m->parameter_use;
  if (auto* m = dynamic_cast<model::EmbeddingImpl*>(&module)) return &m->parameter_use;
  if (auto* m = dynamic_cast<model::RMSNormImpl*>(&module)) return &m->parameter_use;
  if (auto* m = dynamic_cast<model::LayerNormImpl*>(&module)) return &m->parameter_use;
  return nullptr;
}

// A building block of the model and the entries of the parameters it registers itself.
struct BlockEntries {
  std::shared_ptr<torch::nn::Module> block;
  std::vector<std::size_t> entries;
};

// Every building block of `model` (one with a ParameterUse slot) with parameters among `entries`,
// in module order. An entry in none (a LoRA adapter) is used by no hook.
template <class Entry>
std::vector<BlockEntries> blocks_of_entries(model::PretrainedModel& model,
                                            const std::vector<Entry>& entries) {
  std::unordered_map<const void*, std::size_t> entry_of;
  for (std::size_t i = 0; i < entries.size(); ++i)
    entry_of[entries[i].tensor.unsafeGetTensorImpl()] = i;
  std::vector<BlockEntries> blocks;
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (parameter_use_slot(*module) == nullptr) continue;
    BlockEntries b{module, {}};
    for (const auto& p : module->named_parameters(/*recurse=*/false)) {
      auto it = entry_of.find(p.value().unsafeGetTensorImpl());
      if (it != entry_of.end()) b.entries.push_back(it->second);
    }
    if (!b.entries.empty()) blocks.push_back(std::move(b));
  }
  return blocks;
}

// Which of `count` entries some block fetches (those of `blocks`): the others (a LoRA adapter, a
// tensor no building block registers) have no hook to bring them in, so their chunks stay put.
inline std::vector<bool> fetched_entries(const std::vector<BlockEntries>& blocks,
                                         std::size_t count) {
  std::vector<bool> fetched(count, false);
  for (const BlockEntries& b : blocks)
    for (std::size_t i : b.entries) fetched[i] = true;
  return fetched;
}

// What is not in a chunk (the model's buffers) onto the compute device, the floating-point ones in
// the compute dtype, as Module::to(device, dtype) would (which would also touch the parameters,
// whose memory is the chunks' now).
inline void move_buffers(model::PretrainedModel& model, torch::Device device, torch::Dtype dtype) {
  for (torch::Tensor& buffer : model.buffers())
    buffer.set_data(buffer.is_floating_point() ? buffer.to(device, dtype) : buffer.to(device));
}

// `dest` ← the values of entry `e`: from the checkpoint when the model's weights are deferred
// (`deferred` set, the entry the model's), else from the tensor itself.
template <class Entry>
void fill_entry(const model::DeferredWeights* deferred, const Entry& e, torch::Tensor dest) {
  if (deferred != nullptr && !e.model_name.empty())
    deferred->read_into(e.model_name, std::move(dest));
  else
    dest.copy_(e.tensor.detach());
}

// `sizes` elements of `dtype` at `byte_offset` in a read-only map of `path` (a region's file of
// the disk tier); the map lives as long as the tensor.
inline torch::Tensor mapped_file_tensor(const std::filesystem::path& path, std::int64_t byte_offset,
                                        at::IntArrayRef sizes, torch::Dtype dtype) {
  auto mapped = std::make_shared<core::MappedFile>(path);
  auto* base = const_cast<std::uint8_t*>(mapped->data()) + byte_offset;
  return torch::from_blob(
      base, sizes, [mapped](void*) {}, dtype);
}

}  // namespace tessera::plugins
