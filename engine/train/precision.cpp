// Precision names of the job spec and checkpoints, and the process and device checks
// (train/plugin.h).
#include <torch/cuda.h>

#include "core/error.h"
#include "cuda/runtime.h"
#include "dist/parallel_context.h"
#include "job/strategies.h"
#include "train/plugin.h"

namespace tessera::train {

Precision precision_from_name(const std::string& name) {
  if (name == "fp32" || name == "float32") return Precision::Fp32;
  if (name == "bf16" || name == "bfloat16") return Precision::Bf16;
  if (name == "fp16" || name == "float16") return Precision::Fp16;
  throw_invalid("precision: \"" + name + "\" is not a precision", "use fp32, bf16 or fp16");
}

torch::Dtype compute_dtype_of(Precision precision) {
  return precision == Precision::Fp32   ? torch::kFloat32
         : precision == Precision::Bf16 ? torch::kBFloat16
                                        : torch::kFloat16;
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::Fp32:
      return "fp32";
    case Precision::Bf16:
      return "bf16";
    case Precision::Fp16:
      return "fp16";
  }
  return "unknown";
}

void require_one_process(const ProcessContext& process, const std::string& plugin) {
  if (process.world_size < 1 || process.rank < 0 || process.rank >= process.world_size)
    throw_invalid("strategy " + plugin + ": rank " + std::to_string(process.rank) + " of " +
                  std::to_string(process.world_size) + " processes is not a place in the job");
  if (process.world_size != 1)
    throw_unsupported("strategy " + plugin + " runs in one process; " +
                          std::to_string(process.world_size) + " processes are not supported yet",
                      "run one process, or a data-parallel strategy once it exists");
}

std::vector<double> Plugin::run_micro_batches(std::vector<MicroBatch>&) {
  throw Error(ErrorKind::Internal,
              "strategy " + name() + " does not run micro-batches itself (runs_micro_batches)");
}

double Plugin::evaluation_loss(const model::ForwardInput&) {
  throw Error(ErrorKind::Internal,
              "strategy " + name() + " does not run micro-batches itself (runs_micro_batches)");
}

void require_cpu_device(const PluginOptions& options, const std::string& plugin) {
  if (options.device == "cuda")
    throw_unsupported("strategy " + plugin + ": strategy.options.device \"cuda\" is not " +
                          "supported yet (" + plugin + " computes on the CPU)",
                      "use device \"cpu\" or \"auto\", or strategy single to train on the GPU");
  if (options.device != "auto" && options.device != "cpu")
    throw_invalid("strategy " + plugin + ": strategy.options.device \"" + options.device +
                      "\" is not a device for " + plugin,
                  "use auto or cpu");
}

std::string choose_plugin_device(const PluginOptions& options, const std::string& plugin) {
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  const ProcessContext& process = options.process;
  const int per_node = process.parallel ? process.parallel->local_world_size() : 1;
  const job::DeviceChoice choice =
      job::device_for(plugin, options.device, process.world_size, per_node, gpus);
  if (choice.device == "cpu" && options.device == "auto" && gpus > 0 && options.log &&
      process.rank == 0)
    options.log("warning", "strategy " + plugin + " computes on the CPU (device auto): " +
                               choice.why_not_gpu + "; the GPU stays unused");
  return choice.device;
}

torch::Device rank_cuda_device(const PluginOptions& options, const std::string& plugin) {
  if (!torch::cuda::is_available())
    throw_unsupported("strategy " + plugin +
                          ": strategy.options.device \"cuda\" but no CUDA device is present" +
                          cuda::runtime_note(),
                      "use device \"cpu\" or \"auto\"");
  const ProcessContext& process = options.process;
  const int local_rank = process.parallel ? process.parallel->local_rank() : 0;
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  const bool shares_a_gpu = local_rank >= gpus && job::tests_share_gpu();
  if (local_rank >= gpus && !shares_a_gpu)
    throw_invalid("strategy " + plugin + ": rank " + std::to_string(process.rank) +
                      " is local rank " + std::to_string(local_rank) + " on a machine with " +
                      std::to_string(gpus) + " GPU(s); each rank computes on a GPU of its own",
                  "start at most " + std::to_string(gpus) +
                      " processes on this machine (launch --nproc), or use device \"cpu\"");
  const int gpu = shares_a_gpu ? local_rank % gpus : local_rank;
  if (shares_a_gpu && options.log)
    options.log("warning", "strategy " + plugin + ": rank " + std::to_string(process.rank) +
                               " shares GPU " + std::to_string(gpu) +
                               " with another rank (TESSERA_TESTS_SHARE_GPU, tests only); its "
                               "collectives go through host memory");
  // Collectives and allocations that name no device use the current one. A CUDA device exists,
  // so the CUDA module is loaded.
  if (const cuda::Runtime* runtime = cuda::runtime()) runtime->set_device(gpu);
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(gpu)};
}

torch::Device cpu_or_rank_cuda_device(const PluginOptions& options, const std::string& plugin) {
  if (choose_plugin_device(options, plugin) == "cuda") return rank_cuda_device(options, plugin);
  require_cpu_device(options, plugin);
  return torch::kCPU;
}

}  // namespace tessera::train
