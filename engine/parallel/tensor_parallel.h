#pragma once
// Tensor parallelism's building blocks (Megatron-LM's 1-D scheme) over a tensor-parallel process
// group: autograd-aware collectives and the parallel forms of the layers a transformer is made
// of. A weight is split along one dimension into `size` equal blocks, rank r holding block r
// (shard()); the functions take this rank's block and return what the unsplit layer returns, so
// that a model written with them computes, and backpropagates, what one process computes.
//
//   column-parallel linear: W [out, in] split by rows (outputs); y_r = x W_rᵀ + b_r, the output
//     split along its last dimension (or gathered whole). The input's gradient is all-reduced.
//   row-parallel linear: W split by columns (inputs); y = Σ_r x_r W_rᵀ + b, all-reduced forward.
//   vocabulary-parallel embedding: the table split by rows (token ids); each rank looks up the
//     ids in its range, zeros elsewhere, all-reduced.
//   vocabulary-parallel cross-entropy: the logits split along the vocabulary; the loss from
//     all-reduced maxima, sums of exponentials and target logits, never the whole logits.
//
// Collectives go through engine/dist (Gloo on CPU tensors, NCCL on CUDA ones); with a group of
// one, every function is the plain layer.
#include <torch/torch.h>

#include <cstdint>

namespace tessera::dist {
class ProcessGroup;
}

namespace tessera::parallel {

// Block `rank` of `size` equal blocks of `full` along `dim` (a contiguous copy). Throws
// tessera::Error (InvalidInput) naming `what`, the extent and `size` when it does not divide.
torch::Tensor shard(const torch::Tensor& full, std::int64_t dim, int rank, int size,
                    const char* what);

// Megatron's f: the identity forward, the gradient all-reduced backward (a replicated input
// entering a column-parallel layer).
torch::Tensor copy_to_group(const torch::Tensor& x, dist::ProcessGroup& group);
// Megatron's g: all-reduced (summed) forward, the identity backward (the partial sums a
// row-parallel layer or a parallel embedding leaves on each rank).
torch::Tensor reduce_from_group(const torch::Tensor& x, dist::ProcessGroup& group);
// Every rank's `block` (the same shape on each), stacked in rank order: [size, block's shape].
// No gradient flows through it.
torch::Tensor gather_blocks(const torch::Tensor& block, dist::ProcessGroup& group);
// The ranks' blocks concatenated along the last dimension forward, this rank's block of the
// gradient backward.
torch::Tensor gather_last_dim(const torch::Tensor& x, dist::ProcessGroup& group);

// x [..., in] replicated; weight [out / size, in] and bias [out / size] (or undefined) this
// rank's rows. Returns this rank's block of the output [..., out / size], or the whole output
// when `gather_output`.
torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                     const torch::Tensor& bias, dist::ProcessGroup& group,
                                     bool gather_output = false);

// x [..., in / size] this rank's block of the input; weight [out, in / size] this rank's
// columns; bias [out] whole (or undefined), added once after the reduction.
torch::Tensor row_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias, dist::ProcessGroup& group);

// ids [...] int64 over the whole vocabulary; weight [vocab / size, hidden] this rank's rows
// (ids [rank · vocab / size, (rank + 1) · vocab / size)). Returns [..., hidden], whole.
torch::Tensor vocab_parallel_embedding(const torch::Tensor& ids, const torch::Tensor& weight,
                                       dist::ProcessGroup& group);

// Sequence parallelism (Megatron-LM's, with tensor parallelism): between a layer's tensor-parallel
// regions the hidden states [B, T, …] are split along T (dimension 1) into the group's size
// blocks of L = ⌈T / size⌉ positions, the last padded with zeros (padded positions are cut off
// before attention ever sees them, so they change nothing).
std::int64_t sequence_block_length(std::int64_t length, int size);
// This rank's block of x [B, T, …] forward; backward, the blocks' gradients gathered (the
// hidden states enter the sequence-parallel region replicated).
torch::Tensor split_sequence(const torch::Tensor& x, dist::ProcessGroup& group);
// Every rank's block [B, L, …] gathered into [B, length, …] forward. Backward: with
// `sum_gradient` the gradient reduce-scattered (each rank's use of the whole was different: a
// column-parallel layer's input), else this rank's block of it (every rank's was the same).
torch::Tensor gather_sequence(const torch::Tensor& block, dist::ProcessGroup& group,
                              std::int64_t length, bool sum_gradient);
// x [B, T, …] this rank's partial sums (a row-parallel layer's output): this rank's block of
// their sum forward (a reduce-scatter instead of an all-reduce), the gradient gathered backward.
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, dist::ProcessGroup& group);

// logits [N, vocab / size] this rank's block of the vocabulary; targets [N] int64 over the
// whole vocabulary, `ignore_index` for none. The mean loss over the targets that count, as
// torch's cross_entropy computes it from the whole logits (NaN when none counts, as torch's);
// the same value on every rank. Computed in float32 whatever the logits' dtype.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, dist::ProcessGroup& group,
                                           std::int64_t ignore_index = -100);

}  // namespace tessera::parallel
