// The `single` plugin: one process, one device (CUDA device 0 when present, else the CPU).
#include "plugins/single/single_plugin.h"

#include "train/dense_training.h"
#include "train/plugin_registry.h"

namespace tessera::train {
namespace {

class SinglePlugin : public Plugin {
 public:
  std::string name() const override { return "single"; }

  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const PluginOptions& options) override {
    require_one_process(options.process, name());
    process_ = options.process;
    dense_.prepare(model, std::move(trainable), options,
                   DenseTraining::choose_device(options.device, name()));
  }

  torch::Device device() const override { return dense_.device(); }
  torch::Dtype compute_dtype() const override { return dense_.compute_dtype(); }
  const ProcessContext& process() const override { return process_; }

  void backward(const torch::Tensor& loss, double multiplier, bool /*last_micro_batch*/) override {
    dense_.backward(loss, multiplier);
  }
  StepStats step(double lr, double max_grad_norm) override {
    return dense_.step(lr, max_grad_norm);
  }

  MemoryByCategory memory() const override { return dense_.memory(); }
  void release_training_state() override { dense_.release_training_state(); }

  std::vector<NamedTensor> trainable_weights() override { return dense_.trainable_weights(); }
  std::vector<NamedTensor> optimizer_state() override { return dense_.optimizer_state(); }
  nlohmann::json state_json() const override { return dense_.state_json(); }
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    dense_.load_state(weights, optimizer, state, source);
  }

 private:
  ProcessContext process_;
  DenseTraining dense_;
};

}  // namespace
}  // namespace tessera::train

namespace tessera::plugins {

void register_single_plugin() {
  train::register_plugin("single", [] { return std::make_unique<train::SinglePlugin>(); });
}

}  // namespace tessera::plugins
