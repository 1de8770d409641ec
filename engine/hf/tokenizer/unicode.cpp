#include "hf/tokenizer/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <climits>

#include "core/error.h"

namespace tessera::hf::unicode {

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 with `bad` = length of the maximal
// invalid prefix (at least 1), following the Unicode "maximal subpart" rule.
std::size_t valid_sequence_at(std::string_view s, std::size_t i, std::size_t& bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  bad = 1;
  if (b0 < 0x80) return 1;
  std::size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      bad = k;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      bad = k;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  std::size_t i = 0, bad = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    std::size_t n = valid_sequence_at(s, i, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  std::size_t i = 0, bad = 0;
  while (i < s.size()) {
    std::size_t n = valid_sequence_at(s, i, bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool is_alphanumeric(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC) || is_numeric(c);
}

bool is_regex_word(char32_t c) {
  if (c < 0x80) return c == '_' || is_alphanumeric(c);
  const auto gc = U_MASK(u_charType(static_cast<UChar32>(c)));
  return (gc & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC) ||
         u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_JOIN_CONTROL);
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto mask = U_MASK(u_charType(static_cast<UChar32>(c)));
  return (mask & (U_GC_ND_MASK | U_GC_NL_MASK | U_GC_NO_MASK)) != 0;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  return (U_MASK(u_charType(static_cast<UChar32>(c))) & U_GC_P_MASK) != 0;
}

bool is_other(char32_t c) {
  constexpr auto kMask = U_GC_CC_MASK | U_GC_CF_MASK | U_GC_CO_MASK | U_GC_CS_MASK;
  return (U_MASK(u_charType(static_cast<UChar32>(c))) & kMask) != 0;
}

bool is_mark_nonspacing(char32_t c) {
  if (c < 0x80) return false;
  return u_charType(static_cast<UChar32>(c)) == U_NON_SPACING_MARK;
}

bool is_combining_mark(char32_t c) {
  if (c < 0x80) return false;
  return (U_MASK(u_charType(static_cast<UChar32>(c))) & U_GC_M_MASK) != 0;
}

namespace {
bool is_ascii(std::string_view s) {
  for (char ch : s)
    if (static_cast<unsigned char>(ch) >= 0x80) return false;
  return true;
}
}  // namespace

std::string normalize(std::string_view s, NormalForm form) {
  if (is_ascii(s)) return std::string(s);  // ASCII is invariant under every form
  // ICU strings are indexed by int32_t.
  if (s.size() > static_cast<std::size_t>(INT32_MAX / 2))
    throw_invalid(
        "text of " + std::to_string(s.size()) + " bytes is too large to normalize in one piece",
        "split the text into smaller documents");
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::NFC:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::NFD:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::NFKC:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::NFKD:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status) || n == nullptr)
    throw Error(ErrorKind::Internal, "ICU normalizer unavailable");
  icu::UnicodeString in =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<std::int32_t>(s.size())));
  icu::UnicodeString out = n->normalize(in, status);
  if (U_FAILURE(status)) throw Error(ErrorKind::Internal, "ICU normalization failed");
  std::string result;
  out.toUTF8String(result);
  return result;
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++i;
      continue;
    }
    char32_t c = next_char(s, i);
    if (c == 0x130) {  // the one unconditional multi-character lowercase mapping
      out += "i\xCC\x87";
    } else {
      append_utf8(out, static_cast<char32_t>(u_tolower(static_cast<UChar32>(c))));
    }
  }
  return out;
}

}  // namespace tessera::hf::unicode
