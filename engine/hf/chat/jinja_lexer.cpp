#include "hf/chat/jinja_lexer.h"

#include <cstring>

#include "core/error.h"

namespace tessera::hf::jinja {

void syntax_error(const std::string& source_name, int line, int col, const std::string& message) {
  throw_invalid(source_name + ":" + std::to_string(line) + ":" + std::to_string(col) +
                    ": template syntax error: " + message,
                "fix the chat template at that position (Jinja syntax as used by transformers)");
}

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name) : src_(source), name_(name) {}

  std::vector<Token> run() {
    bool line_starting = true;
    const std::size_t n = src_.size();
    while (pos_ < n) {
      std::size_t idx = find_tag_start(pos_);
      if (idx == std::string::npos) {
        emit_data(src_.substr(pos_), line_, col());
        advance_to(n);
        break;
      }
      std::string text = src_.substr(pos_, idx - pos_);
      int text_line = line_, text_col = col();
      char kind = src_[idx + 1];
      std::size_t after = idx + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::size_t raw_body = std::string::npos;
      if (kind == '%') raw_body = match_raw_begin(after);
      apply_left_strip(text, sign, kind != '{', line_starting);
      emit_data(std::move(text), text_line, text_col);
      advance_to(idx);
      if (kind == '#') {
        line_starting = lex_comment(after);
      } else if (raw_body != std::string::npos) {
        advance_to(raw_body);
        line_starting = lex_raw(raw_body);
      } else {
        line_starting = lex_tag(kind, after);
      }
    }
    Token eof;
    eof.type = Tok::Eof;
    eof.line = line_;
    eof.col = col();
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  int col() const { return static_cast<int>(pos_ - line_start_) + 1; }

  void advance_to(std::size_t p) {
    for (; pos_ < p; ++pos_)
      if (src_[pos_] == '\n') {
        ++line_;
        line_start_ = pos_ + 1;
      }
  }

  [[noreturn]] void fail(const std::string& message) { syntax_error(name_, line_, col(), message); }

  std::size_t find_tag_start(std::size_t from) const {
    for (std::size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    return std::string::npos;
  }

  // `{%[-+]? raw [-]?%}`: returns where the raw body starts, or npos.
  std::size_t match_raw_begin(std::size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return std::string::npos;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && is_space(src_[p])) ++p;
      return p;
    }
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  // Whitespace control before a tag: `-` strips all whitespace; lstrip_blocks strips the
  // spaces and tabs that begin the tag's line (block and comment tags only).
  static void apply_left_strip(std::string& text, char sign, bool is_block_or_comment,
                               bool line_starting) {
    if (sign == '-') {
      std::size_t end = text.size();
      while (end > 0 && is_space(text[end - 1])) --end;
      text.resize(end);
      return;
    }
    if (sign == '+' || !is_block_or_comment) return;
    std::size_t nl = text.rfind('\n');
    std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return;
    if (l_pos >= text.size()) return;
    for (std::size_t i = l_pos; i < text.size(); ++i)
      if (!is_space(text[i])) return;
    text.resize(l_pos);
  }

  void emit_data(std::string text, int line, int column) {
    if (text.empty()) return;
    Token t;
    t.type = Tok::Data;
    t.value = std::move(text);
    t.line = line;
    t.col = column;
    tokens_.push_back(std::move(t));
  }

  // Skips the end of a block or comment tag at `p` (pointing at '-', '+' or the end
  // marker) with trim_blocks; returns the position after it.
  std::size_t skip_block_end(std::size_t p, std::size_t marker_len) {
    if (src_[p] == '-') {
      p += 1 + marker_len;
      while (p < src_.size() && is_space(src_[p])) ++p;
      return p;
    }
    if (src_[p] == '+') return p + 1 + marker_len;
    p += marker_len;
    if (p < src_.size() && src_[p] == '\n') ++p;  // trim_blocks
    return p;
  }

  bool lex_comment(std::size_t body) {
    std::size_t end = src_.find("#}", body);
    if (end == std::string::npos) fail("missing end of comment tag '#}'");
    std::size_t marker = end;
    if (end > body && (src_[end - 1] == '-' || src_[end - 1] == '+')) marker = end - 1;
    std::size_t after = skip_block_end(marker, 2);
    advance_to(after);
    return after > 0 && src_[after - 1] == '\n';
  }

  bool lex_raw(std::size_t body) {
    bool line_starting = body > 0 && src_[body - 1] == '\n';
    std::size_t scan = body;
    while (true) {
      std::size_t idx = src_.find("{%", scan);
      if (idx == std::string::npos) fail("missing end of raw directive '{% endraw %}'");
      std::size_t p = idx + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        scan = idx + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (!(src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 3, "+%}") == 0 ||
            src_.compare(p, 2, "%}") == 0)) {
        scan = idx + 2;
        continue;
      }
      std::string text = src_.substr(body, idx - body);
      apply_left_strip(text, sign, true, line_starting);
      emit_data(std::move(text), line_, col());
      std::size_t after = skip_block_end(p, 2);
      advance_to(after);
      return after > 0 && src_[after - 1] == '\n';
    }
  }

  bool lex_tag(char kind, std::size_t body) {
    Token begin;
    begin.type = kind == '%' ? Tok::BlockBegin : Tok::VarBegin;
    begin.line = line_;
    begin.col = col();
    tokens_.push_back(begin);
    advance_to(body);
    std::vector<char> balance;
    const std::size_t n = src_.size();
    while (true) {
      while (pos_ < n && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= n)
        fail(std::string("unexpected end of template, expected '") + (kind == '%' ? "%}" : "}}") +
             "'");
      if (balance.empty()) {
        std::size_t end = std::string::npos;
        if (kind == '%') {
          if (src_.compare(pos_, 3, "-%}") == 0 || src_.compare(pos_, 3, "+%}") == 0 ||
              src_.compare(pos_, 2, "%}") == 0)
            end = skip_block_end(pos_, 2);
        } else if (src_.compare(pos_, 3, "-}}") == 0) {
          end = pos_ + 3;
          while (end < n && is_space(src_[end])) ++end;
        } else if (src_.compare(pos_, 2, "}}") == 0) {
          end = pos_ + 2;
        }
        if (end != std::string::npos) {
          Token t;
          t.type = kind == '%' ? Tok::BlockEnd : Tok::VarEnd;
          t.line = line_;
          t.col = col();
          tokens_.push_back(t);
          advance_to(end);
          return src_[end - 1] == '\n';
        }
      }
      lex_expression_token(balance);
    }
  }

  void lex_expression_token(std::vector<char>& balance) {
    Token t;
    t.line = line_;
    t.col = col();
    const std::size_t n = src_.size();
    char c = src_[pos_];
    if (is_name_start(c)) {
      std::size_t e = pos_;
      while (e < n && is_name_char(src_[e])) ++e;
      t.type = Tok::Name;
      t.value = src_.substr(pos_, e - pos_);
      advance_to(e);
    } else if (is_digit(c)) {
      lex_number(t);
    } else if (c == '\'' || c == '"') {
      lex_string(t);
    } else {
      static const char* const ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                        "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                        ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
      for (const char* op : ops) {
        std::size_t len = std::strlen(op);
        if (src_.compare(pos_, len, op) == 0) {
          t.type = Tok::Op;
          t.value = op;
          break;
        }
      }
      if (t.type != Tok::Op) fail(std::string("unexpected character '") + c + "'");
      if (t.value == "(" || t.value == "[" || t.value == "{") {
        balance.push_back(t.value == "(" ? ')' : (t.value == "[" ? ']' : '}'));
      } else if (t.value == ")" || t.value == "]" || t.value == "}") {
        if (balance.empty()) fail("unexpected '" + t.value + "'");
        if (balance.back() != t.value[0])
          fail("unexpected '" + t.value + "', expected '" + std::string(1, balance.back()) + "'");
        balance.pop_back();
      }
      advance_to(pos_ + t.value.size());
    }
    tokens_.push_back(std::move(t));
  }

  void lex_number(Token& t) {
    const std::size_t n = src_.size();
    std::size_t e = pos_;
    std::string digits;
    auto take_digits = [&]() {
      while (e < n && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < n && is_digit(src_[e + 1]))))
        if (src_[e++] != '_') digits += src_[e - 1];
    };
    take_digits();
    bool is_float = false;
    if (e + 1 < n && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      digits += '.';
      ++e;
      take_digits();
    }
    if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      std::size_t save = e;
      std::string save_digits = digits;
      digits += 'e';
      ++e;
      if (e < n && (src_[e] == '+' || src_[e] == '-')) digits += src_[e++];
      if (e < n && is_digit(src_[e])) {
        is_float = true;
        take_digits();
      } else {
        e = save;
        digits = save_digits;
      }
    }
    if (is_float) {
      t.type = Tok::Float;
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      t.type = Tok::Int;
      std::int64_t v = 0;
      for (char d : digits) {
        if (v > (INT64_MAX - (d - '0')) / 10) fail("integer literal too large: " + digits);
        v = v * 10 + (d - '0');
      }
      t.int_value = v;
    }
    t.value = digits;
    advance_to(e);
  }

  void lex_string(Token& t) {
    const std::size_t n = src_.size();
    char quote = src_[pos_];
    std::size_t e = pos_ + 1;
    std::string out;
    while (true) {
      if (e >= n) fail("unterminated string literal");
      char c = src_[e];
      if (c == quote) {
        ++e;
        break;
      }
      if (c != '\\') {
        out += c;
        ++e;
        continue;
      }
      if (e + 1 >= n) fail("unterminated string literal");
      char esc = src_[e + 1];
      e += 2;
      switch (esc) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'a':
          out += '\a';
          break;
        case 'x':
        case 'u':
        case 'U': {
          std::size_t count = esc == 'x' ? 2 : (esc == 'u' ? 4 : 8);
          std::uint32_t cp = 0;
          for (std::size_t i = 0; i < count; ++i) {
            int h = e + i < n ? hex_value(src_[e + i]) : -1;
            if (h < 0) fail(std::string("truncated \\") + esc + " escape in string literal");
            cp = cp * 16 + static_cast<std::uint32_t>(h);
          }
          if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            fail("invalid code point in string escape");
          e += count;
          append_utf8(out, cp);
          break;
        }
        default:
          if (esc >= '0' && esc <= '7') {
            std::uint32_t cp = static_cast<std::uint32_t>(esc - '0');
            for (int i = 0; i < 2 && e < n && src_[e] >= '0' && src_[e] <= '7'; ++i)
              cp = cp * 8 + static_cast<std::uint32_t>(src_[e++] - '0');
            append_utf8(out, cp);
          } else {
            out += '\\';  // unknown escapes stay as written, as in Python
            out += esc;
          }
      }
    }
    t.type = Tok::String;
    t.value = std::move(out);
    advance_to(e);
  }

  const std::string& src_;
  const std::string& name_;
  std::size_t pos_ = 0;
  int line_ = 1;
  std::size_t line_start_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& source_name) {
  // Jinja normalizes \r\n and \r to \n and drops one trailing newline
  // (keep_trailing_newline=False).
  std::string normalized;
  normalized.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  Lexer lexer(normalized, source_name);
  return lexer.run();
}

}  // namespace tessera::hf::jinja
