#include "memory/tensor_state.h"

#include "core/error.h"

namespace tessera::memory {

const char* tensor_state_name(TensorState state) {
  switch (state) {
    case TensorState::Free:
      return "free";
    case TensorState::Held:
      return "held";
    case TensorState::Computing:
      return "computing";
    case TensorState::HeldAfterBackward:
      return "held after backward";
    case TensorState::ReadyForUpdate:
      return "ready for the update";
  }
  return "unknown";
}

bool transition_allowed(TensorState from, TensorState to) {
  using S = TensorState;
  switch (from) {
    case S::Free:
      return to == S::Held;
    case S::Held:
      // A frozen tensor is never updated: it goes back to Held after its backward use.
      return to == S::Computing || to == S::Free;
    case S::Computing:
      return to == S::Held || to == S::HeldAfterBackward;
    case S::HeldAfterBackward:
      // Another micro-batch computes with it again before the update (accumulation).
      return to == S::ReadyForUpdate || to == S::Computing;
    case S::ReadyForUpdate:
      return to == S::Held;
  }
  return false;
}

void transition(TensorState& state, TensorState to, const std::string& tensor_name) {
  if (!transition_allowed(state, to))
    throw Error(ErrorKind::Internal, "Gemini: tensor \"" + tensor_name + "\" cannot go from " +
                                         tensor_state_name(state) + " to " + tensor_state_name(to));
  state = to;
}

}  // namespace tessera::memory
