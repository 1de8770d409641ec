// tessera-quant-tool: test-only front end to engine/quant, so pytest can compare our 4-bit
// quantization with bitsandbytes' byte for byte.
//   tessera-quant-tool four-bit IN.safetensors OUT.safetensors nf4|fp4 BLOCKSIZE
//   tessera-quant-tool int8 IN.safetensors OUT.safetensors
// For each F32 tensor NAME of IN, OUT gets NAME.packed (U8) and NAME.absmax (F32), or for int8
// (2-D tensors) NAME.int8 (I8) and NAME.scb (F32, each row's absmax); and NAME.dequantized (F32,
// the shape of NAME). Exit codes: 0 ok, 2 bad input, 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/error.h"
#include "hf/safetensors.h"
#include "quant/four_bit.h"
#include "quant/int8_rows.h"

namespace {

namespace hf = tessera::hf;
namespace quant = tessera::quant;

template <typename T>
std::span<const std::uint8_t> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(T)};
}

int four_bit(const std::string& in, const std::string& out, const std::string& type_name,
             std::int64_t blocksize) {
  const auto type = quant::parse_four_bit_type(type_name, "quantization type");
  const auto file = hf::SafetensorsFile::open(in);
  struct Result {
    std::vector<std::uint8_t> packed;
    std::vector<float> absmax;
    std::vector<float> dequantized;
  };
  std::vector<Result> results;
  results.reserve(file->tensors().size());
  std::vector<hf::TensorToWrite> tensors;
  for (const hf::TensorInfo& info : file->tensors()) {
    if (info.dtype != hf::DType::F32)
      tessera::throw_invalid(info.name + ": only F32 tensors are quantized here");
    const hf::TensorView view = file->view(info);
    const std::size_t count = info.numel();
    std::vector<float> values(count);
    std::memcpy(values.data(), view.bytes.data(), count * sizeof(float));
    Result& r = results.emplace_back();
    r.packed.resize(quant::four_bit_packed_bytes(count));
    r.absmax.resize(quant::four_bit_blocks(count, static_cast<std::uint64_t>(blocksize)));
    r.dequantized.resize(count);
    quant::quantize_four_bit(values, type, blocksize, r.packed, r.absmax);
    quant::dequantize_four_bit(r.packed, r.absmax, type, blocksize, r.dequantized);
    tensors.push_back({info.name + ".packed",
                       hf::DType::U8,
                       {static_cast<std::int64_t>(r.packed.size())},
                       bytes_of(r.packed)});
    tensors.push_back({info.name + ".absmax",
                       hf::DType::F32,
                       {static_cast<std::int64_t>(r.absmax.size())},
                       bytes_of(r.absmax)});
    tensors.push_back(
        {info.name + ".dequantized", hf::DType::F32, info.shape, bytes_of(r.dequantized)});
  }
  hf::write_safetensors(out, tensors);
  return 0;
}

int int8(const std::string& in, const std::string& out) {
  const auto file = hf::SafetensorsFile::open(in);
  struct Result {
    std::vector<std::int8_t> q;
    std::vector<float> scb;
    std::vector<float> dequantized;
  };
  std::vector<Result> results;
  results.reserve(file->tensors().size());
  std::vector<hf::TensorToWrite> tensors;
  for (const hf::TensorInfo& info : file->tensors()) {
    if (info.dtype != hf::DType::F32 || info.shape.size() != 2)
      tessera::throw_invalid(info.name + ": only 2-D F32 tensors are quantized to int8 here");
    const std::int64_t rows = info.shape[0], cols = info.shape[1];
    const std::size_t count = info.numel();
    std::vector<float> values(count);
    std::memcpy(values.data(), file->view(info).bytes.data(), count * sizeof(float));
    Result& r = results.emplace_back();
    r.q.resize(count);
    r.scb.resize(static_cast<std::size_t>(rows));
    r.dequantized.resize(count);
    quant::quantize_int8_rows(values, rows, cols, r.q, r.scb);
    quant::dequantize_int8_rows(r.q, r.scb, rows, cols, r.dequantized);
    tensors.push_back({info.name + ".int8", hf::DType::I8, info.shape, bytes_of(r.q)});
    tensors.push_back({info.name + ".scb", hf::DType::F32, {rows}, bytes_of(r.scb)});
    tensors.push_back(
        {info.name + ".dequantized", hf::DType::F32, info.shape, bytes_of(r.dequantized)});
  }
  hf::write_safetensors(out, tensors);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 6 && std::string(argv[1]) == "four-bit")
      return four_bit(argv[2], argv[3], argv[4], std::stoll(argv[5]));
    if (argc == 4 && std::string(argv[1]) == "int8") return int8(argv[2], argv[3]);
    std::fprintf(stderr,
                 "usage: tessera-quant-tool four-bit IN.safetensors OUT.safetensors nf4|fp4 "
                 "BLOCKSIZE\n       tessera-quant-tool int8 IN.safetensors OUT.safetensors\n");
    return 2;
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera-quant-tool: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-quant-tool: %s\n", e.what());
    return 1;
  }
}
