#pragma once
// The causal-LM loss through the output head a block of rows at a time, so that the logits
// [tokens, vocabulary] are never whole in memory: at 4096 tokens and Llama 3's 128k vocabulary
// they are 2 GiB in float32, and the whole-logits loss holds them about three times over (their
// float32 copy, the log-softmax, its gradient) at its backward.
// Torch-free, so that the planner sizes the blocks as training makes them.
#include <algorithm>
#include <cstdint>
#include <functional>

namespace at {
class Tensor;
}

namespace tessera::model {

// Float32 logits a block holds at most (the block's rows × vocabulary × 4 bytes) on the CPU.
inline constexpr std::int64_t kHeadLossBlockBytes = std::int64_t{8} << 20;
// ... and on a GPU. Each block's two matrix products read the whole head weight, so a block's
// rows are the products' arithmetic intensity (FLOPs per weight byte): at 8 MiB (65 rows of a
// 32000-entry vocabulary) a GPU's products are bound by its memory, not its GEMM rate (which
// needs some hundreds), and 8192 tokens take 126 blocks of some 20 kernels each. 256 MiB is
// 2048 rows of that vocabulary, 512 of Llama 3's 128256 entries, beside the GiBs of the whole
// logits the peers hold.
inline constexpr std::int64_t kHeadLossBlockBytesGpu = std::int64_t{256} << 20;

// The rows per block for a vocabulary of `vocabulary` entries: on the CPU kHeadLossBlockBytes
// of float32 logits, at least 16 rows (narrower matmuls run far below the GEMM's rate); on a
// GPU kHeadLossBlockBytesGpu, in whole tiles of 128 rows, at least one.
inline std::int64_t head_loss_block_rows(std::int64_t vocabulary, bool gpu = false) {
  const std::int64_t entries = std::max<std::int64_t>(1, vocabulary);
  if (!gpu) return std::max<std::int64_t>(16, kHeadLossBlockBytes / (4 * entries));
  constexpr std::int64_t kTile = 128;
  return std::max<std::int64_t>(kTile, kHeadLossBlockBytesGpu / (4 * entries) / kTile * kTile);
}

// The vocabulary split over tensor-parallel ranks: this rank's head holds the rows of the
// vocabulary from `first` on, and the loss's per-row figures are combined over the ranks.
struct VocabularySplit {
  std::int64_t first = 0;
  std::function<void(at::Tensor&)> max_over_ranks;  // elementwise, in place
  std::function<void(at::Tensor&)> sum_over_ranks;  // elementwise, in place
};

// The mean cross-entropy of logits = hidden·weightᵀ + bias against `targets` (-100: ignored), as
// causal_lm_loss computes it from whole logits (computed in the hidden states' dtype, widened to
// float32), equal to it within rounding. The gradients of hidden, and of weight and bias where
// they train, are computed block by block in forward (backward only scales them), so backward
// needs neither the logits nor the weight.
// hidden [N, H], weight [V, H], bias [V] or undefined, targets [N] int64; a float32 scalar.
// With `split`, weight and bias are this rank's block of the vocabulary, targets are over the
// whole of it, every rank gets the whole loss, and the hidden states' gradient is this rank's
// part of theirs (summed over the ranks by whatever copied them to the ranks).
at::Tensor head_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                              const at::Tensor& bias, const at::Tensor& targets,
                              // 0: head_loss_block_rows(V, on a GPU)
                              std::int64_t block_rows = 0, const VocabularySplit* split = nullptr);

// log p(target) of each row under logits = hidden·weightᵀ + bias, float32 [N] (0 where the
// target is -100), as the whole logits give it (computed in the hidden states' dtype, widened to
// float32; the target's logit less the row's log-sum-exp): preference tuning's per-token
// log-probabilities, a block of rows at a time. Each row's value depends on its own hidden
// state alone, so where only the hidden states train, forward keeps d log p / d hidden [N, H]
// (in their dtype) and backward scales it by each row's gradient: backward needs neither the
// logits nor the weight. Where the weight or bias trains, forward keeps the rows' log-sum-exp and
// backward recomputes each block's logits from the hidden states and the weight.
at::Tensor head_target_log_probs(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& targets,
                                 // 0: head_loss_block_rows(V, on a GPU)
                                 std::int64_t block_rows = 0);

// Whether head_target_log_probs will read the weight in backward (it trains, or its bias does).
bool head_log_probs_read_weight_in_backward(const at::Tensor& weight, const at::Tensor& bias);

// Rows [first, first + count) of a frozen head's weight [V, H], [count, H] in the compute dtype:
// a head left in its checkpoint file and read a block of the vocabulary at a time (model/layers.h:
// StoredRows).
using HeadRowReader = std::function<at::Tensor(std::int64_t first, std::int64_t count)>;

// The vocabulary entries a block holds when a head of `hidden` columns (`element_bytes` each) is
// read by rows for `rows` hidden states: the block's weight rows and its float32 logits each
// within kHeadLossBlockBytes, at least 64 entries.
inline std::int64_t head_vocabulary_block(std::int64_t rows, std::int64_t hidden,
                                          std::int64_t element_bytes) {
  const std::int64_t by_weight =
      kHeadLossBlockBytes / std::max<std::int64_t>(1, hidden * element_bytes);
  const std::int64_t by_logits = kHeadLossBlockBytes / (4 * std::max<std::int64_t>(1, rows));
  return std::max<std::int64_t>(64, std::min(by_weight, by_logits));
}

// −log p(target) of each row under logits = hidden·weightᵀ of a frozen head without bias read
// through `read` a block of the vocabulary at a time, float32 [N] (0 where the target is -100), as
// the whole logits give it (computed in the hidden states' dtype, widened to float32): neither
// the logits nor the weight are ever whole. One pass over the vocabulary: each row's running
// log-sum-exp and Σ exp(logit)·weight-row are rescaled as its largest logit grows, so forward
// makes d/d hidden [N, H] and backward only scales it by each row's gradient.
// hidden [N, H], targets [N] int64.
at::Tensor stored_head_target_losses(const at::Tensor& hidden, const HeadRowReader& read,
                                     std::int64_t vocabulary, const at::Tensor& targets,
                                     std::int64_t block = 0);  // 0: head_vocabulary_block

// hidden·weightᵀ [..., V] of a frozen head without bias read through `read` a block of the
// vocabulary at a time (generation's last positions, evaluation); backward, where the hidden
// states train, reads the blocks again for their gradient.
at::Tensor stored_head_logits(const at::Tensor& hidden, const HeadRowReader& read,
                              std::int64_t vocabulary,
                              std::int64_t block = 0);  // 0: head_vocabulary_block

}  // namespace tessera::model
