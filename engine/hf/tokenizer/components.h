#pragma once
// The tokenizer pipeline's stages, as the `tokenizers` library defines them: normalizer →
// pre-tokenizer → model → post-processor, and decoder for the way back. Internal header.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessera::hf::tokenizer_detail {

using Json = nlohmann::json;

// Where a JSON value sits, for error messages: "<file>: pre_tokenizer.pretokenizers[1].type".
struct Where {
  std::string file;
  std::string field;
  Where operator/(const std::string& child) const {
    return {file, field.empty() ? child : field + "." + child};
  }
  Where operator[](std::size_t index) const {
    return {file, field + "[" + std::to_string(index) + "]"};
  }
  std::string str() const { return file + ": " + field; }
};

// Field access with errors that name the file and field.
// `key` is a C string: GCC 13's -Wdangling-reference takes a std::string temporary argument for
// the referent of the result.
const Json& require(const Json& object, const char* key, const Where& where);
std::string require_string(const Json& object, const std::string& key, const Where& where);
bool get_bool(const Json& object, const std::string& key, bool fallback, const Where& where);
std::int64_t get_int(const Json& object, const std::string& key, std::int64_t fallback,
                     const Where& where);
std::string type_of(const Json& object, const Where& where);
// A field that must hold exactly one character (Metaspace replacement, a delimiter, …).
char32_t one_char(const std::string& s, const Where& where);
[[noreturn]] void unknown_type(const std::string& type, const Where& where, const char* known);

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};
using Vocab = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

// One piece of the pre-tokenized text. `token_id` >= 0 marks an added token that the model
// must not see; `at_start` says the piece begins at offset 0 of the original text.
struct Split {
  std::string text;
  bool at_start = false;
  std::int32_t token_id = -1;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits further every piece whose token_id < 0; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<Split>& splits) const = 0;
  virtual bool is_byte_level() const { return false; }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual void tokenize(std::string_view word, std::vector<std::int32_t>& out) const = 0;
  virtual std::optional<std::int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(std::int32_t id) const = 0;
  virtual const Vocab& vocab() const = 0;
  virtual std::string kind() const = 0;
  virtual bool byte_fallback() const { return false; }
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<std::int32_t>& ids) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  virtual bool is_byte_level() const { return false; }
};

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const Where& where);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const Where& where);
std::unique_ptr<Model> make_model(const Json& j, const Where& where);
// `lookup` resolves special-token strings (BertProcessing carries ids; Template carries ids).
std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const Where& where);
std::unique_ptr<Decoder> make_decoder(const Json& j, const Where& where);

// The GPT-2 byte ↔ printable-character table used by ByteLevel.
const std::string& byte_to_unicode(unsigned char b);  // UTF-8 of the mapped character
std::optional<unsigned char> unicode_to_byte(char32_t c);

}  // namespace tessera::hf::tokenizer_detail
