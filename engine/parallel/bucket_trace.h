#pragma once
// What the data-parallel plugins' gradient buckets did (parallel/gradient_buckets.h), kept
// torch-free for the tools and tests that read it.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera::parallel {

inline constexpr std::uint64_t kDefaultBucketBytes = 25ull * 1024 * 1024;

// What the last backward that reduced gradients did, in seconds from its start: for tests and
// benchmarks that check communication overlaps backward.
struct BucketTrace {
  std::vector<std::size_t> bucket_tensors;  // tensors per bucket, in launch order
  std::vector<std::uint64_t> bucket_bytes;  // float32 bytes per bucket
  std::vector<double> launched_s;           // when each bucket's collective was started
  double last_gradient_s = 0.0;             // when the last gradient came out of autograd
  double backward_end_s = 0.0;              // when autograd's backward returned
  double reduced_s = 0.0;                   // when every bucket's collective was waited on
  std::uint64_t collectives = 0;            // buckets reduced since prepare(), every step
};

}  // namespace tessera::parallel
