#include "plugins/ddp/replica_training.h"

#include "core/error.h"

namespace tessera::plugins {

void ReplicaTraining::prepare(model::PretrainedModel& model,
                              std::vector<optim::NamedTensor> trainable,
                              const train::PluginOptions& options, torch::Device device,
                              dist::ProcessGroup* group, const std::string& plugin,
                              bool shard_optimizer) {
  plugin_ = plugin;
  dense_.prepare(model, std::move(trainable), options, device, shard_optimizer ? group : nullptr);
  GradientBuckets::Options bucket_options;
  bucket_options.plugin = plugin;
  bucket_options.cap_bytes = bucket_size_option(options.strategy_options);
  buckets_ = std::make_unique<GradientBuckets>(
      dense_.params(),
      [this](const torch::Tensor& g) { return dense_.precision().master_gradient(g); }, group,
      bucket_options);
}

template <typename Run>
void ReplicaTraining::run_backward(const Run& run, bool last_micro_batch) {
  if (!last_micro_batch) {
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
  reduced_ = true;
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
  reduced_ = true;
}

std::vector<torch::Tensor> ReplicaTraining::averaged_gradients() {
  if (!reduced_)
    throw Error(ErrorKind::Internal,
                "strategy " + plugin_ + ": step() before a backward of the last micro-batch");
  std::vector<torch::Tensor> gradients(dense_.params().size());
  for (std::size_t i = 0; i < gradients.size(); ++i) gradients[i] = buckets_->whole_gradient(i);
  return gradients;
}

void ReplicaTraining::finish_step() {
  reduced_ = false;
  buckets_->adopt_learned_order();
}

train::MemoryByCategory ReplicaTraining::memory() const {
  return dense_.memory(buckets_ ? buckets_->buffer_bytes() : 0);
}

void ReplicaTraining::release_training_state() {
  buckets_.reset();
  dense_.release_training_state();
}

}  // namespace tessera::plugins
