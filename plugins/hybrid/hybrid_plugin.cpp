#include "plugins/hybrid/hybrid_plugin.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "dist/parallel_context.h"
#include "hf/families.h"
#include "optim/clip.h"
#include "parallel/split_model.h"
#include "plugins/ddp/replica_training.h"
#include "train/lora.h"
#include "train/plugin_registry.h"

namespace tessera::train {
namespace {

class HybridPlugin : public Plugin {
 public:
  std::string name() const override { return "hybrid"; }
  bool runs_distributed() const override { return true; }

  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const PluginOptions& options) override {
    process_ = options.process;
    require_cpu_device(options, name());
    // The runner made the (world / tp) × tp mesh from strategy.options.tp_size and refused a
    // tp_size the processes or the model do not divide (runner::check_hybrid).
    if (process_.tensor_group != nullptr && process_.tensor_group->size() > 1) {
      tensor_group_ = process_.tensor_group;
      layout_ = parallel::split_model(model, *tensor_group_);
      for (const parallel::SplitParameter& p : layout_) split_of_[p.name] = p;
      split_adapters(model, trainable);
    }
    dist::ProcessGroup* data_group =
        process_.data_group != nullptr && process_.data_group->size() > 1 ? process_.data_group
                                                                          : nullptr;
    // The blocks are the model's parameters now (set_data in place): the trainable handles
    // see them, and the masters and moments are made of them.
    replicas_.prepare(model, std::move(trainable), options, torch::kCPU, data_group, name());
    model_ = &model;
  }

  torch::Device device() const override { return dense().device(); }
  torch::Dtype compute_dtype() const override { return dense().compute_dtype(); }
  const ProcessContext& process() const override { return process_; }

  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) override {
    replicas_.backward(loss, multiplier, last_micro_batch);
  }

  StepStats step(double lr, double max_grad_norm) override {
    torch::NoGradGuard no_grad;
    const std::vector<NamedTensor>& params = dense().params();
    std::vector<torch::Tensor> gradients = replicas_.averaged_gradients();
    std::vector<torch::Tensor> split_gradients, whole_gradients;
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      // LoRA's A on a layer split by outputs: each rank's gradient is its outputs' share.
      if (summed_over_tensor_group_.count(params[i].name) && gradients[i].defined())
        tensor_group_->all_reduce(gradients[i]);
      (is_split(params[i].name) ? split_gradients : whole_gradients).push_back(gradients[i]);
    }
    // The global norm: every tensor group's blocks of the split tensors, and the tensors every
    // rank of a group holds whole (their gradients are the same on each) once.
    torch::Tensor split_squares = optim::gradient_norms(split_gradients).pow(2).sum();
    if (tensor_group_ != nullptr) tensor_group_->all_reduce(split_squares);
    const torch::Tensor total =
        (split_squares + optim::gradient_norms(whole_gradients).pow(2).sum()).sqrt();
    StepStats stats;
    stats.grad_norm = optim::apply_clip_coefficient(gradients, total, max_grad_norm);
    stats.applied = dense().step(lr, /*max_grad_norm=*/0.0, &gradients).applied;
    replicas_.finish_step();
    return stats;
  }

  MemoryByCategory memory() const override { return replicas_.memory(); }
  void release_training_state() override { replicas_.release_training_state(); }

  // The export reads whole weights: every rank gathers its tensor group's blocks (the model's and
  // the adapters').
  void gather_weights() override {
    if (tensor_group_ == nullptr || gathered_) return;
    parallel::unsplit_model(*model_, layout_, *tensor_group_);
    torch::NoGradGuard no_grad;
    for (const NamedTensor& p : dense().params())
      if (adapters_.count(p.name) && is_split(p.name))
        p.tensor.set_data(
            parallel::gather_whole(p.tensor.detach(), split_of_.at(p.name), *tensor_group_));
    gathered_ = true;
  }

  // Checkpoints hold whole tensors (every rank of a tensor group gathers them together).
  std::vector<NamedTensor> trainable_weights() override {
    return gathered(dense().trainable_weights(), "");
  }
  std::vector<NamedTensor> optimizer_state() override {
    return gathered(dense().optimizer_state(), ".");
  }
  nlohmann::json state_json() const override { return dense().state_json(); }
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    dense().load_state(blocks_of(weights, ""), blocks_of(optimizer, "."), state, source);
  }

 private:
  DenseTraining& dense() { return replicas_.dense(); }
  const DenseTraining& dense() const { return replicas_.dense(); }

  // LoRA's adapters (outside the model's parameters, PEFT names) on split layers are split with
  // them: on a layer split by its outputs B by its rows (A whole, its gradient summed over the
  // tensor group); on one split by its inputs A by its columns (B whole).
  void split_adapters(model::PretrainedModel& model, std::vector<NamedTensor>& trainable) {
    std::set<const void*> in_model;
    for (const auto& p : model.parameters()) in_model.insert(p.unsafeGetTensorImpl());
    const hf::FamilyTraits& family = hf::family_of(model.config());
    for (NamedTensor& t : trainable) {
      if (in_model.count(t.tensor.unsafeGetTensorImpl())) continue;
      adapters_.insert(t.name);
      const std::optional<LoraMatrix> matrix = lora_matrix_of(t.name);
      if (!matrix)
        throw Error(ErrorKind::Internal, "strategy hybrid: trainable tensor " + t.name +
                                             " is neither a parameter nor a LoRA matrix");
      const bool is_a = matrix->is_a;
      const hf::TensorSplitRule* rule = hf::tensor_split_of(family, matrix->module);
      if (rule == nullptr) continue;  // on a whole layer: whole, the same gradient everywhere
      parallel::SplitParameter p;
      p.name = t.name;
      p.whole_shape = t.tensor.sizes().vec();
      if (rule->split == hf::TensorSplit::Row) {
        if (is_a) p.dim = 1;  // A [r, in]
      } else if (is_a) {
        summed_over_tensor_group_.insert(t.name);
      } else {
        p.dim = 0;  // B [out, r]
        p.parts = rule->parts;
      }
      if (p.dim < 0) continue;
      torch::NoGradGuard no_grad;
      t.tensor.set_data(
          parallel::block_of(t.tensor.detach(), p, tensor_group_->rank(), tensor_group_->size()));
      split_of_[t.name] = p;
    }
  }

  bool is_split(const std::string& parameter) const {
    const auto found = split_of_.find(parameter);
    return found != split_of_.end() && found->second.dim >= 0;
  }
  // How a checkpoint tensor is split: as its parameter, or (`prefixed`: ".") as the parameter
  // its optimizer state belongs to ("exp_avg.<name>"). Whole when it is neither.
  const parallel::SplitParameter& split_of(const std::string& name,
                                           const std::string& prefixed) const {
    static const parallel::SplitParameter whole;
    std::string parameter = name;
    if (!prefixed.empty()) {
      const auto dot = name.find('.');
      parameter = dot == std::string::npos ? name : name.substr(dot + 1);
    }
    const auto found = split_of_.find(parameter);
    return found == split_of_.end() ? whole : found->second;
  }
  std::vector<NamedTensor> gathered(std::vector<NamedTensor> tensors,
                                    const std::string& prefixed) const {
    if (tensor_group_ == nullptr) return tensors;
    for (NamedTensor& t : tensors)
      t.tensor = parallel::gather_whole(t.tensor, split_of(t.name, prefixed), *tensor_group_);
    return tensors;
  }
  std::map<std::string, torch::Tensor> blocks_of(const std::map<std::string, torch::Tensor>& whole,
                                                 const std::string& prefixed) const {
    if (tensor_group_ == nullptr) return whole;
    std::map<std::string, torch::Tensor> blocks;
    for (const auto& [name, tensor] : whole)
      blocks[name] = parallel::block_of(tensor, split_of(name, prefixed), tensor_group_->rank(),
                                        tensor_group_->size());
    return blocks;
  }

  ProcessContext process_;
  dist::ProcessGroup* tensor_group_ = nullptr;  // null: tp_size 1 (nothing split)
  std::vector<parallel::SplitParameter> layout_;
  std::map<std::string, parallel::SplitParameter> split_of_;  // by parameter name
  std::set<std::string> adapters_;                            // LoRA's matrices (PEFT names)
  std::set<std::string> summed_over_tensor_group_;            // whole, each rank's gradient a share
  model::PretrainedModel* model_ = nullptr;
  plugins::ReplicaTraining replicas_;
  bool gathered_ = false;
};

}  // namespace
}  // namespace tessera::train

namespace tessera::plugins {

void register_hybrid_plugin() {
  train::register_plugin("hybrid", [] { return std::make_unique<train::HybridPlugin>(); });
}

}  // namespace tessera::plugins
