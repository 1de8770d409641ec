#pragma once
// A run's time series as the dashboard draws them and the runs database stores them.
#include <QList>
#include <QMetaType>
#include <QString>
#include <QStringList>
#include <cmath>
#include <cstdint>
#include <limits>

namespace tessera::ui {

inline constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();
inline bool present(double v) {
  return !std::isnan(v);
}

// "42 s", "3 min 5 s", "2 h 10 min"; "—" when unknown.
inline QString format_duration(double seconds) {
  if (!present(seconds) || seconds < 0) return "—";
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s < 60) return QString("%1 s").arg(s);
  if (s < 3600) return QString("%1 min %2 s").arg(s / 60).arg(s % 60);
  return QString("%1 h %2 min").arg(s / 3600).arg((s % 3600) / 60);
}

// A step's time: "250 ms" below a second, else as format_duration.
inline QString format_step_time(double seconds) {
  if (seconds > 0 && seconds < 1) return QString("%1 ms").arg(seconds * 1000, 0, 'f', 0);
  return format_duration(seconds);
}

// Throughput is drawn as the mean of its last kThroughputWindow steps (the dashboard and
// Compare alike): checkpoints and evaluations make single steps slow, and drawn raw a long
// run's throughput becomes a solid block of spikes.
inline constexpr qsizetype kThroughputWindow = 25;

// The mean of the last `window` values added.
class TrailingMean {
 public:
  explicit TrailingMean(qsizetype window) : window_(window) {}
  double add(double value) {  // the mean with `value` in it
    values_.push_back(value);
    sum_ += value;
    if (values_.size() > window_) sum_ -= values_.takeFirst();
    return sum_ / double(values_.size());
  }
  void clear() {
    values_.clear();
    sum_ = 0;
  }

 private:
  qsizetype window_;
  QList<double> values_;
  double sum_ = 0;
};

// One rank's figures in a metric event of a job of several processes (its `ranks`).
struct RankMetric {
  int rank = 0;
  double loss = kMissing;
  double tokens_per_s = kMissing;  // its tokens over its own step time
  // Strategy hybrid: its place on the dp × pp × tp mesh (-1 when the event names none), and the
  // share of its step spent waiting for other pipeline stages (pipeline_idle_s / step_s).
  int dp = -1, pp = -1, tp = -1;
  double pipeline_idle_share = kMissing;
};

struct MetricPoint {
  std::int64_t step = 0;
  double t = 0;  // seconds since the Unix epoch
  double loss = kMissing, lr = kMissing, grad_norm = kMissing, tokens_per_s = kMissing,
         eval_loss = kMissing;
  // Preference tuning (the event's `preference`): the mean rewards of the chosen (desirable) and
  // rejected (undesirable) completions, their margin, the share of pairs ranked right, KTO's KL.
  double reward_chosen = kMissing, reward_rejected = kMissing, reward_margin = kMissing,
         reward_accuracy = kMissing, kl = kMissing;
  QList<RankMetric> ranks;  // empty: one process
};

inline const QStringList& memory_categories() {
  static const QStringList kCategories = {"weights", "gradients", "optimizer", "activations_other"};
  return kCategories;
}

// Disk tier: chunk traffic between the disk and host memory, in bytes: totals since the run
// started and rates since the previous report (kMissing: not reported).
struct ChunkTraffic {
  double read_bytes = kMissing, written_bytes = kMissing;  // disk → host, host → disk
  double read_bytes_per_s = kMissing, written_bytes_per_s = kMissing;  // the same per second
  bool reported() const {
    return present(read_bytes) || present(written_bytes) || present(read_bytes_per_s) ||
           present(written_bytes_per_s);
  }
};

// One rank's memory in a memory event of a job of several processes (its `ranks`).
struct RankMemory {
  int rank = 0;
  QString host;  // "hostname (address)"
  double used = kMissing;
  double by_category[4] = {kMissing, kMissing, kMissing, kMissing};  // memory_categories()
};

struct MemorySample {
  double t = 0;
  QString tier;                                             // device | host | disk
  QString device;                                           // "cuda:0", "cpu", a disk path, …
  double used = 0, reserved = kMissing, budget = kMissing;  // bytes
  double system_used = kMissing;  // host tier: memory in use on the whole machine
  double by_category[4] = {kMissing, kMissing, kMissing, kMissing};  // memory_categories()
  ChunkTraffic traffic;                                              // disk tier only
  QList<RankMemory> ranks;  // empty: one process (the fields above are rank 0's)
};

struct CheckpointRecord {
  std::int64_t step = 0;
  QString path;
  double t = 0;
};

struct RawEvent {  // every event that is not a metric or memory sample, kept for the log
  std::int64_t seq = 0;
  double t = 0;
  QString type;
  QString json;
};

// New data since the last take (live) or a whole run (replay).
struct RunSeries {
  QList<MetricPoint> metrics;
  QList<MemorySample> memory;
  QStringList log;
  bool has_progress = false;
  QString phase;
  std::int64_t done = 0, total = 0;
  double eta_s = kMissing;
  QString last_error;               // message and hint of the last `error` event
  std::int64_t next_event_seq = 0;  // replay only: after the run's last recorded event
  bool empty() const {
    return metrics.isEmpty() && memory.isEmpty() && log.isEmpty() && !has_progress;
  }
  void append(const RunSeries& more);
};

}  // namespace tessera::ui
