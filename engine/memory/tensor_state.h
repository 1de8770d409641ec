#pragma once
// The life of one tensor inside a Gemini chunk, as an enum plus an explicit table of the allowed
// transitions (after Colossal-AI's chunk.py). Every change goes through `transition`, which
// refuses anything the table does not list, so a plugin bug shows as a named error instead of a
// silently stale weight.
//
//   Free ──load──▶ Held ──fetch──▶ Computing ──forward done──▶ Held
//                    ▲                  │
//                    │            backward done
//                    │                  ▼
//                    │          HeldAfterBackward ──gradient in its chunk──▶ ReadyForUpdate
//                    └──────────────────────── optimizer updated ◀───────────────┘
//   Held ──release / offload──▶ Free
#include <string>

namespace tessera::memory {

enum class TensorState { Free, Held, Computing, HeldAfterBackward, ReadyForUpdate };

const char* tensor_state_name(TensorState state);

// True when the table allows `from` → `to`.
bool transition_allowed(TensorState from, TensorState to);

// Moves `state` to `to`, or throws tessera::Error (Internal) naming the tensor and both states.
void transition(TensorState& state, TensorState to, const std::string& tensor_name);

}  // namespace tessera::memory
