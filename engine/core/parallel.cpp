#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::core {
namespace {

thread_local bool inside_piece = false;
constexpr int kSpinIterations = 20000;  // about 50 µs of pause instructions

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Workers wait for a job generation, run their piece, and report back. One job at a time.
class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void run(std::int64_t count, int pieces,
           const std::function<void(std::int64_t, std::int64_t)>& body) {
    std::lock_guard job_lock(job_mutex_);  // concurrent callers take turns
    ensure_workers(pieces - 1);
    const std::int64_t piece = (count + pieces - 1) / pieces;
    {
      std::lock_guard lock(mutex_);
      body_ = &body;
      count_ = count;
      piece_ = piece;
      pieces_ = pieces;
      remaining_ = pieces - 1;
      error_ = nullptr;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    run_piece(0, body);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return remaining_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void ensure_workers(int wanted) {
    while (static_cast<int>(workers_.size()) < wanted) {
      const int index = static_cast<int>(workers_.size()) + 1;  // piece 0 is the caller's
      std::uint64_t seen = 0;
      {
        std::lock_guard lock(mutex_);
        seen = generation_;
      }
      workers_.emplace_back([this, index, seen] { worker(index, seen); });
    }
  }

  void run_piece(int index, const std::function<void(std::int64_t, std::int64_t)>& body) {
    const std::int64_t begin = static_cast<std::int64_t>(index) * piece_;
    const std::int64_t end = std::min(count_, begin + piece_);
    if (begin >= end) return;
    inside_piece = true;
    try {
      body(begin, end);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    inside_piece = false;
  }

  void worker(int index, std::uint64_t seen) {
    for (;;) {
      const std::function<void(std::int64_t, std::int64_t)>* body = nullptr;
      // Jobs come in bursts (one per tensor of an optimizer step): spin briefly before sleeping,
      // so a job that follows within ~50 µs does not pay for a futex wake-up.
      for (int spin = 0;
           spin < kSpinIterations && published_.load(std::memory_order_acquire) == seen; ++spin)
        cpu_relax();
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        if (index >= pieces_) continue;  // this job needs fewer workers
        body = body_;
      }
      run_piece(index, *body);
      {
        std::lock_guard lock(mutex_);
        --remaining_;
      }
      done_.notify_one();
    }
  }

  std::mutex job_mutex_;
  std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(std::int64_t, std::int64_t)>* body_ = nullptr;
  std::int64_t count_ = 0;
  std::int64_t piece_ = 0;
  int pieces_ = 0;
  int remaining_ = 0;
  std::uint64_t generation_ = 0;
  std::atomic<std::uint64_t> published_{0};  // generation_, readable without the mutex
  std::exception_ptr error_;
  bool stopping_ = false;
};

Pool& pool() {
  static Pool instance;
  return instance;
}

}  // namespace

void parallel_for(std::int64_t count, std::int64_t grain, int threads,
                  const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (count <= 0) return;
  const std::int64_t by_grain =
      (count + std::max<std::int64_t>(grain, 1) - 1) / std::max<std::int64_t>(grain, 1);
  const int pieces = static_cast<int>(std::min<std::int64_t>(std::max(threads, 1), by_grain));
  if (pieces <= 1 || inside_piece) {
    body(0, count);
    return;
  }
  pool().run(count, pieces, body);
}

}  // namespace tessera::core
