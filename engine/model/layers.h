#pragma once
// The engine's own building blocks. Every model family is written with these (never with
// torch::nn::Linear & co. directly), so that LoRA, tensor parallelism, activation
// checkpointing and chunked parameters can wrap or swap one block type without touching the
// families. Parameters are registered under the names HuggingFace uses ("weight", "bias").
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace tessera::model {

// What a plugin puts around every use of a block's parameters, so that they need not stay in
// memory between uses (Gemini's parameter chunks on disk; tensor parallelism will gather sharded
// weights here). Installed per block by the plugin; null: the parameters are always there.
class ParameterUse {
 public:
  virtual ~ParameterUse() = default;
  // Before `block` computes with its parameters (in forward, or in its recomputation under
  // activation checkpointing): they must be in memory when this returns.
  virtual void enter(const torch::nn::Module& block) = 0;
  // After it did; `output` is the block's result. `needs_parameters_in_backward`: the block's
  // backward reads them (a layer's input gradient does; an embedding lookup's never does).
  // Returns `output`, to which the plugin may attach what must run before the block's backward
  // (fetching the parameters again).
  virtual torch::Tensor leave(const torch::nn::Module& block, torch::Tensor output,
                              bool needs_parameters_in_backward) = 0;
};

// An addition to a Linear's output computed from its input (LoRA's B·A·x), so that adapters wrap
// a layer without touching its parameters or the family that owns it.
// How an adapter computes on a layer split over tensor-parallel ranks (SplitLinear::adapt).
struct AdapterSplit {
  // Applied to the adapter's low-rank intermediate before its second matrix: the sum over the
  // ranks when the layer is split by its inputs (each rank holds a block of them). Null: none.
  std::function<torch::Tensor(const torch::Tensor&)> reduce;
  // x is this rank's block of the layer's input (split by its inputs): its dropout is drawn for
  // the whole input and this block taken (model::dropout_block).
  bool input_is_block = false;
};

struct LinearAdapter {
  virtual ~LinearAdapter() = default;
  // `y` = the base output for `x`; returns y plus the adapter's contribution. `training` is the
  // Linear's mode (dropout and the like apply only when true). `split`: the layer is split over
  // tensor-parallel ranks, and the adapter's matrices with it.
  virtual torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y, bool training,
                                const AdapterSplit* split = nullptr) = 0;
};

// How a block computes when its weight is split over tensor-parallel ranks (engine/parallel
// installs these; the block's weight and bias then hold this rank's block). Null: whole weights.
class SplitLinear {
 public:
  virtual ~SplitLinear() = default;
  // The layer's output for `x` from this rank's `weight` block, seen [out, in] whatever the
  // layer's layout, and bias block (undefined when none).
  virtual torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& weight,
                                const torch::Tensor& bias) = 0;
  // `y` (forward's result for `x`) plus `adapter`'s contribution, computed with the adapter's
  // matrices split like the layer (the hybrid plugin splits them).
  virtual torch::Tensor adapt(const torch::Tensor& x, const torch::Tensor& y,
                              LinearAdapter& adapter, bool training) {
    return adapter.forward(x, y, training);
  }
};
class SplitEmbedding {
 public:
  virtual ~SplitEmbedding() = default;
  virtual torch::Tensor lookup(const torch::Tensor& ids, const torch::Tensor& weight) = 0;
  // hidden · weightᵀ for a tied head.
  virtual torch::Tensor attend(const torch::Tensor& hidden, const torch::Tensor& weight) = 0;
};
// What an output head split along the vocabulary implements besides its SplitLinear or
// SplitEmbedding: its logits are this rank's vocabulary block, and the loss is computed from them
// across the ranks.
class SplitLogits {
 public:
  virtual ~SplitLogits() = default;
  // logits [N, vocab block], targets [N] over the whole vocabulary (-100: none): the mean loss.
  virtual torch::Tensor cross_entropy(const torch::Tensor& logits,
                                      const torch::Tensor& targets) = 0;
  // The same loss without the logits (model/head_loss.h): `hidden` [..., H] is the head's input
  // (this split brings it to the ranks), weight and bias this rank's block of the head.
  virtual torch::Tensor head_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const torch::Tensor& targets) = 0;
};

class QuantizedWeight;  // model/quantized_linear.h

// A frozen table left in its checkpoint file, read by rows as it is used: an input embedding's
// lookups read the rows they need, an output head a block of the vocabulary at a time.
// (model/model.h: DeferredWeights::leave_frozen_tables_in_file.)
class StoredRows {
 public:
  virtual ~StoredRows() = default;
  // The rows of `ids` (any shape, within the table), [..., dim] in the table's compute dtype.
  virtual torch::Tensor lookup(const torch::Tensor& ids) = 0;
  // Rows [first, first + count), [count, dim] in the table's compute dtype.
  virtual torch::Tensor rows(std::int64_t first, std::int64_t count) = 0;
  virtual std::vector<std::int64_t> shape() const = 0;  // the table's [rows, dim]
};

// y = x·Wᵀ + b. `InOut` stores W as [in, out] (GPT-2's Conv1D) and computes y = x·W + b, so a
// checkpoint's tensor loads as is under the same name. With an `adapter`, its forward(x, y) is
// the output.
class LinearImpl : public torch::nn::Module {
 public:
  enum class Layout { OutIn, InOut };
  LinearImpl(std::int64_t in_features, std::int64_t out_features, bool bias,
             const torch::TensorOptions& options, Layout layout = Layout::OutIn);
  torch::Tensor forward(const torch::Tensor& x);
  // As Module's, and a quantized weight moves with the layer.
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  std::int64_t in_features;
  std::int64_t out_features;
  Layout layout;
  torch::Tensor weight;
  torch::Tensor bias;                      // undefined when the layer has none
  std::shared_ptr<LinearAdapter> adapter;  // null: a plain linear layer
  std::shared_ptr<ParameterUse> parameter_use;
  std::shared_ptr<SplitLinear> split;  // null: the whole weight is here
  // Set: the frozen weight is held quantized (QLoRA's base) and `weight` is empty.
  std::shared_ptr<QuantizedWeight> quantized;
  // Set: the frozen weight [out, in] (an output head) is read from its checkpoint file a block of
  // rows at a time and `weight` is empty.
  std::shared_ptr<StoredRows> stored;
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(std::int64_t num_embeddings, std::int64_t dim, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& ids);  // ids must be in range (checked by callers)
  // hidden · weightᵀ: a tied output head, through this block so that whatever wraps the
  // embedding's weight (Gemini's chunks, tensor parallelism) sees that use too.
  torch::Tensor attend(const torch::Tensor& hidden);

  std::int64_t num_embeddings;
  torch::Tensor weight;  // [num_embeddings, dim]
  std::shared_ptr<ParameterUse> parameter_use;
  std::shared_ptr<SplitEmbedding> split;  // null: the whole table is here
  // Set: the frozen table is read from its checkpoint file by rows and `weight` is empty.
  std::shared_ptr<StoredRows> stored;
};
TORCH_MODULE(Embedding);

// Llama-style RMSNorm: normalises in float32 and casts back before the weight, like
// transformers, so bf16 results match it (training on a GPU: torch's fused kernel, layers.cpp).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(std::int64_t dim, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);

  double eps;
  torch::Tensor weight;
  std::shared_ptr<ParameterUse> parameter_use;
};
TORCH_MODULE(RMSNorm);

class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(std::int64_t dim, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);

  std::int64_t dim;
  double eps;
  torch::Tensor weight;
  torch::Tensor bias;
  std::shared_ptr<ParameterUse> parameter_use;
};
TORCH_MODULE(LayerNorm);

// Activation by its HuggingFace name: silu, gelu (erf), gelu_pytorch_tanh (torch's tanh
// approximation), gelu_new (the same approximation written out as transformers does, which
// rounds differently in bf16), relu. Unknown names raise tessera::Error (Unsupported).
enum class Activation { Silu, Gelu, GeluTanh, GeluNew, Relu };
Activation activation_from_name(const std::string& name);
torch::Tensor activate(const torch::Tensor& x, Activation activation);

// Rotary position embedding (rotate-half convention) with rope_scaling default, linear
// (positions divided by `factor`) or llama3 (frequency-dependent scaling of Llama 3.1).
struct RopeOptions {
  std::int64_t head_dim = 0;
  double theta = 10000.0;
  std::string rope_type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(const RopeOptions& options);
  // cos and sin for `positions` [B or 1, T], computed in float32 and cast to `dtype`:
  // [B or 1, T, head_dim] each.
  std::pair<torch::Tensor, torch::Tensor> cos_sin(const torch::Tensor& positions,
                                                  torch::Dtype dtype) const;
  const torch::Tensor& inv_freq() const { return inv_freq_; }

 private:
  torch::Tensor inv_freq_;  // float32 [head_dim / 2], on the CPU; moved on use
};

// x [B, heads, T, D], cos/sin [B or 1, T, D].
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin);

// Boolean attention mask [B, 1, T, T], true = may attend. Keys at padding (attention_mask 0)
// are masked; `causal` masks future keys; `sliding_window` (causal only) keeps key j for query
// i only when i - j < window, as transformers does. A query left with no key at all (a
// left-padding position under a causal mask) keeps an empty row: scaled_dot_product_attention
// (torch >= 2.5) returns zeros for it, with finite gradients, which is exactly what transformers
// 5 computes there — so even the loss term a left-padded row's last padding position
// contributes (it predicts the first real token) matches.
torch::Tensor build_attention_mask(const torch::Tensor& attention_mask, bool causal,
                                   std::optional<std::int64_t> sliding_window = std::nullopt);

// The causal mask of incremental decoding: the queries are the last `query_length` of the
// `key_mask` [B, S] positions (the earlier ones come from a KV cache), so query i sits at key
// index S - query_length + i. [B, 1, query_length, S], true = may attend; equal to
// build_attention_mask(key_mask, true, sliding_window) when query_length == S.
torch::Tensor build_causal_mask(const torch::Tensor& key_mask, std::int64_t query_length,
                                std::optional<std::int64_t> sliding_window = std::nullopt);

// The mask a causal stack's attention takes: undefined when the causal order alone is exact (no
// key is padding, the queries are all the keys, no cache before them, and no sliding window
// shorter than the keys), which lets scaled_dot_product_attention choose its flash or
// memory-efficient kernels on a GPU with no mask tensor at all; else build_causal_mask's. Its one
// host sync (whether any key is padding) is per forward, not per layer.
torch::Tensor causal_attention_mask(const torch::Tensor& key_mask, std::int64_t query_length,
                                    std::optional<std::int64_t> sliding_window = std::nullopt);

// Scaled dot-product attention with grouped-query heads: q [B, H, T, D], k/v [B, Hkv, T, D]
// with H a multiple of Hkv. `mask` as from build_attention_mask, or undefined for causal
// attention over every key (causal_attention_mask): then no mask is built and the grouped heads
// are not repeated (the kernel reads each key/value head for its group).
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, double dropout, bool training,
                        std::optional<double> scale = std::nullopt);

// [B, T, heads*D] → [B, heads, T, D] and back.
torch::Tensor split_heads(const torch::Tensor& x, std::int64_t heads, std::int64_t head_dim);
torch::Tensor merge_heads(const torch::Tensor& x);

}  // namespace tessera::model
