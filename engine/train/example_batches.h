#pragma once
// engine/data's tokenized examples as trainer batches: a collate function (right padding,
// attention_mask 0 and labels -100 on padding) and a BatchSource over an example list that
// reshuffles every epoch from (seed, epoch), so a checkpoint's (epoch, index) restores the
// exact data order.
#include <cstdint>
#include <vector>

#include "data/format.h"
#include "train/batch.h"

namespace tessera::train {

// Pads to the longest example. Causal-LM examples give labels [B, T] (the example's labels,
// -100 on padding); classification examples (with `label`) give labels [B]; B preference pairs
// give 2·B rows, the chosen ones first, and B unpaired (KTO) examples 2·B rows, their own and then
// the mismatched ones, cut to `max_length` (0: whole), with `desirable` (train/preference.h).
// Throws tessera::Error (InvalidInput) for an empty example, labels of the wrong length, or a mix
// of the two kinds.
Batch collate(const std::vector<const data::TokenizedExample*>& examples, std::int32_t pad_id,
              std::size_t max_length = 0);

class ExampleBatchSource : public BatchSource {
 public:
  // The last batch of an epoch may be smaller (as a DataLoader with drop_last=False).
  // `max_length`: unpaired (KTO) examples' rows are cut to it here (collate).
  ExampleBatchSource(std::vector<data::TokenizedExample> examples, std::int64_t batch_size,
                     bool shuffle, std::uint64_t seed, std::int32_t pad_id,
                     std::size_t max_length = 0);
  std::int64_t batches_per_epoch() const override;
  // Preference pairs and KTO's examples are two rows each (collate).
  std::int64_t rows_per_batch() const override {
    const bool two_rows = examples_.front().is_pair() || examples_.front().desirable.has_value();
    return two_rows ? 2 * batch_size_ : batch_size_;
  }
  Batch next() override;
  DataPosition position() const override { return position_; }
  void seek(const DataPosition& position) override;
  std::uint64_t order_seed() const override { return seed_; }

 private:
  std::vector<data::TokenizedExample> examples_;
  std::int64_t batch_size_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int32_t pad_id_;
  std::size_t max_length_;
  DataPosition position_;
  std::vector<std::size_t> order_;
};

}  // namespace tessera::train
