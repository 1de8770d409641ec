// tessera-cli eval: mean token cross-entropy and perplexity of a causal LM on a dataset, equal
// to transformers' shifted-label loss summed over the whole dataset (see model/evaluate.h).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "command.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/format.h"
#include "device_option.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/families.h"
#include "hf/tokenizer/tokenizer.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "plan/model_size.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

int run_eval(const std::vector<std::string>& raw) {
  Args args(
      raw, {"--json"},
      {"--model", "--data", "--format", "--max-length", "--batch-tokens", "--dtype", "--device"});
  const std::string& model_arg = args.required("--model", "PATH");
  const std::string& data_arg = args.required("--data", "FILE");
  args.expect_no_positionals();
  const std::string format_name = args.option("--format") ? *args.option("--format") : "text";
  if (format_name != "text")
    throw_unsupported("eval: format \"" + format_name + "\" is not supported yet",
                      "use --format text (one record per sequence)");
  const fs::path model_dir = model_arg;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    throw_invalid(model_dir.string() + ": no such model folder",
                  "--model takes a folder with config.json, *.safetensors and tokenizer.json");

  const std::string dtype_name = args.option("--dtype") ? *args.option("--dtype") : "float32";
  const torch::Dtype dtype = model::dtype_from_string(dtype_name);
  // A config.json asking for more than this machine has is refused before anything is built.
  plan::check_model_folder_fits(model_dir, static_cast<double>(c10::elementSize(dtype)),
                                dtype_name);
  const c10::Device device = device_option(args);
  std::shared_ptr<model::PretrainedModel> model = model::load_pretrained(model_dir, dtype, device);
  const std::int64_t positions = model->config().max_position_embeddings;
  const std::int64_t max_length = args.integer(
      "--max-length", positions > 0 ? std::min<std::int64_t>(positions, 1024) : 1024, 1);
  if (positions > 0 && max_length > positions && hf::family_of(model->config()).learned_positions)
    throw UsageError{"--max-length " + std::to_string(max_length) + " exceeds the model's " +
                     std::to_string(positions) + " positions"};

  const hf::Tokenizer tokenizer = hf::Tokenizer::from_folder(model_dir);
  hf::TokenizerConfig tokenizer_config = hf::load_tokenizer_config_from_folder(model_dir);
  std::unique_ptr<data::DatasetReader> reader = data::open_dataset(data_arg);
  // The data layer's hint names --format and --column, which eval does not take.
  const data::DatasetFormat format = [&] {
    try {
      return data::resolve_format(reader->columns(), data_arg, data::FormatKind::Text);
    } catch (const Error& e) {
      throw_invalid(e.what(),
                    "eval scores the records of a 'text' column only: give a file with one "
                    "(instruction, chat and preference data are evaluated by a training run's "
                    "eval_every)");
    }
  }();
  data::TokenizeOptions tokenize;
  tokenize.max_length = static_cast<std::size_t>(max_length);
  tokenize.pack = false;  // one record per sequence
  const data::ExampleBuilder builder(format, tokenizer, tokenizer_config, tokenize);
  std::vector<std::size_t> indices(reader->num_rows());
  std::iota(indices.begin(), indices.end(), std::size_t{0});
  data::TokenizedDataset tokenized = data::tokenize_rows(*reader, indices, builder, false);
  std::vector<std::vector<std::int32_t>> sequences;
  sequences.reserve(tokenized.examples.size());
  for (auto& ex : tokenized.examples) sequences.push_back(std::move(ex.input_ids));

  model::EvalOptions options;
  options.batch_tokens = args.integer("--batch-tokens", 8192, 1);
  options.device = device;
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  options.progress = [&](std::size_t done, std::size_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::seconds(2) && done < total) return;
    if (now - start < std::chrono::seconds(2)) return;  // short evals stay quiet
    last = now;
    std::cerr << "eval: " << done << "/" << total << " sequences\n";
  };
  const model::EvalResult result = model::evaluate_causal_lm(*model, sequences, options);

  if (args.flag("--json")) {
    nlohmann::json out;
    out["mean_loss"] = result.mean_loss();
    out["perplexity"] = result.perplexity();
    out["total_loss"] = result.total_loss;
    out["predicted_tokens"] = result.predicted_tokens;
    out["sequences"] = result.sequences;
    out["max_length"] = max_length;
    out["format"] = format.describe();
    out["device"] = device.str();
    std::cout << out.dump() << "\n";
  } else {
    std::cout << "data: " << data_arg << " (" << format.describe() << ", " << result.sequences
              << " sequences of at most " << max_length << " tokens)\n"
              << "mean loss: " << result.mean_loss() << " nats/token over "
              << result.predicted_tokens << " predicted tokens\n"
              << "perplexity: " << result.perplexity() << "\n";
  }
  std::cout.flush();
  if (!std::cout) throw_io("cannot write to standard output");
  return 0;
}

const RegisterCommand kEvalCommand{{
    "eval",
    "eval --model PATH --data FILE [--format text] [--max-length N] [--batch-tokens N] "
    "[--dtype float32|bfloat16] [--device auto|cpu|cuda|cuda:N] [--json]",
    "mean token cross-entropy and perplexity of a causal LM: each record is one sequence (BOS + "
    "text + EOS, first N tokens); loss = sum of -log p(token | prefix) over every predicted "
    "token of the dataset / their number; perplexity = exp(loss); --device: where it computes "
    "(auto: CUDA device 0 when present, else the CPU)",
    run_eval,
}};

}  // namespace
}  // namespace tessera::cli
