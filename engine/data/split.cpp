#include "data/split.h"

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "core/error.h"

namespace tessera::data {

namespace {

// Uniform in [0, bound) by rejection: portable, unlike std::uniform_int_distribution.
std::uint64_t bounded(std::mt19937_64& rng, std::uint64_t bound) {
  // 2^64 mod bound, computed without overflow.
  const std::uint64_t rejected = (std::numeric_limits<std::uint64_t>::max() % bound + 1) % bound;
  const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() - rejected;  // inclusive
  while (true) {
    const std::uint64_t r = rng();
    if (r <= limit) return r % bound;
  }
}

}  // namespace

std::vector<std::size_t> shuffled_indices(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 rng(seed);
  for (std::size_t i = n; i-- > 1;) {
    const auto j = static_cast<std::size_t>(bounded(rng, static_cast<std::uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

Split split_rows(std::size_t n, const SplitOptions& options) {
  if (options.validation_fraction && options.validation_count)
    throw_invalid("validation split: give a fraction or a count, not both");
  std::size_t validation = 0;
  if (options.validation_fraction) {
    const double f = *options.validation_fraction;
    if (!(f >= 0.0 && f < 1.0))
      throw_invalid("validation split: fraction " + std::to_string(f) + " is outside [0, 1)",
                    "use e.g. 0.1 for 10% of the rows");
    validation = static_cast<std::size_t>(std::ceil(f * static_cast<double>(n)));
  } else if (options.validation_count) {
    validation = *options.validation_count;
  }
  if (validation >= n && n > 0 && validation > 0)
    throw_invalid("validation split: " + std::to_string(validation) + " validation rows of " +
                      std::to_string(n) + " leave no training row",
                  "use a smaller validation size");
  if (n == 0) throw_invalid("validation split: the dataset has no rows");
  std::vector<std::size_t> order(n);
  if (options.shuffle) {
    order = shuffled_indices(n, options.seed);
  } else {
    std::iota(order.begin(), order.end(), std::size_t{0});
  }
  Split split;
  split.validation.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(validation));
  split.train.assign(order.begin() + static_cast<std::ptrdiff_t>(validation), order.end());
  return split;
}

}  // namespace tessera::data
