#include "model/quantized_linear.h"

#include <ATen/TensorIterator.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <span>

#include "core/error.h"
#include "core/parallel.h"
#include "cuda/runtime.h"
#include "hf/config.h"
#include "hf/safetensors.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/module_names.h"
#include "quant/four_bit.h"
#include "quant/int8_rows.h"

namespace tessera::model {
namespace {

quant::FourBitType four_bit_type(QuantizedFormat format) {
  return format == QuantizedFormat::NF4 ? quant::FourBitType::NF4 : quant::FourBitType::FP4;
}

// Values per piece of a parallel quantization or dequantization (a multiple of every block).
constexpr std::int64_t kGrainValues = std::int64_t{1} << 16;

// Runs body(begin, end) over [0, count) on torch's own intra-op threads. Our thread pool
// (core::parallel_for) would compete there with torch's OpenMP workers, which spin for a while
// after each of the matmuls this layer alternates with: on 2 cores a dequantization spread over
// our pool ran slower than on one thread. A TensorIterator's for_each runs its loop inside
// torch's parallel_for (compiled with its OpenMP), here over one byte per piece.
void on_torch_threads(std::int64_t count,
                      const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (count <= 0) return;
  torch::Tensor pieces = torch::empty({count}, torch::kUInt8);
  const char* first = static_cast<const char*>(pieces.data_ptr());
  at::TensorIterator iter = at::TensorIterator::nullary_op(pieces);
  // A 2-D loop: the 1-D form's adapter trips -Wmaybe-uninitialized inside torch's headers. A
  // nullary iterator over one dimension gives size1 = 1.
  iter.for_each(
      [&](char** data, const std::int64_t* strides, std::int64_t size0, std::int64_t size1) {
        for (std::int64_t j = 0; j < size1; ++j) {
          const std::int64_t begin = data[0] + j * strides[1] - first;
          body(begin, begin + size0);
        }
      },
      /*grain_size=*/1);
}

template <typename T>
std::span<T> span_of(const torch::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), static_cast<std::size_t>(t.numel())};
}

// The buffer a tile's dequantized weight goes into: one per thread, reused by every tile of
// every layer (a fresh tensor a tile costs its pages' faults and unmapping, more than the
// dequantization itself). Each tile is consumed by its matmul before the next is written.
// On a GPU each tile is a new tensor from the caching allocator, which reuses its blocks.
torch::Tensor tile_buffer(const QuantizedWeight& weight, std::int64_t bytes) {
  if (!weight.device().is_cpu()) return {};
  thread_local torch::Tensor buffer;
  if (!buffer.defined() || buffer.nbytes() < static_cast<std::size_t>(bytes))
    buffer = torch::empty({bytes}, torch::kUInt8);
  return buffer;
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
    if (x.device() != weight->device())
      throw Error(ErrorKind::Internal, "QuantizedWeight: the weight is on " +
                                           weight->device().str() + ", its input on " +
                                           x.device().str());
    const std::int64_t out = weight->out_features(), tile = weight->tile_rows();
    const torch::Tensor buffer =
        tile_buffer(*weight, std::min(tile, out) * weight->in_features() *
                                 static_cast<std::int64_t>(x.element_size()));
    std::vector<torch::Tensor> pieces;
    for (std::int64_t first = 0; first < out; first += tile) {
      const std::int64_t end = std::min(out, first + tile);
      pieces.push_back(
          torch::linear(x, weight->dequantize_rows(first, end, x.scalar_type(), buffer),
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
    torch::Tensor gx;
    if (weight->column_bands()) {
      // gx = gy·W a band of W's columns at a time: each band of gx is one matmul over every
      // output feature, written once (no partial sums).
      const std::int64_t in = weight->in_features(), band = weight->band_columns();
      const torch::Tensor buffer = tile_buffer(
          *weight, out * std::min(band, in) * static_cast<std::int64_t>(gy.element_size()));
      std::vector<torch::Tensor> pieces;
      for (std::int64_t first = 0; first < in; first += band)
        pieces.push_back(
            torch::matmul(gy, weight->dequantize_columns(first, std::min(in, first + band),
                                                         gy.scalar_type(), buffer)));
      gx = pieces.size() == 1 ? pieces.front() : torch::cat(pieces, -1);
    } else {
      // Otherwise (4-bit blocks that straddle rows) gx = gy·W summed over the tiles of W's
      // rows. With several tiles, below float32 the partial sums add up in float32 (one matmul
      // accumulates so), cast once at the end, and each tile's slice of gy is made contiguous: a
      // strided bf16 operand leaves the fast GEMM.
      const bool whole = tile >= out;
      const torch::Tensor buffer =
          tile_buffer(*weight, std::min(tile, out) * weight->in_features() *
                                   static_cast<std::int64_t>(gy.element_size()));
      for (std::int64_t first = 0; first < out; first += tile) {
        const std::int64_t end = std::min(out, first + tile);
        const torch::Tensor rows = weight->dequantize_rows(first, end, gy.scalar_type(), buffer);
        if (whole) {
          gx = torch::matmul(gy, rows);
          break;
        }
        const torch::Tensor part =
            torch::matmul(gy.narrow(-1, first, end - first).contiguous(), rows).to(torch::kFloat32);
        gx = gx.defined() ? gx.add_(part) : part;
      }
      gx = gx.to(gy.scalar_type());
    }
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

torch::Tensor dynamic_quant_map() {
  // As bitsandbytes builds it (signed, 7 exponent bits of 8): for each exponent i, the midpoints
  // of 2^i + 1 points spread evenly over [0.1, 1], scaled by 10^(i - 6), with both signs; then
  // 0 and 1, sorted. The same torch ops in float32, so the same values.
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const torch::Tensor bounds = torch::linspace(0.1, 1.0, (1 << i) + 1, torch::kFloat32);
    const torch::Tensor means = (bounds.slice(0, 0, -1) + bounds.slice(0, 1)) / 2.0;
    const double scale = i == 6 ? 1.0 : std::pow(10.0, i - 6);
    for (const torch::Tensor& part : {means * scale, means * -scale}) {
      const float* v = part.contiguous().data_ptr<float>();
      data.insert(data.end(), v, v + part.numel());
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  return torch::tensor(data, torch::kFloat32);
}

QuantizedWeight::QuantizedWeight(QuantizedFormat format, std::int64_t out_features,
                                 std::int64_t in_features, std::int64_t blocksize,
                                 torch::Tensor codes, torch::Tensor scales,
                                 std::optional<NestedAbsmax> nested, const std::string& source)
    : format_(format),
      out_features_(out_features),
      in_features_(in_features),
      blocksize_(blocksize),
      codes_(std::move(codes)),
      scales_(std::move(scales)),
      nested_(std::move(nested)) {
  const auto fail = [&](const std::string& what) {
    throw_invalid(source + ": " + what,
                  "the checkpoint does not match config.json; re-download or re-save it");
  };
  const std::int64_t count = out_features * in_features;
  if (is_four_bit_format()) {
    if (blocksize <= 0 || (blocksize & (blocksize - 1)) != 0)
      fail("blocksize " + std::to_string(blocksize) + " is not a power of two");
    const auto blocks = static_cast<std::int64_t>(quant::four_bit_blocks(
        static_cast<std::uint64_t>(count), static_cast<std::uint64_t>(blocksize)));
    if (codes_.scalar_type() != torch::kUInt8 ||
        codes_.numel() != static_cast<std::int64_t>(
                              quant::four_bit_packed_bytes(static_cast<std::uint64_t>(count))))
      fail("the packed 4-bit codes hold " + std::to_string(codes_.numel()) + " bytes, not the " +
           std::to_string((count + 1) / 2) + " of a [" + std::to_string(out_features) + ", " +
           std::to_string(in_features) + "] weight");
    if (nested_) {
      const NestedAbsmax& n = *nested_;
      if (n.codes.scalar_type() != torch::kUInt8 || n.codes.numel() != blocks ||
          n.code.numel() != 256 || n.blocksize <= 0 ||
          n.scales.numel() != (blocks + n.blocksize - 1) / n.blocksize)
        fail("the double-quantized absmax (" + std::to_string(n.codes.numel()) + " codes, " +
             std::to_string(n.scales.numel()) + " scales) do not fit " + std::to_string(blocks) +
             " blocks of " + std::to_string(blocksize));
      scales_ = torch::Tensor();
    } else if (scales_.scalar_type() != torch::kFloat32 || scales_.numel() != blocks) {
      fail("absmax holds " + std::to_string(scales_.numel()) + " values, not the " +
           std::to_string(blocks) + " of blocks of " + std::to_string(blocksize));
    }
  } else {
    if (codes_.scalar_type() != torch::kInt8 || codes_.numel() != count)
      fail("the int8 weight holds " + std::to_string(codes_.numel()) + " values, not " +
           std::to_string(count));
    if (scales_.scalar_type() != torch::kFloat32 || scales_.numel() != out_features)
      fail("SCB holds " + std::to_string(scales_.numel()) + " values, not one per row (" +
           std::to_string(out_features) + ")");
  }
  codes_ =
      codes_.reshape(is_four_bit_format() ? std::vector<std::int64_t>{codes_.numel()}
                                          : std::vector<std::int64_t>{out_features, in_features});
  set_tile_rows();
}

namespace {

// `extent` (rows or columns) split into as few equal parts as keep each part's values (`across`
// a row or column) near `elements`, each a multiple of `unit`. Equal parts, because a short last
// tile is a thin matmul: on the CPU a bf16 matmul over a band of 128 columns or a tile of 186 rows
// took about twice its share of the whole one (TinyLlama's MLP shapes, 256 tokens).
std::int64_t equal_parts(std::int64_t extent, std::int64_t across, std::int64_t unit,
                         std::int64_t elements) {
  const std::int64_t units = (extent + unit - 1) / unit;
  const std::int64_t per_part =
      std::max<std::int64_t>(1, elements / std::max<std::int64_t>(1, across * unit));
  const std::int64_t parts = (units + per_part - 1) / per_part;
  return std::min(extent, (units + parts - 1) / parts * unit);
}

}  // namespace

std::int64_t QuantizedWeight::band_columns() const {
  return equal_parts(in_features_, out_features_, is_four_bit_format() ? blocksize_ : 1,
                     tile_elements_);
}

void QuantizedWeight::set_tile_elements(std::int64_t elements) {
  tile_elements_ = std::max<std::int64_t>(1, elements);
  set_tile_rows();
}

void QuantizedWeight::set_tile_rows() {
  // 4-bit tiles start on block boundaries: rows × in a multiple of the block size.
  const std::int64_t unit =
      is_four_bit_format() ? blocksize_ / std::gcd(in_features_, blocksize_) : 1;
  tile_rows_ = equal_parts(out_features_, in_features_, unit, tile_elements_);
}

void QuantizedWeight::double_quantize() {
  NestedAbsmax n;
  n.blocksize = 256;
  // The mean as torch takes it (bitsandbytes: absmax.mean()), so the offset is the same float.
  n.offset = scales_.mean().item<float>();
  n.code = dynamic_quant_map();
  n.codes = torch::empty({scales_.numel()}, torch::kUInt8);
  n.scales = torch::empty({(scales_.numel() + n.blocksize - 1) / n.blocksize}, torch::kFloat32);
  quant::quantize_nested_absmax(span_of<const float>(scales_), n.offset,
                                span_of<const float>(n.code), n.blocksize,
                                span_of<std::uint8_t>(n.codes), span_of<float>(n.scales));
  nested_ = std::move(n);
  scales_ = torch::Tensor();
}

QuantizedWeight::QuantizedWeight(const torch::Tensor& weight, QuantizedFormat format,
                                 std::int64_t blocksize, bool double_quant)
    : QuantizedWeight(
          weight.dim() == 2 ? weight.size(0) : -1, weight.dim() == 2 ? weight.size(1) : -1,
          [&weight](std::int64_t first_row, const torch::Tensor& rows) {
            rows.copy_(weight.narrow(0, first_row, rows.size(0)));
          },
          format, blocksize, double_quant) {}

QuantizedWeight::QuantizedWeight(std::int64_t out_features, std::int64_t in_features,
                                 const RowReader& read, QuantizedFormat format,
                                 std::int64_t blocksize, bool double_quant)
    : format_(format),
      out_features_(out_features),
      in_features_(in_features),
      blocksize_(blocksize) {
  if (out_features < 0 || in_features < 0)
    throw Error(ErrorKind::Internal, "QuantizedWeight: the weight must be [out, in]");
  const std::int64_t count = out_features_ * in_features_;
  // A band of rows at a time, in one float32 buffer reused from band to band: a checkpoint's
  // weight is never whole in float32 (a 5632 × 2048 MLP weight would be a 44 MiB transient per
  // matrix, whose holes stayed in the heap). A band starts on a 4-bit block, so the blocks and
  // their absmax are those of the whole weight.
  // (A block size quantize_four_bit refuses gets a unit of 1 and its error there.)
  const std::int64_t unit =
      is_four_bit_format() && blocksize_ > 0
          ? std::max<std::int64_t>(1, blocksize_ / std::gcd(in_features_, blocksize_))
          : 1;
  const std::int64_t band_rows = std::clamp<std::int64_t>(
      quant::kQuantizeBandValues / std::max<std::int64_t>(1, in_features_) / unit * unit, unit,
      std::max<std::int64_t>(unit, out_features_));
  if (is_four_bit_format()) {
    codes_ = torch::empty({static_cast<std::int64_t>(quant::four_bit_packed_bytes(count))},
                          torch::kUInt8);
    scales_ = torch::empty({static_cast<std::int64_t>(quant::four_bit_blocks(
                               count, static_cast<std::uint64_t>(blocksize)))},
                           torch::kFloat32);
  } else {
    codes_ = torch::empty({out_features_, in_features_}, torch::kInt8);
    scales_ = torch::empty({out_features_}, torch::kFloat32);
  }
  // After the codes and scales, so that the heap's top frees it (an earlier band left a hole
  // below every weight's codes: 130 MiB of a 1.1B llama's load).
  torch::Tensor band =
      torch::empty({std::min(band_rows, out_features_), in_features_}, torch::kFloat32);
  for (std::int64_t r0 = 0; r0 < out_features_; r0 += band_rows) {
    const torch::Tensor rows = band.narrow(0, 0, std::min(band_rows, out_features_ - r0));
    read(r0, rows);
    quantize_band(r0, rows);
  }
  if (is_four_bit_format() && double_quant) double_quantize();
  set_tile_rows();
}

// Rows [first_row, first_row + rows.size(0)) of the weight, float32, into the codes and scales.
void QuantizedWeight::quantize_band(std::int64_t first_row, const torch::Tensor& rows) {
  const std::int64_t cols = in_features_;
  const std::int64_t first = first_row * cols;  // on a block boundary (4-bit)
  if (is_four_bit_format()) {
    const std::int64_t count = rows.numel();
    const std::span<const float> values = span_of<const float>(rows);
    const std::span<std::uint8_t> packed = span_of<std::uint8_t>(codes_);
    const std::span<float> absmax = span_of<float>(scales_);
    // Pieces of whole blocks (and an even count of values, two to a byte) quantize apart.
    const std::int64_t grain = std::lcm(kGrainValues, blocksize_);
    const std::int64_t pieces = (count + grain - 1) / grain;
    core::parallel_for(pieces, 1, at::get_num_threads(), [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p) {
        const std::int64_t begin = p * grain, end = std::min(count, begin + grain);
        const auto n = static_cast<std::size_t>(end - begin);
        const std::int64_t at = first + begin;
        quant::quantize_four_bit(
            values.subspan(static_cast<std::size_t>(begin), n), four_bit_type(format_), blocksize_,
            packed.subspan(static_cast<std::size_t>(at / 2), quant::four_bit_packed_bytes(n)),
            absmax.subspan(static_cast<std::size_t>(at / blocksize_),
                           quant::four_bit_blocks(n, static_cast<std::uint64_t>(blocksize_))));
      }
    });
    return;
  }
  // bitsandbytes quantizes LLM.int8's weights from their float16 values (Int8Params).
  const torch::Tensor halved = rows.to(torch::kHalf).to(torch::kFloat32);
  const std::span<const float> values = span_of<const float>(halved);
  const std::span<std::int8_t> q = span_of<std::int8_t>(codes_);
  const std::span<float> absmax = span_of<float>(scales_);
  core::parallel_for(
      rows.size(0), std::max<std::int64_t>(1, kGrainValues / std::max<std::int64_t>(1, cols)),
      at::get_num_threads(), [&](std::int64_t r0, std::int64_t r1) {
        const auto local = static_cast<std::size_t>(r0 * cols);
        const auto n = static_cast<std::size_t>((r1 - r0) * cols);
        quant::quantize_int8_rows(values.subspan(local, n), r1 - r0, cols,
                                  q.subspan(static_cast<std::size_t>(first) + local, n),
                                  absmax.subspan(static_cast<std::size_t>(first_row + r0),
                                                 static_cast<std::size_t>(r1 - r0)));
      });
}

void QuantizedWeight::dequantize_values(const Views& views, std::int64_t begin, std::int64_t count,
                                        std::span<float> dest, std::uint16_t* bf16_dest) const {
  if (is_four_bit_format()) {
    const auto codes =
        views.codes.subspan(static_cast<std::size_t>(begin / 2),
                            quant::four_bit_packed_bytes(static_cast<std::uint64_t>(count)));
    const auto scales =
        views.scales.subspan(static_cast<std::size_t>(begin / blocksize_ - views.first_scale),
                             quant::four_bit_blocks(static_cast<std::uint64_t>(count),
                                                    static_cast<std::uint64_t>(blocksize_)));
    if (bf16_dest != nullptr)
      quant::dequantize_four_bit_bf16(codes, scales, four_bit_type(format_), blocksize_,
                                      {bf16_dest, static_cast<std::size_t>(count)});
    else
      quant::dequantize_four_bit(codes, scales, four_bit_type(format_), blocksize_, dest);
    return;
  }
  // int8: each row's piece with that row's scale.
  const std::span<const std::int8_t> q(reinterpret_cast<const std::int8_t*>(views.codes.data()),
                                       views.codes.size());
  for (std::int64_t at = begin; at < begin + count;) {
    const std::int64_t row = at / in_features_;
    const std::int64_t n = std::min(begin + count, (row + 1) * in_features_) - at;
    quant::dequantize_int8_rows(
        q.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(n)),
        views.scales.subspan(static_cast<std::size_t>(row), 1), 1, n,
        dest.subspan(static_cast<std::size_t>(at - begin), static_cast<std::size_t>(n)));
    at += n;
  }
}

namespace {

// float32 values into `dest` in `dtype` (bfloat16 or float16), rounded to nearest even as
// Tensor::to rounds them. (float32 is dequantized in place.)
void store_as(std::span<const float> values, torch::Dtype dtype, void* dest) {
  if (dtype == torch::kBFloat16) {
    auto* out = static_cast<c10::BFloat16*>(dest);
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = c10::BFloat16(values[i]);
  } else if (dtype == torch::kHalf) {
    auto* out = static_cast<c10::Half*>(dest);
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = c10::Half(values[i]);
  } else {
    throw Error(ErrorKind::Internal, "QuantizedWeight: no dequantization to this dtype");
  }
}

}  // namespace

void QuantizedWeight::check_block(std::int64_t first_row, std::int64_t end_row,
                                  std::int64_t first_col, std::int64_t end_col) const {
  if (first_row < 0 || end_row > out_features_ || first_row > end_row || first_col < 0 ||
      end_col > in_features_ || first_col > end_col)
    throw Error(ErrorKind::Internal, "QuantizedWeight: block out of range");
  const bool whole_rows = end_col - first_col == in_features_;
  if (is_four_bit_format() &&
      (whole_rows ? (first_row * in_features_) % blocksize_ != 0
                  : !column_bands() || first_col % blocksize_ != 0 ||
                        (end_col % blocksize_ != 0 && end_col != in_features_)))
    throw Error(ErrorKind::Internal, "QuantizedWeight: the block does not start on a block");
}

torch::Tensor QuantizedWeight::code_pairs() const {
  if (code_pairs_.defined()) return code_pairs_;
  const std::array<float, 16>& code = quant::four_bit_code(four_bit_type(format_));
  torch::Tensor pairs = torch::empty({256, 2}, torch::kFloat32);
  float* p = pairs.data_ptr<float>();
  for (int byte = 0; byte < 256; ++byte) {
    p[2 * byte] = code[static_cast<std::size_t>(byte >> 4)];  // the first value: the high nibble
    p[2 * byte + 1] = code[static_cast<std::size_t>(byte & 15)];
  }
  return pairs.to(device());
}

torch::Tensor QuantizedWeight::block_absmax(std::int64_t first, std::int64_t count) const {
  if (!nested_) return scales_.narrow(0, first, count);
  // code[q] × absmax2[i / blocksize2] + offset in float32, as dequantize_nested_absmax_range.
  const NestedAbsmax& n = *nested_;
  const torch::Tensor groups =
      torch::div(torch::arange(first, first + count,
                               torch::TensorOptions().dtype(torch::kLong).device(device())),
                 n.blocksize, "floor");
  return n.code.index({n.codes.narrow(0, first, count).to(torch::kLong)})
      .mul_(n.scales.index({groups}))
      .add_(n.offset);
}

torch::Tensor QuantizedWeight::dequantize_block_with_ops(std::int64_t first_row,
                                                         std::int64_t end_row,
                                                         std::int64_t first_col,
                                                         std::int64_t end_col,
                                                         torch::Dtype dtype) const {
  check_block(first_row, end_row, first_col, end_col);
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kHalf)
    throw Error(ErrorKind::Internal, "QuantizedWeight: no dequantization to this dtype");
  torch::NoGradGuard no_grad;
  const std::int64_t rows = end_row - first_row, cols = end_col - first_col;
  torch::Tensor values;  // float32 [rows, cols]
  if (!is_four_bit_format()) {
    // (q × absmax) × 1/127, as dequantize_int8_rows.
    values = codes_.slice(0, first_row, end_row)
                 .slice(1, first_col, end_col)
                 .to(torch::kFloat32)
                 .mul_(scales_.slice(0, first_row, end_row).unsqueeze(1))
                 .mul_(quant::kInt8Inverse127);
  } else if (cols == in_features_) {
    // Whole rows: one run of values from a block's start; a short last block padded.
    const std::int64_t begin = first_row * in_features_, count = rows * cols;
    const std::int64_t blocks = (count + blocksize_ - 1) / blocksize_;
    torch::Tensor v =
        code_pairs().index({codes_.narrow(0, begin / 2, (count + 1) / 2).to(torch::kLong)});
    v = v.reshape({-1});
    if (v.numel() < blocks * blocksize_)
      v = torch::constant_pad_nd(v, {0, blocks * blocksize_ - v.numel()});
    values = v.view({blocks, blocksize_})
                 .mul_(block_absmax(begin / blocksize_, blocks).unsqueeze(1))
                 .reshape({-1})
                 .narrow(0, 0, count)
                 .view({rows, cols});
  } else {
    // A band of columns (each row a whole number of blocks): rows × the band's blocks.
    const std::int64_t per_row = in_features_ / blocksize_, blocks = cols / blocksize_;
    const torch::Tensor bytes = codes_.view({out_features_, in_features_ / 2})
                                    .slice(0, first_row, end_row)
                                    .slice(1, first_col / 2, end_col / 2);
    const torch::Tensor absmax =
        block_absmax(first_row * per_row, rows * per_row)
            .view({rows, per_row})
            .slice(1, first_col / blocksize_, first_col / blocksize_ + blocks);
    values = code_pairs()
                 .index({bytes.reshape({-1}).to(torch::kLong)})
                 .view({rows, blocks, blocksize_})
                 .mul_(absmax.unsqueeze(2))
                 .view({rows, cols});
  }
  return dtype == torch::kFloat32 ? values.contiguous() : values.to(dtype).contiguous();
}

torch::Tensor QuantizedWeight::block_output(std::int64_t rows, std::int64_t cols,
                                            torch::Dtype dtype, const torch::Tensor& into) const {
  if (!into.defined())
    return torch::empty({rows, cols}, torch::TensorOptions().dtype(dtype).device(device()));
  const std::int64_t bytes = rows * cols * static_cast<std::int64_t>(c10::elementSize(dtype));
  if (!into.is_contiguous() || into.nbytes() < static_cast<std::size_t>(bytes) ||
      into.device() != device())
    throw Error(ErrorKind::Internal, "QuantizedWeight: the buffer is too small or elsewhere");
  return into.view(torch::kUInt8).reshape({-1}).narrow(0, 0, bytes).view(dtype).view({rows, cols});
}

torch::Tensor QuantizedWeight::dequantize_block_with_kernel(
    const cuda::Runtime& runtime, std::int64_t first_row, std::int64_t end_row,
    std::int64_t first_col, std::int64_t end_col, torch::Dtype dtype,
    const torch::Tensor& into) const {
  cuda::DequantizedType type = cuda::DequantizedType::Float32;
  if (dtype == torch::kBFloat16)
    type = cuda::DequantizedType::BFloat16;
  else if (dtype == torch::kHalf)
    type = cuda::DequantizedType::Float16;
  else if (dtype != torch::kFloat32)
    throw Error(ErrorKind::Internal, "QuantizedWeight: no dequantization to this dtype");
  const std::int64_t rows = end_row - first_row, cols = end_col - first_col;
  torch::Tensor out = block_output(rows, cols, dtype, into);
  const int status =
      is_four_bit_format()
          ? runtime.dequantize_four_bit(four_bit_block(first_row, end_row, first_col, end_col),
                                        type, out.data_ptr(), device().index())
          : runtime.dequantize_int8(int8_block(first_row, end_row, first_col, end_col), type,
                                    out.data_ptr(), device().index());
  if (status != 0)
    throw_io("the CUDA dequantization kernel failed to launch (CUDA error " +
             std::to_string(status) + ")");
  return out;
}

cuda::FourBitBlock QuantizedWeight::four_bit_block(std::int64_t first_row, std::int64_t end_row,
                                                   std::int64_t first_col,
                                                   std::int64_t end_col) const {
  if (!is_four_bit_format()) throw Error(ErrorKind::Internal, "QuantizedWeight: not 4-bit");
  check_block(first_row, end_row, first_col, end_col);
  cuda::FourBitBlock block;
  block.codes = codes_.data_ptr<std::uint8_t>();
  if (nested_) {
    block.nested_codes = nested_->codes.data_ptr<std::uint8_t>();
    block.nested_code = nested_->code.data_ptr<float>();
    block.nested_scales = nested_->scales.data_ptr<float>();
    block.nested_blocksize = nested_->blocksize;
    block.nested_offset = nested_->offset;
  } else {
    block.absmax = scales_.data_ptr<float>();
  }
  const std::array<float, 16>& code = quant::four_bit_code(four_bit_type(format_));
  std::copy(code.begin(), code.end(), block.code);
  block.blocksize = blocksize_;
  block.region = {in_features_, first_row, end_row - first_row, first_col, end_col - first_col};
  return block;
}

cuda::Int8Block QuantizedWeight::int8_block(std::int64_t first_row, std::int64_t end_row,
                                            std::int64_t first_col, std::int64_t end_col) const {
  if (is_four_bit_format()) throw Error(ErrorKind::Internal, "QuantizedWeight: not int8");
  check_block(first_row, end_row, first_col, end_col);
  cuda::Int8Block block;
  block.codes = codes_.data_ptr<std::int8_t>();
  block.row_absmax = scales_.data_ptr<float>();
  block.inverse_127 = quant::kInt8Inverse127;
  block.region = {in_features_, first_row, end_row - first_row, first_col, end_col - first_col};
  return block;
}

torch::Tensor QuantizedWeight::dequantize_to_host() const {
  if (device().is_cpu()) return dequantize();
  torch::Tensor out = torch::empty({out_features_, in_features_}, torch::kFloat32);
  for (std::int64_t first = 0; first < out_features_; first += tile_rows_) {
    const std::int64_t end = std::min(out_features_, first + tile_rows_);
    out.narrow(0, first, end - first).copy_(dequantize_rows(first, end));
  }
  return out;
}

void QuantizedWeight::to(const torch::Device& device) {
  if (device == this->device()) return;
  codes_ = codes_.to(device);
  if (scales_.defined()) scales_ = scales_.to(device);
  if (nested_) {
    nested_->codes = nested_->codes.to(device);
    nested_->code = nested_->code.to(device);
    nested_->scales = nested_->scales.to(device);
  }
  code_pairs_ = torch::Tensor();
  if (is_four_bit_format() && !device.is_cpu()) code_pairs_ = code_pairs();
}

torch::Tensor QuantizedWeight::dequantize_block(std::int64_t first_row, std::int64_t end_row,
                                                std::int64_t first_col, std::int64_t end_col,
                                                torch::Dtype dtype,
                                                const torch::Tensor& into) const {
  check_block(first_row, end_row, first_col, end_col);
  const cuda::Runtime* runtime = cuda::runtime();
  if (device().is_cuda() && runtime != nullptr)
    return dequantize_block_with_kernel(*runtime, first_row, end_row, first_col, end_col, dtype,
                                        into);
  if (!device().is_cpu())
    return dequantize_block_with_ops(first_row, end_row, first_col, end_col, dtype);
  const std::int64_t rows = end_row - first_row, cols = end_col - first_col;
  const bool whole_rows = cols == in_features_;
  torch::Tensor out = block_output(rows, cols, dtype, into);
  auto* base = static_cast<std::uint8_t*>(out.data_ptr());
  const std::size_t element = out.element_size();
  // Whole rows are one run of values; a band of columns is a run per row. Runs are dequantized
  // in pieces of at most kGrainValues (whole blocks) straight into `out` (float32; bf16 from 4
  // bits), or in float32 into a buffer that stays in cache and then stored in `dtype`: the
  // float32 block never exists whole. Double-quantized absmax are restored per piece, on the
  // piece's thread, into a buffer as small.
  const std::int64_t run = whole_rows ? rows * cols : cols;
  const std::int64_t runs = whole_rows ? 1 : rows;
  const std::int64_t grain =
      is_four_bit_format() ? std::lcm(kGrainValues, blocksize_) : kGrainValues;
  const std::int64_t per_run = (run + grain - 1) / grain;
  Views storage;
  storage.codes = {static_cast<const std::uint8_t*>(codes_.data_ptr()),
                   static_cast<std::size_t>(codes_.nbytes())};
  if (!nested_) storage.scales = span_of<const float>(scales_);
  on_torch_threads(runs * per_run, [&](std::int64_t p0, std::int64_t p1) {
    std::vector<float> buffer;
    std::vector<float> restored;
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t r = p / per_run, at = (p % per_run) * grain;
      const std::int64_t n = std::min(run, at + grain) - at;
      const std::int64_t global = whole_rows ? first_row * in_features_ + at
                                             : (first_row + r) * in_features_ + first_col + at;
      Views views = storage;
      if (nested_) {
        const NestedAbsmax& nested = *nested_;
        const std::size_t blocks = quant::four_bit_blocks(static_cast<std::uint64_t>(n),
                                                          static_cast<std::uint64_t>(blocksize_));
        restored.resize(blocks);
        views.first_scale = global / blocksize_;
        quant::dequantize_nested_absmax_range(
            span_of<const std::uint8_t>(nested.codes), span_of<const float>(nested.code),
            span_of<const float>(nested.scales), nested.blocksize, nested.offset,
            static_cast<std::uint64_t>(views.first_scale), restored);
        views.scales = restored;
      }
      void* dest = base + static_cast<std::size_t>(r * run + at) * element;
      if (dtype == torch::kFloat32) {
        dequantize_values(views, global, n,
                          {static_cast<float*>(dest), static_cast<std::size_t>(n)});
      } else if (dtype == torch::kBFloat16 && is_four_bit_format()) {
        dequantize_values(views, global, n, {}, static_cast<std::uint16_t*>(dest));
      } else {
        buffer.resize(static_cast<std::size_t>(n));
        dequantize_values(views, global, n, buffer);
        store_as(buffer, dtype, dest);
      }
    }
  });
  return out;
}

torch::Tensor QuantizedWeight::linear(const torch::Tensor& x, const torch::Tensor& bias) const {
  return QuantizedMatmul::apply(
      x, bias.defined() ? std::optional<torch::Tensor>(bias) : std::nullopt, this);
}

std::uint64_t QuantizedWeight::bytes() const {
  std::uint64_t total = static_cast<std::uint64_t>(codes_.nbytes());
  if (scales_.defined()) total += static_cast<std::uint64_t>(scales_.nbytes());
  if (nested_)
    total += static_cast<std::uint64_t>(nested_->codes.nbytes() + nested_->code.nbytes() +
                                        nested_->scales.nbytes());
  return total;
}

namespace {

template <typename Visit>
void for_each_linear(const PretrainedModel& model, Visit visit) {
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value()))
      visit(item.key(), *linear);
}

// The layer computes from `quantized` from now on. Its `weight` parameter stays registered (its
// name is the checkpoint's), empty: nothing reserves or converts a dense copy.
void install(LinearImpl& linear, std::shared_ptr<QuantizedWeight> quantized) {
  linear.quantized = std::move(quantized);
  linear.weight.set_data(torch::empty({0}, linear.weight.options()));
  linear.weight.set_requires_grad(false);
}

constexpr const char* kFourBitStates[] = {".quant_state.bitsandbytes__nf4",
                                          ".quant_state.bitsandbytes__fp4"};

// A copy of checkpoint tensor `name`, which must have dtype `dtype`.
torch::Tensor copy_tensor(const hf::SafetensorsCheckpoint& checkpoint, const std::string& name,
                          hf::DType dtype, torch::Dtype torch_dtype, const std::string& folder) {
  if (!checkpoint.contains(name))
    throw_invalid(folder + ": tensor \"" + name + "\" is missing",
                  "a bitsandbytes checkpoint stores it beside its weight; re-download or re-save "
                  "the model");
  const hf::TensorInfo& info = checkpoint.info(name);
  if (info.dtype != dtype)
    throw_invalid(folder + ": tensor \"" + name + "\" has dtype " + hf::dtype_name(info.dtype) +
                      ", not " + hf::dtype_name(dtype),
                  "re-download or re-save the model");
  const hf::TensorView view = checkpoint.view(name);
  return torch::from_blob(const_cast<std::uint8_t*>(view.bytes.data()),
                          {static_cast<std::int64_t>(info.numel())}, torch_dtype)
      .clone();
}

std::shared_ptr<QuantizedWeight> read_stored(const hf::SafetensorsCheckpoint& checkpoint,
                                             const std::string& name, const LinearImpl& linear,
                                             const std::string& folder) {
  const std::int64_t out = linear.weight.size(0), in = linear.weight.size(1);
  const std::string module = name.substr(0, name.size() - std::string(".weight").size());
  const std::string where = folder + ": " + name;
  for (const char* suffix : kFourBitStates) {
    if (!checkpoint.contains(name + suffix)) continue;
    const torch::Tensor state_bytes =
        copy_tensor(checkpoint, name + suffix, hf::DType::U8, torch::kUInt8, folder);
    nlohmann::json state;
    try {
      state =
          nlohmann::json::parse(std::string(reinterpret_cast<const char*>(state_bytes.data_ptr()),
                                            static_cast<std::size_t>(state_bytes.numel())));
    } catch (const nlohmann::json::exception&) {
      throw_invalid(where + suffix + ": not the JSON bitsandbytes writes",
                    "re-download or re-save the model");
    }
    const auto field = [&](const char* key) -> const nlohmann::json& {
      if (!state.is_object() || !state.contains(key))
        throw_invalid(where + suffix + ": \"" + key + "\" is missing",
                      "re-download or re-save the model");
      return state.at(key);
    };
    const std::string type = field("quant_type").get<std::string>();
    if (type != "nf4" && type != "fp4")
      throw_invalid(where + ": 4-bit type \"" + type + "\" is not nf4 or fp4");
    const auto shape = field("shape").get<std::vector<std::int64_t>>();
    if (shape != std::vector<std::int64_t>{out, in})
      throw_invalid(
          where + ": stored for a weight of shape [" +
              (shape.size() == 2 ? std::to_string(shape[0]) + ", " + std::to_string(shape[1])
                                 : std::string("?")) +
              "], the model's is [" + std::to_string(out) + ", " + std::to_string(in) + "]",
          "the checkpoint does not match config.json");
    const QuantizedFormat format = type == "nf4" ? QuantizedFormat::NF4 : QuantizedFormat::FP4;
    // The code must be ours: a checkpoint with a code of its own would dequantize otherwise.
    const torch::Tensor map =
        copy_tensor(checkpoint, name + ".quant_map", hf::DType::F32, torch::kFloat32, folder);
    const auto& code = quant::four_bit_code(four_bit_type(format));
    if (map.numel() != 16 ||
        !torch::equal(map, torch::tensor(std::vector<float>(code.begin(), code.end()))))
      throw_unsupported(where + ".quant_map: not bitsandbytes' " + type + " code",
                        "only the standard nf4 and fp4 codes are read");
    const std::int64_t blocksize = field("blocksize").get<std::int64_t>();
    std::optional<NestedAbsmax> nested;
    torch::Tensor absmax;
    if (checkpoint.contains(name + ".nested_absmax")) {
      NestedAbsmax n;
      n.codes = copy_tensor(checkpoint, name + ".absmax", hf::DType::U8, torch::kUInt8, folder);
      n.scales =
          copy_tensor(checkpoint, name + ".nested_absmax", hf::DType::F32, torch::kFloat32, folder);
      n.code = copy_tensor(checkpoint, name + ".nested_quant_map", hf::DType::F32, torch::kFloat32,
                           folder);
      n.blocksize = field("nested_blocksize").get<std::int64_t>();
      n.offset = field("nested_offset").get<float>();
      nested = std::move(n);
    } else {
      absmax = copy_tensor(checkpoint, name + ".absmax", hf::DType::F32, torch::kFloat32, folder);
    }
    return std::make_shared<QuantizedWeight>(
        format, out, in, blocksize,
        copy_tensor(checkpoint, name, hf::DType::U8, torch::kUInt8, folder), absmax,
        std::move(nested), where);
  }
  if (checkpoint.contains(module + ".weight_format")) {
    const torch::Tensor layout =
        copy_tensor(checkpoint, module + ".weight_format", hf::DType::U8, torch::kUInt8, folder);
    if (layout.numel() != 1 || layout.item<std::uint8_t>() != 0)
      throw_unsupported(
          folder + ": " + module + ".weight_format " +
              std::to_string(layout.numel() == 1 ? layout.item<std::uint8_t>() : 255) +
              ": only the row-major int8 layout (0) is read",
          "re-save the model with a current bitsandbytes");
  }
  return std::make_shared<QuantizedWeight>(
      QuantizedFormat::Int8, out, in, 0,
      copy_tensor(checkpoint, name, hf::DType::I8, torch::kInt8, folder),
      copy_tensor(checkpoint, module + ".SCB", hf::DType::F32, torch::kFloat32, folder),
      std::nullopt, where);
}

}  // namespace

bool is_stored_quantized_weight(const hf::SafetensorsCheckpoint& checkpoint,
                                const std::string& name) {
  if (!name.ends_with(".weight")) return false;
  for (const char* suffix : kFourBitStates)
    if (checkpoint.contains(name + suffix)) return true;
  const std::string module = name.substr(0, name.size() - std::string(".weight").size());
  return checkpoint.contains(module + ".SCB") && checkpoint.info(name).dtype == hf::DType::I8;
}

bool is_stored_quantization_companion(const hf::SafetensorsCheckpoint& checkpoint,
                                      const std::string& name) {
  for (const char* suffix : {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                             kFourBitStates[0], kFourBitStates[1]})
    if (name.ends_with(suffix) &&
        is_stored_quantized_weight(checkpoint, name.substr(0, name.size() - std::strlen(suffix))))
      return true;
  for (const char* suffix : {".SCB", ".weight_format"})
    if (name.ends_with(suffix) &&
        is_stored_quantized_weight(checkpoint,
                                   name.substr(0, name.size() - std::strlen(suffix)) + ".weight"))
      return true;
  return false;
}

std::vector<std::string> install_stored_quantized(
    PretrainedModel& model, const hf::SafetensorsCheckpoint& checkpoint, const std::string& folder,
    const hf::StoredQuantization& stored, const std::map<std::string, std::string>& weights) {
  std::vector<std::string> names;
  if (weights.empty()) return names;
  torch::NoGradGuard no_grad;
  std::size_t present = 0;  // installed before or now
  for_each_linear(model, [&](const std::string& module, LinearImpl& linear) {
    const auto found = weights.find(module + ".weight");
    if (found == weights.end()) return;
    ++present;
    if (linear.quantized) return;
    if (linear.layout != LinearImpl::Layout::OutIn)
      throw_unsupported(folder + ": " + found->second +
                            " is stored quantized for a layer stored [in, out] (GPT-2's Conv1D), "
                            "which is not supported yet",
                        "use the model's unquantized checkpoint");
    std::shared_ptr<QuantizedWeight> q = read_stored(checkpoint, found->second, linear, folder);
    const bool four_bit = q->format() != QuantizedFormat::Int8;
    if (four_bit != (stored.format != "int8"))
      throw_invalid(folder + ": " + found->second + " is stored " + (four_bit ? "4-bit" : "int8") +
                        " while config.json's quantization_config "
                        "says " +
                        stored.format,
                    "the checkpoint does not match config.json");
    install(linear, std::move(q));
    names.push_back(found->first);
  });
  if (present != weights.size())
    throw_unsupported(folder + ": " + std::to_string(weights.size() - present) +
                          " weight(s) stored quantized are not weights of linear layers",
                      "only linear layers' weights are read quantized; use the model's "
                      "unquantized checkpoint");
  return names;
}

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
    // From the checkpoint a band of rows at a time (never the whole weight dense); else the
    // weight the model holds.
    install(linear,
            weights != nullptr
                ? std::make_shared<QuantizedWeight>(
                      linear.weight.size(0), linear.weight.size(1),
                      [&](std::int64_t first_row, const torch::Tensor& rows) {
                        weights->read_rows_into(name, first_row, rows);
                      },
                      options.format, options.blocksize, options.double_quant)
                : std::make_shared<QuantizedWeight>(linear.weight, options.format,
                                                    options.blocksize, options.double_quant));
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

std::map<std::string, std::shared_ptr<const QuantizedWeight>> quantized_weights(
    const PretrainedModel& model) {
  std::map<std::string, std::shared_ptr<const QuantizedWeight>> out;
  for_each_linear(model, [&](const std::string& module, LinearImpl& linear) {
    if (linear.quantized) out.emplace(module + ".weight", linear.quantized);
  });
  return out;
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> dense_parameter_shapes(
    const PretrainedModel& model) {
  const auto quantized = quantized_weights(model);
  const auto stored = stored_table_shapes(model);
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  for (const auto& p : model.named_parameters()) {
    const auto q = quantized.find(p.key());
    const auto table = stored.find(p.key());
    out.emplace_back(p.key(), q != quantized.end()
                                  ? std::vector<std::int64_t>{q->second->out_features(),
                                                              q->second->in_features()}
                              : table != stored.end() ? table->second
                                                      : p.value().sizes().vec());
  }
  return out;
}

void move_quantized_weights(PretrainedModel& model, const torch::Device& device) {
  for_each_linear(model, [&](const std::string&, LinearImpl& linear) {
    if (linear.quantized) linear.quantized->to(device);
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
