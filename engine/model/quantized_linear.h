#pragma once
// A Linear's frozen weight held quantized (QLoRA's base, issue 27): 4-bit NF4 / FP4 in blocks with
// an absmax each (double-quantized or not), or int8 rows with their absmax, in bitsandbytes'
// layouts (engine/quant). The layer computes x·Wᵀ from it a tile of rows at a time, and x's
// gradient a band of columns at a time — each tile dequantized as bitsandbytes does (float32
// values) and rounded to x's dtype (for bf16 straight from the codes), then multiplied — so the
// dense weight never exists whole, in forward or in backward (which dequantizes again).
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "quant/tiles.h"

namespace tessera::cuda {
struct Runtime;
}  // namespace tessera::cuda

namespace tessera::hf {
class SafetensorsCheckpoint;
struct StoredQuantization;
}  // namespace tessera::hf

namespace tessera::model {

class PretrainedModel;
class DeferredWeights;

enum class QuantizedFormat { NF4, FP4, Int8 };

// "nf4" / "fp4" / "int8"; throws tessera::Error (InvalidInput) naming `field` otherwise.
QuantizedFormat quantized_format_from_name(const std::string& name, const std::string& field);

// bitsandbytes' double quantization of a 4-bit weight's absmax: 8-bit indices into a 256-value
// code, in blocks with a float32 scale each, less their mean (quant/four_bit.h).
struct NestedAbsmax {
  torch::Tensor codes;   // uint8, one per absmax
  torch::Tensor code;    // float32 [256]: the value of each index
  torch::Tensor scales;  // float32, one per `blocksize` codes
  std::int64_t blocksize = 256;
  float offset = 0.0f;
};

// bitsandbytes' signed dynamic 8-bit map (its create_dynamic_map()), which double quantization
// indexes.
torch::Tensor dynamic_quant_map();

class QuantizedWeight {
 public:
  // Quantizes a dense [out, in] weight (any float dtype; read as float32). 4-bit formats use
  // blocks of `blocksize` (bitsandbytes' 64); `double_quant` then quantizes their absmax too.
  QuantizedWeight(const torch::Tensor& weight, QuantizedFormat format, std::int64_t blocksize = 64,
                  bool double_quant = false);
  // The same from a weight read a band of rows at a time: read(first_row, rows) fills `rows`
  // (float32 [n, in_features]) with rows [first_row, first_row + n). The quantized result is
  // that of the whole weight; only a band is ever dense.
  using RowReader = std::function<void(std::int64_t first_row, const torch::Tensor& rows)>;
  QuantizedWeight(std::int64_t out_features, std::int64_t in_features, const RowReader& read,
                  QuantizedFormat format, std::int64_t blocksize = 64, bool double_quant = false);
  // A weight as a checkpoint stores it: 4-bit `codes` (packed, uint8) with float32 `scales` per
  // block or `nested` ones; int8 `codes` [out, in] with a float32 scale per row. Throws
  // tessera::Error (InvalidInput) naming `source` when the sizes do not fit [out, in].
  QuantizedWeight(QuantizedFormat format, std::int64_t out_features, std::int64_t in_features,
                  std::int64_t blocksize, torch::Tensor codes, torch::Tensor scales,
                  std::optional<NestedAbsmax> nested, const std::string& source);

  // x·Wᵀ + bias in x's dtype; differentiable with respect to x and bias (never the weight).
  torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& bias) const;
  // Rows [first_row, end_row) × columns [first_col, end_col) of the weight, dense: each value
  // dequantized in float32 (as bitsandbytes does), then rounded to `dtype` (float32, bfloat16
  // or float16). A block of whole rows starts on a 4-bit block; a band of columns needs
  // column_bands() and starts (and ends, or reaches the last column) on one. Written into
  // `into`'s storage when given (at least that many bytes, contiguous: a buffer reused from tile
  // to tile, on the storage's device), else into a new tensor. On a GPU (storage moved by to()),
  // by the CUDA module's kernel; on another device (the tests' meta), as torch ops there
  // (dequantize_block_with_ops), into a new tensor on it.
  torch::Tensor dequantize_block(std::int64_t first_row, std::int64_t end_row,
                                 std::int64_t first_col, std::int64_t end_col,
                                 torch::Dtype dtype = torch::kFloat32,
                                 const torch::Tensor& into = {}) const;
  torch::Tensor dequantize_rows(std::int64_t first, std::int64_t end,
                                torch::Dtype dtype = torch::kFloat32,
                                const torch::Tensor& into = {}) const {
    return dequantize_block(first, end, 0, in_features_, dtype, into);
  }
  torch::Tensor dequantize_columns(std::int64_t first, std::int64_t end,
                                   torch::Dtype dtype = torch::kFloat32,
                                   const torch::Tensor& into = {}) const {
    return dequantize_block(0, out_features_, first, end, dtype, into);
  }
  torch::Tensor dequantize() const { return dequantize_rows(0, out_features_); }
  // The whole weight in float32 in host memory; from a GPU a tile of rows at a time, so that
  // the device holds no more than one tile's workspace (the merged export).
  torch::Tensor dequantize_to_host() const;
  // The same block computed by torch ops on the storage's device (a table lookup of each packed
  // byte's two codes, times the block's absmax in float32, cast): the same bits as the CPU's own
  // loops and the CUDA kernel's. The path of a device without the kernel; on the CPU and the GPU
  // it serves the tests that hold the three equal.
  torch::Tensor dequantize_block_with_ops(std::int64_t first_row, std::int64_t end_row,
                                          std::int64_t first_col, std::int64_t end_col,
                                          torch::Dtype dtype = torch::kFloat32) const;
  // The block as the CUDA kernels read it (cuda/kernels.h): pointers into the storage, wherever
  // it is; a 4-bit format's for four_bit_block, int8's for int8_block.
  cuda::FourBitBlock four_bit_block(std::int64_t first_row, std::int64_t end_row,
                                    std::int64_t first_col, std::int64_t end_col) const;
  cuda::Int8Block int8_block(std::int64_t first_row, std::int64_t end_row, std::int64_t first_col,
                             std::int64_t end_col) const;
  // Moves the codes and scales to `device` (QLoRA on a GPU; LinearImpl::to calls it): the layer
  // then computes there, a tile at a time as on the CPU.
  void to(const torch::Device& device);
  torch::Device device() const { return codes_.device(); }
  // Whether bands of columns dequantize (each row's values a whole number of 4-bit blocks; int8
  // always): backward then computes x's gradient a band of its columns at a time, each with the
  // whole sum over the output features (no partial sums to add up).
  bool column_bands() const { return !is_four_bit_format() || in_features_ % blocksize_ == 0; }
  // The columns of one band: a multiple of the block size, the weight's columns split into as
  // few equal bands as keep each near tile_elements() values.
  std::int64_t band_columns() const;

  // The rows of one tile: a multiple of what keeps each tile's start on a block boundary, the
  // weight's rows split into as few equal tiles as keep each near tile_elements() values.
  std::int64_t tile_rows() const { return tile_rows_; }
  // The values a tile or band holds at most, about (kTileElements unless set): smaller tiles
  // bound the workspace tighter, larger ones keep the matmuls on them efficient.
  std::int64_t tile_elements() const { return tile_elements_; }
  void set_tile_elements(std::int64_t elements);
  std::uint64_t bytes() const;  // the quantized storage (codes and scales)
  QuantizedFormat format() const { return format_; }
  std::int64_t out_features() const { return out_features_; }
  std::int64_t in_features() const { return in_features_; }
  std::int64_t blocksize() const { return blocksize_; }
  const torch::Tensor& codes() const { return codes_; }  // uint8 packed nibbles / int8 values
  // float32 absmax per block / per row; undefined when they are double-quantized (nested()).
  const torch::Tensor& scales() const { return scales_; }
  const std::optional<NestedAbsmax>& nested() const { return nested_; }

  static constexpr std::int64_t kTileElements = quant::kDequantizeTileElements;

 private:
  QuantizedFormat format_;
  std::int64_t out_features_;
  std::int64_t in_features_;
  std::int64_t blocksize_;
  std::int64_t tile_rows_;
  std::int64_t tile_elements_ = kTileElements;
  torch::Tensor codes_;
  torch::Tensor scales_;
  std::optional<NestedAbsmax> nested_;

  // The 4-bit codes of every byte value, [256, 2] float32 (high nibble first), on the storage's
  // device: kept there by to(), made for each call on the CPU.
  torch::Tensor code_pairs_;

  void set_tile_rows();
  void check_block(std::int64_t first_row, std::int64_t end_row, std::int64_t first_col,
                   std::int64_t end_col) const;
  // float32 absmax of 4-bit blocks [first, first + count), double-quantized ones restored, as a
  // tensor on the storage's device.
  torch::Tensor block_absmax(std::int64_t first, std::int64_t count) const;
  torch::Tensor code_pairs() const;
  // The block by the CUDA module's kernel (cuda/kernels.h), into `into` or a new tensor: on a
  // GPU, one pass from the codes to the tile (dequantize_block_with_ops' bits).
  torch::Tensor dequantize_block_with_kernel(const cuda::Runtime& runtime, std::int64_t first_row,
                                             std::int64_t end_row, std::int64_t first_col,
                                             std::int64_t end_col, torch::Dtype dtype,
                                             const torch::Tensor& into) const;
  // rows × cols of `dtype` on the storage's device: a view of `into`'s storage, else new.
  torch::Tensor block_output(std::int64_t rows, std::int64_t cols, torch::Dtype dtype,
                             const torch::Tensor& into) const;
  void double_quantize();
  void quantize_band(std::int64_t first_row, const torch::Tensor& rows);
  bool is_four_bit_format() const { return format_ != QuantizedFormat::Int8; }
  // Values [begin, begin + count) of the flattened weight (a 4-bit run starts on a block) in
  // float32 into `dest`, or for a 4-bit weight with `bf16_dest` set, rounded to bfloat16 there.
  // The storage's spans, taken once per dequantization (a tensor's data_ptr() costs checks).
  // `scales`: one per 4-bit block (double-quantized ones restored) or per int8 row, from block
  // (row) `first_scale` of the weight on.
  struct Views {
    std::span<const std::uint8_t> codes;  // 4-bit packed codes or int8 values, as bytes
    std::span<const float> scales;
    std::int64_t first_scale = 0;
  };
  void dequantize_values(const Views& views, std::int64_t begin, std::int64_t count,
                         std::span<float> dest, std::uint16_t* bf16_dest = nullptr) const;
};

struct QuantizeOptions {
  QuantizedFormat format = QuantizedFormat::NF4;
  std::int64_t blocksize = 64;
  bool double_quant = false;  // 4-bit: the absmax double-quantized (bnb_4bit_use_double_quant)
  // Linear layers whose last name component is here stay dense (transformers keeps the output
  // head in the compute dtype: lm_head).
  std::vector<std::string> keep_dense = {"lm_head"};
};

// Quantizes every Linear of `model` but those options.keep_dense names, one weight at a time:
// read as float32 from `weights` (the model built by create_model, its weights not yet read) or,
// when null, from the loaded parameter, quantized and dropped; the layer's `weight` parameter is
// left empty (0 elements). Returns the quantized weights' parameter names. Throws tessera::Error
// (Unsupported) for a layer stored [in, out] (GPT-2's Conv1D).
std::vector<std::string> quantize_linears(PretrainedModel& model, const DeferredWeights* weights,
                                          const QuantizeOptions& options);

// Installs each weight a checkpoint stores quantized (`stored`: config.json's
// quantization_config) in its Linear: `weights` maps the model's parameter name
// ("<module>.weight") to the checkpoint's. The tensors are copied out of the checkpoint, which
// may close after. Returns the parameter names. Throws tessera::Error (InvalidInput) naming
// `folder` (the checkpoint's, for messages) and the tensor when one is missing or does not fit
// the layer.
std::vector<std::string> install_stored_quantized(
    PretrainedModel& model, const hf::SafetensorsCheckpoint& checkpoint, const std::string& folder,
    const hf::StoredQuantization& stored, const std::map<std::string, std::string>& weights);

// Whether checkpoint tensor `name` is a weight stored quantized (bitsandbytes: a 4-bit weight with
// its quant_state, an int8 one with its SCB), and whether it is one of the tensors such a weight
// carries beside it (absmax, quant_map, nested_*, quant_state, SCB, weight_format).
bool is_stored_quantized_weight(const hf::SafetensorsCheckpoint& checkpoint,
                                const std::string& name);
bool is_stored_quantization_companion(const hf::SafetensorsCheckpoint& checkpoint,
                                      const std::string& name);

// The parameter names ("<module>.weight") of the model's quantized Linears.
std::set<std::string> quantized_weight_names(const PretrainedModel& model);
// The bytes of their quantized storage.
std::uint64_t quantized_weight_bytes(const PretrainedModel& model);
// The model's quantized weights by parameter name ("<module>.weight").
std::map<std::string, std::shared_ptr<const QuantizedWeight>> quantized_weights(
    const PretrainedModel& model);
// Every parameter's name and dense shape, in named_parameters() order: a quantized Linear's
// weight (an empty parameter) as its [out, in], a table left in its file as stored there, the
// others as they are.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> dense_parameter_shapes(
    const PretrainedModel& model);
// Moves every quantized weight's storage to `device` (a plugin that places the model's tensors
// itself: gemini's device tier).
void move_quantized_weights(PretrainedModel& model, const torch::Device& device);
// Replaces each quantized weight by its dense dequantized value in the parameter's dtype (for a
// merge or an export: the base as the quantized model computes with it).
void dequantize_linears(PretrainedModel& model);

}  // namespace tessera::model
