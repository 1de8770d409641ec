#include "train/dense_training.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "cuda/runtime.h"
#include "dist/parallel_context.h"
#include "model/quantized_linear.h"
#include "optim/clip.h"
#include "train/param_groups.h"

namespace tessera::train {
namespace {

bool is_model_parameter(model::PretrainedModel& model, const torch::Tensor& t) {
  for (const auto& p : model.parameters())
    if (p.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
  return false;
}

// Elements per member in one all-gather of updated shares (25 MiB in float32).
constexpr std::int64_t kGatherElements = std::int64_t{25} << 18;

}  // namespace

ElementShare element_share(std::int64_t numel, int rank, int members) {
  ElementShare s;
  s.per_rank = (numel + members - 1) / members;
  s.start = std::min(numel, rank * s.per_rank);
  s.count = std::clamp<std::int64_t>(numel - rank * s.per_rank, 0, s.per_rank);
  return s;
}

std::uint64_t model_and_adapter_bytes(model::PretrainedModel& model,
                                      const std::vector<NamedTensor>& trainable) {
  // A quantized base's Linears hold their weights outside the parameters (QLoRA).
  std::uint64_t bytes = model::quantized_weight_bytes(model);
  for (const auto& p : model.parameters()) bytes += static_cast<std::uint64_t>(p.nbytes());
  for (const NamedTensor& t : trainable)
    if (!is_model_parameter(model, t.tensor))
      bytes += static_cast<std::uint64_t>(t.tensor.nbytes());
  return bytes;
}

torch::Device DenseTraining::choose_device(const std::string& device, const std::string& plugin) {
  if (device == "cuda" || (device == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available())
      throw_unsupported("strategy " + plugin +
                            ": strategy.options.device \"cuda\" but no CUDA device is present" +
                            cuda::runtime_note(),
                        "use device \"cpu\" or \"auto\"");
    return torch::Device(torch::kCUDA, 0);
  }
  if (device != "auto" && device != "cpu")
    throw_invalid("strategy.options.device: \"" + device + "\" is not a device for " + plugin,
                  "use auto, cpu or cuda");
  return torch::kCPU;
}

void DenseTraining::prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
                            const PluginOptions& options, torch::Device device,
                            dist::ProcessGroup* shard_group) {
  device_ = device;
  precision_.emplace(options.precision, device_);
  dtype_ = precision_->compute_dtype();
  shard_group_ = shard_group != nullptr && shard_group->size() > 1 ? shard_group : nullptr;
  torch::NoGradGuard no_grad;
  shares_.clear();
  if (shard_group_ != nullptr)
    for (const NamedTensor& t : trainable)
      shares_.push_back(
          element_share(t.tensor.numel(), shard_group_->rank(), shard_group_->size()));
  // Masters first, from the loaded float32 (or wider) values, before anything is rounded.
  if (precision_->keeps_masters() && shard_group_ != nullptr) {
    masters_.clear();
    for (std::size_t i = 0; i < trainable.size(); ++i)
      masters_.push_back({trainable[i].name, trainable[i]
                                                 .tensor.detach()
                                                 .reshape(-1)
                                                 .narrow(0, shares_[i].start, shares_[i].count)
                                                 .to(device_, torch::kFloat32,
                                                     /*non_blocking=*/false, /*copy=*/true)});
  } else if (precision_->keeps_masters()) {
    masters_ = precision_->make_masters(trainable, device_);
  }
  std::set<const void*> trainable_impls;
  for (const NamedTensor& t : trainable) trainable_impls.insert(t.tensor.unsafeGetTensorImpl());
  for (auto& p : model.parameters())
    if (!trainable_impls.count(p.unsafeGetTensorImpl())) p.set_requires_grad(false);
  model.to(device_, dtype_);
  for (NamedTensor& t : trainable) {
    if (t.tensor.device() != device_ || t.tensor.scalar_type() != dtype_)
      t.tensor.set_data(t.tensor.to(device_, dtype_));
    // Shares are flat ranges of the compute tensors.
    if (shard_group_ != nullptr && !t.tensor.is_contiguous())
      t.tensor.set_data(t.tensor.contiguous());
    t.tensor.set_requires_grad(true);
  }
  params_ = std::move(trainable);
  if (!precision_->keeps_masters()) {
    masters_ = params_;
    // fp32 sharded: the masters are this member's ranges of the compute tensors, updated in place.
    if (shard_group_ != nullptr)
      for (std::size_t i = 0; i < params_.size(); ++i) masters_[i].tensor = own_range(i);
  }
  // transformers' Trainer grouping: no weight decay for biases and norm weights.
  std::vector<bool> decays = train::decays_weight(model, params_);
  std::vector<NamedTensor> updated = masters_;
  if (shard_group_ != nullptr) {  // AdamW over the shares this member has
    updated.clear();
    std::vector<bool> owned_decays;
    for (std::size_t i = 0; i < masters_.size(); ++i) {
      if (shares_[i].count == 0) continue;
      updated.push_back(masters_[i]);
      owned_decays.push_back(decays[i]);
    }
    decays = std::move(owned_decays);
  }
  optimizer_ = std::make_unique<optim::AdamW>(
      train::split_by_decay(updated, decays, options.adamw.weight_decay), options.adamw);
  // In bf16 / fp16 the update writes the compute copy in the same pass (CPU) or right after.
  if (precision_->keeps_masters()) {
    std::map<std::string, torch::Tensor> copy_of;
    for (std::size_t i = 0; i < params_.size(); ++i)
      copy_of[params_[i].name] =
          shard_group_ != nullptr ? own_range(i) : params_[i].tensor.detach();
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
                              const std::vector<torch::Tensor>* master_gradients,
                              bool gradient_shares, std::optional<double> clipped_norm) {
  torch::NoGradGuard no_grad;
  if (shard_group_ != nullptr) {
    if (master_gradients == nullptr)
      throw Error(ErrorKind::Internal,
                  "DenseTraining::step: sharded over replicas but given no averaged gradients");
    return sharded_step(lr, max_grad_norm, *master_gradients, gradient_shares, clipped_norm);
  }
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
  stats.grad_norm = clipped_norm ? *clipped_norm : optim::clip_grad_norm(masters, max_grad_norm);
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
  // (Sharded, the masters' gradients are ranges of the caller's averaged ones.)
  for (const NamedTensor& t : masters_)
    if (precision_->keeps_masters() && shard_group_ == nullptr && t.tensor.grad().defined())
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
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto it = weights.find(params_[i].name);
    if (it == weights.end())
      throw_invalid(source + ": the checkpoint has no weight \"" + params_[i].name + "\"",
                    kResumeSameTraining);
    if (it->second.sizes() != params_[i].tensor.sizes())
      throw_invalid(source + ": weight \"" + params_[i].name + "\" has shape " +
                    c10::str(it->second.sizes()) + ", the model has " +
                    c10::str(params_[i].tensor.sizes()));
    if (shard_group_ != nullptr) {
      // Every member reads the whole tensor: the compute copy whole, the master its share.
      params_[i].tensor.detach().copy_(it->second);
      if (precision_->keeps_masters())
        masters_[i].tensor.copy_(
            it->second.reshape(-1).narrow(0, shares_[i].start, shares_[i].count));
      continue;
    }
    masters_[i].tensor.detach().copy_(it->second);
    if (precision_->keeps_masters()) params_[i].tensor.detach().copy_(masters_[i].tensor);
  }
  if (weights.size() != masters_.size())
    throw_invalid(source + ": the checkpoint holds " + std::to_string(weights.size()) +
                      " weights but this run trains " + std::to_string(masters_.size()),
                  kResumeSameTraining);
  precision_->restore_state(state, source);
  std::map<std::string, torch::Tensor> moments = optimizer;
  if (shard_group_ != nullptr) {  // whole moments: this member's shares of them
    std::map<std::string, std::size_t> index_of;
    for (std::size_t i = 0; i < params_.size(); ++i) index_of[params_[i].name] = i;
    moments.clear();
    for (const auto& [name, value] : optimizer) {
      const auto dot = name.find('.');
      const auto it = index_of.find(dot == std::string::npos ? name : name.substr(dot + 1));
      if (it == index_of.end()) {
        moments[name] = value;  // unknown: AdamW::load_state names it
        continue;
      }
      const ElementShare& s = shares_[it->second];
      if (value.numel() != params_[it->second].tensor.numel())
        throw_invalid(source + ": optimizer tensor \"" + name + "\" has " +
                          std::to_string(value.numel()) + " elements, its weight " +
                          std::to_string(params_[it->second].tensor.numel()),
                      kResumeSameTraining);
      if (s.count > 0) moments[name] = value.reshape(-1).narrow(0, s.start, s.count);
    }
  }
  try {
    optimizer_->load_state(moments, state.at("optimizer_steps").get<std::int64_t>(), source);
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(source + ": trainer_state.json: plugin state is invalid (" + e.what() + ")");
  }
}

std::vector<NamedTensor> DenseTraining::trainable_weights() {
  if (shard_group_ == nullptr) return masters_;
  // fp32: the compute tensors are the whole, current values on every member.
  if (!precision_->keeps_masters()) return params_;
  std::vector<NamedTensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    out.push_back({params_[i].name, gather_whole(i, masters_[i].tensor)});
  return out;
}

std::vector<NamedTensor> DenseTraining::optimizer_state() {
  if (shard_group_ == nullptr) return optimizer_->state_tensors();
  std::map<std::string, torch::Tensor> mine;
  for (NamedTensor& t : optimizer_->state_tensors()) mine[t.name] = t.tensor;
  std::vector<NamedTensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (const char* moment : {"exp_avg.", "exp_avg_sq."}) {
      const std::string name = moment + params_[i].name;
      const auto found = mine.find(name);
      torch::Tensor whole = gather_whole(i, found == mine.end() ? torch::Tensor() : found->second);
      if (whole.defined()) out.push_back({name, whole});
    }
  }
  return out;
}

StepStats DenseTraining::sharded_step(double lr, double max_grad_norm,
                                      const std::vector<torch::Tensor>& master_gradients,
                                      bool shares, std::optional<double> clipped_norm) {
  if (master_gradients.size() != params_.size())
    throw Error(ErrorKind::Internal,
                "DenseTraining::step: " + std::to_string(master_gradients.size()) +
                    " gradients for " + std::to_string(params_.size()) + " trainable tensors");
  std::vector<torch::Tensor> gradients;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& g = master_gradients[i];
    if (shares_[i].count == 0 || !g.defined()) continue;
    masters_[i].tensor.mutable_grad() =
        shares ? g : g.reshape(-1).narrow(0, shares_[i].start, shares_[i].count);
    gradients.push_back(masters_[i].tensor.grad());
  }
  StepStats stats;
  if (clipped_norm) {
    stats.grad_norm = *clipped_norm;
  } else {
    // The global norm from every member's shares (the members' gradients are the same, so this
    // is the norm of the whole tensors).
    torch::Tensor squares =
        optim::gradient_norms(gradients).pow(2).sum().to(torch::kCPU, torch::kFloat32).contiguous();
    shard_group_->all_reduce(squares);
    stats.grad_norm = optim::apply_clip_coefficient(gradients, squares.sqrt(), max_grad_norm);
  }
  stats.applied = precision_->accept_step(stats.grad_norm);
  if (stats.applied) {
    optimizer_->step(lr);
    gather_shares();
  }
  for (NamedTensor& p : params_) p.tensor.mutable_grad() = torch::Tensor();
  for (NamedTensor& m : masters_) m.tensor.mutable_grad() = torch::Tensor();
  return stats;
}

torch::Tensor DenseTraining::own_range(std::size_t i) const {
  return params_[i].tensor.detach().view(-1).narrow(0, shares_[i].start, shares_[i].count);
}

void DenseTraining::gather_shares() {
  const int members = shard_group_->size();
  const int rank = shard_group_->rank();
  std::size_t next = 0;
  while (next < params_.size()) {
    // A run of tensors whose shares fit one all-gather (one tensor at least).
    std::vector<std::size_t> run;
    std::int64_t segment = 0;
    while (next < params_.size() &&
           (run.empty() || segment + shares_[next].per_rank <= kGatherElements)) {
      run.push_back(next);
      segment += shares_[next].per_rank;
      ++next;
    }
    torch::Tensor send = torch::zeros({segment}, torch::dtype(dtype_).device(device_));
    std::int64_t offset = 0;
    for (std::size_t i : run) {
      if (shares_[i].count > 0) send.narrow(0, offset, shares_[i].count).copy_(own_range(i));
      offset += shares_[i].per_rank;
    }
    const torch::Tensor gathered = shard_group_->all_gather(send);
    for (int r = 0; r < members; ++r) {
      if (r == rank) continue;
      offset = r * segment;
      for (std::size_t i : run) {
        const ElementShare s = element_share(params_[i].tensor.numel(), r, members);
        if (s.count > 0)
          params_[i]
              .tensor.detach()
              .view(-1)
              .narrow(0, s.start, s.count)
              .copy_(gathered.narrow(0, offset, s.count));
        offset += shares_[i].per_rank;
      }
    }
  }
}

torch::Tensor DenseTraining::gather_whole(std::size_t i, const torch::Tensor& share) const {
  const int members = shard_group_->size();
  const std::int64_t per_rank = shares_[i].per_rank;
  const auto options = torch::dtype(torch::kFloat32).device(device_);
  // The share, then 1 when this member has one.
  torch::Tensor send = torch::zeros({per_rank + 1}, options);
  if (share.defined() && shares_[i].count > 0) {
    send.narrow(0, 0, shares_[i].count).copy_(share.reshape(-1));
    send[per_rank] = 1.0f;
  }
  // Assembled in host memory (checkpoints hold whole tensors there): on a GPU the caller keeps
  // every tensor of the state, which whole would not fit beside the training state. One copy down
  // of the gathered shares, one at a time on the GPU.
  const torch::Tensor gathered = shard_group_->all_gather(send).to(torch::kCPU);
  const std::int64_t numel = params_[i].tensor.numel();
  torch::Tensor whole = torch::zeros({numel}, torch::kFloat32);
  bool any = false;
  for (int r = 0; r < members; ++r) {
    const torch::Tensor part = gathered.narrow(0, r * (per_rank + 1), per_rank + 1);
    if (part[per_rank].item<float>() == 0.0f) continue;
    any = true;
    const ElementShare s = element_share(numel, r, members);
    whole.narrow(0, s.start, s.count).copy_(part.narrow(0, 0, s.count));
  }
  return any ? whole.view(params_[i].tensor.sizes()) : torch::Tensor();
}

}  // namespace tessera::train
