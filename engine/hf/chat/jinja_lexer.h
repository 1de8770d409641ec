#pragma once
// Tokens of a Jinja template, lexed with transformers' settings (trim_blocks,
// lstrip_blocks, trailing newline dropped). Internal to engine/hf/chat.
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::hf::jinja {

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string value;  // Data text, name, decoded string, operator
  int line = 0;
  int col = 0;
  std::int64_t int_value = 0;
  double float_value = 0.0;
};

// Throws tessera::Error naming `source_name`, line and column on a lexical error.
std::vector<Token> lex(const std::string& source, const std::string& source_name);

[[noreturn]] void syntax_error(const std::string& source_name, int line, int col,
                               const std::string& message);

}  // namespace tessera::hf::jinja
