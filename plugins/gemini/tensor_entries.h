#pragma once
// The tensors gemini manages, in use order: the model's parameters in registration order, then
// the trainable tensors the model does not own (LoRA adapters). Shared by the one-process plugin
// and the sharded one, whose entry types differ but carry the same identity fields.
#include <torch/torch.h>

#include <cstddef>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/model.h"
#include "train/param_groups.h"
#include "train/plugin.h"

namespace tessera::plugins {

// Appends an Entry per tensor to `entries` (name: the checkpoint name for trainable tensors, the
// named_parameters() key otherwise; model_name: that key, empty for adapters; tensor; trainable;
// decays) and returns, for each tensor of `trainable`, the index of its entry.
template <class Entry>
std::vector<std::size_t> collect_tensor_entries(model::PretrainedModel& model,
                                                const std::vector<train::NamedTensor>& trainable,
                                                std::vector<Entry>& entries) {
  const std::vector<bool> decays = train::decays_weight(model, trainable);
  std::unordered_map<const void*, std::size_t> trainable_index;
  for (std::size_t i = 0; i < trainable.size(); ++i)
    trainable_index[trainable[i].tensor.unsafeGetTensorImpl()] = i;
  std::vector<std::size_t> entry_of_trainable(trainable.size());
  for (auto& item : model.named_parameters()) {
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

}  // namespace tessera::plugins
