#pragma once
// LoRA on the engine's Linear blocks, saved and loaded in the PEFT format.
//
// How it wraps Linear without touching the families: each targeted LinearImpl gets an adapter
// (model::LinearAdapter) that adds PEFT's B(A(dropout(x)))·α/r to the base output. The base
// weight stays a frozen parameter under its HF name; only rank-sized tensors are built per
// forward; dropout (lora_dropout) applies in training mode only, like PEFT's nn.Dropout.
//
// Names: `base_model.model.<module path>.lora_A.weight` ([r, in]) and `.lora_B.weight`
// ([out, r]), as PeftModel saves them. GPT-2's Conv1D ([in, out]) is PEFT's fan_in_fan_out.
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/model.h"
#include "optim/adamw.h"

namespace tessera::train {

struct LoraOptions {
  std::int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  // Module names' last component; empty = the family's default_lora_targets (hf/families.h).
  std::vector<std::string> targets;
};

// The module and the matrix of an adapter tensor's PEFT name (as LoraModel::adapters() names
// them); nullopt for any other name.
struct LoraMatrix {
  std::string module;  // e.g. "model.layers.0.self_attn.q_proj"
  bool is_a = false;   // lora_A ([r, in]); else lora_B ([out, r])
};
std::optional<LoraMatrix> lora_matrix_of(const std::string& peft_name);

class LoraModel {
 public:
  // Adds adapters to every Linear whose last name component is a target: A ~ kaiming-uniform
  // (a = √5, as PEFT), B = 0, drawn from torch's default generator. Throws tessera::Error when
  // a target matches no Linear, or for invalid rank/alpha/dropout.
  LoraModel(std::shared_ptr<model::PretrainedModel> model, LoraOptions options);
  ~LoraModel();

  // The adapter tensors in PEFT names (lora_A then lora_B per module, in module order).
  std::vector<optim::NamedTensor> adapters() const;
  // Attaches the adapters to their Linears (done by the constructor; needed again only after
  // detach()). Gradients flow to the adapters when grad mode is on.
  void refresh();
  // Removes the adapters from the Linears (the model then runs as the plain base model).
  void detach();
  // W += (α/r)·B·A into the base weights (in their dtype) and detaches; the model is then a
  // plain model with the adapter merged (for export). The adapters are unusable afterwards.
  void merge();

  // Copies adapter tensors by PEFT name; `source` names the file in errors. Every adapter must be
  // present with its shape.
  void load_adapters(const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source);
  // adapter_config.json (PEFT LoraConfig) and adapter_model.safetensors (float32) into `dir`,
  // each written atomically. `weights` overrides the tensors written (e.g. float32 masters).
  void save_adapter(const std::filesystem::path& dir, const std::string& base_model_name,
                    const std::vector<optim::NamedTensor>* weights = nullptr) const;
  nlohmann::json adapter_config(const std::string& base_model_name) const;

  double scaling() const { return options_.alpha / static_cast<double>(options_.rank); }
  const LoraOptions& options() const { return options_; }

 private:
  class Adapter;
  struct Layer {
    std::string module_name;  // e.g. model.layers.0.self_attn.q_proj
    std::shared_ptr<model::LinearImpl> linear;
    std::shared_ptr<Adapter> adapter;  // holds lora_A [r, in] and lora_B [out, r]
  };
  torch::Tensor delta(const Layer& layer) const;  // float32, in the base weight's layout
  std::shared_ptr<model::PretrainedModel> model_;
  LoraOptions options_;
  std::vector<Layer> layers_;
  bool fan_in_fan_out_ = false;
};

// Reads an adapter_model.safetensors (or any safetensors file) into float32 CPU tensors.
std::map<std::string, torch::Tensor> read_safetensors_tensors(const std::filesystem::path& file);
// Writes named tensors (any float dtype; converted to float32 when `as_float32`) atomically.
// Takes the list by value and drops each tensor once it is written, so tensors over memory maps
// (gemini's on-disk optimizer state) are released one at a time.
void write_safetensors_tensors(const std::filesystem::path& file,
                               std::vector<optim::NamedTensor> tensors, bool as_float32 = true,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera::train
