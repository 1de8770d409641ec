#pragma once
// `gemini` on several processes (ZeRO-3 over the data-parallel group): every chunk of parameters
// is split into W equal shards (the chunk padded to a multiple of W) and rank r keeps shard r of
// each — its parameter values, and for trainable chunks the float32 gradient of that shard and
// its optimizer state (Adam moments; float32 masters in bf16). A chunk is all-gathered into a
// whole temporary chunk when a block computes with it (forward, and again before its backward),
// the module parameters being views of it, and released when others need the room; the next
// chunk of the order traced on the first step is gathered ahead asynchronously. A chunk's
// gradients are reduce-scattered (mean) into the owners' shards as soon as all its tensors have
// theirs, on every micro-batch, so no whole gradient outlives the backward that made it. The
// update runs on the shard with the fused CPU Adam; clipping all-reduces the squared shard norms.
// Chunks holding a tensor no block fetches (LoRA's adapters) stay gathered and are gathered
// again after each update. With offload_optim_frac, the optimizer shards of that share of the
// trainable chunks live in the rank's own disk tier and stream through the update (disk_chunks.h,
// as in the one-process plugin) with their reduced gradient shards, written there after each
// micro-batch (no device tier); with the parameter shards in memory that update runs behind the
// next forward (update_pipeline.h), each block waiting for its own chunks; with offload_param_frac,
// the parameter shards of that share of the chunks (not LoRA's adapters) live there too, read when
// their chunk is gathered and streamed through the update. Placement auto puts every parameter
// shard there and, after the first step, keeps as many in memory as the rank's share of host_budget
// leaves beside the rest of the process (its measured peak). With a device tier (a GPU per rank, or
// the simulated device) the gathered chunks and the gradient chunks live in device memory and the
// collectives run there (NCCL between GPUs), and so do the shards and their optimizer state but
// for the shares host_param_frac / host_optim_frac in host memory and those on disk: a gather of a
// host shard copies it up first, a reduction of a chunk updated on the host copies the rank's
// shard of the result down; a chunk whose optimizer shard is on the device is updated there by
// torch's fused AdamW (the hybrid Adam). The single-process plugin is gemini_plugin.cpp; the registered `gemini` chooses between
// them by the world size (gemini_front.cpp), or takes this one for one process too where the
// tests ask (kShardedOneProcessVariable): a group of one, which in host memory gathers a chunk
// as its shard's own memory and adds gradients up in the step's shard (with a device tier it
// copies the shard up and the gradients down, without collectives).
#include <cstdint>
#include <memory>

namespace tessera::train {
class Plugin;
}

namespace tessera::plugins {

// Set to 1 (tests only: the GPU check on a machine with one GPU), the sharded plugin runs one
// process too, so that its device tier runs on that GPU.
inline constexpr const char* kShardedOneProcessVariable = "TESSERA_GEMINI_SHARDED_ONE_PROCESS";

// The single-process plugin (gemini_plugin.cpp) and the sharded one (sharded_gemini.cpp).
std::unique_ptr<train::Plugin> make_one_process_gemini();
std::unique_ptr<train::Plugin> make_sharded_gemini();

// What a sharded gemini rank holds, counted from its buffers (for tests, against memory()).
struct GeminiShardHeld {
  int world_size = 0;
  std::int64_t chunks = 0;
  std::int64_t chunk_elements = 0;            // Σ padded chunk sizes (every parameter, every rank)
  std::int64_t shard_elements = 0;            // Σ this rank's shard sizes
  std::int64_t trainable_elements = 0;        // trainable tensors' elements, whole
  std::int64_t trainable_shard_elements = 0;  // elements of trainable tensors in this rank's shards
  std::uint64_t parameter_shard_bytes = 0;    // compute dtype
  std::uint64_t gathered_bytes = 0;           // whole chunks in memory now
  std::uint64_t master_bytes = 0;             // float32 masters (bf16)
  std::uint64_t moment_bytes = 0;             // Adam m and v (in memory)
  // Optimizer shards on disk (offload_optim_frac), their bytes without the I/O padding.
  std::int64_t offloaded_chunks = 0;
  std::uint64_t offloaded_moment_bytes = 0;
  std::uint64_t offloaded_master_bytes = 0;
  // Parameter shards on disk (offload_param_frac), their bytes without the I/O padding.
  std::int64_t offloaded_parameter_chunks = 0;
  std::uint64_t offloaded_parameter_bytes = 0;
  std::uint64_t cached_parameter_bytes = 0;  // of those, resident now
  std::int64_t cached_parameter_limit = 0;   // shards of on-disk chunks kept resident at most
  std::uint64_t gradient_bytes = 0;          // reduced shards, whole gradient chunks, in flight
  // Reduced gradient shards in the disk tier (beside an optimizer shard there), unpadded.
  std::uint64_t offloaded_gradient_bytes = 0;
  std::uint64_t all_gathers = 0;  // since prepare()
  std::uint64_t reduce_scatters = 0;
  std::uint64_t prefetched = 0;  // gathers started ahead of their use
  // Chunks whose update runs behind the next forward (optimizer shards on disk), and the steps
  // whose update did so.
  std::int64_t pipelined_chunks = 0;
  std::uint64_t updates_behind = 0;
};

// Through the registered `gemini` (gemini_front.cpp): false unless `plugin` runs sharded.
bool gemini_shard_held(const train::Plugin& plugin, GeminiShardHeld* held);
// The same on the sharded plugin itself (sharded_gemini.cpp).
bool sharded_gemini_held(const train::Plugin& sharded, GeminiShardHeld* held);

}  // namespace tessera::plugins
