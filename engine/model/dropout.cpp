#include "model/dropout.h"

#include <ATen/CPUGeneratorImpl.h>

namespace tessera::model {
namespace {

thread_local std::optional<DropoutStream> current_stream;

// splitmix64's finaliser: a well-mixed 64-bit value from each input, chained.
std::uint64_t mix(std::uint64_t h, std::uint64_t value) {
  std::uint64_t z = h ^ (value + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t row_seed(const DropoutStream& s, std::int64_t row) {
  std::uint64_t h = mix(0x7465737365726125ull, s.seed);
  h = mix(h, static_cast<std::uint64_t>(s.step));
  h = mix(h, static_cast<std::uint64_t>(row));
  return mix(h, static_cast<std::uint64_t>(s.site));
}

// A generator of x's device that this call alone uses (so reseeding it races with nobody).
at::Generator private_generator(const torch::Device& device) {
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>();
  return at::globalContext().defaultGenerator(device).clone();
}

}  // namespace

DropoutScope::DropoutScope(const DropoutStream& stream) : previous_(current_stream) {
  current_stream = stream;
}

DropoutScope::~DropoutScope() {
  current_stream = previous_;
}

std::optional<DropoutStream> current_dropout_stream() {
  return current_stream;
}

bool layout_free_dropout_active(double p, bool training) {
  return training && p > 0.0 && current_stream.has_value();
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  if (!current_stream) return torch::dropout(x, p, /*train=*/true);
  DropoutStream& stream = *current_stream;
  const std::int64_t site = stream.site++;
  if (p >= 1.0) return x * 0;
  DropoutStream at_site = stream;
  at_site.site = site;
  const double keep = 1.0 - p;
  torch::Tensor mask = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  at::Generator generator = private_generator(x.device());
  {
    torch::NoGradGuard no_grad;  // (bernoulli_ takes the generator's lock itself)
    for (std::int64_t i = 0; i < x.size(0); ++i) {
      generator.set_current_seed(row_seed(at_site, stream.first_row + i));
      mask.select(0, i).bernoulli_(keep, generator);
    }
    mask.div_(keep);
  }
  return x * mask;
}

}  // namespace tessera::model
