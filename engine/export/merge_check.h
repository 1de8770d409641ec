#pragma once
// The check a merged-LoRA export runs before it reports success: every adapted weight must
// equal base + delta (so a merge that silently writes the base model back fails), and every
// other weight must equal the base. Written against plain tensors so that it does not depend on
// how the trainer represents adapters.
//
// For an adapted weight W (exported), B (base) and D (expected delta, in W's layout), all taken
// to float64:
//   residual = ||W - B - D||,  allowed = rel_tolerance * ||D|| + rounding,
//   rounding = ||B + D|| * eps(dtype of W)  (what storing B + D in that dtype may cost);
// it passes when ||D|| > 0, residual <= allowed and residual < ||D|| / 2 (so the delta is
// really present, not lost in the export dtype's rounding). Other weights pass when
// ||W - B|| <= ||B|| * eps(dtype of W).
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace tessera::exporter {

struct MergeCheckEntry {
  std::string name;
  bool adapted = false;
  double delta_norm = 0.0;     // ||D|| (0 for weights that are not adapted)
  double residual_norm = 0.0;  // ||W - B - D||
  double allowed = 0.0;
  bool passed = false;
  std::string problem;  // why it failed, empty when passed
};

struct MergeCheckReport {
  std::vector<MergeCheckEntry> entries;  // adapted weights first, then the others
  bool passed = false;
  std::size_t failures() const;
  std::string summary() const;  // one line; names the first failures
};

// `base` and `exported`: weights by HF name; `deltas`: adapted weight name -> expected delta
// (e.g. scaling * B·A). Every name in `deltas` must be in both maps; a name of `base` missing
// from `exported` (or the reverse) is a failure.
MergeCheckReport check_merged_deltas(const std::map<std::string, torch::Tensor>& base,
                                     const std::map<std::string, torch::Tensor>& exported,
                                     const std::map<std::string, torch::Tensor>& deltas,
                                     double rel_tolerance = 1e-4);

}  // namespace tessera::exporter
