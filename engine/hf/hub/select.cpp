// select_files: what Tessera fetches of a repository (client.h).
#include <fnmatch.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

#include "hf/hub/client.h"
#include "hf/hub/datasets.h"

namespace tessera::hf::hub {
namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool matches(const std::string& path, const std::vector<std::string>& patterns) {
  if (patterns.empty()) return true;
  for (std::string pattern : patterns) {
    if (!pattern.empty() && pattern.back() == '/') pattern += '*';
    if (::fnmatch(pattern.c_str(), path.c_str(), 0) == 0) return true;
  }
  return false;
}

constexpr std::array kModelFiles = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
};

bool is_model_file(const std::string& path) {
  if (path.find('/') != std::string::npos) return false;  // transformers loads the top level
  if (ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json")) return true;
  return std::find(kModelFiles.begin(), kModelFiles.end(), std::string_view(path)) !=
         kModelFiles.end();
}

bool is_pickle_weights(const std::string& path) {
  return ends_with(path, ".bin") || ends_with(path, ".pt") || ends_with(path, ".pth") ||
         ends_with(path, ".ckpt") || ends_with(path, ".pkl");
}

bool is_dataset_file(const std::string& path) {
  return path == "README.md" || is_data_file(path);
}

}  // namespace

Selection select_files(const std::string& repo_id, RepoType type,
                       const std::vector<RepoFile>& files,
                       const std::vector<std::string>& include) {
  Selection s;
  if (type == RepoType::Model) {
    bool has_safetensors = false;
    std::string pickle;
    for (const auto& f : files) {
      if (f.path.find('/') != std::string::npos) continue;
      if (ends_with(f.path, ".safetensors")) has_safetensors = true;
      if (pickle.empty() && is_pickle_weights(f.path)) pickle = f.path;
    }
    if (!has_safetensors) {
      if (!pickle.empty()) {
        s.refusal = repo_id + " has only pickle weights (" + pickle +
                    "): Tessera trains from safetensors only, since loading a pickle file can "
                    "run code from the file";
        s.hint =
            "pick a repository or revision with .safetensors weights (the Hub's conversion "
            "bot often opens one as a pull request: try --revision refs/pr/N)";
      } else {
        s.refusal = repo_id + " has no .safetensors weights at its top level";
        s.hint = "is it a model repository? datasets need --dataset";
      }
      return s;
    }
    for (const auto& f : files)
      if (is_model_file(f.path) && matches(f.path, include)) s.files.push_back(f);
  } else {
    for (const auto& f : files)
      if (is_dataset_file(f.path) && matches(f.path, include)) s.files.push_back(f);
    if (std::none_of(s.files.begin(), s.files.end(),
                     [](const RepoFile& f) { return f.path != "README.md"; }) &&
        include.empty()) {
      s.refusal = repo_id + " has no JSON, JSONL, CSV, TSV, Parquet or text files";
      s.hint = "the Hub converts many datasets to Parquet: try --revision refs/convert/parquet";
      s.files.clear();
      return s;
    }
  }
  if (s.files.empty()) {
    s.refusal = "no file of " + repo_id + " that Tessera fetches matches --include";
    s.hint = "see the files with `tessera-cli hub info " + repo_id + "`";
  }
  return s;
}

std::vector<std::string> matching(const std::vector<std::string>& paths,
                                  const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const std::string& path : paths)
    if (!patterns.empty() && matches(path, patterns)) out.push_back(path);
  return out;
}

}  // namespace tessera::hf::hub
