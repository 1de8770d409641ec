#pragma once
// The tokenizer as llama.cpp reads it from a GGUF file (tokenizer.ggml.*), from a model folder's
// tokenizer.json, tokenizer_config.json (and chat_template.jinja) and config.json. Two kinds are
// expressible:
//   "gpt2"   byte-level BPE (GPT-2, Llama 3, Qwen2): tokens, merges ("left right"), and the
//            pre-tokenizer llama.cpp must apply, named by tokenizer.ggml.pre ("gpt-2",
//            "llama-bpe", "qwen2"), recognised from tokenizer.json's pre_tokenizer
//   "llama"  SentencePiece-style BPE with byte fallback (Llama 2, Mistral, TinyLlama): tokens,
//            scores (llama.cpp merges the adjacent pair whose joined token scores highest, so a
//            token made by merge r scores −(r + 1), reproducing the merge order), <0xXX> byte
//            tokens, and whether a "▁" is prepended (add_space_prefix)
// Anything else (WordPiece, Unigram, an unknown pre-tokenizer or normalizer) is refused with an
// error naming the file and the field: llama.cpp would tokenize it differently.
// Torch-free.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hf/config.h"

namespace tessera::exporter {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum GgufTokenType : std::int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

struct GgufVocab {
  std::string model;                // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;                  // tokenizer.ggml.pre ("gpt2" only)
  std::vector<std::string> tokens;  // by id; [PAD<id>] fills ids the tokenizer lacks
  std::vector<std::int32_t> token_types;
  std::vector<float> scores;        // "llama" only
  std::vector<std::string> merges;  // "gpt2" only, in rank order
  std::optional<std::uint32_t> bos_id, eos_id, unk_id, pad_id;
  bool add_bos = false;                  // the tokenizer's post-processor prepends BOS
  bool add_eos = false;                  // … appends EOS
  std::optional<bool> add_space_prefix;  // "llama" only
  std::optional<std::string> chat_template;
  std::size_t padding_tokens = 0;  // [PAD<id>] entries added to reach the model's vocab_size
};

// Reads the tokenizer of `dir` for a model of `config` (its vocab_size is the number of tokens
// llama.cpp expects). Throws tessera::Error naming the file and field for what GGUF cannot
// express, with a hint.
GgufVocab read_gguf_vocab(const std::filesystem::path& dir, const hf::ModelConfig& config);

}  // namespace tessera::exporter
