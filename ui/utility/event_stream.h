#pragma once
// Reading the engine's event stream (docs/events.md): JSON lines split out of a byte stream
// that arrives in arbitrary chunks, and each event turned into chart points, log text and
// database rows.
#include <QByteArray>
#include <QString>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "ui/models/run_data.h"
#include "ui/models/runs_db.h"

namespace tessera::ui {

// Splits a stream into lines; a partial last line waits for the rest.
class LineSplitter {
 public:
  void feed(const QByteArray& bytes) { buffer_.append(bytes); }
  bool next(QByteArray& line);  // false when no complete line is buffered
  QByteArray take_rest();       // the unterminated tail (at end of stream)
  bool has_complete_line() const { return buffer_.indexOf('\n', scan_from_) >= 0; }
  qsizetype buffered() const { return buffer_.size() - consumed_; }
  // Bytes of the stream handed out as complete lines (with their newlines) since the start.
  qint64 consumed_total() const { return consumed_total_; }

 private:
  QByteArray buffer_;
  qint64 consumed_total_ = 0;
  qsizetype consumed_ = 0;
  qsizetype scan_from_ = 0;
};

// One line of log text for an event, or "" for events shown only in charts.
QString describe_event(const nlohmann::json& event);

// The `ranks` arrays of metric and memory events (docs/events.md), and back (the runs
// database keeps them as this JSON).
QList<RankMetric> metric_ranks_from_json(const nlohmann::json& ranks);
QList<RankMemory> memory_ranks_from_json(const nlohmann::json& ranks);
nlohmann::json to_json(const QList<RankMetric>& ranks);
nlohmann::json to_json(const QList<RankMemory>& ranks);

// What applying events has learned about the run so far.
struct StreamState {
  std::int64_t seq = 0;
  QString done_status;  // from the `done` event: completed | stopped | failed
  QString last_error;   // message (and hint) of the last `error` event
  // Training steps done and planned: from the last training progress, then the `done` event's
  // `steps` / `total_steps` (where a stopped run ended; progress comes only every few steps).
  std::int64_t steps_done = 0, total_steps = 0;
  std::int64_t last_checkpoint_step = -1;  // of the last `checkpoint` event; -1: none yet
};

// Applies one event: chart data into `delta`, rows into `batch`.
void apply_event(const nlohmann::json& event, const QByteArray& line, StreamState& state,
                 RunSeries& delta, RunBatch& batch);

}  // namespace tessera::ui
