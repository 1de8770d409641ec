#pragma once
// Chat templates rendered exactly as transformers' apply_chat_template(..., tokenize=False).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "hf/chat/jinja.h"
#include "hf/chat/tokenizer_config.h"

namespace tessera::hf {

class ChatTemplate {
 public:
  // Throws tessera::Error naming `source_name`, line and column on a syntax error.
  static ChatTemplate parse(std::string source, std::string source_name);

  // messages: [{"role":..., "content":...}, ...]. Renders with the special tokens of
  // `config` (bos_token, eos_token, unk_token, pad_token), add_generation_prompt, and the
  // variables transformers passes (tools=none, documents=none). As transformers does,
  // message keys whose value is null are dropped first. Key order of `messages` is kept
  // for the ordered_json overload; nlohmann::json sorts keys.
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const TokenizerConfig& config) const;
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const TokenizerConfig& config,
                     const nlohmann::ordered_json& extra_variables = {}) const;
  // Raw: renders with any variables (a JSON object).
  std::string render(const nlohmann::json& context) const;
  std::string render_ordered(const nlohmann::ordered_json& context) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
};

// A short human name for a known template ("chatml", "llama2", "llama3", "mistral",
// "zephyr", "gemma", "phi3", …) or "custom" for anything else.
std::string chat_template_name(const std::string& source);

}  // namespace tessera::hf
