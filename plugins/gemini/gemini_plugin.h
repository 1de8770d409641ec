#pragma once
// The `gemini` plugin (Colossal-AI's Gemini; ZeRO-3 over the data-parallel group, one process being
// a group of one): every chunk of parameters — trainable or frozen, the LoRA base included — is
// split into W equal shards (the chunk padded to a multiple of W) and rank r keeps shard r of
// each: its parameter values, and for trainable chunks the float32 gradient of that shard and its
// optimizer state (Adam moments; float32 masters in bf16). A chunk is all-gathered into a whole
// temporary chunk when a block computes with it (forward, and again before its backward), the
// module parameters being views of it, and released when others need the room; the next chunk of
// the order traced on the first step is gathered ahead asynchronously. A chunk's gradients are
// reduce-scattered (mean) into the owners' shards as soon as all its tensors have theirs, on every
// micro-batch, so no whole gradient outlives the backward that made it. The update runs on the
// shard with the fused CPU Adam; clipping all-reduces the squared shard norms. A group of one
// computes on its shards in place (a gathered chunk is its shard's own memory) and adds gradients
// up in the step's shard: no collective, no copy.
//
// Chunks holding a tensor no block fetches (LoRA's adapters) stay gathered and are gathered again
// after each update. With offload_optim_frac, the optimizer shards of that share of the trainable
// chunks live in the rank's own disk tier and stream through the update in slices (disk_chunks.h)
// with their reduced gradient shards, written there after each micro-batch (no device tier); with
// the parameter shards in memory that update runs behind the next forward (update_pipeline.h),
// each block waiting for its own chunks; with offload_param_frac, the parameter shards of that
// share of the chunks (not LoRA's adapters) live there too, read when their chunk is gathered and
// streamed through the update. Placement auto puts every parameter shard there and, after the
// first step, keeps as many in memory as the rank's share of host_budget leaves beside the rest of
// the process (its measured peak).
//
// With a device tier (a GPU per rank, or the simulated device) the gathered chunks and the
// gradient chunks live in device memory and the collectives run there (NCCL between GPUs), and so
// do the shards and their optimizer state but for the shares host_param_frac / host_optim_frac in
// host memory and those on disk: a gather of a host shard copies it up first, a reduction of a
// chunk updated on the host copies the rank's shard of the result down; a chunk whose optimizer
// shard is on the device is updated there by torch's fused AdamW, the others by the CPU Adam (the
// hybrid Adam). Placement auto with a device starts every parameter shard in host memory and, after
// the first step, moves as many to the device as its measured peak leaves room for.
//
// Options (job spec strategy.options; validated by job/strategies.h, read by gemini_options.h):
// placement, offload_optim_frac, offload_param_frac, offload_dir, chunk_size, host_budget, and
// with a device host_param_frac, host_optim_frac, device_budget.
#include <cstdint>

namespace tessera::train {
class Plugin;
}

namespace tessera::plugins {

// Registers "gemini" in the plugin registry (train/plugin_registry.h).
void register_gemini_plugin();

// What a gemini rank holds, counted from its buffers (for tests, against memory()).
struct GeminiShardHeld {
  int world_size = 0;
  std::int64_t chunks = 0;
  std::int64_t chunk_elements = 0;            // Σ padded chunk sizes (every parameter, every rank)
  std::int64_t shard_elements = 0;            // Σ this rank's shard sizes
  std::int64_t trainable_elements = 0;        // trainable tensors' elements, whole
  std::int64_t trainable_shard_elements = 0;  // elements of trainable tensors in this rank's shards
  std::uint64_t parameter_shard_bytes = 0;    // compute dtype
  std::uint64_t gathered_bytes = 0;           // whole chunks in memory now
  std::int64_t gathered_chunks = 0;           // of those, gathered for blocks (not kept whole)
  std::uint64_t master_bytes = 0;             // float32 masters (bf16)
  std::uint64_t moment_bytes = 0;             // Adam m and v (in memory)
  // Optimizer shards on disk (offload_optim_frac), their bytes without the I/O padding; the one
  // read ahead (below) among them.
  std::int64_t offloaded_chunks = 0;
  std::uint64_t offloaded_moment_bytes = 0;
  std::uint64_t offloaded_master_bytes = 0;
  // Parameter shards on disk (offload_param_frac), their bytes without the I/O padding.
  std::int64_t offloaded_parameter_chunks = 0;
  std::uint64_t offloaded_parameter_bytes = 0;
  std::uint64_t cached_parameter_bytes = 0;  // of those, resident now
  std::int64_t cached_parameter_limit = 0;   // shards of on-disk chunks kept resident at most
  std::uint64_t gradient_bytes = 0;          // reduced shards, whole gradient chunks, in flight
  // Reduced gradient shards in the disk tier (beside an optimizer shard there), unpadded; the
  // one of the chunk read ahead among them once written.
  std::uint64_t offloaded_gradient_bytes = 0;
  std::uint64_t all_gathers = 0;  // since prepare()
  std::uint64_t reduce_scatters = 0;
  std::uint64_t prefetched = 0;  // gathers started ahead of their use
  // Chunks whose update runs behind the next forward (optimizer shards on disk), and the steps
  // whose update did so.
  std::int64_t pipelined_chunks = 0;
  std::uint64_t updates_behind = 0;
  // Steps whose first pipelined chunk's optimizer shard was read during backward. The chunk
  // read ahead for the next update, if one is now: its moments and masters in memory (also
  // counted in moment_bytes and master_bytes), its gradient shard kept in memory (in
  // gradient_bytes), and the bytes of its optimizer and gradient files.
  std::uint64_t read_aheads = 0;
  std::uint64_t read_ahead_moment_bytes = 0;
  std::uint64_t read_ahead_master_bytes = 0;
  std::uint64_t read_ahead_gradient_bytes = 0;
  std::uint64_t read_ahead_optimizer_file_bytes = 0;
  std::uint64_t read_ahead_gradient_file_bytes = 0;
};

// False unless `plugin` is the registered `gemini`.
bool gemini_shard_held(const train::Plugin& plugin, GeminiShardHeld* held);

}  // namespace tessera::plugins
