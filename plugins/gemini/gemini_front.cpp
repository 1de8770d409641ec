// The registered `gemini`: one process runs the single-process plugin (gemini_plugin.cpp), several
// the sharded one (sharded_gemini.cpp). The choice is made in prepare(), which is the first call
// that knows the world size; until then the one-process plugin answers.
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "plugins/gemini/gemini_plugin.h"
#include "plugins/gemini/sharded_gemini.h"
#include "train/plugin.h"
#include "train/plugin_registry.h"

namespace tessera::plugins {
namespace {

class GeminiFront : public train::Plugin {
 public:
  GeminiFront() : impl_(make_one_process_gemini()) {}

  std::string name() const override { return "gemini"; }
  bool runs_distributed() const override { return true; }
  bool reads_deferred_weights() const override { return true; }

  void prepare(model::PretrainedModel& model, std::vector<train::NamedTensor> trainable,
               const train::PluginOptions& options) override {
    const char* one = std::getenv(kShardedOneProcessVariable);
    if (options.process.world_size > 1 || (one != nullptr && std::string(one) == "1"))
      impl_ = make_sharded_gemini();
    impl_->prepare(model, std::move(trainable), options);
  }

  torch::Device device() const override { return impl_->device(); }
  torch::Dtype compute_dtype() const override { return impl_->compute_dtype(); }
  const train::ProcessContext& process() const override { return impl_->process(); }
  StateLayout state_layout() const override { return impl_->state_layout(); }
  std::map<std::string, train::StateSlice> state_slices() const override {
    return impl_->state_slices();
  }
  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) override {
    impl_->backward(loss, multiplier, last_micro_batch);
  }
  train::StepStats step(double lr, double max_grad_norm) override {
    return impl_->step(lr, max_grad_norm);
  }
  void settle() override { impl_->settle(); }
  train::MemoryByCategory memory() const override { return impl_->memory(); }
  std::optional<train::DiskTierMemory> disk_memory() const override { return impl_->disk_memory(); }
  std::optional<train::DeviceTierMemory> device_tier_memory() const override {
    return impl_->device_tier_memory();
  }
  void release_training_state() override { impl_->release_training_state(); }
  bool weights_in_memory() const override { return impl_->weights_in_memory(); }
  void visit_weights(model::PretrainedModel& model, const WeightVisit& visit) override {
    impl_->visit_weights(model, visit);
  }
  void gather_weights() override { impl_->gather_weights(); }
  std::vector<train::NamedTensor> trainable_weights() override {
    return impl_->trainable_weights();
  }
  std::vector<train::NamedTensor> optimizer_state() override { return impl_->optimizer_state(); }
  nlohmann::json state_json() const override { return impl_->state_json(); }
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    impl_->load_state(weights, optimizer, state, source);
  }

  const train::Plugin& implementation() const { return *impl_; }

 private:
  std::unique_ptr<train::Plugin> impl_;
};

}  // namespace

void register_gemini_plugin() {
  train::register_plugin("gemini", [] { return std::make_unique<GeminiFront>(); });
}

bool gemini_shard_held(const train::Plugin& plugin, GeminiShardHeld* held) {
  const auto* front = dynamic_cast<const GeminiFront*>(&plugin);
  return front != nullptr && sharded_gemini_held(front->implementation(), held);
}

}  // namespace tessera::plugins
