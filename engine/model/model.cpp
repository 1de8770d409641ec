#include "model/model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/files.h"
#include "hf/families.h"
#include "model/head_loss.h"
#include "model/layers.h"
#include "model/quantized_linear.h"
#include "model/vector_math.h"

namespace tessera::model {
namespace {

std::string shape_string(c10::IntArrayRef shape) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << ']';
  return s.str();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// "a, b, c and 12 more" — error messages stay readable for a checkpoint with thousands of names.
std::string name_list(const std::vector<std::string>& names, std::size_t shown = 12) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

torch::Tensor integer_tensor(const torch::Tensor& t, const char* field) {
  if (t.scalar_type() != torch::kInt64 && t.scalar_type() != torch::kInt32 &&
      t.scalar_type() != torch::kInt16 && t.scalar_type() != torch::kInt8 &&
      t.scalar_type() != torch::kUInt8 && t.scalar_type() != torch::kBool)
    throw_invalid(std::string(field) + ": expected an integer tensor, got " +
                  std::string(c10::toString(t.scalar_type())));
  return t.to(torch::kInt64);
}

std::string checkpoint_folder(const hf::SafetensorsCheckpoint& checkpoint) {
  return checkpoint.files().empty() ? std::string("checkpoint")
                                    : checkpoint.files().front()->path().parent_path().string();
}

std::optional<torch::Dtype> torch_dtype_of(hf::DType d) {
  switch (d) {
    case hf::DType::F64:
      return torch::kFloat64;
    case hf::DType::F32:
      return torch::kFloat32;
    case hf::DType::F16:
      return torch::kFloat16;
    case hf::DType::BF16:
      return torch::kBFloat16;
    default:
      return std::nullopt;
  }
}

}  // namespace

const char* task_head_name(TaskHead head) {
  switch (head) {
    case TaskHead::Base:
      return "base model";
    case TaskHead::CausalLM:
      return "causal LM";
    case TaskHead::SequenceClassification:
      return "sequence classification";
  }
  return "unknown";
}

ForwardOutput PretrainedModel::forward(const ForwardInput& input) {
  if (!input.input_ids.defined()) throw_invalid("input_ids: missing");
  if (input.input_ids.dim() != 2 || input.input_ids.size(0) < 1 || input.input_ids.size(1) < 1)
    throw_invalid("input_ids: expected shape [batch, length] with both at least 1, got " +
                  shape_string(input.input_ids.sizes()));
  // The caller placed the inputs where the model computes (the plugin knows; a parameter need
  // not: gemini's may be on disk). What forward makes itself goes there too.
  const torch::Device device = input.input_ids.device();
  ForwardInput in;
  in.input_ids = integer_tensor(input.input_ids, "input_ids");
  const std::int64_t lo = in.input_ids.min().item<std::int64_t>();
  const std::int64_t hi = in.input_ids.max().item<std::int64_t>();
  if (lo < 0 || hi >= config_.vocab_size)
    throw_invalid("input_ids: token id " + std::to_string(lo < 0 ? lo : hi) +
                      " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")",
                  "the tokenizer and the model's config.json (vocab_size) must belong together");
  const std::int64_t batch = in.input_ids.size(0);
  const std::int64_t length = in.input_ids.size(1);
  std::int64_t past = 0;
  if (input.cache != nullptr || input.position_ids.defined()) {
    if (!supports_cache())
      throw_unsupported(config_.model_type + " " + task_head_name(head_) +
                        ": a KV cache and position_ids are supported by the decoder families only");
  }
  if (input.cache != nullptr) {
    past = input.cache->length();
    if (past > 0 && input.cache->batch_size() != batch)
      throw_invalid("cache: it holds " + std::to_string(input.cache->batch_size()) +
                        " sequences but input_ids has " + std::to_string(batch),
                    "use one cache per batch of sequences (clear() it to start over)");
    in.cache = input.cache;
  }
  const std::vector<std::int64_t> mask_shape{batch, past + length};
  if (input.attention_mask.defined()) {
    if (input.attention_mask.sizes() != c10::IntArrayRef(mask_shape))
      throw_invalid("attention_mask: shape " + shape_string(input.attention_mask.sizes()) +
                    " differs from " + shape_string(mask_shape) +
                    (past > 0 ? " ([batch, cached + new positions])" : " (input_ids' shape)"));
    in.attention_mask = integer_tensor(input.attention_mask, "attention_mask");
    if ((in.attention_mask.ne(0) & in.attention_mask.ne(1)).any().item<bool>())
      throw_invalid("attention_mask: values must be 0 (padding) or 1 (token)");
  } else {
    in.attention_mask = torch::ones(mask_shape, torch::kInt64);
  }
  if (input.position_ids.defined()) {
    if (input.position_ids.dim() != 2 ||
        (input.position_ids.size(0) != batch && input.position_ids.size(0) != 1) ||
        input.position_ids.size(1) != length)
      throw_invalid("position_ids: expected shape [batch or 1, " + std::to_string(length) +
                    "], got " + shape_string(input.position_ids.sizes()));
    in.position_ids = integer_tensor(input.position_ids, "position_ids");
    if (in.position_ids.lt(0).any().item<bool>())
      throw_invalid("position_ids: positions must not be negative");
  } else if (supports_cache()) {
    in.position_ids = torch::arange(past, past + length, torch::kInt64).unsqueeze(0);
  }
  if (input.logits_to_keep < 0)
    throw_invalid("logits_to_keep: must be 0 (all positions) or positive");
  if (input.logits_to_keep > 0 && input.labels.defined())
    throw_invalid("logits_to_keep: the loss needs every position's logits; give no labels");
  in.logits_to_keep = input.logits_to_keep;
  in.logits = input.logits;
  in.label_log_probs = input.label_log_probs;
  if (input.label_log_probs && (head_ != TaskHead::CausalLM || !input.labels.defined()))
    throw_invalid(
        "label_log_probs: needs a causal LM head and labels (the tokens whose "
        "log-probabilities to compute)");
  if (input.labels.defined()) {
    if (head_ == TaskHead::Base)
      throw_invalid("labels: a base model (" + std::string(task_head_name(head_)) +
                    ") computes no loss; load a model with a head");
    if (head_ == TaskHead::CausalLM) {
      if (input.labels.sizes() != input.input_ids.sizes())
        throw_invalid("labels: shape " + shape_string(input.labels.sizes()) +
                      " differs from input_ids' " + shape_string(input.input_ids.sizes()));
      in.labels = integer_tensor(input.labels, "labels");
      torch::Tensor bad = in.labels.ne(-100) & (in.labels.lt(0) | in.labels.ge(config_.vocab_size));
      if (bad.any().item<bool>())
        throw_invalid("labels: values must be token ids in [0, " +
                      std::to_string(config_.vocab_size) + ") or -100 (ignored)");
    } else {
      in.labels = input.labels;
    }
    in.labels = in.labels.to(device);
  }
  if (input.token_type_ids.defined()) in.token_type_ids = input.token_type_ids.to(device);
  if (!stage.whole()) {
    if (!supports_stages())
      throw_unsupported(config_.model_type + " " + task_head_name(head_) +
                        ": pipeline stages are supported by the causal decoder families only");
    const std::int64_t end = stage_end_layer();
    if (stage.first_layer < 0 || end <= stage.first_layer || end > config_.num_hidden_layers)
      throw_invalid("pipeline stage: layers [" + std::to_string(stage.first_layer) + ", " +
                    std::to_string(end) + ") are not a range of the model's " +
                    std::to_string(config_.num_hidden_layers) + " layers");
    if (input.cache != nullptr)
      throw_unsupported("pipeline stage: a KV cache (generation) needs the whole model");
    if (!first_stage()) {
      // Under sequence parallelism the stages pass this rank's block of the positions.
      const std::int64_t positions =
          sequence_shards.enter ? (length + sequence_shards.parts - 1) / sequence_shards.parts
                                : length;
      const std::vector<std::int64_t> hidden_shape{batch, positions, config_.hidden_size};
      if (!input.stage_input.defined() ||
          input.stage_input.sizes() != c10::IntArrayRef(hidden_shape))
        throw_invalid("stage_input: a stage from layer " + std::to_string(stage.first_layer) +
                      " needs the previous stage's output of shape " + shape_string(hidden_shape));
      in.stage_input = input.stage_input;
    }
  }
  in.input_ids = in.input_ids.to(device);
  in.attention_mask = in.attention_mask.to(device);
  if (in.position_ids.defined()) in.position_ids = in.position_ids.to(device);
  return run(in);
}

std::int64_t PretrainedModel::stage_end_layer() const {
  return stage.end_layer < 0 ? config_.num_hidden_layers : stage.end_layer;
}

std::string PretrainedModel::base_prefix() const {
  return hf::family_of(config_).base_prefix;
}

bool PretrainedModel::is_ignorable_tensor(const std::string& name) const {
  for (const std::string& suffix : hf::family_of(config_).buffer_suffixes)
    if (name.ends_with(suffix)) return true;
  // Some writers store a tied lm_head anyway; it equals the input embedding.
  return head_ == TaskHead::CausalLM && config_.tie_word_embeddings && name == "lm_head.weight";
}

TaskHead head_from_config(const hf::ModelConfig& config) {
  for (const auto& arch : config.architectures) {
    if (arch.ends_with("ForCausalLM") || arch.ends_with("LMHeadModel")) return TaskHead::CausalLM;
    if (arch.ends_with("ForSequenceClassification")) return TaskHead::SequenceClassification;
    if (arch.ends_with("Model")) return TaskHead::Base;
  }
  const bool causal_lm = hf::family_of(config).causal_lm;
  if (!config.architectures.empty() && causal_lm)
    throw_unsupported(
        "config.json: architecture \"" + config.architectures.front() + "\" is not supported",
        "supported heads: *Model (hidden states), *ForCausalLM / *LMHeadModel, "
        "BertForSequenceClassification");
  // A family without a causal LM (BertForMaskedLM / BertForPreTraining & co.): its base model.
  return causal_lm ? TaskHead::CausalLM : TaskHead::Base;
}

// The torch half of the registry: each family's module builder.
std::shared_ptr<PretrainedModel> create_model(const hf::ModelConfig& config, TaskHead head,
                                              const torch::TensorOptions& options) {
  warm_up_vector_math();  // before any forward: see model/vector_math.h
  switch (config.family) {
    case hf::ModelFamily::Llama:
    case hf::ModelFamily::Mistral:
    case hf::ModelFamily::Qwen2:
      return create_decoder(config, head, options);
    case hf::ModelFamily::Gpt2:
      return create_gpt2(config, head, options);
    case hf::ModelFamily::Bert:
      return create_bert(config, head, options);
  }
  throw_unsupported("model_type \"" + config.model_type + "\" is not supported");
}

void init_weights(PretrainedModel& model, std::uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& item : model.named_parameters()) {
    torch::Tensor& p = item.value();
    torch::Tensor values;
    if (item.key().ends_with(".bias"))
      values = torch::zeros(p.sizes(), torch::kFloat32);
    else if (p.dim() == 1)  // the only 1-D weights are norm scales
      values = torch::ones(p.sizes(), torch::kFloat32);
    else
      values = at::normal(0.0, 0.02, p.sizes(), generator, torch::kFloat32);
    p.copy_(values);
  }
}

namespace {

// Which checkpoint tensor fills each parameter, checked (names, shapes, dtypes) before anything
// is read.
struct WeightMatch {
  std::map<std::string, std::string> source;  // parameter name → checkpoint tensor name
  // The weights the checkpoint stores quantized (config.json's quantization_config): parameter
  // name → checkpoint tensor name, read by install_stored_quantized.
  std::map<std::string, std::string> quantized;
  LoadReport report;
};

WeightMatch match_weights(const PretrainedModel& model, const hf::SafetensorsCheckpoint& checkpoint,
                          const std::vector<std::string>& new_head_prefixes) {
  std::map<std::string, torch::Tensor> expected;
  for (const auto& item : model.named_parameters()) expected.emplace(item.key(), item.value());
  const bool has_head = model.head() != TaskHead::Base;
  const std::string prefix = model.base_prefix() + ".";
  const std::vector<std::string> names = checkpoint.names();
  const bool checkpoint_prefixed = std::any_of(
      names.begin(), names.end(), [&](const std::string& n) { return starts_with(n, prefix); });
  const std::string source = checkpoint_folder(checkpoint);

  WeightMatch match;
  std::vector<std::string> unexpected;
  const bool stored_quantized = model.config().quantization.stored();
  for (const std::string& name : names) {
    // A quantized weight's absmax, code maps and state travel with it.
    if (stored_quantized && is_stored_quantization_companion(checkpoint, name)) continue;
    std::string target;
    if (expected.count(name))
      target = name;
    else if (has_head && expected.count(prefix + name))
      target = prefix + name;  // a bare base-model checkpoint loaded under a head
    else if (!has_head && starts_with(name, prefix) && expected.count(name.substr(prefix.size())))
      target = name.substr(prefix.size());  // a checkpoint with a head loaded as the base model
    if (target.empty()) {
      if (model.is_ignorable_tensor(name) ||
          (!has_head && checkpoint_prefixed && !starts_with(name, prefix)))
        match.report.skipped.push_back(name);  // a buffer, or another task's head
      else
        unexpected.push_back(name);
      continue;
    }
    if (stored_quantized && is_stored_quantized_weight(checkpoint, name)) {
      match.quantized.emplace(target, name);
      continue;
    }
    if (auto [it, inserted] = match.source.emplace(target, name); !inserted)
      throw_invalid(
          source + ": tensors \"" + it->second + "\" and \"" + name +
              "\" both map to parameter \"" + target + "\"",
          "the checkpoint mixes names with and without the \"" + prefix + "\" prefix; keep one");
  }
  std::vector<std::string> missing;
  for (const auto& [name, tensor] : expected) {
    if (match.source.count(name) || match.quantized.count(name)) continue;
    const bool new_head = std::any_of(new_head_prefixes.begin(), new_head_prefixes.end(),
                                      [&](const std::string& p) { return starts_with(name, p); });
    (new_head ? match.report.initialized : missing).push_back(name);
  }
  const std::string what = model.config().model_type + " " + task_head_name(model.head());
  if (!missing.empty() || !unexpected.empty()) {
    std::string message = source + ": the checkpoint does not match the " + what + ":";
    if (!missing.empty())
      message += " " + std::to_string(missing.size()) +
                 " parameter(s) are missing from the checkpoint: " + name_list(missing) + ".";
    if (!unexpected.empty())
      message +=
          " " + std::to_string(unexpected.size()) +
          " tensor(s) in the checkpoint are not parameters of the model: " + name_list(unexpected) +
          ".";
    throw_invalid(message,
                  "config.json (model_type, architectures, layer count, tie_word_embeddings) "
                  "must describe the checkpoint; re-export it or fix the config");
  }
  for (const auto& [target, name] : match.source) {
    const hf::TensorInfo& info = checkpoint.info(name);
    const torch::Tensor& param = expected.at(target);
    if (c10::IntArrayRef(info.shape) != param.sizes())
      throw_invalid(source + ": tensor \"" + name + "\" has shape " + shape_string(info.shape) +
                        " but the model expects " + shape_string(param.sizes()),
                    "the checkpoint does not match config.json (hidden_size, vocab_size, heads)");
    if (!torch_dtype_of(info.dtype))
      throw_invalid(source + ": tensor \"" + name + "\" has dtype " + hf::dtype_name(info.dtype) +
                        "; a parameter must be F32, F16, BF16 or F64",
                    "re-export the checkpoint with floating-point weights");
  }
  return match;
}

// Copies checkpoint tensor `name` into `dest` (checked by match_weights), converting the dtype.
// Checkpoint tensor `name` as a tensor over the mapping (which outlives the copies made from it;
// from_blob only reads).
torch::Tensor mapped_tensor(const hf::SafetensorsCheckpoint& checkpoint, const std::string& name) {
  const hf::TensorInfo& info = checkpoint.info(name);
  const hf::TensorView view = checkpoint.view(name);
  return torch::from_blob(const_cast<std::uint8_t*>(view.bytes.data()), info.shape,
                          torch::TensorOptions().dtype(*torch_dtype_of(info.dtype)));
}

void read_tensor(const hf::SafetensorsCheckpoint& checkpoint, const std::string& name,
                 torch::Tensor dest) {
  dest.copy_(mapped_tensor(checkpoint, name));
}

// The checkpoint tensor behind parameter `name` of a DeferredWeights' `source` map.
const std::string& source_of(const std::map<std::string, std::string>& source,
                             const std::string& name, const std::string& folder) {
  const auto it = source.find(name);
  if (it == source.end())
    throw Error(ErrorKind::Internal, folder + ": no checkpoint tensor for parameter \"" + name +
                                         "\" (not a parameter of the model it was matched to)");
  return it->second;
}

// A frozen table's rows read from its safetensors file with pread as lookups need them: the
// page cache holds them, not this process. (Through the mapping, a fault maps the page cache's
// whole large folio, 2 MiB: a 256-token batch touched every page of a 125 MiB table.) The file
// stays open, so a model folder renamed or replaced during the run reads as it was loaded.
class FileRows final : public StoredRows {
 public:
  FileRows(const std::filesystem::path& path, std::uint64_t offset, hf::DType file_dtype,
           std::int64_t rows, std::int64_t dim, torch::Dtype dtype, std::string source)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)),
        offset_(offset),
        file_dtype_(*torch_dtype_of(file_dtype)),
        row_bytes_(static_cast<std::uint64_t>(dim) * hf::dtype_size(file_dtype)),
        rows_(rows),
        dim_(dim),
        dtype_(dtype),
        source_(std::move(source)) {
    if (fd_.get() < 0)
      throw_io(source_ + ": cannot open " + path.string() + " (" + std::strerror(errno) + ")",
               "the model folder must stay readable while the model trains");
  }

  torch::Tensor lookup(const torch::Tensor& ids) override {
    torch::NoGradGuard no_grad;
    const torch::Tensor flat = ids.reshape({-1}).to(torch::kCPU, torch::kLong).contiguous();
    const auto [unique, inverse] = at::_unique(flat, /*sorted=*/true, /*return_inverse=*/true);
    torch::Tensor raw = torch::empty({unique.numel(), dim_}, file_dtype_);
    const std::int64_t* id = unique.data_ptr<std::int64_t>();
    auto* dest = static_cast<std::uint8_t*>(raw.data_ptr());
    for (std::int64_t i = 0; i < unique.numel(); ++i) {
      if (id[i] < 0 || id[i] >= rows_)
        throw Error(ErrorKind::Internal, source_ + ": row " + std::to_string(id[i]) +
                                             " is outside the table's " + std::to_string(rows_));
      read_bytes(dest + static_cast<std::uint64_t>(i) * row_bytes_,
                 offset_ + static_cast<std::uint64_t>(id[i]) * row_bytes_, row_bytes_);
    }
    std::vector<std::int64_t> shape = ids.sizes().vec();
    shape.push_back(dim_);
    return raw.to(dtype_).index_select(0, inverse).reshape(shape).to(ids.device());
  }

  torch::Tensor rows(std::int64_t first, std::int64_t count) override {
    if (first < 0 || count < 0 || first + count > rows_)
      throw Error(ErrorKind::Internal, source_ + ": rows " + std::to_string(first) + "+" +
                                           std::to_string(count) + " are outside the table's " +
                                           std::to_string(rows_));
    torch::Tensor raw = torch::empty({count, dim_}, file_dtype_);
    read_bytes(static_cast<std::uint8_t*>(raw.data_ptr()),
               offset_ + static_cast<std::uint64_t>(first) * row_bytes_,
               static_cast<std::uint64_t>(count) * row_bytes_);
    return raw.to(dtype_);
  }

  std::vector<std::int64_t> shape() const override { return {rows_, dim_}; }

 private:
  void read_bytes(std::uint8_t* dest, std::uint64_t at, std::uint64_t bytes) const {
    for (std::uint64_t done = 0; done < bytes;) {
      const ssize_t got =
          ::pread(fd_.get(), dest + done, bytes - done, static_cast<off_t>(at + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw_io(source_ + ": reading rows of the table failed (" +
                     (got < 0 ? std::string(std::strerror(errno)) : "the file is shorter") + ")",
                 "the model folder must stay readable while the model trains");
      done += static_cast<std::uint64_t>(got);
    }
  }

  core::FileDescriptor fd_;
  std::uint64_t offset_;
  torch::Dtype file_dtype_;
  std::uint64_t row_bytes_;
  std::int64_t rows_, dim_;
  torch::Dtype dtype_;
  std::string source_;
};

}  // namespace

std::map<std::string, std::vector<std::int64_t>> stored_table_shapes(const PretrainedModel& model) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (const auto* e = item.value()->as<EmbeddingImpl>(); e != nullptr && e->stored)
      out.emplace(item.key() + ".weight", e->stored->shape());
    if (const auto* l = item.value()->as<LinearImpl>(); l != nullptr && l->stored)
      out.emplace(item.key() + ".weight", l->stored->shape());
  }
  return out;
}

LoadReport load_weights(PretrainedModel& model, const hf::SafetensorsCheckpoint& checkpoint,
                        const std::vector<std::string>& new_head_prefixes) {
  torch::NoGradGuard no_grad;
  WeightMatch match = match_weights(model, checkpoint, new_head_prefixes);
  std::map<std::string, torch::Tensor> params;
  for (auto& item : model.named_parameters()) params.emplace(item.key(), item.value());
  for (const auto& [target, name] : match.source) read_tensor(checkpoint, name, params.at(target));
  install_stored_quantized(model, checkpoint, checkpoint_folder(checkpoint),
                           model.config().quantization, match.quantized);
  return std::move(match.report);
}

DeferredWeights::DeferredWeights(const PretrainedModel& model, hf::SafetensorsCheckpoint checkpoint)
    : checkpoint_(std::move(checkpoint)), folder_(checkpoint_folder(checkpoint_)) {
  WeightMatch match = match_weights(model, checkpoint_, {});
  source_ = std::move(match.source);
  stored_quantized_ = std::move(match.quantized);
  quantization_ = model.config().quantization;
}

std::vector<std::string> DeferredWeights::install_stored_quantized(PretrainedModel& model) const {
  return model::install_stored_quantized(model, checkpoint_, folder_, quantization_,
                                         stored_quantized_);
}

void DeferredWeights::read_into(const std::string& name, torch::Tensor dest) const {
  const std::string& tensor = source_of(source_, name, folder_);
  torch::NoGradGuard no_grad;
  read_tensor(checkpoint_, tensor, std::move(dest));
  // Deferred reads fill chunks one tensor at a time (gemini's disk tier writes each chunk out
  // before the next): the file's pages read so far would otherwise stay in the resident set,
  // the whole checkpoint by the end (the 1.2 GB file of a 297M llama loaded all to disk).
  checkpoint_.release_resident_pages(tensor);
}

void DeferredWeights::read_rows_into(const std::string& name, std::int64_t first_row,
                                     torch::Tensor dest) const {
  const std::string& tensor = source_of(source_, name, folder_);
  torch::NoGradGuard no_grad;
  dest.copy_(mapped_tensor(checkpoint_, tensor).narrow(0, first_row, dest.size(0)));
  checkpoint_.release_resident_pages(tensor);
}

void DeferredWeights::load_into(PretrainedModel& model) const {
  // A quantized Linear's weight is read into its quantized form: here, the checkpoint's stored
  // ones; before, those quantize_linears quantized. A table left in the file stays there.
  install_stored_quantized(model);
  const std::set<std::string> quantized = quantized_weight_names(model);
  const auto stored = stored_table_shapes(model);
  for (auto& item : model.named_parameters())
    if (!quantized.count(item.key()) && !stored.count(item.key()))
      read_into(item.key(), item.value());
}

std::vector<std::string> DeferredWeights::leave_frozen_tables_in_file(PretrainedModel& model,
                                                                      torch::Dtype dtype) const {
  std::vector<std::string> names;
  if (model.config().tie_word_embeddings) return names;  // the head reads the whole table
  const std::int64_t vocabulary = model.config().vocab_size;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* e = item.value()->as<EmbeddingImpl>();
    auto* l = item.value()->as<LinearImpl>();
    // The vocabulary's tables, frozen, whole here: the input embedding and the output head (as
    // the loss reads it: rows [vocabulary, hidden], no bias, no adapter).
    const bool input_table = e != nullptr && !e->split && !e->stored &&
                             e->num_embeddings == vocabulary && !e->weight.requires_grad();
    const bool output_table = l != nullptr && !l->split && !l->stored && !l->quantized &&
                              !l->adapter && !l->bias.defined() &&
                              l->layout == LinearImpl::Layout::OutIn &&
                              l->out_features == vocabulary && !l->weight.requires_grad();
    if (!input_table && !output_table) continue;
    const std::string name = item.key() + ".weight";
    const auto source = source_.find(name);
    if (source == source_.end()) continue;
    const hf::TensorInfo& info = checkpoint_.info(source->second);
    if (info.shape.size() != 2) continue;
    const auto [path, offset] = checkpoint_.location(source->second);
    auto rows = std::make_shared<FileRows>(path, offset, info.dtype, info.shape[0], info.shape[1],
                                           dtype, folder_ + ": " + source->second);
    torch::Tensor& weight = input_table ? e->weight : l->weight;
    torch::NoGradGuard no_grad;
    weight.set_data(torch::empty({0}, weight.options().dtype(dtype)));
    weight.set_requires_grad(false);
    if (input_table) {
      e->stored = std::move(rows);
    } else {
      l->stored = std::move(rows);
    }
    names.push_back(name);
  }
  return names;
}

void DeferredWeights::load_into(PretrainedModel& model, torch::Dtype dtype) const {
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model.named_parameters())
      if (p.value().numel() > 0 && p.value().is_floating_point() &&
          p.value().scalar_type() != dtype)
        p.value().set_data(torch::empty(p.value().sizes(), p.value().options().dtype(dtype)));
  }
  load_into(model);
}

std::shared_ptr<PretrainedModel> load_pretrained(const std::filesystem::path& dir,
                                                 torch::Dtype dtype, torch::Device device,
                                                 LoadReport* report) {
  // config.json first: its errors come before the checkpoint's (arguments have no order).
  const hf::ModelConfig config = hf::load_model_config(dir / "config.json");
  return load_pretrained(config, hf::SafetensorsCheckpoint::open(dir), dtype, device, report);
}

std::shared_ptr<PretrainedModel> load_pretrained(const hf::ModelConfig& config,
                                                 const hf::SafetensorsCheckpoint& checkpoint,
                                                 torch::Dtype dtype, torch::Device device,
                                                 LoadReport* report) {
  // A checkpoint stored quantized loads on the host and then moves: made on a GPU, every Linear
  // would first hold its dense weight there (a 4-bit 7B in float32: 26 GB before install()
  // empties them), where the host only reserves pages it never touches.
  const bool move_after = config.quantization.stored() && !device.is_cpu();
  std::shared_ptr<PretrainedModel> model =
      create_model(config, head_from_config(config),
                   torch::TensorOptions().dtype(dtype).device(move_after ? torch::kCPU : device));
  LoadReport r = load_weights(*model, checkpoint);
  if (move_after) model->to(device);  // the quantized weights too (LinearImpl::to)
  if (report) *report = std::move(r);
  model->eval();
  return model;
}

torch::Dtype dtype_from_string(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "f32") return torch::kFloat32;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "f16") return torch::kFloat16;
  throw_invalid("dtype \"" + name + "\" is not supported", "use float32, bfloat16 or float16");
}

std::int64_t KVCache::length() const {
  return layers.empty() || !layers.front().key.defined() ? 0 : layers.front().key.size(2);
}

std::int64_t KVCache::batch_size() const {
  return layers.empty() || !layers.front().key.defined() ? 0 : layers.front().key.size(0);
}

torch::Tensor keep_last_positions(const torch::Tensor& hidden, std::int64_t keep) {
  if (keep <= 0 || keep >= hidden.size(1)) return hidden;
  return hidden.narrow(1, hidden.size(1) - keep, keep);
}

namespace {

// The shifted targets of `labels`: position t predicts token t+1, the last position nothing.
torch::Tensor shifted_targets(const torch::Tensor& labels) {
  return torch::nn::functional::pad(labels,
                                    torch::nn::functional::PadFuncOptions({0, 1}).value(-100))
      .narrow(1, 1, labels.size(1));
}

// The head's parameters where they serve the loss without logits (a head not quantized and
// without an adapter; `split` set where its vocabulary is split over ranks); false elsewhere.
struct HeadParameters {
  const torch::nn::Module* block = nullptr;
  ParameterUse* use = nullptr;
  SplitLogits* split = nullptr;
  torch::Tensor weight, bias;
};

bool blockwise_head(LinearImpl* lm_head, EmbeddingImpl& tied, HeadParameters& head) {
  if (lm_head) {
    if (lm_head->quantized || lm_head->adapter || lm_head->layout != LinearImpl::Layout::OutIn)
      return false;
    if (lm_head->split && !(head.split = dynamic_cast<SplitLogits*>(lm_head->split.get())))
      return false;
    head.block = lm_head;
    head.use = lm_head->parameter_use.get();
    head.weight = lm_head->weight;
    head.bias = lm_head->bias;
  } else {
    if (tied.split && !(head.split = dynamic_cast<SplitLogits*>(tied.split.get()))) return false;
    head.block = &tied;
    head.use = tied.parameter_use.get();
    head.weight = tied.weight;
  }
  return true;
}

// −log p(target) of each of `rows` [N, H] through a head left in its checkpoint file, read a
// block of the vocabulary at a time (model/head_loss.h).
torch::Tensor stored_head_losses(LinearImpl& lm_head, const torch::Tensor& rows,
                                 const torch::Tensor& targets) {
  StoredRows* table = lm_head.stored.get();
  return stored_head_target_losses(
      rows, [table](std::int64_t first, std::int64_t count) { return table->rows(first, count); },
      lm_head.out_features, targets);
}

// Preference tuning's per-token log-probabilities (in.label_log_probs) through a whole head a
// block of positions at a time (or a head in its file a block of the vocabulary at a time);
// undefined where the head is split, quantized or adapted.
torch::Tensor label_log_probs_without_logits(const ForwardOutput& out, const ForwardInput& in,
                                             LinearImpl* lm_head, EmbeddingImpl& tied) {
  const bool stored = lm_head && lm_head->stored;
  HeadParameters head;
  if (!stored && (!blockwise_head(lm_head, tied, head) || head.split)) return {};
  const std::int64_t length = in.labels.size(1);
  const std::int64_t hidden = out.hidden_states.size(-1);
  // Position t predicts label t + 1: the last position predicts nothing and is not computed.
  const torch::Tensor rows = out.hidden_states.narrow(1, 0, length - 1).reshape({-1, hidden});
  const torch::Tensor targets = in.labels.narrow(1, 1, length - 1).reshape({-1});
  if (stored)
    return stored_head_losses(*lm_head, rows, targets)
        .neg()
        .reshape({in.labels.size(0), length - 1});
  // Backward reads the weight again only where the head trains (model/head_loss.h).
  const bool weight_in_backward = head_log_probs_read_weight_in_backward(head.weight, head.bias);
  if (head.use) head.use->enter(*head.block);
  torch::Tensor log_probs = head_target_log_probs(rows, head.weight, head.bias, targets)
                                .reshape({in.labels.size(0), length - 1});
  return head.use ? head.use->leave(*head.block, std::move(log_probs), weight_in_backward)
                  : log_probs;
}

// The same from whole logits [B, T, V].
torch::Tensor label_log_probs_of_logits(const torch::Tensor& logits, const torch::Tensor& labels) {
  const std::int64_t length = labels.size(1);
  const torch::Tensor targets = labels.narrow(1, 1, length - 1);
  const torch::Tensor counted = targets.ne(-100);
  const torch::Tensor predicted = logits.narrow(1, 0, length - 1).to(torch::kFloat32);
  // log p(target) = logit(target) − logsumexp(logits): no [rows, T, vocab] log-softmax kept.
  return (predicted.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) -
          predicted.logsumexp(-1))
      .masked_fill(counted.logical_not(), 0);
}

// The loss without the logits (in.logits false), through a head not quantized and without an
// adapter, whole here or split over ranks by the vocabulary. Undefined where the head is not.
torch::Tensor head_loss_without_logits(const ForwardOutput& out, const ForwardInput& in,
                                       LinearImpl* lm_head, EmbeddingImpl& tied) {
  if (in.logits || !in.labels.defined()) return {};
  if (lm_head && lm_head->stored) {
    const torch::Tensor targets = shifted_targets(in.labels).reshape({-1});
    const torch::Tensor losses = stored_head_losses(
        *lm_head, out.hidden_states.reshape({-1, out.hidden_states.size(-1)}), targets);
    // transformers' mean: NaN when no target counts (0 / 0).
    return losses.sum() / targets.ne(-100).sum().to(torch::kFloat32);
  }
  HeadParameters head;
  if (!blockwise_head(lm_head, tied, head)) return {};
  // Whatever holds the head's parameters (Gemini's chunks) has them in memory from here to
  // leave(); backward reads only the gradients computed in forward, never the weight again.
  if (head.use) head.use->enter(*head.block);
  const torch::Tensor targets = shifted_targets(in.labels).reshape({-1});
  torch::Tensor loss;
  if (head.split) {
    loss = head.split->head_loss(out.hidden_states, head.weight, head.bias, targets);
  } else {
    const std::int64_t hidden = out.hidden_states.size(-1);
    loss = head_cross_entropy(out.hidden_states.reshape({-1, hidden}), head.weight, head.bias,
                              targets);
  }
  return head.use ? head.use->leave(*head.block, std::move(loss), false) : loss;
}

}  // namespace

void apply_causal_lm_head(ForwardOutput& out, const ForwardInput& in, LinearImpl* lm_head,
                          EmbeddingImpl& tied) {
  if (in.label_log_probs) {
    // Sequences of one token predict nothing.
    if (in.labels.size(1) < 2) {
      out.label_log_probs =
          torch::zeros({in.labels.size(0), 0}, out.hidden_states.options().dtype(torch::kFloat32));
      return;
    }
    out.label_log_probs = label_log_probs_without_logits(out, in, lm_head, tied);
    if (!out.label_log_probs.defined()) {
      out.logits = lm_head ? lm_head->forward(out.hidden_states) : tied.attend(out.hidden_states);
      out.label_log_probs = label_log_probs_of_logits(out.logits, in.labels);
    }
    return;
  }
  if (torch::Tensor loss = head_loss_without_logits(out, in, lm_head, tied); loss.defined()) {
    out.loss = std::move(loss);
    return;
  }
  const torch::Tensor kept = keep_last_positions(out.hidden_states, in.logits_to_keep);
  out.logits = lm_head ? lm_head->forward(kept) : tied.attend(kept);
  SplitLogits* split = lm_head ? dynamic_cast<SplitLogits*>(lm_head->split.get())
                               : dynamic_cast<SplitLogits*>(tied.split.get());
  if (in.labels.defined()) out.loss = causal_lm_loss(out.logits, in.labels, split);
}

torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                             SplitLogits* split) {
  const torch::Tensor shifted = shifted_targets(labels);
  if (split)
    return split->cross_entropy(logits.reshape({-1, logits.size(-1)}), shifted.reshape({-1}));
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}), shifted.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

double config_dropout(const hf::ModelConfig& config, const char* key, double fallback) {
  const auto found = config.dropout.find(key);
  return found == config.dropout.end() ? fallback : found->second;
}

}  // namespace tessera::model
