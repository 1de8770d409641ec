// gpt2: learned absolute positions, pre-norm blocks, Conv1D weights stored [in, out], one fused
// c_attn projection for q, k and v, lm_head tied to wte unless the config says otherwise.
#include "core/error.h"
#include "model/dropout.h"
#include "model/layers.h"
#include "model/model.h"

namespace tessera::model {
namespace {

constexpr auto kConv1D = LinearImpl::Layout::InOut;

struct Gpt2Options {
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t inner = 0;
  double eps = 1e-5;
  double attn_dropout = 0.1;
  double resid_dropout = 0.1;
  Activation act = Activation::GeluNew;
};

class Gpt2AttentionImpl : public torch::nn::Module {
 public:
  Gpt2AttentionImpl(const Gpt2Options& o, const torch::TensorOptions& t) : o_(o) {
    c_attn = register_module("c_attn", Linear(o.hidden, 3 * o.hidden, true, t, kConv1D));
    c_proj = register_module("c_proj", Linear(o.hidden, o.hidden, true, t, kConv1D));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask,
                        KVCache::Layer* past = nullptr) {
    // q, k and v side by side; under tensor parallelism this rank's heads of each.
    const torch::Tensor fused = c_attn(x);
    const std::int64_t width = fused.size(-1) / 3;
    auto qkv = fused.split(width, -1);
    const std::int64_t head_dim = o_.hidden / o_.heads;
    const std::int64_t heads = width / head_dim;
    torch::Tensor k = split_heads(qkv[1], heads, head_dim);
    torch::Tensor v = split_heads(qkv[2], heads, head_dim);
    if (past != nullptr) {
      if (past->key.defined()) {
        k = torch::cat({past->key, k}, 2);
        v = torch::cat({past->value, v}, 2);
      }
      past->key = k;
      past->value = v;
    }
    torch::Tensor out =
        attention(split_heads(qkv[0], heads, head_dim), k, v, mask, o_.attn_dropout, is_training());
    return model::dropout(c_proj(merge_heads(out)), o_.resid_dropout, is_training());
  }
  Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  Gpt2Options o_;
};
TORCH_MODULE(Gpt2Attention);

class Gpt2MlpImpl : public torch::nn::Module {
 public:
  Gpt2MlpImpl(const Gpt2Options& o, const torch::TensorOptions& t) : o_(o) {
    c_fc = register_module("c_fc", Linear(o.hidden, o.inner, true, t, kConv1D));
    c_proj = register_module("c_proj", Linear(o.inner, o.hidden, true, t, kConv1D));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return model::dropout(c_proj(activate(c_fc(x), o_.act)), o_.resid_dropout, is_training());
  }
  Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  Gpt2Options o_;
};
TORCH_MODULE(Gpt2Mlp);

class Gpt2BlockImpl : public torch::nn::Module {
 public:
  Gpt2BlockImpl(const Gpt2Options& o, const torch::TensorOptions& t) {
    ln_1 = register_module("ln_1", LayerNorm(o.hidden, o.eps, t));
    attn = register_module("attn", Gpt2Attention(o, t));
    ln_2 = register_module("ln_2", LayerNorm(o.hidden, o.eps, t));
    mlp = register_module("mlp", Gpt2Mlp(o, t));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask,
                        KVCache::Layer* past = nullptr) {
    torch::Tensor h = x + attn->forward(ln_1(x), mask, past);
    return h + mlp(ln_2(h));
  }
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Gpt2Attention attn{nullptr};
  Gpt2Mlp mlp{nullptr};
};
TORCH_MODULE(Gpt2Block);

// GPT2Model: wte, wpe, h.N, ln_f.
class Gpt2StackImpl : public torch::nn::Module {
 public:
  Gpt2StackImpl(const hf::ModelConfig& c, const torch::TensorOptions& t) {
    Gpt2Options o;
    o.hidden = c.hidden_size;
    o.heads = c.num_attention_heads;
    o.inner = c.intermediate_size;
    o.eps = c.norm_eps;
    o.attn_dropout = config_dropout(c, "attn_pdrop", 0.1);
    o.resid_dropout = config_dropout(c, "resid_pdrop", 0.1);
    o.act = activation_from_name(c.hidden_act);
    embd_dropout_ = config_dropout(c, "embd_pdrop", 0.1);
    wte = register_module("wte", Embedding(c.vocab_size, c.hidden_size, t));
    wpe = register_module("wpe", Embedding(c.max_position_embeddings, c.hidden_size, t));
    h = register_module("h", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) h->push_back(Gpt2Block(o, t));
    ln_f = register_module("ln_f", LayerNorm(c.hidden_size, c.norm_eps, t));
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attention_mask) {
    // Positions 0..T-1 for every row, as transformers 5 does when given only a mask.
    torch::Tensor positions =
        torch::arange(ids.size(1), torch::TensorOptions().dtype(torch::kInt64).device(ids.device()))
            .unsqueeze(0);
    return forward(ids, attention_mask, positions, nullptr);
  }
  // `attention_mask` [B, S + T] covers cached and new positions; `positions` is [B or 1, T].
  // A pipeline stage (`stage` not whole) runs its blocks from `stage_input` (unless it holds
  // block 0) and returns their output without ln_f (unless it holds the last block).
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attention_mask,
                        const torch::Tensor& positions, KVCache* cache,
                        const LayerWrapper& wrapper = {}, const PipelineStage& stage = {},
                        const torch::Tensor& stage_input = {}, const SequenceShards& shards = {}) {
    const auto count = static_cast<std::int64_t>(h->size());
    const std::int64_t end = stage.end_layer < 0 ? count : stage.end_layer;
    torch::Tensor x;
    if (stage.first_layer == 0) {
      x = wte(ids) + wpe(positions);
      x = model::dropout(x, embd_dropout_, is_training());
    } else {
      x = stage_input;
    }
    torch::Tensor mask = causal_attention_mask(attention_mask, ids.size(1));
    if (cache != nullptr && cache->layers.size() != h->size()) cache->layers.resize(h->size());
    const bool sequence_parallel = shards.enter && cache == nullptr;
    if (sequence_parallel && stage.first_layer == 0)
      x = shards.enter(x);
    else if (sequence_parallel)
      shards.resume(ids.size(1));
    for (auto i = static_cast<std::size_t>(stage.first_layer); i < static_cast<std::size_t>(end);
         ++i) {
      begin_dropout_layer(static_cast<std::int64_t>(i));
      if (wrapper && cache == nullptr) {
        std::shared_ptr<Gpt2BlockImpl> block = h->ptr<Gpt2BlockImpl>(i);
        x = wrapper([block, mask](const torch::Tensor& in) { return block->forward(in, mask); }, x);
      } else {
        x = h[i]->as<Gpt2BlockImpl>()->forward(x, mask, cache ? &cache->layers[i] : nullptr);
      }
    }
    if (end < count) {
      if (sequence_parallel) shards.pause();
      return x;
    }
    if (sequence_parallel) x = shards.leave(x);
    begin_dropout_layer(count);
    return ln_f(x);
  }
  Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  LayerNorm ln_f{nullptr};

 private:
  double embd_dropout_ = 0.1;
};
TORCH_MODULE(Gpt2Stack);

void check_gpt2_positions(const hf::ModelConfig& c, const ForwardInput& in) {
  const std::int64_t total = in.attention_mask.size(1);  // cached + new positions
  if (total > c.max_position_embeddings)
    throw_invalid("gpt2: sequence length " + std::to_string(total) + " exceeds n_positions " +
                      std::to_string(c.max_position_embeddings),
                  "truncate or split the input to at most n_positions tokens");
  if (in.position_ids.max().item<std::int64_t>() >= c.max_position_embeddings)
    throw_invalid("gpt2: position_ids reach " +
                      std::to_string(in.position_ids.max().item<std::int64_t>()) +
                      ", beyond n_positions " + std::to_string(c.max_position_embeddings),
                  "positions must be below n_positions");
}

class Gpt2Base : public PretrainedModel {
 public:
  Gpt2Base(const hf::ModelConfig& c, const torch::TensorOptions& t)
      : PretrainedModel(c, TaskHead::Base) {
    stack_ = Gpt2Stack(c, t);
    register_module("wte", stack_->wte);
    register_module("wpe", stack_->wpe);
    register_module("h", stack_->h);
    register_module("ln_f", stack_->ln_f);
  }
  bool supports_cache() const override { return true; }

 protected:
  ForwardOutput run(const ForwardInput& in) override {
    check_gpt2_positions(config(), in);
    stack_->train(is_training());
    ForwardOutput out;
    out.hidden_states = stack_->forward(in.input_ids, in.attention_mask, in.position_ids, in.cache,
                                        layer_wrapper, {}, {}, sequence_shards);
    return out;
  }

 private:
  Gpt2Stack stack_{nullptr};
};

class Gpt2LMHead : public PretrainedModel {
 public:
  Gpt2LMHead(const hf::ModelConfig& c, const torch::TensorOptions& t)
      : PretrainedModel(c, TaskHead::CausalLM) {
    transformer = register_module("transformer", Gpt2Stack(c, t));
    if (!c.tie_word_embeddings)
      lm_head = register_module("lm_head", Linear(c.hidden_size, c.vocab_size, false, t));
  }
  bool supports_cache() const override { return true; }
  bool supports_stages() const override { return true; }

  Gpt2Stack transformer{nullptr};
  Linear lm_head{nullptr};  // null when tied to transformer.wte

 protected:
  ForwardOutput run(const ForwardInput& in) override {
    check_gpt2_positions(config(), in);
    ForwardOutput out;
    out.hidden_states =
        transformer->forward(in.input_ids, in.attention_mask, in.position_ids, in.cache,
                             layer_wrapper, stage, in.stage_input, sequence_shards);
    if (!last_stage()) return out;
    apply_causal_lm_head(out, in, lm_head ? lm_head.get() : nullptr, *transformer->wte);
    return out;
  }
};

}  // namespace

std::shared_ptr<PretrainedModel> create_gpt2(const hf::ModelConfig& config, TaskHead head,
                                             const torch::TensorOptions& options) {
  switch (head) {
    case TaskHead::Base:
      return std::make_shared<Gpt2Base>(config, options);
    case TaskHead::CausalLM:
      return std::make_shared<Gpt2LMHead>(config, options);
    case TaskHead::SequenceClassification:
      break;
  }
  throw_unsupported("gpt2: the " + std::string(task_head_name(head)) +
                        " head is not supported for this model type",
                    "supported for gpt2: base model (GPT2Model), causal LM (GPT2LMHeadModel)");
}

}  // namespace tessera::model
