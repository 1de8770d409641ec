// Test-only writer of the studio's runs database for tests/ui/test_runs_db_kill.py:
//   tessera-runs-db-writer DB FIRST
// opens (creating and migrating) DB through RunsStore, prints "ready", then commits batches
// for runs "run-FIRST", "run-FIRST+1", ... — each a run row and ten metric rows — and prints
// "committed N" once batch N is committed (RunsStore::flush returned), until it is killed.
#include <QCoreApplication>
#include <QDateTime>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "ui/models/runs_db.h"

int main(int argc, char** argv) {
  QCoreApplication app(argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: tessera-runs-db-writer DB FIRST\n");
    return 2;
  }
  try {
    tessera::ui::RunsStore store(QString::fromLocal8Bit(argv[1]));
    std::printf("ready\n");
    std::fflush(stdout);
    for (long long n = std::atoll(argv[2]);; ++n) {
      tessera::ui::RunBatch batch;
      batch.run_id = QString("run-%1").arg(n);
      tessera::ui::RunRecord run;
      run.id = batch.run_id;
      run.name = run.id;
      run.status = "running";
      run.started_at = double(QDateTime::currentMSecsSinceEpoch()) / 1000.0;
      batch.upsert = run;
      for (int step = 1; step <= 10; ++step) {
        tessera::ui::MetricPoint m;
        m.step = step;
        m.t = run.started_at + step;
        m.loss = 1.0 / step;
        batch.metrics.push_back(m);
      }
      store.submit(batch);
      store.flush();
      std::printf("committed %lld\n", n);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-runs-db-writer: %s\n", e.what());
    return 1;
  }
}
