#pragma once
// Module names as named_modules() gives them ("model.layers.0.self_attn.q_proj"): what LoRA's
// targets and QLoRA's kept-dense layers are matched by.
#include <string>

namespace tessera::model {

// The last component of a dotted module name ("q_proj"); the whole name when it has no dot.
inline std::string last_component(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace tessera::model
