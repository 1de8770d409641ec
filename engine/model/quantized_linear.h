#pragma once
// A Linear's frozen weight held quantized (QLoRA's base, issue 27): 4-bit NF4 / FP4 in blocks with
// an absmax each, or int8 rows with their absmax, in bitsandbytes' layouts (engine/quant). The
// layer computes x·Wᵀ from it a tile of rows at a time — each tile dequantized to float32, cast
// to x's dtype and multiplied, as bitsandbytes' MatMul4Bit does for the whole weight — so the
// dense weight never exists whole, in forward or in backward (which recomputes the tiles).
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "quant/tiles.h"

namespace tessera::model {

class PretrainedModel;
class DeferredWeights;

enum class QuantizedFormat { NF4, FP4, Int8 };

// "nf4" / "fp4" / "int8"; throws tessera::Error (InvalidInput) naming `field` otherwise.
QuantizedFormat quantized_format_from_name(const std::string& name, const std::string& field);

class QuantizedWeight {
 public:
  // Quantizes a dense [out, in] weight (any float dtype; read as float32). 4-bit formats use
  // blocks of `blocksize` (bitsandbytes' 64).
  QuantizedWeight(const torch::Tensor& weight, QuantizedFormat format, std::int64_t blocksize = 64);

  // x·Wᵀ + bias in x's dtype; differentiable with respect to x and bias (never the weight).
  torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& bias) const;
  // Rows [first, end) of the weight, dense [end - first, in]: dequantized in float32 (as
  // bitsandbytes does), then cast to `dtype`.
  torch::Tensor dequantize_rows(std::int64_t first, std::int64_t end,
                                torch::Dtype dtype = torch::kFloat32) const;
  torch::Tensor dequantize() const { return dequantize_rows(0, out_features_); }

  // The rows of one tile: a multiple of what keeps each tile's start on a block boundary, about
  // kTileElements values.
  std::int64_t tile_rows() const { return tile_rows_; }
  std::uint64_t bytes() const;  // the quantized storage (codes and scales)
  QuantizedFormat format() const { return format_; }
  std::int64_t out_features() const { return out_features_; }
  std::int64_t in_features() const { return in_features_; }
  std::int64_t blocksize() const { return blocksize_; }
  const torch::Tensor& codes() const { return codes_; }    // uint8 packed nibbles / int8 values
  const torch::Tensor& scales() const { return scales_; }  // float32 absmax per block / per row

  static constexpr std::int64_t kTileElements = quant::kDequantizeTileElements;

 private:
  QuantizedFormat format_;
  std::int64_t out_features_;
  std::int64_t in_features_;
  std::int64_t blocksize_;
  std::int64_t tile_rows_;
  torch::Tensor codes_;
  torch::Tensor scales_;
};

struct QuantizeOptions {
  QuantizedFormat format = QuantizedFormat::NF4;
  std::int64_t blocksize = 64;
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

// The parameter names ("<module>.weight") of the model's quantized Linears.
std::set<std::string> quantized_weight_names(const PretrainedModel& model);
// The bytes of their quantized storage.
std::uint64_t quantized_weight_bytes(const PretrainedModel& model);
// Copies the dequantized weight of each quantized Linear of `from` into the parameter of the same
// name in `to` (a dense model of the same config), converting to its dtype.
void copy_dequantized_weights(const PretrainedModel& from, PretrainedModel& to);
// Replaces each quantized weight by its dense dequantized value in the parameter's dtype (for a
// merge or an export: the base as the quantized model computes with it).
void dequantize_linears(PretrainedModel& model);

}  // namespace tessera::model
