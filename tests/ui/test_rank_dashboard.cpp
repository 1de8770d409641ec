// A job of several processes on the run dashboard: a real 2-rank ddp run of a tiny Llama
// (`tessera-cli launch --nproc 2`, made once for the suite) streamed through a replay child into a
// RunMonitor and the dashboard, whose per-rank table must show each rank's loss, tokens/s and
// memory and the job's total exactly as the last events with `ranks` say (read here from the
// stream with a JSON parser of the test's own); the same after the run is read back from the
// runs database; a row per node once the ranks' hosts differ. And the wizard: 2 processes on this
// machine with ddp (offered as `plan` lists it) launched as `tessera-cli launch`, run to the end.
// And strategy hybrid's pipeline stages: each rank's place on the mesh and its idle share.
#include <QComboBox>
#include <QDir>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QListWidget>
#include <QProcess>
#include <QPushButton>
#include <QSignalSpy>
#include <QSortFilterProxyModel>
#include <QSpinBox>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <memory>

#include "tests/ui/studio_fixture.h"
#include "ui/main_window.h"
#include "ui/models/runs_db.h"
#include "ui/pages/hardware_page.h"
#include "ui/pages/run_dashboard.h"
#include "ui/pages/runs_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/run_monitor.h"
#include "ui/utility/studio_settings.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/layouts_table.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;
namespace job = tessera::job;

namespace {

// What the dashboard must show: the last metric event with `ranks` and, per tier, the last
// memory event with them.
struct Expected {
  QJsonObject metric;
  QMap<QString, QJsonObject> memory;  // tier -> event
};

Expected expected_of(const QByteArray& stream) {
  Expected e;
  for (const QByteArray& line : stream.split('\n')) {
    const QJsonObject o = QJsonDocument::fromJson(line).object();
    if (!o.contains("ranks")) continue;
    if (o.value("type").toString() == "metric") e.metric = o;
    if (o.value("type").toString() == "memory") e.memory[o.value("tier").toString()] = o;
  }
  return e;
}

QString cell(QTableWidget* t, int row, int column) {
  const QTableWidgetItem* item = t->item(row, column);
  return item ? item->text() : QString("<none>");
}

}  // namespace

class TestRankDashboard : public QObject {
  Q_OBJECT

  QTemporaryDir tmp_;
  QByteArray stream_;  // events.jsonl of the 2-rank run
  std::unique_ptr<RunsStore> store_;

  QString path(const QString& name) const { return QDir(tmp_.path()).filePath(name); }

  RunRecord make_run(const QString& id) const {
    RunRecord r;
    r.id = id;
    r.name = id;
    r.output_dir = path(id);
    r.status = "running";
    return r;
  }

  // Streams `events` through the replay child into a monitor and `dashboard`.
  void stream(RunMonitor& monitor, RunDashboard& dashboard, const QString& id,
              const QByteArray& events) {
    const QString file = path(id + ".events.jsonl");
    write_file(file, events);
    QSignalSpy finished(&monitor, &RunMonitor::finished);
    monitor.start(make_run(id), TESSERA_EVENT_REPLAY, {file, "--delay-ms", "1"});
    dashboard.attach(&monitor);
    QVERIFY(finished.wait(60000));
    QTest::qWait(100);  // the last repaint
  }

  // The table against `e`: a row per rank in rank order (with its node), a row per node when
  // there are several, then the job's.
  void check_table(QTableWidget* t, const Expected& e) {
    const QJsonArray metric_ranks = e.metric.value("ranks").toArray();
    QVERIFY(metric_ranks.size() >= 2);
    const QStringList tiers = e.memory.keys();
    QVERIFY(!tiers.isEmpty());
    QCOMPARE(t->columnCount(), 4 + tiers.size());
    for (int c = 0; c < tiers.size(); ++c)
      QCOMPARE(t->horizontalHeaderItem(4 + c)->text(), QString("Memory (%1)").arg(tiers[c]));
    QStringList hosts;
    for (int i = 0; i < metric_ranks.size(); ++i) {
      const QJsonObject r = metric_ranks[i].toObject();
      QCOMPARE(cell(t, i, 0), QString::number(r.value("rank").toInt()));
      QCOMPARE(cell(t, i, 2), QString::number(r.value("loss").toDouble(), 'f', 4));
      QCOMPARE(cell(t, i, 3), QString::number(r.value("tokens_per_s").toDouble(), 'f', 1));
      for (int c = 0; c < tiers.size(); ++c) {
        QJsonObject mine;
        for (const QJsonValue& m : e.memory[tiers[c]].value("ranks").toArray())
          if (m.toObject().value("rank").toInt() == r.value("rank").toInt()) mine = m.toObject();
        QVERIFY(!mine.isEmpty());
        QCOMPARE(cell(t, i, 4 + c), format_bytes(mine.value("used").toDouble()));
        QCOMPARE(cell(t, i, 1), mine.value("host").toString());
        if (!hosts.contains(mine.value("host").toString())) hosts << mine.value("host").toString();
      }
    }
    int row = int(metric_ranks.size());
    if (hosts.size() > 1) {
      for (const QString& host : hosts) {
        QCOMPARE(cell(t, row, 0), QString("node"));
        QCOMPARE(cell(t, row, 1), host);
        double tokens = 0;
        for (const QJsonValue& m : e.memory[tiers[0]].value("ranks").toArray())
          if (m.toObject().value("host").toString() == host)
            for (const QJsonValue& r : metric_ranks)
              if (r.toObject().value("rank") == m.toObject().value("rank"))
                tokens += r.toObject().value("tokens_per_s").toDouble();
        QCOMPARE(cell(t, row, 3), QString::number(tokens, 'f', 1));
        ++row;
      }
    }
    QCOMPARE(t->rowCount(), row + 1);
    QCOMPARE(cell(t, row, 0), QString("job"));
    QCOMPARE(cell(t, row, 2), QString::number(e.metric.value("loss").toDouble(), 'f', 4));
    QCOMPARE(cell(t, row, 3), QString::number(e.metric.value("tokens_per_s").toDouble(), 'f', 1));
    for (int c = 0; c < tiers.size(); ++c) {
      double sum = 0;
      for (const QJsonValue& m : e.memory[tiers[c]].value("ranks").toArray())
        sum += m.toObject().value("used").toDouble();
      QCOMPARE(cell(t, row, 4 + c), format_bytes(sum));
    }
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    isolate_settings(path("settings"));
    store_ = std::make_unique<RunsStore>(path("runs.sqlite"));
    const QString cli = training_cli();
    if (cli.isEmpty()) QSKIP("this tessera-cli cannot train (no LibTorch)");
    settings::set_cli_program(cli);  // the studio's (the wizard's case)
    QString error;
    if (make_tiny_llama(path("model"), &error) == 0) QSKIP(qPrintable(error));
    QByteArray rows;
    for (int a = 0; a < 8; ++a)
      for (int b = 0; b < 8; ++b)
        rows += QString(R"({"instruction": "What is %1 plus %2?", "output": "%3"})"
                        "\n")
                    .arg(a)
                    .arg(b)
                    .arg(a + b)
                    .toUtf8();
    write_file(path("data.jsonl"), rows);
    const QJsonObject spec{
        {"version", 1},
        {"model", QJsonObject{{"path", path("model")}}},
        {"dataset", QJsonObject{{"train", path("data.jsonl")}, {"max_length", 32}}},
        {"training", QJsonObject{{"steps", 4},
                                 {"batch_size", 2},
                                 {"learning_rate", 1e-3},
                                 {"seed", 7},
                                 {"log_every", 1}}},
        {"strategy", QJsonObject{{"name", "ddp"}, {"options", QJsonObject{{"device", "cpu"}}}}},
        {"output", QJsonObject{{"dir", path("ddp-2")}}}};
    write_file(path("ddp-2.json"), QJsonDocument(spec).toJson());
    QProcess launch;
    launch.start(cli, {"launch", "--nproc", "2", path("ddp-2.json")});
    QVERIFY(launch.waitForFinished(180000));
    QVERIFY2(launch.exitCode() == 0, launch.readAllStandardError().right(3000).constData());
    QFile events(path("ddp-2/events.jsonl"));
    QVERIFY(events.open(QIODevice::ReadOnly));
    stream_ = events.readAll();
    const Expected e = expected_of(stream_);
    QVERIFY2(!e.metric.isEmpty() && !e.memory.isEmpty(), "the 2-rank stream has no ranks");
  }

  // Live: the table shows what the last events with ranks say, and the charts their job's
  // figures; read back from the database, the same.
  void per_rank_figures_are_the_events() {
    if (stream_.isEmpty()) QSKIP("no 2-rank stream");
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    dashboard.resize(1280, 900);
    dashboard.show();
    QVERIFY(!dashboard.ranks_table()->isVisible());
    stream(monitor, dashboard, "two-ranks", stream_);
    QVERIFY(dashboard.ranks_table()->isVisible());
    check_table(dashboard.ranks_table(), expected_of(stream_));
    // Two ranks on this machine: one node, no node rows.
    QCOMPARE(dashboard.ranks_table()->rowCount(), 3);
    screenshot(&dashboard, "dashboard-ranks");

    store_->flush();
    RunDashboard replayed;
    replayed.resize(1280, 900);
    replayed.show();
    const RunSeries series = store_->load_series_async("two-ranks").result();
    QVERIFY(!series.metrics.isEmpty());
    replayed.show_replay(monitor.run(), series);
    check_table(replayed.ranks_table(), expected_of(stream_));
    replayed.clear();
    QVERIFY(!replayed.ranks_table()->isVisible());
  }

  // Rank 1 on another node (its host rewritten in the recorded stream): a row per node with its
  // ranks' throughput and memory added up.
  void per_node_rows() {
    if (stream_.isEmpty()) QSKIP("no 2-rank stream");
    QByteArray edited;
    for (const QByteArray& line : stream_.split('\n')) {
      QJsonObject o = QJsonDocument::fromJson(line).object();
      if (o.value("type").toString() == "memory" && o.contains("ranks")) {
        QJsonArray ranks = o.value("ranks").toArray();
        for (int i = 0; i < ranks.size(); ++i)
          if (ranks[i].toObject().value("rank").toInt() == 1) {
            QJsonObject r = ranks[i].toObject();
            r["host"] = "lab-2 (192.168.1.20)";
            ranks[i] = r;
          }
        o["ranks"] = ranks;
        edited += QJsonDocument(o).toJson(QJsonDocument::Compact) + "\n";
      } else if (!line.isEmpty()) {
        edited += line + "\n";
      }
    }
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    dashboard.resize(1280, 900);
    dashboard.show();
    stream(monitor, dashboard, "two-nodes", edited);
    QTableWidget* t = dashboard.ranks_table();
    QCOMPARE(t->rowCount(), 2 + 2 + 1);
    check_table(t, expected_of(edited));
    QCOMPARE(cell(t, 4, 1), QString("2 nodes"));
  }
  // Strategy hybrid with 2 pipeline stages (a real `launch --nproc 2` of the tiny llama, one
  // layer per stage): each rank's place on the mesh and the share of its step it waited for the
  // other stage, as its metric events say, live and read back from the database.
  void pipeline_stages_show_their_place_and_idle() {
    if (stream_.isEmpty()) QSKIP("no 2-rank stream");
    const QJsonObject spec{
        {"version", 1},
        {"model", QJsonObject{{"path", path("model")}}},
        {"dataset", QJsonObject{{"train", path("data.jsonl")}, {"max_length", 32}}},
        {"training", QJsonObject{{"steps", 3},
                                 {"batch_size", 2},
                                 {"gradient_accumulation", 2},
                                 {"learning_rate", 1e-3},
                                 {"seed", 7},
                                 {"log_every", 1}}},
        {"strategy",
         QJsonObject{{"name", "hybrid"},
                     {"options", QJsonObject{{"device", "cpu"}, {"tp_size", 1}, {"pp_size", 2}}}}},
        {"output", QJsonObject{{"dir", path("pp-2")}}}};
    write_file(path("pp-2.json"), QJsonDocument(spec).toJson());
    QProcess launch;
    launch.start(training_cli(), {"launch", "--nproc", "2", path("pp-2.json")});
    QVERIFY(launch.waitForFinished(180000));
    QVERIFY2(launch.exitCode() == 0, launch.readAllStandardError().right(3000).constData());
    QFile file(path("pp-2/events.jsonl"));
    QVERIFY(file.open(QIODevice::ReadOnly));
    const QByteArray events = file.readAll();
    const QJsonArray ranks = expected_of(events).metric.value("ranks").toArray();
    QCOMPARE(ranks.size(), 2);

    const auto check = [&](QTableWidget* t) {
      int place = -1, idle = -1;
      for (int c = 0; c < t->columnCount(); ++c) {
        if (t->horizontalHeaderItem(c)->text() == "Place (data · stage · tensor)") place = c;
        if (t->horizontalHeaderItem(c)->text() == "Pipeline idle") idle = c;
      }
      QVERIFY(place >= 0 && idle >= 0);
      for (int i = 0; i < ranks.size(); ++i) {
        const QJsonObject r = ranks[i].toObject();
        const QJsonObject mesh = r.value("mesh").toObject();
        QCOMPARE(mesh.value("pp").toInt(), i);
        QCOMPARE(cell(t, i, place), QString("dp %1 · stage %2 · tp %3")
                                        .arg(mesh.value("dp").toInt())
                                        .arg(mesh.value("pp").toInt())
                                        .arg(mesh.value("tp").toInt()));
        const double share = r.value("pipeline_idle_s").toDouble() / r.value("step_s").toDouble();
        QVERIFY(share >= 0.0 && share < 1.0);
        QCOMPARE(cell(t, i, idle), QString::number(100.0 * share, 'f', 1) + " %");
      }
    };
    RunMonitor monitor(store_.get());
    RunDashboard dashboard;
    dashboard.resize(1280, 900);
    dashboard.show();
    stream(monitor, dashboard, "pipeline", events);
    check(dashboard.ranks_table());
    screenshot(&dashboard, "dashboard-pipeline-ranks");
    store_->flush();
    RunDashboard replayed;
    replayed.resize(1280, 900);
    replayed.show();
    replayed.show_replay(monitor.run(), store_->load_series_async("pipeline").result());
    check(replayed.ranks_table());
  }

  // Preference tuning on 2 processes (DPO, ddp; KTO in one): the rewards chart has each step's
  // chosen, rejected and margin, the ranking chart each step's share of pairs ranked right (KTO:
  // its KL estimate instead), as many points as the stream has steps with them.
  void preference_rewards_are_charted() {
    QByteArray pairs, unpaired;
    for (int a = 0; a < 8; ++a)
      for (int b = 0; b < 4; ++b) {
        pairs += QString(R"({"prompt": "What is %1 plus %2?", "chosen": " %3", "rejected": " %4"})"
                         "\n")
                     .arg(a)
                     .arg(b)
                     .arg(a + b)
                     .arg(a + b + 3)
                     .toUtf8();
        unpaired += QString(R"({"prompt": "What is %1 plus %2?", "completion": " %3", "label": %4})"
                            "\n")
                        .arg(a)
                        .arg(b)
                        .arg(a + b + b % 2)
                        .arg(b % 2 ? "false" : "true")
                        .toUtf8();
      }
    write_file(path("pairs.jsonl"), pairs);
    write_file(path("unpaired.jsonl"), unpaired);
    for (const QString& loss : {QString("dpo"), QString("kto")}) {
      const bool kto = loss == "kto";
      const QString name = "pref-" + loss;
      const QJsonObject spec{
          {"version", 1},
          {"model", QJsonObject{{"path", path("model")}}},
          {"dataset", QJsonObject{{"train", path(kto ? "unpaired.jsonl" : "pairs.jsonl")},
                                  {"max_length", 32}}},
          {"method", QJsonObject{{"type", "lora"},
                                 {"preference", QJsonObject{{"loss", loss}, {"beta", 0.5}}}}},
          {"training", QJsonObject{{"steps", 4},
                                   {"batch_size", 4},
                                   {"learning_rate", 2e-2},
                                   {"seed", 7},
                                   {"log_every", 1}}},
          {"strategy", QJsonObject{{"name", kto ? "single" : "ddp"},
                                   {"options", QJsonObject{{"device", "cpu"}}}}},
          {"output", QJsonObject{{"dir", path(name)}}}};
      write_file(path(name + ".json"), QJsonDocument(spec).toJson());
      QProcess run;
      run.start(training_cli(), kto ? QStringList{"run", path(name + ".json")}
                                    : QStringList{"launch", "--nproc", "2", path(name + ".json")});
      QVERIFY(run.waitForFinished(180000));
      QVERIFY2(run.exitCode() == 0, run.readAllStandardError().right(3000).constData());
      QFile file(path(name + "/events.jsonl"));
      QVERIFY(file.open(QIODevice::ReadOnly));
      const QByteArray events = file.readAll();
      int steps = 0;
      for (const QByteArray& line : events.split('\n'))
        steps += QJsonDocument::fromJson(line).object().contains("preference");
      QCOMPARE(steps, 4);
      RunMonitor monitor(store_.get());
      RunDashboard dashboard;
      dashboard.resize(1280, 900);
      dashboard.show();
      stream(monitor, dashboard, name, events);
      QVERIFY(dashboard.rewards_chart()->isVisible());
      for (const char* series : {"chosen", "rejected", "margin"})
        QCOMPARE(dashboard.rewards_chart()->point_count(series), steps);
      QCOMPARE(dashboard.ranking_chart()->isVisible(), !kto);
      QCOMPARE(dashboard.kl_chart()->isVisible(), kto);
      if (kto)
        QCOMPARE(dashboard.kl_chart()->point_count("KL"), steps);
      else
        QCOMPARE(dashboard.ranking_chart()->point_count("reward accuracy"), steps);
      screenshot(&dashboard, "dashboard-" + name);
    }
  }

  // The layouts table on its own: the planner's order first (its choice marked), any column
  // sorts by its figures (not its text: "900 MiB" below "1.2 GiB"), a row's tooltip says why it
  // lost, and double-clicking or "Use this layout" emits the row's strategy key.
  void layouts_table_sorts_and_picks() {
    QJsonArray strategies;
    auto add = [&](const char* name, int stage, int tp, int pp, bool chosen, bool fits, double peak,
                   double seconds, double bubble, const char* summary) {
      strategies.append(QJsonObject{{"strategy", name},
                                    {"zero_stage", stage},
                                    {"tp_size", tp},
                                    {"pp_size", pp},
                                    {"sequence_parallel", false},
                                    {"layout", name},
                                    {"chosen", chosen},
                                    {"fits", fits},
                                    {"micro_batch", 8},
                                    {"activation_checkpointing", !fits},
                                    {"peak_per_rank", peak},
                                    {"seconds_per_step", seconds},
                                    {"communication_seconds_per_step", seconds / 10},
                                    {"bubble", bubble},
                                    {"summary", summary}});
    };
    add("ddp", 0, 1, 1, true, true, 1.2 * (1 << 30), 11.9, 0, "");
    add("zero", 2, 1, 1, false, true, 900.0 * (1 << 20), 12.0, 0, "zero stage 2 would save");
    add("hybrid", 0, 1, 2, false, true, 1.1 * (1 << 30), 16.9, 0.33, "no quicker");
    add("gemini", 0, 1, 1, false, false, 3.0 * (1 << 30), 20.0, 0, "would need 3 GiB");
    LayoutsTable table;
    table.resize(900, 400);
    table.show();
    table.show_layouts(strategies);
    QCOMPARE(table.row_count(), 4);
    QStringList keys;
    for (int row = 0; row < 4; ++row) keys << table.key_at(row);
    QCOMPARE(keys, QStringList({"ddp", "zero:2", "hybrid:1x2x0x0", "gemini"}));
    QVERIFY(table.sorted()->index(0, LayoutsTable::Layout).data().toString().startsWith("✓"));
    QCOMPARE(table.sorted()->index(1, LayoutsTable::Layout).data(Qt::ToolTipRole).toString(),
             QString("zero stage 2 would save"));
    table.view()->sortByColumn(LayoutsTable::Peak, Qt::AscendingOrder);
    keys.clear();
    for (int row = 0; row < 4; ++row) keys << table.key_at(row);
    QCOMPARE(keys, QStringList({"zero:2", "hybrid:1x2x0x0", "ddp", "gemini"}));
    table.view()->sortByColumn(LayoutsTable::Bubble, Qt::DescendingOrder);
    QCOMPARE(table.key_at(0), QString("hybrid:1x2x0x0"));
    QCOMPARE(table.sorted()->index(0, LayoutsTable::Bubble).data().toString(), QString("33%"));
    QSignalSpy picked(&table, &LayoutsTable::layoutPicked);
    QVERIFY(!table.use_button()->isEnabled());
    table.view()->selectRow(0);
    table.use_button()->click();
    QCOMPARE(picked.count(), 1);
    QCOMPARE(picked.at(0).at(0).toString(), QString("hybrid:1x2x0x0"));
    const QModelIndex gemini = table.sorted()->index(3, LayoutsTable::Layout);
    table.view()->setCurrentIndex(gemini);
    Q_EMIT table.view()->activated(gemini);
    QCOMPARE(picked.count(), 2);
    QCOMPARE(picked.at(1).at(0).toString(), table.key_at(3));
    table.show_layouts({});
    QCOMPARE(table.row_count(), 0);
  }

  // Hardware & strategy: 2 processes on this machine; the strategy list offers what `plan`
  // plans for 2 processes (ddp, zero stages when registered); ddp chosen; Review says "2
  // processes"; Launch runs `tessera-cli launch` on the spec's nodes, and the dashboard shows
  // both ranks to the end.
  void wizard_launches_two_processes() {
    if (stream_.isEmpty()) QSKIP("no 2-rank stream");
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    if (!window.cli_probe()->supports("launch") || !window.cli_probe()->supports("plan"))
      QSKIP("this tessera-cli has no launch or plan");
    FineTuneWizard* wizard = window.wizard();
    HardwarePage* hardware = wizard->hardware_page();
    QCOMPARE(hardware->processes()->value(), 1);
    QVERIFY(!hardware->distributed_strategy()->isEnabled());
    QVERIFY(!wizard->build_spec().nodes);
    hardware->processes()->setValue(2);
    QVERIFY(hardware->distributed_strategy()->isEnabled());
    QVERIFY(hardware->processes_note()->text().startsWith("2 processes on this machine"));
    wizard->model_page()->choose_folder(path("model"));
    wizard->dataset_page()->max_length()->setValue(32);
    wizard->dataset_page()->choose_file(path("data.jsonl"));
    wizard->method_page()->set_method("full");
    wizard->method_page()->set_steps(4);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    wizard->go_to(FineTuneWizard::HardwareStep);  // where the job is planned
    // The planner's strategies for 2 processes, as it lists them, are offered.
    QComboBox* strategies = hardware->distributed_strategy();
    QTRY_VERIFY2_WITH_TIMEOUT(
        strategies->findData("ddp") >= 0,
        qPrintable(QString("missing: %1; plan: %2 %3")
                       .arg(wizard->missing().join("; "), hardware->strategy_label()->text(),
                            hardware->plan_error())),
        60000);
    QTRY_VERIFY_WITH_TIMEOUT(!hardware->planning() && hardware->has_plan(), 60000);
    QCOMPARE(hardware->plan_json().value("ranks").toObject().value("processes").toInt(), 2);
    int hybrid_layouts = 0;
    for (const QJsonValue& v : hardware->plan_json().value("strategies").toArray()) {
      const QJsonObject planned = v.toObject();
      const int stage = planned.value("zero_stage").toInt();
      const QString name = planned.value("strategy").toString();
      // hybrid: one entry per layout the planner weighed.
      const QString key = name == "hybrid"
                              ? QString("hybrid:%1x%2x%3x%4")
                                    .arg(planned.value("tp_size").toInt())
                                    .arg(planned.value("pp_size").toInt())
                                    .arg(stage)
                                    .arg(planned.value("sequence_parallel").toBool() ? 1 : 0)
                              : name + (stage > 0 ? QString(":%1").arg(stage) : QString());
      QVERIFY2(strategies->findData(key) >= 0, qPrintable(key));
      hybrid_layouts += name == "hybrid" ? 1 : 0;
    }
    // The tiny llama splits 2 ways either way: tensor 2 × pipeline 1 (also with sequence
    // parallelism) and tensor 1 × pipeline 2 (one replica each: nothing for ZeRO-1 to share);
    // choosing one writes its sizes into the job.
    QCOMPARE(hybrid_layouts, 3);
    QVERIFY(strategies->findData("hybrid:2x1x0x1") >= 0);
    QCOMPARE(strategies->itemText(strategies->findData("hybrid:2x1x0x1")),
             QString("hybrid: tensor 2 × pipeline 1, sequence parallel"));
    strategies->setCurrentIndex(strategies->findData("hybrid:1x2x0x0"));
    QCOMPARE(strategies->currentText(), QString("hybrid: tensor 1 × pipeline 2"));
    const job::JobSpec split = wizard->build_spec();
    QCOMPARE(split.strategy.name, std::string("hybrid"));
    QCOMPARE(split.strategy.options.value("tp_size", 0), 1);
    QCOMPARE(split.strategy.options.value("pp_size", 0), 2);
    QVERIFY(!split.strategy.options.contains("zero_stage"));
    QVERIFY(!split.strategy.options.contains("sequence_parallel"));
    // The table lists every layout the plan weighed, its choice first; picking a row there
    // chooses it in the list above (and plans again).
    LayoutsTable* table = hardware->layouts_table();
    QTRY_VERIFY_WITH_TIMEOUT(!hardware->planning() && hardware->has_plan(), 60000);
    QVERIFY(table->isVisible());
    QCOMPARE(table->row_count(), int(hardware->plan_json().value("strategies").toArray().size()));
    QVERIFY(table->row_count() >= 6);  // ddp, zero 1 and 2, gemini, hybrid's three
    int tp_row = -1;
    for (int row = 0; row < table->row_count(); ++row)
      if (table->key_at(row) == "hybrid:2x1x0x0") tp_row = row;
    QVERIFY(tp_row >= 0);
    table->view()->selectRow(tp_row);
    QVERIFY(table->use_button()->isEnabled());
    table->use_button()->click();
    QCOMPARE(strategies->currentData().toString(), QString("hybrid:2x1x0x0"));
    QCOMPARE(wizard->build_spec().strategy.options.value("tp_size", 0), 2);
    // Its batch is the one replica's: the note says what a step trains against whole replicas.
    const job::JobSpec picked = wizard->build_spec();
    const qint64 per_replica =
        qint64(picked.training.batch_size) * qint64(picked.training.gradient_accumulation);
    QVERIFY2(hardware->processes_note()->text().contains(
                 QString("a step trains %1 sequences on 1 replica(s), where a layout of whole "
                         "replicas on every process trains %2")
                     .arg(per_replica)
                     .arg(2 * per_replica)),
             qPrintable(hardware->processes_note()->text()));
    // Named, the plan still lists the others beside it (the choice marked).
    QTRY_VERIFY_WITH_TIMEOUT(!hardware->planning() && hardware->has_plan() &&
                                 hardware->plan_json().value("strategy").toString() == "hybrid",
                             60000);
    QCOMPARE(table->key_at(0), QString("hybrid:2x1x0x0"));
    QVERIFY(table->row_count() >= 6);
    screenshot(&window, "4-hardware-layouts");
    // One process's strategy is not offered; gemini is, sharded over the ranks (the planner
    // plans it per rank since issue 12's gemini slice).
    for (int i = 0; i < strategies->count(); ++i)
      QVERIFY(strategies->itemData(i).toString() != "single");
    QVERIFY(strategies->findData("gemini") >= 0);
    strategies->setCurrentIndex(strategies->findData("ddp"));
    QVERIFY(!hardware->processes_note()->text().contains("replica"));
    const job::JobSpec spec = wizard->build_spec();
    QCOMPARE(spec.strategy.name, std::string("ddp"));
    QVERIFY(spec.nodes);
    QCOMPARE(spec.nodes->ranks_per_node.size(), size_t(1));
    QCOMPARE(spec.nodes->ranks_per_node[0].name, std::string("local"));
    QCOMPARE(spec.nodes->ranks_per_node[0].nproc, 2);
    wizard->go_to(FineTuneWizard::ReviewStep);
    QTRY_COMPARE_WITH_TIMEOUT(wizard->review_page()->summary_value("Processes"),
                              QString("2 processes: 2 on this machine (tessera-cli launch)"),
                              30000);

    const QString run_id = launch_through_wizard(window, {}, path("data.jsonl"), 32, "full", 4);
    QVERIFY2(!run_id.isEmpty(), qPrintable(wizard->missing().join("; ")));
    RunDashboard* dashboard = window.runs_page()->dashboard();
    QCOMPARE(wait_for_run_end(dashboard, 240000), QString("completed"));
    const QString folder = dashboard->run().output_dir;
    QVERIFY(folder.endsWith(run_id));
    const job::JobSpec ran = job::load_job_spec(QDir(folder).filePath("job.json").toStdString());
    QCOMPARE(ran.strategy.name, std::string("ddp"));
    QVERIFY(ran.nodes && ran.nodes->ranks_per_node.at(0).nproc == 2);
    QFile events(QDir(folder).filePath("events.jsonl"));
    QVERIFY(events.open(QIODevice::ReadOnly));
    const Expected e = expected_of(events.readAll());
    QCOMPARE(e.metric.value("ranks").toArray().size(), 2);
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->ranks_table()->rowCount() == 3, 10000);
    check_table(dashboard->ranks_table(), e);
  }
};

QTEST_MAIN(TestRankDashboard)
#include "test_rank_dashboard.moc"
