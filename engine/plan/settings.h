#pragma once
// The settings a plan chooses for a job (and a measured step time is recorded under).
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::plan {

struct Settings {
  std::string method = "full";  // full | lora
  std::int64_t lora_rank = 8;
  std::vector<std::string> lora_targets;  // empty: the family's default
  // With lora: the frozen base's linear layers held as nf4 | fp4 | int8 (QLoRA); "none": dense.
  std::string quantize = "none";
  bool double_quant = false;       // 4-bit: the absmax double-quantized (a byte a block, not four)
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (a GPU's, with the loss scaler)
  std::int64_t micro_batch = 1;
  std::int64_t gradient_accumulation = 1;
  std::int64_t sequence_length = 512;
  bool activation_checkpointing = false;
  // Preference tuning: each example is two rows (chosen and rejected; KTO's example and its
  // mismatched row); DPO, IPO and KTO run a reference forward over every row, without gradients
  // (`reference_forward`: the base with LoRA's adapters off, or a frozen copy), and with full
  // fine-tuning or a named reference keep that copy in the compute dtype (`reference_copy`).
  std::int64_t rows_per_example = 1;
  bool reference_forward = false;
  bool reference_copy = false;
  // The plugin: "single", or "gemini" with this share of the optimizer state (Adam moments and
  // fp32 masters) on disk, and this share of the parameter chunks' bytes (every parameter, in
  // the compute dtype) on disk.
  // Over several processes: "ddp" (a whole replica per rank) or "zero" with zero_stage 1
  // (optimizer state and masters sharded) or 2 (gradients too).
  std::string strategy = "single";
  double offload_optim_frac = 0.0;
  double offload_param_frac = 0.0;
  int zero_stage = 0;  // 1 or 2 with strategy "zero", else 0
  // gemini on a GPU (its device tier): the chunks live on the GPU but for these shares of the
  // parameter chunks' and of the optimizer state's bytes kept in host memory (the offload_*
  // shares are on disk; parameter chunks on disk with a device are not supported).
  bool device_tier = false;
  double host_param_frac = 0.0;
  double host_optim_frac = 0.0;
  // ... on the tests' simulated device, which computes in host memory: only the chunks and the
  // gradients are device memory there.
  bool simulated_device = false;
  // The job computes on a GPU (or the simulated device), whatever the strategy: LoRA's frozen
  // tables then stay loaded (cost::table_in_file is for the CPU).
  bool on_gpu = false;
  // single's frozen_tables option: "file" leaves them in the checkpoint (cost::table_in_file).
  bool frozen_tables_in_file = true;
  // zero with offload_optimizer on a GPU (ZeRO-Offload): the shard's float32 masters and Adam
  // moments in host memory, updated there.
  bool zero_offload = false;
  // strategy "hybrid": a dp × pp × tp mesh (dp: the processes left), pp_chunks model chunks per
  // pipeline stage (interleaved 1F1B above 1).
  int tp_size = 1;
  int pp_size = 1;
  int pp_chunks = 1;
  bool sequence_parallel = false;  // hybrid's, with tp_size above 1
};

// Whether `precision` computes in two bytes a value (bf16, or fp16 on a GPU): what the estimates
// size weights, gradients and activations by.
inline bool half_precision(const std::string& precision) {
  return precision == "bf16" || precision == "fp16";
}

}  // namespace tessera::plan
