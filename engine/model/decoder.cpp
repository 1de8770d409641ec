// llama / mistral / qwen2: one pre-norm decoder; the families differ only in options
// (q/k/v/o bias, MLP bias, sliding window, rope scaling, tied embeddings).
#include "core/error.h"
#include "model/dropout.h"
#include "model/layers.h"
#include "model/model.h"

namespace tessera::model {
namespace {

struct DecoderOptions {
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t intermediate = 0;
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  double eps = 1e-6;
  double attention_dropout = 0.0;
  std::optional<std::int64_t> sliding_window;
  Activation act = Activation::Silu;
};

DecoderOptions decoder_options(const hf::ModelConfig& c) {
  DecoderOptions o;
  o.hidden = c.hidden_size;
  o.heads = c.num_attention_heads;
  o.kv_heads = c.num_key_value_heads;
  o.head_dim = c.head_dim;
  o.intermediate = c.intermediate_size;
  o.qkv_bias = c.attention_bias;
  o.o_bias = c.attention_output_bias;
  o.mlp_bias = c.mlp_bias;
  o.eps = c.norm_eps;
  o.attention_dropout = config_dropout(c, "attention_dropout", 0.0);
  o.sliding_window = c.sliding_window;
  o.act = activation_from_name(c.hidden_act);
  return o;
}

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const DecoderOptions& o, const torch::TensorOptions& t) : o_(o) {
    q_proj = register_module("q_proj", Linear(o.hidden, o.heads * o.head_dim, o.qkv_bias, t));
    k_proj = register_module("k_proj", Linear(o.hidden, o.kv_heads * o.head_dim, o.qkv_bias, t));
    v_proj = register_module("v_proj", Linear(o.hidden, o.kv_heads * o.head_dim, o.qkv_bias, t));
    o_proj = register_module("o_proj", Linear(o.heads * o.head_dim, o.hidden, o.o_bias, t));
  }
  // `past` (optional): this layer's cache entry; its keys/values are attended to and this
  // call's are appended.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask, KVCache::Layer* past = nullptr) {
    // Heads from the projections' widths: under tensor parallelism this rank's share of them.
    const torch::Tensor queries = q_proj(x), keys = k_proj(x), values = v_proj(x);
    const std::int64_t heads = queries.size(-1) / o_.head_dim;
    const std::int64_t kv_heads = keys.size(-1) / o_.head_dim;
    torch::Tensor q = apply_rotary(split_heads(queries, heads, o_.head_dim), cos, sin);
    torch::Tensor k = apply_rotary(split_heads(keys, kv_heads, o_.head_dim), cos, sin);
    torch::Tensor v = split_heads(values, kv_heads, o_.head_dim);
    if (past != nullptr) {
      if (past->key.defined()) {
        k = torch::cat({past->key, k}, 2);
        v = torch::cat({past->value, v}, 2);
      }
      past->key = k;
      past->value = v;
    }
    torch::Tensor out = attention(q, k, v, mask, o_.attention_dropout, is_training());
    return o_proj(merge_heads(out));
  }
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  DecoderOptions o_;
};
TORCH_MODULE(Attention);

class GatedMlpImpl : public torch::nn::Module {
 public:
  GatedMlpImpl(const DecoderOptions& o, const torch::TensorOptions& t) : act_(o.act) {
    gate_proj = register_module("gate_proj", Linear(o.hidden, o.intermediate, o.mlp_bias, t));
    up_proj = register_module("up_proj", Linear(o.hidden, o.intermediate, o.mlp_bias, t));
    down_proj = register_module("down_proj", Linear(o.intermediate, o.hidden, o.mlp_bias, t));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return down_proj(activate(gate_proj(x), act_) * up_proj(x));
  }
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  Activation act_;
};
TORCH_MODULE(GatedMlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const DecoderOptions& o, const torch::TensorOptions& t) {
    self_attn = register_module("self_attn", Attention(o, t));
    mlp = register_module("mlp", GatedMlp(o, t));
    input_layernorm = register_module("input_layernorm", RMSNorm(o.hidden, o.eps, t));
    post_attention_layernorm =
        register_module("post_attention_layernorm", RMSNorm(o.hidden, o.eps, t));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask, KVCache::Layer* past = nullptr) {
    torch::Tensor h = x + self_attn->forward(input_layernorm(x), cos, sin, mask, past);
    return h + mlp(post_attention_layernorm(h));
  }
  Attention self_attn{nullptr};
  GatedMlp mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

RopeOptions rope_options(const hf::ModelConfig& c) {
  RopeOptions r;
  r.head_dim = c.head_dim;
  r.theta = c.rope_theta;
  r.rope_type = c.rope_scaling.rope_type;
  r.factor = c.rope_scaling.factor;
  r.low_freq_factor = c.rope_scaling.low_freq_factor;
  r.high_freq_factor = c.rope_scaling.high_freq_factor;
  r.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  return r;
}

// LlamaModel and friends: embed_tokens, layers.N, norm.
class DecoderStackImpl : public torch::nn::Module {
 public:
  DecoderStackImpl(const hf::ModelConfig& c, const torch::TensorOptions& t)
      : options_(decoder_options(c)), rotary_(rope_options(c)) {
    embed_tokens = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size, t));
    layers = register_module("layers", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
      layers->push_back(DecoderLayer(options_, t));
    norm = register_module("norm", RMSNorm(c.hidden_size, c.norm_eps, t));
    sliding_layers_ = c.sliding_layers;
    sliding_layers_.resize(static_cast<std::size_t>(c.num_hidden_layers), false);
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attention_mask) {
    // transformers 5 uses positions 0..T-1 for every row when only a mask is given.
    torch::Tensor positions =
        torch::arange(ids.size(1), torch::TensorOptions().dtype(torch::kInt64).device(ids.device()))
            .unsqueeze(0);
    return forward(ids, attention_mask, positions, nullptr);
  }
  // `attention_mask` covers the cached and the new positions ([B, S + T]); `positions` is
  // [B or 1, T]. The sliding window is applied through the mask, so the cache keeps every
  // position (the same attention as transformers' sliding-window cache layers).
  // A pipeline stage (`stage` not whole) runs its layers from `stage_input` (unless it holds
  // layer 0) and returns their output without the final norm (unless it holds the last layer).
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attention_mask,
                        const torch::Tensor& positions, KVCache* cache,
                        const LayerWrapper& wrapper = {}, const PipelineStage& stage = {},
                        const torch::Tensor& stage_input = {}, const SequenceShards& shards = {}) {
    const auto count = static_cast<std::int64_t>(layers->size());
    const std::int64_t end = stage.end_layer < 0 ? count : stage.end_layer;
    torch::Tensor h = stage.first_layer == 0 ? embed_tokens(ids) : stage_input;
    auto [cos, sin] = rotary_.cos_sin(positions, h.scalar_type());
    const std::int64_t length = ids.size(1);
    torch::Tensor full_mask = causal_attention_mask(attention_mask, length);
    torch::Tensor sliding_mask;
    if (options_.sliding_window)
      sliding_mask = causal_attention_mask(attention_mask, length, options_.sliding_window);
    if (cache != nullptr && cache->layers.size() != layers->size())
      cache->layers.resize(layers->size());
    const bool sequence_parallel = shards.enter && cache == nullptr;
    if (sequence_parallel && stage.first_layer == 0)
      h = shards.enter(h);
    else if (sequence_parallel)
      shards.resume(length);
    for (auto i = static_cast<std::size_t>(stage.first_layer); i < static_cast<std::size_t>(end);
         ++i) {
      begin_dropout_layer(static_cast<std::int64_t>(i));
      const torch::Tensor& mask = sliding_layers_[i] ? sliding_mask : full_mask;
      if (wrapper && cache == nullptr) {
        std::shared_ptr<DecoderLayerImpl> layer = layers->ptr<DecoderLayerImpl>(i);
        h = wrapper([layer, cos = cos, sin = sin,
                     mask](const torch::Tensor& in) { return layer->forward(in, cos, sin, mask); },
                    h);
      } else {
        h = layers[i]->as<DecoderLayerImpl>()->forward(h, cos, sin, mask,
                                                       cache ? &cache->layers[i] : nullptr);
      }
    }
    if (end < count) {
      if (sequence_parallel) shards.pause();
      return h;
    }
    if (sequence_parallel) h = shards.leave(h);
    begin_dropout_layer(count);
    return norm(h);
  }
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

 private:
  DecoderOptions options_;
  RotaryEmbedding rotary_;
  std::vector<bool> sliding_layers_;  // per layer: sliding-window (true) or full attention
};
TORCH_MODULE(DecoderStack);

class DecoderBase : public PretrainedModel {
 public:
  DecoderBase(const hf::ModelConfig& c, const torch::TensorOptions& t)
      : PretrainedModel(c, TaskHead::Base) {
    stack_ = DecoderStack(c, t);
    // A bare LlamaModel's parameters carry no prefix: register the stack's children directly.
    register_module("embed_tokens", stack_->embed_tokens);
    register_module("layers", stack_->layers);
    register_module("norm", stack_->norm);
  }
  bool supports_cache() const override { return true; }

 protected:
  ForwardOutput run(const ForwardInput& in) override {
    ForwardOutput out;
    out.hidden_states = stack_->forward(in.input_ids, in.attention_mask, in.position_ids, in.cache,
                                        layer_wrapper, {}, {}, sequence_shards);
    return out;
  }

 private:
  DecoderStack stack_{nullptr};
};

class DecoderCausalLM : public PretrainedModel {
 public:
  DecoderCausalLM(const hf::ModelConfig& c, const torch::TensorOptions& t)
      : PretrainedModel(c, TaskHead::CausalLM) {
    model = register_module("model", DecoderStack(c, t));
    if (!c.tie_word_embeddings)
      lm_head = register_module("lm_head", Linear(c.hidden_size, c.vocab_size, false, t));
  }
  bool supports_cache() const override { return true; }
  bool supports_stages() const override { return true; }

  DecoderStack model{nullptr};
  Linear lm_head{nullptr};  // null when tied: the logits use model.embed_tokens.weight

 protected:
  ForwardOutput run(const ForwardInput& in) override {
    ForwardOutput out;
    out.hidden_states = model->forward(in.input_ids, in.attention_mask, in.position_ids, in.cache,
                                       layer_wrapper, stage, in.stage_input, sequence_shards);
    if (!last_stage()) return out;
    apply_causal_lm_head(out, in, lm_head ? lm_head.get() : nullptr, *model->embed_tokens);
    return out;
  }
};

}  // namespace

std::shared_ptr<PretrainedModel> create_decoder(const hf::ModelConfig& config, TaskHead head,
                                                const torch::TensorOptions& options) {
  switch (head) {
    case TaskHead::Base:
      return std::make_shared<DecoderBase>(config, options);
    case TaskHead::CausalLM:
      return std::make_shared<DecoderCausalLM>(config, options);
    case TaskHead::SequenceClassification:
      break;
  }
  throw_unsupported(config.model_type + ": the " + task_head_name(head) +
                        " head is not supported for this model type",
                    "supported for " + config.model_type + ": base model, causal LM");
}

}  // namespace tessera::model
