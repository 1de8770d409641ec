#pragma once
// The embedded default: everything `tessera-cli demo` needs, generated on the spot with no
// network. A byte-level tokenizer (256 byte tokens, no merges, so every character is a token),
// a small Llama-architecture model with random weights (2 layers, hidden 128), and a synthetic
// instruction dataset of string transformations whose answers can be checked exactly:
//   "first kiwo" -> "k",  "last kiwo" -> "o",  "upper kiwo" -> "KIWO"
// Words are 3-6 random lowercase letters; held-out words never appear in training.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hf/config.h"

namespace tessera::runner {

struct DemoTask {
  std::string instruction;
  std::string answer;
};

// Held-out and training tasks from `seed`: `train_count` + `eval_count` distinct words.
struct DemoData {
  std::vector<DemoTask> train;
  std::vector<DemoTask> validation;  // for the eval loss during training
  std::vector<DemoTask> test;        // for accuracy by generation
};
DemoData make_demo_data(std::size_t train_count, std::size_t test_count, std::uint64_t seed);

// Writes tokenizer.json, tokenizer_config.json and config.json of the demo model into `dir`.
hf::ModelConfig write_demo_model_files(const std::filesystem::path& dir);

// Writes tasks as instruction JSONL ({"instruction", "output"}), atomically.
void write_demo_jsonl(const std::filesystem::path& path, const std::vector<DemoTask>& tasks);

}  // namespace tessera::runner
