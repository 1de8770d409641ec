// tessera-model-probe: loads a model folder with the engine and runs one forward pass, for the
// parity tests against transformers.
//
//   tessera-model-probe --model DIR [--dtype float32|bfloat16] [--device cpu|cuda] --input IN
//       --output OUT
//   tessera-model-probe --model DIR [--dtype …] --list-parameters
//
// IN is a safetensors file with `input_ids` [B, T] (I64 or I32) and optionally
// `attention_mask`, `labels`, `token_type_ids`. OUT is a safetensors file with F32 tensors
// `logits`, `hidden_states` and `loss` (shape []), each only when the model produced it.
// --device: where the model computes (default cpu; tests/gpu runs it on cuda).
// --list-parameters prints "name<TAB>shape" per parameter, in registration order.
#include <torch/torch.h>

#include <cstring>
#include <iostream>
#include <string>

#include "core/fatal_signals.h"
#include "core/error.h"
#include "hf/safetensors.h"
#include "model/model.h"

namespace {

using tessera::model::ForwardInput;

[[noreturn]] void usage(const std::string& why) {
  throw tessera::Error(
      tessera::ErrorKind::Usage, why,
      "usage: tessera-model-probe --model DIR [--dtype float32|bfloat16] [--device cpu|cuda] "
      "(--input IN.safetensors --output OUT.safetensors | --list-parameters)");
}

torch::Tensor read_integer_tensor(const tessera::hf::SafetensorsCheckpoint& file,
                                  const std::string& name) {
  const tessera::hf::TensorInfo& info = file.info(name);
  torch::Dtype dtype = torch::kInt64;
  if (info.dtype == tessera::hf::DType::I32)
    dtype = torch::kInt32;
  else if (info.dtype != tessera::hf::DType::I64)
    tessera::throw_invalid("input: tensor \"" + name + "\" must be I64 or I32, not " +
                           tessera::hf::dtype_name(info.dtype));
  tessera::hf::TensorView view = file.view(name);
  return torch::from_blob(const_cast<std::uint8_t*>(view.bytes.data()), info.shape,
                          torch::TensorOptions().dtype(dtype))
      .to(torch::kInt64);
}

struct OutputTensor {
  std::string name;
  torch::Tensor values;  // contiguous float32 on the CPU
};

int run(int argc, char** argv) {
  std::string model_dir, input_path, output_path, dtype_name = "float32", device_name = "cpu";
  bool list_parameters = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--model")
      model_dir = value();
    else if (arg == "--input")
      input_path = value();
    else if (arg == "--output")
      output_path = value();
    else if (arg == "--dtype")
      dtype_name = value();
    else if (arg == "--device")
      device_name = value();
    else if (arg == "--list-parameters")
      list_parameters = true;
    else
      usage("unknown argument \"" + arg + "\"");
  }
  if (model_dir.empty()) usage("--model is required");
  if (!list_parameters && (input_path.empty() || output_path.empty()))
    usage("--input and --output are required unless --list-parameters is given");

  const torch::Device device(device_name);  // "cpu", "cuda", "cuda:1"
  if (device.is_cuda() && !torch::cuda::is_available())
    tessera::throw_unsupported("--device " + device_name + ": no CUDA device is present");
  torch::NoGradGuard no_grad;
  auto model = tessera::model::load_pretrained(
      model_dir, tessera::model::dtype_from_string(dtype_name), device);
  if (list_parameters) {
    for (const auto& item : model->named_parameters()) {
      std::cout << item.key() << '\t' << item.value().sizes() << '\n';
    }
    return 0;
  }

  auto input = tessera::hf::SafetensorsCheckpoint::open(input_path);
  ForwardInput in;
  in.input_ids = read_integer_tensor(input, "input_ids").to(device);
  if (input.contains("attention_mask"))
    in.attention_mask = read_integer_tensor(input, "attention_mask").to(device);
  if (input.contains("labels")) in.labels = read_integer_tensor(input, "labels").to(device);
  if (input.contains("token_type_ids"))
    in.token_type_ids = read_integer_tensor(input, "token_type_ids").to(device);
  tessera::model::ForwardOutput out = model->forward(in);

  std::vector<OutputTensor> outputs;
  auto add = [&](const char* name, const torch::Tensor& t) {
    if (t.defined())
      outputs.push_back({name, t.detach().to(torch::kCPU, torch::kFloat32).contiguous()});
  };
  add("logits", out.logits);
  add("hidden_states", out.hidden_states);
  add("loss", out.loss);
  std::vector<tessera::hf::TensorToWrite> tensors;
  for (const auto& o : outputs) {
    tessera::hf::TensorToWrite w;
    w.name = o.name;
    w.dtype = tessera::hf::DType::F32;
    w.shape.assign(o.values.sizes().begin(), o.values.sizes().end());
    w.bytes = {reinterpret_cast<const std::uint8_t*>(o.values.data_ptr<float>()),
               static_cast<std::size_t>(o.values.numel()) * sizeof(float)};
    tensors.push_back(w);
  }
  tessera::hf::write_safetensors(output_path, tensors);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::core::report_fatal_signals("tessera-model-probe");
  try {
    return run(argc, argv);
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << '\n';
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << '\n';
    const auto kind = e.kind();
    return kind == tessera::ErrorKind::Io || kind == tessera::ErrorKind::Internal ? 1 : 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
}
