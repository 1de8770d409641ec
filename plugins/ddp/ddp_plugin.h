#pragma once
// The `ddp` plugin: data parallelism over the job's data-parallel group (engine/dist). Every rank
// holds the whole model and optimizer state (as `single`, whose DenseTraining it shares) and
// trains on its own micro-batches; gradients are all-reduced (averaged) in buckets of about
// `bucket_size` bytes while backward still runs. See plugins/README.md.
// Options (job spec strategy.options, job/strategies.h): device = auto | cpu (cuda not yet),
// bucket_size = auto (25 MiB) | a size.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera::train {
class Plugin;
}

namespace tessera::plugins {

// Registers "ddp" in the plugin registry (train/plugin_registry.h).
void register_ddp_plugin();

inline constexpr std::uint64_t kDefaultBucketBytes = 25ull * 1024 * 1024;

// What the last backward that reduced gradients did, in seconds from its start: for tests and
// benchmarks that check communication overlaps backward.
struct DdpTrace {
  std::vector<std::size_t> bucket_tensors;  // tensors per bucket, in launch order
  std::vector<std::uint64_t> bucket_bytes;  // float32 bytes per bucket
  std::vector<double> launched_s;           // when each bucket's all_reduce was started
  double last_gradient_s = 0.0;             // when the last gradient came out of autograd
  double backward_end_s = 0.0;              // when autograd's backward returned
  double reduced_s = 0.0;                   // when every bucket's all_reduce was waited on
  std::uint64_t all_reduces = 0;            // buckets all-reduced since prepare(), every step
};

// The trace of `plugin` when it is a prepared ddp plugin, else nullptr.
const DdpTrace* ddp_trace(const train::Plugin& plugin);

}  // namespace tessera::plugins
