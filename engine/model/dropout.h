#pragma once
// Dropout whose masks do not depend on how a step's batch is laid out. torch's dropout draws from
// the process's generator, so the same global batch split another way (gradient accumulation,
// data-parallel ranks, a resume on another layout) draws other masks and trains to other losses.
// Here a training forward runs inside a DropoutScope that names the step and the global row of
// its first example; each row's mask at each dropout site comes from a generator seeded by
// (seed, step, global row, site), so a row sees the same masks wherever it is computed.
//
// Outside a scope (a forward the trainer does not run) dropout is torch's.
#include <torch/torch.h>

#include <cstdint>
#include <optional>

namespace tessera::model {

struct DropoutStream {
  std::uint64_t seed = 0;
  std::int64_t step = 0;
  std::int64_t first_row = 0;  // global row (within the step's global batch) of local row 0
  std::int64_t site = 0;       // dropout calls this forward has made so far
  // Under tensor parallelism, this rank's block of the attention heads (its tensor rank):
  // attention's dropout keys each head by its place among all of them.
  std::int64_t head_block = 0;
  std::int64_t blocks = 1;  // the tensor-parallel ranks (head_block's count)
  // Under sequence parallelism, inside the layers: the hidden states are block
  // `sequence_block` of `sequence_blocks` blocks of ⌈sequence_length / blocks⌉ positions each
  // row (begin_sequence_blocks). 1: whole rows.
  std::int64_t sequence_length = 0;
  std::int64_t sequence_block = 0;
  std::int64_t sequence_blocks = 1;
};

// Installs `stream` for this thread's dropout calls until destroyed (then the previous one, if
// any, is back). Activation checkpointing copies the stream as a layer starts and replays the
// layer under a scope of that copy, so the recomputation draws the forward's masks.
class DropoutScope {
 public:
  explicit DropoutScope(const DropoutStream& stream);
  ~DropoutScope();
  DropoutScope(const DropoutScope&) = delete;
  DropoutScope& operator=(const DropoutScope&) = delete;

 private:
  std::optional<DropoutStream> previous_;
};

// The stream of this thread's innermost scope, if any (copied by activation checkpointing).
std::optional<DropoutStream> current_dropout_stream();

// A family's layer loop calls this before layer `layer` (and with the layer count before the
// head): the layer's sites are numbered from a base of its own, so a pipeline stage that starts
// at that layer draws the masks the whole model draws there. Nothing outside a scope.
void begin_dropout_layer(std::int64_t layer);

// Sequence parallelism: from here on hidden states [B, L, …] are block `block` of `blocks` of
// each row's `length` positions (L = ⌈length / blocks⌉, the last block padded): dropout() on
// such a tensor draws the whole row's mask, as one process draws it, and takes the block.
// end_sequence_blocks() returns to whole rows. Nothing outside a scope. (Activation
// checkpointing copies the stream with these, so a recomputed layer draws the same.)
void begin_sequence_blocks(std::int64_t length, std::int64_t block, std::int64_t blocks);
void end_sequence_blocks();

// x with each element zeroed with probability p and the rest scaled by 1 / (1 - p), when
// `training` and p > 0; else x. Dimension 0 of x is the batch: row i draws from its own generator
// keyed by the scope's (seed, step, first_row + i, site). Every call is one site.
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

// The same for attention probabilities [B, heads, T, S]: each (row, head) draws from its own
// generator, the head numbered among every head of the layer (head_block · heads + h), so that a
// rank holding a block of the heads draws their masks as one process draws them.
torch::Tensor dropout_heads(const torch::Tensor& probabilities, double p, bool training);

// The same for x, block `head_block` of `blocks` equal blocks of a tensor along its last
// dimension (a layer's input split over tensor-parallel ranks): each row's mask is drawn for the
// whole tensor and this block of it taken, so it is the whole tensor's mask there.
torch::Tensor dropout_block(const torch::Tensor& x, double p, bool training);

// Whether dropout(x, p, training) draws layout-free masks (training, p > 0 and a scope): then
// attention computes its probabilities explicitly so that their dropout is this one.
bool layout_free_dropout_active(double p, bool training);

}  // namespace tessera::model
