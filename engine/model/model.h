#pragma once
// Model families keyed by HuggingFace model_type, built from engine/model/layers.h:
//   llama / mistral / qwen2  one decoder (RMSNorm, RoPE none/linear/llama3, GQA, gated SiLU MLP;
//                            qwen2 adds q/k/v bias; mistral's sliding_window is honoured)
//   gpt2                     learned positions, Conv1D ([in, out]) weights, tied lm_head
//   bert                     BertModel (last hidden state + pooler) and
//                            BertForSequenceClassification (pooler → classifier)
//
// Parameter names: `named_parameters()` of the returned module yields exactly the names of the
// matching transformers class, e.g. `model.layers.0.self_attn.q_proj.weight` (LlamaForCausalLM),
// `transformer.h.0.attn.c_attn.weight` (GPT2LMHeadModel), `bert.encoder.layer.0.attention.self.
// query.weight` and `classifier.weight` (BertForSequenceClassification), or
// `encoder.layer.0…` for a bare BertModel. A tied lm_head is not a parameter of its own (as in
// transformers): the logits use the input embedding's weight.
//
// Numerics (checked by tests/parity/test_model_parity.py against transformers 5):
//   float32: logits, hidden states and loss within 1e-4 (max abs) of transformers (measured:
//   identical for llama/mistral/qwen2/bert, <= 2e-6 for gpt2).
//   bfloat16: every op runs in the order and precision transformers uses (bias fused into the
//   matmul, RMSNorm and rotary tables in float32, gelu_new written out), so on the CPU the
//   logits are bit-identical to transformers in bf16. The test bound is max abs logits
//   difference <= 0.0625, mean <= 0.01, loss <= 0.01, leaving room for other kernels' rounding;
//   against float32 the bf16 logits drift by up to ~0.11 (bound 0.25) for logits of std ~1.2.
//   Training on a GPU takes torch's fused RMSNorm, which rounds once after the weight: there a
//   bf16 norm's element may be one unit in the last place from transformers'.
//
// Positions: like transformers 5 when only attention_mask is given, position ids are 0..T-1
// for every row, whatever the padding (left padding therefore shifts positions; that is what
// transformers computes and what a fine-tuned model saw).
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hf/config.h"
#include "hf/safetensors.h"

namespace tessera::model {

// Which transformers class a model mirrors.
enum class TaskHead {
  Base,                    // LlamaModel / GPT2Model / BertModel: hidden states only
  CausalLM,                // *ForCausalLM, GPT2LMHeadModel
  SequenceClassification,  // BertForSequenceClassification
};
const char* task_head_name(TaskHead head);

// Keys and values of the positions seen so far, one entry per decoder layer, for incremental
// decoding: a forward with a cache attends to the cached positions and appends its own.
// Keys are stored after the rotary embedding, as transformers' DynamicCache holds them.
struct KVCache {
  struct Layer {
    torch::Tensor key;    // [B, kv_heads, S, head_dim]; undefined until the first forward
    torch::Tensor value;  // [B, kv_heads, S, head_dim]
  };
  std::vector<Layer> layers;
  std::int64_t length() const;      // S, the number of cached positions (0 when empty)
  std::int64_t batch_size() const;  // 0 when empty
  void clear() { layers.clear(); }
};

// Inputs on the device the model computes on: forward runs where input_ids is (the caller
// placed the model and moves its inputs there; forward never asks a parameter).
struct ForwardInput {
  torch::Tensor input_ids;       // [B, T] int64, required; its device is the compute device
  torch::Tensor attention_mask;  // [B, T], 1 = token, 0 = padding; all ones when undefined.
                                 // With a non-empty cache: [B, S + T], past and new positions.
  torch::Tensor labels;          // optional: [B, T] for CausalLM (-100 ignored, shifted inside),
                                 // [B] for SequenceClassification
  torch::Tensor token_type_ids;  // optional, bert only: [B, T], zeros when undefined
  // Optional, decoders only: [B or 1, T] position of each token. Default: S + 0..T-1 for every
  // row, S = the cache length (0 without a cache), as transformers 5 does given only a mask.
  torch::Tensor position_ids;
  // Optional, decoders only (supports_cache()): read the past keys/values from it and append
  // this call's. The caller owns it; one cache belongs to one sequence batch.
  KVCache* cache = nullptr;
  // CausalLM: compute logits for the last `logits_to_keep` positions only (0 = all), as
  // transformers' logits_to_keep; generation needs just the last one.
  std::int64_t logits_to_keep = 0;
  // CausalLM with labels: false computes the loss through the head a block of positions at a
  // time (model/head_loss.h) and leaves ForwardOutput::logits undefined: training's memory
  // holds no [B, T, vocab] logits. Where the head is split, quantized or adapted, as true.
  bool logits = true;
  // CausalLM with labels: instead of the loss, ForwardOutput::label_log_probs, log p(labels[:, t
  // + 1] | tokens up to t) — preference tuning's per-token figures — computed through the head a
  // block of positions at a time (model/head_loss.h) where the head allows (as `logits` false),
  // else from whole logits.
  bool label_log_probs = false;
  // A pipeline stage after the first (PretrainedModel::stage): the previous stage's output
  // [B, T, hidden], where its layers start. input_ids, attention_mask and labels are still given
  // (masks, positions and the loss are made from them).
  torch::Tensor stage_input;
};

struct ForwardOutput {
  torch::Tensor logits;  // CausalLM: [B, T, vocab]; SequenceClassification: [B, labels]
  torch::Tensor loss;    // scalar float32, defined when labels were given
  // With ForwardInput::label_log_probs: [B, T - 1] float32, position t's log-probability of
  // labels[:, t + 1] (0 where that label is -100); no loss then.
  torch::Tensor label_log_probs;
  torch::Tensor hidden_states;  // last hidden state [B, T, hidden] (after the final norm); a
                                // pipeline stage before the last: its last layer's output
};

// Pipeline parallelism: the part of a model one stage runs, layers [first_layer, end_layer).
// The stage holding layer 0 embeds input_ids; the others start from ForwardInput::stage_input.
// The stage holding the last layer applies the final norm, the head and the loss; the others
// return their last layer's output (ForwardOutput::hidden_states) and no logits.
struct PipelineStage {
  std::int64_t first_layer = 0;
  std::int64_t end_layer = -1;  // -1: through the last layer (the whole model by default)
  bool whole() const { return first_layer == 0 && end_layer < 0; }
};

// One layer of a family's stack as a function of its input hidden states (the layer's other
// inputs — rotary tables, mask — captured by value), and a wrapper that runs it: the hook for
// activation checkpointing (train::checkpointed), which calls the function again in backward.
using LayerFunction = std::function<torch::Tensor(const torch::Tensor&)>;
using LayerWrapper = std::function<torch::Tensor(const LayerFunction&, const torch::Tensor&)>;

// Sequence parallelism (engine/parallel/split_model.h installs it): `enter` takes the hidden
// states after the embedding to this rank's block of the positions, `leave` gives every position
// back after the last layer, before the final norm. The layers between compute on the block
// (their split linear layers gather and scatter the positions). A pipeline stage that does not
// hold the embedding receives a block already: `resume` takes it up for sequences of `length`
// positions; one that does not hold the last layer sends its block on: `pause`. Unset: nothing
// happens.
struct SequenceShards {
  std::function<torch::Tensor(const torch::Tensor&)> enter;
  std::function<torch::Tensor(const torch::Tensor&)> leave;
  std::function<void(std::int64_t length)> resume;
  std::function<void()> pause;
  std::int64_t parts = 1;  // ranks the positions are split over (blocks of ⌈T / parts⌉)
};

class PretrainedModel : public torch::nn::Module {
 public:
  PretrainedModel(hf::ModelConfig config, TaskHead head)
      : config_(std::move(config)), head_(head) {}
  // Validates the input (shapes, dtypes, token ids within the vocabulary) and runs the model.
  ForwardOutput forward(const ForwardInput& input);

  const hf::ModelConfig& config() const { return config_; }
  TaskHead head() const { return head_; }
  // The transformers `base_model_prefix` ("model", "transformer", "bert"; the family's entry in
  // hf/families.h): the name under which a model with a head holds its base model. Checkpoints
  // of a bare base model lack it.
  std::string base_prefix() const;
  // Checkpoint names that are not parameters and may be skipped (the family's buffers such as
  // `position_ids` or rotary `inv_freq`, GPT-2's `attn.bias`, a tied `lm_head.weight`).
  bool is_ignorable_tensor(const std::string& name) const;
  // Whether forward accepts ForwardInput::cache and position_ids (the decoder families).
  virtual bool supports_cache() const { return false; }

  // When set, every family's layer loop runs each layer as layer_wrapper(layer, h) instead of
  // layer(h) — except with a KV cache (generation), where layers run directly since a
  // recomputation would append to the cache twice.
  LayerWrapper layer_wrapper;
  // Applied by the families' layer loops (decoder, gpt2) around their layers; never with a KV
  // cache.
  SequenceShards sequence_shards;

  // The layers forward runs (pipeline parallelism); the whole model by default. Only families
  // with supports_stages() take another.
  PipelineStage stage;
  virtual bool supports_stages() const { return false; }
  // The stage's layer range resolved against the model's layer count, and where it stands.
  std::int64_t stage_first_layer() const { return stage.first_layer; }
  std::int64_t stage_end_layer() const;
  bool first_stage() const { return stage.first_layer == 0; }
  bool last_stage() const { return stage_end_layer() == config_.num_hidden_layers; }

 protected:
  virtual ForwardOutput run(const ForwardInput& input) = 0;

 private:
  hf::ModelConfig config_;
  TaskHead head_;
};

// The head a config asks for (from `architectures`), e.g. LlamaForCausalLM → CausalLM,
// BertModel → Base. Without `architectures`: CausalLM for decoders, Base for bert.
TaskHead head_from_config(const hf::ModelConfig& config);

// Builds an uninitialised model (parameters allocated, contents undefined) with the given
// dtype/device. Throws tessera::Error (Unsupported) for a family/head pair we do not have.
std::shared_ptr<PretrainedModel> create_model(const hf::ModelConfig& config, TaskHead head,
                                              const torch::TensorOptions& options = {});

// Fills parameters with transformers-like random init (normal(0, 0.02) matrices, unit norm
// weights, zero biases), for tests and training from scratch.
void init_weights(PretrainedModel& model, std::uint64_t seed);

struct LoadReport {
  std::vector<std::string> skipped;      // checkpoint tensors deliberately not loaded
  std::vector<std::string> initialized;  // parameters left at their initial values (new head)
};

// Copies every checkpoint tensor into the parameter with the same HF name, converting
// F32/F16/BF16 (and F64) to the parameter's dtype. Adds or strips the base prefix when the
// checkpoint is of a bare base model or of a model with a head. Missing parameters,
// unexpected tensors, shape or dtype mismatches raise tessera::Error (InvalidInput) listing the
// names and shapes.
//
// `new_head_prefixes`: parameters under these prefixes (e.g. "classifier.") may be absent from
// the checkpoint — a new task head on a base model, as transformers initialises it; they keep
// their current values and are listed in LoadReport::initialized.
LoadReport load_weights(PretrainedModel& model, const hf::SafetensorsCheckpoint& checkpoint,
                        const std::vector<std::string>& new_head_prefixes = {});

// The checkpoint tensor behind each parameter of a model whose parameters have no values yet,
// matched and checked as load_weights does (names, shapes, dtypes) when made, read only when
// asked: a plugin fills its own storage from it one tensor at a time (gemini straight into its
// chunks), so the whole model is never in memory twice, or at all.
//
// Such a model is built with create_model on the CPU and never written: LibTorch's meta tensors
// cannot become CPU tensors in place (set_data refuses another backend, and the blocks hold
// their parameters' handles), but memory that is reserved and never touched is not resident
// either — the kernel gives a page only when it is written.
class DeferredWeights {
 public:
  DeferredWeights(const PretrainedModel& model, hf::SafetensorsCheckpoint checkpoint);
  // Copies the checkpoint tensor of parameter `name` (a named_parameters() key of the model) into
  // `dest`, converting the dtype.
  void read_into(const std::string& name, torch::Tensor dest) const;
  // Rows [first_row, first_row + dest.size(0)) of the checkpoint tensor of parameter `name` into
  // `dest`, converting the dtype; the file's pages read stay out of the resident set.
  void read_rows_into(const std::string& name, std::int64_t first_row, torch::Tensor dest) const;
  // Fills every parameter of `model` (the model it was made for) in place: load_weights. The
  // weights of quantized Linears (quantize_linears read them already) are left as they are.
  void load_into(PretrainedModel& model) const;
  // The same with every float parameter read straight into `dtype` (its untouched storage
  // replaced by one of that dtype first): a frozen model that computes in bf16 is never held in
  // float32 whole. Reading rounds each value as a cast of the float32 load would.
  void load_into(PretrainedModel& model, torch::Dtype dtype) const;
  // The vocabulary's frozen tables (not tied to each other, not split) left in the checkpoint
  // file, read with pread in `dtype`, their parameters emptied — never resident (LoRA and QLoRA
  // under `single`): the input embedding's lookups read the rows they need, the output head (no
  // bias, no adapter) is read a block of the vocabulary at a time by the loss (one pass a step)
  // and by the logits. Returns the parameter names left there; load_into then skips them.
  std::vector<std::string> leave_frozen_tables_in_file(PretrainedModel& model,
                                                       torch::Dtype dtype) const;
  // Weights the checkpoint stores quantized (config.json's quantization_config, bitsandbytes):
  // whether there are any, and installing them in `model`'s Linears (those not quantized yet)
  // with their stored codes; returns the parameter names installed.
  bool has_stored_quantized() const { return !stored_quantized_.empty(); }
  const hf::StoredQuantization& stored_quantization() const { return quantization_; }
  std::vector<std::string> install_stored_quantized(PretrainedModel& model) const;

 private:
  hf::SafetensorsCheckpoint checkpoint_;
  std::string folder_;
  std::map<std::string, std::string> source_;            // parameter name → checkpoint tensor
  std::map<std::string, std::string> stored_quantized_;  // the same for stored quantized weights
  hf::StoredQuantization quantization_;
};

// The parameters whose tables stay in their checkpoint file (leave_frozen_tables_in_file), by
// name, with the shape they have there.
std::map<std::string, std::vector<std::int64_t>> stored_table_shapes(const PretrainedModel& model);

// config.json + safetensors of `dir` → a loaded model in eval mode.
std::shared_ptr<PretrainedModel> load_pretrained(const std::filesystem::path& dir,
                                                 torch::Dtype dtype = torch::kFloat32,
                                                 torch::Device device = torch::kCPU,
                                                 LoadReport* report = nullptr);
// The same from a config and a checkpoint already read (a run's hf::ModelFolder).
std::shared_ptr<PretrainedModel> load_pretrained(const hf::ModelConfig& config,
                                                 const hf::SafetensorsCheckpoint& checkpoint,
                                                 torch::Dtype dtype = torch::kFloat32,
                                                 torch::Device device = torch::kCPU,
                                                 LoadReport* report = nullptr);

// Parses a dtype name as users write it: float32/fp32/f32, bfloat16/bf16, float16/fp16/f16.
torch::Dtype dtype_from_string(const std::string& name);

// Family builders (decoder.cpp, gpt2.cpp, bert.cpp), chosen by create_model from the config's
// family; everything else about a family is its entry in hf/families.h.
std::shared_ptr<PretrainedModel> create_decoder(const hf::ModelConfig& config, TaskHead head,
                                                const torch::TensorOptions& options);
std::shared_ptr<PretrainedModel> create_gpt2(const hf::ModelConfig& config, TaskHead head,
                                             const torch::TensorOptions& options);
std::shared_ptr<PretrainedModel> create_bert(const hf::ModelConfig& config, TaskHead head,
                                             const torch::TensorOptions& options);

// Shared by the families: the logits of the last `keep` positions (all when 0 or >= T).
torch::Tensor keep_last_positions(const torch::Tensor& hidden, std::int64_t keep);

// Shared by the families: causal-LM loss as transformers computes it (labels shifted left by
// one, -100 ignored, mean over the remaining tokens, logits upcast to float32).
// With `split`, the logits are this tensor-parallel rank's vocabulary block and the loss is its.
class SplitLogits;
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                             SplitLogits* split = nullptr);

class LinearImpl;
class EmbeddingImpl;
// Shared by the causal-LM families, after out.hidden_states: the logits of the kept positions
// through `lm_head` (with its adapter, if any), or through the tied input embedding
// embedding `tied` (its attend()) when `lm_head` is null; the loss when labels are given. A head
// split along the vocabulary over tensor-parallel ranks (its SplitLogits) gives this rank's block
// of the logits, and the loss from every rank's.
void apply_causal_lm_head(ForwardOutput& out, const ForwardInput& in, LinearImpl* lm_head,
                          EmbeddingImpl& tied);

// A dropout probability config.json sets (`key`, hf::ModelConfig::dropout), `fallback` when absent.
double config_dropout(const hf::ModelConfig& config, const char* key, double fallback);

}  // namespace tessera::model
