#include "train/param_groups.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <unordered_set>

#include "model/layers.h"

namespace tessera::train {

bool name_excludes_weight_decay(const std::string& name) {
  static const std::regex pattern(R"(bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.))");
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::regex_search(lower, pattern);
}

std::vector<bool> decays_weight(model::PretrainedModel& model,
                                const std::vector<optim::NamedTensor>& trainable) {
  std::unordered_set<const void*> in_layer_norm;
  for (const auto& module : model.modules(/*include_self=*/false))
    if (dynamic_cast<const model::LayerNormImpl*>(module.get()) != nullptr)
      for (const auto& p : module->parameters()) in_layer_norm.insert(p.unsafeGetTensorImpl());
  std::vector<bool> decays;
  for (const optim::NamedTensor& t : trainable)
    decays.push_back(!name_excludes_weight_decay(t.name) &&
                     in_layer_norm.count(t.tensor.unsafeGetTensorImpl()) == 0);
  return decays;
}

std::vector<optim::ParamGroup> split_by_decay(const std::vector<optim::NamedTensor>& tensors,
                                              const std::vector<bool>& decays,
                                              double weight_decay) {
  optim::ParamGroup decayed{{}, weight_decay};
  optim::ParamGroup not_decayed{{}, 0.0};
  for (std::size_t i = 0; i < tensors.size(); ++i)
    (decays.at(i) ? decayed : not_decayed).params.push_back(tensors[i]);
  std::vector<optim::ParamGroup> groups;
  if (!decayed.params.empty()) groups.push_back(std::move(decayed));
  if (!not_decayed.params.empty()) groups.push_back(std::move(not_decayed));
  return groups;
}

}  // namespace tessera::train
