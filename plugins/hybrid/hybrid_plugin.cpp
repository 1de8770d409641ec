#include "plugins/hybrid/hybrid_plugin.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "dist/parallel_context.h"
#include "hf/families.h"
#include "job/strategies.h"
#include "optim/clip.h"
#include "parallel/pipeline_stage.h"
#include "parallel/replica_training.h"
#include "parallel/split_model.h"
#include "train/lora.h"
#include "train/plugin_registry.h"

namespace tessera::train {
namespace {

class HybridPlugin : public Plugin {
 public:
  std::string name() const override { return "hybrid"; }
  bool runs_distributed() const override { return true; }
  // Each rank reads only the weights its pipeline stage holds.
  bool reads_deferred_weights() const override { return true; }

  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const PluginOptions& options) override {
    process_ = options.process;
    // On a GPU (device "cuda", or "auto" with a GPU for each rank of this machine): rank r on GPU
    // LOCAL_RANK. The model is read and split on the CPU (below), then moved there whole by
    // DenseTraining; the tensor and data groups' collectives run on NCCL, the pipeline's sends and
    // receives through host memory (dist::ProcessGroup::send says why).
    const torch::Device device = train::cpu_or_rank_cuda_device(options, name());
    // Whole shapes, for checkpoints and the export (which hold whole tensors).
    for (const auto& item : model.named_parameters())
      whole_shape_[item.key()] = item.value().sizes().vec();
    std::set<const void*> in_model;
    for (const auto& p : model.parameters()) in_model.insert(p.unsafeGetTensorImpl());
    for (const NamedTensor& t : trainable) {
      whole_shape_[t.name] = t.tensor.sizes().vec();
      trainable_names_.push_back(t.name);
      if (in_model.count(t.tensor.unsafeGetTensorImpl())) continue;
      adapters_.insert(t.name);  // LoRA's matrices (outside the model's parameters)
      adapter_handles_[t.name] = t.tensor;
    }
    // The runner made the dp × pp × tp mesh from strategy.options.tp_size and pp_size and
    // refused sizes the processes or the model do not divide (runner::check_hybrid).
    if (process_.pipeline_group != nullptr && process_.pipeline_group->size() > 1) {
      stages_ = std::make_unique<parallel::PipelineStages>(
          model, *process_.pipeline_group, job::hybrid_pipeline_chunks(options.strategy_options));
      std::erase_if(trainable, [&](const NamedTensor& t) { return !stages_->holds(t.name); });
      // Before any weight is read: a stage reads only its own layers' (below), so each rank's
      // memory holds about 1 / pp of the model from the start.
      stages_->release_other_stages(model);
    }
    if (options.deferred_weights) {
      for (auto& item : model.named_parameters())
        if (item.value().numel() > 0) options.deferred_weights->read_into(item.key(), item.value());
    }
    if (process_.tensor_group != nullptr && process_.tensor_group->size() > 1) {
      tensor_group_ = process_.tensor_group;
      const bool sequence_parallel = job::hybrid_sequence_parallel(options.strategy_options);
      layout_ = parallel::split_model(model, *tensor_group_, whole_shape_, sequence_parallel);
      for (const parallel::SplitParameter& p : layout_) split_of_[p.name] = p;
      split_adapters(model);
      // Sequence parallelism: the layers' whole tensors see this rank's positions only, so
      // each rank's gradient of them is a share (summed over the group, counted once).
      if (sequence_parallel)
        for (const std::string& name : trainable_names_)
          if (!is_split(name) && !summed_over_tensor_group_.count(name) &&
              parallel::sequence_parallel_shared(model.config(), name))
            summed_over_tensor_group_.insert(name);
    }
    if (stages_) {
      if (options.log && process_.rank == 0)
        options.log("info",
                    "strategy hybrid: " + std::to_string(stages_->stages()) + " pipeline stages" +
                        (stages_->chunks() > 1 ? " of " + std::to_string(stages_->chunks()) +
                                                     " interleaved chunks each"
                                               : "") +
                        " hold " + parallel::describe_stages(stages_->layout()));
    }
    dist::ProcessGroup* data_group =
        process_.data_group != nullptr && process_.data_group->size() > 1 ? process_.data_group
                                                                          : nullptr;
    // zero_stage 1: the replicas of a block share its masters and moments (ZeRO-1); 2: its
    // gradients too (ZeRO-2).
    const int zero_stage = job::hybrid_zero_stage(options.strategy_options);
    if (zero_stage > 0 && data_group == nullptr && options.log && process_.rank == 0)
      options.log("warning",
                  "strategy.options.zero_stage " + std::to_string(zero_stage) + ": the " +
                      std::to_string(process_.world_size) +
                      " processes are one data-parallel replica (tp_size × pp_size), so there is "
                      "no one to share the optimizer state or gradients with; every rank keeps "
                      "its own whole");
    // The blocks are the model's parameters now (set_data in place): the trainable handles
    // see them, and the masters and moments are made of them.
    replicas_.prepare(model, std::move(trainable), options, device, data_group, name(), zero_stage);
    data_group_ = data_group;
    model_ = &model;
  }

  torch::Device device() const override { return dense().device(); }
  torch::Dtype compute_dtype() const override { return dense().compute_dtype(); }
  const ProcessContext& process() const override { return process_; }

  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) override {
    replicas_.backward(loss, multiplier, last_micro_batch);
  }

  // With pipeline stages the plugin runs the step's micro-batches (1F1B).
  bool runs_micro_batches() const override { return stages_ != nullptr; }
  std::vector<double> run_micro_batches(std::vector<MicroBatch>& micro_batches) override {
    std::vector<model::ForwardInput> inputs;
    std::vector<model::DropoutStream> streams;
    std::vector<double> multipliers;
    for (MicroBatch& m : micro_batches) {
      inputs.push_back(std::move(m.input));
      streams.push_back(m.dropout);
      multipliers.push_back(m.multiplier);
    }
    // Plain 1F1B: the last micro-batch's backward ends every gradient of the stage, and the
    // replicas average them as it runs. Interleaved: a stage's chunks end their backwards at
    // different times, so every backward accumulates and the average follows the schedule.
    const bool interleaved = stages_->chunks() > 1;
    const int last = static_cast<int>(inputs.size()) - 1;
    std::vector<double> losses = stages_->run_one_f_one_b(
        *model_, inputs, streams,
        [&](const torch::Tensor& output, const torch::Tensor& gradient, int micro_batch) {
          const bool ends_step = !interleaved && micro_batch == last;
          if (gradient.defined())
            replicas_.backward_through(output, gradient, ends_step);
          else
            replicas_.backward(output, multipliers[static_cast<std::size_t>(micro_batch)],
                               ends_step);
        },
        activations());
    if (interleaved) replicas_.reduce_accumulated();
    return losses;
  }
  double last_schedule_idle_seconds() const override { return stages_->last_idle_seconds(); }
  double evaluation_loss(const model::ForwardInput& input) override {
    return stages_->forward_loss(*model_, input, activations());
  }

  StepStats step(double lr, double max_grad_norm) override {
    torch::NoGradGuard no_grad;
    const std::vector<NamedTensor>& params = dense().params();
    // ZeRO-2: this replica's share of each averaged gradient, flat. The sums below are
    // element-wise over ranks holding the same shares (the same data-parallel rank), so they
    // apply to shares as to whole tensors.
    const bool shares = replicas_.gradient_shares();
    std::vector<torch::Tensor> gradients = replicas_.averaged_gradients();
    share_tied_gradient(gradients);
    std::vector<torch::Tensor> split_gradients, whole_gradients;
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      // LoRA's A on a layer split by outputs: each rank's gradient is its outputs' share.
      if (summed_over_tensor_group_.count(params[i].name) && gradients[i].defined())
        tensor_group_->all_reduce(gradients[i]);
      // A kv head's block held by several ranks (fewer kv heads than ranks): each holder's
      // gradient is its query heads' share; the block's is their sum, counted once in the norm.
      bool counted = true;
      if (is_split(params[i].name) && split_of_.at(params[i].name).replicas > 1 &&
          gradients[i].defined()) {
        parallel::SplitParameter p = split_of_.at(params[i].name);
        if (shares) p.dim = 0;  // a flat share: every holder's at the same elements
        gradients[i] = parallel::sum_over_replicas(gradients[i], p, *tensor_group_);
        counted = tensor_group_->rank() % p.replicas == 0;
      }
      // The last stage's copy of a tied embedding counts once, on the first stage.
      if (stages_ && stages_->last() && params[i].name == stages_->tied_embedding()) continue;
      if (counted)
        (is_split(params[i].name) ? split_gradients : whole_gradients).push_back(gradients[i]);
    }
    // The global norm: every tensor group's blocks of the split tensors, and the tensors every
    // rank of a group holds whole (their gradients are the same on each) once; then every
    // pipeline stage's.
    // On this rank's device even where it has no such gradient (gradient_norms' empty result is
    // a CPU tensor): every member's tensor goes through the same backend.
    torch::Tensor split_squares =
        optim::gradient_norms(split_gradients).pow(2).sum().to(device(), torch::kFloat32);
    if (tensor_group_ != nullptr) tensor_group_->all_reduce(split_squares);
    torch::Tensor squares =
        (split_squares + optim::gradient_norms(whole_gradients).pow(2).sum().to(device()))
            .to(torch::kFloat32)
            .contiguous();
    if (shares) data_group_->all_reduce(squares);  // the replicas' shares make up each tensor
    if (stages_) stages_->group().all_reduce(squares);
    const torch::Tensor total = squares.sqrt();
    StepStats stats;
    stats.grad_norm = optim::apply_clip_coefficient(gradients, total, max_grad_norm);
    // fp16's skip by this global norm: every rank skips (and backs off its loss scale) together.
    stats.applied =
        dense().step(lr, /*max_grad_norm=*/0.0, &gradients, shares, stats.grad_norm).applied;
    replicas_.finish_step();
    return stats;
  }

  MemoryByCategory memory() const override { return replicas_.memory(); }
  void release_training_state() override { replicas_.release_training_state(); }

  // The export reads whole weights: every rank gathers its tensor group's blocks (the model's and
  // the adapters').
  void gather_weights() override {
    if (gathered_) return;
    gathered_ = true;
    torch::NoGradGuard no_grad;
    // On a GPU the export runs from host memory, as on the CPU: the whole model would not fit
    // on each rank's GPU beside its training state (which the leader frees only after this).
    if (device().is_cuda()) {
      model_->to(torch::kCPU);
      for (auto& [name, tensor] : adapter_handles_) tensor.set_data(tensor.to(torch::kCPU));
    }
    if (stages_) gather_stages();
    if (tensor_group_ == nullptr) return;
    parallel::unsplit_model(*model_, layout_, *tensor_group_);
    for (const auto& [name, tensor] : adapter_tensors())
      if (is_split(name))
        tensor.set_data(
            parallel::gather_whole(tensor.detach(), split_of_.at(name), *tensor_group_));
  }

  // Checkpoints hold whole tensors, which rank 0 writes (train/trainer.cpp): every rank of a
  // tensor group gathers each block with the others, and the ranks of rank 0's pipeline send
  // their stage's to it. The other ranks drop what they gathered as they go and return nothing,
  // so only the writer ever holds the whole state (at tp 2 it was on every rank: +230 MiB each).
  std::vector<NamedTensor> trainable_weights() override {
    return across_stages(gathered(dense().trainable_weights(), ""), "");
  }
  std::vector<NamedTensor> optimizer_state() override {
    return across_stages(gathered(dense().optimizer_state(), "."), ".");
  }
  nlohmann::json state_json() const override { return dense().state_json(); }
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    dense().load_state(blocks_of(this_stage(weights, ""), ""),
                       blocks_of(this_stage(optimizer, "."), "."), state, source);
  }

 private:
  DenseTraining& dense() { return replicas_.dense(); }
  const DenseTraining& dense() const { return replicas_.dense(); }
  torch::TensorOptions activations() const {
    return torch::TensorOptions().dtype(compute_dtype()).device(device());
  }

  // A tied embedding's gradient is the first stage's (the lookup) plus the last's (the head):
  // summed over the pipeline group, the stages between giving zeros.
  void share_tied_gradient(std::vector<torch::Tensor>& gradients) {
    if (!stages_ || stages_->tied_embedding().empty()) return;
    const std::string& tied = stages_->tied_embedding();
    if (std::find(trainable_names_.begin(), trainable_names_.end(), tied) == trainable_names_.end())
      return;  // frozen (LoRA): no gradient anywhere
    torch::Tensor sum;
    const std::vector<NamedTensor>& params = dense().params();
    if (!tied_index_) {  // found once: the trained tensors do not change between steps
      tied_index_ = params.size();
      for (std::size_t i = 0; i < params.size(); ++i)
        if (params[i].name == tied) tied_index_ = i;
    }
    const std::size_t index = *tied_index_;
    if (index < params.size() && gradients[index].defined()) {
      sum = gradients[index].contiguous();
    } else if (replicas_.gradient_shares()) {  // this replica's share of the block, flat
      std::int64_t numel = 1;
      for (std::int64_t n : block_shape(tied)) numel *= n;
      sum = torch::zeros(
          {train::element_share(numel, data_group_->rank(), data_group_->size()).count},
          torch::dtype(torch::kFloat32).device(device()));
    } else {
      sum = torch::zeros(block_shape(tied), torch::dtype(torch::kFloat32).device(device()));
    }
    stages_->group().all_reduce(sum);
    if (index < params.size()) gradients[index] = sum;
  }

  // A tensor's shape on this rank of its tensor group (its block when split; a kv head's block
  // held by `replicas` ranks is one of size / replicas, as parallel::block_of cuts it).
  std::vector<std::int64_t> block_shape(const std::string& name) const {
    std::vector<std::int64_t> shape = whole_shape_.at(name);
    const auto found = split_of_.find(name);
    if (found != split_of_.end() && found->second.dim >= 0)
      shape[static_cast<std::size_t>(found->second.dim)] /=
          tensor_group_->size() / std::max(1, found->second.replicas);
    return shape;
  }

  // LoRA's matrices by name (they are not parameters of the model).
  std::map<std::string, torch::Tensor> adapter_tensors() const {
    std::map<std::string, torch::Tensor> out;
    for (const std::string& name : adapters_)
      if (const auto found = adapter_handles_.find(name); found != adapter_handles_.end())
        out[name] = found->second;
    return out;
  }

  // The export: every stage's parameters and adapters (this tensor rank's blocks) on every
  // stage, and the model whole again.
  void gather_stages() {
    std::map<std::string, torch::Tensor> mine;
    std::vector<std::string> names;
    std::map<std::string, torch::Tensor> handles;
    for (const auto& item : model_->named_parameters()) {
      names.push_back(item.key());
      handles[item.key()] = item.value();
    }
    for (const auto& [name, tensor] : adapter_tensors()) {
      names.push_back(name);
      handles[name] = tensor;
    }
    // Through host memory (Gloo), in the compute dtype every stage's own tensors have: on a GPU
    // the whole model would not fit beside the training state, and other stages' adapters stay
    // where LoRA made them (float32, on the CPU) until they arrive.
    for (const auto& [name, tensor] : handles)
      if (stages_->owner(name) == stages_->stage())
        mine[name] = tensor.detach().to(torch::kCPU, compute_dtype());
    const std::map<std::string, torch::Tensor> all =
        stages_->share(names, mine, [&](const std::string& name) {
          return torch::empty(block_shape(name), torch::dtype(compute_dtype()));
        });
    for (const auto& [name, tensor] : all)
      if (stages_->owner(name) != stages_->stage()) handles.at(name).set_data(tensor);
    model_->stage = {};
  }

  // Checkpoint tensors (whole, this stage's) made every stage's. `prefixed`: optimizer state,
  // named "<moment>.<parameter>".
  std::vector<NamedTensor> across_stages(std::vector<NamedTensor> tensors,
                                         const std::string& prefixed) const {
    if (!on_writers_pipeline()) return {};
    if (!stages_) return process_.rank == 0 ? tensors : std::vector<NamedTensor>{};
    // Through host memory (Gloo): the writer holds every stage's tensors at once, which on a GPU
    // would not fit beside its training state.
    std::map<std::string, torch::Tensor> mine;
    for (const NamedTensor& t : tensors)
      if (stages_->owner(parameter_of(t.name, prefixed)) == stages_->stage())
        mine[t.name] = t.tensor.to(torch::kCPU);
    std::vector<std::string> names;
    for (const std::string& name : trainable_names_) {
      if (prefixed.empty()) {
        names.push_back(name);
      } else {
        names.push_back("exp_avg." + name);
        names.push_back("exp_avg_sq." + name);
      }
    }
    const bool writer = process_.rank == 0;
    const std::map<std::string, torch::Tensor> all = stages_->share(
        names, mine,
        [&](const std::string& name) {
          return torch::empty(whole_shape_.at(parameter_of(name, prefixed)), torch::kFloat32);
        },
        /*keep_received=*/writer);
    if (!writer) return {};
    std::vector<NamedTensor> out;
    for (const std::string& name : names)
      if (const auto found = all.find(name); found != all.end())
        out.push_back({name, found->second});
    return out;
  }
  // The checkpoint tensors this stage trains.
  std::map<std::string, torch::Tensor> this_stage(const std::map<std::string, torch::Tensor>& all,
                                                  const std::string& prefixed) const {
    if (!stages_) return all;
    std::map<std::string, torch::Tensor> out;
    for (const auto& [name, tensor] : all)
      if (stages_->holds(parameter_of(name, prefixed))) out[name] = tensor;
    return out;
  }
  static std::string parameter_of(const std::string& name, const std::string& prefixed) {
    if (prefixed.empty()) return name;
    const auto dot = name.find('.');
    return dot == std::string::npos ? name : name.substr(dot + 1);
  }

  // LoRA's adapters (outside the model's parameters, PEFT names) on split layers are split with
  // them: on a layer split by its outputs B by its rows (A whole, its gradient summed over the
  // tensor group); on one split by its inputs A by its columns (B whole).
  void split_adapters(model::PretrainedModel& model) {
    const hf::FamilyTraits& family = hf::family_of(model.config());
    // Every adapter, those of other pipeline stages too (their blocks come from their stage for
    // the export).
    for (auto& [name, tensor] : adapter_handles_) {
      const NamedTensor t{name, tensor};
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
        p.replicas = parallel::replicas_of(*rule, model.config(), tensor_group_->size());
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
    const auto found = split_of_.find(parameter_of(name, prefixed));
    return found == split_of_.end() ? whole : found->second;
  }
  // Whole tensors from this tensor group's blocks; a rank off the writer's pipeline takes part
  // in each gather and drops its result at once.
  std::vector<NamedTensor> gathered(std::vector<NamedTensor> tensors,
                                    const std::string& prefixed) const {
    // Another replica's tensor group has nothing to give the writer.
    if (process_.data_group != nullptr && process_.data_group->rank() != 0) return {};
    if (tensor_group_ == nullptr) return tensors;
    const bool keep = on_writers_pipeline();
    for (NamedTensor& t : tensors) {
      torch::Tensor whole =
          parallel::gather_whole(t.tensor, split_of(t.name, prefixed), *tensor_group_);
      // Kept in host memory: on a GPU one whole tensor at a time is there.
      t.tensor = keep ? whole.to(torch::kCPU) : torch::Tensor();
    }
    if (!keep) tensors.clear();
    return tensors;
  }
  // Whether this rank's pipeline (its tensor rank and data replica) holds rank 0, which writes
  // checkpoints: the mesh puts rank 0 at tensor rank 0 of replica 0.
  bool on_writers_pipeline() const {
    return (tensor_group_ == nullptr || tensor_group_->rank() == 0) &&
           (process_.data_group == nullptr || process_.data_group->rank() == 0);
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
  dist::ProcessGroup* data_group_ = nullptr;    // null: one replica (nothing averaged)
  std::vector<parallel::SplitParameter> layout_;
  std::map<std::string, parallel::SplitParameter> split_of_;  // by parameter name
  std::set<std::string> adapters_;                            // LoRA's matrices (PEFT names)
  std::set<std::string> summed_over_tensor_group_;            // whole, each rank's gradient a share
  std::map<std::string, torch::Tensor> adapter_handles_;      // LoRA's matrices by name
  std::map<std::string, std::vector<std::int64_t>> whole_shape_;  // parameters and trainables
  std::vector<std::string> trainable_names_;  // every stage's, in the order prepare() got them
  std::unique_ptr<parallel::PipelineStages> stages_;  // null: pp_size 1
  model::PretrainedModel* model_ = nullptr;
  parallel::ReplicaTraining replicas_;
  bool gathered_ = false;
  std::optional<std::size_t> tied_index_;  // the tied embedding's place in params (size: none)
};

}  // namespace
}  // namespace tessera::train

namespace tessera::plugins {

void register_hybrid_plugin() {
  train::register_plugin("hybrid", [] { return std::make_unique<train::HybridPlugin>(); });
}

}  // namespace tessera::plugins
