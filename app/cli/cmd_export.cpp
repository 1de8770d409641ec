// tessera-cli export: writes a model folder as a HuggingFace checkpoint (chosen dtype and
// sharding) that transformers loads, after checking the written folder against the model; or,
// with --format gguf, as one GGUF file for llama.cpp, Ollama and LM Studio.
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "export/export.h"
#include "export/gguf.h"
#include "model/model.h"
#include "model/quantized_linear.h"
#include "plan/model_size.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

// The stored dtype of a model folder (float32 when config.json names none we load).
std::string stored_dtype(const fs::path& model_dir) {
  const hf::ModelConfig config = hf::load_model_config(model_dir / "config.json");
  return config.torch_dtype == "bfloat16" || config.torch_dtype == "float16" ? config.torch_dtype
                                                                             : "float32";
}

int run_gguf_export(const Args& args, const fs::path& model_dir, const fs::path& out) {
  for (const char* hf_only : {"--dtype", "--max-shard-size"})
    if (args.option(hf_only))
      throw UsageError{std::string(hf_only) + " applies to --format hf; GGUF takes --gguf-type"};
  exporter::GgufOptions options;
  if (const std::string* type = args.option("--gguf-type")) {
    try {
      options.type = exporter::parse_gguf_file_type(*type);
    } catch (const Error& e) {
      throw UsageError{std::string("--gguf-type: ") + e.what() + " (f32, f16, bf16 or q8_0)"};
    }
  }
  options.force = args.flag("--force");
  options.tokenizer_dir = model_dir;
  options.progress = [](const std::string& step) { std::cerr << "export: " << step << "\n"; };
  // Refused before loading anything (export_gguf checks again before writing).
  std::error_code ec;
  if (fs::is_directory(out, ec))
    throw_invalid(out.string() + " is a folder; a GGUF export is one file",
                  "give --out a file name such as " + (out / "model.gguf").string());
  if (!options.force && fs::exists(out, ec))
    throw_invalid(out.string() + ": the file exists",
                  "choose another --out, or pass --force to replace it (the new file is written "
                  "and checked first, then renamed over it)");

  // The family, head, activation and tokenizer are checked before the weights are loaded.
  exporter::check_gguf_exportable(hf::load_model_config(model_dir / "config.json"), model_dir);

  // Loaded in its stored dtype: each tensor is converted once, to float32, on its way out.
  const std::string dtype = stored_dtype(model_dir);
  const torch::Dtype load_dtype = model::dtype_from_string(dtype);
  plan::check_model_folder_fits(model_dir, static_cast<double>(c10::elementSize(load_dtype)),
                                dtype);
  std::cerr << "export: loading " << model_dir.string() << " as " << dtype << "\n";
  std::shared_ptr<model::PretrainedModel> model = model::load_pretrained(model_dir, load_dtype);
  model::dequantize_linears(*model);  // a base stored quantized (bitsandbytes) exports dense
  const exporter::GgufReport report = exporter::export_gguf(*model, out, options);
  for (const std::string& note : report.notes) std::cerr << "export: note: " << note << "\n";
  if (args.flag("--json")) {
    nlohmann::json doc;
    doc["file"] = report.file.string();
    doc["format"] = "gguf";
    doc["architecture"] = report.architecture;
    doc["gguf_type"] = report.file_type;
    doc["file_bytes"] = report.file_bytes;
    doc["parameters"] = report.parameters;
    doc["metadata_keys"] = report.metadata_keys;
    doc["tensors_by_type"] = report.tensors_by_type;
    doc["tokenizer"] = {{"model", report.tokenizer_model},
                        {"pre", report.tokenizer_pre},
                        {"tokens", report.tokens},
                        {"merges", report.merges}};
    doc["notes"] = report.notes;
    std::cout << doc.dump() << "\n";
  } else {
    std::cout << "exported " << report.parameters << " parameters ("
              << core::human_bytes(report.file_bytes) << ", " << report.architecture << ", "
              << report.file_type << ") to " << report.file.string() << "\n";
    std::cout << "  tensors:";
    for (const auto& [type, count] : report.tensors_by_type)
      std::cout << " " << count << " " << type;
    std::cout << "\n  tokenizer: " << report.tokenizer_model
              << (report.tokenizer_pre.empty() ? "" : " (pre " + report.tokenizer_pre + ")") << ", "
              << report.tokens << " tokens, " << report.merges << " merges\n";
    std::cout << "verified: the file read back has the metadata, tensor table and tensor bytes "
                 "that were written\n";
  }
  std::cout.flush();
  if (!std::cout) throw_io("cannot write to standard output");
  return 0;
}

int run_export(const std::vector<std::string>& raw) {
  Args args(raw, {"--force", "--json"},
            {"--model", "--out", "--dtype", "--max-shard-size", "--format", "--gguf-type"});
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
  const std::string format = args.option("--format") ? *args.option("--format") : "hf";
  if (format == "gguf") return run_gguf_export(args, model_dir, out_arg);
  if (format != "hf") throw UsageError{"--format " + format + ": choose hf or gguf"};
  if (args.option("--gguf-type")) throw UsageError{"--gguf-type needs --format gguf"};

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
  const std::string dtype_name =
      args.option("--dtype") ? *args.option("--dtype") : stored_dtype(model_dir);
  options.dtype = model::dtype_from_string(dtype_name);
  // A config.json asking for more than this machine has is refused before anything is built.
  plan::check_model_folder_fits(model_dir, static_cast<double>(c10::elementSize(options.dtype)),
                                dtype_name);
  std::cerr << "export: loading " << model_dir.string() << " as "
            << exporter::dtype_name(options.dtype) << "\n";
  std::shared_ptr<model::PretrainedModel> model = model::load_pretrained(model_dir, options.dtype);
  model::dequantize_linears(*model);  // a base stored quantized (bitsandbytes) exports dense

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

const RegisterCommand kExportCommand{{
    "export",
    "export --model PATH --out DIR [--dtype float32|bfloat16|float16] [--max-shard-size 2GB] "
    "[--force] [--json]\n"
    "       tessera-cli export --model PATH --out FILE.gguf --format gguf [--gguf-type "
    "f32|f16|bf16|q8_0] "
    "[--force] [--json]",
    "write a HuggingFace folder (config, safetensors shards, tokenizer, generation config) and "
    "verify it by reloading it and comparing outputs; or, with --format gguf, one GGUF file for "
    "llama.cpp / Ollama / LM Studio (default type f16; llama, mistral, qwen2, gpt2), verified "
    "by reading it back",
    run_export,
}};

}  // namespace
}  // namespace tessera::cli
