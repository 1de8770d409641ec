#include "hf/config.h"

#include <algorithm>

#include "core/error.h"
#include "core/files.h"

namespace tessera::hf {
namespace {

using nlohmann::json;

// Reads typed fields from a config document, naming the file and the field on any fault.
class FieldReader {
 public:
  FieldReader(const json& doc, std::string source) : doc_(doc), source_(std::move(source)) {}

  bool has(const char* key) const { return doc_.contains(key) && !doc_.at(key).is_null(); }

  std::int64_t int_field(const char* key, std::optional<std::int64_t> fallback = std::nullopt,
                         std::int64_t min_value = 1) const {
    if (!has(key)) {
      if (fallback) return *fallback;
      fail(key, "is missing", "add it to config.json");
    }
    const json& v = doc_.at(key);
    if (!v.is_number_integer() &&
        !(v.is_number_float() && v.get<double>() == static_cast<double>(v.get<std::int64_t>())))
      fail(key, "must be an integer, got " + std::string(v.type_name()));
    auto value = v.get<std::int64_t>();
    if (value < min_value)
      fail(key, "must be at least " + std::to_string(min_value) + ", got " + std::to_string(value));
    return value;
  }

  double number_field(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = doc_.at(key);
    if (!v.is_number()) fail(key, "must be a number, got " + std::string(v.type_name()));
    return v.get<double>();
  }

  bool bool_field(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = doc_.at(key);
    if (!v.is_boolean()) fail(key, "must be true or false, got " + std::string(v.type_name()));
    return v.get<bool>();
  }

  std::string string_field(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = doc_.at(key);
    if (!v.is_string()) fail(key, "must be a string, got " + std::string(v.type_name()));
    return v.get<std::string>();
  }

  std::optional<std::int64_t> optional_token_id(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = doc_.at(key);
    if (v.is_array()) {  // some configs list several ids; the first is the canonical one
      if (v.empty()) return std::nullopt;
      if (!v.front().is_number_integer()) fail(key, "must be an integer or a list of integers");
      return v.front().get<std::int64_t>();
    }
    if (!v.is_number_integer()) fail(key, "must be an integer or a list of integers");
    return v.get<std::int64_t>();
  }

  std::vector<std::int64_t> token_id_list(const char* key) const {
    std::vector<std::int64_t> out;
    if (!has(key)) return out;
    const json& v = doc_.at(key);
    if (v.is_number_integer()) return {v.get<std::int64_t>()};
    if (!v.is_array()) fail(key, "must be an integer or a list of integers");
    for (const auto& e : v) {
      if (!e.is_number_integer()) fail(key, "must be an integer or a list of integers");
      out.push_back(e.get<std::int64_t>());
    }
    return out;
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what,
                         std::string hint = {}) const {
    throw_invalid(source_ + ": field \"" + key + "\" " + what, std::move(hint));
  }

 private:
  const json& doc_;
  std::string source_;
};

const std::vector<std::pair<std::string, ModelFamily>>& family_table() {
  static const std::vector<std::pair<std::string, ModelFamily>> table = {
      {"llama", ModelFamily::Llama},
      {"mistral", ModelFamily::Mistral},
      {"qwen2", ModelFamily::Qwen2},
      {"gpt2", ModelFamily::Gpt2},
      {"bert", ModelFamily::Bert}};
  return table;
}

std::string supported_list() {
  std::string s;
  for (const auto& name : supported_model_types()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

// transformers 5 writes `rope_parameters` (with rope_theta inside); older files write a
// top-level rope_theta and an optional `rope_scaling`. Both are read.
void read_rope(const json& doc, const std::string& source, ModelConfig& config) {
  FieldReader top(doc, source);
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
  FieldReader rope(*params, source + " (" + key + ")");
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

}  // namespace

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [name, family] : family_table()) v.push_back(name);
    return v;
  }();
  return names;
}

const char* family_name(ModelFamily family) {
  for (const auto& [name, f] : family_table())
    if (f == family) return name.c_str();
  return "unknown";
}

ModelConfig parse_model_config(const nlohmann::json& doc, const std::string& source) {
  if (!doc.is_object()) throw_invalid(source + ": expected a JSON object");
  FieldReader f(doc, source);
  ModelConfig c;
  c.raw = doc;
  if (!f.has("model_type"))
    f.fail("model_type", "is missing",
           "a HuggingFace config.json names its architecture in model_type; supported: " +
               supported_list());
  c.model_type = f.string_field("model_type", "");
  auto it = std::find_if(family_table().begin(), family_table().end(),
                         [&](const auto& e) { return e.first == c.model_type; });
  if (it == family_table().end())
    throw_unsupported(source + ": model_type \"" + c.model_type + "\" is not supported",
                      "supported model types: " + supported_list());
  c.family = it->second;
  if (doc.contains("architectures") && doc["architectures"].is_array())
    for (const auto& a : doc["architectures"])
      if (a.is_string()) c.architectures.push_back(a.get<std::string>());
  c.torch_dtype = f.string_field("torch_dtype", f.string_field("dtype", ""));
  c.bos_token_id = f.optional_token_id("bos_token_id");
  c.eos_token_ids = f.token_id_list("eos_token_id");
  c.pad_token_id = f.optional_token_id("pad_token_id");
  c.vocab_size = f.int_field("vocab_size");

  switch (c.family) {
    case ModelFamily::Llama:
    case ModelFamily::Mistral:
    case ModelFamily::Qwen2: {
      c.hidden_size = f.int_field("hidden_size");
      c.intermediate_size = f.int_field("intermediate_size");
      c.num_hidden_layers = f.int_field("num_hidden_layers");
      c.num_attention_heads = f.int_field("num_attention_heads");
      c.num_key_value_heads = f.int_field("num_key_value_heads", c.num_attention_heads);
      c.head_dim = f.int_field("head_dim", c.hidden_size / c.num_attention_heads);
      c.max_position_embeddings = f.int_field("max_position_embeddings", 2048);
      c.hidden_act = f.string_field("hidden_act", "silu");
      c.norm_eps = f.number_field("rms_norm_eps", 1e-6);
      c.tie_word_embeddings = f.bool_field("tie_word_embeddings", false);
      c.attention_bias = c.family == ModelFamily::Qwen2 || f.bool_field("attention_bias", false);
      c.mlp_bias = f.bool_field("mlp_bias", false);
      read_rope(doc, source, c);
      bool sliding = c.family == ModelFamily::Mistral ||
                     (c.family == ModelFamily::Qwen2 && f.bool_field("use_sliding_window", false));
      if (sliding && f.has("sliding_window")) c.sliding_window = f.int_field("sliding_window");
      if (c.num_attention_heads % c.num_key_value_heads != 0)
        f.fail("num_key_value_heads",
               "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
      if (c.hidden_act != "silu")
        throw_unsupported(
            source + ": hidden_act \"" + c.hidden_act + "\" is not supported for " + c.model_type,
            "supported: silu");
      if (f.has("pretraining_tp") && f.int_field("pretraining_tp") != 1)
        throw_unsupported(source + ": pretraining_tp other than 1 is not supported");
      break;
    }
    case ModelFamily::Gpt2: {
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
      c.mlp_bias = true;
      if (f.bool_field("scale_attn_by_inverse_layer_idx", false) ||
          f.bool_field("reorder_and_upcast_attn", false))
        throw_unsupported(source +
                          ": scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not "
                          "supported");
      if (!f.bool_field("scale_attn_weights", true))
        throw_unsupported(source + ": scale_attn_weights=false is not supported");
      if (c.hidden_act != "gelu_new" && c.hidden_act != "gelu" && c.hidden_act != "relu" &&
          c.hidden_act != "gelu_pytorch_tanh")
        throw_unsupported(
            source + ": activation_function \"" + c.hidden_act + "\" is not supported",
            "supported: gelu_new, gelu_pytorch_tanh, gelu, relu");
      break;
    }
    case ModelFamily::Bert: {
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
      c.attention_bias = true;
      c.mlp_bias = true;
      if (c.position_embedding_type != "absolute")
        throw_unsupported(source + ": position_embedding_type \"" + c.position_embedding_type +
                              "\" is not supported",
                          "supported: absolute");
      if (c.hidden_act != "gelu" && c.hidden_act != "gelu_new" && c.hidden_act != "relu")
        throw_unsupported(source + ": hidden_act \"" + c.hidden_act + "\" is not supported",
                          "supported: gelu, gelu_new, relu");
      if (f.has("id2label")) {
        const json& labels = doc.at("id2label");
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
      c.num_labels = f.int_field(
          "num_labels", static_cast<std::int64_t>(c.id2label.empty() ? 2 : c.id2label.size()));
      break;
    }
  }
  if (c.hidden_size % c.num_attention_heads != 0 && c.family != ModelFamily::Llama &&
      c.family != ModelFamily::Mistral && c.family != ModelFamily::Qwen2)
    f.fail("num_attention_heads", "must divide the hidden size");
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& path) {
  std::string text = core::read_text_file(path);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw_invalid(path.string() + ": not valid JSON (byte " + std::to_string(e.byte) + ")",
                  "config.json must be the JSON document HuggingFace writes");
  }
  return parse_model_config(doc, path.string());
}

}  // namespace tessera::hf
