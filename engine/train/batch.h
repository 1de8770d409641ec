#pragma once
// The trainer's view of data: batches of {input_ids, attention_mask, labels} tensors from a
// source with a position that a checkpoint saves and a resume restores. engine/data's
// tokenized examples are collated into these by an adapter; tests feed fixed batches.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace tessera::train {

struct Batch {
  torch::Tensor input_ids;       // [B, T] int64
  torch::Tensor attention_mask;  // [B, T], 1 = token
  torch::Tensor labels;          // [B, T], -100 = no loss
  // KTO (train/preference.h): [N] bool, whether each of the first N rows is desirable; rows N…2N
  // are their mismatched rows. Undefined otherwise.
  torch::Tensor desirable;
};

// The next batch to be read: `index` within epoch `epoch` (both 0-based).
struct DataPosition {
  std::int64_t epoch = 0;
  std::int64_t index = 0;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual std::int64_t batches_per_epoch() const = 0;
  // The rows of a full batch (an epoch's last may have fewer): the trainer numbers a step's rows
  // by it.
  virtual std::int64_t rows_per_batch() const = 0;
  // Returns the batch at position() and advances, wrapping into the next epoch.
  virtual Batch next() = 0;
  virtual DataPosition position() const = 0;
  // Throws tessera::Error (InvalidInput) when the position is outside the data.
  virtual void seek(const DataPosition& position) = 0;
  // The seed of the data order (saved in checkpoints; a resume with another seed is refused).
  virtual std::uint64_t order_seed() const = 0;
};

// The order of `count` items in `epoch`: 0..count-1, or (shuffle) a Fisher-Yates permutation
// drawn from a generator seeded by (seed, epoch) alone.
std::vector<std::size_t> epoch_order(std::size_t count, bool shuffle, std::uint64_t seed,
                                     std::int64_t epoch);

// A fixed list of batches, in order or reshuffled every epoch by a permutation derived from
// (seed, epoch) alone, so any position can be restored without replaying the past.
class FixedBatchSource : public BatchSource {
 public:
  FixedBatchSource(std::vector<Batch> batches, bool shuffle, std::uint64_t seed);
  std::int64_t batches_per_epoch() const override;
  std::int64_t rows_per_batch() const override;  // the most any batch has
  Batch next() override;
  DataPosition position() const override { return position_; }
  void seek(const DataPosition& position) override;
  std::uint64_t order_seed() const override { return seed_; }

 private:
  void build_order();
  std::vector<Batch> batches_;
  bool shuffle_;
  std::uint64_t seed_;
  DataPosition position_;
  std::vector<std::size_t> order_;  // for position_.epoch
};

// Rank `rank` of `world_size` data-parallel ranks: micro-batch `rank` of every `world_size`
// consecutive micro-batches of `inner`, in `inner`'s order (shared by every rank). So one step of
// world_size ranks reads the micro-batches one process reads in world_size steps of gradient
// accumulation. position() and seek() are `inner`'s (global) positions, the same on every rank:
// the start of the next group of world_size micro-batches. A group may run across an epoch's end.
class ShardedBatchSource : public BatchSource {
 public:
  // `inner` must outlive this source; 0 <= rank < world_size.
  ShardedBatchSource(BatchSource& inner, int rank, int world_size);
  // Whole groups of world_size micro-batches per epoch (at least 1).
  std::int64_t batches_per_epoch() const override;
  std::int64_t rows_per_batch() const override { return inner_.rows_per_batch(); }
  Batch next() override;
  DataPosition position() const override { return inner_.position(); }
  void seek(const DataPosition& position) override { inner_.seek(position); }
  std::uint64_t order_seed() const override { return inner_.order_seed(); }

 private:
  BatchSource& inner_;
  int rank_;
  int world_size_;
};

// `position` moved on by `count` batches of `batches_per_epoch` per epoch.
DataPosition advance(DataPosition position, std::int64_t count, std::int64_t batches_per_epoch);

}  // namespace tessera::train
