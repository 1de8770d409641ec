#pragma once
// Bytes a ProcessGroup hands to c10d, per collective kind (issue 12): what the plugins
// communicate, for the `metric` event's `traffic` (docs/events.md) and the planner. Torch-free,
// so the trainer's and runner's event code can carry it.
//
// Two numbers per kind, both for this rank:
//   bytes       the payload handed to c10d, S: the tensor of an all_reduce or broadcast, the
//               input of a reduce_scatter, the output (the gathered tensor) of an all_gather.
//               Counted exactly when the collective is issued.
//   ring_bytes  what a ring algorithm sends from each rank for that payload over N ranks:
//               all_reduce 2·(N−1)/N·S, reduce_scatter and all_gather (N−1)/N·S, broadcast
//               (N−1)/N·S (a pipelined ring: every rank but the last forwards S; the mean per
//               rank), send S (a point-to-point send; receives are not counted, the sender
//               counts them). The textbook lower bound a strategy's theoretical volume is written
//               in, so comparing ring_bytes with it compares like with like.
// Neither is what Gloo itself writes to its sockets: Gloo's reduce_scatter all-reduces the
// whole input and keeps this rank's block (2·(N−1)/N·S), and its broadcast is a tree from the
// root. tests/bench/bench_dist.py measures that against /proc/<pid>/io and says so.
// Barriers carry no payload and are not counted. A group of one process counts nothing.
#include <cstdint>

namespace tessera::dist {

struct CollectiveTraffic {
  std::uint64_t calls = 0;
  std::uint64_t bytes = 0;
  std::uint64_t ring_bytes = 0;

  CollectiveTraffic operator-(const CollectiveTraffic& earlier) const {
    return {calls - earlier.calls, bytes - earlier.bytes, ring_bytes - earlier.ring_bytes};
  }
  CollectiveTraffic operator+(const CollectiveTraffic& other) const {
    return {calls + other.calls, bytes + other.bytes, ring_bytes + other.ring_bytes};
  }
};

struct Traffic {
  CollectiveTraffic all_reduce;
  CollectiveTraffic reduce_scatter;
  CollectiveTraffic all_gather;
  CollectiveTraffic broadcast;
  CollectiveTraffic send;  // point to point (pipeline stages)

  // Every kind together.
  CollectiveTraffic total() const {
    return all_reduce + reduce_scatter + all_gather + broadcast + send;
  }
  // What happened between `earlier` and this reading of the same group's counters.
  Traffic operator-(const Traffic& earlier) const {
    return {all_reduce - earlier.all_reduce, reduce_scatter - earlier.reduce_scatter,
            all_gather - earlier.all_gather, broadcast - earlier.broadcast, send - earlier.send};
  }
};

// ring_bytes for a payload of `bytes` over `ranks` ranks: `factor`·(ranks−1)/ranks·bytes,
// factor 2 for all_reduce and 1 for the others; 0 for one rank.
constexpr std::uint64_t ring_volume(std::uint64_t bytes, int ranks, int factor) {
  if (ranks <= 1) return 0;
  return static_cast<std::uint64_t>(factor) * bytes * static_cast<std::uint64_t>(ranks - 1) /
         static_cast<std::uint64_t>(ranks);
}

}  // namespace tessera::dist
