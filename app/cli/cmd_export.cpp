// tessera-cli export: writes a model folder as a HuggingFace checkpoint (chosen dtype and
// sharding) that transformers loads, after checking the written folder against the model.
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "export/export.h"
#include "model/model.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

int run_export(const std::vector<std::string>& raw) {
  Args args(raw, {"--force", "--json"}, {"--model", "--out", "--dtype", "--max-shard-size"});
  const std::string& model_arg = args.required("--model", "PATH");
  const std::string& out_arg = args.required("--out", "DIR");
  args.expect_no_positionals();
  const fs::path model_dir = model_arg;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    throw_invalid(model_dir.string() + ": no such model folder",
                  "--model takes a folder with config.json and *.safetensors");
  if (fs::exists(out_arg, ec) && fs::equivalent(model_dir, out_arg, ec))
    throw UsageError{"--out must differ from --model"};

  // Refused before loading anything (export_pretrained checks again before writing).
  if (!args.flag("--force") && fs::is_directory(out_arg, ec) && !fs::is_empty(out_arg, ec))
    throw_invalid(out_arg + ": the folder exists and is not empty",
                  "choose an empty or new --out, or pass --force to replace it (the new export is "
                  "written and checked first, then swapped in)");

  exporter::ExportOptions options;
  if (const std::string* size = args.option("--max-shard-size")) {
    try {
      options.max_shard_bytes = exporter::parse_size(*size);
    } catch (const Error& e) {
      throw UsageError{std::string("--max-shard-size: ") + e.what()};
    }
  }
  options.force = args.flag("--force");
  options.tokenizer_dir = model_dir;
  options.source_dir = model_dir;
  options.progress = [](const std::string& step) { std::cerr << "export: " << step << "\n"; };

  // Loading straight into the exported dtype converts each tensor once, as export would.
  std::string dtype_name;
  if (const std::string* d = args.option("--dtype")) {
    dtype_name = *d;
  } else {
    const hf::ModelConfig config = hf::load_model_config(model_dir / "config.json");
    dtype_name = config.torch_dtype == "bfloat16" || config.torch_dtype == "float16"
                     ? config.torch_dtype
                     : "float32";
  }
  options.dtype = model::dtype_from_string(dtype_name);
  std::cerr << "export: loading " << model_dir.string() << " as "
            << exporter::dtype_name(options.dtype) << "\n";
  std::shared_ptr<model::PretrainedModel> model = model::load_pretrained(model_dir, options.dtype);

  const exporter::ExportReport report = exporter::export_pretrained(*model, out_arg, options);
  if (args.flag("--json")) {
    nlohmann::json out;
    out["dir"] = report.dir.string();
    out["files"] = report.files;
    out["dtype"] = report.dtype;
    out["parameters"] = report.parameters;
    out["weight_bytes"] = report.weight_bytes;
    out["verify"] = {{"compared", report.verify.compared},
                     {"sequences", report.verify.sequences},
                     {"tokens_per_sequence", report.verify.tokens_per_sequence},
                     {"max_abs_diff", report.verify.max_abs_diff},
                     {"tolerance", report.verify.tolerance},
                     {"passed", report.verify.passed}};
    std::cout << out.dump() << "\n";
  } else {
    std::cout << "exported " << report.parameters << " parameters ("
              << core::human_bytes(report.weight_bytes) << ", " << report.dtype << ") to "
              << report.dir.string() << "\n";
    for (const auto& f : report.files) std::cout << "  " << f << "\n";
    std::cout << "verified: the reloaded export's " << report.verify.compared << " on "
              << report.verify.sequences << " sequences x " << report.verify.tokens_per_sequence
              << " tokens match the model in memory (max abs diff " << report.verify.max_abs_diff
              << " <= " << report.verify.tolerance << ")\n";
  }
  std::cout.flush();
  if (!std::cout) throw_io("cannot write to standard output");
  return 0;
}

const RegisterCommand kRegister{{
    "export",
    "export --model PATH --out DIR [--dtype float32|bfloat16|float16] [--max-shard-size 2GB] "
    "[--force] [--json]",
    "write a HuggingFace folder (config, safetensors shards, tokenizer, generation config) and "
    "verify it by reloading it and comparing outputs",
    run_export,
}};

}  // namespace
}  // namespace tessera::cli
