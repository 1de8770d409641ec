#pragma once
// What gemini does with chunks in the disk tier
// (memory/disk_store.h): which chunks static placement puts there, and streaming the optimizer
// chunks through an update, a load or a save one at a time, the next one read ahead and the
// last one written back behind.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/units.h"
#include "memory/chunk_layout.h"

namespace tessera::plugins {

// A size option of strategy.options (chunk_size, host_budget, device_budget; validated by
// job/strategies.h): none when absent or "auto", else its bytes.
inline std::optional<std::uint64_t> size_option(const nlohmann::json& options,
                                                const std::string& key) {
  if (!options.is_object() || !options.contains(key)) return std::nullopt;
  const nlohmann::json& value = options[key];
  if (value.is_number()) return value.get<std::uint64_t>();
  if (value == "auto") return std::nullopt;
  return core::parse_byte_size(value.get<std::string>(), "strategy.options." + key);
}

// Static placement: which chunks go to disk (memory/chunk_layout.h, shared with the planner).
using memory::choose_offloaded_chunks;

// How stream_disk_chunks moves chunk `c`: `read` makes its buffers and starts their reads,
// `arrived` (optional) runs once they are in, `write` starts writing back what the body
// changed, `written` frees the buffers once those writes are done.
struct DiskChunkTransfers {
  std::function<bool(std::size_t)> on_disk;
  std::function<std::vector<std::future<void>>(std::size_t)> read;
  std::function<void(std::size_t)> arrived;
  std::function<std::vector<std::future<void>>(std::size_t)> write;
  std::function<void(std::size_t)> written;
};

// Placement auto keeps this share of the host budget free, as the planner does.
inline constexpr double kAutoHeadroom = 0.1;

// Placement auto, after the first step: how many disk-backed items of `item_bytes` (parameter
// chunks or shards) may stay in memory. The measured `peak` less the `held` items it included
// is the rest of the process; the items that fit beside it in `budget` (less the headroom and
// one item of margin), at least `at_least` and at most `on_disk`.
inline std::size_t items_within_budget(std::uint64_t peak, std::uint64_t held, std::uint64_t budget,
                                       std::uint64_t item_bytes, std::size_t at_least,
                                       std::size_t on_disk) {
  const double rest = static_cast<double>(peak > held ? peak - held : 0);
  const double room = static_cast<double>(budget) * (1.0 - kAutoHeadroom) - rest;
  const double items = std::floor(room / static_cast<double>(item_bytes)) - 1.0;
  return std::max(at_least,
                  static_cast<std::size_t>(std::clamp(items, 0.0, static_cast<double>(on_disk))));
}

// Placement auto after the first step: of the items streamed from their home
// (`streamed_bytes`: each chunk's or shard's bytes), `current` of which were held at the
// measured `peak`, how many stay in memory from now on (items_within_budget, each counted at the
// largest); none when nothing streams or nothing was measured.
inline std::optional<std::size_t> cache_limit_after_peak(
    const std::vector<std::uint64_t>& streamed_bytes, std::size_t current, std::uint64_t peak,
    std::uint64_t budget, std::size_t at_least) {
  const std::uint64_t item =
      streamed_bytes.empty() ? 0 : *std::max_element(streamed_bytes.begin(), streamed_bytes.end());
  if (item == 0 || peak == 0) return std::nullopt;
  const std::size_t count = streamed_bytes.size();
  return items_within_budget(peak, std::min(current, count) * item, budget, item, at_least, count);
}

// Runs body(c) for c = 0 … count − 1 in order, every chunk on disk resident during its call:
// the next chunk on disk is read while the body works on this one, and this one is written back
// while the body works on the next (at most three chunks' buffers at once). An I/O error (a full
// disk) is thrown once nothing in flight still uses a buffer.
inline void stream_disk_chunks(std::size_t count, const DiskChunkTransfers& io,
                               const std::function<void(std::size_t)>& body) {
  struct Pending {
    std::size_t chunk = 0;
    std::vector<std::future<void>> transfers;
  };
  const auto start_read = [&](std::size_t c) -> std::optional<Pending> {
    for (; c < count; ++c)
      if (io.on_disk(c)) return Pending{c, io.read(c)};
    return std::nullopt;
  };
  const auto wait_all = [](Pending& p) {
    for (std::future<void>& f : p.transfers)
      if (f.valid()) f.get();
  };
  std::optional<Pending> next_read;
  std::deque<Pending> writes;
  try {
    next_read = start_read(0);
    for (std::size_t c = 0; c < count; ++c) {
      const bool on_disk = io.on_disk(c);
      if (on_disk) {
        wait_all(*next_read);  // this chunk's reads
        next_read = start_read(c + 1);
        if (io.arrived) io.arrived(c);
      }
      body(c);
      if (!on_disk) continue;
      writes.push_back(Pending{c, io.write(c)});
      while (writes.size() > 1) {
        wait_all(writes.front());
        io.written(writes.front().chunk);
        writes.pop_front();
      }
    }
    while (!writes.empty()) {
      wait_all(writes.front());
      io.written(writes.front().chunk);
      writes.pop_front();
    }
  } catch (...) {
    // Nothing may outlive its buffer: wait for what is in flight, then report the first error.
    const auto wait_quietly = [](Pending& p) {
      for (std::future<void>& f : p.transfers)
        if (f.valid()) f.wait();
    };
    if (next_read) wait_quietly(*next_read);
    for (Pending& w : writes) wait_quietly(w);
    throw;
  }
}

// The update of optimizer state on disk in slices: `slices` in order, each read
// (start_read: its buffers made and their reads started into its `io`) kUpdateSlicesAhead ahead
// of the one being updated, then written behind it (start_write), at most kUpdateSlicesAhead
// writes in flight before the oldest is waited for and its `arrays` handed to `recycle` (which
// keeps them for a later slice's reads, or frees them). `update(i)` runs once slice i is in,
// `written(i)` once its write has started. An I/O error is thrown once nothing in flight still
// uses a buffer.
template <typename Slice, typename Read, typename Update, typename Write, typename Written,
          typename Recycle>
void stream_update_slices(std::vector<Slice>& slices, Read&& start_read, Update&& update,
                          Write&& start_write, Written&& written, Recycle&& recycle) {
  constexpr std::size_t ahead = memory::kUpdateSlicesAhead;
  const auto wait_all = [](Slice& slice) {
    for (std::future<void>& f : slice.io)
      if (f.valid()) f.get();
    slice.io.clear();
  };
  std::deque<Slice*> writes;
  try {
    for (std::size_t i = 0; i < std::min(ahead, slices.size()); ++i) start_read(slices[i]);
    for (std::size_t i = 0; i < slices.size(); ++i) {
      Slice& slice = slices[i];
      wait_all(slice);
      if (i + ahead < slices.size()) start_read(slices[i + ahead]);
      update(i);
      start_write(slice);
      writes.push_back(&slice);
      while (writes.size() > ahead) {
        wait_all(*writes.front());
        recycle(*writes.front());
        writes.pop_front();
      }
      written(i);
    }
    while (!writes.empty()) {
      wait_all(*writes.front());
      recycle(*writes.front());
      writes.pop_front();
    }
  } catch (...) {
    for (Slice& slice : slices)
      for (std::future<void>& f : slice.io)
        if (f.valid()) f.wait();
    throw;
  }
}

}  // namespace tessera::plugins
