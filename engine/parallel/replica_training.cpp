#include "parallel/replica_training.h"

#include "core/error.h"

namespace tessera::parallel {

void ReplicaTraining::prepare(model::PretrainedModel& model,
                              std::vector<optim::NamedTensor> trainable,
                              const train::PluginOptions& options, torch::Device device,
                              dist::ProcessGroup* group, const std::string& plugin,
                              int zero_stage) {
  plugin_ = plugin;
  zero_stage_ = group != nullptr && group->size() > 1 ? zero_stage : 0;
  dense_.prepare(model, std::move(trainable), options, device, zero_stage_ >= 1 ? group : nullptr);
  GradientBuckets::Options bucket_options;
  bucket_options.plugin = plugin;
  bucket_options.cap_bytes = bucket_size_option(options.strategy_options);
  if (zero_stage_ == 2) {
    const int members = group->size();
    std::vector<std::int64_t> counts;
    for (const optim::NamedTensor& t : dense_.params())
      counts.push_back(train::element_share(t.tensor.numel(), group->rank(), members).count);
    shares_ = GradientShares(counts, device);
    // zero's stage 2: segment r of every bucket is member r's share of each of its tensors.
    bucket_options.segments = members;
    bucket_options.collective = GradientBuckets::Collective::ReduceScatterMean;
    bucket_options.buffers = GradientBuckets::Buffers::PerBackward;
    bucket_options.max_in_flight = 2;  // one filling while the previous one is reduced
    bucket_options.consume = [this](std::size_t, GradientBuckets::Bucket& bucket) {
      shares_.add(*buckets_, bucket);
    };
  }
  buckets_ = std::make_unique<GradientBuckets>(
      dense_.params(), [this] { return dense_.precision().gradient_divisor(); }, group,
      bucket_options);
}

template <typename Run>
void ReplicaTraining::run_backward(const Run& run, bool last_micro_batch) {
  // ZeRO-2 reduces every micro-batch's gradients as its backward runs, so none is whole after.
  if (!last_micro_batch && zero_stage_ != 2) {
    run();
    return;
  }
  buckets_->start();
  try {
    run();
  } catch (...) {
    buckets_->abandon();
    throw;
  }
  buckets_->finish();
  if (zero_stage_ == 2) buckets_->adopt_learned_order();  // its buffers are gone already
  if (last_micro_batch) reduced_ = true;
}

void ReplicaTraining::backward(const torch::Tensor& loss, double multiplier,
                               bool last_micro_batch) {
  run_backward([&] { dense_.backward(loss, multiplier); }, last_micro_batch);
}

void ReplicaTraining::backward_through(const torch::Tensor& output, const torch::Tensor& gradient,
                                       bool last_micro_batch) {
  run_backward([&] { dense_.backward_through(output, gradient); }, last_micro_batch);
}

void ReplicaTraining::reduce_accumulated() {
  buckets_->start();
  try {
    for (std::size_t i = 0; i < dense_.params().size(); ++i)
      if (dense_.params()[i].tensor.grad().defined())
        buckets_->gradient_ready(i, dense_.params()[i].tensor);
  } catch (...) {
    buckets_->abandon();
    throw;
  }
  buckets_->finish();
  if (zero_stage_ == 2) buckets_->adopt_learned_order();
  reduced_ = true;
}

std::vector<torch::Tensor> ReplicaTraining::averaged_gradients() {
  if (!reduced_)
    throw Error(ErrorKind::Internal,
                "strategy " + plugin_ + ": step() before a backward of the last micro-batch");
  if (zero_stage_ == 2) return shares_.all();
  std::vector<torch::Tensor> gradients(dense_.params().size());
  for (std::size_t i = 0; i < gradients.size(); ++i) gradients[i] = buckets_->whole_gradient(i);
  return gradients;
}

void ReplicaTraining::finish_step() {
  reduced_ = false;
  if (zero_stage_ == 2)
    shares_.zero();
  else
    buckets_->adopt_learned_order();
}

train::MemoryByCategory ReplicaTraining::memory() const {
  return dense_.memory((buckets_ ? buckets_->buffer_bytes() : 0) + shares_.bytes());
}

void ReplicaTraining::release_training_state() {
  buckets_.reset();
  shares_ = GradientShares();
  dense_.release_training_state();
}

}  // namespace tessera::parallel
