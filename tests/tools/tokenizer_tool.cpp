// Test-only front end to hf::Tokenizer, driven by parity/test_tokenizer.py and
// bench/bench_tokenizer.py.
//   tessera-tok-tool encode TOKENIZER IN.json OUT.json   IN: JSON list of texts
//   tessera-tok-tool bench TOKENIZER TEXT_FILE [REPEATS]  one text per line, one thread
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "hf/tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
using tessera::hf::Tokenizer;

int encode(const Tokenizer& tok, const std::string& in_path, const std::string& out_path) {
  const json texts = json::parse(tessera::core::read_text_file(in_path));
  json out = json::object();
  out["vocab_size"] = tok.vocab_size();
  out["model_kind"] = tok.model_kind();
  out["special_tokens"] = tok.special_tokens();
  json results = json::array();
  for (const auto& t : texts) {
    const std::string text = t.get<std::string>();
    const auto ids = tok.encode(text);
    json r;
    r["ids"] = ids;
    r["ids_plain"] = tok.encode(text, false);
    r["decoded"] = tok.decode(ids);
    r["decoded_skip"] = tok.decode(ids, true);
    results.push_back(std::move(r));
  }
  out["results"] = std::move(results);
  tessera::core::write_file_atomic(out_path,
                                   out.dump(-1, ' ', false, json::error_handler_t::replace));
  return 0;
}

int bench(const Tokenizer& tok, const std::string& path, int repeats) {
  const std::string contents = tessera::core::read_text_file(path);
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start < contents.size()) {
    std::size_t end = contents.find('\n', start);
    if (end == std::string::npos) end = contents.size();
    lines.push_back(std::string_view(contents).substr(start, end - start));
    start = end + 1;
  }
  double best = 1e300;
  std::size_t tokens = 0;
  for (int r = 0; r < repeats; ++r) {
    tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::string_view line : lines) tokens += tok.encode(line, false).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  std::cout << json{{"tokens", tokens}, {"seconds", best}, {"lines", lines.size()}}.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() == 4 && args[0] == "encode")
      return encode(Tokenizer::from_folder(args[1]), args[2], args[3]);
    if ((args.size() == 3 || args.size() == 4) && args[0] == "bench")
      return bench(Tokenizer::from_folder(args[1]), args[2],
                   args.size() == 4 ? std::stoi(args[3]) : 1);
    std::cerr << "usage: tessera-tok-tool encode TOKENIZER IN.json OUT.json | bench TOKENIZER FILE "
                 "[REPEATS]\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
