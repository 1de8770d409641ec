#pragma once
// Activation checkpointing for one layer: run it without keeping its activations, and in
// backward re-run it under grad mode and backpropagate through the recomputation (the
// "reentrant" scheme of torch.utils.checkpoint, written as a custom autograd::Function since
// LibTorch has no checkpoint). Gradients of the tensors the layer captures (its parameters)
// accumulate into their .grad exactly as in a plain backward. The layout-free dropout's stream
// (model/dropout.h) and torch's CPU and CUDA generator states are replayed, so dropout draws the
// same masks in the recomputation.
//
// Wired into the models through PretrainedModel::layer_wrapper (the trainer sets it when
// training.activation_checkpointing is on).
#include <torch/torch.h>

#include <functional>

namespace tessera::train {

using LayerFunction = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(x), recomputed in backward. `fn` is copied and must stay valid to call until backward
// (capture tensors by value).
torch::Tensor checkpointed(const LayerFunction& fn, const torch::Tensor& x);

// The default CPU generator's state (saved by checkpoints, replayed by recomputed layers so
// that dropout masks repeat).
torch::Tensor cpu_rng_state();
void set_cpu_rng_state(const torch::Tensor& state);
// The same for a CUDA device's default generator (dropout on the GPU draws from it): saved in
// checkpoints and replayed by recomputation beside the CPU one. Only called for a CUDA device.
torch::Tensor device_rng_state(c10::Device device);
void set_device_rng_state(c10::Device device, const torch::Tensor& state);

}  // namespace tessera::train
