// tessera-quant-tool: test-only front end to engine/quant, so pytest can compare our 4-bit
// quantization with bitsandbytes' byte for byte.
//   tessera-quant-tool four-bit IN.safetensors OUT.safetensors nf4|fp4 BLOCKSIZE
//   tessera-quant-tool int8 IN.safetensors OUT.safetensors
//   tessera-quant-tool four-bit-nested IN.safetensors OUT.safetensors nf4|fp4 BLOCKSIZE BLOCKSIZE2
//     IN: a double-quantized 4-bit tensor as bitsandbytes stores it — packed (U8), qabsmax (U8),
//     code2 (F32, 256), absmax2 (F32), offset (F32, 1), count (I64, 1); OUT: absmax (F32, the
//     restored block scales) and dequantized (F32, count values).
//   tessera-quant-tool nested-absmax IN.safetensors OUT.safetensors BLOCKSIZE2
//     IN: absmax (F32, a 4-bit weight's block scales), offset (F32, 1: their mean) and code2
//     (F32, 256); OUT: qabsmax (U8) and absmax2 (F32), their double quantization.
// For each F32 tensor NAME of IN, OUT gets NAME.packed (U8) and NAME.absmax (F32), or for int8
// (2-D tensors) NAME.int8 (I8) and NAME.scb (F32, each row's absmax); and NAME.dequantized (F32,
// the shape of NAME), for 4-bit also NAME.dequantized_bf16 (BF16, dequantize_four_bit_bf16's). Exit
// codes: 0 ok, 2 bad input, 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "hf/safetensors.h"
#include "quant/four_bit.h"
#include "quant/int8_rows.h"

namespace {

namespace hf = tessera::hf;
namespace quant = tessera::quant;

// One tensor of the output: NAME + suffix.
struct Output {
  std::string suffix;
  hf::DType dtype = hf::DType::F32;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
};

template <typename T>
std::vector<std::uint8_t> raw(const std::vector<T>& v) {
  const auto* begin = reinterpret_cast<const std::uint8_t*>(v.data());
  return {begin, begin + v.size() * sizeof(T)};
}

// Quantizes each F32 tensor of `in` with `quantize` (its values → the outputs) into `out`.
using Quantizer = std::function<std::vector<Output>(const hf::TensorInfo&, std::vector<float>)>;
int quantize_file(const std::string& in, const std::string& out, const Quantizer& quantize) {
  const auto file = hf::SafetensorsFile::open(in);
  std::deque<Output> kept;  // stable addresses for the spans written below
  std::vector<hf::TensorToWrite> tensors;
  for (const hf::TensorInfo& info : file->tensors()) {
    if (info.dtype != hf::DType::F32)
      tessera::throw_invalid(info.name + ": only F32 tensors are quantized here");
    std::vector<float> values(info.numel());
    std::memcpy(values.data(), file->view(info).bytes.data(), values.size() * sizeof(float));
    for (Output& o : quantize(info, std::move(values))) {
      const Output& k = kept.emplace_back(std::move(o));
      tensors.push_back({info.name + k.suffix, k.dtype, k.shape, k.bytes});
    }
  }
  hf::write_safetensors(out, tensors);
  return 0;
}

std::vector<Output> four_bit(const hf::TensorInfo& info, const std::vector<float>& values,
                             quant::FourBitType type, std::int64_t blocksize) {
  std::vector<std::uint8_t> packed(quant::four_bit_packed_bytes(values.size()));
  std::vector<float> absmax(
      quant::four_bit_blocks(values.size(), static_cast<std::uint64_t>(blocksize)));
  std::vector<float> dequantized(values.size());
  quant::quantize_four_bit(values, type, blocksize, packed, absmax);
  quant::dequantize_four_bit(packed, absmax, type, blocksize, dequantized);
  std::vector<std::uint16_t> bf16(values.size());
  quant::dequantize_four_bit_bf16(packed, absmax, type, blocksize, bf16);
  return {{".packed", hf::DType::U8, {static_cast<std::int64_t>(packed.size())}, packed},
          {".absmax", hf::DType::F32, {static_cast<std::int64_t>(absmax.size())}, raw(absmax)},
          {".dequantized", hf::DType::F32, info.shape, raw(dequantized)},
          {".dequantized_bf16", hf::DType::BF16, info.shape, raw(bf16)}};
}

std::vector<Output> int8(const hf::TensorInfo& info, const std::vector<float>& values) {
  if (info.shape.size() != 2)
    tessera::throw_invalid(info.name + ": only 2-D tensors are quantized to int8 here");
  const std::int64_t rows = info.shape[0], cols = info.shape[1];
  std::vector<std::int8_t> q(values.size());
  std::vector<float> scb(static_cast<std::size_t>(rows));
  std::vector<float> dequantized(values.size());
  quant::quantize_int8_rows(values, rows, cols, q, scb);
  quant::dequantize_int8_rows(q, scb, rows, cols, dequantized);
  return {{".int8", hf::DType::I8, info.shape, raw(q)},
          {".scb", hf::DType::F32, {rows}, raw(scb)},
          {".dequantized", hf::DType::F32, info.shape, raw(dequantized)}};
}

template <typename T>
std::span<const T> typed(const hf::SafetensorsFile& file, const std::string& name,
                         hf::DType dtype) {
  const hf::TensorInfo* info = file.find(name);
  if (info == nullptr || info->dtype != dtype)
    tessera::throw_invalid(file.path().string() + ": no " + hf::dtype_name(dtype) + " tensor " +
                           name);
  const hf::TensorView view = file.view(*info);
  return {reinterpret_cast<const T*>(view.bytes.data()), view.bytes.size() / sizeof(T)};
}

int four_bit_nested(const std::string& in, const std::string& out, quant::FourBitType type,
                    std::int64_t blocksize, std::int64_t blocksize2) {
  const auto file = hf::SafetensorsFile::open(in);
  const auto qabsmax = typed<std::uint8_t>(*file, "qabsmax", hf::DType::U8);
  std::vector<float> absmax(qabsmax.size());
  quant::dequantize_nested_absmax(qabsmax, typed<float>(*file, "code2", hf::DType::F32),
                                  typed<float>(*file, "absmax2", hf::DType::F32), blocksize2,
                                  typed<float>(*file, "offset", hf::DType::F32)[0], absmax);
  std::vector<float> dequantized(
      static_cast<std::size_t>(typed<std::int64_t>(*file, "count", hf::DType::I64)[0]));
  quant::dequantize_four_bit(typed<std::uint8_t>(*file, "packed", hf::DType::U8), absmax, type,
                             blocksize, dequantized);
  const std::vector<std::uint8_t> absmax_bytes = raw(absmax), dequantized_bytes = raw(dequantized);
  hf::write_safetensors(
      out, {{"absmax", hf::DType::F32, {static_cast<std::int64_t>(absmax.size())}, absmax_bytes},
            {"dequantized",
             hf::DType::F32,
             {static_cast<std::int64_t>(dequantized.size())},
             dequantized_bytes}});
  return 0;
}

int nested_absmax(const std::string& in, const std::string& out, std::int64_t blocksize2) {
  const auto file = hf::SafetensorsFile::open(in);
  const auto absmax = typed<float>(*file, "absmax", hf::DType::F32);
  std::vector<std::uint8_t> q(absmax.size());
  std::vector<float> absmax2(
      quant::four_bit_blocks(absmax.size(), static_cast<std::uint64_t>(blocksize2)));
  quant::quantize_nested_absmax(absmax, typed<float>(*file, "offset", hf::DType::F32)[0],
                                typed<float>(*file, "code2", hf::DType::F32), blocksize2, q,
                                absmax2);
  const std::vector<std::uint8_t> absmax2_bytes = raw(absmax2);
  hf::write_safetensors(
      out,
      {{"qabsmax", hf::DType::U8, {static_cast<std::int64_t>(q.size())}, q},
       {"absmax2", hf::DType::F32, {static_cast<std::int64_t>(absmax2.size())}, absmax2_bytes}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 6 && std::string(argv[1]) == "four-bit") {
      const auto type = quant::parse_four_bit_type(argv[4], "quantization type");
      const std::int64_t blocksize = std::stoll(argv[5]);
      return quantize_file(argv[2], argv[3], [&](const hf::TensorInfo& info, std::vector<float> v) {
        return four_bit(info, v, type, blocksize);
      });
    }
    if (argc == 7 && std::string(argv[1]) == "four-bit-nested")
      return four_bit_nested(argv[2], argv[3],
                             quant::parse_four_bit_type(argv[4], "quantization type"),
                             std::stoll(argv[5]), std::stoll(argv[6]));
    if (argc == 5 && std::string(argv[1]) == "nested-absmax")
      return nested_absmax(argv[2], argv[3], std::stoll(argv[4]));
    if (argc == 4 && std::string(argv[1]) == "int8")
      return quantize_file(argv[2], argv[3], [](const hf::TensorInfo& info, std::vector<float> v) {
        return int8(info, v);
      });
    std::fprintf(stderr,
                 "usage: tessera-quant-tool four-bit IN.safetensors OUT.safetensors nf4|fp4 "
                 "BLOCKSIZE\n       tessera-quant-tool int8 IN.safetensors OUT.safetensors\n"
                 "       tessera-quant-tool four-bit-nested IN OUT nf4|fp4 BLOCKSIZE BLOCKSIZE2\n"
                 "       tessera-quant-tool nested-absmax IN OUT BLOCKSIZE2\n");
    return 2;
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera-quant-tool: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-quant-tool: %s\n", e.what());
    return 1;
  }
}
