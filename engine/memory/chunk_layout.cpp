#include "memory/chunk_layout.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::memory {

namespace {

constexpr std::int64_t kCapacityStep = 1024;  // elements: keeps chunk bytes 4 KiB-aligned

std::int64_t round_up(std::int64_t value, std::int64_t step) {
  return (value + step - 1) / step * step;
}

// Waste of packing `numels` with `capacity` (next fit, order kept, a larger tensor alone),
// without building the layout.
std::int64_t waste_of(const std::vector<std::int64_t>& numels, std::int64_t capacity) {
  std::int64_t waste = 0;
  std::int64_t used = 0;
  bool open = false;
  for (std::int64_t n : numels) {
    if (n > capacity) {
      if (open) waste += capacity - used;
      waste += round_up(n, kCapacityStep) - n;
      used = 0;
      open = false;
      continue;
    }
    if (open && used + n > capacity) {
      waste += capacity - used;
      used = 0;
    }
    used += n;
    open = true;
  }
  if (open) waste += capacity - used;
  return waste;
}

}  // namespace

std::int64_t ChunkLayout::wasted_elements() const {
  std::int64_t waste = 0;
  for (const ChunkSpec& c : chunks) waste += c.capacity - c.used;
  return waste;
}

ChunkLayout pack_chunks(const std::vector<std::int64_t>& numels,
                        const std::vector<std::string>& names, std::int64_t capacity,
                        bool alone_when_larger) {
  ChunkLayout layout;
  layout.capacity = capacity;
  bool open = false;  // whether the last chunk takes more tensors
  for (std::size_t i = 0; i < numels.size(); ++i) {
    const std::int64_t n = numels[i];
    if (n > capacity && alone_when_larger) {
      layout.chunks.push_back({round_up(n, kCapacityStep), n, {{i, 0, n}}});
      open = false;
      continue;
    }
    if (n > capacity)
      throw_invalid("strategy.options.chunk_size: tensor \"" +
                        (i < names.size() ? names[i] : std::to_string(i)) + "\" has " +
                        std::to_string(n) + " elements, more than a chunk of " +
                        std::to_string(capacity),
                    "use chunk_size \"auto\" or a size at least as large as the largest tensor");
    if (!open || layout.chunks.back().used + n > capacity) {
      layout.chunks.push_back({capacity, 0, {}});
      open = true;
    }
    ChunkSpec& chunk = layout.chunks.back();
    chunk.slots.push_back({i, chunk.used, n});
    chunk.used += n;
  }
  return layout;
}

std::int64_t search_chunk_capacity(const std::vector<std::int64_t>& numels,
                                   std::int64_t max_chunk_elements, int min_chunks) {
  std::int64_t largest = 0;  // of the tensors a chunk may hold with others
  std::int64_t total = 0;
  for (std::int64_t n : numels) {
    if (n <= max_chunk_elements) largest = std::max(largest, n);
    total += n;
  }
  const std::int64_t low = round_up(std::max<std::int64_t>(largest, 1), kCapacityStep);
  const std::int64_t streaming = total / std::max(min_chunks, 1);
  const std::int64_t high =
      std::max(low, round_up(std::min(max_chunk_elements, streaming), kCapacityStep));
  std::int64_t best = low;
  std::int64_t best_waste = waste_of(numels, low);
  for (std::int64_t c = low + kCapacityStep; c <= high; c += kCapacityStep) {
    const std::int64_t w = waste_of(numels, c);
    if (w <= best_waste) {
      best = c;
      best_waste = w;
    }
  }
  return best;
}

ChunkLayout pack_chunks_auto(const std::vector<std::int64_t>& numels,
                             const std::vector<std::string>& names,
                             std::int64_t max_chunk_elements) {
  return pack_chunks(numels, names, search_chunk_capacity(numels, max_chunk_elements),
                     /*alone_when_larger=*/true);
}

ChunkLayout pack_gemini_chunks(const std::vector<std::int64_t>& numels,
                               const std::vector<std::string>& names, std::int64_t element_bytes,
                               std::optional<std::uint64_t> chunk_bytes) {
  const std::int64_t bytes = chunk_bytes ? static_cast<std::int64_t>(*chunk_bytes) : kMaxChunkBytes;
  const std::int64_t max_elements = std::max<std::int64_t>(bytes / element_bytes, 1);
  return chunk_bytes ? pack_chunks(numels, names, max_elements)
                     : pack_chunks_auto(numels, names, max_elements);
}

std::vector<bool> choose_offloaded_chunks(const std::vector<std::uint64_t>& sizes, double fraction,
                                          const std::vector<bool>& eligible) {
  double total = 0.0;
  for (std::uint64_t size : sizes) total += static_cast<double>(size);
  const double target = fraction * total;
  std::vector<bool> on_disk(sizes.size(), false);
  double offloaded = 0.0;
  for (std::size_t c = sizes.size(); c-- > 0;) {
    const double size = static_cast<double>(sizes[c]);
    if (offloaded + size / 2.0 > target) break;
    if (!eligible.empty() && !eligible[c]) continue;
    on_disk[c] = true;
    offloaded += size;
  }
  return on_disk;
}

std::vector<ChunkTier> place_chunks(const std::vector<std::uint64_t>& sizes, double disk_fraction,
                                    double host_fraction, bool device_tier,
                                    const std::vector<bool>& may_go_to_disk) {
  const std::vector<bool> on_disk = choose_offloaded_chunks(sizes, disk_fraction, may_go_to_disk);
  std::vector<bool> in_memory(sizes.size());
  for (std::size_t c = 0; c < sizes.size(); ++c) in_memory[c] = !on_disk[c];
  const std::vector<bool> on_host =
      device_tier ? choose_offloaded_chunks(sizes, host_fraction, in_memory) : in_memory;
  std::vector<ChunkTier> tiers(sizes.size(), ChunkTier::Device);
  for (std::size_t c = 0; c < sizes.size(); ++c)
    if (on_disk[c])
      tiers[c] = ChunkTier::Disk;
    else if (on_host[c])
      tiers[c] = ChunkTier::Host;
  return tiers;
}

}  // namespace tessera::memory
