#include "model/dropout.h"

#include <ATen/CPUGeneratorImpl.h>

#include <vector>

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

void begin_dropout_layer(std::int64_t layer) {
  // Sites before layer 0 (the embedding's) are 0 …; a layer has far fewer than 2^16 sites.
  if (current_stream) current_stream->site = (layer + 1) << 16;
}

void begin_sequence_blocks(std::int64_t length, std::int64_t block, std::int64_t blocks) {
  if (!current_stream) return;
  current_stream->sequence_length = length;
  current_stream->sequence_block = block;
  current_stream->sequence_blocks = blocks;
}

void end_sequence_blocks() {
  if (current_stream) current_stream->sequence_blocks = 1;
}

bool layout_free_dropout_active(double p, bool training) {
  return training && p > 0.0 && current_stream.has_value();
}

namespace {

// x times the mask the scope's next site draws, scaled by 1 / (1 - p): draw(mask, stream at the
// site, keep, generator) fills the mask by reseeding the generator for each part it draws.
template <typename Draw>
torch::Tensor drop(const torch::Tensor& x, double p, const Draw& draw) {
  DropoutStream& stream = *current_stream;
  DropoutStream at_site = stream;
  at_site.site = stream.site++;
  if (p >= 1.0) return x * 0;
  const double keep = 1.0 - p;
  torch::Tensor mask = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  at::Generator generator = private_generator(x.device());
  {
    torch::NoGradGuard no_grad;  // (bernoulli_ takes the generator's lock itself)
    draw(mask, at_site, keep, generator);
    mask.div_(keep);
  }
  return x * mask;
}

}  // namespace

torch::Tensor dropout_heads(const torch::Tensor& probabilities, double p, bool training) {
  if (!training || p <= 0.0) return probabilities;
  if (!current_stream) return torch::dropout(probabilities, p, /*train=*/true);
  return drop(probabilities, p,
              [](torch::Tensor& mask, const DropoutStream& s, double keep, at::Generator& g) {
                const std::int64_t heads = mask.size(1);
                for (std::int64_t i = 0; i < mask.size(0); ++i)
                  for (std::int64_t h = 0; h < heads; ++h) {
                    g.set_current_seed(mix(row_seed(s, s.first_row + i),
                                           static_cast<std::uint64_t>(s.head_block * heads + h)));
                    mask.select(0, i).select(0, h).bernoulli_(keep, g);
                  }
              });
}

torch::Tensor dropout_block(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  if (!current_stream || current_stream->blocks <= 1) return model::dropout(x, p, training);
  return drop(x, p, [](torch::Tensor& mask, const DropoutStream& s, double keep, at::Generator& g) {
    std::vector<std::int64_t> whole = mask.select(0, 0).sizes().vec();
    const std::int64_t width = whole.back();
    whole.back() = width * s.blocks;
    for (std::int64_t i = 0; i < mask.size(0); ++i) {
      g.set_current_seed(row_seed(s, s.first_row + i));
      torch::Tensor row = torch::empty(whole, mask.options());
      row.bernoulli_(keep, g);
      mask.select(0, i).copy_(row.narrow(-1, s.head_block * width, width));
    }
  });
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  if (!current_stream) return torch::dropout(x, p, /*train=*/true);
  return drop(x, p, [](torch::Tensor& mask, const DropoutStream& s, double keep, at::Generator& g) {
    // A block of the positions (sequence parallelism): the whole row's mask, then the block.
    // (A tensor of every position inside the layers, a LoRA input, has the row's length.)
    const std::int64_t block =
        s.sequence_blocks > 1 ? (s.sequence_length + s.sequence_blocks - 1) / s.sequence_blocks : 0;
    const bool blocked =
        block > 0 && mask.dim() >= 2 && mask.size(1) == block && block != s.sequence_length;
    for (std::int64_t i = 0; i < mask.size(0); ++i) {
      g.set_current_seed(row_seed(s, s.first_row + i));
      if (!blocked) {
        mask.select(0, i).bernoulli_(keep, g);
        continue;
      }
      std::vector<std::int64_t> whole = mask.select(0, i).sizes().vec();
      whole[0] = s.sequence_length;
      torch::Tensor row = torch::empty(whole, mask.options());
      row.bernoulli_(keep, g);
      whole[0] = block * s.sequence_blocks - s.sequence_length;  // the padding: kept
      row = torch::cat({row, torch::ones(whole, mask.options())}, 0);
      mask.select(0, i).copy_(row.narrow(0, s.sequence_block * block, block));
    }
  });
}

}  // namespace tessera::model
