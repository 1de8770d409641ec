#include "ui/utility/run_monitor.h"

#include <QDateTime>
#include <QDir>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>
#include <csignal>

#include "core/exit_codes.h"

namespace tessera::ui {

namespace {
double now_s() {
  return double(QDateTime::currentMSecsSinceEpoch()) / 1000.0;
}
constexpr int kSliceBudgetMs = 4;      // parse for at most this long per event-loop turn
constexpr int kFlushIntervalMs = 250;  // database batches
constexpr int kStderrTailLines = 20;
}  // namespace

RunMonitor::RunMonitor(RunsStore* store, QObject* parent) : QObject(parent), store_(store) {
  flush_timer_.setInterval(kFlushIntervalMs);
  connect(&flush_timer_, &QTimer::timeout, this, &RunMonitor::flush_batch);
}

RunMonitor::~RunMonitor() {
  if (process_) {
    process_->disconnect(this);
    if (process_->state() != QProcess::NotRunning) {
      process_->kill();
      process_->waitForFinished(2000);
    }
  }
  flush_batch();
}

void RunMonitor::begin_run(RunRecord run) {
  run_ = std::move(run);
  run_.status = "running";
  if (!present(run_.started_at)) run_.started_at = now_s();
  batch_ = {};
  batch_.run_id = run_.id;
  batch_.upsert = run_;
}

void RunMonitor::start(RunRecord run, const QString& program, const QStringList& args,
                       const QString& working_dir) {
  begin_run(std::move(run));
  flush_batch();
  start_process(program, args, working_dir);
}

void RunMonitor::start_detached(RunRecord run, const QString& program, const QStringList& args) {
  begin_run(std::move(run));
  start_offset_ = read_offset_ = 0;
  launch_detached(program, args);
}

void RunMonitor::resume_detached(RunRecord run, const QString& program, const QStringList& args,
                                 std::int64_t next_event_seq) {
  run_ = std::move(run);
  run_.status = "running";
  run_.failure.clear();
  run_.ended_at = kMissing;
  state_.seq = std::max<std::int64_t>(0, next_event_seq);
  batch_ = {};
  batch_.run_id = run_.id;
  // A status update, not a replacement of the row: the run keeps its metrics and events.
  batch_.status = QString("running");
  // The resumed child appends to events.jsonl: follow it from the current end.
  start_offset_ = read_offset_ = QFileInfo(QDir(run_.output_dir).filePath("events.jsonl")).size();
  pending_.log << "[resume] continuing " + run_.id + " from its last checkpoint";
  launch_detached(program, args);
}

void RunMonitor::reattach(RunRecord run, std::int64_t next_event_seq) {
  run_ = std::move(run);
  state_.seq = std::max<std::int64_t>(0, next_event_seq);
  batch_ = {};
  batch_.run_id = run_.id;
  pid_ = run_.pid;
  start_offset_ = read_offset_ = run_.events_offset;
  pending_.log << QString("[reattached] %1 is still training (process %2)").arg(run_.id).arg(pid_);
  follow_file();
}

void RunMonitor::launch_detached(const QString& program, const QStringList& args) {
  const QDir dir(run_.output_dir);
  QProcess child;
  child.setProgram(program);
  child.setArguments(args);
  child.setWorkingDirectory(run_.output_dir);
  child.setStandardInputFile(QProcess::nullDevice());
  child.setStandardOutputFile(QProcess::nullDevice());
  child.setStandardErrorFile(dir.filePath("stderr.log"), QIODevice::Append);
  pending_.log << "$ " + program + " " + args.join(' ');
  qint64 pid = 0;
  if (!child.startDetached(&pid) || pid <= 0) {
    start_error_ = "could not start " + program + ": " + child.errorString();
    exited_ = true;
    crashed_ = true;
    flush_batch();
    schedule_slice();
    return;
  }
  pid_ = pid;
  run_.pid = pid;
  batch_.pid = pid;
  flush_batch();
  follow_file();
}

void RunMonitor::follow_file() {
  last_event_.start();
  longest_gap_ms_ = 0;
  flush_timer_.start();
  tail_timer_.setInterval(200);
  connect(&tail_timer_, &QTimer::timeout, this, &RunMonitor::poll_detached, Qt::UniqueConnection);
  tail_timer_.start();
  poll_detached();
}

void RunMonitor::poll_detached() {
  auto read_new = [this] {
    if (!events_file_.isOpen()) {
      events_file_.setFileName(QDir(run_.output_dir).filePath("events.jsonl"));
      if (!events_file_.open(QIODevice::ReadOnly | QIODevice::Unbuffered)) return;
    }
    const qint64 size = events_file_.size();
    if (size <= read_offset_ || !events_file_.seek(read_offset_)) return;
    const QByteArray chunk = events_file_.read(size - read_offset_);
    read_offset_ += chunk.size();
    splitter_.feed(chunk);
    schedule_slice();
  };
  read_new();
  if (exited_ || run_process_alive(pid_, run_.output_dir)) return;
  read_new();  // what it wrote just before it ended
  QFile stderr_log(QDir(run_.output_dir).filePath("stderr.log"));
  if (stderr_log.open(QIODevice::ReadOnly)) {
    if (stderr_log.size() > 8192) stderr_log.seek(stderr_log.size() - 8192);
    for (const QByteArray& line : stderr_log.readAll().split('\n'))
      if (!line.trimmed().isEmpty()) stderr_tail_ << QString::fromUtf8(line.trimmed());
    while (stderr_tail_.size() > kStderrTailLines) stderr_tail_.removeFirst();
  }
  tail_timer_.stop();
  exited_ = true;
  exit_code_ = 0;  // unknown for a detached child: its `done` event says how it ended
  schedule_slice();
}

void RunMonitor::signal_child(int signal) {
  if (detached()) {
    if (running()) ::kill(pid_t(pid_), signal);
    return;
  }
  if (process_ && process_->processId() > 0) ::kill(pid_t(process_->processId()), signal);
}

void RunMonitor::start_process(const QString& program, const QStringList& args,
                               const QString& working_dir) {
  process_ = new QProcess(this);
  if (!working_dir.isEmpty()) process_->setWorkingDirectory(working_dir);
  connect(process_, &QProcess::readyReadStandardOutput, this, &RunMonitor::on_stdout);
  connect(process_, &QProcess::readyReadStandardError, this, &RunMonitor::on_stderr);
  connect(process_, &QProcess::finished, this, &RunMonitor::on_finished);
  connect(process_, &QProcess::errorOccurred, this, &RunMonitor::on_error);
  flush_timer_.start();
  pending_.log << "$ " + program + " " + args.join(' ');
  last_event_.start();
  longest_gap_ms_ = 0;
  process_->start(program, args);
}

void RunMonitor::stop(int kill_after_ms) {
  if (!running() || stop_requested_) return;
  stop_requested_ = true;
  signal_child(SIGINT);
  pending_.log << "[stop] asked the run to stop after the current step (with a checkpoint)";
  QTimer::singleShot(kill_after_ms, this, [this] {
    if (running()) signal_child(SIGTERM);
  });
}

bool RunMonitor::stalled() const {
  return running() && !stop_requested_ &&
         silent_ms() > std::max(min_stall_ms_, 5 * longest_gap_ms_);
}

void RunMonitor::interrupt(int kill_after_ms) {
  interrupting_ = true;
  stop(kill_after_ms);
}

void RunMonitor::kill_now() {
  if (!running()) return;
  killed_after_stop_ = stop_requested_;
  pending_.log << "[stop] ended the run at once (SIGKILL)";
  signal_child(SIGKILL);
}

std::int64_t RunMonitor::last_checkpoint_step() const {
  std::int64_t newest = state_.last_checkpoint_step;
  if (run_.output_dir.isEmpty()) return newest;
  const QStringList folders =
      QDir(run_.output_dir).entryList({"checkpoint-*"}, QDir::Dirs | QDir::NoDotAndDotDot);
  for (const QString& folder : folders) {
    bool numbered = false;
    const qlonglong step = folder.mid(int(qstrlen("checkpoint-"))).toLongLong(&numbered);
    if (numbered) newest = std::max<std::int64_t>(newest, step);
  }
  return newest;
}

RunSeries RunMonitor::take_pending() {
  RunSeries out = std::move(pending_);
  pending_ = {};
  pending_signalled_ = false;
  return out;
}

void RunMonitor::on_stdout() {
  splitter_.feed(process_->readAllStandardOutput());
  schedule_slice();
}

void RunMonitor::on_stderr() {
  stderr_partial_ += process_->readAllStandardError();
  qsizetype nl;
  while ((nl = stderr_partial_.indexOf('\n')) >= 0) {
    QString line = QString::fromUtf8(stderr_partial_.left(nl)).trimmed();
    stderr_partial_.remove(0, nl + 1);
    if (line.isEmpty()) continue;
    stderr_tail_ << line;
    if (stderr_tail_.size() > kStderrTailLines) stderr_tail_.removeFirst();
    pending_.log << "[stderr] " + line;
  }
}

void RunMonitor::schedule_slice() {
  if (slice_scheduled_) return;
  slice_scheduled_ = true;
  QTimer::singleShot(0, this, &RunMonitor::process_slice);
}

void RunMonitor::process_slice() {
  slice_scheduled_ = false;
  QElapsedTimer clock;
  clock.start();
  QByteArray line;
  while (splitter_.next(line)) {
    handle_line(line);
    if (clock.elapsed() >= kSliceBudgetMs) break;
  }
  if (splitter_.has_complete_line()) {
    schedule_slice();  // more to do: yield to the event loop first
  } else if (exited_) {
    finish();
  }
  if (!pending_.empty() && !pending_signalled_) {
    pending_signalled_ = true;
    Q_EMIT pendingAvailable();
  }
}

void RunMonitor::handle_line(const QByteArray& line) {
  if (line.trimmed().isEmpty()) return;
  auto event = nlohmann::json::parse(line.constBegin(), line.constEnd(), nullptr, false);
  if (event.is_discarded() || !event.is_object()) {
    pending_.log << "[output] " + QString::fromUtf8(line);
    return;
  }
  longest_gap_ms_ = std::max(longest_gap_ms_, last_event_.restart());
  const auto before = batch_.metrics.size();
  apply_event(event, line, state_, pending_, batch_);
  metrics_seen_ += batch_.metrics.size() - before;
  for (auto i = before; i < batch_.metrics.size(); ++i)
    if (present(batch_.metrics[i].loss)) last_step_ = std::max(last_step_, batch_.metrics[i].step);
  if (state_.total_steps > 0) {  // a resumed run keeps its recorded steps until progress comes
    run_.steps_done = state_.steps_done;
    run_.total_steps = state_.total_steps;
  }
}

void RunMonitor::on_error(QProcess::ProcessError error) {
  if (error == QProcess::FailedToStart) {
    start_error_ = "could not start " + process_->program() + ": " + process_->errorString();
    exited_ = true;
    crashed_ = true;
    schedule_slice();
  }
}

void RunMonitor::on_finished(int exit_code, QProcess::ExitStatus exit_status) {
  // Whatever is still in the pipe belongs to the stream.
  splitter_.feed(process_->readAllStandardOutput());
  on_stderr();
  exited_ = true;
  exit_code_ = exit_code;
  crashed_ = exit_status == QProcess::CrashExit;
  schedule_slice();
}

void RunMonitor::finish() {
  if (run_.status != "running") return;  // already finished
  QByteArray rest = splitter_.take_rest();
  if (!rest.trimmed().isEmpty()) handle_line(rest);
  QString status, failure;
  if (!start_error_.isEmpty()) {
    status = "failed";
    failure = start_error_;
  } else if (state_.done_status == "stopped" && !crashed_) {
    status = "stopped";  // exit 130 is how `run` says it stopped at the user's request
  } else if (stop_requested_ && !crashed_ && core::is_requested_stop(exit_code_)) {
    status = "stopped";  // stopped while loading: `run` ends at once there, with no done event
  } else if (crashed_ || exit_code_ != 0) {
    status = state_.done_status == "stopped" ? "stopped" : "failed";
    if (!state_.last_error.isEmpty())
      failure = state_.last_error;
    else if (crashed_)
      failure = "the training process crashed";
    else
      failure = QString("the training process exited with code %1").arg(exit_code_);
    if (state_.last_error.isEmpty() && !stderr_tail_.isEmpty())
      failure += ": " + stderr_tail_.last();
  } else if (state_.done_status == "stopped") {
    status = "stopped";
  } else if (state_.done_status == "failed") {
    status = "failed";
    failure = state_.last_error.isEmpty() ? "the run reported failure" : state_.last_error;
  } else if (state_.done_status.isEmpty()) {
    status = "failed";
    failure = "the training process ended without a `done` event";
    if (detached() && !stderr_tail_.isEmpty()) {
      failure += ": " + stderr_tail_.last();
      for (const QString& line : stderr_tail_) pending_.log << "[stderr] " + line;
    }
  } else {
    status = "completed";
  }
  if (killed_after_stop_ && status == "failed") {
    status = "stopped";
    failure = "ended at once at your request: the steps after its last checkpoint were not saved";
  }
  if (interrupting_ && status != "completed") {
    status = "interrupted";
    failure = "the studio quit during this run; Resume continues it from its last checkpoint";
  }
  run_.status = status;
  run_.failure = failure;
  run_.ended_at = now_s();
  batch_.status = status;
  batch_.failure = failure;
  batch_.ended_at = run_.ended_at;
  flush_timer_.stop();
  flush_batch();
  if (!failure.isEmpty()) {
    pending_.last_error = failure;
    pending_.log << "[" + status + "] " + failure;
  } else {
    pending_.log << "[" + status + "]";
  }
  if (!pending_signalled_) {
    pending_signalled_ = true;
    Q_EMIT pendingAvailable();
  }
  Q_EMIT finished(status, failure);
}

void RunMonitor::flush_batch() {
  if (!store_ || batch_.run_id.isEmpty()) return;
  // With the rows parsed so far, how far into events.jsonl they go (a reattach starts there).
  if (detached() && (!batch_.metrics.isEmpty() || !batch_.memory.isEmpty() ||
                     !batch_.events.isEmpty() || !batch_.checkpoints.isEmpty() || batch_.status))
    batch_.events_offset = start_offset_ + splitter_.consumed_total();
  if (!batch_.upsert && batch_.metrics.isEmpty() && batch_.memory.isEmpty() &&
      batch_.events.isEmpty() && batch_.checkpoints.isEmpty() && !batch_.status)
    return;
  RunBatch out = std::move(batch_);
  batch_ = {};
  batch_.run_id = out.run_id;
  store_->submit(std::move(out));
}

QString resume_blocker(const RunRecord& run) {
  if (run.status != "stopped" && run.status != "failed" && run.status != "interrupted")
    return QObject::tr("only a stopped, failed or interrupted run can be resumed (this one is %1)")
        .arg(run.status);
  if (run.output_dir.isEmpty() || !QFileInfo::exists(QDir(run.output_dir).filePath("job.json")))
    return QObject::tr("its folder %1 has no job.json").arg(run.output_dir);
  if (QDir(run.output_dir).entryList({"checkpoint-*"}, QDir::Dirs | QDir::NoDotAndDotDot).isEmpty())
    return QObject::tr("its folder %1 has no checkpoint to resume from").arg(run.output_dir);
  return {};
}

QStringList resume_arguments(const RunRecord& run) {
  // A job of several processes (its spec lists "nodes") resumes through `launch`.
  const QJsonObject spec = QJsonDocument::fromJson(run.spec_json.toUtf8()).object();
  return {spec.contains("nodes") ? "launch" : "run", QDir(run.output_dir).filePath("job.json"),
          "--resume", run.output_dir};
}

}  // namespace tessera::ui
