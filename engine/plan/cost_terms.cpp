#include "plan/cost_terms.h"

#include "hf/families.h"
#include "plan/planner.h"

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

ParameterCounts counts_of(const hf::ModelConfig& c, const Settings& s) {
  const double n = d(count_parameters(c));
  const bool lora = s.method == "lora";
  const bool bf16 = s.precision == "bf16";
  const double trainable = lora ? d(count_lora_parameters(c, s.lora_rank, s.lora_targets)) : n;
  return {n, trainable, lora ? n + trainable : n, bf16 ? 2.0 : 4.0, lora, bf16};
}

}  // namespace tessera::plan::cost
