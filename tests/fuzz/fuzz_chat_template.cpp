// A chat template (tokenizer_config.json's chat_template or chat_template.jinja): parsed, then
// rendered as fine-tuning and generation render it, over a conversation with a system turn, a
// multi-turn exchange and a tool call, with and without the generation prompt.
#include "fuzz_support.h"
#include "hf/chat/chat_template.h"

namespace {

const nlohmann::ordered_json& conversation() {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <s> {{ x }}"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
      "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"}])");
  return messages;
}

const tessera::hf::TokenizerConfig& special_tokens() {
  static const tessera::hf::TokenizerConfig config = [] {
    tessera::hf::TokenizerConfig made;
    made.bos_token = "<s>";
    made.eos_token = "</s>";
    made.unk_token = "<unk>";
    made.pad_token = "<pad>";
    return made;
  }();
  return config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tessera::fuzz::refusal_is_fine([&] {
    const auto chat = tessera::hf::ChatTemplate::parse(
        std::string(tessera::fuzz::as_text(data, size)), "chat_template.jinja");
    (void)tessera::hf::chat_template_name(chat.source());
    for (const bool add_generation_prompt : {false, true}) {
      tessera::fuzz::refusal_is_fine(
          [&] { (void)chat.render(conversation(), add_generation_prompt, special_tokens()); });
    }
  });
  return 0;
}
