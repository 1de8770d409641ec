#include "plan/plan_text.h"

#include <cstdio>

namespace tessera::plan {

std::string gib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

std::string seconds_text(double seconds) {
  char buf[32];
  if (seconds < 1.0)
    std::snprintf(buf, sizeof buf, "%.0f ms", seconds * 1000);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  return buf;
}

std::string percent(double fraction) {
  return std::to_string(static_cast<int>(fraction * 100 + 0.5)) + "%";
}

std::string join(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& x : parts) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string on_disk_phrase(const Settings& s) {
  const std::string optim = percent(s.offload_optim_frac) + " of the optimizer state";
  const std::string params = percent(s.offload_param_frac) + " of the parameters";
  if (!(s.offload_param_frac > 0.0)) return optim;
  if (!(s.offload_optim_frac > 0.0)) return params;
  return optim + " and " + params;
}

std::string in_host_phrase(const Settings& s) {
  std::string phrase;
  if (s.host_optim_frac > 0.0) phrase = percent(s.host_optim_frac) + " of the optimizer state";
  if (s.host_param_frac > 0.0)
    phrase += (phrase.empty() ? "" : " and ") + percent(s.host_param_frac) + " of the parameters";
  return phrase.empty() ? "nothing" : phrase;
}

std::string method_phrase(const Settings& s) {
  if (s.method != "lora") return "full fine-tuning";
  return s.quantize != "none"
             ? "QLoRA (rank " + std::to_string(s.lora_rank) + ", " + s.quantize + " base)"
             : "LoRA (rank " + std::to_string(s.lora_rank) + ")";
}

}  // namespace tessera::plan
