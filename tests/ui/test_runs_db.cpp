// The runs database: schema migrations from an old version, WAL, batched writes from the
// writer thread, interrupted runs, delete, refusal of a newer schema, and runs whose folder is
// gone.
#include <QDir>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QTest>

#include "core/error.h"
#include "ui/models/runs_db.h"
#include "ui/models/runs_table_model.h"

using namespace tessera::ui;

class RunsDbTest : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;
  QString path(const char* name) { return QDir(tmp_.path()).filePath(name); }

  static int count(QSqlDatabase& db, const QString& sql) {
    QSqlQuery q(db);
    if (!q.exec(sql) || !q.next()) return -1;
    return q.value(0).toInt();
  }

 private Q_SLOTS:
  void initTestCase() { QVERIFY(tmp_.isValid()); }

  void new_database_has_the_latest_schema_in_wal_mode() {
    RunsStore store(path("new.sqlite"));
    DbConnection c(store.path());
    QCOMPARE(schema_version(c.db()), kRunsSchemaVersion);
    for (const char* table : {"runs", "metrics", "events", "memory", "checkpoints", "nodes"})
      QVERIFY2(c.db().tables().contains(table), table);
    QSqlQuery q(c.db());
    QVERIFY(q.exec("PRAGMA journal_mode") && q.next());
    QCOMPARE(q.value(0).toString(), QString("wal"));
  }

  void old_version_is_migrated_keeping_its_runs() {
    const QString file = path("old.sqlite");
    {
      DbConnection c(file);
      migrate(c.db(), 1);  // the schema as version 1 shipped it
      QCOMPARE(schema_version(c.db()), 1);
      QVERIFY(!c.db().tables().contains("memory"));
      QSqlQuery q(c.db());
      QVERIFY(
          q.exec("INSERT INTO runs (id, name, status, started_at) VALUES "
                 "('r1', 'old run', 'completed', 1000), ('r2', 'live', 'running', 2000)"));
      QVERIFY(
          q.exec("INSERT INTO metrics (run_id, step, loss, eval_loss) VALUES "
                 "('r1', 1, 2.5, NULL), ('r1', 2, 2.0, 2.2), ('r1', 3, 1.5, NULL)"));
    }
    RunsStore store(file);
    QCOMPARE(store.interrupted_on_open(), 1);
    DbConnection c(file);
    QCOMPARE(schema_version(c.db()), kRunsSchemaVersion);
    auto runs = list_runs(c.db());
    QCOMPARE(runs.size(), 2);
    auto r1 = find_run(c.db(), "r1");
    QVERIFY(r1);
    QCOMPARE(r1->name, QString("old run"));
    QCOMPARE(r1->final_loss, 1.5);  // backfilled by the migration
    QCOMPARE(r1->final_eval_loss, 2.2);
    auto r2 = find_run(c.db(), "r2");
    QCOMPARE(r2->status, QString("interrupted"));
    QVERIFY(r2->failure.contains("quit"));
    QCOMPARE(load_run_series(c.db(), "r1").metrics.size(), 3);
  }

  // Version 4 adds the disk tier's chunk traffic to the memory samples: older samples read
  // back without it, new ones keep it.
  void disk_tier_traffic_is_kept_and_older_samples_migrate() {
    const QString file = path("traffic.sqlite");
    {
      DbConnection c(file);
      migrate(c.db(), 3);
      QSqlQuery q(c.db());
      QVERIFY(q.exec("INSERT INTO runs (id, status) VALUES ('t1', 'completed')"));
      QVERIFY(
          q.exec("INSERT INTO memory (run_id, t, tier, device, used, optimizer) VALUES "
                 "('t1', 1, 'disk', '/offload', 1000, 1000)"));
    }
    RunsStore store(file);
    MemorySample m;
    m.t = 2;
    m.tier = "disk";
    m.device = "/offload";
    m.used = 2048;
    m.by_category[2] = 2048;
    m.traffic = {4096, 8192, 2.1e8, 1.9e8};
    RunBatch batch;
    batch.run_id = "t1";
    batch.memory.push_back(m);
    store.submit(batch);
    store.flush();
    DbConnection c(file);
    QCOMPARE(schema_version(c.db()), kRunsSchemaVersion);
    const RunSeries s = load_run_series(c.db(), "t1");
    QCOMPARE(s.memory.size(), 2);
    QVERIFY(!s.memory[0].traffic.reported());
    QCOMPARE(s.memory[0].by_category[2], 1000.0);
    QCOMPARE(s.memory[1].device, QString("/offload"));
    QVERIFY(!present(s.memory[1].budget));
    QCOMPARE(s.memory[1].traffic.read_bytes, 4096.0);
    QCOMPARE(s.memory[1].traffic.written_bytes, 8192.0);
    QCOMPARE(s.memory[1].traffic.read_bytes_per_s, 2.1e8);
    QCOMPARE(s.memory[1].traffic.written_bytes_per_s, 1.9e8);
  }

  // Preference tuning's figures per step come back with the run (the dashboard of a finished
  // run charts them from here); a database from before them migrates, its steps without them.
  void preference_figures_are_kept_and_older_metrics_migrate() {
    const QString file = path("preference.sqlite");
    {
      DbConnection c(file);
      migrate(c.db(), 5);
      QSqlQuery q(c.db());
      QVERIFY(q.exec("INSERT INTO runs (id, status) VALUES ('p1', 'completed')"));
      QVERIFY(q.exec("INSERT INTO metrics (run_id, step, t, loss) VALUES ('p1', 1, 1, 0.69)"));
    }
    RunsStore store(file);
    MetricPoint dpo;
    dpo.step = 2;
    dpo.t = 2;
    dpo.loss = 0.61;
    dpo.reward_chosen = 0.25;
    dpo.reward_rejected = -0.125;
    dpo.reward_margin = 0.375;
    dpo.reward_accuracy = 0.75;
    MetricPoint kto = dpo;
    kto.step = 3;
    kto.reward_accuracy = kMissing;
    kto.kl = 0.0625;
    RunBatch batch;
    batch.run_id = "p1";
    batch.metrics = {dpo, kto};
    store.submit(batch);
    store.flush();
    DbConnection c(file);
    QCOMPARE(schema_version(c.db()), kRunsSchemaVersion);
    const RunSeries s = load_run_series(c.db(), "p1");
    QCOMPARE(s.metrics.size(), 3);
    QVERIFY(!present(s.metrics[0].reward_margin) && !present(s.metrics[0].kl));
    QCOMPARE(s.metrics[1].reward_chosen, 0.25);
    QCOMPARE(s.metrics[1].reward_rejected, -0.125);
    QCOMPARE(s.metrics[1].reward_margin, 0.375);
    QCOMPARE(s.metrics[1].reward_accuracy, 0.75);
    QVERIFY(!present(s.metrics[1].kl));
    QVERIFY(!present(s.metrics[2].reward_accuracy));
    QCOMPARE(s.metrics[2].kl, 0.0625);
  }

  void newer_schema_is_refused_with_a_clear_error() {
    const QString file = path("future.sqlite");
    {
      DbConnection c(file);
      migrate(c.db());
      QSqlQuery q(c.db());
      QVERIFY(q.exec("UPDATE schema_version SET version = 99"));
    }
    try {
      RunsStore store(file);
      QFAIL("a newer schema was accepted");
    } catch (const tessera::Error& e) {
      QVERIFY2(QString(e.what()).contains("schema version 99"), e.what());
      QVERIFY(QString(e.what()).contains(file));
    }
  }

  // A finished run whose folder was moved or deleted says so in the list (it read "completed",
  // as if its model could still be exported); the history keeps the row.
  void a_run_whose_folder_is_gone_is_listed_as_such() {
    RunsStore store(path("folders.sqlite"));
    const QString kept = path("run-kept"), gone = path("run-gone");
    QVERIFY(QDir().mkpath(kept) && QDir().mkpath(gone));
    for (const auto& [id, folder] : {std::pair{"kept", kept}, std::pair{"gone", gone}}) {
      RunRecord run;
      run.id = id;
      run.status = "completed";
      run.output_dir = folder;
      RunBatch batch;
      batch.run_id = id;
      batch.upsert = run;
      store.submit(batch);
    }
    store.flush();
    QVERIFY(QDir(gone).removeRecursively());
    const QList<RunRecord> runs = store.list_runs_async().result();
    QCOMPARE(runs.size(), 2);
    RunsTableModel model;
    model.set_runs(runs);
    auto status = [&](const char* id, int role) {
      return model.index_of(model.row_of(id), RunsTableModel::Column::Status).data(role).toString();
    };
    QCOMPARE(status("kept", Qt::DisplayRole), QString("completed"));
    QCOMPARE(status("gone", Qt::DisplayRole), QString("completed, folder missing"));
    QVERIFY(status("gone", Qt::ToolTipRole).contains(gone + " is no longer there"));
    QVERIFY(status("kept", Qt::ToolTipRole).isEmpty());
  }

  void batches_are_written_by_the_writer_thread() {
    RunsStore store(path("batches.sqlite"));
    RunRecord run;
    run.id = "b1";
    run.status = "running";
    run.started_at = 1.0;
    RunBatch first;
    first.run_id = "b1";
    first.upsert = run;
    store.submit(first);
    for (int b = 0; b < 10; ++b) {
      RunBatch batch;
      batch.run_id = "b1";
      for (int i = 0; i < 100; ++i) {
        MetricPoint p;
        p.step = b * 100 + i + 1;
        p.loss = 3.0 - p.step * 0.001;
        batch.metrics.push_back(p);
      }
      MemorySample m;
      m.tier = "host";
      m.used = 1e9;
      m.by_category[0] = 4e8;
      m.system_used = 6e9;
      batch.memory.push_back(m);
      batch.events.push_back({b, 1.0, "log", R"({"type":"log","level":"info","message":"hi"})"});
      store.submit(batch);
    }
    RunBatch last;
    last.run_id = "b1";
    last.steps = {{1000, 1000}};
    last.status = "completed";
    last.ended_at = 9.0;
    store.submit(last);
    store.flush();
    DbConnection c(store.path());
    QCOMPARE(count(c.db(), "SELECT COUNT(*) FROM metrics WHERE run_id = 'b1'"), 1000);
    QCOMPARE(count(c.db(), "SELECT COUNT(*) FROM memory WHERE run_id = 'b1'"), 10);
    auto r = find_run(c.db(), "b1");
    QCOMPARE(r->status, QString("completed"));
    QCOMPARE(r->ended_at, 9.0);
    QCOMPARE(r->final_loss, 3.0 - 1000 * 0.001);
    QCOMPARE(r->steps_done, 1000);
    QCOMPARE(r->total_steps, 1000);
    RunSeries s = load_run_series(c.db(), "b1");
    QCOMPARE(s.memory.size(), 10);
    QCOMPARE(s.memory[0].by_category[0], 4e8);
    QCOMPARE(s.memory[0].system_used, 6e9);
    QCOMPARE(s.log.size(), 10);
    QVERIFY(s.log[0].contains("hi"));

    delete_run(c.db(), "b1");
    QCOMPARE(count(c.db(), "SELECT COUNT(*) FROM metrics"), 0);
    QVERIFY(!find_run(c.db(), "b1"));
  }
};

QTEST_GUILESS_MAIN(RunsDbTest)
#include "test_runs_db.moc"
