// The planner's memory and communication estimates of one rank (plan/planner.h): single's
// categories from config.json, refined by each strategy's cost model (plan/strategy_costs.h).
#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "hf/families.h"
#include "model/head_loss.h"
#include "plan/activations.h"
#include "plan/cost_terms.h"
#include "plan/gemini_cost.h"
#include "plan/model_size.h"
#include "plan/plan_text.h"
#include "plan/planner.h"
#include "plan/replica_cost.h"
#include "plan/strategy_costs.h"
#include "quant/tiles.h"

namespace tessera::plan {

using cost::counts_of;
using cost::d;
using cost::linear_shape;
using cost::to_bytes;

double parameter_count(const hf::ModelConfig& c) {
  const hf::ParameterShapes shapes = hf::family_of(c).parameter_shapes(c);
  return shapes.outside_layers + d(c.num_hidden_layers) * cost::layer_elements(shapes);
}

std::int64_t count_parameters(const hf::ModelConfig& c) {
  const double n = parameter_count(c);
  if (!(n < kMaxParameterCount)) throw_invalid(too_many_parameters(c, "config.json"));
  return static_cast<std::int64_t>(n);
}

std::vector<std::string> default_lora_targets(const hf::ModelConfig& c) {
  return hf::family_of(c).default_lora_targets;
}

std::int64_t count_lora_parameters(const hf::ModelConfig& c, std::int64_t rank,
                                   const std::vector<std::string>& targets) {
  const std::vector<std::string> names = targets.empty() ? default_lora_targets(c) : targets;
  double n = 0;
  for (const auto& name : names) {
    auto shape = linear_shape(c, name);
    if (!shape) {
      std::vector<std::string> linears;
      for (const hf::LinearModule& l : hf::family_of(c).parameter_shapes(c).layer_linears)
        linears.push_back(l.name);
      throw_invalid("method.targets: \"" + name + "\" is not a linear layer of " + c.model_type,
                    "name linear layers of its blocks: " + join(linears) + " (the default is " +
                        join(default_lora_targets(c)) + ")");
    }
    n += d(rank) * (shape->first + shape->second);
  }
  return static_cast<std::int64_t>(std::min(n * d(c.num_hidden_layers), 9.0e18));
}

namespace {

// The widest output of a layer's linears (a quantized linear's output pieces and their
// concatenation are that wide).
double widest_layer_output(const hf::ModelConfig& c) {
  double widest = 0.0;
  for (const hf::LinearModule& l : hf::family_of(c).parameter_shapes(c).layer_linears)
    widest = std::max(widest, l.out_features);
  return widest;
}

}  // namespace

ActivationTerms activation_terms(const hf::ModelConfig& c, const Settings& s, int tp) {
  const bool lora = s.method == "lora";
  const bool bf16 = half_precision(s.precision);
  const double split = static_cast<double>(std::max(1, tp));
  // Activations saved for backward, per our modules (engine/model/decoder.cpp, layers.cpp),
  // in elements of the compute dtype; T = B·S tokens.
  const double t = d(s.micro_batch) * d(s.rows_per_example) * d(s.sequence_length);
  const double h = d(c.hidden_size), v = d(c.vocab_size);
  const double act = bf16 ? 2.0 : 4.0;
  // A GPU's kernels (the simulated device computes on the CPU, with the CPU's).
  const bool gpu_kernels = s.on_gpu && !s.simulated_device;
  // RMSNorm (engine/model/layers.cpp) saves its float32 input for pow and the product, and,
  // when the weight trains, the normalised value it multiplies (in the compute dtype). Under
  // bf16 the float32 input is the widened copy; in fp32 it is the input itself. On a GPU the
  // fused kernel saves its input alone (and a float32 figure per row).
  const double norm_bytes = gpu_kernels ? act : 4.0 + (lora ? 0.0 : act);
  // Per family (hf/families.cpp: saved_per_token), plus softmax's fp32 log-sum-exp per head.
  // Split over tp: all but the layer's input and residual (2h).
  const hf::ParameterShapes shapes = hf::family_of(c).parameter_shapes(c);
  double saved = shapes.saved_per_token;
  if (lora) {
    // The frozen base keeps no linear's input for a weight gradient: only the inputs an adapter
    // reads (each shared input once) stay.
    const auto targets = cost::lora_targets(c, s);
    std::map<int, std::pair<double, bool>> inputs;  // input → (its width, read by an adapter)
    for (const hf::LinearModule& l : shapes.layer_linears) {
      auto& [width, adapted] = inputs[l.input];
      width = l.in_features;
      adapted = adapted || std::find(targets.begin(), targets.end(), l.name) != targets.end();
    }
    for (const auto& [input, width_adapted] : inputs)
      if (!width_adapted.second) saved -= width_adapted.first;
  }
  const double whole = std::min(saved, 2.0 * h);
  // Sequence parallelism splits the rest by positions: the layer's input and residual, and the
  // norms (the column-parallel layers keep their input's block, gathering it again in backward).
  const double positions = tp > 1 && s.sequence_parallel ? split : 1.0;
  ActivationTerms out;
  out.layer = t * (act * (tp > 1 ? whole / positions + (saved - whole) / split : saved) +
                   2 * norm_bytes * h / positions);
  out.layer += t * d(c.num_attention_heads) / split * 4.0;
  if (lora) {
    const auto targets = cost::lora_targets(c, s);
    out.layer += t * act * d(s.lora_rank) * d(static_cast<std::int64_t>(targets.size())) * 2;
  }
  out.boundary = t * h * act / positions;
  const double final_norm = t * h * (act + 2 * norm_bytes);
  // Training's loss through the head (model/head_loss.h): a block of rows' logits at a time (of
  // this rank's V / tp columns), in the compute dtype, widened to float32 (in place of them in
  // fp32), and their gradient in the compute dtype; plus the hidden states' gradient, computed in
  // forward. Preference tuning's per-token log-probabilities the same way (their gradient with
  // respect to the hidden states kept from forward, or, where the head trains, the blocks
  // recomputed in backward from the hidden states). A head with LoRA's adapter reads whole
  // logits.
  const bool adapted_head = cost::adapts_head(c, s);
  const double columns = v / split;
  if (cost::head_in_file(c, s)) {
    // The head read from its file a block of the vocabulary at a time, for every token at once:
    // the block's weight rows and its float32 logits, their exponentials in the compute dtype;
    // each token's running Σ softmax·weight-row (float32), its target's row and the hidden
    // states' gradient, made in forward.
    const double block =
        d(model::head_vocabulary_block(static_cast<std::int64_t>(t), static_cast<std::int64_t>(h),
                                       static_cast<std::int64_t>(act)));
    out.head = block * h * act + t * block * (4.0 + act) + t * h * (4.0 + 2 * act) + final_norm;
    return out;
  }
  if (hf::family_of(c).causal_lm && !adapted_head) {
    // A GPU takes larger blocks than the CPU.
    const double rows = std::min(
        t, d(model::head_loss_block_rows(static_cast<std::int64_t>(columns), gpu_kernels)));
    out.head = rows * columns * (bf16 ? 2.0 + 4.0 + 2.0 : 4.0) + t * h * act + final_norm;
    return out;
  }
  // Whole logits at the loss's backward: the logits, their fp32 copy under bf16, log-softmax,
  // and the gradients of both, all [T, V / tp].
  out.head = t * columns * (bf16 ? 2.0 + 4.0 * 3 : 4.0 * 4) + final_norm;
  return out;
}

MemoryEstimate estimate_host_memory(const hf::ModelConfig& c, const Settings& s,
                                    std::uint64_t checkpoint_bytes, int world_size) {
  if (s.strategy == "zero" && s.zero_offload) return zero_offload_host_memory(c, s, world_size);
  if (s.strategy != "gemini" || !s.device_tier) return {};
  return sharded_device_tiers(c, s, checkpoint_bytes, world_size).second;
}

MemoryEstimate estimate_memory(const hf::ModelConfig& c, const Settings& s,
                               std::uint64_t checkpoint_bytes, int world_size) {
  if (s.strategy == "gemini" && s.device_tier) {
    // Preference tuning's frozen reference copy computes on the device beside the chunks.
    MemoryEstimate device = sharded_device_tiers(c, s, checkpoint_bytes, world_size).first;
    device.weights += to_bytes(cost::reference_copy_bytes(c, s));
    return device;
  }
  MemoryEstimate e;
  const auto [n, trainable, stored, param_bytes, lora, bf16] = counts_of(c, s);
  const cost::QuantizedBase quantized = cost::quantized_base(c, s);
  // Preference tuning's frozen reference model, beside the one that trains.
  const double reference = cost::reference_copy_bytes(c, s);
  e.weights =
      to_bytes(stored * param_bytes + quantized.bytes + (bf16 ? trainable * 4.0 : 0.0) + reference);
  e.gradients = to_bytes(trainable * (bf16 ? 2.0 + 4.0 : 4.0));
  e.optimizer = to_bytes(trainable * 8.0);
  e.runtime = kRuntimeBaselineBytes;
  // The runner loads in fp32 from the memory-mapped checkpoint, then casts; LoRA under
  // `single` reads its frozen base straight into the compute dtype (engine/train/trainer). A
  // quantized base's linear weights are quantized from a float32 band of rows at a time. A
  // preference reference is read straight into the compute dtype beside it (engine/runner).
  const double loaded_bytes = lora && s.strategy == "single" ? param_bytes : 4.0;
  e.load_peak =
      to_bytes((n - quantized.elements - cost::table_in_file(c, s)) * loaded_bytes +
               quantized.bytes + quantized.load_band * 4.0 + reference +
               static_cast<double>(checkpoint_bytes) + static_cast<double>(kRuntimeBaselineBytes));
  // The export (engine/runner), after the optimizer state is freed. Full fine-tuning: the
  // trained model, its fp32 copy below fp32 training, and the reload that verifies the written
  // files (read through a mapping, resident while it copies, as the load is). LoRA's merged
  // export is streamed beside the model at rest: one weight at a time, from the checkpoint or
  // dequantized, in float32 (merge_working_set).
  e.export_peak = to_bytes(stored * param_bytes + quantized.bytes +
                           (lora ? (bf16 ? trainable * 4.0 : 0.0) + cost::merge_working_set(c, s)
                                 : (bf16 ? n * 4.0 : 0.0) + n * 4.0 * 2) +
                           static_cast<double>(kRuntimeBaselineBytes));

  const ActivationTerms act = activation_terms(c, s);
  const double layers = d(c.num_hidden_layers);
  const double stack =
      s.activation_checkpointing ? layers * act.boundary + act.layer : layers * act.layer;
  const double head = act.head;
  // A quantized linear's workspace: the tile it dequantizes, in the compute dtype (no float32
  // copy, on the CPU or by the CUDA kernel on a GPU: engine/model/quantized_linear), and its
  // output's pieces beside their concatenation.
  const double workspace = quantized.elements > 0
                               ? d(quant::kDequantizeTileElements) * (bf16 ? 2.0 : 4.0) +
                                     d(s.micro_batch) * d(s.sequence_length) *
                                         widest_layer_output(c) * (bf16 ? 2.0 : 4.0)
                               : 0.0;
  e.activations = to_bytes((stack + head) * kActivationOverhead + workspace);
  // `single` keeps the widened float32 gradients only for the update (plugins/single).
  if (bf16 && s.strategy == "single") e.update_gradients = to_bytes(trainable * 4.0);

  if (const StrategyCost* cost = strategy_cost(s.strategy); cost && cost->memory)
    cost->memory(e, c, s, checkpoint_bytes, world_size);
  return e;
}

Communication estimate_communication(const hf::ModelConfig& c, const Settings& s, int world_size,
                                     const std::optional<LinkInfo>& link,
                                     std::uint64_t bucket_bytes) {
  Communication out;
  if (world_size <= 1 || !distributes(s)) return out;
  const StrategyCost* cost = strategy_cost(s.strategy);
  if (cost == nullptr || cost->communication == nullptr) return out;
  out = cost->communication(c, s, world_size, bucket_bytes);
  // Each blocking tensor-group collective also waits for the later rank of the group.
  if (link && link->measured && link->bandwidth_bytes_per_s > 0.0)
    out.seconds = d(static_cast<std::int64_t>(out.bytes)) / link->bandwidth_bytes_per_s +
                  d(out.calls) * link->latency_s + d(out.blocking_calls) * kTensorCollectiveWait;
  return out;
}

}  // namespace tessera::plan
