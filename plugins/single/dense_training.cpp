#include "plugins/single/dense_training.h"

#include <set>

#include "core/error.h"
#include "optim/clip.h"
#include "train/param_groups.h"

namespace tessera::train {
namespace {

bool is_model_parameter(model::PretrainedModel& model, const torch::Tensor& t) {
  for (const auto& p : model.parameters())
    if (p.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
  return false;
}

}  // namespace

std::uint64_t model_and_adapter_bytes(model::PretrainedModel& model,
                                      const std::vector<NamedTensor>& trainable) {
  std::uint64_t bytes = 0;
  for (const auto& p : model.parameters()) bytes += static_cast<std::uint64_t>(p.nbytes());
  for (const NamedTensor& t : trainable)
    if (!is_model_parameter(model, t.tensor))
      bytes += static_cast<std::uint64_t>(t.tensor.nbytes());
  return bytes;
}

torch::Device DenseTraining::choose_device(const std::string& device, const std::string& plugin) {
  if (device == "cuda" || (device == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available())
      throw_unsupported("strategy.options.device: \"cuda\" but no CUDA device is present",
                        "use device \"cpu\" or \"auto\"");
    return torch::Device(torch::kCUDA, 0);
  }
  if (device != "auto" && device != "cpu")
    throw_invalid("strategy.options.device: \"" + device + "\" is not a device for " + plugin,
                  "use auto, cpu or cuda");
  return torch::kCPU;
}

void DenseTraining::prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
                            const PluginOptions& options, torch::Device device) {
  device_ = device;
  precision_.emplace(options.precision, device_);
  dtype_ = precision_->compute_dtype();
  torch::NoGradGuard no_grad;
  // Masters first, from the loaded float32 (or wider) values, before anything is rounded.
  if (precision_->keeps_masters()) masters_ = precision_->make_masters(trainable, device_);
  std::set<const void*> trainable_impls;
  for (const NamedTensor& t : trainable) trainable_impls.insert(t.tensor.unsafeGetTensorImpl());
  for (auto& p : model.parameters())
    if (!trainable_impls.count(p.unsafeGetTensorImpl())) p.set_requires_grad(false);
  model.to(device_, dtype_);
  for (NamedTensor& t : trainable) {
    if (t.tensor.device() != device_ || t.tensor.scalar_type() != dtype_)
      t.tensor.set_data(t.tensor.to(device_, dtype_));
    t.tensor.set_requires_grad(true);
  }
  params_ = std::move(trainable);
  if (!precision_->keeps_masters()) masters_ = params_;
  // transformers' Trainer grouping: no weight decay for biases and norm weights.
  const std::vector<bool> decays = train::decays_weight(model, params_);
  optimizer_ = std::make_unique<optim::AdamW>(
      train::split_by_decay(masters_, decays, options.adamw.weight_decay), options.adamw);
  // In bf16 / fp16 the update writes the compute copy in the same pass (CPU) or right after.
  if (precision_->keeps_masters()) {
    std::map<std::string, torch::Tensor> copy_of;
    for (const NamedTensor& p : params_) copy_of[p.name] = p.tensor.detach();
    std::vector<torch::Tensor> copies;
    for (const NamedTensor& m : optimizer_->params()) copies.push_back(copy_of.at(m.name));
    optimizer_->set_compute_copies(std::move(copies));
  }
  model_weight_bytes_ = model_and_adapter_bytes(model, params_);
}

void DenseTraining::backward(const torch::Tensor& loss, double multiplier) {
  (loss * precision_->backward_multiplier(multiplier)).backward();
}

void DenseTraining::backward_through(const torch::Tensor& output, const torch::Tensor& gradient) {
  torch::autograd::backward({output}, {gradient});
}

StepStats DenseTraining::step(double lr, double max_grad_norm,
                              const std::vector<torch::Tensor>* master_gradients) {
  torch::NoGradGuard no_grad;
  if (master_gradients != nullptr) {
    if (master_gradients->size() != masters_.size())
      throw Error(ErrorKind::Internal,
                  "DenseTraining::step: " + std::to_string(master_gradients->size()) +
                      " gradients for " + std::to_string(masters_.size()) + " trainable tensors");
    for (std::size_t i = 0; i < masters_.size(); ++i)
      masters_[i].tensor.mutable_grad() = (*master_gradients)[i];
  } else if (precision_->keeps_masters()) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const torch::Tensor& g = params_[i].tensor.grad();
      masters_[i].tensor.mutable_grad() =
          g.defined() ? precision_->master_gradient(g) : torch::Tensor();
    }
  }
  std::vector<torch::Tensor> masters;
  for (const NamedTensor& m : masters_) masters.push_back(m.tensor);
  StepStats stats;
  stats.grad_norm = optim::clip_grad_norm(masters, max_grad_norm);
  stats.applied = precision_->accept_step(stats.grad_norm);
  if (stats.applied) optimizer_->step(lr);
  for (NamedTensor& p : params_) p.tensor.mutable_grad() = torch::Tensor();
  for (NamedTensor& m : masters_) m.tensor.mutable_grad() = torch::Tensor();
  return stats;
}

MemoryByCategory DenseTraining::memory(std::uint64_t extra_gradient_bytes) const {
  MemoryByCategory m;
  m.weights = model_weight_bytes_;
  m.gradients = extra_gradient_bytes;
  // Gradients that exist now (between backward and the update; none after a step).
  for (const NamedTensor& p : params_)
    if (p.tensor.grad().defined())
      m.gradients += static_cast<std::uint64_t>(p.tensor.grad().nbytes());
  for (const NamedTensor& t : masters_)
    if (precision_->keeps_masters() && t.tensor.grad().defined())
      m.gradients += static_cast<std::uint64_t>(t.tensor.grad().nbytes());
  if (precision_->keeps_masters())
    for (const NamedTensor& t : masters_)
      m.weights += static_cast<std::uint64_t>(t.tensor.nbytes());
  m.optimizer = optimizer_ ? optimizer_->state_bytes() : 0;
  return m;
}

void DenseTraining::release_training_state() {
  optimizer_.reset();
  if (precision_->keeps_masters()) masters_.clear();
}

nlohmann::json DenseTraining::state_json() const {
  nlohmann::json state = {{"optimizer_steps", optimizer_->steps_taken()}};
  precision_->write_state(state);
  return state;
}

void DenseTraining::load_state(const std::map<std::string, torch::Tensor>& weights,
                               const std::map<std::string, torch::Tensor>& optimizer,
                               const nlohmann::json& state, const std::string& source) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < masters_.size(); ++i) {
    auto it = weights.find(masters_[i].name);
    if (it == weights.end())
      throw_invalid(source + ": the checkpoint has no weight \"" + masters_[i].name + "\"",
                    "resume with the same model and method (full / LoRA and its targets)");
    if (it->second.sizes() != masters_[i].tensor.sizes())
      throw_invalid(source + ": weight \"" + masters_[i].name + "\" has shape " +
                    c10::str(it->second.sizes()) + ", the model has " +
                    c10::str(masters_[i].tensor.sizes()));
    masters_[i].tensor.detach().copy_(it->second);
    if (precision_->keeps_masters()) params_[i].tensor.detach().copy_(masters_[i].tensor);
  }
  if (weights.size() != masters_.size())
    throw_invalid(source + ": the checkpoint holds " + std::to_string(weights.size()) +
                      " weights but this run trains " + std::to_string(masters_.size()),
                  "resume with the same model and method (full / LoRA and its targets)");
  precision_->restore_state(state, source);
  try {
    optimizer_->load_state(optimizer, state.at("optimizer_steps").get<std::int64_t>(), source);
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(source + ": trainer_state.json: plugin state is invalid (" + e.what() + ")");
  }
}

}  // namespace tessera::train
