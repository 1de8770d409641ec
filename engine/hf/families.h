#pragma once
// The model families, one registry entry each, keyed by config.json's model_type: how the
// family's config maps onto ModelConfig, its HuggingFace weight names (base_model_prefix,
// checkpoint buffers that are not parameters), the heads it has, its default LoRA targets and
// the parameter shapes the planner counts. Torch-free, so the planner and the GUI read the same
// entry the engine builds from; the LibTorch modules of each family are built in engine/model
// (create_model picks the builder by `family`), its GGUF writer in engine/export/gguf.cpp.
// docs/adding-a-model-family.md says how to add one.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hf/config.h"

namespace tessera::hf {

class ConfigFields;

// A linear module of one layer, as LoRA targets name it (the last component of its module path).
struct LinearModule {
  std::string name;
  double in_features = 0;
  double out_features = 0;
  bool bias = false;
  // Which of the layer's inputs to linears this one reads (linears reading the same tensor
  // share it: q, k and v read the attention norm's output). Autograd keeps that input for the
  // weight's gradient alone: a layer whose linears all stay frozen (LoRA's base) does not, unless
  // an adapter on one of them reads it.
  int input = 0;
};

// Parameter shapes of a model, as transformers' num_parameters() counts them (tied weights once).
// Sizes are doubles: those of a config.json can be absurd, and the planner clamps them.
struct ParameterShapes {
  // One layer's linears in module order; a name may repeat (gpt2's attention and MLP c_proj),
  // and then the first is the one a LoRA target of that name is planned with.
  std::vector<LinearModule> layer_linears;
  double layer_other = 0;     // one layer's other parameters (its norms)
  double outside_layers = 0;  // embeddings, final norm, untied lm_head, pooler, classifier
  // Elements saved for backward per token in one layer, in the compute dtype, besides the two
  // norms' (which the planner adds with their precision rules): the planner's activation figure.
  // With every linear training; each frozen linear's input (LinearModule::input, once for those
  // sharing it) is not kept unless a trained linear or an adapter reads it too.
  double saved_per_token = 0;
};

// How a weight is rearranged on its way into a GGUF file.
enum class GgufLayout {
  AsIs,
  // q_proj / k_proj rows regrouped from transformers' rotary layout (each head's first half
  // rotates with its second half) to GGML's (adjacent pairs rotate together), as llama.cpp's
  // "llama" architecture computes RoPE: per head, rows [0, d/2) and [d/2, d) are interleaved.
  // RotaryQ regroups by num_attention_heads, RotaryK by num_key_value_heads.
  RotaryQ,
  RotaryK,
  Transposed,  // a Conv1D weight stored [in, out], written [out, in] as a linear's
};

// One weight's GGUF name. "{L}" stands for the layer index in both names.
struct GgufTensorName {
  std::string hf;    // e.g. "model.layers.{L}.self_attn.q_proj.weight"
  std::string gguf;  // e.g. "blk.{L}.attn_q.weight"
  GgufLayout layout = GgufLayout::AsIs;
  // Written in float32 whatever the file type (as llama.cpp's converter keeps position
  // embeddings); 1-D tensors and norms always are.
  bool keep_f32 = false;
};

// What llama.cpp calls a family in a GGUF file: its architecture, tensor names and the few
// things that differ between architectures (engine/export/gguf.cpp writes the common keys).
struct GgufNaming {
  std::string architecture;  // general.architecture: "llama", "qwen2", "gpt2"
  std::vector<GgufTensorName> tensors;
  bool rms_norm = true;  // epsilon under attention.layer_norm_rms_epsilon, else layer_norm_epsilon
  // config.json activations llama.cpp's graph for the architecture computes as transformers does.
  std::vector<std::string> activations;
  // llama3 rope scaling is written as the rope_freqs tensor (only llama.cpp's "llama" reads it).
  bool llama3_rope_freqs = false;
};

// HF weight name → its GGUF name ("{L}" filled in), layout and float32 rule.
struct GgufTensor {
  std::string name;
  GgufLayout layout = GgufLayout::AsIs;
  bool keep_f32 = false;
};
// nullopt when `naming` has no entry for `hf_name`.
std::optional<GgufTensor> gguf_tensor(const GgufNaming& naming, std::string_view hf_name);

// How tensor parallelism splits a module's weights over the ranks of a tensor-parallel group
// (transformers' base_model_tp_plan names the same choices "colwise", "rowwise", …).
enum class TensorSplit {
  Column,      // W [out, in] by rows (its outputs), and its bias
  Row,         // W by columns (its inputs); the bias whole, added once after the sum
  Vocabulary,  // an embedding's table by rows (token ids), or an output head by rows with the
               // loss computed across the ranks from their blocks of the logits
};
struct TensorSplitRule {
  // The module's path, matched against the last components of a module name; "*" stands for a
  // layer index: "layers.*.self_attn.q_proj" matches "model.layers.3.self_attn.q_proj".
  std::string module;
  TensorSplit split = TensorSplit::Column;
  // Column only: the output is this many equal parts side by side (gpt2's fused c_attn holds
  // q, k and v), each split by its rows; a rank's block is its block of every part.
  int parts = 1;
  // Column only: the outputs are the key/value heads (GQA). With fewer kv heads than ranks, each
  // head's block is held by size / kv_heads ranks (the ones whose query heads read it).
  bool kv_heads = false;
};

// How pipeline parallelism cuts a family's model into stages of consecutive layers (as
// transformers' base_model_pp_plan): module names, matched against the components of a
// parameter name (with or without the base prefix, LoRA adapters' PEFT names too).
struct PipelinePlan {
  std::string layers;               // the layer list: layer i's parameters are under "<layers>.i."
  std::vector<std::string> before;  // run before layer 0, on the first stage (the embeddings)
  std::vector<std::string> after;   // run after the last layer, on the last stage (norm, head)
  std::string tied_embedding;       // the input embedding a tied head reads (with `before`)
};

// A size field of config.json as the family names it, and the member it is read into.
struct SizeField {
  const char* key;
  std::int64_t ModelConfig::*member;
};

struct FamilyTraits {
  std::string model_type;  // as config.json writes it
  ModelFamily family = ModelFamily::Llama;
  // The family's own fields of config.json onto `config` (the common ones — model_type,
  // architectures, dtype, token ids, vocab_size — are read before). Throws tessera::Error
  // naming the file and the field.
  void (*read_config)(const ConfigFields& fields, ModelConfig& config) = nullptr;
  // transformers' base_model_prefix: the name under which a model with a head holds its base
  // model ("model.layers.0…" in LlamaForCausalLM); checkpoints of a bare base model lack it.
  std::string base_prefix;
  // Checkpoint tensors that are buffers, not parameters, by name suffix (skipped when loading).
  std::vector<std::string> buffer_suffixes;
  bool causal_lm = false;                // has a causal-LM head (the default head without
                                         // `architectures`; bert defaults to its base model)
  bool sequence_classification = false;  // has a sequence-classification head
  bool rotary = false;                   // rotary positions (rope_theta, rope_scaling apply)
  bool learned_positions = false;        // positions beyond max_position_embeddings cannot run
  // Linears stored [in, out] (transformers' Conv1D): PEFT's fan_in_fan_out, and a LoRA delta
  // [out, in] is transposed before it is added to such a weight.
  bool conv1d_weights = false;
  std::vector<std::string> default_lora_targets;  // last module-name components
  ParameterShapes (*parameter_shapes)(const ModelConfig& config) = nullptr;
  // The fields parameter_shapes multiplies, under their config.json names: a refusal of a model
  // too large for the machine names the one that makes it so (plan/model_size.h).
  std::vector<SizeField> size_fields;
  // How llama.cpp names the family in GGUF; nullopt: no GGUF export.
  std::optional<GgufNaming> gguf;
  // The tensor-parallel plan: the modules whose weights are split (the others stay whole on
  // every rank), and the sizes a tensor-parallel size must divide. Empty: the family has none.
  std::vector<TensorSplitRule> tensor_parallel_plan;
  std::vector<SizeField> tensor_parallel_divides;
  // Sizes a tensor-parallel size must divide or be a multiple of (kv heads: replicated).
  std::vector<SizeField> tensor_parallel_divides_or_replicates;
  // The pipeline plan; `layers` empty: the family has none.
  PipelinePlan pipeline_plan;
};

// Whether `config`'s model can be cut into `stages` pipeline stages: a causal LM of a family with
// a pipeline plan and at least one layer per stage. Throws tessera::Error (Unsupported for a
// family without a plan or another head; InvalidInput naming num_hidden_layers and the stage
// counts that would work).
void check_pipeline_parallel(const ModelConfig& config, int stages);

// Where a parameter (named_parameters() name, or a LoRA adapter's PEFT name) runs in the
// pipeline: its layer's index; -1 before layer 0; num_hidden_layers after the last. Throws
// tessera::Error (Internal) for a name the plan does not place.
std::int64_t pipeline_layer_of(const FamilyTraits& family, const ModelConfig& config,
                               std::string_view parameter_name);

// Whether `config`'s model can be split over `size` tensor-parallel ranks. Throws tessera::Error:
// Unsupported when its family has no plan, InvalidInput naming the config field, its value and
// the sizes that would divide every planned field when `size` does not divide one.
void check_tensor_parallel(const ModelConfig& config, int size);

// The rule of `family`'s plan for the module named `module_name` (a named_modules() key), or
// nullptr when it is not split.
const TensorSplitRule* tensor_split_of(const FamilyTraits& family, std::string_view module_name);

// The entry for `model_type`, or nullptr when it is not supported.
const FamilyTraits* find_family(std::string_view model_type);
// The entry of a parsed config (its model_type is always supported).
const FamilyTraits& family_of(const ModelConfig& config);
// Every entry, in the order the registry lists them.
const std::vector<FamilyTraits>& model_families();

const std::vector<std::string>& supported_model_types();
const char* family_name(ModelFamily family);
// "llama, mistral, qwen2 or gpt2": the model types whose entry satisfies `pred`, for messages.
std::string model_types_where(bool (*pred)(const FamilyTraits&));

}  // namespace tessera::hf
