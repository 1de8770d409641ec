#pragma once
// The `gemini` plugin (Colossal-AI's Gemini, one process, CPU): every parameter — trainable or
// frozen, the LoRA base included — lives in fixed-size chunks of the compute dtype (module
// parameters are views into chunk memory); the optimizer state of the trainable ones (Adam
// moments, and the float32 masters of bf16 training) lives in optimizer chunks beside them,
// placed on the host or on disk. Parameter chunks on disk come into memory when a block uses
// them (its forward, and again before its backward) and leave when others need the room. The
// update streams the optimizer chunks through the fused CPU
// Adam in order, reading the next on-disk chunk while the current one is updated and writing
// the previous one back behind it. Checkpoints read the on-disk state through memory maps, so
// the whole optimizer state is never in RAM at once.
//
// Options (job spec strategy.options; validated by job/strategies.h):
//   placement           "static" (the fractions below decide where chunks live) or "auto"
//                       (parameter chunks stream from disk; after the first step the cache of
//                       them grows to what host_budget leaves)
//   offload_optim_frac  0…1, the share of optimizer-chunk bytes kept on disk
//   offload_param_frac  0…1, the share of parameter-chunk bytes kept on disk; the model's
//                       blocks fetch them as they compute (model::ParameterUse) and at most
//                       a few stay cached in memory
//   offload_dir         folder for the disk tier (default: the run folder's offload/)
//   chunk_size          "auto" (searched to waste the fewest bytes) or a size ("64MiB")

namespace tessera::plugins {

// Registers "gemini" in the plugin registry (train/plugin_registry.h).
void register_gemini_plugin();

}  // namespace tessera::plugins
