#pragma once
// What `ddp` and `hybrid` share: this rank's trainable tensors trained as `single` trains them
// (DenseTraining), their gradients averaged over the replicas of a data-parallel group in buckets
// launched while the last micro-batch's backward runs (gradient_buckets.h). ddp's replicas hold
// the whole model; hybrid's hold a tensor-parallel rank's blocks of it.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/gradient_buckets.h"
#include "train/dense_training.h"

namespace tessera::parallel {

class ReplicaTraining {
 public:
  // DenseTraining::prepare, then the buckets over `group` (null: one replica, nothing to
  // average); bucket_size from the strategy options; `plugin` names it in errors.
  // `zero_stage` 1: ZeRO-1 over `group` (DenseTraining's shard group): the gradients are still
  // averaged whole, each replica updates its share, and the shares are all-gathered. 2: ZeRO-2,
  // also the gradients: every micro-batch's backward reduce-scatters its buckets (two in flight),
  // each replica adding its element_share of every tensor's average into float32 share
  // gradients; no whole gradient outlives a backward. Needs a group (0 without one).
  void prepare(model::PretrainedModel& model, std::vector<optim::NamedTensor> trainable,
               const train::PluginOptions& options, torch::Device device, dist::ProcessGroup* group,
               const std::string& plugin, int zero_stage = 0);

  train::DenseTraining& dense() { return dense_; }
  const train::DenseTraining& dense() const { return dense_; }

  // Earlier micro-batches accumulate and communicate nothing (DDP's no_sync); the last one's
  // gradients are averaged as its backward produces them.
  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch);
  // The same from a pipeline stage's output and its gradient (DenseTraining::backward_through).
  void backward_through(const torch::Tensor& output, const torch::Tensor& gradient,
                        bool last_micro_batch);
  // After backwards that all accumulated (none the last micro-batch's): averages what .grad
  // holds now, as the last backward would have (an interleaved pipeline stage, whose chunks end
  // their backwards at different times).
  void reduce_accumulated();
  // The averaged float32 gradients of dense().params(), in order; call after the last
  // micro-batch's backward, then finish_step() once the update has read them. ZeRO-2: this
  // replica's share of each, flat (gradient_shares()).
  std::vector<torch::Tensor> averaged_gradients();
  bool gradient_shares() const { return zero_stage_ == 2; }
  void finish_step();

  train::MemoryByCategory memory() const;
  void release_training_state();
  const BucketTrace* trace() const { return buckets_ ? &buckets_->trace() : nullptr; }

 private:
  // Runs `run` (a backward); the last micro-batch's inside the buckets' reduction.
  template <typename Run>
  void run_backward(const Run& run, bool last_micro_batch);

  std::string plugin_;
  train::DenseTraining dense_;
  std::unique_ptr<GradientBuckets> buckets_;  // hooks on dense_'s tensors
  bool reduced_ = false;                      // the buckets hold this step's averaged gradients
  int zero_stage_ = 0;
  GradientShares shares_;  // ZeRO-2: this replica's element_share of each tensor's average
};

}  // namespace tessera::parallel
