#include "hf/chat/tokenizer_config.h"

#include <cmath>
#include <system_error>

#include "core/error.h"
#include "core/files.h"

namespace tessera::hf {

namespace {

const char* kHint = "fix or re-download tokenizer_config.json";

std::optional<std::string> read_token(const nlohmann::json& doc, const char* field,
                                      const std::string& source) {
  auto it = doc.find(field);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {  // a serialized AddedToken
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
    throw_invalid(
        source + ": field '" + field + "' is an AddedToken object without a string \"content\"",
        kHint);
  }
  throw_invalid(source + ": field '" + field + "' must be a string or an AddedToken object, not " +
                    it->type_name(),
                kHint);
}

std::optional<bool> read_bool(const nlohmann::json& doc, const char* field,
                              const std::string& source) {
  auto it = doc.find(field);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean())
    throw_invalid(source + ": field '" + field + "' must be true or false, not " + it->type_name(),
                  kHint);
  return it->get<bool>();
}

std::optional<std::string> read_chat_template(const nlohmann::json& doc,
                                              const std::string& source) {
  auto it = doc.find("chat_template");
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    throw_invalid(source +
                      ": field 'chat_template' must be a string or a list of {name, template}, "
                      "not " +
                      std::string(it->type_name()),
                  kHint);
  std::optional<std::string> chosen;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const auto& entry = (*it)[i];
    std::string where = source + ": field 'chat_template[" + std::to_string(i) + "]'";
    if (!entry.is_object()) throw_invalid(where + " must be an object {name, template}", kHint);
    auto name = entry.find("name");
    auto tmpl = entry.find("template");
    if (name == entry.end() || !name->is_string())
      throw_invalid(where + " needs a string 'name'", kHint);
    if (tmpl == entry.end() || !tmpl->is_string())
      throw_invalid(where + " needs a string 'template'", kHint);
    if (name->get<std::string>() == "default") chosen = tmpl->get<std::string>();
  }
  return chosen;
}

}  // namespace

TokenizerConfig parse_tokenizer_config(const std::string& text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number beyond a double
    throw_invalid(source + ": not valid JSON (" + e.what() + ")", kHint);
  }
  if (!doc.is_object())
    throw_invalid(
        source + ": expected a JSON object at the top level, got " + std::string(doc.type_name()),
        kHint);
  TokenizerConfig config;
  config.bos_token = read_token(doc, "bos_token", source);
  config.eos_token = read_token(doc, "eos_token", source);
  config.unk_token = read_token(doc, "unk_token", source);
  config.pad_token = read_token(doc, "pad_token", source);
  config.add_bos_token = read_bool(doc, "add_bos_token", source);
  config.add_eos_token = read_bool(doc, "add_eos_token", source);
  config.chat_template = read_chat_template(doc, source);
  if (auto it = doc.find("model_max_length"); it != doc.end() && !it->is_null()) {
    if (it->is_number_integer() || it->is_number_unsigned()) {
      if (it->is_number_unsigned() &&
          it->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
        config.model_max_length = 0;
      else
        config.model_max_length = std::max<std::int64_t>(0, it->get<std::int64_t>());
    } else if (it->is_number_float()) {
      // transformers writes a huge float (1e30) to mean "no limit".
      double v = it->get<double>();
      config.model_max_length =
          (std::isfinite(v) && v > 0 && v < 1e18) ? static_cast<std::int64_t>(v) : 0;
    } else {
      throw_invalid(source + ": field 'model_max_length' must be a number, not " +
                        std::string(it->type_name()),
                    kHint);
    }
  }
  if (auto it = doc.find("tokenizer_class"); it != doc.end() && !it->is_null()) {
    if (!it->is_string())
      throw_invalid(source + ": field 'tokenizer_class' must be a string, not " +
                        std::string(it->type_name()),
                    kHint);
    config.tokenizer_class = it->get<std::string>();
  }
  config.raw = std::move(doc);
  return config;
}

TokenizerConfig load_tokenizer_config(const std::filesystem::path& path) {
  return parse_tokenizer_config(core::read_text_file(path), path.string());
}

TokenizerConfig load_tokenizer_config_from_folder(const std::filesystem::path& model_dir) {
  std::error_code ec;
  const auto config_path = model_dir / "tokenizer_config.json";
  const auto jinja_path = model_dir / "chat_template.jinja";
  bool has_config = std::filesystem::is_regular_file(config_path, ec);
  bool has_jinja = std::filesystem::is_regular_file(jinja_path, ec);
  if (!has_config && !has_jinja)
    throw_invalid(model_dir.string() + ": no tokenizer_config.json or chat_template.jinja",
                  "point at a HuggingFace model folder that includes its tokenizer files");
  TokenizerConfig config;
  if (has_config) config = load_tokenizer_config(config_path);
  if (has_jinja) config.chat_template = core::read_text_file(jinja_path);
  return config;
}

}  // namespace tessera::hf
