// tessera-cli tokenize: the token ids that transformers' tokenizer(text)["input_ids"] gives.
#include <climits>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "hf/tokenizer/text_streamer.h"
#include "hf/tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

// Tokens shown to a person: byte-level symbols stay as they are in the vocabulary, since that
// is what a user will search for in tokenizer.json.
void print_readable(const hf::Tokenizer& tok, std::size_t index,
                    const std::vector<std::int32_t>& ids) {
  std::cout << "text " << index + 1 << ": " << ids.size() << " tokens\n  ids:    [";
  for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? ", " : "") << ids[i];
  std::cout << "]\n  tokens: [";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto token = tok.id_to_token(ids[i]);
    std::cout << (i ? ", " : "")
              << nlohmann::json(token.value_or("?"))
                     .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::cout << "]\n";
}

// --decode: the text of token ids as tokenizer.decode(ids, skip_special_tokens=True) gives it,
// and (--json) the pieces `generate` would print while the ids arrive one at a time.
int run_decode(const std::string& model, const std::vector<std::string>& words, bool json) {
  std::vector<std::int32_t> ids;
  for (const std::string& word : words) {
    std::size_t start = 0;
    while (start <= word.size()) {
      std::size_t end = word.find(',', start);
      if (end == std::string::npos) end = word.size();
      const std::string item = word.substr(start, end - start);
      if (!item.empty()) {
        std::size_t used = 0;
        long long id = -1;
        try {
          id = std::stoll(item, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != item.size() || id < 0 || id > INT32_MAX)
          throw UsageError{"--decode takes token ids (0 or more, spaces or commas), got \"" + item +
                           "\""};
        ids.push_back(static_cast<std::int32_t>(id));
      }
      start = end + 1;
    }
  }
  const hf::Tokenizer tok = hf::Tokenizer::from_folder(model);
  hf::TextStreamer streamer(tok);
  nlohmann::json pieces = nlohmann::json::array();
  for (std::int32_t id : ids)
    if (std::string piece = streamer.add(id); !piece.empty()) pieces.push_back(std::move(piece));
  if (std::string piece = streamer.finish(); !piece.empty()) pieces.push_back(std::move(piece));
  if (json) {
    std::cout << nlohmann::json{{"ids", ids}, {"text", streamer.text()}, {"pieces", pieces}}.dump(
                     -1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    std::cout << streamer.text() << "\n";
  }
  std::cout.flush();
  if (!std::cout) throw_io("cannot write to standard output");
  return 0;
}

int run_tokenize(const std::vector<std::string>& raw) {
  Args args(raw, {"--json", "--no-special", "--decode"}, {"--model", "--file"});
  const std::string& model = args.required("--model", "PATH");
  if (args.flag("--decode")) {
    if (args.option("--file") != nullptr || args.flag("--no-special"))
      throw UsageError{"--decode takes token ids as arguments (no --file, no --no-special)"};
    if (args.positionals().empty()) throw UsageError{"--decode needs token ids"};
    return run_decode(model, args.positionals(), args.flag("--json"));
  }
  const std::string* file = args.option("--file");
  if (file != nullptr && !args.positionals().empty())
    throw UsageError{"give either TEXT arguments or --file, not both"};
  if (file == nullptr && args.positionals().empty())
    throw UsageError{"nothing to tokenize: give TEXT arguments or --file F"};

  std::vector<std::string> texts;
  if (file != nullptr) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*file, ec))
      throw_invalid(*file + ": no such file", "--file takes a text file, one input per line");
    const std::string contents = core::read_text_file(*file);
    std::size_t start = 0;
    while (start < contents.size()) {
      std::size_t end = contents.find('\n', start);
      if (end == std::string::npos) end = contents.size();
      std::string line = contents.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
      texts.push_back(std::move(line));
      start = end + 1;
    }
  } else {
    texts = args.positionals();
  }

  const hf::Tokenizer tok = hf::Tokenizer::from_folder(model);
  const bool add_special = !args.flag("--no-special");
  const bool json = args.flag("--json");
  if (!json)
    std::cout << "tokenizer: " << tok.model_kind() << ", " << tok.vocab_size() << " tokens\n";
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto ids = tok.encode(texts[i], add_special);
    if (json) {
      std::cout << nlohmann::json(ids).dump() << "\n";
    } else {
      print_readable(tok, i, ids);
    }
  }
  std::cout.flush();
  if (!std::cout) throw_io("cannot write to standard output");
  return 0;
}

const RegisterCommand kTokenizeCommand{{
    "tokenize",
    "tokenize --model PATH [--json] [--no-special] (TEXT... | --file F)\n"
    "       tessera-cli tokenize --model PATH --decode [--json] ID...",
    "print the token ids of texts (model folder or tokenizer.json), as transformers gives them; "
    "--decode: the text of ids as tokenizer.decode(ids, skip_special_tokens=True), with --json "
    "also the pieces generate streams",
    run_tokenize,
}};

}  // namespace
}  // namespace tessera::cli
