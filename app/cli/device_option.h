#pragma once
// --device for the commands that load a model to compute (generate, eval): auto (CUDA device 0
// when one is present, else the CPU), cpu, cuda or cuda:N.
#include <c10/core/Device.h>

#include "command.h"

namespace tessera::cli {

inline constexpr const char* kDeviceUsage = "[--device auto|cpu|cuda|cuda:N]";

// The device --device names (auto when absent). A UsageError for a name that is no device; an
// Unsupported error (exit 2) for CUDA on a machine without a CUDA device or with fewer devices.
c10::Device device_option(const Args& args);

}  // namespace tessera::cli
