#pragma once
// HuggingFace tokenizer.json: encode/decode with the same token ids as the `tokenizers`
// library (and as transformers' `tokenizer(text)["input_ids"]` when loaded from a folder).
// Supported: BPE (byte-level, and SentencePiece-style with byte fallback) and WordPiece,
// with the normalizers, pre-tokenizers, post-processors and decoders those models ship with.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::hf {

namespace tokenizer_detail {
struct State;
}

class Tokenizer {
 public:
  // Loads a tokenizer.json; throws tessera::Error naming the file and the field at fault.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);
  // Loads <dir>/tokenizer.json and checks <dir>/tokenizer_config.json if present. Its
  // add_bos_token / add_eos_token are ignored, as transformers 5 ignores them when a
  // tokenizer.json exists (its post-processor decides). A tokenizer.json path works too.
  static Tokenizer from_folder(const std::filesystem::path& model_dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Thread-safe (const). Invalid UTF-8 in `text` is read as U+FFFD, as Python would after a
  // lossy decode.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

  std::size_t vocab_size() const;  // including added tokens, as len(tokenizer)
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(std::int32_t id) const;
  std::vector<std::string> special_tokens() const;  // added tokens with special=true, by id
  std::string model_kind() const;  // "BPE (byte-level)", "BPE (byte fallback)", "WordPiece", "BPE"

  const std::filesystem::path& path() const;

 private:
  explicit Tokenizer(std::unique_ptr<tokenizer_detail::State> state);
  std::unique_ptr<tokenizer_detail::State> state_;
};

}  // namespace tessera::hf
