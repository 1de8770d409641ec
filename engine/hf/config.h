#pragma once
// config.json → a typed configuration. Field names follow the llama family; other
// families' names (gpt2's n_embd, n_layer, …) are mapped onto them, and `raw` keeps the
// whole document for export.
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tessera::hf {

// Names a family in code (engine/model picks the module builder by it); what a family is and
// has is its registry entry, hf/families.h.
enum class ModelFamily { Llama, Mistral, Qwen2, Gpt2, Bert };

struct RopeScaling {
  std::string rope_type = "default";  // default | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;                          // llama3
  double high_freq_factor = 4.0;                         // llama3
  std::int64_t original_max_position_embeddings = 8192;  // llama3
};

// How a checkpoint stores its linear weights when config.json has a `quantization_config`
// (bitsandbytes' layouts, read by engine/model/quantized_linear): empty `format` when dense.
struct StoredQuantization {
  std::string format;         // "" | "nf4" | "fp4" (4-bit, bnb_4bit_quant_type) | "int8"
  bool double_quant = false;  // bnb_4bit_use_double_quant: the absmax are 8-bit codes themselves
  std::vector<std::string> skip_modules;  // llm_int8_skip_modules: kept dense
  bool stored() const { return !format.empty(); }
  // "nf4 (bitsandbytes, double-quantized absmax)": for logs and plans.
  std::string describe() const;
};

struct ModelConfig {
  std::string model_type;  // as written in config.json
  ModelFamily family = ModelFamily::Llama;
  std::vector<std::string> architectures;

  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t max_position_embeddings = 0;
  std::string hidden_act = "silu";
  double norm_eps = 1e-6;  // rms_norm_eps / layer_norm_eps / layer_norm_epsilon
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;         // q/k/v biases (llama's attention_bias; qwen2: true)
  bool attention_output_bias = false;  // the attention output's bias (o_proj; qwen2: none)
  bool mlp_bias = false;
  std::optional<std::int64_t> sliding_window;
  // Decoders with a sliding window: which layers use it (mistral every one; qwen2 as its
  // layer_types says, else from max_window_layers on). Empty without a window.
  std::vector<bool> sliding_layers;
  // The dropout probabilities config.json sets, by its key (attention_dropout, attn_pdrop,
  // hidden_dropout_prob, …), each checked to be in [0, 1).
  std::map<std::string, double> dropout;
  std::string torch_dtype;  // "float32", "bfloat16", … (may be empty)

  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;
  std::optional<std::int64_t> pad_token_id;

  // bert
  std::int64_t type_vocab_size = 0;
  std::int64_t num_labels = 0;  // from id2label when present
  std::map<std::int64_t, std::string> id2label;
  std::string position_embedding_type = "absolute";
  std::string problem_type;  // transformers' problem_type for the classification loss ("" unset)

  // A checkpoint saved quantized (the Hub's -bnb-4bit folders): how. Other quantization methods
  // (GPTQ, AWQ, …) are refused by name when the config is read.
  StoredQuantization quantization;

  // config.json as read, for writing it back with the export; the model is built from the
  // fields above alone.
  nlohmann::json raw;
};

// Parses and validates `path` (a config.json). Missing or ill-typed fields and an
// unsupported model_type raise tessera::Error naming the file and the field.
ModelConfig load_model_config(const std::filesystem::path& path);
ModelConfig parse_model_config(const nlohmann::json& doc, const std::string& source_name);
// The supported model types and each family's mapping: hf/families.h.

}  // namespace tessera::hf
