#pragma once
// GGUF export: one file that llama.cpp (and Ollama, LM Studio, which run llama.cpp) loads,
// written by the engine itself from the model in memory and the model folder's tokenizer.
//
// What is written (ggml/docs/gguf.md, version 3, little-endian, tensors aligned to 32 bytes):
//   general.*          architecture, type "model", name, file_type, quantization_version 2,
//                      alignment
//   {arch}.*           context_length, embedding_length, block_count, feed_forward_length,
//                      attention.head_count / head_count_kv, the norm epsilon
//                      (attention.layer_norm_rms_epsilon or layer_norm_epsilon), vocab_size;
//                      rotary families add rope.freq_base, rope.dimension_count, linear
//                      rope.scaling.*, attention.key_length / value_length when head_dim is not
//                      hidden_size / heads
//   tokenizer.ggml.*   see gguf_vocab.h; tokenizer.chat_template when the model has one
//   tensors            the family's GGUF names (hf/families.h, GgufNaming), q/k rows regrouped
//                      for llama.cpp's "llama" RoPE, GPT-2's Conv1D weights transposed;
//                      llama3 rope scaling as rope_freqs.weight
//
// Tensor types by file type (as llama.cpp's converter decides): 1-D tensors (norms, biases,
// rope_freqs) and position embeddings are always F32; every other weight is F32, F16, BF16 or
// Q8_0, except that a Q8_0 weight whose rows are not whole blocks of 32 is written F16.
//
// Procedure: the tokenizer and every option are checked before anything is written; the file
// is written to a temporary file next to `out` and fsynced, then read back: header, metadata
// and tensor table must equal what was meant, and each tensor's bytes must hash as written.
// Only then is it renamed to `out`. A failure leaves nothing at `out` (an existing file there
// is kept unless `force`, and then replaced atomically by the rename).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hf/config.h"

namespace tessera::model {
class PretrainedModel;
}

namespace tessera::exporter {

enum class GgufFileType { F32, F16, BF16, Q8_0 };

// "f32", "f16", "bf16", "q8_0"; throws tessera::Error (InvalidInput) for anything else.
GgufFileType parse_gguf_file_type(std::string_view name);
const char* gguf_file_type_name(GgufFileType type);

struct GgufOptions {
  GgufFileType type = GgufFileType::F16;
  std::filesystem::path tokenizer_dir;  // holds tokenizer.json (required), tokenizer_config.json
  std::string name;                     // general.name; empty: the output file's stem
  std::uint32_t alignment = 32;         // general.alignment, a power of two
  bool force = false;                   // replace an existing file at `out`
  std::function<void(const std::string&)> progress;  // human-readable steps
};

struct GgufReport {
  std::filesystem::path file;
  std::string architecture;
  std::string file_type;  // "f16", …
  std::uint64_t file_bytes = 0;
  std::uint64_t metadata_keys = 0;
  std::uint64_t parameters = 0;
  std::map<std::string, int> tensors_by_type;  // "F32" → how many tensors
  std::string tokenizer_model;                 // "gpt2" or "llama"
  std::string tokenizer_pre;                   // "gpt2" only
  std::size_t tokens = 0;
  std::size_t merges = 0;
  // Where llama.cpp will compute differently from the model (e.g. a sliding window it ignores).
  std::vector<std::string> notes;
};

// The checks export_gguf makes before writing anything, from config.json and the tokenizer files
// alone, so that a caller can refuse before loading the weights. Throws as export_gguf.
void check_gguf_exportable(const hf::ModelConfig& config,
                           const std::filesystem::path& tokenizer_dir);

// Writes `model` (a causal LM of a family with a GgufNaming) to the file `out`. Throws
// tessera::Error: Unsupported for a family, head, activation, rope scaling or tokenizer GGUF
// cannot express; InvalidInput for an existing `out` without `force`, a folder at `out`, or bad
// tokenizer files; Io for file-system failures; Internal when the read-back check fails.
GgufReport export_gguf(model::PretrainedModel& model, const std::filesystem::path& out,
                       const GgufOptions& options);

}  // namespace tessera::exporter
