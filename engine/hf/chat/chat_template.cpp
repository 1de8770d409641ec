#include "hf/chat/chat_template.h"

#include "core/error.h"

namespace tessera::hf {

ChatTemplate ChatTemplate::parse(std::string source, std::string source_name) {
  ChatTemplate t;
  t.template_ = jinja::Template::parse(source, source_name);
  t.source_ = std::move(source);
  return t;
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const TokenizerConfig& config) const {
  return render(nlohmann::ordered_json::parse(messages.dump()), add_generation_prompt, config);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const TokenizerConfig& config,
                                 const nlohmann::ordered_json& extra_variables) const {
  const std::string& name = template_.source_name();
  if (!messages.is_array())
    throw_invalid(name + ": messages must be a JSON list of {\"role\", \"content\"} objects");
  if (messages.empty())
    throw_invalid(name + ": cannot apply a chat template to an empty conversation",
                  "provide at least one message");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  // transformers passes its special tokens first; explicit variables override them.
  if (config.bos_token) context["bos_token"] = *config.bos_token;
  if (config.eos_token) context["eos_token"] = *config.eos_token;
  if (config.unk_token) context["unk_token"] = *config.unk_token;
  if (config.pad_token) context["pad_token"] = *config.pad_token;
  nlohmann::ordered_json cleaned = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const auto& message = messages[i];
    if (!message.is_object())
      throw_invalid(name + ": message " + std::to_string(i) + " is not a JSON object");
    // Keys whose value is null are dropped, as transformers does.
    nlohmann::ordered_json kept = nlohmann::ordered_json::object();
    for (const auto& [k, v] : message.items())
      if (!v.is_null()) kept[k] = v;
    // transformers also offers a message's reasoning under the names templates read:
    // "thinking" first (unless the message has its own), "reasoning_content" last.
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (kept.contains(key)) {
        reasoning = &kept[key];
        break;
      }
    if (reasoning) {
      nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
      aliased["thinking"] = *reasoning;
      for (const auto& [k, v] : kept.items()) aliased[k] = v;
      aliased["reasoning_content"] = *reasoning;
      kept = std::move(aliased);
    }
    cleaned.push_back(std::move(kept));
  }
  context["messages"] = std::move(cleaned);
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  if (extra_variables.is_object())
    for (const auto& [k, v] : extra_variables.items()) context[k] = v;
  return template_.render(context);
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return template_.render(nlohmann::ordered_json::parse(context.dump()));
}

std::string ChatTemplate::render_ordered(const nlohmann::ordered_json& context) const {
  return template_.render(context);
}

std::string chat_template_name(const std::string& source) {
  try {
    jinja::Template::parse(source, "chat_template");
  } catch (const Error&) {
    return "invalid";
  }
  auto has = [&](const char* s) { return source.find(s) != std::string::npos; };
  if (has("<|im_start|>")) return "chatml";
  if (has("<|start_header_id|>")) return "llama3";
  if (has("[INST]") && has("<<SYS>>")) return "llama2";
  if (has("[INST]")) return "mistral";
  if (has("<start_of_turn>")) return "gemma";
  if (has("<|user|>") && has("<|end|>")) return "phi3";
  if (has("<|user|>") && has("<|assistant|>")) return "zephyr";
  return "custom";
}

}  // namespace tessera::hf
