#pragma once
// The studio's SQLite database of runs, metrics, memory samples, events, checkpoints and
// nodes. Versioned schema (table schema_version) with an ordered list of migrations, WAL
// journal, metrics written in batches by one writer thread (never a commit per row and
// never on the GUI thread). Reads run on worker threads with their own connections.
#include <QFuture>
#include <QList>
#include <QObject>
#include <QSqlDatabase>
#include <QString>
#include <QThread>
#include <functional>
#include <optional>

#include "ui/models/run_data.h"

namespace tessera::ui {

inline constexpr int kRunsSchemaVersion = 6;

struct RunRecord {
  QString id;
  QString name, model, dataset, method;
  QString status;   // starting | running | completed | failed | stopped | interrupted
  QString failure;  // why it failed
  double started_at = kMissing, ended_at = kMissing;  // seconds since the Unix epoch
  QString output_dir;
  QString spec_json;
  // The last recorded losses: final once the run has ended, the latest while it runs.
  double final_loss = kMissing, final_eval_loss = kMissing;
  // A run launched detached (it outlives the studio): its process, and how many bytes of its
  // events.jsonl the database holds, so a restarted studio reattaches where it left off.
  qint64 pid = 0;
  qint64 events_offset = 0;
  std::int64_t steps_done = 0, total_steps = 0;  // from the last training progress (0: none)
  // Not stored: list_runs found no folder at output_dir (moved or deleted since the run).
  bool folder_missing = false;
};

// One open connection on the calling thread, removed again when this goes away.
class DbConnection {
 public:
  explicit DbConnection(const QString& path);  // throws tessera::Error (Io) on failure
  ~DbConnection();
  DbConnection(const DbConnection&) = delete;
  DbConnection& operator=(const DbConnection&) = delete;
  QSqlDatabase& db() { return db_; }

 private:
  QString name_;
  QSqlDatabase db_;
};

// Schema functions on an open connection; they throw tessera::Error naming the statement.
int schema_version(QSqlDatabase& db);  // 0: a new, empty database
// Applies the migrations from the current version up to `target` in one transaction each.
void migrate(QSqlDatabase& db, int target = kRunsSchemaVersion);
// Runs left "running"/"starting" by an app that quit (or crashed) become "interrupted", except
// detached ones whose process still runs: those are added to `alive` (to reattach).
int mark_interrupted_runs(QSqlDatabase& db, QList<RunRecord>* alive);
// Whether `pid` is still a live (not zombie) process working in `run_dir` (a run the studio
// started there).
bool run_process_alive(qint64 pid, const QString& run_dir);
QList<RunRecord> list_runs(QSqlDatabase& db);
std::optional<RunRecord> find_run(QSqlDatabase& db, const QString& id);
RunSeries load_run_series(QSqlDatabase& db, const QString& id);
QList<CheckpointRecord> load_checkpoints(QSqlDatabase& db, const QString& id);
void delete_run(QSqlDatabase& db, const QString& id);

// What the monitor hands to the writer thread every few hundred milliseconds.
struct RunBatch {
  QString run_id;
  std::optional<RunRecord> upsert;  // insert or replace the run's row
  QList<MetricPoint> metrics;
  QList<MemorySample> memory;
  QList<RawEvent> events;
  QList<CheckpointRecord> checkpoints;
  std::optional<qint64> pid;            // set with the rows above
  std::optional<qint64> events_offset;  // bytes of events.jsonl these rows complete
  std::optional<std::pair<std::int64_t, std::int64_t>> steps;  // training steps done, total
  // Status change (applied after the rows above): status, failure, ended_at.
  std::optional<QString> status;
  QString failure;
  double ended_at = kMissing;
};

class DbWriterWorker;

// Owns the database file: migrates it on open, marks interrupted runs, and runs the writer
// thread. Reads are asynchronous (QtConcurrent, their own connections).
class RunsStore : public QObject {
  Q_OBJECT
 public:
  // Opens (creating and migrating) `path`. Throws tessera::Error when it cannot.
  explicit RunsStore(const QString& path, QObject* parent = nullptr);
  ~RunsStore() override;

  const QString& path() const { return path_; }
  int interrupted_on_open() const { return interrupted_on_open_; }
  // Runs recorded "running" whose detached process was still alive when the store opened.
  const QList<RunRecord>& alive_on_open() const { return alive_on_open_; }

  void submit(RunBatch batch);  // queued to the writer thread
  void flush();                 // waits until every submitted batch is written

  QFuture<QList<RunRecord>> list_runs_async() const;
  QFuture<RunSeries> load_series_async(const QString& id) const;
  QFuture<void> delete_run_async(const QString& id);

 Q_SIGNALS:
  void written(const QString& run_id);  // a batch for run_id is committed
  void writeFailed(const QString& message);

 private:
  QString path_;
  int interrupted_on_open_ = 0;
  QList<RunRecord> alive_on_open_;
  QThread thread_;
  DbWriterWorker* worker_ = nullptr;
};

}  // namespace tessera::ui

Q_DECLARE_METATYPE(tessera::ui::RunBatch)
