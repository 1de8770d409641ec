#include "train/activation_checkpoint.h"

#include <optional>

#include "model/dropout.h"

namespace tessera::train {
namespace {

struct SavedLayer : torch::CustomClassHolder {
  LayerFunction fn;
  torch::Tensor cpu_rng_state;
  torch::Tensor device_rng_state;  // the input's CUDA generator, when it is on a GPU
  // The layout-free dropout's stream as the layer started (model/dropout.h), when there is one.
  std::optional<model::DropoutStream> dropout_stream;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // `anchor` is an empty tensor that requires grad, so backward runs even when `x` needs no
  // gradient (e.g. LoRA with frozen embeddings) but the layer's parameters do.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& anchor, const LayerFunction& fn) {
    auto saved = c10::make_intrusive<SavedLayer>();
    saved->fn = fn;
    saved->cpu_rng_state = cpu_rng_state();
    if (x.is_cuda()) saved->device_rng_state = device_rng_state(x.device());
    saved->dropout_stream = model::current_dropout_stream();
    ctx->saved_data["layer"] = c10::IValue::make_capsule(saved);
    ctx->save_for_backward({x});
    (void)anchor;
    return fn(x);  // grad mode is off inside Function::forward: no activations kept
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor x = ctx->get_saved_variables().at(0);
    auto saved =
        c10::static_intrusive_pointer_cast<SavedLayer>(ctx->saved_data["layer"].toCapsule());
    torch::Tensor input = x.detach().set_requires_grad(x.requires_grad());
    // The recomputation draws the dropout masks the forward drew, then the streams go on.
    const torch::Tensor rng_now = cpu_rng_state();
    set_cpu_rng_state(saved->cpu_rng_state);
    torch::Tensor device_rng_now;
    if (saved->device_rng_state.defined()) {
      device_rng_now = device_rng_state(x.device());
      set_device_rng_state(x.device(), saved->device_rng_state);
    }
    torch::Tensor output;
    {
      torch::AutoGradMode grad_on(true);
      // Backward may run on another thread than the forward did: the copy of the stream is
      // installed here, and its sites count up from where the layer's forward started.
      std::optional<model::DropoutScope> dropout_scope;
      if (saved->dropout_stream) dropout_scope.emplace(*saved->dropout_stream);
      output = saved->fn(input);
    }
    set_cpu_rng_state(rng_now);
    if (device_rng_now.defined()) set_device_rng_state(x.device(), device_rng_now);
    if (output.requires_grad()) torch::autograd::backward({output}, {grad_outputs.at(0)});
    return {x.requires_grad() ? input.grad() : torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpointed(const LayerFunction& fn, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled()) return fn(x);  // nothing to save memory on
  torch::Tensor anchor = torch::empty({0}, x.options()).set_requires_grad(true);
  return CheckpointFunction::apply(x, anchor, fn);
}

torch::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

torch::Tensor device_rng_state(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_device_rng_state(c10::Device device, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace tessera::train
