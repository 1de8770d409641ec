#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "optim/cpu_adam.h"

namespace tessera::optim {

AdamW::AdamW(std::vector<NamedTensor> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{{std::move(params), options.weight_decay}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options) : options_(options) {
  for (ParamGroup& group : groups) {
    if (!(group.weight_decay >= 0.0)) throw_invalid("AdamW: weight_decay must be >= 0");
    for (NamedTensor& p : group.params) {
      params_.push_back(std::move(p));
      decay_.push_back(group.weight_decay);
    }
  }
  slots_.resize(params_.size());
  copies_.resize(params_.size());
  validate();
}

void AdamW::validate() const {
  if (!(options_.beta1 >= 0.0 && options_.beta1 < 1.0) ||
      !(options_.beta2 >= 0.0 && options_.beta2 < 1.0))
    throw_invalid("AdamW: betas must lie in [0, 1), got (" + std::to_string(options_.beta1) + ", " +
                  std::to_string(options_.beta2) + ")");
  if (!(options_.eps >= 0.0)) throw_invalid("AdamW: eps must be >= 0");
}

void AdamW::set_compute_copies(std::vector<torch::Tensor> copies) {
  if (copies.size() != params_.size())
    throw Error(ErrorKind::Internal, "AdamW: " + std::to_string(copies.size()) +
                                         " compute copies for " + std::to_string(params_.size()) +
                                         " parameters");
  for (std::size_t i = 0; i < copies.size(); ++i)
    if (copies[i].defined() && copies[i].sizes() != params_[i].tensor.sizes())
      throw Error(ErrorKind::Internal, "AdamW: the compute copy of " + params_[i].name +
                                           " has another shape than the parameter");
  copies_ = std::move(copies);
}

bool AdamW::fused_cpu_applies(const torch::Tensor& p, const torch::Tensor& grad,
                              const torch::Tensor& copy) {
  const auto is_cpu_float = [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
  };
  if (!is_cpu_float(p) || !is_cpu_float(grad)) return false;
  if (!copy.defined()) return true;
  return copy.device().is_cpu() && copy.is_contiguous() &&
         (copy.scalar_type() == torch::kBFloat16 || copy.scalar_type() == torch::kFloat16);
}

void adamw_step_ops(torch::Tensor& p, const torch::Tensor& grad, torch::Tensor& exp_avg,
                    torch::Tensor& exp_avg_sq, double lr, const AdamWOptions& options,
                    double weight_decay, std::int64_t step) {
  const double bias_correction1 = 1.0 - std::pow(options.beta1, static_cast<double>(step));
  const double bias_correction2_sqrt =
      std::sqrt(1.0 - std::pow(options.beta2, static_cast<double>(step)));
  if (weight_decay != 0.0) p.mul_(1.0 - lr * weight_decay);
  exp_avg.lerp_(grad, 1.0 - options.beta1);
  exp_avg_sq.mul_(options.beta2).addcmul_(grad, grad, 1.0 - options.beta2);
  torch::Tensor denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options.eps);
  p.addcdiv_(exp_avg, denom, -(lr / bias_correction1));
}

bool AdamW::fused_device_applies(const torch::Tensor& p, const torch::Tensor& grad) {
  return p.is_cuda() && p.scalar_type() == torch::kFloat32 && p.is_contiguous() &&
         grad.device() == p.device() && grad.scalar_type() == torch::kFloat32 &&
         grad.is_contiguous();
}

void adamw_fused_step(FusedAdamWLists& lists, double lr, const AdamWOptions& options,
                      double weight_decay, std::int64_t step) {
  if (lists.params.empty()) return;
  // The kernel reads the step from a tensor per parameter (torch keeps one in each state);
  // one shared tensor on the parameters' device is enough as nothing writes it.
  const torch::Tensor step_tensor =
      torch::full({}, static_cast<double>(step), lists.params.front().options());
  const std::vector<torch::Tensor> steps(lists.params.size(), step_tensor);
  torch::_fused_adamw_(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, {}, steps, lr,
                       options.beta1, options.beta2, weight_decay, options.eps,
                       /*amsgrad=*/false, /*maximize=*/false);
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  // GPU tensors: gathered per (device, weight decay) for one fused launch each, after the loop.
  struct DeviceGroup {
    torch::Device device;
    double weight_decay;
    FusedAdamWLists lists;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (updated, compute copy)
  };
  std::vector<DeviceGroup> device_groups;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i].tensor;
    const torch::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    Slot& slot = slots_[i];
    if (!slot.exp_avg.defined()) {
      slot.exp_avg = torch::zeros_like(p, torch::MemoryFormat::Contiguous);
      slot.exp_avg_sq = torch::zeros_like(p, torch::MemoryFormat::Contiguous);
    }
    const torch::Tensor& copy = copies_[i];
    const double weight_decay = decay_[i];
    if (fused_cpu_applies(p, grad, copy) && slot.exp_avg.is_contiguous() &&
        slot.exp_avg_sq.is_contiguous()) {
      AdamArrays arrays;
      arrays.param = p.data_ptr<float>();
      arrays.grad = grad.data_ptr<float>();
      arrays.exp_avg = slot.exp_avg.data_ptr<float>();
      arrays.exp_avg_sq = slot.exp_avg_sq.data_ptr<float>();
      arrays.count = p.numel();
      if (copy.defined()) {
        arrays.copy = static_cast<std::uint16_t*>(copy.data_ptr());
        arrays.copy_kind = copy.scalar_type() == torch::kBFloat16 ? LowPrecisionCopy::Bf16
                                                                  : LowPrecisionCopy::Fp16;
      }
      cpu_adamw_step(arrays,
                     {lr, options_.beta1, options_.beta2, options_.eps, weight_decay, step_});
      // Written through raw pointers: tell autograd, as an in-place op would.
      p.unsafeGetTensorImpl()->bump_version();
      if (copy.defined()) copy.unsafeGetTensorImpl()->bump_version();
      continue;
    }
    if (fused_device_applies(p, grad) && slot.exp_avg.is_contiguous() &&
        slot.exp_avg_sq.is_contiguous()) {
      auto group = std::find_if(device_groups.begin(), device_groups.end(), [&](const auto& g) {
        return g.device == p.device() && g.weight_decay == weight_decay;
      });
      if (group == device_groups.end())
        group = device_groups.insert(device_groups.end(), {p.device(), weight_decay, {}, {}});
      group->lists.params.push_back(p);
      group->lists.grads.push_back(grad);
      group->lists.exp_avgs.push_back(slot.exp_avg);
      group->lists.exp_avg_sqs.push_back(slot.exp_avg_sq);
      if (copy.defined()) group->copies.emplace_back(p, copy);
      continue;
    }
    adamw_step_ops(p, grad, slot.exp_avg, slot.exp_avg_sq, lr, options_, weight_decay, step_);
    if (copy.defined()) copy.copy_(p);
  }
  for (DeviceGroup& group : device_groups) {
    adamw_fused_step(group.lists, lr, options_, group.weight_decay, step_);
    for (auto& [updated, copy] : group.copies) copy.copy_(updated);
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
                    kResumeSameTraining);
    const torch::Tensor& p = params_[it->second].tensor;
    if (tensor.sizes() != p.sizes())
      throw_invalid(source + ": optimizer tensor \"" + name + "\" has shape " +
                    c10::str(tensor.sizes()) + " but the parameter has " + c10::str(p.sizes()));
    torch::Tensor copy = tensor.to(p.options()).contiguous().clone();
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
