// tokenizer.json as a model folder's tokenizer is loaded, then used as fine-tuning and generation
// use it: a few texts encoded (with and without special tokens) and decoded back.
#include <array>
#include <vector>

#include "fuzz_support.h"
#include "hf/tokenizer/tokenizer.h"

namespace {

// Plain words, merges, Unicode (accents, CJK, emoji), whitespace runs and invalid UTF-8.
constexpr std::array<std::string_view, 4> kTexts{
    "hello world, the quick brown fox! abc ab bc unaffable 123",
    "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80  \t\n\n  tokens's <s></s>[CLS]",
    "\xff\xfe broken \xc3 utf-8 \xed\xa0\x80", ""};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = tessera::fuzz::write_input("tokenizer.json", data, size);
  tessera::fuzz::refusal_is_fine([&] {
    const auto tokenizer = tessera::hf::Tokenizer::from_file(path);
    (void)tokenizer.vocab_size();
    (void)tokenizer.special_tokens();
    (void)tokenizer.model_kind();
    for (const std::string_view text : kTexts) {
      for (const bool special : {true, false}) {
        const std::vector<std::int32_t> ids = tokenizer.encode(text, special);
        (void)tokenizer.decode(ids, false);
        (void)tokenizer.decode(ids, true);
        for (const std::int32_t id : ids) (void)tokenizer.id_to_token(id);
      }
    }
  });
  return 0;
}
