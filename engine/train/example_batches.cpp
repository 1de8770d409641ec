#include "train/example_batches.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::train {

namespace {

// Preference pairs: every chosen row (prompt + chosen), then every rejected row in the same order.
Batch collate_pairs(const std::vector<const data::TokenizedExample*>& pairs, std::int32_t pad_id) {
  std::vector<data::TokenizedExample> rows(pairs.size() * 2);
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    if (!pairs[i]->is_pair())
      throw_invalid("collate: the batch mixes preference pairs and single examples");
    rows[i].input_ids = pairs[i]->input_ids;
    rows[i].labels = pairs[i]->labels;
    rows[pairs.size() + i].input_ids = pairs[i]->rejected_input_ids;
    rows[pairs.size() + i].labels = pairs[i]->rejected_labels;
  }
  std::vector<const data::TokenizedExample*> pointers;
  for (const auto& row : rows) pointers.push_back(&row);
  return collate(pointers, pad_id);
}

// KTO's examples (unpaired): each one's prompt + completion, then each prompt with the previous
// example's completion (the last one's for the first), every row cut to `max_length` (0: whole),
// as TRL's KTO collator makes them; `desirable` says which examples are.
Batch collate_unpaired(const std::vector<const data::TokenizedExample*>& examples,
                       std::int32_t pad_id, std::size_t max_length) {
  const std::size_t n = examples.size();
  std::vector<data::TokenizedExample> rows(2 * n);
  const auto row = [&](data::TokenizedExample& out, const data::TokenizedExample& prompt_of,
                       const data::TokenizedExample& completion_of) {
    const auto prompt_end =
        prompt_of.input_ids.begin() + static_cast<std::ptrdiff_t>(prompt_of.prompt_length);
    const auto completion_start =
        completion_of.input_ids.begin() + static_cast<std::ptrdiff_t>(completion_of.prompt_length);
    out.input_ids.assign(prompt_of.input_ids.begin(), prompt_end);
    out.input_ids.insert(out.input_ids.end(), completion_start, completion_of.input_ids.end());
    out.labels.assign(prompt_of.prompt_length, data::kIgnoreIndex);
    out.labels.insert(out.labels.end(), completion_start, completion_of.input_ids.end());
    if (max_length > 0 && out.input_ids.size() > max_length) {
      out.input_ids.resize(max_length);
      out.labels.resize(max_length);
    }
  };
  torch::Tensor desirable = torch::empty({static_cast<std::int64_t>(n)}, torch::kBool);
  for (std::size_t i = 0; i < n; ++i) {
    if (!examples[i]->desirable)
      throw_invalid("collate: the batch mixes unpaired preference examples and other examples");
    desirable[static_cast<std::int64_t>(i)] = *examples[i]->desirable;
    row(rows[i], *examples[i], *examples[i]);
    row(rows[n + i], *examples[i], *examples[(i + n - 1) % n]);
  }
  std::vector<const data::TokenizedExample*> pointers;
  for (const auto& r : rows) pointers.push_back(&r);
  Batch batch = collate(pointers, pad_id);
  batch.desirable = desirable;
  return batch;
}

}  // namespace

Batch collate(const std::vector<const data::TokenizedExample*>& examples, std::int32_t pad_id,
              std::size_t max_length) {
  if (examples.empty()) throw_invalid("collate: no examples");
  if (examples.front()->is_pair()) return collate_pairs(examples, pad_id);
  if (examples.front()->desirable) return collate_unpaired(examples, pad_id, max_length);
  const bool classification = examples.front()->label.has_value();
  std::size_t longest = 0;
  for (std::size_t i = 0; i < examples.size(); ++i) {
    const data::TokenizedExample& e = *examples[i];
    if (e.input_ids.empty())
      throw_invalid("collate: example " + std::to_string(i) + " of the batch has no tokens");
    if (e.label.has_value() != classification)
      throw_invalid("collate: the batch mixes classification and language-modelling examples");
    if (!classification && e.labels.size() != e.input_ids.size())
      throw_invalid("collate: example " + std::to_string(i) + " has " +
                    std::to_string(e.labels.size()) + " labels for " +
                    std::to_string(e.input_ids.size()) + " tokens");
    longest = std::max(longest, e.input_ids.size());
  }
  const auto b = static_cast<std::int64_t>(examples.size());
  const auto t = static_cast<std::int64_t>(longest);
  Batch batch;
  batch.input_ids = torch::full({b, t}, static_cast<std::int64_t>(pad_id), torch::kInt64);
  batch.attention_mask = torch::zeros({b, t}, torch::kInt64);
  batch.labels = classification
                     ? torch::empty({b}, torch::kInt64)
                     : torch::full({b, t}, std::int64_t{data::kIgnoreIndex}, torch::kInt64);
  auto ids = batch.input_ids.accessor<std::int64_t, 2>();
  auto mask = batch.attention_mask.accessor<std::int64_t, 2>();
  for (std::int64_t i = 0; i < b; ++i) {
    const data::TokenizedExample& e = *examples[static_cast<std::size_t>(i)];
    for (std::size_t j = 0; j < e.input_ids.size(); ++j) {
      ids[i][static_cast<std::int64_t>(j)] = e.input_ids[j];
      mask[i][static_cast<std::int64_t>(j)] = 1;
    }
    if (classification) {
      batch.labels[i] = *e.label;
    } else {
      auto labels = batch.labels.accessor<std::int64_t, 2>();
      for (std::size_t j = 0; j < e.labels.size(); ++j)
        labels[i][static_cast<std::int64_t>(j)] = e.labels[j];
    }
  }
  return batch;
}

ExampleBatchSource::ExampleBatchSource(std::vector<data::TokenizedExample> examples,
                                       std::int64_t batch_size, bool shuffle, std::uint64_t seed,
                                       std::int32_t pad_id, std::size_t max_length)
    : examples_(std::move(examples)),
      batch_size_(batch_size),
      shuffle_(shuffle),
      seed_(seed),
      pad_id_(pad_id),
      max_length_(max_length) {
  if (examples_.empty())
    throw_invalid("training data: no examples", "the dataset (after filtering) is empty");
  if (batch_size_ < 1) throw_invalid("training.batch_size: must be >= 1");
  order_ = epoch_order(examples_.size(), shuffle_, seed_, 0);
}

std::int64_t ExampleBatchSource::batches_per_epoch() const {
  const auto n = static_cast<std::int64_t>(examples_.size());
  return n / batch_size_ + (n % batch_size_ != 0 ? 1 : 0);
}

Batch ExampleBatchSource::next() {
  const auto n = static_cast<std::int64_t>(examples_.size());
  const std::int64_t begin = position_.index * batch_size_;
  const std::int64_t end = std::min(n, begin + batch_size_);
  std::vector<const data::TokenizedExample*> picked;
  for (std::int64_t i = begin; i < end; ++i)
    picked.push_back(&examples_[order_[static_cast<std::size_t>(i)]]);
  Batch batch = collate(picked, pad_id_, max_length_);
  if (++position_.index >= batches_per_epoch()) {
    position_.index = 0;
    ++position_.epoch;
    order_ = epoch_order(examples_.size(), shuffle_, seed_, position_.epoch);
  }
  return batch;
}

void ExampleBatchSource::seek(const DataPosition& position) {
  if (position.epoch < 0 || position.index < 0 || position.index >= batches_per_epoch())
    throw_invalid("data position (epoch " + std::to_string(position.epoch) + ", batch " +
                      std::to_string(position.index) + ") is outside the data (" +
                      std::to_string(batches_per_epoch()) + " batches per epoch)",
                  "resume with the same dataset, batch size and max length");
  // Sharded reading (ShardedBatchSource) seeks twice per batch: the order is drawn again only
  // when the epoch changes.
  const bool same_epoch = position.epoch == position_.epoch;
  position_ = position;
  if (!same_epoch) order_ = epoch_order(examples_.size(), shuffle_, seed_, position_.epoch);
}

}  // namespace tessera::train
