#include "hf/config.h"

#include <cctype>
#include <cmath>

#include "core/error.h"
#include "core/files.h"
#include "hf/config_fields.h"
#include "hf/families.h"

namespace tessera::hf {
namespace {

using nlohmann::json;

// Integers of config.json as a signed 64-bit value: JSON allows any size, and larger ones arrive
// as unsigned or floating-point numbers whose conversion would wrap or be undefined.
constexpr double kInt64Limit = 9223372036854775808.0;  // 2^63

std::string supported_list() {
  std::string s;
  for (const auto& name : supported_model_types()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

// config.json's `quantization_config`: bitsandbytes' 4-bit and 8-bit layouts are read; every
// other method is refused by its name before any tensor is.
StoredQuantization read_quantization(const json& doc, const std::string& source) {
  StoredQuantization q;
  if (!doc.contains("quantization_config") || doc.at("quantization_config").is_null()) return q;
  const json& qc = doc.at("quantization_config");
  if (!qc.is_object())
    throw_invalid(source + ": field \"quantization_config\" must be an object, got " +
                  std::string(qc.type_name()));
  ConfigFields f(qc, source + ": quantization_config");
  const std::string method = f.string_field("quant_method", "bitsandbytes");
  if (method != "bitsandbytes") {
    std::string upper = method;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    throw_unsupported(source + ": the checkpoint is quantized with " + upper +
                          " (quantization_config.quant_method \"" + method +
                          "\"), which is not supported yet",
                      "use the model's unquantized repository (method.quantize nf4 quantizes it "
                      "on load for QLoRA) or its bitsandbytes version (a -bnb-4bit folder)");
  }
  const bool four_bit = f.bool_field("load_in_4bit", false);
  const bool eight_bit = f.bool_field("load_in_8bit", false);
  if (four_bit == eight_bit)
    f.fail(
        "load_in_4bit",
        four_bit ? "and load_in_8bit are both true" : "and load_in_8bit are both false or missing",
        "a bitsandbytes checkpoint is either 4-bit or 8-bit");
  if (four_bit) {
    q.format = f.string_field("bnb_4bit_quant_type", "fp4");
    if (q.format != "nf4" && q.format != "fp4")
      f.fail("bnb_4bit_quant_type", "is \"" + q.format + "\"", "bitsandbytes writes nf4 or fp4");
    const std::string storage = f.string_field("bnb_4bit_quant_storage", "uint8");
    if (storage != "uint8")
      throw_unsupported(source + ": quantization_config.bnb_4bit_quant_storage \"" + storage +
                            "\": 4-bit codes stored as anything but uint8 are not supported yet",
                        "use a checkpoint saved with the default uint8 storage");
    q.double_quant = f.bool_field("bnb_4bit_use_double_quant", false);
  } else {
    q.format = "int8";
    if (f.bool_field("llm_int8_has_fp16_weight", false))
      throw_unsupported(source +
                            ": quantization_config.llm_int8_has_fp16_weight: an 8-bit "
                            "checkpoint that keeps float16 weights is not supported yet",
                        "use a checkpoint saved with int8 weights");
  }
  if (f.has("llm_int8_skip_modules")) {
    const json& skip = qc.at("llm_int8_skip_modules");
    if (!skip.is_array()) f.fail("llm_int8_skip_modules", "must be a list of module names");
    for (const auto& m : skip) {
      if (!m.is_string()) f.fail("llm_int8_skip_modules", "must be a list of module names");
      q.skip_modules.push_back(m.get<std::string>());
    }
  }
  return q;
}

}  // namespace

std::string StoredQuantization::describe() const {
  if (!stored()) return "dense";
  return format + " (bitsandbytes" + (double_quant ? ", double-quantized absmax)" : ")");
}

std::int64_t ConfigFields::int_field(const char* key, std::optional<std::int64_t> fallback,
                                     std::int64_t min_value) const {
  if (!has(key)) {
    if (fallback) return *fallback;
    fail(key, "is missing", "add it to config.json");
  }
  const json& v = doc_.at(key);
  const auto too_large = [&](const std::string& written) {
    fail(key, "is " + written + ", more than a 64-bit integer holds",
         "config.json's sizes are counts of elements; correct " + std::string(key));
  };
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    too_large(std::to_string(v.get<std::uint64_t>()));
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (!std::isfinite(x) || x != std::floor(x)) fail(key, "must be an integer, got " + v.dump());
    if (x >= kInt64Limit || x < -kInt64Limit) too_large(v.dump());
  } else if (!v.is_number_integer()) {
    fail(key, "must be an integer, got " + std::string(v.type_name()));
  }
  const auto value =
      v.is_number_float() ? static_cast<std::int64_t>(v.get<double>()) : v.get<std::int64_t>();
  if (value < min_value)
    fail(key, "must be at least " + std::to_string(min_value) + ", got " + std::to_string(value));
  return value;
}

double ConfigFields::number_field(const char* key, double fallback) const {
  if (!has(key)) return fallback;
  const json& v = doc_.at(key);
  if (!v.is_number()) fail(key, "must be a number, got " + std::string(v.type_name()));
  return v.get<double>();
}

bool ConfigFields::bool_field(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = doc_.at(key);
  if (!v.is_boolean()) fail(key, "must be true or false, got " + std::string(v.type_name()));
  return v.get<bool>();
}

std::string ConfigFields::string_field(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const json& v = doc_.at(key);
  if (!v.is_string()) fail(key, "must be a string, got " + std::string(v.type_name()));
  return v.get<std::string>();
}

std::optional<std::int64_t> ConfigFields::optional_token_id(const char* key) const {
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

std::vector<std::int64_t> ConfigFields::token_id_list(const char* key) const {
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

void ConfigFields::fail(const std::string& key, const std::string& what, std::string hint) const {
  throw_invalid(source_ + ": field \"" + key + "\" " + what, std::move(hint));
}

void ConfigFields::fail_value(const std::string& key, std::int64_t value, const std::string& what,
                              std::string hint) const {
  throw_invalid(source_ + ": " + key + " " + std::to_string(value) + " " + what, std::move(hint));
}

ModelConfig parse_model_config(const nlohmann::json& doc, const std::string& source) {
  if (!doc.is_object()) throw_invalid(source + ": expected a JSON object");
  ConfigFields f(doc, source);
  ModelConfig c;
  c.raw = doc;
  if (!f.has("model_type"))
    f.fail("model_type", "is missing",
           "a HuggingFace config.json names its architecture in model_type; supported: " +
               supported_list());
  c.model_type = f.string_field("model_type", "");
  const FamilyTraits* found = find_family(c.model_type);
  if (found == nullptr)
    throw_unsupported(source + ": model_type \"" + c.model_type + "\" is not supported",
                      "supported model types: " + supported_list());
  const FamilyTraits& family = *found;
  c.family = family.family;
  if (doc.contains("architectures") && doc["architectures"].is_array())
    for (const auto& a : doc["architectures"])
      if (a.is_string()) c.architectures.push_back(a.get<std::string>());
  c.torch_dtype = f.string_field("torch_dtype", f.string_field("dtype", ""));
  c.bos_token_id = f.optional_token_id("bos_token_id");
  c.eos_token_ids = f.token_id_list("eos_token_id");
  c.pad_token_id = f.optional_token_id("pad_token_id");
  c.vocab_size = f.int_field("vocab_size");

  family.read_config(f, c);
  c.quantization = read_quantization(doc, source);
  // Read by the model's modules (engine/model) from ModelConfig::dropout, checked here where the
  // file is known.
  for (const char* key :
       {"attention_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob",
        "classifier_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop"}) {
    if (!f.has(key) || !doc.at(key).is_number()) continue;
    const double p = doc.at(key).get<double>();
    if (!(p >= 0.0 && p < 1.0))
      throw_invalid(
          source + ": " + key + " " + doc.at(key).dump() + " is not a probability in [0, 1)",
          "set " + std::string(key) + " to 0.0 (no dropout) or a value below 1");
    c.dropout[key] = p;
  }
  return c;
}

namespace {

// A folder without config.json: what it is instead (a run writes adapters and checkpoints beside
// its model, and a user may point at them), and where the model is.
[[noreturn]] void refuse_folder_without_config(const std::filesystem::path& config_path) {
  namespace fs = std::filesystem;
  const fs::path dir =
      config_path.parent_path().empty() ? fs::path(".") : config_path.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw_invalid(dir.string() + ": no such model folder",
                  "give a HuggingFace model folder (config.json, *.safetensors, tokenizer.json)");
  const fs::path run_model = dir.parent_path() / "model";
  const std::string beside =
      fs::exists(run_model / "config.json", ec)
          ? "the run's model is beside it in " + run_model.string()
          : "a finished run writes its model into its output folder's model/";
  if (fs::exists(dir / "trainer_state.json", ec))
    throw_invalid(dir.string() +
                      ": a training checkpoint (what --resume continues), not a model "
                      "folder: it has no config.json",
                  beside + "; continue the run with tessera-cli run JOB.json --resume " +
                      dir.parent_path().string());
  if (fs::exists(dir / "adapter_config.json", ec))
    throw_invalid(dir.string() +
                      ": a LoRA adapter (for peft), not a model folder: it has no "
                      "config.json",
                  beside +
                      " (the adapter merged into its base); or load the adapter in peft on "
                      "its base model");
  throw_invalid(dir.string() + ": no config.json in this folder",
                "give a HuggingFace model folder (config.json, *.safetensors, tokenizer.json)");
}

}  // namespace

ModelConfig load_model_config(const std::filesystem::path& path) {
  std::error_code missing;
  if (path.filename() == "config.json" && !std::filesystem::exists(path, missing) && !missing)
    refuse_folder_without_config(path);
  std::string text = core::read_text_file(path);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw_invalid(path.string() + ": not valid JSON (byte " + std::to_string(e.byte) + ")",
                  "config.json must be the JSON document HuggingFace writes");
  } catch (const json::out_of_range& e) {  // a number beyond a double's range (1e400)
    throw_invalid(path.string() + ": not valid JSON (" + e.what() + ")",
                  "config.json must be the JSON document HuggingFace writes");
  }
  return parse_model_config(doc, path.string());
}

}  // namespace tessera::hf
