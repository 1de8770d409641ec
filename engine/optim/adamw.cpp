#include "optim/adamw.h"

#include <cmath>

#include "core/error.h"

namespace tessera::optim {

AdamW::AdamW(std::vector<NamedTensor> params, AdamWOptions options)
    : params_(std::move(params)), slots_(params_.size()), options_(options) {
  if (!(options_.beta1 >= 0.0 && options_.beta1 < 1.0) ||
      !(options_.beta2 >= 0.0 && options_.beta2 < 1.0))
    throw_invalid("AdamW: betas must lie in [0, 1), got (" + std::to_string(options_.beta1) + ", " +
                  std::to_string(options_.beta2) + ")");
  if (!(options_.eps >= 0.0)) throw_invalid("AdamW: eps must be >= 0");
  if (!(options_.weight_decay >= 0.0)) throw_invalid("AdamW: weight_decay must be >= 0");
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i].tensor;
    const torch::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    Slot& slot = slots_[i];
    if (!slot.exp_avg.defined()) {
      slot.exp_avg = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      slot.exp_avg_sq = torch::zeros_like(p, torch::MemoryFormat::Preserve);
    }
    if (options_.weight_decay != 0.0) p.mul_(1.0 - lr * options_.weight_decay);
    slot.exp_avg.lerp_(grad, 1.0 - options_.beta1);
    slot.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    torch::Tensor denom = (slot.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options_.eps);
    p.addcdiv_(slot.exp_avg, denom, -step_size);
  }
}

std::vector<NamedTensor> AdamW::state_tensors() const {
  std::vector<NamedTensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!slots_[i].exp_avg.defined()) continue;
    out.push_back({"exp_avg." + params_[i].name, slots_[i].exp_avg});
    out.push_back({"exp_avg_sq." + params_[i].name, slots_[i].exp_avg_sq});
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, torch::Tensor>& tensors, std::int64_t steps,
                       const std::string& source) {
  if (steps < 0) throw_invalid(source + ": optimizer step count " + std::to_string(steps) + " < 0");
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < params_.size(); ++i) index[params_[i].name] = i;
  std::vector<Slot> slots(params_.size());
  for (const auto& [name, tensor] : tensors) {
    bool is_avg = name.rfind("exp_avg.", 0) == 0;
    bool is_sq = name.rfind("exp_avg_sq.", 0) == 0;
    if (!is_avg && !is_sq)
      throw_invalid(source + ": unexpected optimizer tensor \"" + name + "\"",
                    "the checkpoint was not written by this trainer");
    const std::string param = name.substr(is_sq ? 11 : 8);
    auto it = index.find(param);
    if (it == index.end())
      throw_invalid(source + ": optimizer state for \"" + param +
                        "\", which is not a trainable parameter of this run",
                    "resume with the same model and method (full / LoRA and its targets)");
    const torch::Tensor& p = params_[it->second].tensor;
    if (tensor.sizes() != p.sizes())
      throw_invalid(source + ": optimizer tensor \"" + name + "\" has shape " +
                    c10::str(tensor.sizes()) + " but the parameter has " + c10::str(p.sizes()));
    torch::Tensor copy = tensor.to(p.options()).clone();
    (is_sq ? slots[it->second].exp_avg_sq : slots[it->second].exp_avg) = copy;
  }
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i].exp_avg.defined() != slots[i].exp_avg_sq.defined())
      throw_invalid(source + ": optimizer state of \"" + params_[i].name +
                    "\" has only one of exp_avg / exp_avg_sq");
  slots_ = std::move(slots);
  step_ = steps;
}

std::uint64_t AdamW::state_bytes() const {
  std::uint64_t bytes = 0;
  for (const Slot& s : slots_)
    if (s.exp_avg.defined())
      bytes += static_cast<std::uint64_t>(s.exp_avg.nbytes() + s.exp_avg_sq.nbytes());
  return bytes;
}

}  // namespace tessera::optim
