// Normalizers: text → text before splitting. Only ids matter here, so alignments that the
// `tokenizers` library tracks for offsets are not kept.
#include "core/error.h"
#include "hf/tokenizer/components.h"
#include "hf/tokenizer/regex.h"
#include "hf/tokenizer/unicode.h"

namespace tessera::hf::tokenizer_detail {
namespace {

using unicode::next_char;

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = unicode::normalize(text, form_); }

 private:
  unicode::NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = unicode::lowercase(text); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    std::size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        std::size_t i = begin;
        if (!unicode::is_whitespace(next_char(text, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        std::size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        std::size_t i = start;
        if (!unicode::is_whitespace(next_char(text, i))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Drops characters for which `drop` is true.
template <typename Pred>
void filter_chars(std::string& text, Pred drop) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t start = i;
    char32_t c = next_char(text, i);
    if (!drop(c)) out.append(text, start, i - start);
  }
  text = std::move(out);
}

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    filter_chars(text, [](char32_t c) { return unicode::is_combining_mark(c); });
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::optional<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    std::string out;
    std::size_t prev = 0;
    if (regex_) {
      std::vector<std::pair<std::size_t, std::size_t>> matches;
      regex_->find_all(text, matches);
      if (matches.empty()) return;
      for (auto [b, e] : matches) {
        out.append(text, prev, b - prev);
        out += content_;
        prev = e;
      }
    } else {
      if (literal_.empty()) return;
      std::size_t pos = text.find(literal_);
      if (pos == std::string::npos) return;
      while (pos != std::string::npos) {
        out.append(text, prev, pos - prev);
        out += content_;
        prev = pos + literal_.size();
        pos = text.find(literal_, prev);
      }
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  std::string content_;
};

bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool chinese, bool strip_accents, bool lowercase)
      : clean_text_(clean_text),
        chinese_(chinese),
        strip_accents_(strip_accents),
        lowercase_(lowercase) {}

  void normalize(std::string& text) const override {
    if (clean_text_ || chinese_) {
      std::string out;
      out.reserve(text.size() + 8);
      std::size_t i = 0;
      while (i < text.size()) {
        std::size_t start = i;
        char32_t c = next_char(text, i);
        if (clean_text_) {
          // Control characters go first, so VT, FF and NEL are dropped, not turned into spaces.
          if (c == 0 || c == 0xFFFD) continue;
          const bool keep_control = c == '\t' || c == '\n' || c == '\r';
          if (!keep_control && unicode::is_other(c)) continue;
          if (keep_control || unicode::is_whitespace(c)) {
            out.push_back(' ');
            continue;
          }
        }
        if (chinese_ && c >= 0x3400 && is_chinese_char(c)) {
          out.push_back(' ');
          out.append(text, start, i - start);
          out.push_back(' ');
          continue;
        }
        out.append(text, start, i - start);
      }
      text = std::move(out);
    }
    if (strip_accents_) {
      text = unicode::normalize(text, unicode::NormalForm::NFD);
      filter_chars(text, [](char32_t c) { return unicode::is_mark_nonspacing(c); });
    }
    if (lowercase_) text = unicode::lowercase(text);
  }

 private:
  bool clean_text_, chinese_, strip_accents_, lowercase_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const Where& where) {
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    const Json& list = require(j, "normalizers", where);
    if (!list.is_array()) throw_invalid((where / "normalizers").str() + " must be an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (std::size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_normalizer(list[i], (where / "normalizers")[i]));
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(get_bool(j, "strip_left", true, where),
                                             get_bool(j, "strip_right", true, where));
  }
  if (type == "Prepend")
    return std::make_unique<PrependNormalizer>(require_string(j, "prepend", where));
  if (type == "Replace") {
    const Json& pattern = require(j, "pattern", where);
    const Where pw = where / "pattern";
    std::string content = require_string(j, "content", where);
    if (pattern.is_object() && pattern.contains("String"))
      return std::make_unique<ReplaceNormalizer>(require_string(pattern, "String", pw),
                                                 std::nullopt, std::move(content));
    if (pattern.is_object() && pattern.contains("Regex"))
      return std::make_unique<ReplaceNormalizer>(
          "", Regex(require_string(pattern, "Regex", pw), pw.str()), std::move(content));
    throw_invalid(pw.str() + " must be {\"String\": ...} or {\"Regex\": ...}");
  }
  if (type == "BertNormalizer") {
    const bool lowercase = get_bool(j, "lowercase", true, where);
    bool strip_accents = lowercase;  // null follows lowercase, as in BERT
    if (j.contains("strip_accents") && !j["strip_accents"].is_null())
      strip_accents = get_bool(j, "strip_accents", lowercase, where);
    return std::make_unique<BertNormalizer>(get_bool(j, "clean_text", true, where),
                                            get_bool(j, "handle_chinese_chars", true, where),
                                            strip_accents, lowercase);
  }
  if (type == "Precompiled" || type == "Nmt" || type == "ByteLevel")
    throw_unsupported((where / "type").str() + ": normalizer '" + type + "' is not supported yet",
                      "supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, "
                      "Replace, Prepend, BertNormalizer");
  unknown_type(type, where,
               "Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, "
               "Prepend, BertNormalizer");
}

}  // namespace tessera::hf::tokenizer_detail
