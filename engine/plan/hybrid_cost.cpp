#include "plan/hybrid_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "hf/families.h"
#include "parallel/pipeline_schedule.h"
#include "plan/activations.h"
#include "plan/cost_terms.h"
#include "plan/plan_text.h"
#include "plan/planner.h"
#include "plan/step_cost.h"
#include "plan/strategy_costs.h"

namespace tessera::plan {

using cost::d;
using cost::to_bytes;

namespace {

// The tensor-parallel rule of a layer's linear named `name` (its module path's last component:
// gpt2's two c_proj are both split by their inputs), or null when it stays whole.
const hf::TensorSplitRule* layer_rule(const hf::FamilyTraits& family, const std::string& name) {
  for (const hf::TensorSplitRule& rule : family.tensor_parallel_plan) {
    const auto dot = rule.module.rfind('.');
    if (rule.module.find('*') != std::string::npos &&
        rule.module.substr(dot == std::string::npos ? 0 : dot + 1) == name)
      return &rule;
  }
  return nullptr;
}

// The share of a column-split linear's outputs one rank holds: 1/tp, or with fewer kv heads
// than ranks, one kv head's block of 1/kv (held by tp/kv ranks).
double column_share(const hf::TensorSplitRule& rule, const hf::ModelConfig& c, int tp) {
  if (rule.kv_heads && c.num_key_value_heads > 0 && c.num_key_value_heads < tp)
    return 1.0 / d(c.num_key_value_heads);
  return 1.0 / d(tp);
}

bool vocabulary_split(const hf::FamilyTraits& family, const std::string& module) {
  const hf::TensorSplitRule* rule = hf::tensor_split_of(family, module);
  return rule != nullptr && rule->split == hf::TensorSplit::Vocabulary;
}

// "layers 0-1" / "layers 0, 2-3": a stage's ranges (one per chunk).
std::string describe(const std::vector<parallel::StageLayers>& ranges) {
  std::string out = "layers ";
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0) out += ", ";
    out.append(std::to_string(ranges[i].first));
    if (ranges[i].end - ranges[i].first > 1) {
      out.push_back('-');  // append, not "-" + …: GCC 12's -Wrestrict false positive
      out.append(std::to_string(ranges[i].end - 1));
    }
  }
  return out;
}

}  // namespace

const HybridStage& HybridLayout::heaviest(const Settings& s) const {
  if (stages.empty()) throw Error(ErrorKind::Internal, "hybrid layout without stages");
  return *std::max_element(
      stages.begin(), stages.end(), [&](const HybridStage& a, const HybridStage& b) {
        return hybrid_stage_memory(a, s).total() < hybrid_stage_memory(b, s).total();
      });
}

HybridStageMemory hybrid_stage_memory(const HybridStage& stage, const Settings& s) {
  const bool bf16 = half_precision(s.precision);
  const double param_bytes = bf16 ? 2.0 : 4.0;
  const bool lora = s.method == "lora";
  // ZeRO-1 and 2: each replica's share of every block (⌈n / dp⌉, so about n / dp).
  const bool sharded = s.zero_stage >= 1 && stage.replicas > 1;
  const double updated = sharded ? stage.trainable / d(stage.replicas) : stage.trainable;
  HybridStageMemory m;
  m.weights = (stage.parameters + (lora ? stage.trainable : 0.0)) * param_bytes +
              (bf16 ? updated * 4.0 : 0.0);
  m.gradient_buckets = stage.trainable * 4.0;
  m.gradients = stage.trainable * (bf16 ? 2.0 + 4.0 : 4.0) + m.gradient_buckets;
  if (sharded && s.zero_stage == 2) {
    // Every micro-batch's gradients leave for their buckets as they arrive; two buckets in
    // flight, and the float32 average of the replica's share.
    m.gradient_buckets = std::min(m.gradient_buckets, 2.0 * d(kDefaultBucketBytes));
    m.gradients = updated * 4.0 + m.gradient_buckets;
  }
  m.optimizer = updated * 8.0;
  m.activations = stage.activation_bytes;
  return m;
}

HybridLayout hybrid_layout(const hf::ModelConfig& c, const Settings& s, int world_size,
                           std::uint64_t bucket_bytes) {
  HybridLayout out;
  out.tp = std::max(1, s.tp_size);
  out.pp = std::max(1, s.pp_size);
  out.chunks = std::max(1, s.pp_chunks);
  out.dp = std::max(1, world_size / (out.tp * out.pp));
  out.micro_batches = std::max<std::int64_t>(1, s.gradient_accumulation);
  out.zero_stage = out.dp > 1 ? s.zero_stage : 0;
  out.sequence_parallel = s.sequence_parallel && out.tp > 1;
  const int tp = out.tp, pp = out.pp, chunks = out.chunks;
  const hf::FamilyTraits& family = hf::family_of(c);
  const hf::ParameterShapes shapes = family.parameter_shapes(c);
  const double v = d(c.vocab_size), h = d(c.hidden_size);
  const bool lora = s.method == "lora";
  const std::vector<std::string> targets = cost::lora_targets(c, s);
  const double r = d(s.lora_rank);

  // One layer: its elements whole, one rank's blocks, and one rank's LoRA adapters.
  double layer_whole = shapes.layer_other, layer_rank = shapes.layer_other, layer_lora = 0;
  std::vector<std::string> counted_targets;  // a name repeated (gpt2's c_proj) is planned once
  for (const hf::LinearModule& m : shapes.layer_linears) {
    const double weight = m.in_features * m.out_features;
    const double bias = m.bias ? m.out_features : 0.0;
    layer_whole += weight + bias;
    const hf::TensorSplitRule* rule = tp > 1 ? layer_rule(family, m.name) : nullptr;
    double out_share = 1.0, in_share = 1.0;
    if (rule != nullptr && rule->split == hf::TensorSplit::Column)
      out_share = column_share(*rule, c, tp);
    if (rule != nullptr && rule->split == hf::TensorSplit::Row) in_share = 1.0 / d(tp);
    layer_rank += weight * out_share * in_share + bias * out_share;
    const bool targeted = std::find(targets.begin(), targets.end(), m.name) != targets.end();
    if (lora && targeted &&
        std::find(counted_targets.begin(), counted_targets.end(), m.name) ==
            counted_targets.end()) {
      counted_targets.push_back(m.name);
      // A [r, in] split with the inputs, B [out, r] with the outputs.
      layer_lora += r * m.in_features * in_share + r * m.out_features * out_share;
    }
  }
  // Outside the layers: the embedding (the first stage's, vocabulary-split), an untied head (the
  // last's, vocabulary-split) or with several stages the tied embedding's copy there, the final
  // norm (the last's, as large as one of a layer's norms) and what precedes layer 0 besides the
  // embedding (gpt2's position embedding, the first's).
  const double head_whole =
      !c.tie_word_embeddings && shapes.outside_layers >= 2 * v * h ? v * h : 0.0;
  const double final_norm = shapes.layer_other / 2.0;
  const double before_rest = std::max(0.0, shapes.outside_layers - v * h - head_whole - final_norm);
  const std::string embedding =
      family.pipeline_plan.before.empty() ? "embed_tokens" : family.pipeline_plan.before.front();
  const double embedding_share = tp > 1 && vocabulary_split(family, embedding) ? 1.0 / d(tp) : 1.0;
  const double head_share = tp > 1 && vocabulary_split(family, "lm_head") ? 1.0 / d(tp) : 1.0;

  // The cut: the plugin's (parallel::PipelineStages) over the layers' parameter counts.
  const std::vector<double> layer_costs(static_cast<std::size_t>(c.num_hidden_layers), layer_whole);
  std::vector<parallel::StageLayers> cuts;
  if (pp > 1)
    cuts = parallel::balance_stages(layer_costs, 0.0, v * h, pp * chunks);
  else
    cuts = {{0, c.num_hidden_layers}};

  const ActivationTerms act = activation_terms(c, s, tp);
  const double element = half_precision(s.precision) ? 2.0 : 4.0;
  const double tokens = d(s.micro_batch) * d(s.sequence_length);
  const double micro_batches = d(out.micro_batches);
  out.bubble =
      pp > 1 ? parallel::pipeline_bubble_fraction(pp, static_cast<int>(out.micro_batches), chunks)
             : 0.0;
  for (int stage = 0; stage < pp; ++stage) {
    HybridStage st;
    st.stage = stage;
    st.first = stage == 0;
    st.last = stage == pp - 1;
    std::vector<parallel::StageLayers> ranges;
    std::int64_t widest_chunk = 0;
    for (int chunk = 0; chunk < (pp > 1 ? chunks : 1); ++chunk) {
      const parallel::StageLayers& range = cuts[static_cast<std::size_t>(chunk * pp + stage)];
      ranges.push_back(range);
      st.layer_count += range.end - range.first;
      st.chunk_layers.push_back(range.end - range.first);
      widest_chunk = std::max(widest_chunk, range.end - range.first);
    }
    st.layers = describe(ranges);
    const double layers = d(st.layer_count);
    st.parameters = layers * layer_rank;
    st.whole_parameters = layers * layer_whole;
    if (st.first) {
      st.parameters += v * h * embedding_share + before_rest;
      st.whole_parameters += v * h + before_rest;
    }
    if (st.last) {
      st.parameters += final_norm;
      st.whole_parameters += final_norm;
      // The head's own weight, or the tied embedding's copy when another stage holds the lookup.
      if (head_whole > 0.0 || pp > 1) {
        st.parameters += v * h * head_share;
        st.whole_parameters += v * h;
      }
    }
    st.trainable = lora ? layers * layer_lora : st.parameters;
    // Products: every tensor the stage holds but the input embedding (a lookup; the head's
    // matrix, tied or not, is a product).
    st.compute_parameters = st.parameters + (lora ? st.trainable : 0.0) -
                            (st.first ? v * h * embedding_share + before_rest : 0.0);
    // With one stage a tied head is the embedding's matrix, held once but a product too.
    if (st.last && pp == 1 && head_whole == 0.0 && family.causal_lm)
      st.compute_parameters += v * h * head_share;
    const double per_layer = layer_rank + (lora ? layer_lora : 0.0);
    double in_layers = 0.0;
    for (std::int64_t n : st.chunk_layers) {
      st.chunk_compute_parameters.push_back(d(n) * per_layer);
      in_layers += d(n) * per_layer;
    }
    st.chunk_compute_parameters.back() += st.compute_parameters - in_layers;

    // Activations: the schedule's most chunk micro-batches alive on this stage, each holding its
    // chunk's layers (only their inputs under activation checkpointing, one layer recomputed at a
    // time), the loss head's on the last stage.
    const std::vector<parallel::PipelineAction> actions =
        pp > 1 ? parallel::interleaved_one_f_one_b(stage, pp, chunks,
                                                   static_cast<int>(out.micro_batches))
               : std::vector<parallel::PipelineAction>{{parallel::PipelineAction::Forward, 0}};
    st.micro_batches_held = pp > 1 ? parallel::most_activations_held(actions) : 1;
    const double held = d(st.micro_batches_held);
    const double chunk_layers = d(widest_chunk);
    const double stack = s.activation_checkpointing ? held * chunk_layers * act.boundary + act.layer
                                                    : held * chunk_layers * act.layer;
    st.activation_bytes = (stack + (st.last ? act.head : 0.0)) * kActivationOverhead;

    // Traffic per step. The tensor group (Megatron's scheme, per micro-batch of n tokens): an
    // all-reduce of n·h for the embedding's output, two per layer forward (attention's and the
    // MLP's outputs; again when the layer is recomputed) and two backward, one for the head's
    // input gradient, two of n floats and an all-gather of n maxima for the loss; then the
    // clipping norm's scalar.
    if (tp > 1) {
      const double forward = s.activation_checkpointing ? 4.0 : 2.0;
      const double reduces =
          (forward + 2.0) * layers + (st.first ? 1.0 : 0.0) + (st.last ? 1.0 : 0.0);
      const double reduced_bytes =
          reduces * tokens * h * element + (st.last ? 2.0 * tokens * 4.0 : 0.0);
      const double gathered_bytes = st.last ? d(tp) * tokens * 4.0 : 0.0;
      const double ring = d(tp - 1) / d(tp);
      st.tensor_bytes =
          micro_batches * (2.0 * ring * reduced_bytes + ring * gathered_bytes) + 2.0 * ring * 4.0;
      st.tensor_calls =
          static_cast<std::int64_t>(micro_batches * (reduces + (st.last ? 3.0 : 0.0)) + 1.0);
      if (s.sequence_parallel) {
        // Each all-reduce in the layers an all-gather and a reduce-scatter (the same bytes, twice
        // the calls); more: the positions gathered again in backward for the weights' gradients
        // of q/k/v and of gate/up (full fine-tuning), and the gathers entering the layers (in
        // backward) and leaving them.
        const double regathers =
            (lora ? 0.0 : 2.0) * layers + (st.first ? 1.0 : 0.0) + (st.last ? 1.0 : 0.0);
        st.tensor_bytes += micro_batches * ring * regathers * tokens * h * element;
        st.tensor_calls +=
            static_cast<std::int64_t>(micro_batches * ((forward + 2.0) * layers + regathers));
      }
    }
    // The pipeline: each chunk's activations to the next virtual stage, their gradients back.
    if (pp > 1) {
      const int virtual_stages = pp * chunks;
      std::int64_t sends = 0;
      for (int chunk = 0; chunk < chunks; ++chunk) {
        const int virtual_stage = chunk * pp + stage;
        if (virtual_stage < virtual_stages - 1) ++sends;  // forward
        if (virtual_stage > 0) ++sends;                   // backward
      }
      st.pipeline_sends = out.micro_batches * sends;
      // Under sequence parallelism each rank sends its block of the positions (the last padded).
      const double sent = out.sequence_parallel
                              ? d(s.micro_batch) * std::ceil(d(s.sequence_length) / d(tp))
                              : tokens;
      st.pipeline_bytes = d(st.pipeline_sends) * sent * h * element;
    }
    // The data-parallel group: every float32 gradient all-reduced once a step, in buckets
    // (ZeRO-2: reduce-scattered in every micro-batch); with ZeRO the updated shares gathered after,
    // 25 MiB of float32 elements a member per call (plugins/single/dense_training.cpp).
    st.replicas = out.dp;
    if (out.dp > 1) {
      const double gradients = st.trainable * 4.0;
      const double buckets = std::ceil(
          gradients / d(static_cast<std::int64_t>(std::max<std::uint64_t>(bucket_bytes, 1))));
      if (s.zero_stage == 2) {  // each micro-batch's reduce-scattered: (dp − 1) / dp of them
        st.data_bytes = micro_batches * d(out.dp - 1) / d(out.dp) * gradients;
        st.data_calls = static_cast<std::int64_t>(micro_batches * buckets);
      } else {
        st.data_bytes = 2.0 * d(out.dp - 1) / d(out.dp) * gradients;
        st.data_calls = static_cast<std::int64_t>(buckets);
      }
      if (s.zero_stage >= 1) {
        st.data_gather_bytes = d(out.dp - 1) / d(out.dp) * st.trainable * element;
        st.data_bytes += st.data_gather_bytes;
        st.data_calls += static_cast<std::int64_t>(
            std::ceil(st.trainable / d(out.dp) / d(std::int64_t{25} << 18)));
      }
    }
    out.stages.push_back(std::move(st));
  }
  return out;
}

void hybrid_memory(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                   std::uint64_t checkpoint_bytes, int world_size) {
  const auto counts = cost::counts_of(c, s);
  const double n = counts.n, trainable = counts.trainable;
  // One rank of a dp × pp × tp mesh (plugins/hybrid): the stage that holds the most, its
  // blocks of its layers' tensors (and of the embedding or head), trained as ddp's replicas
  // (autograd's gradients and float32 buckets, AdamW's moments), with the activations of the
  // micro-batches its 1F1B schedule keeps alive. Loading reads only the stage's tensors, whole
  // in float32 before the split, through the memory-mapped checkpoint.
  const HybridLayout layout = hybrid_layout(c, s, world_size, kDefaultBucketBytes);
  const HybridStage& st = layout.heaviest(s);
  const HybridStageMemory held = hybrid_stage_memory(st, s);
  e.weights = to_bytes(held.weights);
  e.gradient_buckets = to_bytes(held.gradient_buckets);
  e.gradients = to_bytes(held.gradients);
  e.optimizer = to_bytes(held.optimizer);
  e.activations = to_bytes(held.activations);
  e.update_gradients = 0;
  // Checkpoints (the last one at least, after the final step) are written by rank 0, which
  // gathers every trainable tensor whole with its two moments (every stage's) beside its own
  // stage's training state at rest: at tp 2 on a 21M llama the rank's peak.
  const HybridStageMemory writer = hybrid_stage_memory(layout.stages.front(), s);
  e.save_peak = to_bytes(writer.weights + writer.gradient_buckets + writer.optimizer +
                         trainable * 12.0 + static_cast<double>(kRuntimeBaselineBytes));
  const double share = n > 0.0 ? std::min(1.0, st.whole_parameters / n) : 1.0;
  e.load_peak = to_bytes(st.whole_parameters * 4.0 + share * static_cast<double>(checkpoint_bytes) +
                         static_cast<double>(kRuntimeBaselineBytes));
}

Communication hybrid_communication(const hf::ModelConfig& c, const Settings& s, int world_size,
                                   std::uint64_t bucket_bytes) {
  Communication out;
  // The busiest rank's: its tensor group's all-reduces and all-gathers, its pipeline sends
  // and its data-parallel all-reduce (plan/hybrid_cost.h), all on the step's critical path.
  const HybridLayout layout = hybrid_layout(c, s, world_size, bucket_bytes);
  for (const HybridStage& st : layout.stages) {
    const double bytes = st.tensor_bytes + st.pipeline_bytes + st.data_bytes;
    if (bytes < d(static_cast<std::int64_t>(out.bytes))) continue;
    out.blocking_calls = st.tensor_calls;
    out.tensor_bytes = to_bytes(st.tensor_bytes);
    out.pipeline_bytes = to_bytes(st.pipeline_bytes);
    out.gradient_bytes = to_bytes(st.data_bytes - st.data_gather_bytes);
    out.all_gather_bytes = to_bytes(st.data_gather_bytes);
    out.bytes = to_bytes(bytes);
    out.calls = st.tensor_calls + st.pipeline_sends + st.data_calls;
  }
  return out;
}

double hybrid_compute_seconds(const hf::ModelConfig& c, const Settings& s, int world_size,
                              double tokens, double rank_flops) {
  if (!(rank_flops > 0)) return 0.0;
  const HybridLayout layout = hybrid_layout(c, s, world_size, kDefaultBucketBytes);
  const double sequence = sequence_of(s, tokens);
  const double micro_tokens = tokens / d(layout.micro_batches);
  const auto virtual_stages = static_cast<std::size_t>(layout.pp * layout.chunks);
  std::vector<double> forward(virtual_stages, 0.0), backward(virtual_stages, 0.0);
  double update = 0.0;
  for (const HybridStage& st : layout.stages) {
    for (std::size_t k = 0; k < st.chunk_layers.size(); ++k) {
      const double layers = d(st.chunk_layers[k]);
      const StepWork work{st.chunk_compute_parameters[k],
                          attention_flops(c, layers, sequence, layout.tp)};
      const double flops = step_flops(s, work, micro_tokens);
      const double forward_flops = (2.0 * work.products + work.attention) * micro_tokens;
      const double ops = (120.0 * layers + (st.first && k == 0 ? 40.0 : 0.0)) * kSecondsPerOp;
      const double seconds = flops / rank_flops + ops;
      const std::size_t g =
          k * static_cast<std::size_t>(layout.pp) + static_cast<std::size_t>(st.stage);
      forward[g] = flops > 0.0 ? seconds * forward_flops / flops : 0.0;
      backward[g] = seconds - forward[g];
    }
    update = std::max(update, (130.0 * d(st.layer_count) + 60.0) * kSecondsPerOp);
  }
  return parallel::simulate_pipeline(layout.pp, static_cast<int>(layout.micro_batches), forward,
                                     backward, nullptr, layout.chunks) +
         update;
}

std::string hybrid_phrase(const Settings& s) {
  return "hybrid tp " + std::to_string(s.tp_size) + " × pp " + std::to_string(s.pp_size) +
         (s.pp_chunks > 1 ? " (" + std::to_string(s.pp_chunks) + " chunks a stage)" : "") +
         (s.sequence_parallel ? " with sequence parallelism" : "") +
         (s.zero_stage > 0 ? std::string(s.sequence_parallel ? " and" : " with") + " ZeRO-" +
                                 std::to_string(s.zero_stage)
                           : "");
}

std::string hybrid_family(const Settings& s) {
  return s.tp_size > 1 && s.pp_size > 1 ? "tensor × pipeline parallel"
         : s.tp_size > 1                ? "tensor parallel"
                                        : "pipeline parallel";
}

std::string hybrid_saves_memory_by(const Settings& s) {
  std::vector<std::string> costs;
  if (s.tp_size > 1)
    costs.push_back(s.sequence_parallel
                        ? "all-gathers and reduce-scatters of activations in every layer"
                        : "all-reduces of activations in every layer");
  if (s.pp_size > 1) costs.push_back("idle time while the pipeline fills and drains");
  if (s.zero_stage > 0) costs.push_back("an all-gather of the updated parameters every step");
  std::string out;
  for (std::size_t i = 0; i < costs.size(); ++i)
    out += (i == 0 ? "" : i + 1 == costs.size() ? " and " : ", ") + costs[i];
  return out;
}

void hybrid_layouts(const hf::ModelConfig& c, int processes, const Settings& base,
                    const Settings* written, std::vector<Settings>& out) {
  if (written != nullptr) {
    out.push_back(with_layout(base, *written));
    return;
  }
  Settings t = base;
  for (int tp : {1, 2, 4, 8})
    for (int pp : {1, 2, 4, 8}) {
      if (tp * pp == 1 || processes % (tp * pp) != 0) continue;
      try {
        if (tp > 1) hf::check_tensor_parallel(c, tp);
        if (pp > 1) hf::check_pipeline_parallel(c, pp);
      } catch (const Error&) {
        continue;
      }
      t.tp_size = tp;
      t.pp_size = pp;
      for (const bool sequence : {false, true}) {
        if (sequence && tp == 1) continue;
        for (const int zero : {0, 1, 2}) {
          if (zero > 0 && processes / (tp * pp) == 1) continue;
          t.sequence_parallel = sequence;
          t.zero_stage = zero;
          out.push_back(t);
        }
      }
    }
}

std::string hybrid_held(const HybridLayout& layout) {
  std::string stages;
  for (const HybridStage& st : layout.stages)
    stages += (stages.empty() ? "" : ", ") + std::string("stage ") + std::to_string(st.stage) +
              " " + st.layers + (st.first ? " with the embedding" : "") +
              (st.last ? std::string(st.first ? " and" : " with") + " the head" : "");
  char bubble[32];
  std::snprintf(bubble, sizeof bubble, "%.0f%%", layout.bubble * 100.0);
  std::string out = layout.pp > 1 ? "the layers cut into " + std::to_string(layout.pp) +
                                        " pipeline stages balanced by cost (" + stages + ")"
                                  : std::string("every layer on every rank");
  if (layout.tp > 1)
    out += ", each stage's tensors split over " + std::to_string(layout.tp) +
           " ranks (heads, MLP width and vocabulary)" +
           (layout.sequence_parallel
                ? ", the layers' norms and residuals on 1/" + std::to_string(layout.tp) +
                      " of the positions each (sequence parallelism)"
                : "");
  if (layout.dp > 1)
    out += ", " + std::to_string(layout.dp) + " replicas of that averaging their gradients" +
           (layout.zero_stage == 1 ? ", each keeping and updating 1/" + std::to_string(layout.dp) +
                                         " of the optimizer state (ZeRO-1)"
            : layout.zero_stage == 2
                ? ", each keeping and updating 1/" + std::to_string(layout.dp) +
                      " of the optimizer state and of the averaged gradients, reduce-scattered "
                      "in every micro-batch's backward (ZeRO-2)"
                : "");
  if (layout.pp > 1)
    out += "; the " + std::string(layout.chunks > 1 ? "interleaved " : "") + "1F1B schedule over " +
           std::to_string(layout.micro_batches) + " micro-batches keeps at most " +
           std::to_string(layout.stages.front().micro_batches_held) +
           " micro-batches' activations on stage 0 and idles each stage " + bubble +
           " of the step, (pp − 1) / (" + (layout.chunks > 1 ? "chunks · " : "") +
           "micro-batches + pp − 1)";
  return out;
}

std::string hybrid_held_by_rank(const hf::ModelConfig& c, const Settings& s, std::uint64_t,
                                int world_size) {
  return hybrid_held(hybrid_layout(c, s, world_size, kDefaultBucketBytes));
}

job::StrategySpec hybrid_written_as(const Settings& s) {
  return {"hybrid",
          {{"tp_size", s.tp_size},
           {"pp_size", s.pp_size},
           {"zero_stage", s.zero_stage},
           {"sequence_parallel", s.sequence_parallel},
           {"device", "cpu"}}};
}

bool hybrid_valid(const Settings& s) {
  return s.zero_stage >= 0 && s.zero_stage <= 2;
}

}  // namespace tessera::plan
