#include "runner/demo.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/files.h"

namespace tessera::runner {
namespace {

using nlohmann::json;

// GPT-2's byte → printable code point table, so the byte-level vocabulary is the same one
// HuggingFace tokenizers use.
std::string byte_to_unicode(int b) {
  int cp = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// Uniform integer in [0, n) from the generator, by rejection (portable across standard
// libraries, unlike std::uniform_int_distribution).
std::uint64_t bounded(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  std::uint64_t x;
  do x = rng();
  while (x >= limit);
  return x % n;
}

DemoTask task_for(const std::string& word, std::size_t kind) {
  switch (kind % 3) {
    case 0:
      return {"first " + word, std::string(1, word.front())};
    case 1:
      return {"last " + word, std::string(1, word.back())};
    default: {
      std::string upper = word;
      std::transform(upper.begin(), upper.end(), upper.begin(),
                     [](char c) { return static_cast<char>(c - 'a' + 'A'); });
      return {"upper " + word, upper};
    }
  }
}

// A terse template keeps sequences short (every character is a token): "<|bos|>first kiwo =
// k<|eos|>". It renders a conversation prefix by prefix, so the loss falls on the assistant's
// tokens only.
constexpr const char* kDemoChatTemplate =
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] + ' = ' }}"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}";

}  // namespace

DemoData make_demo_data(std::size_t train_count, std::size_t test_count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<std::string> seen;
  std::vector<std::string> words;
  const std::size_t validation_count = std::max<std::size_t>(32, test_count / 2);
  const std::size_t needed = train_count + validation_count + test_count;
  while (words.size() < needed) {
    std::size_t length = 3 + bounded(rng, 4);
    std::string w;
    for (std::size_t i = 0; i < length; ++i) w += static_cast<char>('a' + bounded(rng, 26));
    if (seen.insert(w).second) words.push_back(w);
  }
  DemoData data;
  for (std::size_t i = 0; i < words.size(); ++i) {
    DemoTask t = task_for(words[i], i);
    if (i < train_count)
      data.train.push_back(t);
    else if (i < train_count + validation_count)
      data.validation.push_back(t);
    else
      data.test.push_back(t);
  }
  return data;
}

hf::ModelConfig write_demo_model_files(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(b)] = b;
  const std::vector<std::string> specials = {"<|bos|>", "<|eos|>", "<|pad|>"};
  json added = json::array();
  for (std::size_t i = 0; i < specials.size(); ++i) {
    vocab[specials[i]] = 256 + static_cast<int>(i);
    added.push_back({{"id", 256 + i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array()}}},
  };
  core::write_file_atomic(dir / "tokenizer.json", tokenizer.dump(1) + "\n");
  json tokenizer_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                           {"bos_token", "<|bos|>"},
                           {"eos_token", "<|eos|>"},
                           {"pad_token", "<|pad|>"},
                           {"model_max_length", 256},
                           {"chat_template", kDemoChatTemplate}};
  core::write_file_atomic(dir / "tokenizer_config.json", tokenizer_config.dump(2) + "\n");
  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"vocab_size", 259},
                 {"hidden_size", 128},
                 {"intermediate_size", 352},
                 // Two layers, not four: on these tasks four layers sat on a loss plateau for
                 // most of a short run (13-24% after 500 steps), two learn them in a few hundred
                 // steps at half the step time (README.md has the measurements).
                 {"num_hidden_layers", 2},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 2},
                 {"max_position_embeddings", 256},
                 {"rms_norm_eps", 1e-6},
                 {"rope_theta", 10000.0},
                 {"tie_word_embeddings", false},
                 {"bos_token_id", 256},
                 {"eos_token_id", 257},
                 {"pad_token_id", 258},
                 {"hidden_act", "silu"},
                 {"torch_dtype", "float32"}};
  core::write_file_atomic(dir / "config.json", config.dump(2) + "\n");
  return hf::parse_model_config(config, (dir / "config.json").string());
}

void write_demo_jsonl(const std::filesystem::path& path, const std::vector<DemoTask>& tasks) {
  std::string text;
  for (const auto& t : tasks)
    text += json{{"instruction", t.instruction}, {"output", t.answer}}.dump() + "\n";
  core::write_file_atomic(path, text);
}

}  // namespace tessera::runner
