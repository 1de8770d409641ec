#pragma once
// UTF-8 and Unicode-property helpers for the tokenizer (ICU underneath). Text reaching these
// functions is valid UTF-8 (the tokenizer repairs its input first).
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::hf::unicode {

// Decodes the code point at s[i] and advances i. Assumes valid UTF-8.
inline char32_t next_char(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    char32_t c = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    i += 2;
    return c;
  }
  if (b0 < 0xF0) {
    char32_t c = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
                 (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
    i += 3;
    return c;
  }
  char32_t c = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
               ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) |
               (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  i += 4;
  return c;
}

// Length in bytes of the UTF-8 sequence that starts with lead byte b (valid text).
inline std::size_t char_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

void append_utf8(std::string& out, char32_t c);

// Replaces each maximal invalid subsequence by U+FFFD (Rust's from_utf8_lossy).
std::string to_valid_utf8(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

// Rust char predicates as the `tokenizers` crate uses them.
bool is_whitespace(char32_t c);       // White_Space property (char::is_whitespace)
bool is_alphanumeric(char32_t c);     // char::is_alphanumeric: Alphabetic or Numeric
bool is_regex_word(char32_t c);       // Rust regex \w: Alphabetic | M | Nd | Pc | Join_Control
bool is_numeric(char32_t c);          // Nd | Nl | No
bool is_punctuation(char32_t c);      // ASCII punctuation or Unicode P*
bool is_other(char32_t c);            // Cc | Cf | Co | Cs: unassigned code points are kept
bool is_mark_nonspacing(char32_t c);  // Mn
bool is_combining_mark(char32_t c);   // Mn | Mc | Me

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);
// Per-character full lowercase mapping (no context such as final sigma), as Rust's
// char::to_lowercase applied character by character.
std::string lowercase(std::string_view s);

}  // namespace tessera::hf::unicode
