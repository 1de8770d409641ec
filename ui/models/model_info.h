#pragma once
// What the wizard's Model page shows about a model folder, computed by the engine's own
// readers (config.json, safetensors headers, tokenizer.json, tokenizer_config.json), and
// where local models are found: folders the user picks and the HuggingFace cache.
#include <QList>
#include <QString>
#include <cstdint>

namespace tessera::hf {
struct ModelConfig;
}

namespace tessera::ui {

struct ModelSummary {
  QString folder;
  bool trainable = false;  // the engine can load and fine-tune it
  QString problem;         // why not: the engine's error message
  QString hint;            // and what to do about it
  QString architecture;    // "bert (BertModel)"
  QString model_type;
  std::uint64_t parameters = 0;
  QString dtype;  // the dtype holding most parameters, e.g. "F32"
  // A checkpoint stored quantized (config.json's bitsandbytes quantization_config): "nf4
  // (bitsandbytes, double-quantized absmax)"; empty for a dense one. It trains as QLoRA only.
  QString quantization;
  std::uint64_t disk_bytes = 0;  // every file in the folder
  std::int64_t context_length = 0;
  QString chat_template;  // a name ("chatml", "llama-3", …) or "none"
  QString tokenizer;      // "WordPiece, vocabulary 30522" or "none"
  bool has_tokenizer = false;
};

// Validates `folder` with the engine. Never throws: engine errors land in problem/hint.
// Reads files: call it off the GUI thread.
ModelSummary inspect_model(const QString& folder);

// Whether the runner can fine-tune a model of this config: a causal language model
// (*ForCausalLM / *LMHeadModel, or no architectures for a decoder family).
bool is_causal_lm(const hf::ModelConfig& config);

// What to call the model in lists: "org/name" for a HuggingFace cache snapshot
// (…/models--org--name/snapshots/<rev>), else the folder's name.
QString model_display_name(const QString& folder);

// "22.7M", "1.24B"
QString human_count(std::uint64_t n);
QString human_bytes(std::uint64_t bytes);

struct CachedModel {
  QString repo_id;       // "org/name"
  QString revision;      // the snapshot folder name (a commit hash)
  QString folder;        // <hub>/models--org--name/snapshots/<revision>
  bool is_main = false;  // refs/main points at this snapshot
};

// The HuggingFace hub cache folder: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else
// $HF_HOME/hub, else ~/.cache/huggingface/hub (as huggingface_hub resolves it).
QString hf_hub_cache_dir();

// Every snapshot under `hub_dir` (models--org--name/snapshots/<rev>/ with a config.json).
// Reads the file system: call it off the GUI thread.
QList<CachedModel> scan_hf_cache(const QString& hub_dir);

}  // namespace tessera::ui
