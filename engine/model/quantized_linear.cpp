#include "model/quantized_linear.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <span>

#include "core/error.h"
#include "core/parallel.h"
#include "model/layers.h"
#include "model/model.h"
#include "quant/four_bit.h"
#include "quant/int8_rows.h"

namespace tessera::model {
namespace {

bool is_four_bit(QuantizedFormat format) {
  return format != QuantizedFormat::Int8;
}

quant::FourBitType four_bit_type(QuantizedFormat format) {
  return format == QuantizedFormat::NF4 ? quant::FourBitType::NF4 : quant::FourBitType::FP4;
}

// Values per piece of a parallel quantization or dequantization (a multiple of every block).
constexpr std::int64_t kGrainValues = std::int64_t{1} << 16;

template <typename T>
std::span<T> span_of(const torch::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), static_cast<std::size_t>(t.numel())};
}

// y = x·Wᵀ + b with W's rows dequantized a tile at a time, in forward and again in backward.
class QuantizedMatmul : public torch::autograd::Function<QuantizedMatmul> {
 public:
  // `bias` is optional: autograd takes no undefined tensor as an input.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const std::optional<torch::Tensor>& bias,
                               const QuantizedWeight* weight) {
    ctx->saved_data["weight"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(weight));
    ctx->saved_data["has_bias"] = bias.has_value();
    const std::int64_t out = weight->out_features(), tile = weight->tile_rows();
    std::vector<torch::Tensor> pieces;
    for (std::int64_t first = 0; first < out; first += tile) {
      const std::int64_t end = std::min(out, first + tile);
      pieces.push_back(
          torch::linear(x, weight->dequantize_rows(first, end, x.scalar_type()),
                        bias ? std::optional<torch::Tensor>(bias->slice(0, first, end)) : bias));
    }
    return pieces.size() == 1 ? pieces.front() : torch::cat(pieces, -1);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto* weight = reinterpret_cast<const QuantizedWeight*>(
        static_cast<std::intptr_t>(ctx->saved_data["weight"].toInt()));
    const torch::Tensor& gy = grads.at(0);
    const std::int64_t out = weight->out_features(), tile = weight->tile_rows();
    // gx = gy·W summed over the tiles of W's rows. With several tiles, below float32 the partial
    // sums add up in float32 (one matmul accumulates so), cast once at the end, and each tile's
    // slice of gy is made contiguous: a strided bf16 operand leaves the fast GEMM.
    const bool whole = tile >= out;
    torch::Tensor gx;
    for (std::int64_t first = 0; first < out; first += tile) {
      const std::int64_t end = std::min(out, first + tile);
      const torch::Tensor rows = weight->dequantize_rows(first, end, gy.scalar_type());
      if (whole) {
        gx = torch::matmul(gy, rows);
        break;
      }
      const torch::Tensor part =
          torch::matmul(gy.narrow(-1, first, end - first).contiguous(), rows).to(torch::kFloat32);
      gx = gx.defined() ? gx.add_(part) : part;
    }
    gx = gx.to(gy.scalar_type());
    torch::Tensor gbias;
    if (ctx->saved_data["has_bias"].toBool()) gbias = gy.reshape({-1, out}).sum(0);
    return {gx, gbias, torch::Tensor()};
  }
};

}  // namespace

QuantizedFormat quantized_format_from_name(const std::string& name, const std::string& field) {
  if (name == "nf4") return QuantizedFormat::NF4;
  if (name == "fp4") return QuantizedFormat::FP4;
  if (name == "int8") return QuantizedFormat::Int8;
  throw_invalid(field + ": \"" + name + "\" is not a quantized format", "use nf4, fp4 or int8");
}

QuantizedWeight::QuantizedWeight(const torch::Tensor& weight, QuantizedFormat format,
                                 std::int64_t blocksize)
    : format_(format), blocksize_(blocksize) {
  if (weight.dim() != 2)
    throw Error(ErrorKind::Internal, "QuantizedWeight: the weight must be [out, in]");
  out_features_ = weight.size(0);
  in_features_ = weight.size(1);
  // bitsandbytes quantizes LLM.int8's weights from their float16 values (Int8Params).
  const torch::Tensor dense =
      (format == QuantizedFormat::Int8 ? weight.to(torch::kCPU, torch::kHalf) : weight)
          .to(torch::kCPU, torch::kFloat32)
          .contiguous();
  const std::int64_t count = dense.numel();
  const std::span<const float> values = span_of<const float>(dense);
  if (is_four_bit(format_)) {
    codes_ = torch::empty({static_cast<std::int64_t>(quant::four_bit_packed_bytes(count))},
                          torch::kUInt8);
    scales_ = torch::empty({static_cast<std::int64_t>(quant::four_bit_blocks(
                               count, static_cast<std::uint64_t>(blocksize)))},
                           torch::kFloat32);
    // Pieces of whole blocks (and an even count of values, two to a byte) quantize apart.
    const std::int64_t grain = std::lcm(kGrainValues, blocksize);
    const std::span<std::uint8_t> packed = span_of<std::uint8_t>(codes_);
    const std::span<float> absmax = span_of<float>(scales_);
    const std::int64_t pieces = (count + grain - 1) / grain;
    core::parallel_for(pieces, 1, at::get_num_threads(), [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p) {
        const std::int64_t begin = p * grain, end = std::min(count, begin + grain);
        const auto n = static_cast<std::size_t>(end - begin);
        quant::quantize_four_bit(
            values.subspan(static_cast<std::size_t>(begin), n), four_bit_type(format_), blocksize,
            packed.subspan(static_cast<std::size_t>(begin / 2), quant::four_bit_packed_bytes(n)),
            absmax.subspan(static_cast<std::size_t>(begin / blocksize),
                           quant::four_bit_blocks(n, static_cast<std::uint64_t>(blocksize))));
      }
    });
    // Tiles start on block boundaries: rows × in a multiple of the block size.
    const std::int64_t unit = blocksize / std::gcd(in_features_, blocksize);
    tile_rows_ =
        std::max<std::int64_t>(1, kTileElements / std::max<std::int64_t>(1, in_features_ * unit)) *
        unit;
  } else {
    codes_ = torch::empty({out_features_, in_features_}, torch::kInt8);
    scales_ = torch::empty({out_features_}, torch::kFloat32);
    const std::span<std::int8_t> q = span_of<std::int8_t>(codes_);
    const std::span<float> absmax = span_of<float>(scales_);
    const std::int64_t cols = in_features_;
    core::parallel_for(
        out_features_, std::max<std::int64_t>(1, kGrainValues / std::max<std::int64_t>(1, cols)),
        at::get_num_threads(), [&](std::int64_t r0, std::int64_t r1) {
          const auto at = static_cast<std::size_t>(r0 * cols);
          const auto n = static_cast<std::size_t>((r1 - r0) * cols);
          quant::quantize_int8_rows(
              values.subspan(at, n), r1 - r0, cols, q.subspan(at, n),
              absmax.subspan(static_cast<std::size_t>(r0), static_cast<std::size_t>(r1 - r0)));
        });
    tile_rows_ = std::max<std::int64_t>(1, kTileElements / std::max<std::int64_t>(1, in_features_));
  }
}

torch::Tensor QuantizedWeight::dequantize_rows(std::int64_t first, std::int64_t end,
                                               torch::Dtype dtype) const {
  if (first < 0 || end > out_features_ || first > end)
    throw Error(ErrorKind::Internal, "QuantizedWeight: rows out of range");
  torch::Tensor out = torch::empty({end - first, in_features_}, torch::kFloat32);
  const std::span<float> dest = span_of<float>(out);
  const std::int64_t begin = first * in_features_, count = (end - first) * in_features_;
  if (is_four_bit(format_)) {
    if (begin % blocksize_ != 0)
      throw Error(ErrorKind::Internal, "QuantizedWeight: rows do not start on a block");
    const std::span<const std::uint8_t> packed = span_of<const std::uint8_t>(codes_);
    const std::span<const float> absmax = span_of<const float>(scales_);
    const std::int64_t grain = std::lcm(kGrainValues, blocksize_);
    core::parallel_for(
        (count + grain - 1) / grain, 1, at::get_num_threads(),
        [&](std::int64_t p0, std::int64_t p1) {
          for (std::int64_t p = p0; p < p1; ++p) {
            const std::int64_t at = p * grain, n = std::min(count, at + grain) - at;
            const std::int64_t global = begin + at;
            const auto codes =
                packed.subspan(static_cast<std::size_t>(global / 2),
                               quant::four_bit_packed_bytes(static_cast<std::uint64_t>(n)));
            const auto scales =
                absmax.subspan(static_cast<std::size_t>(global / blocksize_),
                               quant::four_bit_blocks(static_cast<std::uint64_t>(n),
                                                      static_cast<std::uint64_t>(blocksize_)));
            quant::dequantize_four_bit(
                codes, scales, four_bit_type(format_), blocksize_,
                dest.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(n)));
          }
        });
  } else {
    const std::span<const std::int8_t> q = span_of<const std::int8_t>(codes_);
    const std::span<const float> absmax = span_of<const float>(scales_);
    const std::int64_t cols = in_features_;
    core::parallel_for(end - first,
                       std::max<std::int64_t>(1, kGrainValues / std::max<std::int64_t>(1, cols)),
                       at::get_num_threads(), [&](std::int64_t r0, std::int64_t r1) {
                         const auto at = static_cast<std::size_t>((first + r0) * cols);
                         const auto n = static_cast<std::size_t>((r1 - r0) * cols);
                         quant::dequantize_int8_rows(
                             q.subspan(at, n),
                             absmax.subspan(static_cast<std::size_t>(first + r0),
                                            static_cast<std::size_t>(r1 - r0)),
                             r1 - r0, cols, dest.subspan(static_cast<std::size_t>(r0 * cols), n));
                       });
  }
  return out.scalar_type() == dtype ? out : out.to(dtype);
}

torch::Tensor QuantizedWeight::linear(const torch::Tensor& x, const torch::Tensor& bias) const {
  return QuantizedMatmul::apply(
      x, bias.defined() ? std::optional<torch::Tensor>(bias) : std::nullopt, this);
}

std::uint64_t QuantizedWeight::bytes() const {
  return static_cast<std::uint64_t>(codes_.nbytes() + scales_.nbytes());
}

namespace {

std::string last_component(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

template <typename Visit>
void for_each_linear(const PretrainedModel& model, Visit visit) {
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value()))
      visit(item.key(), *linear);
}

}  // namespace

std::vector<std::string> quantize_linears(PretrainedModel& model, const DeferredWeights* weights,
                                          const QuantizeOptions& options) {
  std::vector<std::string> names;
  torch::NoGradGuard no_grad;
  for_each_linear(model, [&](const std::string& module, LinearImpl& linear) {
    if (std::find(options.keep_dense.begin(), options.keep_dense.end(), last_component(module)) !=
        options.keep_dense.end())
      return;
    if (linear.quantized) return;
    if (linear.layout != LinearImpl::Layout::OutIn)
      throw_unsupported(module +
                            ": quantizing a weight stored [in, out] (GPT-2's Conv1D) is not "
                            "supported yet",
                        "quantize a llama, mistral or qwen2 model, or train LoRA without "
                        "method.quantize");
    const std::string name = module + ".weight";
    torch::Tensor dense = linear.weight;
    if (weights != nullptr) {
      dense = torch::empty(linear.weight.sizes(), torch::kFloat32);
      weights->read_into(name, dense);
    }
    linear.quantized = std::make_shared<QuantizedWeight>(dense, options.format, options.blocksize);
    // The parameter stays registered (its name is the checkpoint's), empty: nothing reserves or
    // converts a dense copy.
    linear.weight.set_data(torch::empty({0}, linear.weight.options()));
    linear.weight.set_requires_grad(false);
    names.push_back(name);
  });
  return names;
}

std::set<std::string> quantized_weight_names(const PretrainedModel& model) {
  std::set<std::string> names;
  for_each_linear(model, [&](const std::string& module, LinearImpl& linear) {
    if (linear.quantized) names.insert(module + ".weight");
  });
  return names;
}

std::uint64_t quantized_weight_bytes(const PretrainedModel& model) {
  std::uint64_t bytes = 0;
  for_each_linear(model, [&](const std::string&, LinearImpl& linear) {
    if (linear.quantized) bytes += linear.quantized->bytes();
  });
  return bytes;
}

void copy_dequantized_weights(const PretrainedModel& from, PretrainedModel& to) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> targets;
  for (const auto& p : to.named_parameters()) targets.emplace(p.key(), p.value());
  for_each_linear(from, [&](const std::string& module, LinearImpl& linear) {
    if (!linear.quantized) return;
    auto it = targets.find(module + ".weight");
    const QuantizedWeight& q = *linear.quantized;
    if (it == targets.end() || it->second.dim() != 2 || it->second.size(0) != q.out_features() ||
        it->second.size(1) != q.in_features())
      throw Error(ErrorKind::Internal,
                  module + ".weight: no dense parameter of its shape to copy into");
    it->second.copy_(q.dequantize());
  });
}

void dequantize_linears(PretrainedModel& model) {
  torch::NoGradGuard no_grad;
  for_each_linear(model, [&](const std::string&, LinearImpl& linear) {
    if (!linear.quantized) return;
    linear.weight.set_data(
        linear.quantized->dequantize().to(linear.weight.device(), linear.weight.scalar_type()));
    linear.quantized.reset();
  });
}

}  // namespace tessera::model
