// Pre-tokenizers: split the normalized text into the words the model sees.
#include <algorithm>
#include <array>

#include "core/error.h"
#include "hf/tokenizer/components.h"
#include "hf/tokenizer/regex.h"
#include "hf/tokenizer/unicode.h"

namespace tessera::hf::tokenizer_detail {

const std::string& byte_to_unicode(unsigned char b) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    char32_t next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE);
      std::string s;
      unicode::append_utf8(s, printable ? static_cast<char32_t>(i) : next++);
      t[static_cast<std::size_t>(i)] = s;
    }
    return t;
  }();
  return table[b];
}

std::optional<unsigned char> unicode_to_byte(char32_t c) {
  static const std::unordered_map<char32_t, unsigned char> inverse = [] {
    std::unordered_map<char32_t, unsigned char> m;
    for (int i = 0; i < 256; ++i) {
      const std::string& s = byte_to_unicode(static_cast<unsigned char>(i));
      std::size_t k = 0;
      m[unicode::next_char(s, k)] = static_cast<unsigned char>(i);
    }
    return m;
  }();
  auto it = inverse.find(c);
  if (it == inverse.end()) return std::nullopt;
  return it->second;
}

namespace {

using unicode::next_char;

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Piece {
  std::size_t begin, end;
  bool is_match;
};

Behavior parse_behavior(const Json& j, const Where& where, Behavior fallback) {
  if (!j.contains("behavior")) return fallback;
  const std::string b = require_string(j, "behavior", where);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  throw_invalid((where / "behavior").str() + ": unknown split behavior '" + b + "'",
                "use Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous");
}

// Turns the match/non-match pieces covering a text into the pieces to keep, as the
// `tokenizers` library's SplitDelimiterBehavior does.
void apply_behavior(std::vector<Piece>& pieces, Behavior behavior) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::Isolated:
      return;
    case Behavior::Removed:
      for (const Piece& p : pieces)
        if (!p.is_match) out.push_back(p);
      break;
    case Behavior::MergedWithPrevious:
      for (const Piece& p : pieces) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::Contiguous:
      for (const Piece& p : pieces) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
  }
  pieces = std::move(out);
}

// Match pieces for a list of match ranges.
void pieces_from_matches(std::size_t size,
                         const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                         bool invert, std::vector<Piece>& pieces) {
  std::size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) pieces.push_back({prev, b, invert});
    pieces.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < size) pieces.push_back({prev, size, invert});
}

// Each character for which `pred` holds is a match of its own.
template <typename Pred>
void pieces_from_chars(std::string_view text, Pred pred, std::vector<Piece>& pieces) {
  std::size_t i = 0, run = 0;
  while (i < text.size()) {
    std::size_t start = i;
    if (pred(next_char(text, i))) {
      if (start > run) pieces.push_back({run, start, false});
      pieces.push_back({start, i, true});
      run = i;
    }
  }
  if (text.size() > run) pieces.push_back({run, text.size(), false});
}

// Replaces every splittable piece by the pieces `fn(text, pieces)` keeps.
template <typename Fn>
void split_each(std::vector<Split>& splits, Fn fn) {
  std::vector<Split> out;
  out.reserve(splits.size() * 4);
  std::vector<Piece> pieces;
  for (Split& s : splits) {
    if (s.token_id >= 0) {
      out.push_back(std::move(s));
      continue;
    }
    pieces.clear();
    fn(s.text, pieces);
    for (const Piece& p : pieces) {
      if (p.end <= p.begin) continue;
      out.push_back({s.text.substr(p.begin, p.end - p.begin), s.at_start && p.begin == 0, -1});
    }
  }
  splits = std::move(out);
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    for (const auto& step : steps_) step->pre_tokenize(splits);
  }
  bool is_byte_level() const override {
    for (const auto& step : steps_)
      if (step->is_byte_level()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::string literal, std::optional<Regex> regex, Behavior behavior, bool invert)
      : literal_(std::move(literal)),
        regex_(std::move(regex)),
        behavior_(behavior),
        invert_(invert) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    std::vector<std::pair<std::size_t, std::size_t>> matches;
    split_each(splits, [&](const std::string& text, std::vector<Piece>& pieces) {
      matches.clear();
      if (regex_) {
        regex_->find_all(text, matches);
      } else if (!literal_.empty()) {
        for (std::size_t pos = text.find(literal_); pos != std::string::npos;
             pos = text.find(literal_, pos + literal_.size()))
          matches.emplace_back(pos, pos + literal_.size());
      }
      pieces_from_matches(text.size(), matches, invert_, pieces);
      apply_behavior(pieces, behavior_);
    });
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::optional<Regex>(Regex(kGpt2Pattern, "ByteLevel")) : std::nullopt) {}
  bool is_byte_level() const override { return true; }
  void pre_tokenize(std::vector<Split>& splits) const override {
    if (add_prefix_space_) {
      for (Split& s : splits)
        if (s.token_id < 0 && !s.text.empty() && s.text[0] != ' ') s.text.insert(0, 1, ' ');
    }
    if (regex_) {
      std::vector<std::pair<std::size_t, std::size_t>> matches;
      split_each(splits, [&](const std::string& text, std::vector<Piece>& pieces) {
        matches.clear();
        regex_->find_all(text, matches);
        pieces_from_matches(text.size(), matches, false, pieces);
      });
    }
    std::string mapped;
    for (Split& s : splits) {
      if (s.token_id >= 0) continue;
      mapped.clear();
      for (char ch : s.text) mapped += byte_to_unicode(static_cast<unsigned char>(ch));
      s.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    for (Split& s : splits) {
      if (s.token_id >= 0) continue;
      std::string replaced;
      replaced.reserve(s.text.size() + 8);
      for (char ch : s.text) {
        if (ch == ' ') {
          replaced += replacement_;
        } else {
          replaced.push_back(ch);
        }
      }
      const bool starts = replaced.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts &&
          (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && s.at_start)))
        replaced.insert(0, replacement_);
      s.text = std::move(replaced);
    }
    if (!split_) return;
    std::vector<std::pair<std::size_t, std::size_t>> matches;
    split_each(splits, [&](const std::string& text, std::vector<Piece>& pieces) {
      matches.clear();
      for (std::size_t pos = text.find(replacement_); pos != std::string::npos;
           pos = text.find(replacement_, pos + replacement_.size()))
        matches.emplace_back(pos, pos + replacement_.size());
      pieces_from_matches(text.size(), matches, false, pieces);
      apply_behavior(pieces, Behavior::MergedWithNext);
    });
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class BertPreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Split>& splits) const override {
    split_each(splits, [](const std::string& text, std::vector<Piece>& pieces) {
      std::size_t i = 0, word = 0;
      while (i < text.size()) {
        std::size_t start = i;
        char32_t c = next_char(text, i);
        const bool ws = unicode::is_whitespace(c);
        if (ws || unicode::is_punctuation(c)) {
          if (start > word) pieces.push_back({word, start, false});
          if (!ws) pieces.push_back({start, i, false});
          word = i;
        }
      }
      if (text.size() > word) pieces.push_back({word, text.size(), false});
    });
  }
};

class WhitespaceSplitPreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Split>& splits) const override {
    split_each(splits, [](const std::string& text, std::vector<Piece>& pieces) {
      pieces_from_chars(text, unicode::is_whitespace, pieces);
      apply_behavior(pieces, Behavior::Removed);
    });
  }
};

// \w+|[^\w\s]+ with the Rust regex crate's Unicode \w (Alphabetic, marks, Nd, Pc,
// Join_Control), which is wider than PCRE2's: ZWJ and variation selectors are word characters.
class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Split>& splits) const override {
    split_each(splits, [](const std::string& text, std::vector<Piece>& pieces) {
      enum { kSpace, kWord, kOther } run = kSpace;
      std::size_t i = 0, run_start = 0;
      while (i < text.size()) {
        const std::size_t start = i;
        const char32_t c = next_char(text, i);
        const auto kind = unicode::is_regex_word(c)   ? kWord
                          : unicode::is_whitespace(c) ? kSpace
                                                      : kOther;
        if (kind != run) {
          if (run != kSpace && start > run_start) pieces.push_back({run_start, start, false});
          run = kind;
          run_start = start;
        }
      }
      if (run != kSpace && text.size() > run_start)
        pieces.push_back({run_start, text.size(), false});
    });
  }
};

template <bool (*Pred)(char32_t)>
class CharClassPreTokenizer final : public PreTokenizer {
 public:
  explicit CharClassPreTokenizer(Behavior behavior) : behavior_(behavior) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    split_each(splits, [&](const std::string& text, std::vector<Piece>& pieces) {
      pieces_from_chars(text, Pred, pieces);
      apply_behavior(pieces, behavior_);
    });
  }

 private:
  Behavior behavior_;
};

class CharDelimiterPreTokenizer final : public PreTokenizer {
 public:
  explicit CharDelimiterPreTokenizer(char32_t delimiter) : delimiter_(delimiter) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    split_each(splits, [&](const std::string& text, std::vector<Piece>& pieces) {
      pieces_from_chars(
          text, [&](char32_t c) { return c == delimiter_; }, pieces);
      apply_behavior(pieces, Behavior::Removed);
    });
  }

 private:
  char32_t delimiter_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const Where& where) {
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    const Json& list = require(j, "pretokenizers", where);
    if (!list.is_array()) throw_invalid((where / "pretokenizers").str() + " must be an array");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (std::size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_pre_tokenizer(list[i], (where / "pretokenizers")[i]));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    const Json& pattern = require(j, "pattern", where);
    const Where pw = where / "pattern";
    const Behavior behavior = parse_behavior(j, where, Behavior::Isolated);
    const bool invert = get_bool(j, "invert", false, where);
    if (pattern.is_object() && pattern.contains("String"))
      return std::make_unique<SplitPreTokenizer>(require_string(pattern, "String", pw),
                                                 std::nullopt, behavior, invert);
    if (pattern.is_object() && pattern.contains("Regex"))
      return std::make_unique<SplitPreTokenizer>(
          "", Regex(require_string(pattern, "Regex", pw), pw.str()), behavior, invert);
    throw_invalid(pw.str() + " must be {\"String\": ...} or {\"Regex\": ...}");
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", true, where),
                                                   get_bool(j, "use_regex", true, where));
  }
  if (type == "Metaspace") {
    std::string replacement = j.contains("replacement") ? require_string(j, "replacement", where)
                                                        : std::string("\xE2\x96\x81");
    one_char(replacement, where / "replacement");
    PrependScheme scheme = PrependScheme::Always;
    if (j.contains("prepend_scheme")) {
      const std::string s = require_string(j, "prepend_scheme", where);
      if (s == "always") {
        scheme = PrependScheme::Always;
      } else if (s == "first") {
        scheme = PrependScheme::First;
      } else if (s == "never") {
        scheme = PrependScheme::Never;
      } else {
        throw_invalid((where / "prepend_scheme").str() + ": unknown value '" + s + "'",
                      "use always, first or never");
      }
    } else if (j.contains("add_prefix_space")) {  // files written before prepend_scheme
      scheme = get_bool(j, "add_prefix_space", true, where) ? PrependScheme::Always
                                                            : PrependScheme::Never;
    }
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme,
                                                   get_bool(j, "split", true, where));
  }
  if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  if (type == "Punctuation")
    return std::make_unique<CharClassPreTokenizer<unicode::is_punctuation>>(
        parse_behavior(j, where, Behavior::Isolated));
  if (type == "Digits") {
    if (get_bool(j, "individual_digits", false, where))
      return std::make_unique<CharClassPreTokenizer<unicode::is_numeric>>(Behavior::Isolated);
    return std::make_unique<CharClassPreTokenizer<unicode::is_numeric>>(Behavior::Contiguous);
  }
  if (type == "CharDelimiterSplit")
    return std::make_unique<CharDelimiterPreTokenizer>(
        one_char(require_string(j, "delimiter", where), where / "delimiter"));
  unknown_type(type, where,
               "Sequence, Split, ByteLevel, Metaspace, BertPreTokenizer, Whitespace, "
               "WhitespaceSplit, Punctuation, Digits, CharDelimiterSplit");
}

}  // namespace tessera::hf::tokenizer_detail
