// bert: post-norm bidirectional encoder with word + position + token-type embeddings, a tanh
// pooler over the first token, and (BertForSequenceClassification) a linear classifier on it.
#include "core/error.h"
#include "model/dropout.h"
#include "model/layers.h"
#include "model/model.h"

namespace tessera::model {
namespace {

struct BertOptions {
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t intermediate = 0;
  double eps = 1e-12;
  double hidden_dropout = 0.1;
  double attn_dropout = 0.1;
  Activation act = Activation::Gelu;
};

class BertEmbeddingsImpl : public torch::nn::Module {
 public:
  BertEmbeddingsImpl(const hf::ModelConfig& c, const BertOptions& o, const torch::TensorOptions& t)
      : dropout_(o.hidden_dropout) {
    word_embeddings = register_module("word_embeddings", Embedding(c.vocab_size, o.hidden, t));
    position_embeddings =
        register_module("position_embeddings", Embedding(c.max_position_embeddings, o.hidden, t));
    token_type_embeddings =
        register_module("token_type_embeddings", Embedding(c.type_vocab_size, o.hidden, t));
    LayerNorm_ = register_module("LayerNorm", LayerNorm(o.hidden, o.eps, t));
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& token_types) {
    torch::Tensor positions = torch::arange(
        ids.size(1), torch::TensorOptions().dtype(torch::kInt64).device(ids.device()));
    torch::Tensor x = word_embeddings(ids) + token_type_embeddings(token_types) +
                      position_embeddings(positions).unsqueeze(0);
    return model::dropout(LayerNorm_(x), dropout_, is_training());
  }
  Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  LayerNorm LayerNorm_{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(BertEmbeddings);

class BertSelfAttentionImpl : public torch::nn::Module {
 public:
  BertSelfAttentionImpl(const BertOptions& o, const torch::TensorOptions& t) : o_(o) {
    query = register_module("query", Linear(o.hidden, o.hidden, true, t));
    key = register_module("key", Linear(o.hidden, o.hidden, true, t));
    value = register_module("value", Linear(o.hidden, o.hidden, true, t));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const std::int64_t head_dim = o_.hidden / o_.heads;
    torch::Tensor out = attention(
        split_heads(query(x), o_.heads, head_dim), split_heads(key(x), o_.heads, head_dim),
        split_heads(value(x), o_.heads, head_dim), mask, o_.attn_dropout, is_training());
    return merge_heads(out);
  }
  Linear query{nullptr}, key{nullptr}, value{nullptr};

 private:
  BertOptions o_;
};
TORCH_MODULE(BertSelfAttention);

// dense → dropout → LayerNorm(residual + ·); used as attention.output and as output.
class BertResidualOutputImpl : public torch::nn::Module {
 public:
  BertResidualOutputImpl(std::int64_t in, const BertOptions& o, const torch::TensorOptions& t)
      : dropout_(o.hidden_dropout) {
    dense = register_module("dense", Linear(in, o.hidden, true, t));
    LayerNorm_ = register_module("LayerNorm", LayerNorm(o.hidden, o.eps, t));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& residual) {
    return LayerNorm_(model::dropout(dense(x), dropout_, is_training()) + residual);
  }
  Linear dense{nullptr};
  LayerNorm LayerNorm_{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(BertResidualOutput);

class BertAttentionImpl : public torch::nn::Module {
 public:
  BertAttentionImpl(const BertOptions& o, const torch::TensorOptions& t) {
    self = register_module("self", BertSelfAttention(o, t));
    output = register_module("output", BertResidualOutput(o.hidden, o, t));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    return output(self(x, mask), x);
  }
  BertSelfAttention self{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertAttention);

class BertIntermediateImpl : public torch::nn::Module {
 public:
  BertIntermediateImpl(const BertOptions& o, const torch::TensorOptions& t) : act_(o.act) {
    dense = register_module("dense", Linear(o.hidden, o.intermediate, true, t));
  }
  torch::Tensor forward(const torch::Tensor& x) { return activate(dense(x), act_); }
  Linear dense{nullptr};

 private:
  Activation act_;
};
TORCH_MODULE(BertIntermediate);

class BertLayerImpl : public torch::nn::Module {
 public:
  BertLayerImpl(const BertOptions& o, const torch::TensorOptions& t) {
    attention_ = register_module("attention", BertAttention(o, t));
    intermediate = register_module("intermediate", BertIntermediate(o, t));
    output = register_module("output", BertResidualOutput(o.intermediate, o, t));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    torch::Tensor h = attention_(x, mask);
    return output(intermediate(h), h);
  }
  BertAttention attention_{nullptr};
  BertIntermediate intermediate{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertLayer);

class BertEncoderImpl : public torch::nn::Module {
 public:
  BertEncoderImpl(std::int64_t layers, const BertOptions& o, const torch::TensorOptions& t) {
    layer = register_module("layer", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < layers; ++i) layer->push_back(BertLayer(o, t));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask,
                        const LayerWrapper& wrapper = {}) {
    for (std::size_t i = 0; i < layer->size(); ++i) {
      std::shared_ptr<BertLayerImpl> l = layer->ptr<BertLayerImpl>(i);
      x = wrapper ? wrapper([l, mask](const torch::Tensor& in) { return l->forward(in, mask); }, x)
                  : l->forward(x, mask);
    }
    return x;
  }
  torch::nn::ModuleList layer{nullptr};
};
TORCH_MODULE(BertEncoder);

class BertPoolerImpl : public torch::nn::Module {
 public:
  BertPoolerImpl(const BertOptions& o, const torch::TensorOptions& t) {
    dense = register_module("dense", Linear(o.hidden, o.hidden, true, t));
  }
  torch::Tensor forward(const torch::Tensor& hidden) {
    return torch::tanh(dense(hidden.select(1, 0)));
  }
  Linear dense{nullptr};
};
TORCH_MODULE(BertPooler);

BertOptions bert_options(const hf::ModelConfig& c) {
  BertOptions o;
  o.hidden = c.hidden_size;
  o.heads = c.num_attention_heads;
  o.intermediate = c.intermediate_size;
  o.eps = c.norm_eps;
  o.hidden_dropout = config_dropout(c, "hidden_dropout_prob", 0.1);
  o.attn_dropout = config_dropout(c, "attention_probs_dropout_prob", 0.1);
  o.act = activation_from_name(c.hidden_act);
  return o;
}

// BertModel: embeddings, encoder, pooler. Registered into `owner` directly (bare BertModel) or
// under a `bert` child (models with a head) by the classes below.
class BertStackImpl : public torch::nn::Module {
 public:
  BertStackImpl(const hf::ModelConfig& c, const torch::TensorOptions& t) {
    BertOptions o = bert_options(c);
    embeddings = register_module("embeddings", BertEmbeddings(c, o, t));
    encoder = register_module("encoder", BertEncoder(c.num_hidden_layers, o, t));
    pooler = register_module("pooler", BertPooler(o, t));
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& token_types,
                        const torch::Tensor& attention_mask, const LayerWrapper& wrapper = {}) {
    torch::Tensor mask = build_attention_mask(attention_mask, /*causal=*/false);
    return encoder->forward(embeddings(ids, token_types), mask, wrapper);
  }
  BertEmbeddings embeddings{nullptr};
  BertEncoder encoder{nullptr};
  BertPooler pooler{nullptr};
};
TORCH_MODULE(BertStack);

torch::Tensor token_types_or_zeros(const hf::ModelConfig& c, const ForwardInput& in) {
  if (!in.token_type_ids.defined()) return torch::zeros_like(in.input_ids);
  if (in.token_type_ids.sizes() != in.input_ids.sizes())
    throw_invalid("token_type_ids: shape must equal input_ids' shape");
  torch::Tensor t = in.token_type_ids.to(torch::kInt64);
  if (t.numel() > 0 &&
      (t.min().item<std::int64_t>() < 0 || t.max().item<std::int64_t>() >= c.type_vocab_size))
    throw_invalid("token_type_ids: values must be in [0, " + std::to_string(c.type_vocab_size) +
                  ") (type_vocab_size)");
  return t;
}

void check_bert_positions(const hf::ModelConfig& c, const ForwardInput& in) {
  if (in.input_ids.size(1) > c.max_position_embeddings)
    throw_invalid("bert: sequence length " + std::to_string(in.input_ids.size(1)) +
                      " exceeds max_position_embeddings " +
                      std::to_string(c.max_position_embeddings),
                  "truncate the input to at most max_position_embeddings tokens");
}

class BertBase : public PretrainedModel {
 public:
  BertBase(const hf::ModelConfig& c, const torch::TensorOptions& t)
      : PretrainedModel(c, TaskHead::Base) {
    stack_ = BertStack(c, t);
    register_module("embeddings", stack_->embeddings);
    register_module("encoder", stack_->encoder);
    register_module("pooler", stack_->pooler);
  }

 protected:
  ForwardOutput run(const ForwardInput& in) override {
    check_bert_positions(config(), in);
    ForwardOutput out;
    out.hidden_states = stack_->forward(in.input_ids, token_types_or_zeros(config(), in),
                                        in.attention_mask, layer_wrapper);
    return out;
  }

 private:
  BertStack stack_{nullptr};
};

class BertSequenceClassifier : public PretrainedModel {
 public:
  BertSequenceClassifier(const hf::ModelConfig& c, const torch::TensorOptions& t)
      : PretrainedModel(c, TaskHead::SequenceClassification) {
    if (c.num_labels < 1)
      throw_invalid("bert: num_labels must be at least 1 for sequence classification");
    bert = register_module("bert", BertStack(c, t));
    classifier = register_module("classifier", Linear(c.hidden_size, c.num_labels, true, t));
    const double hidden_dropout = config_dropout(c, "hidden_dropout_prob", 0.1);
    classifier_dropout_ = config_dropout(c, "classifier_dropout", hidden_dropout);
    problem_type_ = c.problem_type;
  }

  BertStack bert{nullptr};
  Linear classifier{nullptr};

 protected:
  ForwardOutput run(const ForwardInput& in) override {
    check_bert_positions(config(), in);
    ForwardOutput out;
    out.hidden_states = bert->forward(in.input_ids, token_types_or_zeros(config(), in),
                                      in.attention_mask, layer_wrapper);
    torch::Tensor pooled = bert->pooler(out.hidden_states);
    out.logits = classifier(model::dropout(pooled, classifier_dropout_, is_training()));
    if (in.labels.defined()) out.loss = loss(out.logits, in.labels);
    return out;
  }

 private:
  // As transformers picks it: regression for one label, single-label cross-entropy for
  // integer labels, multi-label BCE for float labels — unless problem_type says otherwise.
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& labels) const {
    const std::int64_t n = config().num_labels;
    std::string problem = problem_type_;
    if (problem.empty()) {
      if (n == 1)
        problem = "regression";
      else if (!labels.is_floating_point())
        problem = "single_label_classification";
      else
        problem = "multi_label_classification";
    }
    if (problem == "regression") {
      torch::Tensor target = labels.to(logits.scalar_type());
      return n == 1 ? torch::mse_loss(logits.squeeze(), target.squeeze())
                    : torch::mse_loss(logits, target);
    }
    if (problem == "single_label_classification") {
      if (labels.is_floating_point() || labels.numel() != logits.size(0))
        throw_invalid("labels: sequence classification needs one integer label per row ([B])");
      torch::Tensor l = labels.reshape({-1}).to(torch::kInt64);
      torch::Tensor valid = l.ne(-100);
      if (valid.any().item<bool>() &&
          ((l.lt(0) & valid).any().item<bool>() || l.ge(n).any().item<bool>()))
        throw_invalid("labels: class ids must be in [0, " + std::to_string(n) +
                      ") (num_labels) or -100");
      return torch::nn::functional::cross_entropy(logits.view({-1, n}), l);
    }
    if (problem == "multi_label_classification") {
      if (labels.sizes() != logits.sizes())
        throw_invalid("labels: multi-label classification needs labels shaped [B, num_labels]");
      return torch::binary_cross_entropy_with_logits(logits, labels.to(logits.scalar_type()));
    }
    throw_unsupported("config.json: problem_type \"" + problem + "\" is not supported",
                      "supported: regression, single_label_classification, "
                      "multi_label_classification");
  }

  double classifier_dropout_ = 0.1;
  std::string problem_type_;
};

}  // namespace

std::shared_ptr<PretrainedModel> create_bert(const hf::ModelConfig& config, TaskHead head,
                                             const torch::TensorOptions& options) {
  switch (head) {
    case TaskHead::Base:
      return std::make_shared<BertBase>(config, options);
    case TaskHead::SequenceClassification:
      return std::make_shared<BertSequenceClassifier>(config, options);
    case TaskHead::CausalLM:
      break;
  }
  throw_unsupported("bert: the " + std::string(task_head_name(head)) +
                        " head is not supported for this model type",
                    "supported for bert: BertModel, BertForSequenceClassification");
}

}  // namespace tessera::model
