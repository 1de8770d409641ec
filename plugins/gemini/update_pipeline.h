#pragma once
// The update of optimizer chunks on disk pipelined with the next forward, as gemini runs it: a
// worker updates chunks in the order forward uses them and marks each one done; step() returns at
// once, and a block about to compute waits only for the chunks of its own parameters. Whatever else
// reads parameters, gradients or optimizer state waits for the whole update first (settle()), which
// is also where the worker's error surfaces.
#include <ATen/Parallel.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <future>
#include <mutex>
#include <vector>

namespace tessera::plugins {

class UpdatePipeline {
 public:
  // Marks chunk `c` updated (the worker calls it from inside `work`).
  using ChunkDone = std::function<void(std::size_t)>;
  // The update itself: `threads` is torch's intra-op thread count, which a thread torch did not
  // start does not see (the CPU Adam is given it).
  using Work = std::function<void(const ChunkDone& done, int threads)>;

  UpdatePipeline() = default;
  UpdatePipeline(const UpdatePipeline&) = delete;
  UpdatePipeline& operator=(const UpdatePipeline&) = delete;
  ~UpdatePipeline() { wait_quietly(); }

  // Starts `work` on a worker; of `chunk_count` chunks, those in `pending` are not updated until
  // it marks them so (the others are, throughout).
  void start(std::size_t chunk_count, const std::vector<std::size_t>& pending, Work work) {
    settle();
    {
      std::lock_guard lock(mutex_);
      updated_.assign(chunk_count, 1);
      for (std::size_t c : pending) updated_[c] = 0;
      finished_ = false;
    }
    const int threads = at::get_num_threads();
    worker_ = std::async(std::launch::async, [this, work = std::move(work), threads] {
      struct Finished {
        UpdatePipeline* pipeline;
        ~Finished() {
          std::lock_guard lock(pipeline->mutex_);
          pipeline->finished_ = true;
          pipeline->changed_.notify_all();
        }
      } finished{this};
      work(
          [this](std::size_t c) {
            std::lock_guard lock(mutex_);
            updated_[c] = 1;
            changed_.notify_all();
          },
          threads);
    });
  }

  // Waits for the update to end, its error left unreported (a destructor's, whose error has no
  // one to go to).
  void wait_quietly() {
    if (worker_.valid()) worker_.wait();
  }

  // Whether an update started and nobody has waited for its end yet.
  bool running() const { return worker_.valid(); }

  // Returns once each of `chunks` is updated; if the update ended first (having failed, or with
  // a chunk it never marked), waits for it as settle() does.
  void wait_for(const std::vector<std::size_t>& chunks) {
    if (!worker_.valid()) return;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] {
        return finished_ || std::all_of(chunks.begin(), chunks.end(),
                                        [&](std::size_t c) { return updated_[c]; });
      });
      if (!finished_) return;
    }
    settle();
  }

  // Waits for the update to end; rethrows its error.
  void settle() {
    if (worker_.valid()) worker_.get();
  }

  // What the worker changes that other threads read (a chunk's buffers, for memory()) is
  // changed and read under this lock.
  std::mutex& mutex() const { return mutex_; }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<char> updated_;
  bool finished_ = true;
  std::future<void> worker_;
};

}  // namespace tessera::plugins
