#pragma once
// Runs a training child process (`tessera-cli run JOB.json --events -`, or any program that
// writes the event stream to stdout), reads its events incrementally without blocking the
// event loop, records them in the runs database in batches, and keeps what the dashboard
// has not drawn yet. The child's exit decides the run's final status.
#include <QElapsedTimer>
#include <QFile>
#include <QObject>
#include <QProcess>
#include <QStringList>
#include <QTimer>

#include "ui/models/run_data.h"
#include "ui/models/runs_db.h"
#include "ui/utility/event_stream.h"

namespace tessera::ui {

class RunMonitor : public QObject {
  Q_OBJECT
 public:
  RunMonitor(RunsStore* store, QObject* parent = nullptr);
  ~RunMonitor() override;

  // Records `run` (status "running") and starts `program args`. The child's stdout is the
  // event stream; its stderr goes to the log.
  void start(RunRecord run, const QString& program, const QStringList& args,
             const QString& working_dir = {});
  // Detached: the child outlives the studio (quitting need not stop it). Its events go to the
  // run folder's events.jsonl (`args` must not redirect them), which is followed from
  // `run.events_offset`; its stderr to stderr.log there. The process id and how far the file
  // is recorded go to the database, so a restarted studio can reattach().
  void start_detached(RunRecord run, const QString& program, const QStringList& args);
  // Continues a run already in the database: its row keeps its data, the status goes back
  // to "running", and new events are numbered after `next_event_seq`.
  void resume_detached(RunRecord run, const QString& program, const QStringList& args,
                       std::int64_t next_event_seq);
  // Follows a detached run that an earlier studio started and that still runs (run.pid).
  void reattach(RunRecord run, std::int64_t next_event_seq);
  bool detached() const { return pid_ > 0; }

  // Stop after the current step: SIGINT makes `tessera-cli run` write a checkpoint and end
  // "stopped". If it has not ended after `kill_after_ms`, it is terminated.
  void stop(int kill_after_ms = 120000);
  bool stop_requested() const { return stop_requested_; }
  // The studio is quitting: stop as above, and record the run as "interrupted" (resumable
  // from its checkpoint) rather than "stopped".
  void interrupt(int kill_after_ms = 120000);
  // Ends the child at once (SIGKILL); the newest complete checkpoint stays usable. After a
  // stop() the run is then recorded "stopped" (the user ended it), else as the exit decides.
  void kill_now();
  // The step of the run's newest checkpoint: its `checkpoint` events and the checkpoint-<step>/
  // folders in its run folder (a resumed run's earlier ones); -1 when it has none.
  std::int64_t last_checkpoint_step() const;
  // The last training step with a metric this monitor has seen (0: none yet).
  std::int64_t last_step() const { return last_step_; }

  bool running() const {
    return detached() ? !exited_ : process_ && process_->state() != QProcess::NotRunning;
  }
  const RunRecord& run() const { return run_; }
  const QString& status() const { return run_.status; }
  const QString& failure() const { return run_.failure; }
  std::int64_t events_seen() const { return state_.seq + metrics_seen_; }

  // "Stalled": the child runs but has sent no event for longer than both `min_stall_ms`
  // (default 3 min) and 5 times the longest gap between its events so far (a slow step is not a
  // stall). Shown by the dashboard; not a status of the run.
  bool stalled() const;
  qint64 silent_ms() const { return last_event_.isValid() ? last_event_.elapsed() : 0; }
  void set_min_stall_ms(qint64 ms) { min_stall_ms_ = ms; }

  // What arrived since the last call (the dashboard calls this at most ~25 times a second).
  RunSeries take_pending();
  bool has_pending() const { return !pending_.empty() || !pending_.last_error.isEmpty(); }

 Q_SIGNALS:
  void pendingAvailable();  // new data; emitted at most once until take_pending()
  void finished(const QString& status, const QString& failure);

 private:
  void begin_run(RunRecord run);  // the run's row, "running", queued for the database
  void start_process(const QString& program, const QStringList& args, const QString& working_dir);
  void launch_detached(const QString& program, const QStringList& args);
  void follow_file();  // tails events.jsonl from events_offset and watches the process
  void poll_detached();
  void signal_child(int signal);
  void on_stdout();
  void on_stderr();
  void on_finished(int exit_code, QProcess::ExitStatus exit_status);
  void on_error(QProcess::ProcessError error);
  void process_slice();  // parses buffered lines for a few milliseconds, then yields
  void schedule_slice();
  void handle_line(const QByteArray& line);
  void flush_batch();
  void finish();

  RunsStore* store_;
  QProcess* process_ = nullptr;
  RunRecord run_;
  LineSplitter splitter_;
  StreamState state_;
  RunSeries pending_;
  bool pending_signalled_ = false;
  RunBatch batch_;
  QTimer flush_timer_;
  bool slice_scheduled_ = false;
  bool exited_ = false;
  int exit_code_ = 0;
  bool crashed_ = false;
  QString start_error_;
  QStringList stderr_tail_;
  QByteArray stderr_partial_;
  std::int64_t metrics_seen_ = 0;
  bool stop_requested_ = false;
  bool interrupting_ = false;
  bool killed_after_stop_ = false;
  std::int64_t last_step_ = 0;
  QElapsedTimer last_event_;  // since the last event (or the start)
  qint64 longest_gap_ms_ = 0;
  qint64 min_stall_ms_ = 3 * 60 * 1000;
  // Detached mode.
  qint64 pid_ = 0;
  QFile events_file_;
  qint64 read_offset_ = 0;   // bytes of events.jsonl read
  qint64 start_offset_ = 0;  // where this monitor began reading
  QTimer tail_timer_;
};

// Whether `run` can be resumed: "" when it can, else why not (the status is not stopped,
// failed or interrupted, or its folder has no job.json or no checkpoint-<step>/).
QString resume_blocker(const RunRecord& run);
// The arguments of `tessera-cli run` that resume `run` in its own folder (events to its
// events.jsonl, appended).
QStringList resume_arguments(const RunRecord& run);

}  // namespace tessera::ui
