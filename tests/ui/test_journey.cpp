// The studio as a person meets it: the real MainWindow on the xcb platform under Xvfb
// (tests/ui/run_under_xvfb.sh starts the server), driven only by X input that xdotool sends
// through the server: mouse moves and clicks at widgets' on-screen centres, typed text and key
// combinations. One journey on the demo model and dataset: the wizard, a real LoRA run, Stop,
// Resume, Export, Try it, a second run and Compare. Widgets are found the way a person finds
// them (their text, their label, their accessible name), and each step waits for Qt to have
// received the input and then for its effect, never for a fixed time. Where a person expects
// the keyboard focus (a dialog's first field, the chat's message field) it is checked.
#include <QAbstractButton>
#include <QAction>
#include <QApplication>
#include <QCheckBox>
#include <QDialog>
#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QPointer>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QScrollArea>
#include <QSpinBox>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTimer>
#include <QWindow>
#include <csignal>
#include <functional>
#include <memory>
#include <optional>

#include "tests/ui/studio_fixture.h"
#include "ui/dialogs/export_dialog.h"
#include "ui/dialogs/user_guide_window.h"
#include "ui/main_window.h"
#include "ui/models/runs_db.h"
#include "ui/models/runs_table_model.h"
#include "ui/pages/run_dashboard.h"
#include "ui/pages/runs_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/run_monitor.h"
#include "ui/utility/studio_settings.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/chat_pane.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;

// Runs one step of the journey and ends the test function when it recorded a failure (the
// helpers below fail with QVERIFY, which only returns from the helper itself).
#define STEP(...)                           \
  do {                                      \
    __VA_ARGS__;                            \
    if (QTest::currentTestFailed()) return; \
  } while (false)

namespace {

using Effect = std::function<bool()>;
constexpr int kEffectMs = 20000;  // an input's effect (a page change, a check of a file) is seen

// A widget's text as a person reads it: without mnemonics' '&' and a trailing "…".
QString readable(QString text) {
  text.remove('&');
  if (text.endsWith(QChar(0x2026))) text.chop(1);
  return text.trimmed();
}

bool shown(const QWidget* w) {
  return w->isVisible() && w->isEnabled();
}

// Counts the mouse-button and key releases Qt's windows receive: an X input has reached the
// application when its release has.
class InputCounter : public QObject {
 public:
  int releases = 0;

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override {
    if (watched->isWindowType() &&
        (event->type() == QEvent::MouseButtonRelease || event->type() == QEvent::KeyRelease))
      ++releases;
    return false;
  }
};

InputCounter* input_counter() {
  static InputCounter* counter = [] {
    auto* c = new InputCounter;
    qApp->installEventFilter(c);
    return c;
  }();
  return counter;
}

// `xdotool ARGS`; a test failure with its error when it fails.
void xdotool(const QStringList& args) {
  QProcess p;
  p.start("xdotool", args);
  QVERIFY2(p.waitForFinished(10000), qPrintable("xdotool " + args.join(' ') + " hangs"));
  QVERIFY2(p.exitStatus() == QProcess::NormalExit && p.exitCode() == 0,
           qPrintable("xdotool " + args.join(' ') + ": " + p.readAllStandardError()));
}

// Gives `w`'s window the X input focus (what a window manager does for the window a person
// clicks or opens) once it is exposed, and waits until Qt has made it the active window.
void activate(QWidget* w) {
  QWidget* window = w->window();
  QVERIFY2(QTest::qWaitForWindowExposed(window), qPrintable(window->windowTitle()));
  if (window->isActiveWindow()) return;
  xdotool({"windowfocus", "--sync", QString::number(window->winId())});
  QVERIFY2(QTest::qWaitFor([&] { return window->isActiveWindow(); }, 5000),
           qPrintable(window->windowTitle() + " did not become the active window"));
}

// Sends `args` to xdotool and waits until Qt has received `releases` more releases, then for
// `effect` (when given).
void send_input(const QStringList& args, int releases, const Effect& effect, const QString& what) {
  const int before = input_counter()->releases;
  STEP(xdotool(args));
  const auto arrived = [&] { return input_counter()->releases >= before + releases; };
  // An input whose handler runs an event loop of its own (a modal dialog) returns to this wait
  // only once that loop ends; past the wait's 5 s (a loaded machine) qWaitFor then checks once
  // without reading a release still queued: a second wait reads it.
  if (!QTest::qWaitFor(arrived, 5000)) (void)QTest::qWaitFor(arrived, 5000);
  QVERIFY2(arrived(), qPrintable(what + ": the input did not reach the window"));
  if (effect) QVERIFY2(QTest::qWaitFor(effect, kEffectMs), qPrintable(what + ": no effect"));
}

// The active window (the one typed into), after waiting for one.
QWidget* active_window() {
  (void)QTest::qWaitFor([] { return QApplication::activeWindow() != nullptr; }, 5000);
  return QApplication::activeWindow();
}

// Clicks `w` at `at` (its centre by default) with the mouse, holding `modifier` ("ctrl") when
// given: the pointer moves to that point on screen and presses the left button there.
void click(QWidget* w, const Effect& effect = {}, const QString& modifier = {},
           std::optional<QPoint> at = {}) {
  QVERIFY2(w, "no widget to click");
  const auto* as_button = qobject_cast<QAbstractButton*>(w);
  const QString what = "click on " + (as_button ? readable(as_button->text())
                                                : QString(w->metaObject()->className()));
  QVERIFY2(QTest::qWaitFor([&] { return shown(w); }, kEffectMs),
           qPrintable(what + ": it stays hidden or disabled"));
  // A person scrolls to what they click: a page taller than the window shows the widget first.
  for (QWidget* p = w->parentWidget(); p; p = p->parentWidget())
    if (auto* scroll = qobject_cast<QScrollArea*>(p)) {
      scroll->ensureWidgetVisible(w);
      QCoreApplication::processEvents();
      break;
    }
  STEP(activate(w));
  const QPoint global = w->mapToGlobal(at.value_or(w->rect().center()));
  QStringList args = {"mousemove", QString::number(global.x()), QString::number(global.y())};
  if (!modifier.isEmpty()) args << "keydown" << modifier;
  args << "click"
       << "1";
  if (!modifier.isEmpty()) args << "keyup" << modifier;
  send_input(args, modifier.isEmpty() ? 1 : 2, effect, what);
}

// Types `text` into the active window's focused widget; by default waits until a focused line
// edit or spin box shows it.
void type_text(const QString& text, const Effect& effect = {}) {
  QWidget* window = active_window();
  QVERIFY2(window, "no active window to type into");
  STEP(activate(window));
  Effect shows_text = effect;
  if (!shows_text) {
    shows_text = [text] {
      QWidget* focus = QApplication::focusWidget();
      if (auto* edit = qobject_cast<QLineEdit*>(focus)) return edit->text().contains(text);
      if (auto* spin = qobject_cast<QAbstractSpinBox*>(focus)) return spin->text().contains(text);
      return true;
    };
  }
  send_input({"type", "--delay", "15", text}, int(text.size()), shows_text, "typing " + text);
}

// Presses the key combination `combo` (xdotool's names: "ctrl+n", "Return", "Escape", "Tab",
// "alt+l") in the active window; waits for `releases` key releases to reach it.
void key(const QString& combo, const Effect& effect = {}, int releases = 1) {
  QWidget* window = active_window();
  QVERIFY2(window, "no active window for the key");
  STEP(activate(window));
  send_input({"key", "--clearmodifiers", combo}, releases, effect, combo);
}

// The one visible button under `root` whose text (or accessible name, or object name) reads
// `text`; waits for it to appear.
QAbstractButton* button(QWidget* root, const QString& text) {
  const auto matches = [&] {
    QList<QAbstractButton*> found;
    for (QAbstractButton* b : root->findChildren<QAbstractButton*>())
      if (b->isVisible() &&
          (readable(b->text()) == text || b->accessibleName() == text || b->objectName() == text))
        found << b;
    return found;
  };
  (void)QTest::qWaitFor([&] { return matches().size() == 1; }, kEffectMs);
  const QList<QAbstractButton*> found = matches();
  if (found.size() != 1)
    qWarning("%lld visible buttons read \"%s\"", qlonglong(found.size()), qPrintable(text));
  return found.size() == 1 ? found.first() : nullptr;
}

// The field a visible label reading `label` names (its buddy), or the widget with that
// accessible name.
QWidget* field(QWidget* root, const QString& label) {
  const auto matches = [&] {
    QList<QWidget*> found;
    // A buddy that takes the focus from Tab: an input, not a form's read-only value.
    for (QLabel* l : root->findChildren<QLabel*>())
      if (l->isVisible() && l->buddy() && (l->buddy()->focusPolicy() & Qt::TabFocus) &&
          readable(l->text()) == label)
        found << l->buddy();
    for (QWidget* w : root->findChildren<QWidget*>())
      if (w->isVisible() && w->accessibleName() == label && !found.contains(w)) found << w;
    return found;
  };
  (void)QTest::qWaitFor([&] { return matches().size() == 1; }, kEffectMs);
  const QList<QWidget*> found = matches();
  if (found.size() != 1)
    qWarning("%lld visible fields are labelled \"%s\"", qlonglong(found.size()), qPrintable(label));
  return found.size() == 1 ? found.first() : nullptr;
}

// Clicks the field, selects what it holds and types `text` over it.
void type_into(QWidget* edit, const QString& text) {
  QVERIFY2(edit, qPrintable("no field for " + text));
  STEP(click(edit, [edit] { return edit->hasFocus(); }));
  STEP(key("ctrl+a"));
  STEP(type_text(text));
}

// The first widget of `window`'s tab chain: where the keyboard focus belongs when it opens.
QWidget* first_in_tab_order(QWidget* window) {
  for (QWidget* w = window->nextInFocusChain(); w && w != window; w = w->nextInFocusChain())
    if (w->window() == window && (w->focusPolicy() & Qt::TabFocus) && w->isVisible() &&
        w->isEnabled())
      return w;
  return nullptr;
}

// What a modal message box showed when it was answered.
struct AnsweredBox {
  QString text;                  // empty until it was shown
  bool default_focused = false;  // the keyboard focus was on its default button
};

// Answers the next modal QMessageBox with the key `combo` through X once it is exposed. A modal
// box runs its own event loop (the test's code waits under it), so a timer in that loop gives
// the box the X focus and presses the key, without waiting for xdotool.
QTimer* answer_next_message_box(const QString& combo, AnsweredBox* answered) {
  auto* timer = new QTimer;
  timer->setInterval(20);
  QObject::connect(timer, &QTimer::timeout, timer, [timer, combo, answered] {
    auto* box = qobject_cast<QMessageBox*>(QApplication::activeModalWidget());
    if (!box || !box->windowHandle() || !box->windowHandle()->isExposed()) return;
    timer->stop();
    timer->deleteLater();
    answered->text = box->text();
    answered->default_focused = box->defaultButton() && box->focusWidget() == box->defaultButton();
    QProcess::startDetached("xdotool", {"windowfocus", "--sync", QString::number(box->winId()),
                                        "key", "--clearmodifiers", combo});
  });
  timer->start();
  return timer;
}

// Whether `condition` held when `watched` was hidden (read then, while it still exists: a
// dialog closed with WA_DeleteOnClose is gone just after).
class HideProbe : public QObject {
 public:
  HideProbe(QObject* watched, std::function<bool()> condition) : condition_(std::move(condition)) {
    watched->installEventFilter(this);
  }
  bool seen = false;
  bool held = false;

 protected:
  bool eventFilter(QObject*, QEvent* event) override {
    if (event->type() == QEvent::Hide && !seen) {
      seen = true;
      held = condition_();
    }
    return false;
  }

 private:
  std::function<bool()> condition_;
};

// The visible top-level window of type T (a dialog), or null.
template <class T>
T* visible_window() {
  for (QWidget* w : QApplication::topLevelWidgets())
    if (auto* t = qobject_cast<T*>(w); t && t->isVisible()) return t;
  return nullptr;
}

}  // namespace

class JourneyTest : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;
  QString cli_;
  std::unique_ptr<RunsStore> store_;

  QString path(const QString& name) const { return QDir(tmp_.path()).filePath(name); }

  void click_sidebar(MainWindow& window, const QString& label, const Effect& effect) {
    QListWidget* sidebar = window.sidebar();
    const auto items = sidebar->findItems(label, Qt::MatchExactly);
    QVERIFY2(items.size() == 1, qPrintable("no sidebar entry " + label));
    STEP(click(sidebar->viewport(), effect, {}, sidebar->visualItemRect(items.first()).center()));
  }

  // Next until the wizard shows `step`; each Next waits until it is enabled (a page that is not
  // ready yet says why and keeps it disabled).
  void next_until(FineTuneWizard* wizard, int step) {
    for (int guard = 0; wizard->current_page() != step && guard < 5; ++guard) {
      const int from = wizard->current_page();
      STEP(click(button(wizard, "Next >"), [&] { return wizard->current_page() != from; }));
    }
    QCOMPARE(wizard->current_page(), step);
  }

  // Names the run on the Review page, launches it with the keyboard (Alt+L, the Launch button's
  // mnemonic) and waits until the Runs page follows it; returns its id.
  QString launch(MainWindow& window, const QString& name) {
    FineTuneWizard* wizard = window.wizard();
    type_into(field(wizard->review_page(), "Run name:"), name);
    if (QTest::currentTestFailed()) return {};
    QAbstractButton* launch_button = button(wizard, "Launch");
    if (!launch_button) return {};
    if (!QTest::qWaitFor([&] { return launch_button->isEnabled(); }, kEffectMs)) {
      qWarning("Launch stays disabled: %s", qPrintable(wizard->missing().join("; ")));
      return {};
    }
    const QString run_id = wizard->run_id();
    activate(&window);
    key("alt+l", [&] {
      return window.current_page() == MainWindow::Runs && window.live_run() &&
             window.live_run()->run().id == run_id && window.live_run()->run().name == name;
    });
    return QTest::currentTestFailed() ? QString() : run_id;
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    QCoreApplication::setOrganizationName("TesseraTest");
    QCoreApplication::setApplicationName("tessera-journey");
    isolate_settings(tmp_.path());
    QVERIFY2(
        qEnvironmentVariable("QT_QPA_PLATFORM") == "xcb" && qEnvironmentVariableIsSet("DISPLAY"),
        "run under tests/ui/run_under_xvfb.sh (ctest does): it needs an X server");
    cli_ = training_cli();
    if (cli_.isEmpty()) QSKIP("this build's tessera-cli has no `run` (built without LibTorch)");
    settings::set_cli_program(cli_);
    const QString demo_error = make_demo(cli_, path("demo"));
    QVERIFY2(demo_error.isEmpty(), qPrintable(demo_error));
    store_ = std::make_unique<RunsStore>(settings::database_path());
  }

  // No run the studio started outlives the test (a failed step may leave one training).
  void cleanupTestCase() {
    if (!store_) return;
    store_->flush();
    DbConnection c(store_->path());
    for (const RunRecord& r : list_runs(c.db()))
      if (r.pid > 0 && run_process_alive(r.pid, r.output_dir)) ::kill(pid_t(r.pid), SIGKILL);
    store_.reset();
  }

  void wizard_run_stop_resume_export_chat_compare() {
    constexpr int kSteps = 300;
    QElapsedTimer clock;
    clock.start();
    const auto stage = [&](const char* name) {
      qInfo("%6.1f s  %s", double(clock.elapsed()) / 1000, name);
    };
    MainWindow window(store_.get());
    window.resize(1280, 860);
    window.move(0, 0);
    window.show_page(MainWindow::Runs);
    window.show();
    STEP(activate(&window));
    QVERIFY(QTest::qWaitFor([&] { return window.cli_probe()->finished(); }, 20000));
    screenshot(&window, "journey-0-start");

    // F1 opens the user guide; Esc closes it.
    QCOMPARE(window.user_guide_action()->shortcut(), QKeySequence(Qt::Key_F1));
    STEP(key("F1", [&] { return window.user_guide() && window.user_guide()->isVisible(); }));
    QPointer<UserGuideWindow> guide = window.user_guide();
    STEP(activate(guide));
    screenshot(guide, "journey-0-user-guide");
    STEP(key("Escape", [&] { return !guide || !guide->isVisible(); }));

    // The wizard: Ctrl+N (File > New fine-tune), then model, dataset, method, review.
    const auto on_wizard = [&] { return window.current_page() == MainWindow::NewFineTune; };
    QCOMPARE(window.new_fine_tune_action()->shortcut(), QKeySequence("Ctrl+N"));
    STEP(activate(&window));  // a window manager's part once the guide has closed
    STEP(key("ctrl+n", on_wizard));
    FineTuneWizard* wizard = window.wizard();
    QCOMPARE(wizard->current_page(), int(FineTuneWizard::ModelStep));
    // The focus was in the sidebar: Ctrl+N puts it in the model step's first field, so the
    // folder is typed at once, without a click.
    QWidget* model_folder = field(wizard->model_page(), "Folder:");
    QVERIFY(model_folder);
    QVERIFY2(QTest::qWaitFor([&] { return model_folder->hasFocus(); }, 2000),
             qPrintable(QString("after Ctrl+N the focus is on %1 \"%2\", not the model folder")
                            .arg(QApplication::focusWidget()
                                     ? QApplication::focusWidget()->metaObject()->className()
                                     : "nothing",
                                 QApplication::focusWidget()
                                     ? QApplication::focusWidget()->accessibleName()
                                     : QString())));
    // No model yet: Next is off, and says why beside it.
    QVERIFY(!wizard->next_button()->isEnabled());
    QVERIFY(wizard->reason_label()->isVisible() && !wizard->reason_label()->text().isEmpty());
    STEP(type_text(path("demo/base")));
    STEP(key("Return", [&] { return wizard->model_page()->ready(); }));
    QVERIFY2(wizard->model_page()->verdict_label()->text().contains("can fine-tune"),
             qPrintable(wizard->model_page()->verdict_label()->text()));
    screenshot(&window, "journey-1-model");
    stage("model chosen");
    STEP(next_until(wizard, FineTuneWizard::DatasetStep));

    STEP(type_into(field(wizard->dataset_page(), "File:"), path("demo/train.jsonl")));
    DatasetPage* dataset = wizard->dataset_page();
    STEP(key("Return", [&] {
      return dataset->analysis().file == path("demo/train.jsonl") && !dataset->busy();
    }));
    QVERIFY2(dataset->ready(), qPrintable(dataset->problem()));
    screenshot(&window, "journey-2-dataset");
    stage("dataset chosen");
    STEP(next_until(wizard, FineTuneWizard::MethodStep));

    MethodPage* method = wizard->method_page();
    STEP(click(button(method, "LoRA"), [&] { return method->method() == "lora"; }));
    // Quick counts the run in steps; the advanced settings hold the step count.
    STEP(click(button(method, "Quick"), [&] { return method->preset() == "quick"; }));
    QAbstractButton* advanced = button(method, "Advanced settings");
    QVERIFY(advanced);
    if (!advanced->isChecked()) STEP(click(advanced, [&] { return advanced->isChecked(); }));
    STEP(type_into(field(method, "Steps:"), QString::number(kSteps)));
    STEP(key("Tab", [&] { return method->training_spec().steps == kSteps; }));
    screenshot(&window, "journey-3-method");
    STEP(next_until(wizard, FineTuneWizard::ReviewStep));
    screenshot(&window, "journey-4-review");
    stage("review");

    // Launch; the dashboard follows the run.
    const QString first_run = launch(window, "journey: long run");
    QVERIFY(!first_run.isEmpty());
    RunDashboard* dashboard = window.runs_page()->dashboard();
    QProgressBar* bar = dashboard->progress_bar();

    // Ctrl+Q while it runs asks what to do with the run, the focus on the default answer; Esc
    // cancels: the window stays and the run goes on.
    QVERIFY(QTest::qWaitFor([&] { return dashboard->stop_button()->isEnabled(); }, kEffectMs));
    AnsweredBox quit_question;
    answer_next_message_box("Escape", &quit_question);
    // (The question, shown on the key's press, is what shows the key arrived: no release is
    // waited for. The press's own release reaches no window, the main one being blocked by the
    // question then, and the answer's goes to wherever X puts the focus once the question has
    // closed: with the answer delayed 6 s on purpose (session 58), once the main window, once
    // none of ours.)
    STEP(key(
        "ctrl+q",
        [&] { return !quit_question.text.isEmpty() && !QApplication::activeModalWidget(); },
        /*releases=*/0));
    QVERIFY2(quit_question.text.contains("run is in progress"), qPrintable(quit_question.text));
    QVERIFY(quit_question.default_focused);
    QVERIFY(window.isVisible());
    QVERIFY(window.live_run()->running());
    // The bar reads "tokenize: …" first, then "train: DONE / TOTAL".
    const QRegularExpression training(QString("^train: (\\d+) / %1$").arg(kSteps));
    const auto steps_trained = [&] {
      const auto m = training.match(bar->format());
      return m.hasMatch() ? m.captured(1).toInt() : 0;
    };
    QVERIFY2(QTest::qWaitFor(
                 [&] {
                   return steps_trained() >= 20 || dashboard->error_label()->isVisible() ||
                          bar->format() == "completed";
                 },
                 120000),
             qPrintable(bar->format() + " " + dashboard->error_label()->text()));
    QVERIFY2(dashboard->stop_button()->isEnabled() && steps_trained() < kSteps,
             qPrintable("the run ended before it could be stopped: " + bar->format() + " " +
                        dashboard->error_label()->text()));
    QVERIFY(dashboard->loss_chart()->point_count("training loss") > 0);
    screenshot(&window, "journey-5-running");
    stage("running");

    // Stop; a confirmation, should Stop ask one, is answered with Enter (its default button).
    AnsweredBox stop_confirmation;
    QPointer<QTimer> confirm = answer_next_message_box("Return", &stop_confirmation);
    STEP(click(button(dashboard, "Stop"), [&] {
      return window.live_run()->stop_requested() || bar->format().startsWith("stopped at ");
    }));
    QVERIFY2(QTest::qWaitFor([&] { return bar->format().startsWith("stopped at "); }, 60000),
             qPrintable(bar->format()));
    delete confirm;  // none was asked

    const QRegularExpression stopped_at(QString("^stopped at (\\d+) / %1$").arg(kSteps));
    const auto stop = stopped_at.match(bar->format());
    QVERIFY2(stop.hasMatch(), qPrintable(bar->format()));
    const int stopped_step = stop.captured(1).toInt();
    QVERIFY(stopped_step > 0 && stopped_step < kSteps);
    // The runs list says what the dashboard says.
    RunsTableModel* runs_model = window.runs_page()->runs_model();
    const auto listed = [&](const QString& id, RunsTableModel::Column column) {
      const int row = runs_model->row_of(id);
      return row < 0 ? QString() : runs_model->index_of(row, column).data().toString();
    };
    QVERIFY2(QTest::qWaitFor(
                 [&] { return listed(first_run, RunsTableModel::Column::Status) == "stopped"; },
                 kEffectMs),
             qPrintable(listed(first_run, RunsTableModel::Column::Status)));
    screenshot(&window, "journey-6-stopped");
    stage("stopped");

    // Resume with Alt+R, the button's mnemonic (the Run menu is Alt+U, Refresh Alt+E). The run
    // goes on from its checkpoint to the end.
    QAbstractButton* resume = button(dashboard, "Resume");
    QVERIFY(resume && QTest::qWaitFor([&] { return resume->isEnabled(); }, kEffectMs));
    // Pressing Resume turns it off at once; the bar changes once the run's events are read.
    const auto resumed = [&] {
      return !resume->isEnabled() || !bar->format().startsWith("stopped at ");
    };
    STEP(activate(&window));
    STEP(key("alt+r", resumed));
    QVERIFY2(QTest::qWaitFor([&] { return !bar->format().startsWith("stopped at "); }, kEffectMs),
             qPrintable(bar->format()));
    QCOMPARE(wait_for_run_end(dashboard), QString("completed"));
    store_->flush();
    {
      DbConnection c(store_->path());
      const auto record = find_run(c.db(), first_run);
      QVERIFY(record);
      QCOMPARE(record->steps_done, kSteps);
      QCOMPARE(record->status, QString("completed"));
    }
    QVERIFY2(QTest::qWaitFor(
                 [&] { return listed(first_run, RunsTableModel::Column::Status) == "completed"; },
                 kEffectMs),
             qPrintable(listed(first_run, RunsTableModel::Column::Status)));
    screenshot(&window, "journey-7-completed");
    stage("completed");

    // Export: the dialog opens with the focus on its first field; Alt+F (the Folder label's
    // mnemonic) reaches the destination. Esc closes it without exporting what was typed; the
    // second time Enter (the default button) exports.
    const QString exported = path("exported-model");
    QPointer<ExportDialog> dialog;
    QWidget* destination = nullptr;
    const auto open_export_dialog = [&] {
      STEP(activate(&window));
      STEP(click(button(dashboard, "Export"),
                 [] { return visible_window<ExportDialog>() != nullptr; }));
      dialog = visible_window<ExportDialog>();
      STEP(activate(dialog));
      destination = field(dialog, "Folder:");
      QVERIFY(destination);
      STEP(key("alt+f", [&] { return destination->hasFocus(); }));
      STEP(key("ctrl+a"));
      STEP(type_text(exported));
    };
    STEP(click(button(dashboard, "Export"),
               [] { return visible_window<ExportDialog>() != nullptr; }));
    dialog = visible_window<ExportDialog>();
    STEP(activate(dialog));
    QWidget* first_field = first_in_tab_order(dialog);
    QVERIFY(first_field);
    QVERIFY2(
        QTest::qWaitFor([&] { return dialog->focusWidget() == first_field; }, 2000),
        qPrintable(QString("the export dialog opens with the focus on %1, not its first field %2")
                       .arg(dialog->focusWidget() ? dialog->focusWidget()->metaObject()->className()
                                                  : "nothing",
                            first_field->metaObject()->className())));
    STEP(key("Escape", [&] { return !dialog || !dialog->isVisible(); }));

    STEP(open_export_dialog());
    HideProbe closed_idle(dialog, [d = dialog.data()] { return !d->busy(); });
    STEP(key("Escape", [&] { return !dialog || !dialog->isVisible(); }));
    QVERIFY2(closed_idle.seen && closed_idle.held, "Esc started the export it closed");
    QVERIFY(!QFileInfo::exists(exported));

    STEP(open_export_dialog());
    QVERIFY(QTest::qWaitFor([&] { return dialog->measured(); }, kEffectMs));
    QAbstractButton* export_button = button(dialog, "Export");
    // Export is offered once the typed folder was checked by writing there (off the GUI thread).
    QVERIFY(export_button &&
            QTest::qWaitFor([&] { return export_button->isEnabled(); }, kEffectMs));
    STEP(key("Return", [&] { return dialog->busy() || dialog->succeeded(); }));
    QVERIFY2(QTest::qWaitFor([&] { return !dialog->busy(); }, 120000), "the export did not end");
    QVERIFY2(dialog->succeeded(), qPrintable(dialog->message()));
    QVERIFY(QFileInfo::exists(exported + "/config.json"));
    QVERIFY(!QDir(exported).entryList({"*.safetensors"}, QDir::Files).isEmpty());
    QAbstractButton* open_folder = button(dialog, "Open folder");  // offered once it is written
    QVERIFY(open_folder && open_folder->isEnabled());
    screenshot(dialog, "journey-8-export");
    STEP(key("Escape", [&] { return !dialog || !dialog->isVisible(); }));
    stage("exported");

    // Try it: Alt+B asks the base model too; a prompt typed in the message field and Enter;
    // both replies appear side by side.
    STEP(activate(&window));
    ChatPane* chat = window.runs_page()->chat_pane();
    STEP(click(button(dashboard, "Try it"), [&] { return chat->isVisible(); }));
    QWidget* message = field(chat, "Message");
    QVERIFY(message);
    QTRY_VERIFY_WITH_TIMEOUT(message->hasFocus(), 5000);
    STEP(key("alt+b", [&] { return chat->compare()->isChecked(); }));
    STEP(click(message, [&] { return message->hasFocus(); }));
    STEP(type_text("first kiwo"));
    STEP(key("Return", [&] { return chat->busy(); }));
    QVERIFY(QTest::qWaitFor([&] { return !chat->busy(); }, 120000));
    QVERIFY2(chat->last_error().isEmpty(), qPrintable(chat->last_error()));
    QVERIFY2(chat->last_base_error().isEmpty(), qPrintable(chat->last_base_error()));
    // A few hundred LoRA steps teach the demo model mostly where answers end: a reply may be
    // only the end-of-turn token, which the pane then explains.
    QVERIFY2(!chat->last_reply().isEmpty() || !chat->last_note().isEmpty(),
             qPrintable(chat->transcript()->toPlainText()));
    QVERIFY2(!chat->last_base_reply().isEmpty() || !chat->last_base_note().isEmpty(),
             qPrintable(chat->base_transcript()->toPlainText()));
    QVERIFY(chat->transcript()->toPlainText().contains("first kiwo"));
    QVERIFY(chat->base_transcript()->isVisible());
    QVERIFY(chat->base_transcript()->toPlainText().contains("first kiwo"));
    QVERIFY(qobject_cast<QLineEdit*>(message)->text().isEmpty());  // ready for the next prompt
    screenshot(&window, "journey-9-try-it");
    stage("chatted");

    // A second, shorter run to compare with: the wizard keeps the choices.
    constexpr int kSecondSteps = 30;
    STEP(click_sidebar(window, "New fine-tune", on_wizard));
    QListWidget* wizard_steps = qobject_cast<QListWidget*>(field(wizard, "Wizard steps"));
    QVERIFY(wizard_steps);
    const auto method_item = wizard_steps->findItems("3. Method", Qt::MatchExactly);
    QVERIFY(method_item.size() == 1);
    STEP(click(
        wizard_steps->viewport(),
        [&] { return wizard->current_page() == FineTuneWizard::MethodStep; }, {},
        wizard_steps->visualItemRect(method_item.first()).center()));
    STEP(type_into(field(method, "Steps:"), QString::number(kSecondSteps)));
    STEP(key("Tab", [&] { return method->training_spec().steps == kSecondSteps; }));
    STEP(next_until(wizard, FineTuneWizard::ReviewStep));
    const QString second_run = launch(window, "journey: short run");
    QVERIFY(!second_run.isEmpty());
    QCOMPARE(wait_for_run_end(dashboard), QString("completed"));
    stage("second run completed");

    // Compare: click one run, Ctrl+click the other, then Compare.
    RunsPage* runs = window.runs_page();
    QTableView* table = runs->table();
    QVERIFY(QTest::qWaitFor(
        [&] {
          return runs->runs_model()->row_of(first_run) >= 0 &&
                 runs->runs_model()->row_of(second_run) >= 0;
        },
        kEffectMs));
    const auto row_centre = [&](const QString& id) {
      return table->visualRect(runs->runs_model()->index(runs->runs_model()->row_of(id), 0))
          .center();
    };
    const auto selected = [&] { return table->selectionModel()->selectedRows().size(); };
    STEP(click(
        table->viewport(), [&] { return selected() == 1; }, {}, row_centre(first_run)));
    STEP(click(
        table->viewport(), [&] { return selected() == 2; }, "ctrl", row_centre(second_run)));
    STEP(
        click(button(runs, "Compare"), [&] { return runs->compare_chart()->series_count() == 2; }));
    QVERIFY(runs->compare_chart()->isVisible());
    QVERIFY2(runs->compare_summary().contains("steps"), qPrintable(runs->compare_summary()));
    QStringList compared;  // the final figures' columns, one a run, under the names typed
    for (int c = 0; c < runs->compare_metrics()->columnCount(); ++c)
      compared << runs->compare_metrics()->horizontalHeaderItem(c)->text();
    QVERIFY2(compared.filter("journey: long run").size() == 1 &&
                 compared.filter("journey: short run").size() == 1,
             qPrintable(compared.join(" | ")));
    screenshot(&window, "journey-10-compare");
    stage("compared");

    // Ctrl+Q quits (no run is in progress: no question).
    QCOMPARE(window.quit_action()->shortcut(), QKeySequence("Ctrl+Q"));
    STEP(activate(&window));
    STEP(key("ctrl+q", [&] { return !window.isVisible(); }));
  }
};

QTEST_MAIN(JourneyTest)
#include "test_journey.moc"
