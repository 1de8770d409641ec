#include "plan/step_cost.h"

#include <algorithm>

#include "hf/families.h"
#include "plan/cost_terms.h"
#include "plan/planner.h"

namespace tessera::plan {

using cost::d;

double step_flops(const Settings& s, const StepWork& work, double tokens) {
  // Forwards beside the one backward needs: the recomputation of activation checkpointing, and
  // preference tuning's reference over every row.
  const double forwards =
      (s.activation_checkpointing ? 1.0 : 0.0) + (s.reference_forward ? 1.0 : 0.0);
  const double per_product = (s.method == "lora" ? 4.0 : 6.0) + 2.0 * forwards;
  return (per_product * work.products + (3.0 + forwards) * work.attention) * tokens;
}

double attention_flops(const hf::ModelConfig& c, double layers, double sequence, int tp) {
  const double heads = d(c.num_attention_heads);
  const double width = c.head_dim > 0 && heads > 0 ? heads * d(c.head_dim) : d(c.hidden_size);
  const double keys = hf::family_of(c).causal_lm ? sequence / 2.0 : sequence;
  return layers * 4.0 * width * keys / d(std::max(1, tp));
}

double sequence_of(const Settings& s, double tokens) {
  const double sequences = d(std::max<std::int64_t>(1, s.micro_batch)) *
                           d(std::max<std::int64_t>(1, s.rows_per_example)) *
                           d(std::max<std::int64_t>(1, s.gradient_accumulation));
  return std::min(tokens / sequences, d(s.sequence_length));
}

double modelled_step_seconds(const Settings& s, const StepWork& work, double tokens, double layers,
                             double flops_per_s) {
  if (!(flops_per_s > 0)) return 0.0;
  const double micro_batches = d(std::max<std::int64_t>(1, s.gradient_accumulation));
  // A reference forward is about a third of a forward and backward's ops.
  const double forward_share = s.reference_forward ? 1.0 / 3.0 : 0.0;
  const double ops =
      micro_batches * (120.0 * layers + 40.0) * (1.0 + forward_share) + 130.0 * layers + 60.0;
  const double passes =
      2.0 + (s.activation_checkpointing ? 1.0 : 0.0) + (s.reference_forward ? 1.0 : 0.0);
  return step_flops(s, work, tokens) / flops_per_s + ops * kSecondsPerOp +
         micro_batches * passes * work.dequantized * kSecondsPerDequantizedValue;
}

double modelled_forward_seconds(const Settings& s, const StepWork& work, double tokens,
                                double layers, double flops_per_s) {
  if (!(flops_per_s > 0)) return 0.0;
  const double micro_batch_tokens = tokens / d(std::max<std::int64_t>(1, s.gradient_accumulation));
  return (2.0 * work.products + work.attention) * micro_batch_tokens / flops_per_s +
         (120.0 * layers + 40.0) / 3.0 * kSecondsPerOp +
         work.dequantized * kSecondsPerDequantizedValue;
}

StepWork model_work(const hf::ModelConfig& c, const Settings& s, double tokens) {
  const hf::FamilyTraits& family = hf::family_of(c);
  const hf::ParameterShapes shapes = family.parameter_shapes(c);
  const double layers = d(c.num_hidden_layers);
  StepWork w;
  w.products = layers * cost::layer_elements(shapes) + shapes.layer_other / 2.0 +
               (family.causal_lm ? d(c.vocab_size) * d(c.hidden_size) : 0.0);
  if (s.method == "lora") w.products += d(count_lora_parameters(c, s.lora_rank, s.lora_targets));
  w.dequantized = cost::quantized_base(c, s).elements;
  w.attention = attention_flops(c, layers, sequence_of(s, tokens), 1);
  return w;
}

}  // namespace tessera::plan
