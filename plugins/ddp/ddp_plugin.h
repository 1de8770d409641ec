#pragma once
// The `ddp` plugin: data parallelism over the job's data-parallel group (engine/dist). Every rank
// holds the whole model and optimizer state (as `single`, whose DenseTraining it shares) and
// trains on its own micro-batches; gradients are all-reduced (averaged) in buckets of about
// `bucket_size` bytes while backward still runs. See plugins/README.md.
// Options (job spec strategy.options, job/strategies.h): device = auto | cpu (cuda not yet),
// bucket_size = auto (25 MiB) | a size.
#include "parallel/bucket_trace.h"

namespace tessera::train {
class Plugin;
}

namespace tessera::plugins {

// Registers "ddp" in the plugin registry (train/plugin_registry.h).
void register_ddp_plugin();

// What the last backward that reduced gradients did (parallel/gradient_buckets.h).
using DdpTrace = parallel::BucketTrace;

// The trace of `plugin` when it is a prepared ddp plugin, else nullptr.
const DdpTrace* ddp_trace(const train::Plugin& plugin);

}  // namespace tessera::plugins
