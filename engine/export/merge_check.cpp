#include "export/merge_check.h"

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

torch::Tensor f64(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, torch::kFloat64);
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
      const torch::Tensor bd = f64(b->second);
      const torch::Tensor dd = f64(delta);
      const torch::Tensor wd = f64(w->second);
      e.delta_norm = dd.norm().item<double>();
      e.residual_norm = (wd - bd - dd).norm().item<double>();
      const double rounding =
          (bd + dd).norm().item<double>() * dtype_epsilon(w->second.scalar_type());
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
      const torch::Tensor bd = f64(b);
      e.residual_norm = (f64(w->second) - bd).norm().item<double>();
      e.allowed = bd.norm().item<double>() * dtype_epsilon(w->second.scalar_type());
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
