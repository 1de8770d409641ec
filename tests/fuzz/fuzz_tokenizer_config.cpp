// tokenizer_config.json as a model folder's is read: special tokens (strings or AddedToken
// objects), flags, and the chat template, which is then parsed and rendered with those tokens.
#include "fuzz_support.h"
#include "hf/chat/chat_template.h"
#include "hf/chat/tokenizer_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = tessera::fuzz::write_input("tokenizer_config.json", data, size);
  tessera::fuzz::refusal_is_fine([&] {
    const tessera::hf::TokenizerConfig config = tessera::hf::load_tokenizer_config(path);
    if (!config.chat_template) return;
    const auto chat = tessera::hf::ChatTemplate::parse(*config.chat_template, path.string());
    const auto messages = nlohmann::ordered_json::parse(
        R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"}])");
    (void)chat.render(messages, true, config);
  });
  return 0;
}
