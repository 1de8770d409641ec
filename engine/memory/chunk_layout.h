#pragma once
// Packing tensors into chunks (Gemini): tensors keep their order (the order the model uses them),
// are never split, and a chunk closes when the next tensor does not fit. The chunk size is
// searched to waste the fewest bytes while leaving enough chunks to stream; with the searched
// size, a tensor larger than the most a chunk may hold (an embedding of a large vocabulary) gets
// a chunk of its own, as Colossal-AI's chunk manager does, so that the other chunks, which the
// disk tier streams and caches a few at a time, stay small.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::memory {

// Gemini's chunks are searched up to this size (and by the planner that packs as it does): large
// enough for the biggest embedding matrices of the models we train, small enough that several
// stream through the update at once.
inline constexpr std::int64_t kMaxChunkBytes = 64ll << 20;

// Gemini's update of an optimizer shard on disk streams it in slices of this many elements (8 MiB
// of floats), one read ahead of the slice being updated and one written behind it: the update's
// buffers, which the planner counts, are kUpdateSlicesInFlight slices.
inline constexpr std::int64_t kUpdateSliceElements = std::int64_t{1} << 21;
inline constexpr std::size_t kUpdateSlicesAhead = 1;
inline constexpr std::size_t kUpdateSlicesInFlight = 2 * kUpdateSlicesAhead + 1;
// Slice boundaries, and the arrays of such a chunk or shard on disk, are padded to this many
// elements (4 KiB of bf16 gradients, and so of float32 arrays): every range is aligned for
// O_DIRECT.
inline constexpr std::int64_t kUpdateSliceAlignment = 2048;
static_assert(kUpdateSliceElements % kUpdateSliceAlignment == 0);
inline constexpr std::int64_t sliced_array_elements(std::int64_t elements) {
  return (elements + kUpdateSliceAlignment - 1) / kUpdateSliceAlignment * kUpdateSliceAlignment;
}

struct ChunkSlot {
  std::size_t tensor = 0;   // index into the packed tensor list
  std::int64_t offset = 0;  // first element inside the chunk
  std::int64_t numel = 0;
};

struct ChunkSpec {
  std::int64_t capacity = 0;  // elements
  std::int64_t used = 0;      // elements holding tensors
  std::vector<ChunkSlot> slots;
};

struct ChunkLayout {
  std::int64_t capacity = 0;  // elements per chunk
  std::vector<ChunkSpec> chunks;
  std::int64_t wasted_elements() const;
};

// Packs `numels` (in order) into chunks of `capacity` elements. A tensor larger than a chunk
// gets a chunk of its own (its size rounded up to 1024 elements) when `alone_when_larger`;
// otherwise throws tessera::Error (InvalidInput) naming the tensor from `names` (a chunk size
// the user chose that is too small).
ChunkLayout pack_chunks(const std::vector<std::int64_t>& numels,
                        const std::vector<std::string>& names, std::int64_t capacity,
                        bool alone_when_larger = false);

// The capacity (a multiple of 1024 elements, at least the largest tensor of at most
// `max_chunk_elements`) that wastes the fewest elements when packed with the larger tensors
// alone, searched up to min(`max_chunk_elements`, total / `min_chunks`) so that small models
// still get several chunks to stream; ties go to the larger chunk.
std::int64_t search_chunk_capacity(const std::vector<std::int64_t>& numels,
                                   std::int64_t max_chunk_elements, int min_chunks = 8);

// Gemini's layout when the chunk size is "auto": the searched capacity, larger tensors alone.
ChunkLayout pack_chunks_auto(const std::vector<std::int64_t>& numels,
                             const std::vector<std::string>& names,
                             std::int64_t max_chunk_elements);

// Gemini's layout of tensors of `numels` elements of `element_bytes` each (the plugin, and the
// planner that replays it): chunks of `chunk_bytes` (the job's chunk_size), or without one the
// auto layout under kMaxChunkBytes.
ChunkLayout pack_gemini_chunks(const std::vector<std::int64_t>& numels,
                               const std::vector<std::string>& names, std::int64_t element_bytes,
                               std::optional<std::uint64_t> chunk_bytes);

// Static placement on disk (both gemini plugins, and the planner that replays them): the last
// chunks (by size) go to disk, as close to `fraction` of the total size as whole chunks allow; a
// chunk `eligible` marks false (when given) stays in memory and the choice goes on before it. It
// depends on the sizes alone, so the ranks of a sharded job, whose shards have equal sizes, all
// choose the same chunks.
std::vector<bool> choose_offloaded_chunks(const std::vector<std::uint64_t>& sizes, double fraction,
                                          const std::vector<bool>& eligible = {});

// Static placement over the three tiers (the sharded plugin, and the planner that replays it):
// chunks go to disk by `disk_fraction` among `may_go_to_disk` (choose_offloaded_chunks); with a
// device tier, the share `host_fraction` of the others stays in host memory by the same rule and
// the rest live on the device; without one, everything not on disk is in host memory.
enum class ChunkTier { Device, Host, Disk };
std::vector<ChunkTier> place_chunks(const std::vector<std::uint64_t>& sizes, double disk_fraction,
                                    double host_fraction, bool device_tier,
                                    const std::vector<bool>& may_go_to_disk = {});

}  // namespace tessera::memory
