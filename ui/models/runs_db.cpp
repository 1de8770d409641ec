#include "ui/models/runs_db.h"

#include <QAtomicInteger>
#include <QDateTime>
#include <QFile>
#include <QFileInfo>
#include <QSqlError>
#include <QSqlQuery>
#include <QSqlRecord>
#include <QVariant>
#include <QtConcurrent/QtConcurrentRun>
#include <csignal>

#include "core/error.h"
#include "ui/utility/event_stream.h"

namespace tessera::ui {

void RunSeries::append(const RunSeries& more) {
  metrics += more.metrics;
  memory += more.memory;
  log += more.log;
  if (more.has_progress) {
    has_progress = true;
    phase = more.phase;
    done = more.done;
    total = more.total;
    eta_s = more.eta_s;
  }
  if (!more.last_error.isEmpty()) last_error = more.last_error;
}

namespace {

QAtomicInteger<quint64> g_connection_counter;

[[noreturn]] void fail(QSqlDatabase& db, const QString& what, const QSqlError& error) {
  throw_io(("runs database " + db.databaseName() + ": " + what + ": " + error.text()).toStdString(),
           "check that the folder is writable and the disk is not full; a damaged database "
           "file can be moved away to start a new history");
}

void exec(QSqlDatabase& db, const QString& sql) {
  QSqlQuery q(db);
  if (!q.exec(sql)) fail(db, sql.simplified().left(80), q.lastError());
}

QVariant opt(double v) {
  return present(v) ? QVariant(v) : QVariant(QMetaType(QMetaType::Double));
}
double num(const QVariant& v) {
  return v.isNull() ? kMissing : v.toDouble();
}

// Migration i takes the schema from version i to i + 1. Never edit a released entry: add one.
const QList<QStringList>& migrations() {
  static const QList<QStringList> kMigrations = {
      // 0 → 1: runs, metrics, events
      {"CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT, model TEXT, dataset TEXT, "
       "method TEXT, status TEXT NOT NULL, failure TEXT, started_at REAL, ended_at REAL, "
       "output_dir TEXT, spec TEXT)",
       "CREATE TABLE metrics (run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
       "step INTEGER NOT NULL, t REAL, loss REAL, lr REAL, grad_norm REAL, tokens_per_s REAL, "
       "eval_loss REAL)",
       "CREATE TABLE events (run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
       "seq INTEGER NOT NULL, t REAL, type TEXT NOT NULL, json TEXT NOT NULL)"},
      // 1 → 2: memory samples, checkpoints, nodes, final losses on the run row, indexes
      {"CREATE TABLE memory (run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
       "t REAL NOT NULL, tier TEXT NOT NULL, device TEXT, used REAL, reserved REAL, "
       "budget REAL, weights REAL, gradients REAL, optimizer REAL, activations_other REAL)",
       "CREATE TABLE checkpoints (run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
       "step INTEGER NOT NULL, path TEXT NOT NULL, t REAL)",
       "CREATE TABLE nodes (id INTEGER PRIMARY KEY, host TEXT NOT NULL, port INTEGER, "
       "name TEXT, added_at REAL)",
       "ALTER TABLE runs ADD COLUMN final_loss REAL",
       "ALTER TABLE runs ADD COLUMN final_eval_loss REAL",
       "UPDATE runs SET final_loss = (SELECT loss FROM metrics m WHERE m.run_id = runs.id AND "
       "m.loss IS NOT NULL ORDER BY step DESC LIMIT 1), final_eval_loss = (SELECT eval_loss "
       "FROM metrics m WHERE m.run_id = runs.id AND m.eval_loss IS NOT NULL ORDER BY step DESC "
       "LIMIT 1)",
       "CREATE INDEX metrics_run_step ON metrics(run_id, step)",
       "CREATE INDEX events_run_seq ON events(run_id, seq)",
       "CREATE INDEX memory_run_t ON memory(run_id, t)"},
      // 2 → 3: the machine's memory in use next to the run's
      // and the process of a detached run with how much of its events.jsonl is recorded
      // and the training steps done of total
      {"ALTER TABLE memory ADD COLUMN system_used REAL", "ALTER TABLE runs ADD COLUMN pid INTEGER",
       "ALTER TABLE runs ADD COLUMN events_offset INTEGER",
       "ALTER TABLE runs ADD COLUMN steps_done INTEGER",
       "ALTER TABLE runs ADD COLUMN total_steps INTEGER"},
      // 3 → 4: the disk tier's chunk traffic (totals and rates)
      {"ALTER TABLE memory ADD COLUMN read_bytes REAL",
       "ALTER TABLE memory ADD COLUMN written_bytes REAL",
       "ALTER TABLE memory ADD COLUMN read_bytes_per_s REAL",
       "ALTER TABLE memory ADD COLUMN written_bytes_per_s REAL"},
      // 4 → 5: a job of several processes: each rank's figures (the events' `ranks`, as JSON)
      {"ALTER TABLE metrics ADD COLUMN ranks TEXT", "ALTER TABLE memory ADD COLUMN ranks TEXT"},
      // 5 → 6: preference tuning's figures per step (the events' `preference`)
      {"ALTER TABLE metrics ADD COLUMN reward_chosen REAL",
       "ALTER TABLE metrics ADD COLUMN reward_rejected REAL",
       "ALTER TABLE metrics ADD COLUMN reward_margin REAL",
       "ALTER TABLE metrics ADD COLUMN reward_accuracy REAL",
       "ALTER TABLE metrics ADD COLUMN kl REAL"},
  };
  return kMigrations;
}

RunRecord record_from(const QSqlQuery& q) {
  RunRecord r;
  r.id = q.value("id").toString();
  r.name = q.value("name").toString();
  r.model = q.value("model").toString();
  r.dataset = q.value("dataset").toString();
  r.method = q.value("method").toString();
  r.status = q.value("status").toString();
  r.failure = q.value("failure").toString();
  r.started_at = num(q.value("started_at"));
  r.ended_at = num(q.value("ended_at"));
  r.output_dir = q.value("output_dir").toString();
  r.spec_json = q.value("spec").toString();
  r.final_loss = num(q.value("final_loss"));
  r.final_eval_loss = num(q.value("final_eval_loss"));
  r.pid = q.value("pid").toLongLong();
  r.events_offset = q.value("events_offset").toLongLong();
  r.steps_done = q.value("steps_done").toLongLong();
  r.total_steps = q.value("total_steps").toLongLong();
  return r;
}

}  // namespace

DbConnection::DbConnection(const QString& path)
    : name_(QString("tessera-runs-%1").arg(g_connection_counter.fetchAndAddRelaxed(1))) {
  db_ = QSqlDatabase::addDatabase("QSQLITE", name_);
  db_.setDatabaseName(path);
  db_.setConnectOptions("QSQLITE_BUSY_TIMEOUT=5000");
  if (!db_.open()) fail(db_, "cannot open", db_.lastError());
  exec(db_, "PRAGMA foreign_keys = ON");
  QSqlQuery q(db_);
  // WAL: readers on worker threads never block the writer thread, and a crash loses at
  // most the last uncommitted batch.
  if (!q.exec("PRAGMA journal_mode = WAL") || !q.next())
    fail(db_, "PRAGMA journal_mode = WAL", q.lastError());
  exec(db_, "PRAGMA synchronous = NORMAL");
}

DbConnection::~DbConnection() {
  db_.close();
  db_ = QSqlDatabase();
  QSqlDatabase::removeDatabase(name_);
}

int schema_version(QSqlDatabase& db) {
  if (!db.tables().contains("schema_version")) return 0;
  QSqlQuery q(db);
  if (!q.exec("SELECT version FROM schema_version") || !q.next()) return 0;
  return q.value(0).toInt();
}

void migrate(QSqlDatabase& db, int target) {
  int version = schema_version(db);
  if (version > kRunsSchemaVersion)
    throw_unsupported(
        ("runs database " + db.databaseName() + " has schema version " + QString::number(version) +
         ", newer than this studio's " + QString::number(kRunsSchemaVersion))
            .toStdString(),
        "use a newer tessera, or choose another runs database in Settings");
  while (version < target) {
    if (!db.transaction()) fail(db, "begin migration", db.lastError());
    try {
      if (version == 0) exec(db, "CREATE TABLE schema_version (version INTEGER NOT NULL)");
      for (const QString& sql : migrations().at(version)) exec(db, sql);
      exec(db, "DELETE FROM schema_version");
      exec(db, QString("INSERT INTO schema_version (version) VALUES (%1)").arg(version + 1));
    } catch (...) {
      db.rollback();
      throw;
    }
    if (!db.commit()) fail(db, "commit migration", db.lastError());
    ++version;
  }
}

int mark_interrupted_runs(QSqlDatabase& db, QList<RunRecord>* alive) {
  QSqlQuery q(db);
  if (!q.exec("SELECT * FROM runs WHERE status IN ('starting', 'running')"))
    fail(db, "list running runs", q.lastError());
  QStringList gone;
  while (q.next()) {
    RunRecord r = record_from(q);
    if (r.pid > 0 && run_process_alive(r.pid, r.output_dir))
      alive->push_back(r);
    else
      gone << r.id;
  }
  int marked = 0;
  for (const QString& id : gone) {
    QSqlQuery u(db);
    u.prepare(
        "UPDATE runs SET status = 'interrupted', failure = 'the studio quit while this run was "
        "in progress', ended_at = COALESCE(ended_at, ?) WHERE id = ?");
    u.addBindValue(double(QDateTime::currentMSecsSinceEpoch()) / 1000.0);
    u.addBindValue(id);
    if (!u.exec()) fail(db, "mark interrupted runs", u.lastError());
    marked += u.numRowsAffected();
  }
  return marked;
}

bool run_process_alive(qint64 pid, const QString& run_dir) {
  if (pid <= 0 || ::kill(pid_t(pid), 0) != 0) return false;
  // The pid may have been reused since: it must still work in the run's folder (the studio
  // starts it there), and not be a zombie.
  QFile stat(QString("/proc/%1/stat").arg(pid));
  if (stat.open(QIODevice::ReadOnly)) {
    const QByteArray text = stat.readAll();
    const qsizetype close = text.lastIndexOf(')');
    if (close > 0 && close + 2 < text.size() && text.at(close + 2) == 'Z') return false;
  }
  const QFileInfo cwd(QString("/proc/%1/cwd").arg(pid));
  if (!cwd.isSymLink()) return true;  // no /proc: trust kill()
  return cwd.symLinkTarget() == QFileInfo(run_dir).canonicalFilePath();
}

QList<RunRecord> list_runs(QSqlDatabase& db) {
  QList<RunRecord> runs;
  QSqlQuery q(db);
  if (!q.exec("SELECT * FROM runs ORDER BY started_at DESC")) fail(db, "list runs", q.lastError());
  while (q.next()) {
    runs.push_back(record_from(q));
    RunRecord& r = runs.back();
    r.folder_missing = !r.output_dir.isEmpty() && !QFileInfo(r.output_dir).isDir();
  }
  return runs;
}

std::optional<RunRecord> find_run(QSqlDatabase& db, const QString& id) {
  QSqlQuery q(db);
  q.prepare("SELECT * FROM runs WHERE id = ?");
  q.addBindValue(id);
  if (!q.exec()) fail(db, "find run", q.lastError());
  if (!q.next()) return std::nullopt;
  return record_from(q);
}

RunSeries load_run_series(QSqlDatabase& db, const QString& id) {
  RunSeries s;
  QSqlQuery q(db);
  q.prepare(
      "SELECT step, t, loss, lr, grad_norm, tokens_per_s, eval_loss, ranks, reward_chosen, "
      "reward_rejected, reward_margin, reward_accuracy, kl FROM metrics "
      "WHERE run_id = ? ORDER BY rowid");
  q.addBindValue(id);
  if (!q.exec()) fail(db, "load metrics", q.lastError());
  while (q.next()) {
    MetricPoint p;
    p.step = q.value(0).toLongLong();
    p.t = q.value(1).toDouble();
    p.loss = num(q.value(2));
    p.lr = num(q.value(3));
    p.grad_norm = num(q.value(4));
    p.tokens_per_s = num(q.value(5));
    p.eval_loss = num(q.value(6));
    if (!q.value(7).isNull())
      p.ranks = metric_ranks_from_json(
          nlohmann::json::parse(q.value(7).toString().toStdString(), nullptr, false));
    p.reward_chosen = num(q.value(8));
    p.reward_rejected = num(q.value(9));
    p.reward_margin = num(q.value(10));
    p.reward_accuracy = num(q.value(11));
    p.kl = num(q.value(12));
    s.metrics.push_back(p);
  }
  q.prepare(
      "SELECT t, tier, device, used, reserved, budget, weights, gradients, optimizer, "
      "activations_other, system_used, read_bytes, written_bytes, read_bytes_per_s, "
      "written_bytes_per_s, ranks FROM memory WHERE run_id = ? ORDER BY rowid");
  q.addBindValue(id);
  if (!q.exec()) fail(db, "load memory", q.lastError());
  while (q.next()) {
    MemorySample m;
    m.t = q.value(0).toDouble();
    m.tier = q.value(1).toString();
    m.device = q.value(2).toString();
    m.used = q.value(3).toDouble();
    m.reserved = num(q.value(4));
    m.budget = num(q.value(5));
    for (int i = 0; i < 4; ++i) m.by_category[i] = num(q.value(6 + i));
    m.system_used = num(q.value(10));
    m.traffic.read_bytes = num(q.value(11));
    m.traffic.written_bytes = num(q.value(12));
    m.traffic.read_bytes_per_s = num(q.value(13));
    m.traffic.written_bytes_per_s = num(q.value(14));
    if (!q.value(15).isNull())
      m.ranks = memory_ranks_from_json(
          nlohmann::json::parse(q.value(15).toString().toStdString(), nullptr, false));
    s.memory.push_back(m);
  }
  q.prepare("SELECT type, json, seq FROM events WHERE run_id = ? ORDER BY seq");
  q.addBindValue(id);
  if (!q.exec()) fail(db, "load events", q.lastError());
  while (q.next()) {
    s.next_event_seq = std::max<std::int64_t>(s.next_event_seq, q.value(2).toLongLong() + 1);
    auto event = nlohmann::json::parse(q.value(1).toString().toStdString(), nullptr, false);
    QString shown = describe_event(event);
    if (!shown.isEmpty()) s.log << shown;
    if (event.is_object() && q.value(0).toString() == "error") {
      s.last_error = QString::fromStdString(event.value("message", std::string()));
      if (!event.value("hint", std::string()).empty())
        s.last_error += "\n" + QString::fromStdString(event.value("hint", std::string()));
    }
  }
  return s;
}

QList<CheckpointRecord> load_checkpoints(QSqlDatabase& db, const QString& id) {
  QList<CheckpointRecord> out;
  QSqlQuery q(db);
  q.prepare("SELECT step, path, t FROM checkpoints WHERE run_id = ? ORDER BY step");
  q.addBindValue(id);
  if (!q.exec()) fail(db, "load checkpoints", q.lastError());
  while (q.next()) out.push_back({q.value(0).toLongLong(), q.value(1).toString(), num(q.value(2))});
  return out;
}

void delete_run(QSqlDatabase& db, const QString& id) {
  if (!db.transaction()) fail(db, "begin delete", db.lastError());
  for (const char* table : {"metrics", "memory", "events", "checkpoints", "runs"}) {
    QSqlQuery q(db);
    q.prepare(QString("DELETE FROM %1 WHERE %2 = ?")
                  .arg(table, table == QString("runs") ? "id" : "run_id"));
    q.addBindValue(id);
    if (!q.exec()) {
      db.rollback();
      fail(db, "delete run", q.lastError());
    }
  }
  if (!db.commit()) fail(db, "commit delete", db.lastError());
}

namespace {

void write_batch(QSqlDatabase& db, const RunBatch& b) {
  if (!db.transaction()) fail(db, "begin batch", db.lastError());
  try {
    QSqlQuery q(db);
    if (b.upsert) {
      const RunRecord& r = *b.upsert;
      q.prepare(
          "INSERT OR REPLACE INTO runs (id, name, model, dataset, method, status, failure, "
          "started_at, ended_at, output_dir, spec, final_loss, final_eval_loss) VALUES "
          "(?,?,?,?,?,?,?,?,?,?,?,?,?)");
      for (const QVariant& v :
           {QVariant(r.id), QVariant(r.name), QVariant(r.model), QVariant(r.dataset),
            QVariant(r.method), QVariant(r.status), QVariant(r.failure), opt(r.started_at),
            opt(r.ended_at), QVariant(r.output_dir), QVariant(r.spec_json), opt(r.final_loss),
            opt(r.final_eval_loss)})
        q.addBindValue(v);
      if (!q.exec()) fail(db, "insert run", q.lastError());
    }
    if (!b.metrics.isEmpty()) {
      q.prepare(
          "INSERT INTO metrics (run_id, step, t, loss, lr, grad_norm, tokens_per_s, "
          "eval_loss, ranks, reward_chosen, reward_rejected, reward_margin, reward_accuracy, kl) "
          "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
      double last_loss = kMissing, last_eval = kMissing;
      for (const MetricPoint& p : b.metrics) {
        q.bindValue(0, b.run_id);
        q.bindValue(1, QVariant::fromValue<qlonglong>(p.step));
        q.bindValue(2, p.t);
        q.bindValue(3, opt(p.loss));
        q.bindValue(4, opt(p.lr));
        q.bindValue(5, opt(p.grad_norm));
        q.bindValue(6, opt(p.tokens_per_s));
        q.bindValue(7, opt(p.eval_loss));
        q.bindValue(8, p.ranks.isEmpty()
                           ? QVariant()
                           : QVariant(QString::fromStdString(to_json(p.ranks).dump())));
        q.bindValue(9, opt(p.reward_chosen));
        q.bindValue(10, opt(p.reward_rejected));
        q.bindValue(11, opt(p.reward_margin));
        q.bindValue(12, opt(p.reward_accuracy));
        q.bindValue(13, opt(p.kl));
        if (!q.exec()) fail(db, "insert metrics", q.lastError());
        if (present(p.loss)) last_loss = p.loss;
        if (present(p.eval_loss)) last_eval = p.eval_loss;
      }
      QSqlQuery u(db);
      u.prepare(
          "UPDATE runs SET final_loss = COALESCE(?, final_loss), final_eval_loss = "
          "COALESCE(?, final_eval_loss) WHERE id = ?");
      u.addBindValue(opt(last_loss));
      u.addBindValue(opt(last_eval));
      u.addBindValue(b.run_id);
      if (!u.exec()) fail(db, "update final losses", u.lastError());
    }
    if (!b.memory.isEmpty()) {
      q.prepare(
          "INSERT INTO memory (run_id, t, tier, device, used, reserved, budget, weights, "
          "gradients, optimizer, activations_other, system_used, read_bytes, written_bytes, "
          "read_bytes_per_s, written_bytes_per_s, ranks) VALUES "
          "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
      for (const MemorySample& m : b.memory) {
        q.bindValue(0, b.run_id);
        q.bindValue(1, m.t);
        q.bindValue(2, m.tier);
        q.bindValue(3, m.device);
        q.bindValue(4, m.used);
        q.bindValue(5, opt(m.reserved));
        q.bindValue(6, opt(m.budget));
        for (int i = 0; i < 4; ++i) q.bindValue(7 + i, opt(m.by_category[i]));
        q.bindValue(11, opt(m.system_used));
        q.bindValue(12, opt(m.traffic.read_bytes));
        q.bindValue(13, opt(m.traffic.written_bytes));
        q.bindValue(14, opt(m.traffic.read_bytes_per_s));
        q.bindValue(15, opt(m.traffic.written_bytes_per_s));
        q.bindValue(16, m.ranks.isEmpty()
                            ? QVariant()
                            : QVariant(QString::fromStdString(to_json(m.ranks).dump())));
        if (!q.exec()) fail(db, "insert memory", q.lastError());
      }
    }
    if (!b.events.isEmpty()) {
      q.prepare("INSERT INTO events (run_id, seq, t, type, json) VALUES (?,?,?,?,?)");
      for (const RawEvent& e : b.events) {
        q.bindValue(0, b.run_id);
        q.bindValue(1, QVariant::fromValue<qlonglong>(e.seq));
        q.bindValue(2, e.t);
        q.bindValue(3, e.type);
        q.bindValue(4, e.json);
        if (!q.exec()) fail(db, "insert events", q.lastError());
      }
    }
    if (!b.checkpoints.isEmpty()) {
      q.prepare("INSERT INTO checkpoints (run_id, step, path, t) VALUES (?,?,?,?)");
      for (const CheckpointRecord& c : b.checkpoints) {
        q.bindValue(0, b.run_id);
        q.bindValue(1, QVariant::fromValue<qlonglong>(c.step));
        q.bindValue(2, c.path);
        q.bindValue(3, c.t);
        if (!q.exec()) fail(db, "insert checkpoints", q.lastError());
      }
    }
    if (b.steps) {
      q.prepare("UPDATE runs SET steps_done = ?, total_steps = ? WHERE id = ?");
      q.addBindValue(QVariant::fromValue<qlonglong>(b.steps->first));
      q.addBindValue(QVariant::fromValue<qlonglong>(b.steps->second));
      q.addBindValue(b.run_id);
      if (!q.exec()) fail(db, "update steps", q.lastError());
    }
    if (b.pid || b.events_offset) {
      q.prepare(
          "UPDATE runs SET pid = COALESCE(?, pid), events_offset = COALESCE(?, events_offset) "
          "WHERE id = ?");
      q.addBindValue(b.pid ? QVariant::fromValue<qlonglong>(*b.pid)
                           : QVariant(QMetaType(QMetaType::LongLong)));
      q.addBindValue(b.events_offset ? QVariant::fromValue<qlonglong>(*b.events_offset)
                                     : QVariant(QMetaType(QMetaType::LongLong)));
      q.addBindValue(b.run_id);
      if (!q.exec()) fail(db, "update process", q.lastError());
    }
    if (b.status) {
      q.prepare(
          "UPDATE runs SET status = ?, failure = ?, ended_at = COALESCE(?, ended_at) "
          "WHERE id = ?");
      q.addBindValue(*b.status);
      q.addBindValue(b.failure);
      q.addBindValue(opt(b.ended_at));
      q.addBindValue(b.run_id);
      if (!q.exec()) fail(db, "update status", q.lastError());
    }
  } catch (...) {
    db.rollback();
    throw;
  }
  if (!db.commit()) fail(db, "commit batch", db.lastError());
}

}  // namespace

// Lives on the writer thread with the thread's own connection.
class DbWriterWorker : public QObject {
 public:
  explicit DbWriterWorker(QString path) : path_(std::move(path)) {}
  ~DbWriterWorker() override = default;

  // Returns "" or an error message.
  QString write(const RunBatch& batch) {
    try {
      if (!connection_) connection_ = std::make_unique<DbConnection>(path_);
      write_batch(connection_->db(), batch);
    } catch (const Error& e) {
      return QString::fromStdString(e.what());
    }
    return {};
  }
  void close() { connection_.reset(); }

 private:
  QString path_;
  std::unique_ptr<DbConnection> connection_;
};

RunsStore::RunsStore(const QString& path, QObject* parent) : QObject(parent), path_(path) {
  qRegisterMetaType<RunBatch>();
  {
    DbConnection c(path_);
    migrate(c.db());
    interrupted_on_open_ = mark_interrupted_runs(c.db(), &alive_on_open_);
  }
  worker_ = new DbWriterWorker(path_);
  worker_->moveToThread(&thread_);
  thread_.setObjectName("tessera-db-writer");
  thread_.start();
}

RunsStore::~RunsStore() {
  flush();
  QMetaObject::invokeMethod(
      worker_, [w = worker_] { w->close(); }, Qt::BlockingQueuedConnection);
  thread_.quit();
  thread_.wait();
  delete worker_;
}

void RunsStore::submit(RunBatch batch) {
  QMetaObject::invokeMethod(
      worker_,
      [this, w = worker_, batch = std::move(batch)] {
        QString error = w->write(batch);
        // Signals cross back to the store's thread through queued connections.
        if (error.isEmpty())
          Q_EMIT written(batch.run_id);
        else
          Q_EMIT writeFailed(error);
      },
      Qt::QueuedConnection);
}

void RunsStore::flush() {
  QMetaObject::invokeMethod(
      worker_, [] {}, Qt::BlockingQueuedConnection);
}

QFuture<QList<RunRecord>> RunsStore::list_runs_async() const {
  return QtConcurrent::run([path = path_] {
    DbConnection c(path);
    return list_runs(c.db());
  });
}

QFuture<RunSeries> RunsStore::load_series_async(const QString& id) const {
  return QtConcurrent::run([path = path_, id] {
    DbConnection c(path);
    return load_run_series(c.db(), id);
  });
}

QFuture<void> RunsStore::delete_run_async(const QString& id) {
  return QtConcurrent::run([path = path_, id] {
    DbConnection c(path);
    delete_run(c.db(), id);
  });
}

}  // namespace tessera::ui
