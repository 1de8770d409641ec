#pragma once
// Causal-LM evaluation: mean token cross-entropy and perplexity over a set of sequences.
//
// Definition (the same as transformers' loss with shifted labels, summed over the dataset):
//   every sequence of length L predicts its tokens 2..L from the ones before (L - 1 predictions);
//   mean_loss = (sum over all sequences and predicted tokens of -log p(token | prefix))
//               / (total number of predicted tokens);
//   perplexity = exp(mean_loss).
// Each token counts once, so long sequences weigh more than short ones (this is not the mean of
// per-sequence losses). A one-token sequence predicts nothing and adds nothing.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"

namespace tessera::model {

struct EvalOptions {
  // Batches are filled up to about this many tokens (rows x longest row, right-padded).
  std::int64_t batch_tokens = 8192;
  // Called after each batch with (sequences done, total sequences).
  std::function<void(std::size_t done, std::size_t total)> progress;
  torch::Device device = torch::kCPU;  // where the caller placed the model
};

struct EvalResult {
  double total_loss = 0.0;            // sum of token cross-entropies (nats)
  std::int64_t predicted_tokens = 0;  // sum over sequences of (length - 1)
  std::int64_t sequences = 0;
  double mean_loss() const;   // total_loss / predicted_tokens
  double perplexity() const;  // exp(mean_loss)
};

// Throws tessera::Error when the model is not a causal LM, a token id is outside the
// vocabulary, or no sequence has two tokens or more.
EvalResult evaluate_causal_lm(PretrainedModel& model,
                              const std::vector<std::vector<std::int32_t>>& sequences,
                              const EvalOptions& options = {});

}  // namespace tessera::model
