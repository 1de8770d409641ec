#include "model/vector_math.h"

#include <torch/torch.h>

#include <mutex>

namespace tessera::model {

void warm_up_vector_math() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::NoGradGuard no_grad;
    // Small enough that ATen runs each on this thread alone (below its parallel grain).
    for (const torch::Dtype dtype : {torch::kFloat32, torch::kFloat64}) {
      const torch::Tensor x = torch::linspace(0.1, 0.9, 64, torch::TensorOptions().dtype(dtype));
      // The functions ATen sends to VML (ATen/cpu/vml.h), each computed once.
      (void)x.exp();
      (void)x.log();
      (void)x.log10();
      (void)x.log2();
      (void)x.sqrt();
      (void)x.tanh();
      (void)x.erf();
      (void)x.erfc();
      (void)x.erfinv();
      (void)x.sin();
      (void)x.cos();
      (void)x.tan();
      (void)x.asin();
      (void)x.acos();
      (void)x.atan();
      (void)x.trunc();
    }
  });
}

}  // namespace tessera::model
