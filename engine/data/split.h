#pragma once
// Deterministic shuffling and train/validation splits, reproducible on every platform.
//
// Algorithm (do not change without a reason: saved runs depend on it): a std::mt19937_64
// seeded with `seed` drives Fisher–Yates from the last position down: for i = n-1 … 1,
// j = bounded(i + 1), swap(order[i], order[j]). bounded(b) draws 64-bit values r and
// rejects r >= 2^64 - (2^64 mod b), then returns r mod b (no modulo bias). The standard
// library's shuffle and distributions are implementation-defined, so they are not used.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace tessera::data {

// 0, 1, …, n-1 shuffled as described above.
std::vector<std::size_t> shuffled_indices(std::size_t n, std::uint64_t seed);

struct SplitOptions {
  // Validation size: a fraction in [0, 1) of the rows (rounded up, as HuggingFace's
  // train_test_split does), or an exact count. At most one of them is set.
  std::optional<double> validation_fraction;
  std::optional<std::size_t> validation_count;
  bool shuffle = true;
  std::uint64_t seed = 42;
};

struct Split {
  std::vector<std::size_t> train;       // row indices, in training order
  std::vector<std::size_t> validation;  // the first rows of the (shuffled) order
};

// Throws tessera::Error for a fraction outside [0, 1), both sizes set, or a split that
// leaves no training row.
Split split_rows(std::size_t n, const SplitOptions& options);

}  // namespace tessera::data
