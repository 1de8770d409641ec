// Keyboard mnemonics (Alt+letter) as Qt resolves them: every widget that registers one (a
// button's "&Resume", a label's "&Folder:" with a buddy, a group box's title, a tab, a menu-bar
// menu) competes with the others in its window, and when two that are shown share a key, Qt only
// moves the focus between them: the key does nothing a person asked for. This suite walks every
// page of the main window (each wizard step, each tab, each view of a page's stack: the Hub
// views, the empty Runs page and the one with a run, the wizard with a complete job) and the
// dialogs the menus open, and fails on two shown widgets, or menus, that share a key. Also: each
// menu's own items, and a label that shows a literal '&' because it has no buddy to take its
// mnemonic.
//
// A shown but disabled widget counts: it becomes enabled on the same page without anything else
// changing (Resume once a run stops, Compare once two runs are selected), and the clash with it.
#include <QAbstractButton>
#include <QAction>
#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QFile>
#include <QGroupBox>
#include <QJsonArray>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMap>
#include <QMenu>
#include <QMenuBar>
#include <QPushButton>
#include <QShortcut>
#include <QStackedWidget>
#include <QTabBar>
#include <QTabWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTextDocument>
#include <QVBoxLayout>
#include <memory>

#include "job/job_spec.h"
#include "tests/ui/studio_fixture.h"
#include "ui/dialogs/about_dialog.h"
#include "ui/dialogs/export_dialog.h"
#include "ui/dialogs/user_guide_window.h"
#include "ui/main_window.h"
#include "ui/models/runs_db.h"
#include "ui/pages/hardware_page.h"
#include "ui/pages/runs_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/studio_settings.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;
namespace job = tessera::job;

namespace {

// What a key belongs to, as a person would name it: the class and its text.
QString describe(const QObject* owner, const QString& text) {
  return QString("%1 \"%2\"").arg(owner->metaObject()->className(), text);
}

// Whether `w` is shown in its window now (it and every parent visible).
bool shown(const QWidget* w) {
  return w->isVisible();
}

bool rich(const QLabel* label) {
  return label->textFormat() == Qt::RichText ||
         (label->textFormat() == Qt::AutoText && Qt::mightBeRichText(label->text()));
}

// Whether `text` marks a mnemonic a person would read as one: '&' before a letter or a digit
// ("&&" is a literal ampersand; "A & B" is no mnemonic a label means).
bool marks_mnemonic(const QString& text) {
  for (qsizetype i = text.indexOf('&'); i >= 0 && i + 1 < text.size(); i = text.indexOf('&', i + 2))
    if (text[i + 1] != '&') return text[i + 1].isLetterOrNumber();
  return false;
}

// Every key the window's shown widgets and its menu bar take now (mnemonics and shortcuts), each
// with who takes it.
QMap<QString, QStringList> keys_taken(QWidget* window) {
  QMap<QString, QStringList> taken;
  const auto take = [&](const QKeySequence& key, const QString& who) {
    if (!key.isEmpty()) taken[key.toString(QKeySequence::PortableText)] << who;
  };
  for (QMenuBar* bar : window->findChildren<QMenuBar*>()) {
    if (!shown(bar)) continue;
    for (QAction* menu : bar->actions()) {
      if (!menu->isVisible()) continue;
      take(QKeySequence::mnemonic(menu->text()), describe(menu, menu->text()));
      // The menus' items' own shortcuts (Ctrl+N, F1) work while the menus are closed.
      if (QMenu* items = menu->menu())
        for (QAction* item : items->actions())
          if (item->isVisible())
            for (const QKeySequence& key : item->shortcuts())
              take(key, describe(item, item->text()));
    }
  }
  for (QWidget* w : window->findChildren<QWidget*>()) {
    if (w->window() != window || !shown(w)) continue;
    if (auto* button = qobject_cast<QAbstractButton*>(w)) {
      take(button->shortcut(), describe(button, button->text()));
    } else if (auto* label = qobject_cast<QLabel*>(w)) {
      if (label->buddy() && label->text().contains('&'))
        take(QKeySequence::mnemonic(label->text()), describe(label, label->text()));
    } else if (auto* group = qobject_cast<QGroupBox*>(w)) {
      take(QKeySequence::mnemonic(group->title()), describe(group, group->title()));
    } else if (auto* tabs = qobject_cast<QTabBar*>(w)) {
      for (int i = 0; i < tabs->count(); ++i)
        if (tabs->isTabVisible(i))
          take(QKeySequence::mnemonic(tabs->tabText(i)), describe(tabs, tabs->tabText(i)));
    }
  }
  for (QShortcut* s : window->findChildren<QShortcut*>()) {
    auto* parent = qobject_cast<QWidget*>(s->parent());
    if (s->isEnabled() && parent && parent->window() == window && shown(parent))
      for (const QKeySequence& key : s->keys()) take(key, describe(s, key.toString()));
  }
  return taken;
}

// What is wrong with the keys of `window` as it is shown now.
QStringList problems(QWidget* window) {
  QStringList found;
  const auto taken = keys_taken(window);
  for (auto it = taken.begin(); it != taken.end(); ++it)
    if (it.value().size() > 1)
      found << QString("%1 is taken by %2").arg(it.key(), it.value().join(", "));
  for (QLabel* label : window->findChildren<QLabel*>())
    if (label->window() == window && shown(label) && !label->buddy() && !rich(label) &&
        marks_mnemonic(label->text()))
      found << QString("%1 has no buddy: it shows the '&'").arg(describe(label, label->text()));
  return found;
}

// The name of the page `i` of `stack` as a person would name it: its tab's text, or the text
// of its first label.
QString page_name(QStackedWidget* stack, int i) {
  if (auto* tabs = qobject_cast<QTabWidget*>(stack->parentWidget()))
    return "tab " + tabs->tabText(i).remove('&');
  QWidget* page = stack->widget(i);
  if (!page->objectName().isEmpty()) return page->objectName();
  return QString("%1 %2").arg(QString(page->metaObject()->className()).section("::", -1)).arg(i);
}

// The stacked widget `w` is shown in (its nearest), or null.
QStackedWidget* enclosing_stack(QWidget* w, QWidget* scope) {
  for (QWidget* p = w->parentWidget(); p && p != scope; p = p->parentWidget())
    if (auto* s = qobject_cast<QStackedWidget*>(p)) return s;
  return nullptr;
}

// Shows page `i` of `stack` (through its tab bar when it is a tab widget's).
void show_stack_page(QStackedWidget* stack, int i) {
  if (auto* tabs = qobject_cast<QTabWidget*>(stack->parentWidget()))
    tabs->setCurrentIndex(i);
  else
    stack->setCurrentIndex(i);
}

// Each problem of every state of `window` reached by showing each page of each stacked widget
// under `scope` (a wizard step, a tab, a page's other view; nested ones within each page), once,
// with the first state it was seen in.
void walk(QWidget* window, QWidget* scope, const QString& state, QMap<QString, QString>* found) {
  for (const QString& problem : problems(window))
    if (!found->contains(problem)) found->insert(problem, state);
  for (QStackedWidget* stack : scope->findChildren<QStackedWidget*>()) {
    if (!shown(stack) || enclosing_stack(stack, scope) != nullptr) continue;
    const int original = stack->currentIndex();
    for (int i = 0; i < stack->count(); ++i) {
      show_stack_page(stack, i);
      walk(window, stack->widget(i), state + " > " + page_name(stack, i), found);
    }
    show_stack_page(stack, original);
  }
}

// "STATE: PROBLEM", a line each.
// (QVERIFY2 cuts a long message: each line is also printed.)
QString report(const QMap<QString, QString>& found) {
  QStringList lines;
  for (auto it = found.begin(); it != found.end(); ++it) {
    lines << it.value() + ": " + it.key();
    qWarning("%s", qPrintable(lines.last()));
  }
  return QString("%1 problems: %2").arg(lines.size()).arg(lines.join('\n'));
}

}  // namespace

class MnemonicsTest : public QObject {
  Q_OBJECT

  QTemporaryDir tmp_;
  std::unique_ptr<RunsStore> store_;
  QString demo_;  // the demo model and dataset (tessera-cli demo --no-train)

  QString path(const QString& rel) const { return QDir(tmp_.path()).filePath(rel); }

  // A finished run in the database, its model/ in its folder (so Export and Try it are on).
  RunRecord record_run(const QString& id) {
    RunRecord run;
    run.id = id;
    run.name = "mnemonics";
    run.model = "demo/base";
    run.dataset = "train.jsonl";
    run.method = "full";
    run.status = "completed";
    run.output_dir = path("runs/" + id);
    run.started_at = 1.7e9;
    run.ended_at = 1.7e9 + 60;
    run.spec_json = R"({"model":{"path":"demo/base"},"training":{"steps":10}})";
    QDir().mkpath(run.output_dir + "/model");
    write_file(run.output_dir + "/job.json", run.spec_json.toUtf8());
    write_file(run.output_dir + "/model/config.json", R"({"model_type":"llama"})");
    write_file(run.output_dir + "/model/model.safetensors", QByteArray(4096, '\0'));
    RunBatch batch;
    batch.run_id = id;
    batch.upsert = run;
    batch.steps = std::make_pair(std::int64_t(10), std::int64_t(10));
    batch.status = "completed";
    batch.ended_at = run.ended_at;
    store_->submit(batch);
    store_->flush();
    return run;
  }

  // Every page of a main window on this database: each sidebar page and what it holds, and each
  // menu's own items as a person reads them with the menu open.
  void walk_main_window(const QString& state, QMap<QString, QString>* found) {
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    QVERIFY(QTest::qWaitForWindowExposed(&window));
    QVERIFY(QTest::qWaitFor([&] { return !window.runs_page()->loading(); }, 10000));
    // The Hardware step is shown once the CLI said what it can do.
    QVERIFY(QTest::qWaitFor([&] { return window.cli_probe()->finished(); }, 20000));
    for (int page = MainWindow::NewFineTune; page <= MainWindow::Settings; ++page) {
      window.show_page(MainWindow::Page(page));
      walk(&window, window.page_widget(MainWindow::Page(page)),
           state + " > " + window.sidebar()->item(page)->text(), found);
    }
    for (QAction* menu : window.menuBar()->actions()) {
      if (!menu->menu()) continue;
      QMap<QString, QStringList> items;
      for (QAction* item : menu->menu()->actions())
        if (item->isVisible() && !item->isSeparator())
          if (const QKeySequence key = QKeySequence::mnemonic(item->text()); !key.isEmpty())
            items[key.toString(QKeySequence::PortableText)] << item->text();
      for (auto it = items.begin(); it != items.end(); ++it)
        if (it.value().size() > 1)
          found->insert(QString("%1 is taken by %2").arg(it.key(), it.value().join(", ")),
                        "menu " + menu->text());
    }
  }

  // The rows a step shows only for a complete job: the demo model with full fine-tuning (on the
  // CPU the Hardware step shows its offload sliders, and "Let the planner choose" with an
  // override), a dataset with a bad row that is skipped, Review with Launch.
  void walk_complete_job(QMap<QString, QString>* found) {
    QVERIFY2(!demo_.isEmpty(), "no demo model (see initTestCase)");
    job::JobSpec spec = job::load_job_spec((demo_ + "/job.json").toStdString());
    const QString train = path("with-a-bad-row.jsonl");
    QFile demo_train(demo_ + "/train.jsonl");
    QVERIFY(demo_train.open(QIODevice::ReadOnly));
    write_file(train, demo_train.readAll() + "{\"instruction\":\"first abc\"}\n");
    spec.dataset.train_files = {train.toStdString()};
    spec.dataset.skip_bad_rows = true;
    spec.method.type = "full";
    spec.strategy.name = "gemini";
    spec.strategy.options = {{"offload_optim_frac", 0.5}, {"offload_param_frac", 0.0}};
    spec.output.dir = path("runs/complete").toStdString();

    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    QVERIFY(QTest::qWaitForWindowExposed(&window));
    QVERIFY(QTest::qWaitFor([&] { return window.cli_probe()->finished(); }, 20000));
    FineTuneWizard* wizard = window.wizard();
    wizard->load_spec(spec);
    window.show_page(MainWindow::NewFineTune);
    HardwarePage* hardware = wizard->hardware_page();
    QVERIFY2(QTest::qWaitFor(
                 [&] {
                   return wizard->missing().isEmpty() && !hardware->planning() &&
                          hardware->plan_is_for(wizard->build_spec());
                 },
                 60000),
             qPrintable(wizard->missing().join("; ") + " " + hardware->plan_error()));
    QVERIFY2(wizard->dataset_page()->rows_to_skip() == 1,
             qPrintable(QString::number(wizard->dataset_page()->rows_to_skip())));
    // Training on the CPU (no "device" tier in the plan), the offload rows are shown.
    bool on_gpu = false;
    for (const QJsonValue& tier : hardware->plan_json().value("memory").toArray())
      on_gpu = on_gpu || tier.toObject().value("tier").toString() == "device";
    QVERIFY2(on_gpu || (hardware->param_offload_slider()->isVisibleTo(hardware) &&
                        hardware->offload_reset()->isVisibleTo(hardware)),
             "the Hardware step hides its offload rows for full fine-tuning on the CPU");
    walk(&window, window.page_widget(MainWindow::NewFineTune), "a complete job > New fine-tune",
         found);
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    QCoreApplication::setOrganizationName("TesseraTest");
    QCoreApplication::setApplicationName("tessera-mnemonics");
    isolate_settings(tmp_.path());
    // This build's CLI: the Hardware step shows once it says it has `profile` and `plan`.
    settings::set_cli_program(studio_cli());
    store_ = std::make_unique<RunsStore>(settings::database_path());
    const QString demo_error = make_demo(studio_cli(), path("demo"));
    QVERIFY2(demo_error.isEmpty(), qPrintable(demo_error));
    demo_ = path("demo");
  }

  // The check itself: it finds the clashes it is built to find (two shown buttons that share
  // Alt+R, a buddy-less label with a mnemonic), not a hidden widget's, and nothing once fixed.
  void finds_a_clash() {
    QWidget window;
    auto* layout = new QVBoxLayout(&window);
    auto* resume = new QPushButton("&Resume");
    auto* refresh = new QPushButton("&Refresh");
    auto* label = new QLabel("&Folder:");
    auto* folder = new QLineEdit;
    for (QWidget* w : {static_cast<QWidget*>(resume), static_cast<QWidget*>(refresh),
                       static_cast<QWidget*>(label), static_cast<QWidget*>(folder)})
      layout->addWidget(w);
    window.show();
    QVERIFY(QTest::qWaitForWindowExposed(&window));
    QStringList found = problems(&window);
    QCOMPARE(found.size(), 2);
    QVERIFY2(found.filter("Alt+R is taken by").size() == 1 &&
                 found.join('\n').contains("&Refresh") && found.join('\n').contains("&Resume"),
             qPrintable(found.join('\n')));
    QVERIFY2(found.filter("no buddy").size() == 1, qPrintable(found.join('\n')));
    label->setBuddy(folder);       // now Alt+F moves to the folder, and the '&' is not shown
    refresh->setText("Re&fresh");  // but Alt+F is the label's
    found = problems(&window);
    QVERIFY2(found.size() == 1 && found[0].startsWith("Alt+F is taken by"),
             qPrintable(found.join('\n')));
    refresh->hide();  // a hidden widget takes no key
    QVERIFY2(problems(&window).isEmpty(), qPrintable(problems(&window).join('\n')));
    refresh->show();
    refresh->setText("R&efresh");
    QVERIFY2(problems(&window).isEmpty(), qPrintable(problems(&window).join('\n')));
  }

  // The main window's pages, before the first run (the demo offer, the empty Runs page) and with
  // a run shown on the Runs page (its dashboard, the Compare and Try it tabs).
  void main_window_pages() {
    QMap<QString, QString> found;
    walk_main_window("no runs", &found);
    record_run("run-a");
    walk_main_window("with a run", &found);
    walk_complete_job(&found);
    QVERIFY2(found.isEmpty(), qPrintable(report(found)));
  }

  // The windows the menus open: Run > Export… (each kind it offers, a folder or a GGUF file),
  // Help > User guide and Help > About.
  void dialogs() {
    QMap<QString, QString> found;
    const RunRecord run = record_run("run-b");
    ExportDialog exporter(run, studio_cli());
    exporter.show();
    QVERIFY(QTest::qWaitForWindowExposed(&exporter));
    QVERIFY(exporter.kind_combo()->count() > 0);
    for (int i = 0; i < exporter.kind_combo()->count(); ++i) {
      exporter.kind_combo()->setCurrentIndex(i);
      walk(&exporter, &exporter, "Export > " + exporter.kind_combo()->itemText(i), &found);
    }
    UserGuideWindow guide;
    guide.show();
    QVERIFY(QTest::qWaitForWindowExposed(&guide));
    walk(&guide, &guide, "User guide", &found);
    AboutDialog about(studio_cli());
    about.show();
    QVERIFY(QTest::qWaitForWindowExposed(&about));
    walk(&about, &about, "About", &found);
    QVERIFY2(found.isEmpty(), qPrintable(report(found)));
  }
};

QTEST_MAIN(MnemonicsTest)
#include "test_mnemonics.moc"
