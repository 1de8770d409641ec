#pragma once
// AdamW with the numerics of torch.optim.AdamW (single-tensor path, foreach=False):
//   p ← p·(1 − lr·wd)                           decoupled weight decay, applied first
//   m ← lerp(m, g, 1 − β1);  v ← β2·v + (1 − β2)·g²
//   p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)   (ε outside the square root)
// Float32 tensors on the CPU go through the fused CPU Adam (optim/cpu_adam.h: one pass, SIMD,
// multithreaded), which equals torch's fused AdamW bit for bit and the single-tensor path up to
// the last bit of its square root; float32 tensors on a GPU go through torch's fused AdamW
// kernel (one multi-tensor launch per device and weight decay); others (float64) take the
// per-op torch path.
// The optimizer holds only its state (m, v, step); the parameters and their gradients belong
// to whoever calls step() (a Plugin), so a plugin can place them where it likes.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
};

// Parameters that share a weight decay, as torch's param_groups. transformers' Trainer puts
// biases and norm weights in a group without decay (train/param_groups.h builds that split).
struct ParamGroup {
  std::vector<NamedTensor> params;
  double weight_decay = 0.0;
};

// One AdamW update of `p` in torch ops (any device; the per-op path of AdamW::step, and the
// device Adam of gemini's chunks on a GPU): `step` counted from 1, `grad` the same dtype.
void adamw_step_ops(torch::Tensor& p, const torch::Tensor& grad, torch::Tensor& exp_avg,
                    torch::Tensor& exp_avg_sq, double lr, const AdamWOptions& options,
                    double weight_decay, std::int64_t step);

// One AdamW update of every tensor of `params` at once in torch's fused multi-tensor kernel
// (`_fused_adamw_`, what torch.optim.AdamW(fused=True) runs): all on one device, float32,
// contiguous, the lists parallel; `step` counted from 1 (already incremented).
struct FusedAdamWLists {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> exp_avgs;
  std::vector<torch::Tensor> exp_avg_sqs;
};
void adamw_fused_step(FusedAdamWLists& lists, double lr, const AdamWOptions& options,
                      double weight_decay, std::int64_t step);

class AdamW {
 public:
  // `params`: the (float32) tensors the optimizer updates, by name, all with
  // options.weight_decay. Their `.grad()` is read in step(); a parameter without a gradient is
  // skipped, as torch does.
  AdamW(std::vector<NamedTensor> params, AdamWOptions options);
  // Groups with their own weight decay (options.weight_decay is not used).
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options);

  // Low-precision compute copies (bf16 or fp16, same shapes), one per parameter in params()
  // order (an undefined tensor for none): step() writes each updated parameter into its copy,
  // fused into the update on the CPU.
  void set_compute_copies(std::vector<torch::Tensor> copies);

  // One update with learning rate `lr`. Runs under NoGradGuard.
  void step(double lr);

  std::int64_t steps_taken() const { return step_; }
  const AdamWOptions& options() const { return options_; }
  const std::vector<NamedTensor>& params() const { return params_; }
  double weight_decay_of(std::size_t param_index) const { return decay_[param_index]; }

  // State as named tensors: "exp_avg.<name>", "exp_avg_sq.<name>" (float32, same shapes as the
  // parameters; absent for a parameter never updated), for checkpoints.
  std::vector<NamedTensor> state_tensors() const;
  // Restores what state_tensors() returned plus the step count. Throws tessera::Error
  // (InvalidInput) naming `source` and the tensor when a name is unknown or a shape differs.
  void load_state(const std::map<std::string, torch::Tensor>& tensors, std::int64_t steps,
                  const std::string& source);
  // Bytes held by m and v.
  std::uint64_t state_bytes() const;

 private:
  struct Slot {
    torch::Tensor exp_avg;
    torch::Tensor exp_avg_sq;
  };
  void validate() const;
  // The fused CPU kernel applies to contiguous float32 CPU tensors with a matching gradient.
  static bool fused_cpu_applies(const torch::Tensor& p, const torch::Tensor& grad,
                                const torch::Tensor& copy);
  // torch's fused kernel applies to contiguous float32 GPU tensors with a matching gradient.
  static bool fused_device_applies(const torch::Tensor& p, const torch::Tensor& grad);

  std::vector<NamedTensor> params_;
  std::vector<double> decay_;  // weight decay per parameter (from its group)
  std::vector<torch::Tensor> copies_;
  std::vector<Slot> slots_;
  AdamWOptions options_;
  std::int64_t step_ = 0;
};

}  // namespace tessera::optim
