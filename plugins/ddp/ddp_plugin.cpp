// The `ddp` plugin: every rank a whole replica, gradients averaged over the data-parallel group
// in buckets launched during backward (what PyTorch's DistributedDataParallel does; written
// from its documented behaviour, on engine/dist's collectives). The buckets are
// parallel/gradient_buckets.h, shared with `zero`.
#include "plugins/ddp/ddp_plugin.h"

#include <memory>
#include <string>
#include <utility>

#include "core/error.h"
#include "dist/parallel_context.h"
#include "parallel/gradient_buckets.h"
#include "parallel/replica_training.h"
#include "train/plugin_registry.h"

namespace tessera::train {
namespace {

class DdpPlugin : public Plugin {
 public:
  std::string name() const override { return "ddp"; }
  bool runs_distributed() const override { return true; }

  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const PluginOptions& options) override {
    const ProcessContext& process = options.process;
    if (process.world_size < 1 || process.rank < 0 || process.rank >= process.world_size)
      throw_invalid("strategy ddp: rank " + std::to_string(process.rank) + " of " +
                    std::to_string(process.world_size) + " processes is not a place in the job");
    if (process.world_size > 1 && (!process.parallel || process.data_group == nullptr))
      throw Error(ErrorKind::Internal,
                  "strategy ddp: rank " + std::to_string(process.rank) + " of " +
                      std::to_string(process.world_size) +
                      " processes has no data-parallel group (ProcessContext::data_group)",
                  "start the job with `tessera-cli launch`, which joins the ranks");
    process_ = process;
    group_ = process.world_size > 1 ? process.data_group : nullptr;
    // On a GPU (device "cuda", or "auto" with a GPU for each rank of this machine): rank r on GPU
    // LOCAL_RANK, its gradients reduced by NCCL (the runner makes NCCL groups for such a job).
    const torch::Device device = train::cpu_or_rank_cuda_device(options, name());
    replicas_.prepare(model, std::move(trainable), options, device, group_, name());
    // Every rank starts from rank 0's values: the model, the adapters and the float32 masters.
    std::vector<NamedTensor> starting = dense().params();
    for (const NamedTensor& m : dense().trainable_weights()) starting.push_back(m);
    parallel::broadcast_from_rank0(group_, model, starting);
  }

  torch::Device device() const override { return dense().device(); }
  torch::Dtype compute_dtype() const override { return dense().compute_dtype(); }
  const ProcessContext& process() const override { return process_; }

  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) override {
    replicas_.backward(loss, multiplier, last_micro_batch);
  }

  StepStats step(double lr, double max_grad_norm) override {
    std::vector<torch::Tensor> gradients = replicas_.averaged_gradients();
    // Clipping sees the reduced gradients, the same on every rank, so every rank takes the
    // same step.
    const StepStats stats = dense().step(lr, max_grad_norm, &gradients);
    replicas_.finish_step();
    return stats;
  }

  MemoryByCategory memory() const override { return replicas_.memory(); }
  void release_training_state() override { replicas_.release_training_state(); }

  std::vector<NamedTensor> trainable_weights() override { return dense().trainable_weights(); }
  std::vector<NamedTensor> optimizer_state() override { return dense().optimizer_state(); }
  nlohmann::json state_json() const override { return dense().state_json(); }
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    dense().load_state(weights, optimizer, state, source);
  }

  const plugins::DdpTrace* trace() const { return replicas_.trace(); }

 private:
  DenseTraining& dense() { return replicas_.dense(); }
  const DenseTraining& dense() const { return replicas_.dense(); }

  ProcessContext process_;
  dist::ProcessGroup* group_ = nullptr;  // null in one process: nothing to reduce
  parallel::ReplicaTraining replicas_;
};

}  // namespace
}  // namespace tessera::train

namespace tessera::plugins {

void register_ddp_plugin() {
  train::register_plugin("ddp", [] { return std::make_unique<train::DdpPlugin>(); });
}

const DdpTrace* ddp_trace(const train::Plugin& plugin) {
  const auto* ddp = dynamic_cast<const train::DdpPlugin*>(&plugin);
  return ddp != nullptr ? ddp->trace() : nullptr;
}

}  // namespace tessera::plugins
