#pragma once
// Which trainable tensors get weight decay: the split of transformers' Trainer
// (Trainer.get_decay_parameter_names): no decay for a parameter whose lower-cased name contains
// "bias", "layernorm" or "rmsnorm", has a path component "norm" or ending in "_norm", or that
// lives inside a LayerNorm module (GPT-2's ln_1 / ln_2 / ln_f). Everything else decays,
// LoRA adapters included.
#include <string>
#include <vector>

#include "model/model.h"
#include "optim/adamw.h"

namespace tessera::train {

// The name rule alone (a HuggingFace or PEFT parameter name).
bool name_excludes_weight_decay(const std::string& name);

// Per tensor of `trainable` (the tensors the model computes with, in the model or in
// adapters): whether it decays. LayerNorm membership is by tensor identity, so names of either
// form (HuggingFace or PEFT) work.
std::vector<bool> decays_weight(model::PretrainedModel& model,
                                const std::vector<optim::NamedTensor>& trainable);

// `tensors` split by `decays` into {decaying, weight_decay} and {the rest, 0}, each in the
// order given; empty groups are dropped.
std::vector<optim::ParamGroup> split_by_decay(const std::vector<optim::NamedTensor>& tensors,
                                              const std::vector<bool>& decays, double weight_decay);

}  // namespace tessera::train
