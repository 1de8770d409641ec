#pragma once
// The `hybrid` plugin: tensor × pipeline × data parallelism. The model is split over the rank's
// tensor group by its family's plan (engine/parallel/split_model.h: attention by heads, the MLP
// by its inner width, embedding and head by the vocabulary, the loss computed from the
// vocabulary blocks), each rank training its blocks with AdamW as `single` does (DenseTraining);
// the tp-split replicas in the data group average their gradients in ddp's buckets while backward
// runs. Clipping takes the norm over every block of every tensor group. Checkpoints hold whole
// tensors (gathered from the blocks), so any layout — single, ddp, another tp — resumes them,
// and the export is the ordinary HF folder.
// With pp_size above 1 the layers are cut into pipeline stages (engine/parallel/pipeline_stage.h):
// each rank holds its stage's parameters and runs the step's micro-batches in the 1F1B order
// itself (Plugin::run_micro_batches); a tied embedding's gradient is summed over the first and
// last stage, the clipping norm over every stage; checkpoints and the export gather every stage's
// tensors.
// zero_stage 1 makes the replicas ZeRO-1 (single's DenseTraining sharded over the data group):
// each keeps the masters and moments of 1 / dp of its blocks; checkpoints gather them whole.
// zero_stage 2 (ZeRO-2) also reduce-scatters every micro-batch's gradients (ReplicaTraining),
// each replica keeping its share of the average.
// Options (job spec strategy.options, job/strategies.h): device = auto | cpu, tp_size = 2 | 1 | 4
// | 8, pp_size = 1 | 2 | 4 | 8, pp_chunks = 1 | 2 | 4, zero_stage = 0 | 1 | 2, sequence_parallel =
// false | true (parallel/split_model.h; with pipeline stages the stages pass each rank's block of
// the positions). LoRA's adapters are split like their layers. device cuda computes on each
// rank's GPU (pipeline messages go through host memory). Not yet: families without a
// tensor-parallel plan (bert), refused with that said.

namespace tessera::plugins {

// Registers "hybrid" in the plugin registry (train/plugin_registry.h).
void register_hybrid_plugin();

}  // namespace tessera::plugins
