#include "plan/cost_terms.h"

#include <algorithm>
#include <cmath>

#include "hf/families.h"
#include "plan/planner.h"
#include "quant/tiles.h"

namespace tessera::plan::cost {

std::uint64_t to_bytes(double v) {
  if (!(v > 0.0)) return 0;
  if (v >= 1.8e19) return 18000000000000000000ull;
  return static_cast<std::uint64_t>(v);
}

std::optional<std::pair<double, double>> linear_shape(const hf::ModelConfig& c,
                                                      const std::string& name) {
  for (const hf::LinearModule& l : hf::family_of(c).parameter_shapes(c).layer_linears)
    if (l.name == name) return std::pair{l.in_features, l.out_features};
  return std::nullopt;
}

double layer_elements(const hf::ParameterShapes& shapes) {
  double layer = shapes.layer_other;
  for (const hf::LinearModule& l : shapes.layer_linears)
    layer += l.in_features * l.out_features + (l.bias ? l.out_features : 0.0);
  return layer;
}

QuantizedBase quantized_base(const hf::ModelConfig& c, const Settings& s) {
  QuantizedBase q;
  if (s.method != "lora" || s.quantize == "none" || s.quantize.empty()) return q;
  const double layers = d(c.num_hidden_layers);
  for (const hf::LinearModule& l : hf::family_of(c).parameter_shapes(c).layer_linears) {
    const double values = l.in_features * l.out_features;
    // int8: a byte a value and a float32 scale a row; 4-bit: half a byte a value and a float32
    // absmax per block of 64 — double-quantized: a byte per block, a float32 scale per 256 of
    // those and the 256-value code.
    const double blocks = std::ceil(values / 64.0);
    const double scales =
        s.double_quant ? blocks + 4.0 * std::ceil(blocks / 256.0) + 4.0 * 256 : 4.0 * blocks;
    const double bytes =
        s.quantize == "int8" ? values + 4.0 * l.out_features : std::ceil(values / 2.0) + scales;
    q.elements += layers * values;
    q.bytes += layers * bytes;
    q.load_band = std::max(
        q.load_band,
        std::min(values, std::max(std::floor(d(quant::kQuantizeBandValues) / l.in_features), 1.0) *
                             l.in_features));
  }
  return q;
}

ParameterCounts counts_of(const hf::ModelConfig& c, const Settings& s) {
  const double n = d(count_parameters(c));
  const bool lora = s.method == "lora";
  const bool bf16 = half_precision(s.precision);
  const double trainable = lora ? d(count_lora_parameters(c, s.lora_rank, s.lora_targets)) : n;
  const double quantized = quantized_base(c, s).elements;
  return {n,
          trainable,
          (lora ? n + trainable : n) - quantized - table_in_file(c, s),
          bf16 ? 2.0 : 4.0,
          lora,
          bf16};
}

double table_in_file(const hf::ModelConfig& c, const Settings& s) {
  if (s.method != "lora" || s.strategy != "single" || s.on_gpu || !s.frozen_tables_in_file ||
      c.tie_word_embeddings)
    return 0.0;
  return d(c.vocab_size) * d(c.hidden_size) * (head_in_file(c, s) ? 2.0 : 1.0);
}

std::vector<std::string> lora_targets(const hf::ModelConfig& c, const Settings& s) {
  return s.lora_targets.empty() ? default_lora_targets(c) : s.lora_targets;
}

bool adapts_head(const hf::ModelConfig& c, const Settings& s) {
  if (s.method != "lora") return false;
  const auto targets = lora_targets(c, s);
  return std::find(targets.begin(), targets.end(), "lm_head") != targets.end();
}

bool head_in_file(const hf::ModelConfig& c, const Settings& s) {
  return s.method == "lora" && s.strategy == "single" && !s.on_gpu && s.frozen_tables_in_file &&
         !c.tie_word_embeddings && hf::family_of(c).causal_lm && !adapts_head(c, s);
}

double reference_copy_bytes(const hf::ModelConfig& c, const Settings& s) {
  return s.reference_copy ? d(count_parameters(c)) * (half_precision(s.precision) ? 2.0 : 4.0)
                          : 0.0;
}

// LoRA's streamed merged export (engine/runner: export_merged_lora), one weight at a time: an
// adapted weight holds its float32 base and the copy the merge check compares against, the delta
// in float64 and in float32, and the checkpoint's or the written file's pages of it (20 + 4 bytes
// a value); any other weight its float32 value and those pages (8 bytes a value).
double merge_working_set(const hf::ModelConfig& c, const Settings& s) {
  const hf::ParameterShapes shapes = hf::family_of(c).parameter_shapes(c);
  double adapted = 0.0, largest = d(c.vocab_size) * d(c.hidden_size);
  const auto targets = lora_targets(c, s);
  for (const hf::LinearModule& l : shapes.layer_linears) {
    const double values = l.in_features * l.out_features;
    largest = std::max(largest, values);
    if (std::find(targets.begin(), targets.end(), l.name) != targets.end())
      adapted = std::max(adapted, values);
  }
  return std::max(adapted * 24.0, largest * 8.0);
}

}  // namespace tessera::plan::cost
