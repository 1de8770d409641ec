#pragma once
// The cost model of a step's compute, shared by every strategy: the FLOPs of the products and of
// the attention at the device's measured rate, plus a fixed cost per op. Torch-free.
#include "hf/config.h"
#include "plan/settings.h"

namespace tessera::plan {

// The per-token work of a step besides its fixed cost per op: the elements whose products the
// step computes (FLOPs ∝ these: 2 per element per token forward, 4 backward, 2 without weight
// gradients as for LoRA's frozen base) and the attention's scores and weighted sums (FLOPs of one
// forward per token, 2 more of it backward whatever is trained). Activation checkpointing adds a
// forward of both.
struct StepWork {
  double products = 0;
  double attention = 0;
  // A quantized base's values (QLoRA), dequantized once per forward, once more in backward and
  // in a recomputation: per micro-batch, whatever its tokens.
  double dequantized = 0;
};

double step_flops(const Settings& s, const StepWork& work, double tokens);

// Forward FLOPs per token of `layers` layers' attention over sequences of `sequence` tokens, its
// heads split over `tp` ranks: a query's scores against the keys and the sum of their values,
// 2 · 2 · (heads · head_dim) per key; a causal model's kernel (LibTorch's flash attention, on the
// CPU too) skips the blocks above the diagonal, so a query sees half the sequence on average.
double attention_flops(const hf::ModelConfig& c, double layers, double sequence, int tp);

// Tokens per sequence of a step of `tokens` tokens at the settings' batch.
double sequence_of(const Settings& s, double tokens);

// Seconds of a step by the cost model: FLOPs at the device's rate, plus a fixed cost per op
// (LibTorch's dispatch, autograd's bookkeeping, a kernel launch) that dominates small models.
// Ops per step: about 120 per layer and 40 outside the layers in each micro-batch's forward and
// backward, 130 per layer and 60 outside in the optimizer step and clipping. kSecondsPerOp is
// fitted on a 4-layer, hidden-128 Llama (the demo model before it went to 2 layers) on a 2-core
// Xeon: a step of 32 tokens took 18 ms (median of 40) where its FLOPs alone give 3 ms; 2048 tokens
// took 180 ms against 200 ms.
inline constexpr double kSecondsPerOp = 10e-6;
// Seconds a QLoRA step spends per value a quantized linear dequantizes, over what the same step
// on a dense base takes (the dequantization, bf16 straight from the codes, and the matmuls cut
// into tiles): measured by bench_qlora on a 1.1B llama, 2-core AMD EPYC with AVX-512, 2 x 128
// tokens: 4.35 s a step against 3.12 s dense, over 2 x 0.97e9 values dequantized, 0.63 ns each.
// A step time measured on the machine calibrates the model as for everything else (calibrate()).
inline constexpr double kSecondsPerDequantizedValue = 0.63e-9;

double modelled_step_seconds(const Settings& s, const StepWork& work, double tokens, double layers,
                             double flops_per_s);

// Seconds of one forward of a micro-batch without gradients (an evaluation's batch) by the same
// model: 2 FLOPs per product and the attention once, a third of a micro-batch's ops, nothing of
// the optimizer's; `tokens` the step's, as above.
double modelled_forward_seconds(const Settings& s, const StepWork& work, double tokens,
                                double layers, double flops_per_s);

// The whole model's work per token: every layer's tensors, the final norm and the LM head (tied
// or not: the tied embedding's matrix is a product there), LoRA's adapters; not the input
// embedding or learned positions, which are lookups. Its attention over the settings' sequences.
StepWork model_work(const hf::ModelConfig& c, const Settings& s, double tokens);

}  // namespace tessera::plan
