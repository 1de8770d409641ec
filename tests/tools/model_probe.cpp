// tessera-model-probe: loads a model folder with the engine and runs one forward pass, for the
// parity tests against transformers.
//
//   tessera-model-probe --model DIR [--dtype float32|bfloat16] [--device cpu|cuda] --input IN
//       --output OUT
//   tessera-model-probe --model DIR [--dtype …] --list-parameters
//   tessera-model-probe --dequantize nf4|fp4|int8 [--double-quant] [--blocksize N]
//       [--device cpu|cuda] --input IN --output OUT
//
// IN is a safetensors file with `input_ids` [B, T] (I64 or I32) and optionally
// `attention_mask`, `labels`, `token_type_ids`. OUT is a safetensors file with F32 tensors
// `logits`, `hidden_states` and `loss` (shape []), each only when the model produced it.
// --device: where the model computes (default cpu; tests/gpu runs it on cuda).
// --list-parameters prints "name<TAB>shape" per parameter, in registration order.
// --dequantize quantizes IN's F32 `weight` [out, in] on the host and writes, for blocks of it
// (CASE: `whole`, `rows` from a row inside, `band` of columns where the format has them) and
// each DTYPE (float32, bfloat16, float16), F32 tensors CASE.DTYPE.PATH: PATH `cpu` the host's
// loops, `device` dequantize_block with the storage on --device (the CUDA kernel on a GPU),
// `device_into` the same into a reused buffer there, `ops` dequantize_block_with_ops there.
#include <torch/torch.h>

#include <cstring>
#include <iostream>
#include <string>

#include "core/error.h"
#include "core/fatal_signals.h"
#include "hf/safetensors.h"
#include "model/model.h"
#include "model/quantized_linear.h"

namespace {

using tessera::model::ForwardInput;

[[noreturn]] void usage(const std::string& why) {
  throw tessera::Error(
      tessera::ErrorKind::Usage, why,
      "usage: tessera-model-probe --model DIR [--dtype float32|bfloat16] [--device cpu|cuda] "
      "(--input IN.safetensors --output OUT.safetensors | --list-parameters), or "
      "tessera-model-probe --dequantize nf4|fp4|int8 [--double-quant] [--blocksize N] "
      "[--device cpu|cuda] --input IN.safetensors --output OUT.safetensors");
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

void write_outputs(const std::string& path, const std::vector<OutputTensor>& outputs) {
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
  tessera::hf::write_safetensors(path, tensors);
}

// --dequantize: the same blocks by the host's loops and on `device` (see the top of the file).
int dequantize_blocks(const std::string& format_name, bool double_quant, std::int64_t blocksize,
                      const torch::Device& device, const std::string& input_path,
                      const std::string& output_path) {
  namespace model = tessera::model;
  const model::QuantizedFormat format =
      model::quantized_format_from_name(format_name, "--dequantize");
  auto input = tessera::hf::SafetensorsCheckpoint::open(input_path);
  const tessera::hf::TensorInfo& info = input.info("weight");
  if (info.dtype != tessera::hf::DType::F32 || info.shape.size() != 2)
    tessera::throw_invalid(input_path + ": `weight` must be a 2-D F32 tensor");
  tessera::hf::TensorView view = input.view("weight");
  const torch::Tensor weight =
      torch::from_blob(const_cast<std::uint8_t*>(view.bytes.data()), info.shape, torch::kFloat32)
          .clone();
  const model::QuantizedWeight host(weight, format, blocksize, double_quant);
  model::QuantizedWeight moved(weight, format, blocksize, double_quant);
  moved.to(device);
  const bool four_bit = format != model::QuantizedFormat::Int8;
  const std::int64_t rows = host.out_features(), cols = host.in_features();
  struct Block {
    std::string name;
    std::int64_t first_row, end_row, first_col, end_col;
  };
  std::vector<Block> blocks{{"whole", 0, rows, 0, cols}};
  std::int64_t inside = 1;  // the first row after 0 that starts a 4-bit block
  while (four_bit && inside < rows && (inside * cols) % blocksize != 0) ++inside;
  if (inside < rows) blocks.push_back({"rows", inside, rows, 0, cols});
  if (host.column_bands()) {
    const std::int64_t first = four_bit ? blocksize : 3;
    const std::int64_t end = four_bit ? std::min(cols, 3 * blocksize) : cols - 2;
    if (first < end) blocks.push_back({"band", 0, rows, first, end});
  }
  const std::pair<const char*, torch::Dtype> dtypes[] = {
      {"float32", torch::kFloat32}, {"bfloat16", torch::kBFloat16}, {"float16", torch::kHalf}};
  std::vector<OutputTensor> outputs;
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    outputs.push_back({name, t.to(torch::kCPU, torch::kFloat32).contiguous()});
  };
  for (const Block& b : blocks) {
    for (const auto& [dtype_name, dtype] : dtypes) {
      const std::string prefix = b.name + "." + dtype_name + ".";
      add(prefix + "cpu",
          host.dequantize_block(b.first_row, b.end_row, b.first_col, b.end_col, dtype));
      add(prefix + "device",
          moved.dequantize_block(b.first_row, b.end_row, b.first_col, b.end_col, dtype));
      // A buffer larger than the block, as a layer reuses from tile to tile.
      const torch::Tensor buffer =
          torch::full({rows * cols + 64}, 7, torch::TensorOptions().dtype(dtype).device(device));
      add(prefix + "device_into",
          moved.dequantize_block(b.first_row, b.end_row, b.first_col, b.end_col, dtype, buffer));
      add(prefix + "ops",
          moved.dequantize_block_with_ops(b.first_row, b.end_row, b.first_col, b.end_col, dtype));
    }
  }
  write_outputs(output_path, outputs);
  return 0;
}

int run(int argc, char** argv) {
  std::string model_dir, input_path, output_path, dtype_name = "float32", device_name = "cpu";
  std::string dequantize;
  std::int64_t blocksize = 64;
  bool list_parameters = false, double_quant = false;
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
    else if (arg == "--dequantize")
      dequantize = value();
    else if (arg == "--double-quant")
      double_quant = true;
    else if (arg == "--blocksize")
      blocksize = std::stoll(value());
    else
      usage("unknown argument \"" + arg + "\"");
  }
  const torch::Device device(device_name);  // "cpu", "cuda", "cuda:1"
  if (device.is_cuda() && !torch::cuda::is_available())
    tessera::throw_unsupported("--device " + device_name + ": no CUDA device is present");
  if (!dequantize.empty()) {
    if (input_path.empty() || output_path.empty()) usage("--dequantize needs --input and --output");
    return dequantize_blocks(dequantize, double_quant, blocksize, device, input_path, output_path);
  }
  if (model_dir.empty()) usage("--model is required");
  if (!list_parameters && (input_path.empty() || output_path.empty()))
    usage("--input and --output are required unless --list-parameters is given");

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
  write_outputs(output_path, outputs);
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
