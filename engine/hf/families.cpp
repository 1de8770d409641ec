#include "hf/families.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/text.h"
#include "hf/config_fields.h"

namespace tessera::hf {
namespace {

using nlohmann::json;

double d(std::int64_t v) {
  return static_cast<double>(v);
}

// transformers 5 writes `rope_parameters` (with rope_theta inside); older files write a
// top-level rope_theta and an optional `rope_scaling`. Both are read.
void read_rope(const ConfigFields& top, ModelConfig& config) {
  const json& doc = top.doc();
  const std::string& source = top.source();
  config.rope_theta = top.number_field("rope_theta", 10000.0);
  const json* params = nullptr;
  std::string key;
  for (const char* k : {"rope_parameters", "rope_scaling"}) {
    if (top.has(k)) {
      params = &doc.at(k);
      key = k;
      break;
    }
  }
  if (params == nullptr) return;
  if (!params->is_object()) top.fail(key, "must be an object or null");
  ConfigFields rope(*params, source + " (" + key + ")");
  config.rope_theta = rope.number_field("rope_theta", config.rope_theta);
  std::string type = rope.string_field("rope_type", rope.string_field("type", "default"));
  if (type != "default" && type != "linear" && type != "llama3")
    throw_unsupported(source + ": " + key + ".rope_type \"" + type + "\" is not supported",
                      "supported rope types: default, linear, llama3");
  config.rope_scaling.rope_type = type;
  config.rope_scaling.factor = rope.number_field("factor", 1.0);
  config.rope_scaling.low_freq_factor = rope.number_field("low_freq_factor", 1.0);
  config.rope_scaling.high_freq_factor = rope.number_field("high_freq_factor", 4.0);
  config.rope_scaling.original_max_position_embeddings =
      rope.int_field("original_max_position_embeddings", 8192);
  if (type != "default" && config.rope_scaling.factor <= 0) rope.fail("factor", "must be positive");
}

// The divisors of `whole` nearest `wanted` below and above it whose quotient satisfies
// `quotient_ok`, as a hint's " (the nearest: 6 or 8)"; empty when there is none close by (the
// scan is bounded: a hint is not worth scanning an absurd size for).
std::string nearest_divisors(std::int64_t whole, std::int64_t wanted,
                             bool (*quotient_ok)(std::int64_t)) {
  constexpr std::int64_t kScan = 4096;
  std::int64_t below = 0, above = 0;
  for (std::int64_t k = std::min(wanted, whole); k >= 1 && k >= wanted - kScan && below == 0; --k)
    if (whole % k == 0 && quotient_ok(whole / k)) below = k;
  if (wanted < whole)
    for (std::int64_t k = wanted + 1; k <= whole && k - wanted <= kScan && above == 0; ++k)
      if (whole % k == 0 && quotient_ok(whole / k)) above = k;
  if (below == 0 && above == 0) return "";
  if (below != 0 && above != 0)
    return " (the nearest: " + std::to_string(below) + " or " + std::to_string(above) + ")";
  return " (the nearest: " + std::to_string(below != 0 ? below : above) + ")";
}

// Heads split the hidden size evenly (transformers' head_dim = hidden_size / num_attention_heads
// when config.json gives no head_dim). `heads_key` / `hidden_key`: the family's names for them.
// `even`: the heads rotate pairs of dimensions (rotary positions), so head_dim must be even.
void require_heads_divide(const ConfigFields& f, const char* heads_key, const char* hidden_key,
                          const ModelConfig& c, bool even) {
  const std::int64_t heads = c.num_attention_heads, hidden = c.hidden_size;
  auto any = [](std::int64_t) { return true; };
  auto even_quotient = [](std::int64_t q) { return q % 2 == 0; };
  const std::string head_dim_note =
      even ? "; or write head_dim, an even number, and keep num_attention_heads" : "";
  if (hidden % heads != 0)
    f.fail_value(heads_key, heads,
                 "does not divide " + std::string(hidden_key) + " " + std::to_string(hidden) +
                     ": each attention head takes " + hidden_key + " / " + heads_key +
                     " dimensions",
                 "set " + std::string(heads_key) + " to a divisor of " + std::to_string(hidden) +
                     nearest_divisors(hidden, heads, even ? +even_quotient : +any) + head_dim_note);
  if (even && (hidden / heads) % 2 != 0)
    f.fail_value(heads_key, heads,
                 "gives each head " + std::string(hidden_key) + " " + std::to_string(hidden) +
                     " / " + std::to_string(heads) + " = " + std::to_string(hidden / heads) +
                     " dimensions, an odd number: rotary position embeddings rotate pairs of them",
                 "set " + std::string(heads_key) + " so that " + hidden_key + " / " + heads_key +
                     " is even" + nearest_divisors(hidden, heads, even_quotient) + head_dim_note);
}

// ---- llama / mistral / qwen2: one pre-norm decoder (engine/model/decoder.cpp) ----------------

// How the three decoders' configs differ.
struct DecoderVariant {
  bool qkv_bias_always = false;       // qwen2: q/k/v always biased
  bool output_bias_follows = true;    // llama: attention_bias covers o_proj too; qwen2: never
  bool sliding_always = false;        // mistral: sliding_window applies whenever written
  bool sliding_when_enabled = false;  // qwen2: only with use_sliding_window
};

void read_decoder(const ConfigFields& f, ModelConfig& c, const DecoderVariant& variant) {
  c.hidden_size = f.int_field("hidden_size");
  c.intermediate_size = f.int_field("intermediate_size");
  c.num_hidden_layers = f.int_field("num_hidden_layers");
  c.num_attention_heads = f.int_field("num_attention_heads");
  c.num_key_value_heads = f.int_field("num_key_value_heads", c.num_attention_heads);
  if (f.has("head_dim")) {
    c.head_dim = f.int_field("head_dim");
    if (c.head_dim % 2 != 0)
      f.fail_value("head_dim", c.head_dim,
                   "is odd: rotary position embeddings rotate pairs of a head's dimensions",
                   "set head_dim to an even number (or leave it out: hidden_size / "
                   "num_attention_heads)");
  } else {
    require_heads_divide(f, "num_attention_heads", "hidden_size", c, /*even=*/true);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = f.int_field("max_position_embeddings", 2048);
  c.hidden_act = f.string_field("hidden_act", "silu");
  c.norm_eps = f.number_field("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = f.bool_field("tie_word_embeddings", false);
  c.attention_bias = variant.qkv_bias_always || f.bool_field("attention_bias", false);
  c.attention_output_bias = variant.output_bias_follows && c.attention_bias;
  c.mlp_bias = f.bool_field("mlp_bias", false);
  read_rope(f, c);
  const bool sliding = variant.sliding_always ||
                       (variant.sliding_when_enabled && f.bool_field("use_sliding_window", false));
  if (sliding && f.has("sliding_window")) c.sliding_window = f.int_field("sliding_window");
  // Which layers slide, as transformers decides: every layer for mistral; for qwen2 the
  // config's layer_types when written (checked here), else layers from max_window_layers on.
  if (c.sliding_window) {
    const auto n = static_cast<std::size_t>(c.num_hidden_layers);
    c.sliding_layers.assign(n, true);
    if (variant.sliding_when_enabled && f.has("layer_types")) {
      const json& types = f.doc().at("layer_types");
      if (!types.is_array() || types.size() != n)
        f.fail(
            "layer_types",
            "must list one entry per layer (num_hidden_layers " +
                std::to_string(c.num_hidden_layers) + "), got " +
                (types.is_array() ? std::to_string(types.size()) + " entries" : types.type_name()),
            "list \"full_attention\" or \"sliding_attention\" for each layer");
      for (std::size_t i = 0; i < n; ++i) {
        if (!types[i].is_string() ||
            (types[i] != "full_attention" && types[i] != "sliding_attention"))
          f.fail("layer_types", "[" + std::to_string(i) + "] is " + types[i].dump() +
                                    ", not \"full_attention\" or \"sliding_attention\"");
        c.sliding_layers[i] = types[i] == "sliding_attention";
      }
    } else if (variant.sliding_when_enabled) {
      std::int64_t first = 28;  // transformers' default max_window_layers
      if (f.has("max_window_layers") && f.doc().at("max_window_layers").is_number_integer())
        first = f.doc().at("max_window_layers").get<std::int64_t>();
      for (std::size_t i = 0; i < n; ++i)
        c.sliding_layers[i] = static_cast<std::int64_t>(i) >= first;
    }
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail_value("num_key_value_heads", c.num_key_value_heads,
                 "does not divide num_attention_heads " + std::to_string(c.num_attention_heads) +
                     ": each key/value head serves the same number of query heads",
                 "set num_key_value_heads to a divisor of num_attention_heads (" +
                     std::to_string(c.num_attention_heads) + " for plain multi-head attention)");
  if (c.hidden_act != "silu")
    throw_unsupported(
        f.source() + ": hidden_act \"" + c.hidden_act + "\" is not supported for " + c.model_type,
        "supported: silu");
  if (f.has("pretraining_tp") && f.int_field("pretraining_tp") != 1)
    throw_unsupported(f.source() + ": pretraining_tp other than 1 is not supported");
}

void read_llama(const ConfigFields& f, ModelConfig& c) {
  read_decoder(f, c, {});
}
void read_mistral(const ConfigFields& f, ModelConfig& c) {
  read_decoder(f, c, {.sliding_always = true});
}
void read_qwen2(const ConfigFields& f, ModelConfig& c) {
  read_decoder(
      f, c, {.qkv_bias_always = true, .output_bias_follows = false, .sliding_when_enabled = true});
}

ParameterShapes decoder_shapes(const ModelConfig& c) {
  const double v = d(c.vocab_size), h = d(c.hidden_size), m = d(c.intermediate_size);
  const double q = d(c.num_attention_heads) * d(c.head_dim);
  const double kv = d(c.num_key_value_heads) * d(c.head_dim);
  ParameterShapes s;
  s.layer_linears = {
      {"q_proj", h, q, c.attention_bias, 0},  {"k_proj", h, kv, c.attention_bias, 0},
      {"v_proj", h, kv, c.attention_bias, 0}, {"o_proj", q, h, c.attention_output_bias, 1},
      {"gate_proj", h, m, c.mlp_bias, 2},     {"up_proj", h, m, c.mlp_bias, 2},
      {"down_proj", m, h, c.mlp_bias, 3}};
  s.layer_other = 2 * h;  // input and post-attention RMSNorm
  s.outside_layers = v * h + h + (c.tie_word_embeddings ? 0 : v * h);
  // The attention norm's output (q, k and v's input) and the MLP norm's (gate and up's), h each;
  // rotated q, rotated k, v and the attention output (scaled_dot_product_attention's), and the
  // output's merged copy (o_proj's input); gate, act(gate) and up (silu's and the product's), and
  // act·up (down_proj's input).
  s.saved_per_token = 2 * h + 3 * q + 2 * kv + 4 * m;
  return s;
}

// llama.cpp's names for the pre-norm decoder. `rotary_permute`: its "llama" architecture rotates
// adjacent pairs, so q/k rows are regrouped (GgufLayout::RotaryQ/K); its "qwen2" rotates halves
// as transformers does.
GgufNaming decoder_gguf(std::string architecture, bool rotary_permute) {
  GgufNaming n;
  n.architecture = std::move(architecture);
  n.activations = {"silu"};
  n.llama3_rope_freqs = n.architecture == "llama";
  n.tensors = {{"model.embed_tokens.weight", "token_embd.weight"},
               {"model.norm.weight", "output_norm.weight"},
               {"lm_head.weight", "output.weight"},
               {"model.layers.{L}.input_layernorm.weight", "blk.{L}.attn_norm.weight"},
               {"model.layers.{L}.post_attention_layernorm.weight", "blk.{L}.ffn_norm.weight"}};
  const GgufLayout q = rotary_permute ? GgufLayout::RotaryQ : GgufLayout::AsIs;
  const GgufLayout k = rotary_permute ? GgufLayout::RotaryK : GgufLayout::AsIs;
  const struct {
    const char* hf;
    const char* gguf;
    GgufLayout layout;
  } linears[] = {{"self_attn.q_proj", "attn_q", q},
                 {"self_attn.k_proj", "attn_k", k},
                 {"self_attn.v_proj", "attn_v", GgufLayout::AsIs},
                 {"self_attn.o_proj", "attn_output", GgufLayout::AsIs},
                 {"mlp.gate_proj", "ffn_gate", GgufLayout::AsIs},
                 {"mlp.up_proj", "ffn_up", GgufLayout::AsIs},
                 {"mlp.down_proj", "ffn_down", GgufLayout::AsIs}};
  for (const auto& l : linears)
    for (const char* part : {".weight", ".bias"})
      n.tensors.push_back({std::string("model.layers.{L}.") + l.hf + part,
                           std::string("blk.{L}.") + l.gguf + part, l.layout});
  return n;
}

// ---- gpt2 (engine/model/gpt2.cpp) ------------------------------------------------------------

void read_gpt2(const ConfigFields& f, ModelConfig& c) {
  c.hidden_size = f.int_field("n_embd");
  c.num_hidden_layers = f.int_field("n_layer");
  c.num_attention_heads = f.int_field("n_head");
  c.num_key_value_heads = c.num_attention_heads;
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.intermediate_size = f.int_field("n_inner", 4 * c.hidden_size);
  c.max_position_embeddings = f.int_field("n_positions", 1024);
  c.hidden_act = f.string_field("activation_function", "gelu_new");
  c.norm_eps = f.number_field("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = f.bool_field("tie_word_embeddings", true);
  c.attention_bias = true;
  c.attention_output_bias = true;
  c.mlp_bias = true;
  if (f.bool_field("scale_attn_by_inverse_layer_idx", false) ||
      f.bool_field("reorder_and_upcast_attn", false))
    throw_unsupported(f.source() +
                      ": scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not "
                      "supported");
  if (!f.bool_field("scale_attn_weights", true))
    throw_unsupported(f.source() + ": scale_attn_weights=false is not supported");
  if (c.hidden_act != "gelu_new" && c.hidden_act != "gelu" && c.hidden_act != "relu" &&
      c.hidden_act != "gelu_pytorch_tanh")
    throw_unsupported(
        f.source() + ": activation_function \"" + c.hidden_act + "\" is not supported",
        "supported: gelu_new, gelu_pytorch_tanh, gelu, relu");
  require_heads_divide(f, "n_head", "n_embd", c, /*even=*/false);
}

ParameterShapes gpt2_shapes(const ModelConfig& c) {
  const double v = d(c.vocab_size), h = d(c.hidden_size), m = d(c.intermediate_size);
  ParameterShapes s;
  s.layer_linears = {{"c_attn", h, 3 * h, true, 0},
                     {"c_proj", h, h, true, 1},  // attention's; the MLP's is (m, h)
                     {"c_fc", h, m, true, 2},
                     {"c_proj", m, h, true, 3}};
  s.layer_other = 4 * h;  // ln_1, ln_2
  // wte (lm_head tied to it), wpe, ln_f.
  s.outside_layers = v * h + d(c.max_position_embeddings) * h + 2 * h;
  // ln_1's output (c_attn's input), qkv and the attention output (the attention's), merged
  // (c_proj's input), ln_2's output (c_fc's input), fc (gelu's input), gelu (c_proj's).
  s.saved_per_token = 2 * h + 3 * h + 2 * h + 2 * m;
  return s;
}

GgufNaming gpt2_gguf() {
  GgufNaming n;
  n.architecture = "gpt2";
  n.rms_norm = false;
  // llama.cpp's gpt2 graph uses GELU's tanh approximation.
  n.activations = {"gelu_new", "gelu_pytorch_tanh"};
  n.tensors = {{"transformer.wte.weight", "token_embd.weight"},
               {"transformer.wpe.weight", "position_embd.weight", GgufLayout::AsIs, true},
               {"transformer.ln_f.weight", "output_norm.weight"},
               {"transformer.ln_f.bias", "output_norm.bias"},
               {"lm_head.weight", "output.weight"}};
  const struct {
    const char* hf;
    const char* gguf;
    GgufLayout layout;
  } parts[] = {{"ln_1", "attn_norm", GgufLayout::AsIs},
               {"attn.c_attn", "attn_qkv", GgufLayout::Transposed},
               {"attn.c_proj", "attn_output", GgufLayout::Transposed},
               {"ln_2", "ffn_norm", GgufLayout::AsIs},
               {"mlp.c_fc", "ffn_up", GgufLayout::Transposed},
               {"mlp.c_proj", "ffn_down", GgufLayout::Transposed}};
  for (const auto& p : parts) {
    n.tensors.push_back({std::string("transformer.h.{L}.") + p.hf + ".weight",
                         std::string("blk.{L}.") + p.gguf + ".weight", p.layout});
    n.tensors.push_back({std::string("transformer.h.{L}.") + p.hf + ".bias",
                         std::string("blk.{L}.") + p.gguf + ".bias"});
  }
  return n;
}

// ---- bert (engine/model/bert.cpp) ------------------------------------------------------------

void read_bert(const ConfigFields& f, ModelConfig& c) {
  c.hidden_size = f.int_field("hidden_size");
  c.intermediate_size = f.int_field("intermediate_size");
  c.num_hidden_layers = f.int_field("num_hidden_layers");
  c.num_attention_heads = f.int_field("num_attention_heads");
  c.num_key_value_heads = c.num_attention_heads;
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = f.int_field("max_position_embeddings", 512);
  c.type_vocab_size = f.int_field("type_vocab_size", 2);
  c.hidden_act = f.string_field("hidden_act", "gelu");
  c.norm_eps = f.number_field("layer_norm_eps", 1e-12);
  c.position_embedding_type = f.string_field("position_embedding_type", "absolute");
  if (f.has("problem_type") && f.doc().at("problem_type").is_string())
    c.problem_type = f.doc().at("problem_type").get<std::string>();
  c.attention_bias = true;
  c.attention_output_bias = true;
  c.mlp_bias = true;
  if (c.position_embedding_type != "absolute")
    throw_unsupported(f.source() + ": position_embedding_type \"" + c.position_embedding_type +
                          "\" is not supported",
                      "supported: absolute");
  if (c.hidden_act != "gelu" && c.hidden_act != "gelu_new" && c.hidden_act != "relu")
    throw_unsupported(f.source() + ": hidden_act \"" + c.hidden_act + "\" is not supported",
                      "supported: gelu, gelu_new, relu");
  if (f.has("id2label")) {
    const json& labels = f.doc().at("id2label");
    if (!labels.is_object()) f.fail("id2label", "must be an object");
    for (const auto& [k, v] : labels.items()) {
      std::int64_t id = -1;
      try {
        std::size_t used = 0;
        id = std::stoll(k, &used);
        if (used != k.size()) id = -1;
      } catch (const std::exception&) {
      }
      if (id < 0 || !v.is_string())
        f.fail("id2label", "must map label ids (\"0\", \"1\", …) to names");
      c.id2label[id] = v.get<std::string>();
    }
  }
  c.num_labels = f.int_field("num_labels",
                             static_cast<std::int64_t>(c.id2label.empty() ? 2 : c.id2label.size()));
  require_heads_divide(f, "num_attention_heads", "hidden_size", c, /*even=*/false);
}

ParameterShapes bert_shapes(const ModelConfig& c) {
  const double v = d(c.vocab_size), h = d(c.hidden_size), m = d(c.intermediate_size);
  ParameterShapes s;
  s.layer_linears = {{"query", h, h, true, 0}, {"key", h, h, true, 0},  {"value", h, h, true, 0},
                     {"dense", h, h, true, 1},  // attention.output's; then intermediate's, output's
                     {"dense", h, m, true, 2}, {"dense", m, h, true, 3}};
  s.layer_other = 4 * h;  // attention.output.LayerNorm, output.LayerNorm
  // Embeddings (word, position, token type) and their LayerNorm, and the pooler, as BertModel
  // and its heads carry them.
  s.outside_layers =
      (v + d(c.max_position_embeddings) + d(c.type_vocab_size)) * h + 2 * h + (h * h + h);
  // id2label is in every bert config; only a classification head carries the classifier.
  bool classifier = false;
  for (const auto& a : c.architectures)
    classifier = classifier || a.find("ForSequenceClassification") != std::string::npos;
  if (classifier && c.num_labels > 0) s.outside_layers += h * d(c.num_labels) + d(c.num_labels);
  // Planned as gpt2's post-norm twin: inputs, qkv, attention output + merged, dense in,
  // residual, intermediate, activation.
  s.saved_per_token = 2 * h + 3 * h + 2 * h + 2 * m;
  return s;
}

// ---- the registry ----------------------------------------------------------------------------

std::vector<FamilyTraits> make_registry() {
  const std::vector<std::string> decoder_buffers = {"rotary_emb.inv_freq", "position_ids"};
  auto decoder = [&](std::string model_type, ModelFamily family,
                     void (*read)(const ConfigFields&, ModelConfig&)) {
    FamilyTraits t;
    t.model_type = std::move(model_type);
    t.family = family;
    t.read_config = read;
    t.base_prefix = "model";
    t.buffer_suffixes = decoder_buffers;
    t.causal_lm = true;
    t.rotary = true;
    t.default_lora_targets = {"q_proj", "v_proj"};
    t.parameter_shapes = decoder_shapes;
    // Megatron's split of a pre-norm decoder: q/k/v and gate/up by their outputs (heads and
    // the MLP's inner width), o and down by their inputs, the embedding and the head by the
    // vocabulary.
    t.tensor_parallel_plan = {{"embed_tokens", TensorSplit::Vocabulary},
                              {"layers.*.self_attn.q_proj", TensorSplit::Column},
                              {"layers.*.self_attn.k_proj", TensorSplit::Column, 1, true},
                              {"layers.*.self_attn.v_proj", TensorSplit::Column, 1, true},
                              {"layers.*.self_attn.o_proj", TensorSplit::Row},
                              {"layers.*.mlp.gate_proj", TensorSplit::Column},
                              {"layers.*.mlp.up_proj", TensorSplit::Column},
                              {"layers.*.mlp.down_proj", TensorSplit::Row},
                              {"lm_head", TensorSplit::Vocabulary}};
    t.pipeline_plan = {"layers", {"embed_tokens"}, {"norm", "lm_head"}, "embed_tokens"};
    t.tensor_parallel_divides = {{"num_attention_heads", &ModelConfig::num_attention_heads},
                                 {"intermediate_size", &ModelConfig::intermediate_size},
                                 {"vocab_size", &ModelConfig::vocab_size}};
    t.tensor_parallel_divides_or_replicates = {
        {"num_key_value_heads", &ModelConfig::num_key_value_heads}};
    t.size_fields = {{"vocab_size", &ModelConfig::vocab_size},
                     {"hidden_size", &ModelConfig::hidden_size},
                     {"intermediate_size", &ModelConfig::intermediate_size},
                     {"num_hidden_layers", &ModelConfig::num_hidden_layers},
                     {"num_attention_heads", &ModelConfig::num_attention_heads},
                     {"num_key_value_heads", &ModelConfig::num_key_value_heads},
                     {"head_dim", &ModelConfig::head_dim}};
    return t;
  };
  std::vector<FamilyTraits> r;
  r.push_back(decoder("llama", ModelFamily::Llama, read_llama));
  r.back().gguf = decoder_gguf("llama", true);
  // llama.cpp runs mistral as its "llama" architecture (no sliding window: see gguf.cpp).
  r.push_back(decoder("mistral", ModelFamily::Mistral, read_mistral));
  r.back().gguf = decoder_gguf("llama", true);
  r.push_back(decoder("qwen2", ModelFamily::Qwen2, read_qwen2));
  r.back().gguf = decoder_gguf("qwen2", false);

  FamilyTraits gpt2;
  gpt2.model_type = "gpt2";
  gpt2.family = ModelFamily::Gpt2;
  gpt2.read_config = read_gpt2;
  gpt2.base_prefix = "transformer";
  // attn.bias / attn.masked_bias: the causal-mask buffers older GPT-2 checkpoints carry.
  gpt2.buffer_suffixes = {".attn.bias", ".attn.masked_bias", "position_ids"};
  gpt2.causal_lm = true;
  gpt2.learned_positions = true;
  gpt2.conv1d_weights = true;
  gpt2.default_lora_targets = {"c_attn"};
  // Megatron's split of gpt2: c_attn by its outputs, each of q, k and v by heads; c_fc by its
  // inner width; the two c_proj by their inputs; wte (and so the tied head) by the vocabulary;
  // the learned positions whole.
  gpt2.tensor_parallel_plan = {
      {"wte", TensorSplit::Vocabulary},      {"h.*.attn.c_attn", TensorSplit::Column, 3},
      {"h.*.attn.c_proj", TensorSplit::Row}, {"h.*.mlp.c_fc", TensorSplit::Column},
      {"h.*.mlp.c_proj", TensorSplit::Row},  {"lm_head", TensorSplit::Vocabulary}};
  gpt2.pipeline_plan = {"h", {"wte", "wpe"}, {"ln_f", "lm_head"}, "wte"};
  gpt2.tensor_parallel_divides = {{"n_head", &ModelConfig::num_attention_heads},
                                  {"n_inner", &ModelConfig::intermediate_size},
                                  {"vocab_size", &ModelConfig::vocab_size}};
  gpt2.parameter_shapes = gpt2_shapes;
  gpt2.size_fields = {{"vocab_size", &ModelConfig::vocab_size},
                      {"n_embd", &ModelConfig::hidden_size},
                      {"n_inner", &ModelConfig::intermediate_size},
                      {"n_layer", &ModelConfig::num_hidden_layers},
                      {"n_positions", &ModelConfig::max_position_embeddings}};
  gpt2.gguf = gpt2_gguf();
  r.push_back(std::move(gpt2));

  FamilyTraits bert;
  bert.model_type = "bert";
  bert.family = ModelFamily::Bert;
  bert.read_config = read_bert;
  bert.base_prefix = "bert";
  bert.buffer_suffixes = {"position_ids"};
  bert.sequence_classification = true;
  bert.learned_positions = true;
  bert.default_lora_targets = {"query", "value"};
  bert.parameter_shapes = bert_shapes;
  bert.size_fields = {{"vocab_size", &ModelConfig::vocab_size},
                      {"hidden_size", &ModelConfig::hidden_size},
                      {"intermediate_size", &ModelConfig::intermediate_size},
                      {"num_hidden_layers", &ModelConfig::num_hidden_layers},
                      {"max_position_embeddings", &ModelConfig::max_position_embeddings},
                      {"type_vocab_size", &ModelConfig::type_vocab_size},
                      {"num_labels", &ModelConfig::num_labels}};
  r.push_back(std::move(bert));
  return r;
}

}  // namespace

const std::vector<FamilyTraits>& model_families() {
  static const std::vector<FamilyTraits> registry = make_registry();
  return registry;
}

namespace {

// "a.b.c" → {"a", "b", "c"}.
std::vector<std::string_view> components(std::string_view path) {
  std::vector<std::string_view> parts;
  while (true) {
    const std::size_t dot = path.find('.');
    parts.push_back(path.substr(0, dot));
    if (dot == std::string_view::npos) return parts;
    path.remove_prefix(dot + 1);
  }
}

}  // namespace

const TensorSplitRule* tensor_split_of(const FamilyTraits& family, std::string_view module_name) {
  const std::vector<std::string_view> name = components(module_name);
  for (const TensorSplitRule& rule : family.tensor_parallel_plan) {
    const std::vector<std::string_view> pattern = components(rule.module);
    if (pattern.size() > name.size()) continue;
    const std::size_t offset = name.size() - pattern.size();
    bool matches = true;
    for (std::size_t i = 0; i < pattern.size() && matches; ++i) {
      const std::string_view part = name[offset + i];
      matches = pattern[i] == "*" ? !part.empty() && part.find_first_not_of("0123456789") ==
                                                         std::string_view::npos
                                  : pattern[i] == part;
    }
    if (matches) return &rule;
  }
  return nullptr;
}

void check_tensor_parallel(const ModelConfig& config, int size) {
  const FamilyTraits& family = family_of(config);
  if (family.tensor_parallel_plan.empty())
    throw_unsupported(
        "tensor parallelism is not supported yet for " + family.model_type + " models",
        "families with a tensor-parallel plan: " + model_types_where([](const FamilyTraits& f) {
          return !f.tensor_parallel_plan.empty();
        }));
  // A size n fits a field it divides, or (kv heads) one that divides n: each head is then held
  // by n / heads ranks.
  const auto fits = [&](std::int64_t n, const SizeField& field, bool replicable) {
    const std::int64_t value = config.*field.member;
    return value % n == 0 || (replicable && value > 0 && n % value == 0);
  };
  const auto fits_all = [&](std::int64_t n) {
    for (const SizeField& field : family.tensor_parallel_divides)
      if (!fits(n, field, false)) return false;
    for (const SizeField& field : family.tensor_parallel_divides_or_replicates)
      if (!fits(n, field, true)) return false;
    return true;
  };
  if (size > 0 && fits_all(size)) return;
  std::string fitting;
  for (std::int64_t n = 1; n <= 64; ++n)
    if (fits_all(n)) fitting += (fitting.empty() ? "" : ", ") + std::to_string(n);
  for (const bool replicable : {false, true})
    for (const SizeField& field : replicable ? family.tensor_parallel_divides_or_replicates
                                             : family.tensor_parallel_divides) {
      if (size > 0 && fits(size, field, replicable)) continue;
      const std::int64_t value = config.*field.member;
      throw_invalid("tensor parallelism over " + std::to_string(size) + " ranks: config.json's " +
                        field.key + " (" + std::to_string(value) + ") does not split into " +
                        std::to_string(size) + " equal parts" +
                        (replicable ? " (nor divides " + std::to_string(size) + ")" : ""),
                    "tensor-parallel sizes that divide every split size of this model: " + fitting);
    }
}

void check_pipeline_parallel(const ModelConfig& config, int stages) {
  const FamilyTraits& family = family_of(config);
  if (family.pipeline_plan.layers.empty())
    throw_unsupported(
        "pipeline parallelism is not supported yet for " + family.model_type + " models",
        "families with a pipeline plan: " + model_types_where([](const FamilyTraits& f) {
          return !f.pipeline_plan.layers.empty();
        }));
  const bool causal = std::any_of(config.architectures.begin(), config.architectures.end(),
                                  [](const std::string& a) {
                                    return a.ends_with("ForCausalLM") || a.ends_with("LMHeadModel");
                                  }) ||
                      config.architectures.empty();
  if (!causal)
    throw_unsupported(
        "pipeline parallelism trains causal language models only; config.json's "
        "architectures name " +
        config.architectures.front());
  if (stages < 1 || stages > config.num_hidden_layers)
    throw_invalid("pipeline parallelism over " + std::to_string(stages) +
                      " stages: config.json's num_hidden_layers (" +
                      std::to_string(config.num_hidden_layers) + ") gives each stage no layer",
                  "pp_size × pp_chunks (the model chunks of all stages) from 1 to " +
                      std::to_string(config.num_hidden_layers) +
                      " (each model chunk holds at least one layer)");
}

std::int64_t pipeline_layer_of(const FamilyTraits& family, const ModelConfig& config,
                               std::string_view parameter_name) {
  const std::vector<std::string_view> name = components(parameter_name);
  const PipelinePlan& plan = family.pipeline_plan;
  for (std::size_t i = 0; i + 1 < name.size(); ++i)
    if (name[i] == plan.layers && !name[i + 1].empty() &&
        name[i + 1].find_first_not_of("0123456789") == std::string_view::npos)
      return std::stoll(std::string(name[i + 1]));
  for (const std::string_view part : name) {
    for (const std::string& module : plan.before)
      if (part == module) return -1;
    for (const std::string& module : plan.after)
      if (part == module) return config.num_hidden_layers;
  }
  throw Error(ErrorKind::Internal, "pipeline plan of " + family.model_type + ": parameter " +
                                       std::string(parameter_name) + " is in no stage");
}

const FamilyTraits* find_family(std::string_view model_type) {
  for (const FamilyTraits& t : model_families())
    if (t.model_type == model_type) return &t;
  return nullptr;
}

const FamilyTraits& family_of(const ModelConfig& config) {
  for (const FamilyTraits& t : model_families())
    if (t.family == config.family) return t;
  throw Error(ErrorKind::Internal, "model family of \"" + config.model_type + "\" has no entry");
}

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const FamilyTraits& t : model_families()) v.push_back(t.model_type);
    return v;
  }();
  return names;
}

const char* family_name(ModelFamily family) {
  for (const FamilyTraits& t : model_families())
    if (t.family == family) return t.model_type.c_str();
  return "unknown";
}

std::optional<GgufTensor> gguf_tensor(const GgufNaming& naming, std::string_view hf_name) {
  constexpr std::string_view kLayer = "{L}";
  for (const GgufTensorName& t : naming.tensors) {
    const std::size_t at = t.hf.find(kLayer);
    if (at == std::string::npos) {
      if (hf_name == t.hf) return GgufTensor{t.gguf, t.layout, t.keep_f32};
      continue;
    }
    const std::string_view prefix = std::string_view(t.hf).substr(0, at);
    const std::string_view suffix = std::string_view(t.hf).substr(at + kLayer.size());
    if (hf_name.size() <= prefix.size() + suffix.size() || !hf_name.starts_with(prefix) ||
        !hf_name.ends_with(suffix))
      continue;
    const std::string_view layer =
        hf_name.substr(prefix.size(), hf_name.size() - prefix.size() - suffix.size());
    if (!std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::string name = t.gguf;
    name.replace(name.find(kLayer), kLayer.size(), layer);
    return GgufTensor{std::move(name), t.layout, t.keep_f32};
  }
  return std::nullopt;
}

std::string model_types_where(bool (*pred)(const FamilyTraits&)) {
  std::vector<std::string> names;
  for (const FamilyTraits& t : model_families())
    if (pred(t)) names.push_back(t.model_type);
  return core::alternatives(names);
}

}  // namespace tessera::hf
