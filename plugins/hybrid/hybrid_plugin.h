#pragma once
// The `hybrid` plugin: tensor parallelism × data parallelism. The model is split over the rank's
// tensor group by its family's plan (engine/parallel/split_model.h: attention by heads, the MLP
// by its inner width, embedding and head by the vocabulary, the loss computed from the
// vocabulary blocks), each rank training its blocks with AdamW as `single` does (DenseTraining);
// the tp-split replicas in the data group average their gradients in ddp's buckets while backward
// runs. Clipping takes the norm over every block of every tensor group. Checkpoints hold whole
// tensors (gathered from the blocks), so any layout — single, ddp, another tp — resumes them,
// and the export is the ordinary HF folder.
// Options (job spec strategy.options, job/strategies.h): device = auto | cpu, tp_size = 2 | 1 | 4
// | 8, pp_size = 1. LoRA's adapters are split like their layers. Not yet: CUDA, pipeline stages,
// sequence parallelism, families without a tensor-parallel plan (bert): each refused with that
// said.

namespace tessera::plugins {

// Registers "hybrid" in the plugin registry (train/plugin_registry.h).
void register_hybrid_plugin();

}  // namespace tessera::plugins
