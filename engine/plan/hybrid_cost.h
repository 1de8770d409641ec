#pragma once
// The cost model of strategy hybrid (plugins/hybrid): what one rank of a dp × pp × tp mesh holds
// and sends per step, from config.json alone. The stages are cut as the plugin cuts them
// (parallel::balance_stages over the layers' parameter counts, the head's vocabulary × hidden on
// the last), the tensors split by the family's tensor-parallel plan (hf::tensor_parallel_plan),
// the activations held as the 1F1B schedule holds them (parallel::most_activations_held), the
// traffic as Megatron's scheme moves it. Torch-free.
#include <cstdint>
#include <string>
#include <vector>

#include "hf/config.h"
#include "job/job_spec.h"
#include "plan/settings.h"

namespace tessera::plan {

struct MemoryEstimate;  // plan/planner.h
struct Communication;

// One pipeline stage: every rank of its tensor group holds as much (tp divides the split sizes;
// a kv head held by several ranks is the same block size on each).
struct HybridStage {
  int stage = 0;
  std::string layers;            // "layers 0-1" (interleaved: "layers 0, 2")
  std::int64_t layer_count = 0;  // of all its chunks
  bool first = false, last = false;
  double parameters = 0;          // elements one rank holds (its blocks of its stage's tensors)
  double trainable = 0;           // of those trained (LoRA: its blocks of its stage's adapters)
  double whole_parameters = 0;    // the stage's tensors whole: what loading reads before the split
  double compute_parameters = 0;  // elements whose products one rank computes (FLOPs ∝ these)
  // Per model chunk of the stage (virtual stage chunk · pp + stage): its layers and its share of
  // compute_parameters (the head's on the last chunk of the last stage).
  std::vector<std::int64_t> chunk_layers;
  std::vector<double> chunk_compute_parameters;
  int micro_batches_held = 0;   // chunk activations alive at the stage's peak (1F1B)
  double activation_bytes = 0;  // saved for backward at that peak (with kActivationOverhead)
  // Per step: ring bytes through one rank of the tensor group (all-reduces 2(tp−1)/tp of their
  // bytes, all-gathers (tp−1)/tp), and its calls; bytes this stage sends to its neighbours
  // (activations forward, their gradients backward), and its sends.
  double tensor_bytes = 0;
  std::int64_t tensor_calls = 0;
  double pipeline_bytes = 0;
  std::int64_t pipeline_sends = 0;
  // Ring bytes of the data-parallel all-reduce of its float32 gradients (zero_stage 2: the
  // reduce-scatter of every micro-batch's) and, with zero_stage 1 or 2,
  // of the all-gather of the updated shares in the compute dtype (data_gather_bytes of
  // data_bytes), and their calls.
  double data_bytes = 0;
  double data_gather_bytes = 0;
  std::int64_t data_calls = 0;
  int replicas = 1;  // data-parallel replicas of this stage (dp)
};

struct HybridLayout {
  int tp = 1, pp = 1, dp = 1, chunks = 1;
  int zero_stage = 0;              // 1 or 2 over dp > 1 replicas (else 0)
  bool sequence_parallel = false;  // with tp > 1
  std::int64_t micro_batches = 1;  // per step, per pipeline
  double bubble = 0.0;             // parallel::pipeline_bubble_fraction
  std::vector<HybridStage> stages;
  // The stage whose rank holds the most at its training peak (weights, gradients with their
  // buckets, optimizer state and activations).
  const HybridStage& heaviest(const Settings& s) const;
};

// `world_size` ranks with the settings' tp_size, pp_size, pp_chunks (dp the rest).
// `bucket_bytes`: the data-parallel gradient buckets' size.
HybridLayout hybrid_layout(const hf::ModelConfig& config, const Settings& s, int world_size,
                           std::uint64_t bucket_bytes);

// One rank of a stage at its training peak, in bytes: its blocks in the compute dtype (with
// float32 masters in bf16), autograd's gradients and the float32 buckets they are copied into
// (ddp's replicas: plugins/ddp/replica_training), AdamW's moments, the activations. With
// zero_stage 1 the masters and moments are 1 / dp of the blocks' (ZeRO-1 over the replicas); with
// 2 the averaged float32 gradients too, besides two buckets in flight (ZeRO-2).
struct HybridStageMemory {
  double weights = 0;
  double gradients = 0;  // gradient_buckets included
  double gradient_buckets = 0;
  double optimizer = 0;
  double activations = 0;
  double total() const { return weights + gradients + optimizer + activations; }
};
HybridStageMemory hybrid_stage_memory(const HybridStage& stage, const Settings& s);

// One rank's memory: the stage that holds the most (its blocks, gradients with their buckets,
// optimizer state, the activations its schedule keeps), refining single's estimate `e`; the
// writer's checkpoint peak and the stage's load.
void hybrid_memory(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                   std::uint64_t checkpoint_bytes, int world_size);
// Bytes and calls per step through the busiest rank: its tensor group's collectives (each a
// blocking call), its pipeline sends and its replicas' all-reduce.
Communication hybrid_communication(const hf::ModelConfig& c, const Settings& s, int world_size,
                                   std::uint64_t bucket_bytes);

// One rank's compute per step at `rank_flops`: the pipeline's schedule run with each model chunk's
// forward and backward of one micro-batch (parallel::simulate_pipeline: the slowest stage paces
// it, the others' fill and drain add their own time), then the slowest stage's update.
double hybrid_compute_seconds(const hf::ModelConfig& c, const Settings& s, int world_size,
                              double tokens, double rank_flops);

// "hybrid tp 2 × pp 2 (2 chunks a stage) with sequence parallelism and ZeRO-1": the layout as
// the plan's reasons name it.
std::string hybrid_phrase(const Settings& s);
// "tensor parallel", "pipeline parallel" or "tensor × pipeline parallel": the families of
// layouts the plan's explanation names once each.
std::string hybrid_family(const Settings& s);
// What a layout pays for the memory it saves: the tensor group's collectives in every layer, the
// pipeline's idle time, ZeRO's gathers of the updated shares.
std::string hybrid_saves_memory_by(const Settings& s);
// What a rank of a hybrid layout holds, in words: its stages, the tensor split, the replicas, the
// schedule and its bubble.
std::string hybrid_held(const HybridLayout& layout);
// The same for `s` over `world_size` ranks (StrategyCost::held).
std::string hybrid_held_by_rank(const hf::ModelConfig& c, const Settings& s,
                                std::uint64_t checkpoint_bytes, int world_size);
// The strategy `auto` writes for a hybrid layout: its sizes, on the CPU (CUDA under hybrid is not
// supported yet).
job::StrategySpec hybrid_written_as(const Settings& s);
// Its layouts: ZeRO stage 0, 1 or 2 over the replicas.
bool hybrid_valid(const Settings& s);
// The layouts the planner weighs (StrategyCost::layouts): the spec's own (`written`), else every
// tp × pp of 1, 2, 4 or 8 each (not both 1: that is ddp) that divides the processes and the model
// (hf's checks, as the launch makes them), each plain, then with ZeRO-1 and ZeRO-2 over its
// replicas, then with sequence parallelism: a tie in step time keeps the plainer.
void hybrid_layouts(const hf::ModelConfig& c, int processes, const Settings& base,
                    const Settings* written, std::vector<Settings>& out);

}  // namespace tessera::plan
