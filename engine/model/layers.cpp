#include "model/layers.h"

#include <cmath>
#include <limits>
#include <numbers>

#include "core/error.h"
#include "cuda/runtime.h"
#include "model/dropout.h"
#include "model/head_loss.h"
#include "model/quantized_linear.h"

namespace tessera::model {
namespace {

// The block's parameters are in memory from construction to leave().
class BlockUse {
 public:
  BlockUse(ParameterUse* use, const torch::nn::Module& block) : use_(use), block_(block) {
    if (use_ != nullptr) use_->enter(block_);
  }
  torch::Tensor leave(torch::Tensor output, bool needs_parameters_in_backward) {
    if (use_ == nullptr) return output;
    return use_->leave(block_, std::move(output), needs_parameters_in_backward);
  }

 private:
  ParameterUse* use_;
  const torch::nn::Module& block_;
};

}  // namespace

LinearImpl::LinearImpl(std::int64_t in, std::int64_t out, bool has_bias,
                       const torch::TensorOptions& options, Layout layout_)
    : in_features(in), out_features(out), layout(layout_) {
  weight = register_parameter("weight", layout == Layout::OutIn ? torch::empty({out, in}, options)
                                                                : torch::empty({in, out}, options));
  if (has_bias) bias = register_parameter("bias", torch::empty({out}, options));
}

void LinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  if (quantized) quantized->to(device);
}

void LinearImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  if (quantized) quantized->to(device);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  BlockUse use(parameter_use.get(), *this);
  torch::Tensor y;
  if (quantized) {
    y = quantized->linear(x, bias);
  } else if (stored) {
    // Left in the file only without a bias (DeferredWeights::leave_frozen_tables_in_file).
    y = stored_head_logits(
        x,
        [table = stored.get()](std::int64_t first, std::int64_t count) {
          return table->rows(first, count);
        },
        out_features);
  } else if (split) {
    y = split->forward(x, layout == Layout::OutIn ? weight : weight.t(), bias);
  } else if (layout == Layout::OutIn) {
    // at::linear, not torch::nn::functional::linear: the latter adds the bias in a separate
    // step for 3-D inputs, which rounds twice in bf16 where transformers rounds once.
    y = torch::linear(x, weight, bias);
  } else {
    // Conv1D as transformers computes it: one addmm over the flattened rows.
    std::vector<std::int64_t> out_shape = x.sizes().vec();
    out_shape.back() = out_features;
    torch::Tensor rows = x.reshape({-1, in_features});
    y = (bias.defined() ? torch::addmm(bias, rows, weight) : torch::mm(rows, weight))
            .view(out_shape);
  }
  // The weight is needed again in backward only for the input's gradient.
  if (adapter)
    y = split ? split->adapt(x, y, *adapter, is_training()) : adapter->forward(x, y, is_training());
  return use.leave(y, x.requires_grad());
}

EmbeddingImpl::EmbeddingImpl(std::int64_t n, std::int64_t dim, const torch::TensorOptions& options)
    : num_embeddings(n) {
  weight = register_parameter("weight", torch::empty({n, dim}, options));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  if (stored) return stored->lookup(ids);
  BlockUse use(parameter_use.get(), *this);
  return use.leave(split ? split->lookup(ids, weight) : torch::embedding(weight, ids), false);
}

torch::Tensor EmbeddingImpl::attend(const torch::Tensor& hidden) {
  if (stored)
    throw Error(ErrorKind::Internal, "an embedding read from its file by rows cannot be a head");
  BlockUse use(parameter_use.get(), *this);
  return use.leave(split ? split->attend(hidden, weight) : torch::linear(hidden, weight),
                   hidden.requires_grad());
}

RMSNormImpl::RMSNormImpl(std::int64_t dim, double eps_, const torch::TensorOptions& options)
    : eps(eps_) {
  weight = register_parameter("weight", torch::empty({dim}, options));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  BlockUse use(parameter_use.get(), *this);
  // Inference on a GPU in fp32: one fused kernel (in the CUDA module, loaded wherever a CUDA
  // tensor can exist) instead of five elementwise launches. Training keeps the torch ops below,
  // which autograd differentiates.
  bool needs_grad = torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  const cuda::Runtime* runtime = cuda::runtime();
  if (runtime != nullptr && x.is_cuda() && !needs_grad && x.scalar_type() == torch::kFloat32 &&
      weight.scalar_type() == torch::kFloat32 && weight.is_cuda()) {
    torch::Tensor input = x.contiguous();
    torch::Tensor out = torch::empty_like(input);
    const std::int64_t cols = input.size(-1);
    // On the input's GPU and torch's current stream there (the module guards the device).
    int status = runtime->rms_norm_forward_f32(
        input.data_ptr<float>(), weight.contiguous().data_ptr<float>(), out.data_ptr<float>(),
        input.numel() / cols, cols, static_cast<float>(eps), input.device().index());
    if (status != 0)
      throw_io("CUDA RMSNorm kernel failed to launch (CUDA error " + std::to_string(status) + ")");
    return use.leave(out, false);
  }
  // Training on a GPU: torch's fused kernel, one pass each way, saving the input and a float32
  // figure per row. The ops below make seven passes each way over [tokens, hidden] and save a
  // float32 copy of the input: at 8192 tokens of a 1.1B llama that is some 70 GB of memory
  // traffic a step. It rounds once, after the weight, where transformers rounds the normalised
  // value to the compute dtype before multiplying: in bf16 an element may differ by one unit in
  // the last place (in fp32, by the order of the sum).
  if (x.is_cuda() && needs_grad && weight.is_cuda() && weight.scalar_type() == x.scalar_type()) {
    torch::Tensor out = std::get<0>(at::_fused_rms_norm(x.contiguous(), {x.size(-1)}, weight, eps));
    return use.leave(out, x.requires_grad());
  }
  torch::Tensor h = x.to(torch::kFloat32);
  torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps);
  return use.leave(weight * h.to(x.scalar_type()), x.requires_grad());
}

LayerNormImpl::LayerNormImpl(std::int64_t dim_, double eps_, const torch::TensorOptions& options)
    : dim(dim_), eps(eps_) {
  weight = register_parameter("weight", torch::empty({dim}, options));
  bias = register_parameter("bias", torch::empty({dim}, options));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  BlockUse use(parameter_use.get(), *this);
  return use.leave(torch::layer_norm(x, {dim}, weight, bias, eps), x.requires_grad());
}

Activation activation_from_name(const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::Silu;
  if (name == "gelu") return Activation::Gelu;
  if (name == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (name == "gelu_new") return Activation::GeluNew;
  if (name == "relu") return Activation::Relu;
  throw_unsupported("activation \"" + name + "\" is not supported",
                    "supported: silu, gelu, gelu_new, gelu_pytorch_tanh, relu");
}

torch::Tensor activate(const torch::Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::Silu:
      return torch::silu(x);
    case Activation::Gelu:
      return torch::gelu(x);
    case Activation::GeluTanh:
      return torch::gelu(x, "tanh");
    case Activation::GeluNew:
      return 0.5 * x *
             (1.0 + torch::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x.pow(3.0))));
    case Activation::Relu:
      return torch::relu(x);
  }
  return x;
}

RotaryEmbedding::RotaryEmbedding(const RopeOptions& o) {
  if (o.head_dim <= 0 || o.head_dim % 2 != 0)
    throw_invalid("rotary embedding: head_dim " + std::to_string(o.head_dim) +
                  " must be positive and even");
  // Same float32 arithmetic as transformers' default rope so fp32 logits agree to ~1e-6.
  torch::Tensor exponents = torch::arange(0, o.head_dim, 2, torch::kInt64).to(torch::kFloat32) /
                            static_cast<float>(o.head_dim);
  torch::Tensor inv_freq = 1.0 / torch::pow(static_cast<float>(o.theta), exponents);
  if (o.rope_type == "linear") {
    inv_freq = inv_freq / o.factor;
  } else if (o.rope_type == "llama3") {
    // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between
    // interpolated smoothly.
    const double old_context = static_cast<double>(o.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / o.low_freq_factor;
    const double high_freq_wavelen = old_context / o.high_freq_factor;
    torch::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
    torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / o.factor, inv_freq);
    torch::Tensor smooth =
        (old_context / wavelen - o.low_freq_factor) / (o.high_freq_factor - o.low_freq_factor);
    torch::Tensor smoothed = (1 - smooth) * scaled / o.factor + smooth * scaled;
    torch::Tensor medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
    inv_freq = torch::where(medium, smoothed, scaled);
  } else if (o.rope_type != "default") {
    throw_unsupported("rope_type \"" + o.rope_type + "\" is not supported",
                      "supported rope types: default, linear, llama3");
  }
  inv_freq_ = inv_freq.to(torch::kFloat32);
}

std::pair<torch::Tensor, torch::Tensor> RotaryEmbedding::cos_sin(const torch::Tensor& positions,
                                                                 torch::Dtype dtype) const {
  torch::Tensor inv = inv_freq_.to(positions.device());
  torch::Tensor freqs = positions.unsqueeze(-1).to(torch::kFloat32) * inv;
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

namespace {
torch::Tensor rotate_half(const torch::Tensor& x) {
  const std::int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}
}  // namespace

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  torch::Tensor c = cos.unsqueeze(1);
  torch::Tensor s = sin.unsqueeze(1);
  return x * c + rotate_half(x) * s;
}

torch::Tensor build_attention_mask(const torch::Tensor& attention_mask, bool causal,
                                   std::optional<std::int64_t> sliding_window) {
  const std::int64_t t = attention_mask.size(1);
  auto device = attention_mask.device();
  torch::Tensor keys = attention_mask.to(torch::kBool).unsqueeze(1).unsqueeze(1);  // [B,1,1,T]
  torch::Tensor mask = keys.expand({attention_mask.size(0), 1, t, t});
  torch::Tensor q = torch::arange(t, torch::TensorOptions().dtype(torch::kInt64).device(device));
  torch::Tensor qi = q.unsqueeze(1);  // query index, [T,1]
  torch::Tensor kj = q.unsqueeze(0);  // key index, [1,T]
  if (causal) {
    torch::Tensor allowed = kj <= qi;
    if (sliding_window) allowed = allowed & (kj > qi - *sliding_window);
    mask = mask & allowed;
  }
  return mask;
}

torch::Tensor build_causal_mask(const torch::Tensor& key_mask, std::int64_t query_length,
                                std::optional<std::int64_t> sliding_window) {
  const std::int64_t s = key_mask.size(1);
  auto options = torch::TensorOptions().dtype(torch::kInt64).device(key_mask.device());
  torch::Tensor keys = key_mask.to(torch::kBool).unsqueeze(1).unsqueeze(1);     // [B,1,1,S]
  torch::Tensor qi = torch::arange(s - query_length, s, options).unsqueeze(1);  // [Q,1]
  torch::Tensor kj = torch::arange(s, options).unsqueeze(0);                    // [1,S]
  torch::Tensor allowed = kj <= qi;
  if (sliding_window) allowed = allowed & (kj > qi - *sliding_window);
  return keys.expand({key_mask.size(0), 1, query_length, s}) & allowed;
}

torch::Tensor causal_attention_mask(const torch::Tensor& key_mask, std::int64_t query_length,
                                    std::optional<std::int64_t> sliding_window) {
  const std::int64_t keys = key_mask.size(1);
  const bool window_reaches_every_key = !sliding_window || keys <= *sliding_window;
  if (query_length == keys && window_reaches_every_key && key_mask.all().item<bool>()) return {};
  return build_causal_mask(key_mask, query_length, sliding_window);
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, double dropout, bool training,
                        std::optional<double> scale) {
  const std::int64_t groups = q.size(1) / k.size(1);
  if (layout_free_dropout_active(dropout, training)) {
    // The probabilities computed here, so that their dropout is the layout-free one
    // (model/dropout.h): SDPA's would draw from the process's generator.
    torch::Tensor key = groups > 1 ? k.repeat_interleave(groups, 1) : k;
    torch::Tensor value = groups > 1 ? v.repeat_interleave(groups, 1) : v;
    const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    torch::Tensor scores = torch::matmul(q, key.transpose(-2, -1)) * s;
    torch::Tensor allowed =
        mask.defined() ? mask
                       : torch::ones({q.size(2), key.size(2)}, q.options().dtype(torch::kBool))
                             .tril(key.size(2) - q.size(2));
    // A query with no key allowed gets zeros, as SDPA gives (not softmax's NaN).
    torch::Tensor probs = torch::softmax(
        scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity()), -1);
    probs = probs.masked_fill(allowed.logical_not(), 0.0);
    return torch::matmul(model::dropout_heads(probs, dropout, training), value);
  }
  const double dropout_p = training ? dropout : 0.0;
  if (!mask.defined())
    return at::scaled_dot_product_attention(q, k, v, {}, dropout_p, /*is_causal=*/true, scale,
                                            /*enable_gqa=*/groups > 1);
  torch::Tensor key = k;
  torch::Tensor value = v;
  if (groups > 1) {
    key = k.repeat_interleave(groups, 1);
    value = v.repeat_interleave(groups, 1);
  }
  return at::scaled_dot_product_attention(q, key, value, mask, dropout_p, /*is_causal=*/false,
                                          scale);
}

torch::Tensor split_heads(const torch::Tensor& x, std::int64_t heads, std::int64_t head_dim) {
  return x.view({x.size(0), x.size(1), heads, head_dim}).transpose(1, 2);
}

torch::Tensor merge_heads(const torch::Tensor& x) {
  return x.transpose(1, 2).contiguous().view({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

}  // namespace tessera::model
