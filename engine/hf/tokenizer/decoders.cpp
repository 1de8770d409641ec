// Decoders: tokens → text, chained as the `tokenizers` library chains them.
#include "core/error.h"
#include "hf/tokenizer/components.h"
#include "hf/tokenizer/regex.h"
#include "hf/tokenizer/unicode.h"

namespace tessera::hf::tokenizer_detail {
namespace {

using unicode::next_char;

std::string replace_all(const std::string& text, std::string_view from, std::string_view to) {
  if (from.empty()) return text;
  std::string out;
  std::size_t prev = 0;
  for (std::size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, prev)) {
    out.append(text, prev, pos - prev);
    out += to;
    prev = pos + from.size();
  }
  out.append(text, prev, std::string::npos);
  return out;
}

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }
  bool is_byte_level() const override {
    for (const auto& step : steps_)
      if (step->is_byte_level()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  bool is_byte_level() const override { return true; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      const std::size_t mark = bytes.size();
      bool mapped = true;
      std::size_t i = 0;
      while (i < token.size()) {
        auto b = unicode_to_byte(next_char(token, i));
        if (!b) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(*b));
      }
      if (!mapped) {  // a token outside the byte alphabet stays as it is
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens.assign(1, unicode::to_valid_utf8(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      tokens[t] = replace_all(tokens[t], replacement_, (t == 0 && strip_first_) ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    std::size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (unicode::is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (std::size_t k = 0; k < pending_count; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& token : tokens) {
      int value = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        auto hex = [](char c) {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          return -1;
        };
        const int hi = hex(token[3]), lo = hex(token[4]);
        if (hi >= 0 && lo >= 0) value = hi * 16 + lo;
      }
      if (value >= 0) {
        pending.push_back(static_cast<char>(value));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, std::size_t start, std::size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::vector<std::pair<std::size_t, char32_t>> chars;  // byte offset, char
      std::size_t i = 0;
      while (i < token.size()) {
        std::size_t at = i;
        chars.emplace_back(at, next_char(token, i));
      }
      std::size_t first = 0, last = chars.size();
      for (std::size_t k = 0; k < start_ && k < chars.size() && chars[k].second == content_; ++k)
        first = k + 1;
      for (std::size_t k = 0; k < stop_ && k < chars.size(); ++k) {
        const std::size_t index = chars.size() - k - 1;
        if (chars[index].second != content_) break;
        last = index;
      }
      if (first >= last) {
        token.clear();
        continue;
      }
      const std::size_t b = chars[first].first;
      const std::size_t e = last < chars.size() ? chars[last].first : token.size();
      token = token.substr(b, e - b);
    }
  }

 private:
  char32_t content_;
  std::size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string literal, std::optional<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      if (!regex_) {
        token = replace_all(token, literal_, content_);
        continue;
      }
      std::vector<std::pair<std::size_t, std::size_t>> matches;
      regex_->find_all(token, matches);
      std::string out;
      std::size_t prev = 0;
      for (auto [b, e] : matches) {
        out.append(token, prev, b - prev);
        out += content_;
        prev = e;
      }
      out.append(token, prev, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  std::string content_;
};

class WordPieceDecoder final : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup)
      : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string& token = tokens[i];
      if (i != 0) {
        if (!prefix_.empty() && token.compare(0, prefix_.size(), prefix_) == 0) {
          token.erase(0, prefix_.size());
        } else {
          token.insert(0, 1, ' ');
        }
      }
      if (cleanup_) token = cleanup(token);
    }
  }

  // transformers' clean_up_tokenization, as the WordPiece decoder applies it.
  static std::string cleanup(const std::string& text) {
    static const std::pair<const char*, const char*> kRules[] = {
        {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
        {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    std::string out = text;
    for (const auto& [from, to] : kRules) out = replace_all(out, from, to);
    return out;
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = replace_all(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
  }

 private:
  std::string suffix_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j, const Where& where) {
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    const Json& list = require(j, "decoders", where);
    if (!list.is_array()) throw_invalid((where / "decoders").str() + " must be an array");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (std::size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_decoder(list[i], (where / "decoders")[i]));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    std::string replacement = j.contains("replacement") ? require_string(j, "replacement", where)
                                                        : std::string("\xE2\x96\x81");
    one_char(replacement, where / "replacement");
    bool strip_first = true;
    if (j.contains("prepend_scheme")) {
      strip_first = require_string(j, "prepend_scheme", where) != "never";
    } else if (j.contains("add_prefix_space")) {
      strip_first = get_bool(j, "add_prefix_space", true, where);
    }
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), strip_first);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::int64_t start = get_int(j, "start", 0, where), stop = get_int(j, "stop", 0, where);
    if (start < 0 || stop < 0) throw_invalid(where.str() + ": start and stop must not be negative");
    return std::make_unique<StripDecoder>(
        one_char(require_string(j, "content", where), where / "content"),
        static_cast<std::size_t>(start), static_cast<std::size_t>(stop));
  }
  if (type == "Replace") {
    const Json& pattern = require(j, "pattern", where);
    const Where pw = where / "pattern";
    std::string content = require_string(j, "content", where);
    if (pattern.is_object() && pattern.contains("String"))
      return std::make_unique<ReplaceDecoder>(require_string(pattern, "String", pw), std::nullopt,
                                              std::move(content));
    if (pattern.is_object() && pattern.contains("Regex"))
      return std::make_unique<ReplaceDecoder>(
          "", Regex(require_string(pattern, "Regex", pw), pw.str()), std::move(content));
    throw_invalid(pw.str() + " must be {\"String\": ...} or {\"Regex\": ...}");
  }
  if (type == "WordPiece") {
    return std::make_unique<WordPieceDecoder>(
        j.contains("prefix") ? require_string(j, "prefix", where) : "##",
        get_bool(j, "cleanup", true, where));
  }
  if (type == "BPEDecoder")
    return std::make_unique<BpeSuffixDecoder>(
        j.contains("suffix") ? require_string(j, "suffix", where) : "</w>");
  unknown_type(type, where,
               "Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, WordPiece, "
               "BPEDecoder");
}

}  // namespace tessera::hf::tokenizer_detail
