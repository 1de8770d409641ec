#include "export/merge_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera::exporter {
namespace {

// Relative rounding of one value stored in `dtype` (half an ulp at 1, doubled for the
// sum of two roundings).
double dtype_epsilon(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return std::ldexp(1.0, -8);
    case torch::kFloat16:
      return std::ldexp(1.0, -11);
    case torch::kFloat64:
      return std::ldexp(1.0, -52);
    default:
      return std::ldexp(1.0, -23);
  }
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// Squared norms over the flattened tensors, taken a slice at a time: the float64 copies are of
// a slice, not of a whole weight (an embedding matrix in float64 is gigabytes).
constexpr std::int64_t kSliceElements = std::int64_t{1} << 20;

struct SquaredNorms {
  double base = 0.0;      // ||B||²
  double delta = 0.0;     // ||D||²
  double merged = 0.0;    // ||B + D||²
  double residual = 0.0;  // ||W - B - D||²
};

SquaredNorms squared_norms(const torch::Tensor& base, const torch::Tensor& exported,
                           const torch::Tensor* delta) {
  const torch::Tensor b = base.detach().to(torch::kCPU).reshape(-1);
  const torch::Tensor w = exported.detach().to(torch::kCPU).reshape(-1);
  const torch::Tensor d = delta ? delta->detach().to(torch::kCPU).reshape(-1) : torch::Tensor();
  SquaredNorms out;
  const auto squared = [](const torch::Tensor& t) { return t.square().sum().item<double>(); };
  for (std::int64_t first = 0; first < b.numel(); first += kSliceElements) {
    const std::int64_t end = std::min(b.numel(), first + kSliceElements);
    const torch::Tensor bs = b.slice(0, first, end).to(torch::kFloat64);
    const torch::Tensor ws = w.slice(0, first, end).to(torch::kFloat64);
    out.base += squared(bs);
    if (d.defined()) {
      const torch::Tensor ds = d.slice(0, first, end).to(torch::kFloat64);
      out.delta += squared(ds);
      out.merged += squared(bs + ds);
      out.residual += squared(ws - bs - ds);
    } else {
      out.residual += squared(ws - bs);
    }
  }
  return out;
}

}  // namespace

std::size_t MergeCheckReport::failures() const {
  std::size_t n = 0;
  for (const auto& e : entries) n += e.passed ? 0 : 1;
  return n;
}

std::string MergeCheckReport::summary() const {
  std::size_t adapted = 0;
  for (const auto& e : entries) adapted += e.adapted ? 1 : 0;
  if (passed)
    return "merge check passed: " + std::to_string(adapted) +
           " adapted weight(s) equal base + delta, " + std::to_string(entries.size() - adapted) +
           " other weight(s) equal the base";
  std::string s = "merge check failed for " + std::to_string(failures()) + " weight(s):";
  std::size_t shown = 0;
  for (const auto& e : entries) {
    if (e.passed) continue;
    if (shown++ == 5) {
      s += " …";
      break;
    }
    s += " " + e.name + " (" + e.problem + ");";
  }
  return s;
}

MergeCheckReport check_merged_deltas(const std::map<std::string, torch::Tensor>& base,
                                     const std::map<std::string, torch::Tensor>& exported,
                                     const std::map<std::string, torch::Tensor>& deltas,
                                     double rel_tolerance) {
  torch::NoGradGuard no_grad;
  MergeCheckReport report;
  for (const auto& [name, delta] : deltas) {
    MergeCheckEntry e;
    e.name = name;
    e.adapted = true;
    auto b = base.find(name);
    auto w = exported.find(name);
    if (b == base.end() || w == exported.end()) {
      e.problem = b == base.end() ? "not in the base weights" : "not in the exported weights";
    } else if (b->second.sizes() != w->second.sizes() || delta.sizes() != w->second.sizes()) {
      e.problem = "shapes of base, exported weight and delta differ";
    } else {
      const SquaredNorms norms = squared_norms(b->second, w->second, &delta);
      e.delta_norm = std::sqrt(norms.delta);
      e.residual_norm = std::sqrt(norms.residual);
      const double rounding = std::sqrt(norms.merged) * dtype_epsilon(w->second.scalar_type());
      e.allowed = rel_tolerance * e.delta_norm + rounding;
      if (!(e.delta_norm > 0.0))
        e.problem = "the adapter's delta is zero, so a merge cannot be told from the base";
      else if (!std::isfinite(e.residual_norm))
        e.problem = "the exported weight is not finite";
      else if (e.residual_norm > e.allowed || !(e.residual_norm < 0.5 * e.delta_norm))
        e.problem = "||W - base - delta|| = " + fmt(e.residual_norm) +
                    " but ||delta|| = " + fmt(e.delta_norm) + " (allowed " + fmt(e.allowed) + ")" +
                    (e.residual_norm > 0.5 * e.delta_norm &&
                             std::abs(e.residual_norm - e.delta_norm) <= e.allowed
                         ? ": the base weight was written without the delta"
                         : "");
      else
        e.passed = true;
    }
    report.entries.push_back(std::move(e));
  }
  for (const auto& [name, b] : base) {
    if (deltas.count(name)) continue;
    MergeCheckEntry e;
    e.name = name;
    auto w = exported.find(name);
    if (w == exported.end()) {
      e.problem = "not in the exported weights";
    } else if (w->second.sizes() != b.sizes()) {
      e.problem = "shape differs from the base";
    } else {
      const SquaredNorms norms = squared_norms(b, w->second, nullptr);
      e.residual_norm = std::sqrt(norms.residual);
      e.allowed = std::sqrt(norms.base) * dtype_epsilon(w->second.scalar_type());
      if (e.residual_norm <= e.allowed)
        e.passed = true;
      else
        e.problem = "not adapted, yet differs from the base by " + fmt(e.residual_norm);
    }
    report.entries.push_back(std::move(e));
  }
  for (const auto& [name, w] : exported) {
    if (base.count(name)) continue;
    MergeCheckEntry e;
    e.name = name;
    e.problem = "in the export but not in the base model";
    report.entries.push_back(std::move(e));
  }
  report.passed = report.failures() == 0;
  return report;
}

}  // namespace tessera::exporter
