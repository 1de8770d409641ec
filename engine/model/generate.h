#pragma once
// Text generation with a KV cache for the causal-LM families, with transformers' semantics:
//   - the prompt is run once (prefill), then one token per step against the cache;
//   - position ids are cumsum(attention_mask) - 1, as GenerationMixin computes them, so
//     left-padded batches place every row's first real token at position 0;
//   - greedy picks argmax of the float32 logits of the last position;
//   - sampling applies transformers' warpers in its order: temperature, then top-k, then top-p
//     (each skipped at its neutral value), then draws from softmax with torch.multinomial on a
//     CPU generator seeded with `seed` (the same stream as torch.manual_seed(seed));
//   - a row stops at the first of its EOS ids (the EOS is part of the output); a finished row of
//     a batch is filled with pad_token_id (EOS when there is no pad) until all rows finish.
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "model/model.h"

namespace tessera::model {

struct SamplingOptions {
  bool greedy = true;
  double temperature = 1.0;  // > 0; 1 = unchanged
  std::int64_t top_k = 0;    // 0 = off
  double top_p = 1.0;        // in (0, 1]; 1 = off
  std::uint64_t seed = 0;
};

struct GenerateOptions {
  std::int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  std::vector<std::int64_t> eos_token_ids;   // empty = run to max_new_tokens
  std::optional<std::int64_t> pad_token_id;  // fills finished rows of a batch
  torch::Device device = torch::kCPU;        // where the caller placed the model
};

// Throws tessera::Error (InvalidInput) naming the option for a value out of range.
void validate(const GenerateOptions& options);

// transformers' logits warpers on float32 scores [B, V]: temperature, top-k, top-p. Removed
// entries are -inf. Greedy options return the scores unchanged.
torch::Tensor warp_logits(const torch::Tensor& scores, const SamplingOptions& options);

// Called with (row, token) for every generated token of an unfinished row, in order; return
// false to stop generating (the tokens so far are returned).
using TokenCallback = std::function<bool(std::size_t row, std::int64_t token)>;

struct GenerateResult {
  std::vector<std::vector<std::int64_t>> tokens;  // per row: the new tokens (EOS included)
  std::vector<bool> stopped_at_eos;               // per row
};

// Generates for each prompt (token ids, at least one each); several prompts are run as one
// left-padded batch. The model must be a causal LM of a family that supports a KV cache.
GenerateResult generate(PretrainedModel& model,
                        const std::vector<std::vector<std::int64_t>>& prompts,
                        const GenerateOptions& options, const TokenCallback& on_token = {});

// The EOS ids of a model folder: config.json's eos_token_id(s) and generation_config.json's
// (when that file exists), without duplicates.
std::vector<std::int64_t> eos_token_ids(const hf::ModelConfig& config,
                                        const std::filesystem::path& model_dir);

}  // namespace tessera::model
