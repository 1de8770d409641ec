#pragma once
// The `zero` plugin: data parallelism over the job's data-parallel group with the optimizer
// state sharded (ZeRO, as DeepSpeed and Colossal-AI's LowLevelZeroPlugin describe it). Every
// rank computes with the whole model; of each trainable tensor of n elements, rank r of W owns
// elements [r·c, (r+1)·c), c = ⌈n / W⌉: their float32 masters and AdamW moments, which it alone
// updates, after which the updated parameters are all-gathered so every rank holds the whole
// compute-dtype weights again.
//   stage 1: the optimizer state sharded; gradients all-reduced whole in buckets while backward
//            runs (as ddp), each rank reading its share.
//   stage 2: in addition each bucket is reduce-scattered while backward runs (every
//            micro-batch), so a rank keeps only its share of the gradients.
// Clipping uses the global norm: the squared norms of the shards, all-reduced. The checkpoint
// state is sharded by element ranges (Plugin::state_slices()), readable on any layout.
// Options (job spec strategy.options, job/strategies.h): stage = 1 (default) | 2,
// offload_optimizer = false | true, bucket_size = auto (25 MiB) | a size, device = auto | cpu.
// See plugins/README.md.
#include <cstdint>

#include "parallel/bucket_trace.h"

namespace tessera::train {
class Plugin;
}

namespace tessera::plugins {

// Registers "zero" in the plugin registry (train/plugin_registry.h).
void register_zero_plugin();

// What a prepared zero plugin holds on this rank, counted from its tensors (for tests that check
// memory() against them), or nullopt-like zeros when `plugin` is not a prepared zero plugin.
struct ZeroHeld {
  int stage = 0;
  std::int64_t shard_elements = 0;   // trainable elements this rank owns (masters, each moment)
  std::int64_t total_elements = 0;   // trainable elements of the whole model
  std::uint64_t master_bytes = 0;    // float32 masters apart from the compute copies (bf16)
  std::uint64_t moment_bytes = 0;    // AdamW's m and v as allocated
  std::uint64_t gradient_bytes = 0;  // gradient buffers alive now (buckets, shard gradients)
};
bool zero_held(const train::Plugin& plugin, ZeroHeld* held);
// The bucket trace of a prepared zero plugin, else nullptr.
const parallel::BucketTrace* zero_trace(const train::Plugin& plugin);

}  // namespace tessera::plugins
