// What a plan is made from (plan::load_plan_inputs, plan_inputs): the job spec, the model's
// config, the hardware profile, the measured step times and the sampled sequence lengths.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "core/error.h"
#include "data/dataset.h"
#include "data/format.h"
#include "hf/families.h"
#include "hf/model_folder.h"
#include "hf/tokenizer/tokenizer.h"
#include "job/strategies.h"
#include "plan/cost_terms.h"
#include "plan/model_size.h"
#include "plan/planner.h"

namespace tessera::plan {

namespace fs = std::filesystem;
using cost::d;

namespace {

// Tokenizes the first rows of the training data as the run will (its format and tokenizer) and
// sets the tokens per sequence a step sees: the mean of the longest example in each group of
// batch_size consecutive rows (batches are padded to their longest), or for packed text the
// blocks' max_length and how many rows a block holds. Leaves them unset when the data or the
// tokenizer cannot be read here: the run reports that itself.
// Returns whether the data is packed text (false where its format could not be read).
bool sample_sequence_lengths(const job::JobSpec& spec, const fs::path& model_dir, PlanInputs& in) {
  constexpr std::size_t kSampleRows = 512;
  const auto& ds = spec.dataset;
  bool packs = false;  // known once the format is
  if (ds.train_files.empty() || ds.max_length <= 0) return packs;
  try {
    data::ReadOptions read_options;
    read_options.skip_bad_rows = true;
    auto reader = data::open_datasets({ds.train_files.begin(), ds.train_files.end()}, read_options);
    std::optional<data::FormatKind> kind;
    if (ds.format != "auto") kind = data::parse_format_kind(ds.format);
    const data::DatasetFormat format =
        data::resolve_format(reader->columns(), reader->path().string(), kind, ds.columns);
    packs = ds.packing && format.kind == data::FormatKind::Text;
    if (format.kind == data::FormatKind::Classification) return packs;  // labels: the run's
    const hf::Tokenizer tokenizer = hf::Tokenizer::from_folder(model_dir);
    data::TokenizeOptions options;
    // One row, one example: its length before packing. Packed rows are counted whole (packing
    // splits them over blocks, it does not cut them); others as the run cuts them.
    options.max_length = packs ? 0 : static_cast<std::size_t>(ds.max_length);  // 0: uncut
    options.pack = false;
    const data::ExampleBuilder builder(format, tokenizer,
                                       hf::load_tokenizer_config_from_folder(model_dir), options);
    std::vector<std::size_t> rows;
    for (std::size_t i = 0; i < std::min(kSampleRows, reader->num_rows()); ++i) rows.push_back(i);
    const auto sample = data::tokenize_rows(*reader, rows, builder, /*skip_bad_rows=*/true);
    if (sample.examples.empty()) return packs;
    const double max_length = d(ds.max_length);
    const std::string sampled = "measured by tokenizing the first " +
                                std::to_string(sample.examples.size()) + " training rows";
    if (ds.packing && format.kind == data::FormatKind::Text) {
      double tokens = 0;
      for (const auto& e : sample.examples)
        tokens += d(static_cast<std::int64_t>(e.input_ids.size()));
      const double per_row = tokens / d(static_cast<std::int64_t>(sample.examples.size()));
      // Below 1 where a row is longer than a block: it fills several.
      in.packed_rows_per_block = max_length / std::max(1.0, per_row);
      in.tokens_per_sequence = max_length;
      in.tokens_per_sequence_source = sampled + " (packed into full blocks)";
      return packs;
    }
    const std::size_t group =
        static_cast<std::size_t>(std::max<std::int64_t>(1, spec.training.batch_size));
    double longest_sum = 0;
    std::int64_t groups = 0;
    for (std::size_t g = 0; g < sample.examples.size(); g += group, ++groups) {
      std::size_t longest = 0;
      for (std::size_t i = g; i < std::min(g + group, sample.examples.size()); ++i)
        longest = std::max({longest, sample.examples[i].input_ids.size(),
                            sample.examples[i].rejected_input_ids.size()});
      longest_sum += d(static_cast<std::int64_t>(longest));
    }
    in.tokens_per_sequence = std::min(max_length, longest_sum / d(groups));
    if (reader->num_rows() <= kSampleRows) {
      std::size_t longest = 0;
      for (const auto& e : sample.examples)
        longest = std::max({longest, e.input_ids.size(), e.rejected_input_ids.size()});
      in.longest_sequence = std::min(ds.max_length, static_cast<std::int64_t>(longest));
    }
    in.tokens_per_sequence_source =
        sampled + ", the longest of each batch (sequences are padded to it, not to max_length)";
  } catch (const std::exception&) {
    // Unreadable data or tokenizer: the time assumes max_length; the run names the problem.
  }
  return packs;
}

}  // namespace

void check_quantizable(const job::JobSpec& spec, const hf::ModelConfig& model) {
  if (spec.method.quantize == "none" || !hf::family_of(model).conv1d_weights) return;
  throw_unsupported("method.quantize \"" + spec.method.quantize + "\": " + model.model_type +
                        " stores its linear weights [in, out] (GPT-2's Conv1D), and quantizing "
                        "those is not supported yet",
                    "quantize a llama, mistral or qwen2 model, or train LoRA on this one without "
                    "method.quantize");
}

void check_packed_blocks_fit(const job::JobSpec& spec, const hf::ModelConfig& model, bool packs) {
  const std::int64_t positions = model.max_position_embeddings;
  if (!packs || positions <= 0 || spec.dataset.max_length <= positions ||
      !hf::family_of(model).learned_positions)
    return;
  // The field as the model's config.json names it (GPT-2's n_positions).
  const std::string field = model.raw.is_object() && model.raw.contains("n_positions")
                                ? "n_positions"
                                : "max_position_embeddings";
  throw_invalid("dataset.max_length " + std::to_string(spec.dataset.max_length) +
                    ": packed text makes every block this long, and the model's learned position "
                    "embeddings end at " +
                    std::to_string(positions) + " (" + field +
                    " in its config.json): the first step would stop",
                "set dataset.max_length to " + std::to_string(positions) + " at most");
}

PlanInputs load_plan_inputs(const job::JobSpec& spec, const std::string& spec_source,
                            HardwareProfile profile) {
  if (spec.model.path.empty())
    throw_invalid(spec_source + ": model.path is empty; the planner reads a local model folder",
                  "download the model first (tessera-cli hub) and set model.path");
  const fs::path dir = spec.model.path;
  if (!fs::exists(dir / "config.json"))
    throw_invalid(spec_source + ": model.path " + dir.string() + " has no config.json",
                  "point model.path at a HuggingFace model folder");
  return plan_inputs(spec, hf::ModelFolder::open(dir), std::move(profile));
}

PlanInputs plan_inputs(const job::JobSpec& spec, const hf::ModelFolder& model,
                       HardwareProfile profile, bool count_rows) {
  PlanInputs in;
  in.spec = spec;
  in.profile = std::move(profile);
  in.model = model.config();
  // Without weights (a config-only folder) the formula alone is used.
  in.checkpoint_bytes = model.checkpoint_bytes();
  in.checkpoint_parameters = model.checkpoint_parameters();
  // Rows as non-blank lines of the files (JSON Lines and text; nothing for files it cannot open).
  auto lines_of = [count_rows](const std::vector<std::string>& files) {
    std::optional<std::int64_t> rows;
    if (!count_rows) return rows;
    for (const auto& f : files) {
      std::ifstream file(f);
      if (!file) continue;
      rows = rows.value_or(0);
      for (std::string line; std::getline(file, line);)
        if (line.find_first_not_of(" \t\r") != std::string::npos) ++*rows;
    }
    return rows;
  };
  in.dataset_rows = lines_of(spec.dataset.train_files);
  in.validation_rows = lines_of(spec.dataset.validation_files);
  in.step_times = StepTimeStore(StepTimeStore::default_path()).load(&in.step_time_warnings);
  check_packed_blocks_fit(spec, in.model, sample_sequence_lengths(spec, model.dir(), in));
  return in;
}

}  // namespace tessera::plan
