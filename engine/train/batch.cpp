#include "train/batch.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"

namespace tessera::train {

FixedBatchSource::FixedBatchSource(std::vector<Batch> batches, bool shuffle, std::uint64_t seed)
    : batches_(std::move(batches)), shuffle_(shuffle), seed_(seed) {
  if (batches_.empty()) throw_invalid("training data: no batches", "the dataset is empty");
  build_order();
}

std::int64_t FixedBatchSource::batches_per_epoch() const {
  return static_cast<std::int64_t>(batches_.size());
}

std::int64_t FixedBatchSource::rows_per_batch() const {
  std::int64_t rows = 0;
  for (const Batch& b : batches_) rows = std::max(rows, b.input_ids.size(0));
  return rows;
}

std::vector<std::size_t> epoch_order(std::size_t count, bool shuffle, std::uint64_t seed,
                                     std::int64_t epoch) {
  std::vector<std::size_t> order(count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (!shuffle) return order;
  // Our own draw: std::shuffle's algorithm is implementation-defined.
  std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(epoch + 1)));
  for (std::size_t i = order.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(rng() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

void FixedBatchSource::build_order() {
  order_ = epoch_order(batches_.size(), shuffle_, seed_, position_.epoch);
}

Batch FixedBatchSource::next() {
  Batch batch = batches_[order_[static_cast<std::size_t>(position_.index)]];
  if (++position_.index >= batches_per_epoch()) {
    position_.index = 0;
    ++position_.epoch;
    build_order();
  }
  return batch;
}

void FixedBatchSource::seek(const DataPosition& position) {
  if (position.epoch < 0 || position.index < 0 || position.index >= batches_per_epoch())
    throw_invalid("data position (epoch " + std::to_string(position.epoch) + ", batch " +
                      std::to_string(position.index) + ") is outside the data (" +
                      std::to_string(batches_per_epoch()) + " batches per epoch)",
                  "resume with the same dataset, batch size and max length");
  const bool same_epoch = position.epoch == position_.epoch;
  position_ = position;
  if (!same_epoch) build_order();
}

DataPosition advance(DataPosition position, std::int64_t count, std::int64_t batches_per_epoch) {
  const std::int64_t linear = position.epoch * batches_per_epoch + position.index + count;
  return {linear / batches_per_epoch, linear % batches_per_epoch};
}

ShardedBatchSource::ShardedBatchSource(BatchSource& inner, int rank, int world_size)
    : inner_(inner), rank_(rank), world_size_(world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw Error(ErrorKind::Internal, "data shard " + std::to_string(rank) + " of " +
                                         std::to_string(world_size) + " is not a shard");
}

std::int64_t ShardedBatchSource::batches_per_epoch() const {
  return std::max<std::int64_t>(1, inner_.batches_per_epoch() / world_size_);
}

Batch ShardedBatchSource::next() {
  const DataPosition group = inner_.position();
  const std::int64_t per_epoch = inner_.batches_per_epoch();
  if (rank_ > 0) inner_.seek(advance(group, rank_, per_epoch));
  Batch batch = inner_.next();
  inner_.seek(advance(group, world_size_, per_epoch));
  return batch;
}

}  // namespace tessera::train
