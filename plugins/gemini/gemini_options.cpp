#include "plugins/gemini/gemini_options.h"

#include <string>

#include "core/error.h"
#include "core/meminfo.h"
#include "plugins/gemini/disk_chunks.h"
#include "train/plugin.h"

namespace tessera::plugins {

GeminiOptions parse_gemini_options(const train::PluginOptions& options, const char* parts) {
  GeminiOptions out;
  out.offload_dir =
      options.run_dir.empty() ? std::filesystem::path("offload") : options.run_dir / "offload";
  const nlohmann::json& o = options.strategy_options;
  if (!o.is_object()) return out;
  out.auto_placement = o.value("placement", "static") == "auto";
  if (o.contains("offload_param_frac")) {
    if (out.auto_placement)
      throw_invalid(std::string("strategy.options.offload_param_frac: placement \"auto\" decides "
                                "where parameter ") +
                        parts + " live",
                    "remove offload_param_frac, or use placement \"static\" to fix the share on "
                    "disk");
    out.offload_param_frac = o["offload_param_frac"];
  }
  if (out.auto_placement) {
    out.offload_param_frac = 1.0;
    out.host_budget = size_option(o, "host_budget").value_or(0);
    if (out.host_budget == 0) out.host_budget = core::read_meminfo().total;
  }
  if (o.contains("offload_optim_frac")) out.offload_optim_frac = o["offload_optim_frac"];
  if (o.contains("offload_dir")) out.offload_dir = o["offload_dir"].get<std::string>();
  if (o.contains("host_param_frac")) out.host_param_frac = o["host_param_frac"];
  if (o.contains("host_optim_frac")) out.host_optim_frac = o["host_optim_frac"];
  out.device_budget = size_option(o, "device_budget").value_or(0);
  out.chunk_bytes = size_option(o, "chunk_size");
  return out;
}

}  // namespace tessera::plugins
