#include "device_option.h"

#include <torch/cuda.h>

#include "core/error.h"
#include "cuda/runtime.h"

namespace tessera::cli {

c10::Device device_option(const Args& args) {
  const std::string* name = args.option("--device");
  const bool has_cuda = torch::cuda::is_available();
  if (name == nullptr || *name == "auto") return has_cuda ? c10::Device("cuda:0") : c10::kCPU;
  if (*name != "cpu" && name->rfind("cuda", 0) != 0)
    throw UsageError{"--device \"" + *name + "\" is not a device (auto, cpu, cuda or cuda:N)"};
  c10::Device device = c10::kCPU;
  try {
    device = c10::Device(*name);
  } catch (const std::exception&) {
    throw UsageError{"--device \"" + *name + "\" is not a device (auto, cpu, cuda or cuda:N)"};
  }
  if (device.is_cuda()) {
    if (!has_cuda)
      throw_unsupported("--device " + *name + ": no CUDA device is present on this machine" +
                            cuda::runtime_note(),
                        "use --device cpu or auto");
    const auto count = static_cast<int>(torch::cuda::device_count());
    if (device.has_index() && device.index() >= count)
      throw_unsupported("--device " + *name + ": this machine has " + std::to_string(count) +
                            " CUDA device(s), numbered from 0",
                        "use --device cuda:0 … cuda:" + std::to_string(count - 1));
    if (!device.has_index()) device = c10::Device(c10::kCUDA, 0);
  }
  return device;
}

}  // namespace tessera::cli
