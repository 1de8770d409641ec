#pragma once
// Which chunks a bounded cache holds and which it reads ahead (Gemini): the order in which a
// step uses its chunks is traced during the first step and is every later step's order, so
// after each use the next chunk of that order is fetched ahead, and room is made by evicting the
// chunk the order needs again last (Belady's choice; while the first step is traced, the least
// recently used). Gemini's gathered chunks and the planner's simulation of them decide through
// this one policy, so the plan and the run make the same choices. Torch-free: what "held" and
// "evict" mean is the caller's.
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace tessera::memory {

// Gemini (plugins/gemini/gemini_plugin.cpp, and the planner that replays it): whole chunks
// gathered at once per rank (those in use, the one gathered ahead, recently used ones: a block's
// parameters may sit in two chunks, and a tied output head uses the embedding's again; one process
// gathers only chunks whose shard is elsewhere: from disk, or from host memory to a device), and
// reduce-scatters in flight before backward waits for the oldest (each holds a whole float32
// gradient chunk until it is done).
inline constexpr std::size_t kGatheredChunks = 4;
inline constexpr std::size_t kReducesInFlight = 2;
// With a device tier: chunks whose device copies for the update (a float32 shard copied up, or new
// bf16 values on their way down) are alive at once, and the host staging buffers of the CPU Adam's
// new values for shards on the device (each the largest such shard's size).
inline constexpr std::size_t kStagedUpdates = 2;
// Gradient shards on their way to the disk tier at once.
inline constexpr std::size_t kGradientWritesInFlight = 2;

class ChunkCachePolicy {
 public:
  explicit ChunkCachePolicy(std::size_t chunks = 0) { resize(chunks); }
  void resize(std::size_t chunks) { last_use_.assign(chunks, 0); }

  // A use of chunk `c` now (the least-recently-used order while tracing counts these).
  void touch(std::size_t c) { last_use_.at(c) = ++clock_; }
  // While tracing: `c` joins the traced order (a use right after its own use is one use).
  void record(std::size_t c);
  bool tracing() const { return tracing_; }
  // Ends the first step: its traced order is every later step's. Idempotent.
  void end_tracing();
  // An order known beforehand (the planner's), with no tracing step.
  void use_order(std::vector<std::size_t> order);
  const std::vector<std::size_t>& order() const { return trace_; }
  // Between steps (the update in between): the next use is the order's first, even of the chunk
  // used last (the order, wrapping round, may end with the chunk it begins with).
  void next_step() { matched_.reset(); }

  // After a use of `c`: the chunk the order uses next, to fetch ahead, found from where the last
  // use was (one comparison per use while a step follows the order). Uses of one chunk in a row
  // (several modules in one chunk) are one use of the order, as record() traces them. None when `c`
  // is not in the order, or when the next use is the next step's first and `across_steps` is false
  // (gathered chunks: the update in between changes every chunk).
  std::optional<std::size_t> next_after(std::size_t c, bool across_steps);

  // The chunks the block computing now uses: never evicted to make room.
  void pin(std::vector<std::size_t> chunks) { pinned_ = std::move(chunks); }
  void unpin() { pinned_.clear(); }
  bool pinned(std::size_t c) const;

  // Evicts (through `evict`) chunks that `holds` says are held, and that are not pinned, until
  // fewer than `limit` are held: each time the one the order needs again last (the least
  // recently used while tracing; the lowest index on ties). False when every held chunk is
  // pinned before that.
  bool make_room(std::size_t limit, const std::function<bool(std::size_t)>& holds,
                 const std::function<void(std::size_t)>& evict);

  // How many uses along the order until chunk `c` is used again (the order's length: never).
  std::size_t uses_until_needed(std::size_t c) const;

 private:
  void index_order();

  std::vector<std::uint64_t> last_use_;
  std::uint64_t clock_ = 0;
  std::vector<std::size_t> pinned_;
  std::vector<std::size_t> trace_;
  std::vector<std::vector<std::size_t>> positions_;  // per chunk: where trace_ has it, ascending
  std::size_t cursor_ = 0;                           // the order's position after the last use
  std::optional<std::size_t> matched_;               // the order's position of the last use
  bool tracing_ = true;
};

}  // namespace tessera::memory
