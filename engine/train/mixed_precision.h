#pragma once
// The float32 master weights and fp16 loss scaling, as one component every plugin shares (today
// `single` and `gemini`; the data-parallel plugins next). A plugin decides where the masters are
// stored (whole tensors for `single`, optimizer chunks for `gemini`); this decides what they are,
// how a compute gradient becomes a master gradient, whether a step is applied, and what the
// checkpoint records, so checkpoints move between plugins.
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/loss_scaler.h"

namespace tessera::train {

enum class Precision;

class MixedPrecision {
 public:
  // Refuses fp16 off CUDA (loss scaling is only tested there).
  MixedPrecision(Precision precision, torch::Device device);

  Precision precision() const { return precision_; }
  torch::Dtype compute_dtype() const { return compute_dtype_; }
  // Whether the trainable values are float32 masters apart from the compute copies (bf16, fp16);
  // in fp32 the compute tensors are the masters.
  bool keeps_masters() const { return compute_dtype_ != torch::kFloat32; }

  // The factor backward multiplies the loss by: `multiplier` (1 / accumulation steps), times the
  // loss scale in fp16.
  double backward_multiplier(double multiplier) const;
  // The float32 gradient the update uses: the compute gradient widened and, in fp16, unscaled.
  torch::Tensor master_gradient(const torch::Tensor& compute_gradient) const;
  // What a compute gradient is divided by to give the master's: the loss scale in fp16, else 1.
  double gradient_divisor() const;
  // Float32 masters on `device` of `trainable`, copied before anything is rounded to the compute
  // dtype (call before converting the model); in fp32, `trainable` itself.
  std::vector<optim::NamedTensor> make_masters(const std::vector<optim::NamedTensor>& trainable,
                                               torch::Device device) const;

  // After the global gradient norm (of the unscaled gradients) is known: whether the update is
  // applied. In fp16 a non-finite norm skips it and lowers the loss scale.
  bool accept_step(double grad_norm);

  // What trainer_state.json keeps of it ("loss_scale", "loss_scale_good_steps"), and back;
  // `source` names the checkpoint in errors.
  void write_state(nlohmann::json& state) const;
  void restore_state(const nlohmann::json& state, const std::string& source);

 private:
  Precision precision_;
  torch::Dtype compute_dtype_;
  optim::DynamicLossScaler scaler_;
};

}  // namespace tessera::train
