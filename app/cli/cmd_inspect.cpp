// tessera-cli inspect PATH [--json]: what a model folder holds, before anything is loaded
// into memory (tensors are only memory-mapped to read their headers).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "hf/chat/chat_template.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/config.h"
#include "hf/families.h"
#include "hf/safetensors.h"
#include "hf/tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json inspect_folder(const fs::path& path) {
  json out;
  fs::path dir = fs::is_directory(path) ? path : path.parent_path();
  out["path"] = fs::absolute(path).string();

  fs::path config_path = dir / "config.json";
  if (fs::is_directory(path) && !fs::exists(config_path))
    throw_invalid(path.string() + ": no config.json in this folder",
                  "point at a HuggingFace model folder (config.json + *.safetensors)");
  if (fs::exists(config_path)) {
    hf::ModelConfig config = hf::load_model_config(config_path);
    out["model_type"] = config.model_type;
    out["architectures"] = config.architectures;
    out["hidden_size"] = config.hidden_size;
    out["num_hidden_layers"] = config.num_hidden_layers;
    out["num_attention_heads"] = config.num_attention_heads;
    out["num_key_value_heads"] = config.num_key_value_heads;
    out["context_length"] = config.max_position_embeddings;
    out["config_vocab_size"] = config.vocab_size;
    out["tie_word_embeddings"] = config.tie_word_embeddings;
    if (config.rope_scaling.rope_type != "default" || hf::family_of(config).rotary) {
      out["rope"] = {{"type", config.rope_scaling.rope_type}, {"theta", config.rope_theta}};
    }
    if (!config.id2label.empty()) {
      json labels = json::object();
      for (const auto& [id, name] : config.id2label) labels[std::to_string(id)] = name;
      out["labels"] = labels;
    }
  }

  auto checkpoint = hf::SafetensorsCheckpoint::open(path);
  out["tensor_bytes"] = checkpoint.total_bytes();
  // Parameters are the floating-point tensors, as transformers' num_parameters() counts;
  // integer tensors in checkpoints are buffers such as BERT's position_ids.
  std::uint64_t parameters = 0;
  std::map<std::string, std::uint64_t> dtype_params;
  for (const auto& name : checkpoint.names()) {
    const auto& info = checkpoint.info(name);
    dtype_params[hf::dtype_name(info.dtype)] += info.numel();
    if (info.dtype == hf::DType::F64 || info.dtype == hf::DType::F32 ||
        info.dtype == hf::DType::F16 || info.dtype == hf::DType::BF16)
      parameters += info.numel();
  }
  out["parameters"] = parameters;
  out["dtypes"] = dtype_params;
  json files = json::array();
  for (const auto& f : checkpoint.files())
    files.push_back({{"file", fs::relative(f->path(), dir).string()},
                     {"bytes", f->file_size()},
                     {"tensors", f->tensors().size()}});
  out["files"] = files;

  if (fs::exists(dir / "tokenizer.json")) {
    auto tokenizer = hf::Tokenizer::from_folder(dir);
    out["tokenizer"] = {{"kind", tokenizer.model_kind()},
                        {"vocab_size", tokenizer.vocab_size()},
                        {"special_tokens", tokenizer.special_tokens()}};
  } else {
    out["tokenizer"] = nullptr;
  }
  if (fs::exists(dir / "tokenizer_config.json") || fs::exists(dir / "chat_template.jinja")) {
    auto tc = hf::load_tokenizer_config_from_folder(dir);
    json special = json::object();
    if (tc.bos_token) special["bos"] = *tc.bos_token;
    if (tc.eos_token) special["eos"] = *tc.eos_token;
    if (tc.unk_token) special["unk"] = *tc.unk_token;
    if (tc.pad_token) special["pad"] = *tc.pad_token;
    out["special_tokens"] = special;
    out["chat_template"] =
        tc.chat_template ? json(hf::chat_template_name(*tc.chat_template)) : json(nullptr);
  } else {
    out["chat_template"] = nullptr;
  }
  return out;
}

std::string human_count(std::uint64_t n) {
  char buf[32];
  if (n >= 1000000000ULL)
    std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(n) / 1e9);
  else if (n >= 1000000ULL)
    std::snprintf(buf, sizeof buf, "%.2fM", static_cast<double>(n) / 1e6);
  else if (n >= 1000ULL)
    std::snprintf(buf, sizeof buf, "%.1fK", static_cast<double>(n) / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
  return buf;
}

// Appends `item` to a separated list. (Written out rather than `a + b` because GCC 12's
// -Wrestrict misfires on `const char* + std::string` temporaries at -O3.)
void append_item(std::string& list, const char* separator, const std::string& item) {
  if (!list.empty()) list.append(separator);
  list.append(item);
}

void print_human(const json& info) {
  auto line = [](const char* key, const std::string& value) {
    std::printf("%-16s %s\n", key, value.c_str());
  };
  line("path", info["path"].get<std::string>());
  if (info.contains("model_type")) {
    std::string arch = info["model_type"].get<std::string>();
    if (!info["architectures"].empty())
      arch += " (" + info["architectures"][0].get<std::string>() + ")";
    line("architecture", arch);
    line("layers", std::to_string(info["num_hidden_layers"].get<std::int64_t>()) + " × hidden " +
                       std::to_string(info["hidden_size"].get<std::int64_t>()) + ", " +
                       std::to_string(info["num_attention_heads"].get<std::int64_t>()) +
                       " heads (" +
                       std::to_string(info["num_key_value_heads"].get<std::int64_t>()) + " kv)");
    line("context length", std::to_string(info["context_length"].get<std::int64_t>()));
    if (info.contains("rope"))
      line("rope", info["rope"]["type"].get<std::string>() + ", theta " +
                       std::to_string(info["rope"]["theta"].get<double>()));
  }
  line("parameters", human_count(info["parameters"].get<std::uint64_t>()) + " (" +
                         std::to_string(info["parameters"].get<std::uint64_t>()) + ")");
  std::string dtypes;
  for (const auto& [name, count] : info["dtypes"].items())
    append_item(dtypes, ", ", name + " " + human_count(count.get<std::uint64_t>()));
  line("dtypes", dtypes);
  for (const auto& f : info["files"])
    line("file", f["file"].get<std::string>() + "  " +
                     core::human_bytes(f["bytes"].get<std::uint64_t>()) + ", " +
                     std::to_string(f["tensors"].get<std::size_t>()) + " tensors");
  if (info["tokenizer"].is_null()) {
    line("tokenizer", "none (no tokenizer.json)");
  } else {
    line("tokenizer", info["tokenizer"]["kind"].get<std::string>() + ", vocabulary " +
                          std::to_string(info["tokenizer"]["vocab_size"].get<std::size_t>()));
    std::string specials;
    for (const auto& s : info["tokenizer"]["special_tokens"])
      append_item(specials, " ", s.get<std::string>());
    line("special tokens", specials.empty() ? "none" : specials);
  }
  line("chat template",
       info["chat_template"].is_null() ? "none" : info["chat_template"].get<std::string>());
}

int run_inspect(const std::vector<std::string>& raw) {
  Args args(raw, {"--json"}, {});
  if (args.positionals().size() != 1) throw UsageError{"expected exactly one PATH"};
  fs::path path = args.positionals()[0];
  if (!fs::exists(path)) throw_invalid(path.string() + ": no such file or folder");
  json info = inspect_folder(path);
  if (args.flag("--json"))
    std::cout << info.dump(2) << "\n";
  else
    print_human(info);
  return 0;
}

const RegisterCommand kInspectCommand{{
    "inspect",
    "inspect PATH [--json]",
    "Show a model folder's architecture, parameters, dtypes, files, tokenizer and chat template",
    run_inspect,
}};

}  // namespace
}  // namespace tessera::cli
