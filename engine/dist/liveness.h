#pragma once
// Internal to engine/dist. Every rank bumps its own counter in the rendezvous store once per
// heartbeat interval and reads everyone's, from a thread with its own store connection. When a
// collective fails, the rank whose counter stopped moving (killed, crashed, stopped, cut off) is
// the one to name; when the store itself stops answering, that is rank 0, which hosts it.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

namespace tessera::dist {

class LivenessMonitor {
 public:
  struct Suspect {
    int rank = -1;
    std::string reason;  // e.g. "has sent no heartbeat for 3.2 s"
  };

  LivenessMonitor(std::string master_addr, std::uint16_t master_port, int rank, int world_size,
                  std::chrono::milliseconds interval);
  ~LivenessMonitor();  // stops and joins the thread
  LivenessMonitor(const LivenessMonitor&) = delete;
  LivenessMonitor& operator=(const LivenessMonitor&) = delete;

  // The rank among `ranks` (or rank 0, for the store) silent the longest, once silent for three
  // intervals; waits up to four intervals for that evidence, since a peer killed a moment ago
  // was still heard from just before.
  std::optional<Suspect> find_suspect(const std::vector<int>& ranks);

  // The failure some rank recorded first (its rank and description), if any; and recording ours
  // (first writer wins: returns what is recorded afterwards). Both give up at once when the
  // heartbeat thread has lost the store (they never reconnect themselves: a dead store would
  // cost a connect timeout each).
  std::optional<std::pair<int, std::string>> recorded_failure();
  std::optional<std::pair<int, std::string>> record_failure(int rank, const std::string& text);

 private:
  void run();
  void beat();              // one round trip; store_mutex_ held
  c10d::TCPStore& store();  // (re)connects; store_mutex_ held

  const std::string master_addr_;
  const std::uint16_t master_port_;
  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds silence_limit_;  // three intervals

  std::timed_mutex store_mutex_;  // guards store_
  c10::intrusive_ptr<c10d::TCPStore> store_;

  std::mutex state_mutex_;  // guards the fields below
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<std::int64_t> last_counts_;
  std::vector<std::chrono::steady_clock::time_point> last_heard_;
  std::chrono::steady_clock::time_point store_last_answered_;

  std::thread thread_;
};

}  // namespace tessera::dist
