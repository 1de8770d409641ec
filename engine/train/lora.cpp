#include "train/lora.h"

#include <cmath>
#include <set>

#include "core/error.h"
#include "core/files.h"
#include "hf/families.h"
#include "hf/safetensors.h"
#include "model/dropout.h"
#include "model/module_names.h"
#include "model/quantized_linear.h"

namespace tessera::train {

namespace {
using model::last_component;
const std::string kPeftPrefix = "base_model.model.";
}  // namespace

// PEFT's LoRA forward: y + B(A(dropout(x)))·scaling, with A [r, in] and B [out, r] as linear
// weights whatever the base layout (fan_in_fan_out only concerns the base weight). Only
// rank-sized intermediates are built, never a weight-sized delta.
class LoraModel::Adapter : public model::LinearAdapter {
 public:
  Adapter(torch::Tensor a, torch::Tensor b, double scaling, double dropout)
      : lora_a(std::move(a)), lora_b(std::move(b)), scaling_(scaling), dropout_(dropout) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y, bool training,
                        const model::AdapterSplit* split) override {
    torch::Tensor in = x.scalar_type() == lora_a.scalar_type() ? x : x.to(lora_a.scalar_type());
    if (training && dropout_ > 0.0)
      in = split && split->input_is_block ? model::dropout_block(in, dropout_, /*training=*/true)
                                          : model::dropout(in, dropout_, /*training=*/true);
    torch::Tensor low_rank = torch::linear(in, lora_a);
    if (split && split->reduce) low_rank = split->reduce(low_rank);
    torch::Tensor update = torch::linear(low_rank, lora_b) * scaling_;
    return y + (update.scalar_type() == y.scalar_type() ? update : update.to(y.scalar_type()));
  }
  // Shared with adapters() and the plugin (which may move them to another device/dtype in
  // place), so the forward always reads the current values.
  torch::Tensor lora_a;  // [r, in]
  torch::Tensor lora_b;  // [out, r]

 private:
  double scaling_;
  double dropout_;
};

LoraModel::LoraModel(std::shared_ptr<model::PretrainedModel> model, LoraOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  if (options_.rank < 1 || options_.rank > 65536)
    throw_invalid("method.lora_rank: " + std::to_string(options_.rank) + " must be in [1, 65536]");
  if (!(options_.alpha > 0.0) || !std::isfinite(options_.alpha))
    throw_invalid("method.lora_alpha: must be a positive number");
  if (!(options_.dropout >= 0.0 && options_.dropout < 1.0))
    throw_invalid("method.lora_dropout: must be in [0, 1)");
  const hf::FamilyTraits& family = hf::family_of(model_->config());
  if (options_.targets.empty()) options_.targets = family.default_lora_targets;
  fan_in_fan_out_ = family.conv1d_weights;
  std::set<std::string> wanted(options_.targets.begin(), options_.targets.end());
  std::set<std::string> matched;
  torch::NoGradGuard no_grad;
  for (const auto& item : model_->named_modules("", /*include_self=*/false)) {
    auto linear = std::dynamic_pointer_cast<model::LinearImpl>(item.value());
    if (!linear) continue;
    const std::string leaf = last_component(item.key());
    if (!wanted.count(leaf)) continue;
    matched.insert(leaf);
    if (linear->adapter)
      throw_invalid("method.targets: " + item.key() + " already has an adapter",
                    "apply LoRA to a model once");
    auto options = torch::TensorOptions().dtype(torch::kFloat32).device(linear->weight.device());
    torch::Tensor lora_a = torch::empty({options_.rank, linear->in_features}, options);
    // kaiming_uniform_(a=√5) on [r, in]: bound = √(6 / ((1 + a²)·fan_in)) = 1/√fan_in.
    const double bound = 1.0 / std::sqrt(static_cast<double>(linear->in_features));
    lora_a.uniform_(-bound, bound);
    torch::Tensor lora_b = torch::zeros({linear->out_features, options_.rank}, options);
    Layer layer;
    layer.module_name = item.key();
    layer.linear = linear;
    layer.adapter = std::make_shared<Adapter>(lora_a, lora_b, scaling(), options_.dropout);
    layers_.push_back(std::move(layer));
  }
  for (const std::string& t : options_.targets)
    if (!matched.count(t))
      throw_invalid(
          "method.targets: \"" + t + "\" matches no linear layer of this " +
              model_->config().model_type + " model",
          "default targets for this family: " + [&] {
            std::string s;
            for (const auto& d : family.default_lora_targets) s += (s.empty() ? "" : ", ") + d;
            return s;
          }());
  for (const auto& p : model_->parameters()) p.set_requires_grad(false);
  refresh();
}

LoraModel::~LoraModel() = default;

std::optional<LoraMatrix> lora_matrix_of(const std::string& peft_name) {
  for (const bool is_a : {true, false}) {
    const std::string suffix = is_a ? ".lora_A.weight" : ".lora_B.weight";
    if (peft_name.starts_with(kPeftPrefix) && peft_name.ends_with(suffix) &&
        peft_name.size() > kPeftPrefix.size() + suffix.size())
      return LoraMatrix{peft_name.substr(kPeftPrefix.size(),
                                         peft_name.size() - kPeftPrefix.size() - suffix.size()),
                        is_a};
  }
  return std::nullopt;
}

std::vector<optim::NamedTensor> LoraModel::adapters() const {
  std::vector<optim::NamedTensor> out;
  for (const Layer& l : layers_) {
    out.push_back({kPeftPrefix + l.module_name + ".lora_A.weight", l.adapter->lora_a});
    out.push_back({kPeftPrefix + l.module_name + ".lora_B.weight", l.adapter->lora_b});
  }
  return out;
}

torch::Tensor LoraModel::delta(const Layer& l) const {
  torch::Tensor d = torch::mm(l.adapter->lora_b.to(torch::kFloat32),
                              l.adapter->lora_a.to(torch::kFloat32))
                        .mul(scaling());  // [out, in]
  return fan_in_fan_out_ || l.linear->layout == model::LinearImpl::Layout::InOut ? d.t() : d;
}

void LoraModel::refresh() {
  for (Layer& l : layers_) l.linear->adapter = l.adapter;
}

void LoraModel::detach() {
  for (Layer& l : layers_) l.linear->adapter.reset();
}

void LoraModel::merge() {
  torch::NoGradGuard no_grad;
  // A quantized base merges as it computes: dequantized, then the delta added.
  model::dequantize_linears(*model_);
  for (Layer& l : layers_) {
    torch::Tensor& weight = l.linear->weight;
    weight.copy_(weight.to(torch::kFloat32) + delta(l));
    l.linear->adapter.reset();
  }
  layers_.clear();
}

void LoraModel::load_adapters(const std::map<std::string, torch::Tensor>& tensors,
                              const std::string& source) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  for (const optim::NamedTensor& t : adapters()) {
    auto it = tensors.find(t.name);
    if (it == tensors.end())
      throw_invalid(source + ": adapter tensor \"" + t.name + "\" is missing",
                    "the adapter must have the same targets and rank as this run");
    if (it->second.sizes() != t.tensor.sizes())
      throw_invalid(source + ": adapter tensor \"" + t.name + "\" has shape " +
                    c10::str(it->second.sizes()) + ", expected " + c10::str(t.tensor.sizes()));
    torch::Tensor dst = t.tensor;
    dst.detach().copy_(it->second);
    used.insert(t.name);
  }
  for (const auto& [name, tensor] : tensors)
    if (!used.count(name))
      throw_invalid(source + ": unexpected adapter tensor \"" + name + "\"",
                    "the adapter must have the same targets and rank as this run");
}

nlohmann::json LoraModel::adapter_config(const std::string& base_model_name) const {
  std::string task = model_->head() == model::TaskHead::CausalLM ? "CAUSAL_LM"
                     : model_->head() == model::TaskHead::SequenceClassification
                         ? "SEQ_CLS"
                         : "FEATURE_EXTRACTION";
  return {{"peft_type", "LORA"},
          {"task_type", task},
          {"r", options_.rank},
          {"lora_alpha", options_.alpha},
          {"lora_dropout", options_.dropout},
          {"target_modules", options_.targets},
          {"base_model_name_or_path", base_model_name},
          {"bias", "none"},
          {"fan_in_fan_out", fan_in_fan_out_},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"modules_to_save", nullptr},
          {"use_rslora", false},
          {"use_dora", false},
          {"revision", nullptr}};
}

void LoraModel::save_adapter(const std::filesystem::path& dir, const std::string& base_model_name,
                             const std::vector<optim::NamedTensor>* weights) const {
  std::filesystem::create_directories(dir);
  write_safetensors_tensors(dir / "adapter_model.safetensors", weights ? *weights : adapters(),
                            true, {{"format", "pt"}});
  core::write_file_atomic(dir / "adapter_config.json",
                          adapter_config(base_model_name).dump(2) + "\n");
}

std::map<std::string, torch::Tensor> read_safetensors_tensors(const std::filesystem::path& file) {
  auto st = hf::SafetensorsFile::open(file);
  std::map<std::string, torch::Tensor> out;
  for (const hf::TensorInfo& info : st->tensors()) {
    torch::Dtype dtype;
    switch (info.dtype) {
      case hf::DType::F32:
        dtype = torch::kFloat32;
        break;
      case hf::DType::F16:
        dtype = torch::kFloat16;
        break;
      case hf::DType::BF16:
        dtype = torch::kBFloat16;
        break;
      case hf::DType::F64:
        dtype = torch::kFloat64;
        break;
      case hf::DType::I64:
        dtype = torch::kInt64;
        break;
      case hf::DType::I32:
        dtype = torch::kInt32;
        break;
      case hf::DType::U8:
        dtype = torch::kUInt8;
        break;
      default:
        throw_invalid(file.string() + ": tensor \"" + info.name + "\" has unsupported dtype " +
                      hf::dtype_name(info.dtype));
    }
    hf::TensorView view = st->view(info);
    torch::Tensor t = torch::from_blob(const_cast<std::uint8_t*>(view.bytes.data()), info.shape,
                                       torch::TensorOptions().dtype(dtype))
                          .clone();
    out.emplace(info.name, t.is_floating_point() ? t.to(torch::kFloat32) : t);
  }
  return out;
}

void write_safetensors_tensors(const std::filesystem::path& file,
                               std::vector<optim::NamedTensor> tensors, bool as_float32,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> keep;
  std::vector<hf::TensorToWrite> out;
  keep.reserve(tensors.size());
  for (const optim::NamedTensor& t : tensors) {
    torch::Tensor c = t.tensor.detach().to(torch::kCPU);
    if (as_float32 && c.is_floating_point()) c = c.to(torch::kFloat32);
    c = c.contiguous();
    hf::DType dtype;
    switch (c.scalar_type()) {
      case torch::kFloat32:
        dtype = hf::DType::F32;
        break;
      case torch::kBFloat16:
        dtype = hf::DType::BF16;
        break;
      case torch::kFloat16:
        dtype = hf::DType::F16;
        break;
      case torch::kInt64:
        dtype = hf::DType::I64;
        break;
      case torch::kUInt8:
        dtype = hf::DType::U8;
        break;
      default:
        throw Error(ErrorKind::Internal, "cannot write tensor \"" + t.name + "\" of dtype " +
                                             std::string(c10::toString(c.scalar_type())));
    }
    keep.push_back(c);
    out.push_back({t.name,
                   dtype,
                   c.sizes().vec(),
                   {static_cast<const std::uint8_t*>(c.data_ptr()), c.nbytes()}});
  }
  // Each tensor is dropped once written: with the caller's references gone too (`tensors` is
  // ours), memory-mapped sources (gemini's on-disk optimizer state) are unmapped one by one.
  hf::write_safetensors(file, out, metadata, [&](std::size_t i) {
    keep[i] = torch::Tensor();
    tensors[i].tensor = torch::Tensor();
  });
}

}  // namespace tessera::train
