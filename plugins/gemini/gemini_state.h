#pragma once
// What Gemini keeps in a checkpoint's trainer_state.json beside the tensors: the optimizer's step
// count and the mixed-precision state (the fp16 loss scale), as `single` writes them.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "train/mixed_precision.h"

namespace tessera::plugins {

inline nlohmann::json gemini_state_json(const train::MixedPrecision& precision,
                                        std::int64_t optimizer_steps) {
  nlohmann::json state = {{"optimizer_steps", optimizer_steps}};
  precision.write_state(state);
  return state;
}

// Restores the precision's state from `state` and returns the optimizer steps it records;
// `source` names the checkpoint in a refusal.
inline std::int64_t restore_gemini_state(train::MixedPrecision& precision,
                                         const nlohmann::json& state, const std::string& source) {
  precision.restore_state(state, source);
  try {
    return state.at("optimizer_steps").get<std::int64_t>();
  } catch (const nlohmann::json::exception& error) {
    throw_invalid(source + ": trainer_state.json: plugin state is invalid (" + error.what() + ")");
  }
}

}  // namespace tessera::plugins
