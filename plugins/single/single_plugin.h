#pragma once
// The `single` plugin: one process on one device (CUDA device 0 when present, else the CPU),
// AdamW with float32 masters for bf16/fp16 and dynamic loss scaling for fp16.
// Option (job spec strategy.options, job/strategies.h): device = auto | cpu | cuda.

namespace tessera::plugins {

// Registers "single" in the plugin registry (train/plugin_registry.h).
void register_single_plugin();

}  // namespace tessera::plugins
