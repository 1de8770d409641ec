#pragma once
// What `single`, `ddp` and `hybrid` share: every trainable tensor whole in this process, on one
// device. The compute copies the model uses, their float32 masters (train/mixed_precision.h),
// AdamW (weight decay grouped as transformers' Trainer does), clipping by the global norm, memory
// by category and the checkpoint state, which is `single`'s format for all. `ddp` adds only how
// the gradients become the same on every rank before step(). With a shard group (hybrid's
// zero_stage 1) the masters and moments are ZeRO-1's: each replica's share only.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "train/mixed_precision.h"
#include "train/plugin.h"

namespace tessera::dist {
class ProcessGroup;
}

namespace tessera::train {

// The elements [start, start + count) of a tensor of `numel` that member `rank` of `members`
// owns under ZeRO: per_rank = ⌈numel / members⌉, start = rank · per_rank (count 0 past the end).
struct ElementShare {
  std::int64_t per_rank = 0;
  std::int64_t start = 0;
  std::int64_t count = 0;
};
ElementShare element_share(std::int64_t numel, int rank, int members);

// The bytes of every parameter of `model` plus those of the trainable tensors that are not the
// model's (LoRA adapters live outside its parameters): the `weights` category of memory().
std::uint64_t model_and_adapter_bytes(model::PretrainedModel& model,
                                      const std::vector<NamedTensor>& trainable);

class DenseTraining {
 public:
  // The plugin's device from PluginOptions::device (auto | cpu | cuda); `plugin` names it in
  // errors.
  static torch::Device choose_device(const std::string& device, const std::string& plugin);

  // Freezes every parameter of `model` that is not in `trainable`, moves the model and the
  // trainable tensors to `device` in the compute dtype (masters taken first, before rounding)
  // and creates the optimizer.
  // `shard_group` (null, or one member: none) makes it ZeRO-1 over the group's members, which
  // must be replicas (the same gradients in step()): this rank keeps the float32 masters and
  // AdamW moments of its element_share of each trainable tensor and updates only those, then
  // every member's updated shares are all-gathered into the compute tensors, whole on every
  // member. Checkpoint state is gathered whole, so it reads as the unsharded one.
  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const PluginOptions& options, torch::Device device,
               dist::ProcessGroup* shard_group = nullptr);

  torch::Device device() const { return device_; }
  torch::Dtype compute_dtype() const { return dtype_; }
  const MixedPrecision& precision() const { return *precision_; }
  // The trainable tensors the model computes with, in the order prepare() was given them.
  const std::vector<NamedTensor>& params() const { return params_; }

  // Backward of loss × multiplier (× the loss scale in fp16), accumulating into .grad.
  void backward(const torch::Tensor& loss, double multiplier);
  // Backward from a pipeline stage's output given its gradient (which carries the multiplier
  // and loss scale already: the last stage applied them), accumulating into .grad.
  void backward_through(const torch::Tensor& output, const torch::Tensor& gradient);

  // The update from the compute gradients (.grad, widened and unscaled as the masters need), or
  // from `master_gradients` when given (float32, one per trainable tensor in params() order,
  // undefined for none; ddp's reduced ones; required when sharded). Clips by the global norm,
  // updates unless fp16 skips the step, and clears every gradient.
  // Sharded, `gradient_shares` says the gradients are this member's shares already (ZeRO-2's
  // reduce-scattered ones, flat), not whole tensors to take the share of. `clipped_norm`: the
  // caller has clipped the gradients by their global norm, this (hybrid: over the tensor and
  // pipeline groups too), and fp16's skip decides by it, the same on every rank.
  StepStats step(double lr, double max_grad_norm,
                 const std::vector<torch::Tensor>* master_gradients = nullptr,
                 bool gradient_shares = false, std::optional<double> clipped_norm = std::nullopt);

  // Memory now; `extra_gradient_bytes` are gradient buffers the caller holds (ddp's buckets).
  MemoryByCategory memory(std::uint64_t extra_gradient_bytes = 0) const;
  void release_training_state();

  // Whole float32 tensors (sharded: gathered from every member, which all must call it, into
  // host memory).
  std::vector<NamedTensor> trainable_weights();
  std::vector<NamedTensor> optimizer_state();
  nlohmann::json state_json() const;
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source);

 private:
  std::optional<MixedPrecision> precision_;  // set by prepare()
  torch::Device device_ = torch::kCPU;
  torch::Dtype dtype_ = torch::kFloat32;
  std::vector<NamedTensor> params_;   // compute copies (what the model uses)
  std::vector<NamedTensor> masters_;  // float32 values the optimizer updates (= params_ in fp32)
  std::unique_ptr<optim::AdamW> optimizer_;
  std::uint64_t model_weight_bytes_ = 0;
  // ZeRO-1 (null: every tensor whole here): the group, and this member's share of each tensor of
  // params_ (masters_[i] holds that share, flat).
  dist::ProcessGroup* shard_group_ = nullptr;
  std::vector<ElementShare> shares_;

  StepStats sharded_step(double lr, double max_grad_norm,
                         const std::vector<torch::Tensor>& master_gradients, bool shares,
                         std::optional<double> clipped_norm);
  // This member's range of params_[i], flat (a view into the compute tensor).
  torch::Tensor own_range(std::size_t i) const;
  // After an update: every member's shares into every member's compute tensors.
  void gather_shares();
  // params_[i]'s whole float32 value from each member's share (`share` undefined where this
  // member has none); undefined when no member has one.
  torch::Tensor gather_whole(std::size_t i, const torch::Tensor& share) const;
};

}  // namespace tessera::train
