#pragma once
// HuggingFace export: a folder that transformers' from_pretrained loads as is, written so that a
// crash never leaves a half-written destination, and checked before success is reported.
//
// Layout written:
//   config.json             the source config's raw JSON, "dtype" (and "torch_dtype" when the
//                           source had it) set to the exported dtype
//   model.safetensors       or model-0000i-of-0000n.safetensors + model.safetensors.index.json,
//                           tensors named by named_parameters() (HF names); a tied lm_head is not
//                           a parameter and is not written, as transformers saves it
//   generation_config.json  the source's when present, bos/eos/pad from config.json filled in
//   tokenizer files         copied from the tokenizer folder when present (tokenizer.json,
//                           tokenizer_config.json, special_tokens_map.json, chat_template.jinja,
//                           vocab.txt, vocab.json, merges.txt, tokenizer.model, added_tokens.json)
//
// Procedure: everything is written into a temporary folder next to the destination and
// fsynced; the folder is then reloaded through our own loader and its logits compared with the
// model in memory (converted to the exported dtype) on a few fixed random sequences; only when
// that check passes is the folder renamed into place. An existing non-empty destination is
// refused unless `force`, and then the new folder is swapped in atomically (renameat2
// RENAME_EXCHANGE) before the old one is deleted.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace tessera::exporter {

struct ExportOptions {
  torch::Dtype dtype = torch::kFloat32;           // float32, bfloat16 or float16
  std::uint64_t max_shard_bytes = 2'000'000'000;  // transformers' "2GB"
  bool force = false;                             // replace a non-empty destination
  std::filesystem::path tokenizer_dir;            // copy tokenizer files from here (empty: none)
  std::filesystem::path source_dir;               // generation_config.json from here (optional)
  int verify_sequences = 3;
  std::int64_t verify_length = 16;
  double verify_tolerance = 1e-5;                    // max abs logits difference, same dtype
  std::function<void(const std::string&)> progress;  // human-readable steps (stderr in the CLI)
};

struct VerifyReport {
  int sequences = 0;
  std::int64_t tokens_per_sequence = 0;
  std::string compared;  // "logits" or "hidden states"
  double max_abs_diff = 0.0;
  double tolerance = 0.0;
  bool passed = false;
};

struct ExportReport {
  std::filesystem::path dir;
  std::vector<std::string> files;  // file names inside `dir`
  std::uint64_t weight_bytes = 0;
  std::int64_t parameters = 0;
  std::string dtype;
  VerifyReport verify;
};

// Exports `model` to `out`. Throws tessera::Error: InvalidInput for a non-empty destination
// without `force`, a destination that is a file, or a bad option; Internal when the
// self-check fails (nothing is then left at `out`); Io for file-system failures.
ExportReport export_pretrained(model::PretrainedModel& model, const std::filesystem::path& out,
                               const ExportOptions& options);

// Hands every parameter of a model, by its named_parameters() name, to the callback it is
// given (train::Plugin::visit_weights), each value in memory for the call.
using WeightSource = std::function<void(
    const std::function<void(const std::string& name, const torch::Tensor& value)>&)>;

// export_pretrained for a model whose weights are not all in memory: the layout comes from the
// model's parameter names and dense shapes (a quantized Linear's weight as [out, in]), the values
// from `weights`, each converted and written to
// its place in its shard as it comes (hf::StreamingSafetensorsWriter), so no more than one
// tensor is converted at a time. The check reads every tensor back from the staged files and
// compares it byte for byte with a second pass of `weights` (VerifyReport::compared "tensors",
// `sequences` = the number of tensors); the logits check would need the whole model twice.
ExportReport export_streamed(model::PretrainedModel& model, const WeightSource& weights,
                             const std::filesystem::path& out, const ExportOptions& options);

// Reloads `dir` in `dtype` and compares its outputs with `reference` on seeded random
// sequences (the check export_pretrained runs). `reference` must have the same dtype.
VerifyReport verify_export(model::PretrainedModel& reference, const std::filesystem::path& dir,
                           torch::Dtype dtype, int sequences, std::int64_t length,
                           double tolerance);

// "2GB" (10^9), "500MB", "1GiB" (2^30), "123" (bytes), as transformers' max_shard_size.
std::uint64_t parse_size(const std::string& text);

// "float32", "bfloat16", "float16".
std::string dtype_name(torch::Dtype dtype);

// The weight tensors as written: every parameter by HF name, contiguous, on the CPU, in `dtype`.
std::vector<std::pair<std::string, torch::Tensor>> export_tensors(model::PretrainedModel& model,
                                                                  torch::Dtype dtype);

}  // namespace tessera::exporter
