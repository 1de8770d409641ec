#pragma once
// The planner's activation model, per micro-batch, shared by every strategy's estimate.
#include "hf/config.h"
#include "plan/settings.h"

namespace tessera::plan {

// Bytes saved for backward by one micro-batch of s.micro_batch × s.sequence_length tokens, per
// our modules (engine/model/decoder.cpp, layers.cpp), before kActivationOverhead:
struct ActivationTerms {
  double layer = 0;     // one layer's
  double boundary = 0;  // one layer's input (all a layer keeps under activation checkpointing)
  double head = 0;      // the final norm and the loss head's at its backward
};
// With tensor parallelism over `tp` ranks the heads, the MLP's width and the vocabulary are split
// (the layer's input and residual, and the norms, stay whole on every rank).
ActivationTerms activation_terms(const hf::ModelConfig& c, const Settings& s, int tp = 1);

}  // namespace tessera::plan
