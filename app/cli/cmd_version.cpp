// tessera-cli version [--json]: what this tessera-cli is built from — Tessera's version (CMake's
// project version), the LibTorch it links and the CUDA runtime that LibTorch was built with —
// whether Tessera's CUDA module is loaded (engine/cuda/runtime.h; where it is not, LibTorch's
// CUDA libraries are not loaded either) and whether a GPU is visible now. The studio's About box
// shows it.
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "command.h"

#ifdef TESSERA_WITH_TORCH
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "cuda/runtime.h"
#else
#include "plan/profile.h"
#endif

namespace tessera::cli {
namespace {

struct Versions {
  std::string tessera = TESSERA_VERSION;
  std::optional<std::string> libtorch;  // empty: built without LibTorch
  std::optional<std::string> cuda;      // the CUDA runtime LibTorch was compiled against
  int gpus = 0;                         // visible now
  bool cuda_module_loaded = false;
  std::string cuda_module = "not built: this tessera-cli has no LibTorch";
};

Versions collect() {
  Versions v;
#ifdef TESSERA_WITH_TORCH
  v.libtorch = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
               "." + std::to_string(TORCH_VERSION_PATCH);
  // A CPU-only LibTorch has no CUDA runtime; asking it for the version would throw.
  const auto& hooks = at::detail::getCUDAHooks();
  if (hooks.hasCUDART()) {
    const long runtime = hooks.versionCUDART();  // e.g. 13020 for 13.2
    v.cuda = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  }
  v.gpus = static_cast<int>(torch::cuda::device_count());
  v.cuda_module_loaded = cuda::runtime() != nullptr;
  v.cuda_module = cuda::runtime_status();
#else
  plan::ProfileOptions options;  // no disk section: only what the devices are
  options.measure_disk = false;
  v.gpus = static_cast<int>(plan::probe_hardware(options).gpus.size());
#endif
  return v;
}

int run_version(const std::vector<std::string>& raw) {
  Args args(raw, {"--json"}, {});
  args.expect_no_positionals();
  const Versions v = collect();
  if (args.flag("--json")) {
    nlohmann::json out = {{"tessera", v.tessera},
                          {"libtorch", v.libtorch ? nlohmann::json(*v.libtorch) : nullptr},
                          {"cuda", v.cuda ? nlohmann::json(*v.cuda) : nullptr},
                          {"cuda_module_loaded", v.cuda_module_loaded},
                          {"cuda_module", v.cuda_module},
                          {"gpu_visible", v.gpus > 0},
                          {"gpu_count", v.gpus}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "Tessera " << v.tessera << "\n"
            << "LibTorch " << v.libtorch.value_or("not built in") << "\n"
            << "CUDA runtime " << v.cuda.value_or("none") << "\n"
            << "CUDA module " << v.cuda_module << "\n"
            << "GPUs: " << (v.gpus > 0 ? std::to_string(v.gpus) + " visible" : "none visible")
            << "\n";
  return 0;
}

const RegisterCommand kVersionCommand{{
    "version",
    "version [--json]",
    "Show the versions of Tessera, LibTorch and CUDA this tessera-cli is built with, and the GPUs",
    run_version,
}};

}  // namespace
}  // namespace tessera::cli
