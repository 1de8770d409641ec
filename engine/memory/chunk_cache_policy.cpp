#include "memory/chunk_cache_policy.h"

#include <algorithm>

namespace tessera::memory {

void ChunkCachePolicy::record(std::size_t c) {
  if (tracing_ && (trace_.empty() || trace_.back() != c)) trace_.push_back(c);
}

void ChunkCachePolicy::end_tracing() {
  if (!tracing_) return;
  tracing_ = false;
  index_order();
}

void ChunkCachePolicy::use_order(std::vector<std::size_t> order) {
  trace_ = std::move(order);
  cursor_ = 0;
  matched_.reset();
  tracing_ = false;
  index_order();
}

void ChunkCachePolicy::index_order() {
  std::size_t chunks = last_use_.size();
  for (std::size_t c : trace_) chunks = std::max(chunks, c + 1);
  positions_.assign(chunks, {});
  for (std::size_t at = 0; at < trace_.size(); ++at) positions_[trace_[at]].push_back(at);
}

std::optional<std::size_t> ChunkCachePolicy::next_after(std::size_t c, bool across_steps) {
  if (trace_.empty()) return std::nullopt;
  // A use right after a use of the same chunk is the same use of the order (the trace holds it
  // once): the cursor stays. Searching on from the cursor instead found the chunk's next use,
  // further along, and every later fetch ahead and eviction followed the wrong place.
  if (!(matched_ && trace_[*matched_] == c)) {
    std::size_t at = cursor_;
    for (std::size_t n = 0; n < trace_.size() && trace_[at] != c; ++n)
      at = (at + 1) % trace_.size();
    if (trace_[at] != c) return std::nullopt;  // a chunk the order never uses
    matched_ = at;
    cursor_ = (at + 1) % trace_.size();
  }
  if (cursor_ == 0 && !across_steps) return std::nullopt;
  return trace_[cursor_];
}

bool ChunkCachePolicy::pinned(std::size_t c) const {
  return std::find(pinned_.begin(), pinned_.end(), c) != pinned_.end();
}

bool ChunkCachePolicy::make_room(std::size_t limit, const std::function<bool(std::size_t)>& holds,
                                 const std::function<void(std::size_t)>& evict) {
  const std::size_t chunks = std::max(last_use_.size(), positions_.size());
  std::size_t held = 0;
  for (std::size_t c = 0; c < chunks; ++c) held += holds(c) ? 1 : 0;
  for (; held >= limit; --held) {
    std::optional<std::size_t> victim;
    for (std::size_t c = 0; c < chunks; ++c) {
      if (!holds(c) || pinned(c)) continue;
      if (!victim || (tracing_ ? last_use_.at(c) < last_use_.at(*victim)
                               : uses_until_needed(c) > uses_until_needed(*victim)))
        victim = c;
    }
    if (!victim) return false;
    evict(*victim);
  }
  return true;
}

std::size_t ChunkCachePolicy::uses_until_needed(std::size_t c) const {
  if (c >= positions_.size() || positions_[c].empty()) return trace_.size();
  const std::vector<std::size_t>& positions = positions_[c];
  auto next = std::lower_bound(positions.begin(), positions.end(), cursor_);
  if (next != positions.end()) return *next - cursor_;
  return positions.front() + trace_.size() - cursor_;  // next time round
}

}  // namespace tessera::memory
