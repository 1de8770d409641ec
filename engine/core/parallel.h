#pragma once
// Our own intra-op parallelism for CPU kernels. at::parallel_for is not an option in our code:
// with the wheel's OpenMP backend it is a header template whose `#pragma omp parallel` only
// takes effect in translation units compiled with -fopenmp, and we must not add a second OpenMP
// runtime (shared/LIBTORCH.md), so there it silently runs on one thread.
#include <cstdint>
#include <functional>

namespace tessera::core {

// Runs `body(begin, end)` over [0, count) split into at most `threads` contiguous pieces of at
// least `grain` elements; the calling thread runs the first piece, a persistent pool the rest.
// Returns when every piece is done; the first exception a piece throws is rethrown. Calls from
// inside a piece run sequentially (no nested parallelism). Thread-safe: concurrent callers take
// turns on the pool.
void parallel_for(std::int64_t count, std::int64_t grain, int threads,
                  const std::function<void(std::int64_t, std::int64_t)>& body);

}  // namespace tessera::core
