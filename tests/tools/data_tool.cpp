// Test helper for tests/parity/test_data.py: prints what engine/data reads and builds.
//   tessera-data-tool rows FILE [--skip-bad-rows] [--text-split line|paragraph|document]
//       {"columns": [...], "num_rows": N, "skipped": K, "file_type": T}, then one row per line
//   tessera-data-tool tokenize FILE MODEL_DIR [--format F] [--max-length N] [--no-pack]
//       {"format": "...", "skipped": K}, then {"input_ids", "labels", "label"} per line
//   tessera-data-tool shuffle N SEED      the shuffled order as a JSON array
// Errors: the message on stderr, exit 2.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/split.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/tokenizer/tokenizer.h"

using namespace tessera::data;

namespace {

int run(const std::vector<std::string>& args) {
  if (args.empty())
    throw tessera::Error(tessera::ErrorKind::Usage, "usage: rows|tokenize|shuffle ...");
  auto flag = [&](const std::string& name) {
    for (std::size_t i = 0; i < args.size(); ++i)
      if (args[i] == name) return i + 1 < args.size() ? args[i + 1] : std::string("1");
    return std::string();
  };
  auto has = [&](const std::string& name) {
    return std::find(args.begin(), args.end(), name) != args.end();
  };
  if (args[0] == "shuffle" && args.size() >= 3) {
    const auto order = shuffled_indices(std::stoull(args[1]), std::stoull(args[2]));
    std::cout << nlohmann::json(order).dump() << "\n";
    return 0;
  }
  if (args.size() < 2) throw tessera::Error(tessera::ErrorKind::Usage, "missing FILE");
  ReadOptions options;
  options.skip_bad_rows = has("--skip-bad-rows");
  const std::string split = flag("--text-split");
  if (split == "paragraph") options.text_split = TextSplit::Paragraph;
  if (split == "document") options.text_split = TextSplit::Document;
  auto reader = open_dataset(args[1], options);
  if (args[0] == "rows") {
    std::cout << nlohmann::json{{"columns", reader->columns()},
                                {"num_rows", reader->num_rows()},
                                {"skipped", reader->skipped().count},
                                {"file_type", reader->file_type()}}
                     .dump()
              << "\n";
    for (std::size_t i = 0; i < reader->num_rows(); ++i) std::cout << reader->row(i).dump() << "\n";
    return 0;
  }
  if (args[0] == "tokenize" && args.size() >= 3) {
    const auto tokenizer = tessera::hf::Tokenizer::from_folder(args[2]);
    const auto config = tessera::hf::load_tokenizer_config_from_folder(args[2]);
    const std::string kind = flag("--format");
    const auto format =
        resolve_format(reader->columns(), reader->path().string(),
                       kind.empty() ? std::nullopt : std::optional(parse_format_kind(kind)), {});
    TokenizeOptions tok;
    if (!flag("--max-length").empty()) tok.max_length = std::stoull(flag("--max-length"));
    tok.pack = !has("--no-pack");
    LabelSet labels;
    if (format.kind == FormatKind::Classification)
      labels = derive_labels(*reader, format.columns.at("label"));
    ExampleBuilder builder(format, tokenizer, config, tok, labels);
    std::vector<std::size_t> all(reader->num_rows());
    std::iota(all.begin(), all.end(), std::size_t{0});
    const auto ds = tokenize_rows(*reader, all, builder, options.skip_bad_rows);
    std::cout << nlohmann::json{{"format", format.describe()}, {"skipped", ds.skipped.count}}.dump()
              << "\n";
    for (const auto& ex : ds.examples) {
      nlohmann::json j = {{"input_ids", ex.input_ids}, {"labels", ex.labels}};
      j["label"] = ex.label ? nlohmann::json(*ex.label) : nlohmann::json();
      if (ex.is_pair()) {
        j["rejected_input_ids"] = ex.rejected_input_ids;
        j["rejected_labels"] = ex.rejected_labels;
      }
      if (ex.desirable) {
        j["desirable"] = *ex.desirable;
        j["prompt_length"] = ex.prompt_length;
      }
      std::cout << j.dump() << "\n";
    }
    return 0;
  }
  throw tessera::Error(tessera::ErrorKind::Usage, "unknown command " + args[0]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const tessera::Error& e) {
    std::cerr << e.what() << (e.hint().empty() ? "" : "\nhint: " + e.hint()) << "\n";
    return 2;
  }
}
