#pragma once
// tokenizer_config.json: special tokens, BOS/EOS flags and the chat template.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace tessera::hf {

struct TokenizerConfig {
  // Each is a string or an AddedToken dict {"content": ...} in the file.
  std::optional<std::string> bos_token, eos_token, unk_token, pad_token;
  std::optional<bool> add_bos_token, add_eos_token;
  // A string, or the "default" entry of a list of {name, template}.
  std::optional<std::string> chat_template;
  std::int64_t model_max_length = 0;  // 0 = unset/huge
  std::string tokenizer_class;
  nlohmann::json raw;
};

// Throws tessera::Error naming the file and field at fault.
TokenizerConfig load_tokenizer_config(const std::filesystem::path& path);

// Parses an already-read document; `source_name` names it in error messages.
TokenizerConfig parse_tokenizer_config(const std::string& text, const std::string& source_name);

// <dir>/tokenizer_config.json (when present) plus <dir>/chat_template.jinja, which newer
// transformers writes instead of the "chat_template" field and which takes precedence.
TokenizerConfig load_tokenizer_config_from_folder(const std::filesystem::path& model_dir);

}  // namespace tessera::hf
