// Precision names of the job spec and checkpoints (train/plugin.h).
#include "core/error.h"
#include "train/plugin.h"

namespace tessera::train {

Precision precision_from_name(const std::string& name) {
  if (name == "fp32" || name == "float32") return Precision::Fp32;
  if (name == "bf16" || name == "bfloat16") return Precision::Bf16;
  if (name == "fp16" || name == "float16") return Precision::Fp16;
  throw_invalid("precision: \"" + name + "\" is not a precision", "use fp32, bf16 or fp16");
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

}  // namespace tessera::train
