#pragma once
// LibTorch computes exp, log, tanh, erf and their kin on float and double through MKL's vector
// math (VML). MKL picks each function's implementation on its first call; when torch's threads
// make that first call together, the one that arrives during the choice computes that call with
// another implementation (exp off by up to 4e-5 relative on this project's CI: one run in forty
// had a first loss 2e-6 away from the others'). Calling each of them once on one thread, before
// any parallel work, makes every later call take the same implementation.

namespace tessera::model {

// Idempotent and cheap (a few tiny tensors, once per process).
void warm_up_vector_math();

}  // namespace tessera::model
