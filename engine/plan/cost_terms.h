#pragma once
// What every strategy's cost model (plan/*_cost.h) reads: byte arithmetic clamped against absurd
// configs, and what the settings train and store. Torch-free.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hf/config.h"
#include "hf/families.h"
#include "plan/settings.h"

namespace tessera::plan::cost {

// Sizes from config.json can be absurd; all byte arithmetic is in double and clamped, so an
// absurd config gives an absurd (non-fitting) estimate instead of a wrapped one.
std::uint64_t to_bytes(double v);

inline double d(std::int64_t v) {
  return static_cast<double>(v);
}

// (in, out) of a named linear in one layer (the first of that name); nullopt when the family
// has no such module.
std::optional<std::pair<double, double>> linear_shape(const hf::ModelConfig& c,
                                                      const std::string& name);

// One layer's elements: its linears' weights and biases, and its other parameters (norms).
double layer_elements(const hf::ParameterShapes& shapes);

// A quantized base (QLoRA, settings.quantize): the elements of the layers' linear weights it holds
// quantized, their bytes (codes and scales, as engine/model/quantized_linear stores them), and the
// elements of the float32 band the largest is read through while loading (a band of rows at a
// time: quant::kQuantizeBandValues, or the whole weight when smaller).
struct QuantizedBase {
  double elements = 0.0;
  double bytes = 0.0;
  double load_band = 0.0;
};
QuantizedBase quantized_base(const hf::ModelConfig& c, const Settings& s);

// What the settings train and store: every parameter (n), the trainable ones, those stored dense
// (with LoRA the adapters live beside the frozen base; full: the parameters themselves are
// trained; a quantized base's linear weights are not among them: quantized_base, nor a table left
// in its file: table_in_file), in the compute dtype's bytes.
struct ParameterCounts {
  double n;
  double trainable;
  double stored;
  double param_bytes;
  bool lora;
  bool bf16;
};
ParameterCounts counts_of(const hf::ModelConfig& c, const Settings& s);
// The elements of the frozen tables LoRA under `single` on the CPU leaves in the checkpoint file
// (engine/ model: DeferredWeights::leave_frozen_tables_in_file; not when tied to each other): the
// input embedding, and the output head where it has no adapter (head_in_file). Not among `stored`,
// never resident.
double table_in_file(const hf::ModelConfig& c, const Settings& s);
// Whether the causal LM's output head is one of them: the loss reads it a block of the
// vocabulary at a time (model/head_loss.h: stored_head_target_losses).
bool head_in_file(const hf::ModelConfig& c, const Settings& s);
// The linears LoRA adapts: the job's targets, or the family's default ones.
std::vector<std::string> lora_targets(const hf::ModelConfig& c, const Settings& s);
// Whether LoRA adapts the output head (`lm_head` among its targets, or the family's defaults).
bool adapts_head(const hf::ModelConfig& c, const Settings& s);
// Preference tuning's frozen reference copy (Settings::reference_copy): every parameter in the
// compute dtype, beside the model that trains; 0 without one.
double reference_copy_bytes(const hf::ModelConfig& c, const Settings& s);

// The bytes LoRA's streamed merged export holds beside the model at rest (engine/runner:
// export_merged_lora), one weight's copies at a time.
double merge_working_set(const hf::ModelConfig& c, const Settings& s);

}  // namespace tessera::plan::cost
