// The studio as a desktop application: the menu bar and its shortcuts, the Run menu following
// the dashboard, Open run, the user guide, About against `tessera-cli version --json`, the theme,
// the export dialog's Open folder and unwritable folders, the first start's demo offer and empty
// Runs page, and screenshots of every page at 1280×720 in light and dark (a second ctest entry
// runs this binary with QT_SCALE_FACTOR=2).
#include <signal.h>
#include <unistd.h>

#include <QApplication>
#include <QChartView>
#include <QComboBox>
#include <QDesktopServices>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QPlainTextEdit>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QScrollArea>
#include <QScrollBar>
#include <QSettings>
#include <QSignalSpy>
#include <QStorageInfo>
#include <QTableView>
#include <QTemporaryDir>
#include <QTest>
#include <QTextBrowser>
#include <QUrl>
#include <cmath>
#include <memory>

#include "job/job_spec.h"
#include "tests/ui/held_opens.h"
#include "tests/ui/studio_fixture.h"
#include "ui/dialogs/about_dialog.h"
#include "ui/dialogs/export_dialog.h"
#include "ui/dialogs/user_guide_window.h"
#include "ui/main_window.h"
#include "ui/models/runs_db.h"
#include "ui/pages/run_dashboard.h"
#include "ui/pages/runs_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/run_monitor.h"
#include "ui/utility/studio_settings.h"
#include "ui/utility/theme.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/demo_offer.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;

// Receives the URLs the studio asks QDesktopServices to open (instead of a file manager).
class UrlCatcher : public QObject {
  Q_OBJECT
 public:
  QList<QUrl> opened;
 public Q_SLOTS:
  void open(const QUrl& url) { opened << url; }
};

class DesktopTest : public QObject {
  Q_OBJECT

  QTemporaryDir tmp_;
  std::unique_ptr<RunsStore> store_;

  QString path(const QString& rel) const { return QDir(tmp_.path()).filePath(rel); }

  // A main window at 1280×720, shown, active, its run list loaded.
  std::unique_ptr<MainWindow> open_window() {
    auto window = std::make_unique<MainWindow>(store_.get());
    // Listening from the start: the list loads in the background while the window is shown, and a
    // spy made after that would wait out its whole timeout for a signal already sent.
    QSignalSpy refreshed(window->runs_page(), &RunsPage::refreshed);
    window->resize(1280, 720);
    window->show();
    window->activateWindow();
    (void)QTest::qWaitForWindowActive(window.get());
    if (refreshed.isEmpty()) (void)refreshed.wait(10000);
    return window;
  }

  // A finished run in the database with a few hundred steps of metrics and memory samples (so
  // every chart has something to draw), and its job.json in its folder.
  void record_run(const QString& id) {
    RunRecord run;
    run.id = id;
    run.name = "demo · full · screenshot";
    run.model = "demo/base";
    run.dataset = "train.jsonl";
    run.method = "full";
    run.status = "completed";
    run.output_dir = path("runs/" + id);
    run.started_at = 1.7e9;
    run.ended_at = 1.7e9 + 600;
    run.spec_json = R"({"model":{"path":"demo/base"},"training":{"steps":300}})";
    QVERIFY(QDir().mkpath(run.output_dir));
    write_file(run.output_dir + "/job.json", run.spec_json.toUtf8());
    RunBatch batch;
    batch.run_id = id;
    batch.upsert = run;
    for (int step = 1; step <= 300; ++step) {
      MetricPoint p;
      p.step = step;
      p.t = run.started_at + step * 2;
      p.loss = 3.0 * std::exp(-step / 80.0) + 0.2 + 0.05 * std::sin(step);
      p.lr = 2e-3 * std::min(1.0, step / 30.0);
      p.grad_norm = 1.0 + 0.3 * std::cos(step);
      p.tokens_per_s = 12000 + 900 * std::sin(step / 3.0);
      if (step % 50 == 0) p.eval_loss = p.loss + 0.1;
      batch.metrics << p;
      MemorySample m;
      m.t = p.t;
      m.tier = "host";
      m.device = "cpu";
      m.used = 900e6;
      m.budget = 8e9;
      m.by_category[0] = 400e6;
      m.by_category[1] = 200e6;
      m.by_category[2] = 250e6;
      m.by_category[3] = 50e6;
      batch.memory << m;
    }
    batch.steps = std::make_pair(std::int64_t(300), std::int64_t(300));
    batch.status = "completed";
    batch.ended_at = run.ended_at;
    store_->submit(batch);
    store_->flush();
  }

  // A run whose model/ the export dialog can measure (its exports are never started).
  RunRecord measurable_run(const QString& id) {
    RunRecord run;
    run.id = id;
    run.method = "full";
    run.status = "completed";
    run.output_dir = path(id);
    [&] {
      QVERIFY(QDir().mkpath(run.output_dir + "/model"));
      write_file(run.output_dir + "/model/config.json", R"({"model_type":"llama"})");
      write_file(run.output_dir + "/model/model.safetensors", QByteArray(4096, '\0'));
    }();
    return run;
  }

  // `dialog` to `destination`, once its write check answered; what start() says then.
  QString start_at(ExportDialog& dialog, const QString& destination) {
    dialog.set_destination(destination);
    if (!QTest::qWaitFor([&] { return dialog.destination_checked(); }, 20000))
      return "the destination's check never answered";
    return dialog.start();
  }

  // A tmpfs mounted at `dir` with `options` (unmounted in cleanup()); "" or why it could not be.
  QString mount_tmpfs(const QString& dir, const QString& options) {
    if (::geteuid() != 0) return "mounting a file system needs root";
    QDir().mkpath(dir);
    QProcess mount;
    mount.start("mount", {"-t", "tmpfs", "-o", options, "tmpfs", dir});
    if (!mount.waitForFinished(20000) || mount.exitCode() != 0)
      return "mount failed: " + QString::fromUtf8(mount.readAllStandardError()).trimmed();
    mounts_ << dir;
    return {};
  }
  QStringList mounts_;

  // The demo model and dataset in the app's data folder, made once.
  QString demo_dir(const QString& cli) {
    const QString dir = settings::demo_dir();
    if (!QFileInfo::exists(dir + "/train.jsonl")) {
      const QString error = make_demo(cli, dir);
      if (!error.isEmpty()) return {};
    }
    return dir;
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    QCoreApplication::setOrganizationName("TesseraTest");
    QCoreApplication::setApplicationName("tessera-desktop-test");
    isolate_settings(tmp_.path());
    qputenv("XDG_DATA_HOME", path("data").toUtf8());  // the demo goes to the app's data folder
    QSettings().setValue("paths/cli", studio_cli());
    store_ = std::make_unique<RunsStore>(settings::database_path());
  }

  void cleanup() {
    // After each test: no run left training, and the platform's look back.
    if (store_) {
      store_->flush();
      DbConnection c(store_->path());
      for (const RunRecord& r : list_runs(c.db()))
        if (r.pid > 0 && run_process_alive(r.pid, r.output_dir)) ::kill(pid_t(r.pid), SIGKILL);
    }
    settings::set_theme("system");
    apply_theme("system");
    for (const QString& dir : mounts_) QProcess::execute("umount", {dir});
    mounts_.clear();
    QSettings().setValue("paths/cli", studio_cli());
  }

  void cleanupTestCase() {
    cleanup();
    store_.reset();
  }

  // Runs first, while the database is empty.
  void an_empty_runs_page_says_what_to_do_next() {
    auto window = open_window();
    window->show_page(MainWindow::Runs);
    RunsPage* runs = window->runs_page();
    QTRY_VERIFY(runs->empty_state()->isVisible());
    // No blank charts, no empty table: what to do next instead.
    for (QChartView* chart : runs->findChildren<QChartView*>()) QVERIFY(!chart->isVisible());
    QVERIFY(!runs->table()->isVisible());
    const QString text = runs->empty_text()->text();
    QVERIFY2(
        text.contains("No runs yet") && text.contains("New fine-tune") && text.contains("demo"),
        qPrintable(text));
    screenshot(window.get(), "desktop-runs-empty");
    QPushButton* start = nullptr;
    for (QPushButton* b : runs->empty_state()->findChildren<QPushButton*>())
      if (b->text().remove('&') == "New fine-tune") start = b;
    QVERIFY(start);
    QTest::mouseClick(start, Qt::LeftButton);
    QCOMPARE(window->current_page(), MainWindow::NewFineTune);
    // The first start's New fine-tune page offers the demo and says where models come from.
    QVERIFY(window->demo_offer()->isVisible());
    const QString offer = window->demo_offer()->findChild<QLabel*>()->text();
    QVERIFY2(
        offer.contains("folder") && offer.contains("HuggingFace cache") && offer.contains("Hub"),
        qPrintable(offer));
  }

  void the_demo_offer_fills_the_wizard() {
    auto window = open_window();
    DemoOffer* offer = window->demo_offer();
    // A tessera-cli that cannot start is said in words, not as an exit code.
    QSettings().setValue("paths/cli", path("no-such-tessera-cli"));
    QTest::mouseClick(offer->try_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!offer->busy(), 10000);
    QVERIFY2(offer->status_label()->text().startsWith("Could not start"),
             qPrintable(offer->status_label()->text()));
    QVERIFY(offer->try_button()->isEnabled());

    const QString cli = training_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `demo` (built without LibTorch)");
    QSettings().setValue("paths/cli", cli);
    QTest::mouseClick(offer->try_button(), Qt::LeftButton);
    QVERIFY(offer->busy());
    QVERIFY(offer->progress_bar()->isVisible());  // progress while the demo is made
    QTRY_VERIFY_WITH_TIMEOUT(!offer->busy(), 120000);
    QVERIFY2(offer->status_label()->text().startsWith("The demo model and dataset are in"),
             qPrintable(offer->status_label()->text()));
    const QString dir = settings::demo_dir();
    QVERIFY2(dir.startsWith(path("data")), qPrintable(dir));
    FineTuneWizard* wizard = window->wizard();
    QCOMPARE(window->current_page(), MainWindow::NewFineTune);
    QCOMPARE(wizard->current_page(), int(FineTuneWizard::ModelStep));
    // Both pass the wizard's checks: the engine can train the model, the dataset parses.
    QTRY_VERIFY_WITH_TIMEOUT(wizard->model_page()->ready(), 60000);
    QTRY_VERIFY2_WITH_TIMEOUT(wizard->dataset_page()->ready(),
                              qPrintable(wizard->dataset_page()->problem()), 60000);
    QCOMPARE(QFileInfo(wizard->model_page()->summary().folder).canonicalFilePath(),
             QFileInfo(dir + "/base").canonicalFilePath());
    QCOMPARE(QFileInfo(wizard->dataset_page()->analysis().file).canonicalFilePath(),
             QFileInfo(dir + "/train.jsonl").canonicalFilePath());
    const QStringList missing = wizard->missing();
    QVERIFY2(!missing.contains("Choose a model") && !missing.contains("Choose a dataset") &&
                 !missing.contains("Choose a model the engine can train") &&
                 !missing.contains("Fix the dataset's format or columns"),
             qPrintable(missing.join("; ")));
    screenshot(window.get(), "desktop-demo-offer");
  }

  void shortcuts_open_the_wizard_the_guide_and_quit() {
    auto window = open_window();
    QVERIFY(QTest::qWaitForWindowActive(window.get()));
    window->show_page(MainWindow::Settings);
    QTest::keyClick(window.get(), Qt::Key_N, Qt::ControlModifier);
    QCOMPARE(window->current_page(), MainWindow::NewFineTune);

    QVERIFY(!window->user_guide());
    QTest::keyClick(window.get(), Qt::Key_F1);
    QTRY_VERIFY(window->user_guide() && window->user_guide()->isVisible());
    // The guide shown is docs/user-guide.md as shipped in the resource, rendered.
    QFile source(TESSERA_USER_GUIDE);
    QVERIFY(source.open(QIODevice::ReadOnly));
    QCOMPARE(user_guide_markdown(), QString::fromUtf8(source.readAll()));
    const QString shown = window->user_guide()->browser()->toPlainText();
    for (const char* heading : {"Tessera Studio user guide", "New fine-tune (Ctrl+N)", "Runs",
                                "Models", "Datasets", "Settings", "Try it first: the demo"})
      QVERIFY2(shown.contains(heading), heading);
    QVERIFY(!shown.contains("## "));  // rendered, not the Markdown source
    screenshot(window->user_guide(), "desktop-user-guide");
    window->user_guide()->close();

    window->activateWindow();
    QVERIFY(QTest::qWaitForWindowActive(window.get()));
    QTest::keyClick(window.get(), Qt::Key_Q, Qt::ControlModifier);
    QTRY_VERIFY(!window->isVisible());
  }

  void about_shows_the_versions_tessera_cli_reports() {
    // Asked independently of the studio.
    QProcess cli;
    cli.start(studio_cli(), {"version", "--json"});
    QVERIFY(cli.waitForFinished(30000));
    QCOMPARE(cli.exitCode(), 0);
    const QByteArray json = cli.readAllStandardOutput();
    const QJsonObject versions = QJsonDocument::fromJson(json).object();
    QVERIFY2(versions.value("tessera").isString(), json.constData());
    QCOMPARE(versions.value("tessera").toString(), QString(TESSERA_PROJECT_VERSION));
    QVERIFY(versions.value("gpu_visible").isBool());

    auto window = open_window();
    window->about_action()->trigger();
    AboutDialog* about = window->about_dialog();
    QVERIFY(about && about->isVisible());
    QTRY_VERIFY_WITH_TIMEOUT(about->finished(), 30000);
    const QString text = about->text();
    QCOMPARE(text.split('\n').mid(0, 4), version_lines(json));
    QVERIFY2(text.contains(QString("Qt %1").arg(qVersion())), qPrintable(text));
    screenshot(about, "desktop-about");

    // LibTorch and CUDA as the venv's torch (the wheel the build links) states them.
    if (!versions.value("libtorch").isString()) {
      QVERIFY(text.contains("LibTorch: not built in"));
      return;
    }
    QProcess python;
    python.start(TESSERA_PYTHON,
                 {"-c", "import torch; print(torch.__version__); print(torch.version.cuda)"});
    QVERIFY(python.waitForFinished(60000));
    QCOMPARE(python.exitCode(), 0);
    const QStringList torch =
        QString::fromUtf8(python.readAllStandardOutput()).trimmed().split('\n');
    QCOMPARE(torch.size(), 2);
    const QString torch_version = torch[0].section('+', 0, 0);  // "2.15.0+cu132"
    QCOMPARE(versions.value("libtorch").toString(), torch_version);
    QVERIFY2(text.contains("LibTorch " + torch_version), qPrintable(text));
    // CUDA's runtime is known only where the CUDA module loaded (a machine with a driver);
    // elsewhere the dialog says why there is none, in the module's words.
    if (versions.value("cuda_module_loaded").toBool() && torch[1] != "None") {
      QCOMPARE(versions.value("cuda").toString(), torch[1]);
      QVERIFY2(text.contains("CUDA " + torch[1]), qPrintable(text));
    } else {
      QVERIFY(versions.value("cuda").isNull());
      QVERIFY2(text.contains("CUDA: none (" + versions.value("cuda_module").toString() + ")"),
               qPrintable(text));
    }
  }

  void the_theme_switches_at_once_and_persists() {
    record_run("theme-run");
    {
      auto window = open_window();
      window->show_page(MainWindow::Runs);
      QSignalSpy replayed(window->runs_page(), &RunsPage::replayed);
      window->runs_page()->open_run("theme-run");
      QVERIFY(replayed.wait(10000));
      LineChart* loss = window->runs_page()->dashboard()->loss_chart();
      window->show_page(MainWindow::Settings);
      QComboBox* theme = window->theme_combo();
      theme->setCurrentIndex(theme->findData("dark"));
      QCOMPARE(QSettings().value("appearance/theme").toString(), QString("dark"));
      // Applied at once: every widget has it when the event loop next runs.
      QTRY_VERIFY(window->palette().color(QPalette::Window).lightness() < 80);
      QCOMPARE(window->palette().color(QPalette::Window), dark_palette().color(QPalette::Window));
      QTRY_COMPARE(loss->chart()->backgroundBrush().color(), dark_palette().color(QPalette::Base));
      window->show_page(MainWindow::Runs);
      screenshot(window.get(), "desktop-theme-dark");
      theme->setCurrentIndex(theme->findData("light"));
      QTRY_VERIFY(window->palette().color(QPalette::Window).lightness() > 180);
      QTRY_VERIFY(loss->chart()->backgroundBrush().color().lightness() > 180);
      theme->setCurrentIndex(theme->findData("dark"));
    }
    // The next start applies the saved theme before anything is drawn.
    apply_theme("system");
    QVERIFY(QApplication::palette().color(QPalette::Window).lightness() > 180);
    auto window = open_window();
    QCOMPARE(window->theme_combo()->currentData().toString(), QString("dark"));
    QCOMPARE(QApplication::palette().color(QPalette::Window),
             dark_palette().color(QPalette::Window));
    QCOMPARE(window->runs_page()->dashboard()->loss_chart()->palette().color(QPalette::Base),
             dark_palette().color(QPalette::Base));
  }

  void open_run_shows_a_recorded_run_or_says_what_is_missing() {
    record_run("opened-run");
    auto window = open_window();
    QTRY_VERIFY(!window->runs_page()->loading());
    bool has_spec = true;
    // Not a run folder.
    QVERIFY(QDir().mkpath(path("plain-folder")));
    QString problem = window->open_run_folder(path("plain-folder"), &has_spec);
    QVERIFY2(problem.contains("has no job.json"), qPrintable(problem));
    QVERIFY(!has_spec);
    // A run folder the studio did not record (tessera-cli run elsewhere).
    QVERIFY(QDir().mkpath(path("cli-run")));
    write_file(path("cli-run/job.json"), "{}");
    problem = window->open_run_folder(path("cli-run"), &has_spec);
    QVERIFY2(problem.contains("not in the studio's runs database"), qPrintable(problem));
    QVERIFY(has_spec);
    // A recorded run: shown on the Runs page, its row selected.
    window->show_page(MainWindow::Settings);
    QSignalSpy replayed(window->runs_page(), &RunsPage::replayed);
    problem = window->open_run_folder(path("runs/opened-run/"), &has_spec);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QCOMPARE(window->current_page(), MainWindow::Runs);
    QVERIFY(replayed.wait(10000));
    QCOMPARE(window->runs_page()->dashboard()->run().id, QString("opened-run"));
  }

  // A job file given to the studio (its desktop entry opens *.tessera-job.json with it) fills
  // the New fine-tune wizard; a file that is not a job spec is refused naming the file.
  void a_job_file_opens_in_the_wizard() {
    const QString cli = training_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `demo` (built without LibTorch)");
    const QString demo = demo_dir(cli);
    QVERIFY(!demo.isEmpty());
    const QString file = path("shared.tessera-job.json");
    QVERIFY(QFile::copy(demo + "/job.json", file));
    auto window = open_window();
    window->show_page(MainWindow::Settings);
    QCOMPARE(window->open_job_file(file), QString());
    QCOMPARE(window->current_page(), MainWindow::NewFineTune);
    QTRY_VERIFY_WITH_TIMEOUT(window->wizard()->model_page()->ready(), 60000);
    QCOMPARE(window->wizard()->build_spec().model.path,
             tessera::job::load_job_spec(file.toStdString()).model.path);
    write_file(path("not-a-job.tessera-job.json"), "[1, 2]");
    const QString problem = window->open_job_file(path("not-a-job.tessera-job.json"));
    QVERIFY2(problem.contains("not-a-job.tessera-job.json"), qPrintable(problem));
  }

  void the_run_menu_follows_the_dashboard_and_stops_a_real_run() {
    const QString cli = training_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `run` (built without LibTorch)");
    const QString demo = demo_dir(cli);
    QVERIFY(!demo.isEmpty());
    QSettings().setValue("paths/cli", cli);
    auto window = open_window();
    RunDashboard* dashboard = window->runs_page()->dashboard();
    const auto matches_dashboard = [&] {
      return window->stop_action()->isEnabled() == dashboard->stop_button()->isEnabled() &&
             window->resume_action()->isEnabled() == dashboard->resume_button()->isEnabled() &&
             window->export_action()->isEnabled() == dashboard->export_button()->isEnabled();
    };
    QVERIFY(matches_dashboard());
    QVERIFY(!window->stop_action()->isEnabled());  // nothing runs

    FineTuneWizard* wizard = window->wizard();
    wizard->load_spec(tessera::job::load_job_spec((demo + "/job.json").toStdString()));
    QTRY_VERIFY_WITH_TIMEOUT(wizard->model_page()->ready(), 60000);
    QTRY_VERIFY2_WITH_TIMEOUT(wizard->dataset_page()->ready(),
                              qPrintable(wizard->dataset_page()->problem()), 60000);
    tessera::job::JobSpec spec = wizard->build_spec();
    spec.training.steps = 2000;
    spec.training.epochs.reset();
    QCOMPARE(window->launch(spec), QString());
    QTRY_VERIFY_WITH_TIMEOUT(window->stop_action()->isEnabled(), 30000);
    QVERIFY(matches_dashboard());
    QVERIFY(!window->resume_action()->isEnabled());
    // Some training first, so the stop has a step to checkpoint.
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->progress_bar()->value() >= 2, 120000);
    window->show_page(MainWindow::Settings);
    window->stop_action()->trigger();
    QCOMPARE(window->current_page(), MainWindow::Runs);  // where the stop shows
    QVERIFY(window->live_run()->stop_requested());
    QCOMPARE(window->stop_action()->text(), dashboard->stop_button()->text());  // "Stop now…"
    const QString end = wait_for_run_end(dashboard, 120000);
    QVERIFY2(end.startsWith("stopped at "), qPrintable(end));
    QTRY_VERIFY_WITH_TIMEOUT(dashboard->resume_button()->isEnabled(), 10000);
    QVERIFY(matches_dashboard());
    QVERIFY(window->resume_action()->isEnabled());
    QVERIFY(!window->stop_action()->isEnabled());
    QVERIFY(!window->export_action()->isEnabled());  // stopped: no model/ to export
  }

  void export_offers_open_folder_after_success() {
    const QString cli = training_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `export` (built without LibTorch)");
    const QString demo = demo_dir(cli);
    QVERIFY(!demo.isEmpty());
    RunRecord run;
    run.id = "export-run";
    run.method = "full";
    run.status = "completed";
    run.output_dir = path("export-run");
    QVERIFY(QDir().mkpath(run.output_dir + "/model"));
    for (const QString& f : QDir(demo + "/base").entryList(QDir::Files))
      QVERIFY(QFile::copy(demo + "/base/" + f, run.output_dir + "/model/" + f));
    ExportDialog dialog(run, cli);
    dialog.show();
    QTRY_VERIFY_WITH_TIMEOUT(dialog.measured(), 20000);
    dialog.set_kind(ExportDialog::FullModel);
    QVERIFY(!dialog.open_folder_button()->isVisible());
    QCOMPARE(start_at(dialog, path("exported")), QString());
    QTRY_VERIFY_WITH_TIMEOUT(!dialog.busy(), 120000);
    QVERIFY2(dialog.succeeded(), qPrintable(dialog.message()));
    QVERIFY(dialog.open_folder_button()->isVisible());
    UrlCatcher catcher;
    QDesktopServices::setUrlHandler("file", &catcher, "open");
    QTest::mouseClick(dialog.open_folder_button(), Qt::LeftButton);
    QDesktopServices::unsetUrlHandler("file");
    QCOMPARE(catcher.opened, QList<QUrl>{QUrl::fromLocalFile(path("exported"))});
    screenshot(&dialog, "desktop-export-done");

    // The folder now holds a model: the dialog says a second export replaces it, and that export
    // (tessera-cli export --force) swaps the new model in, leaving nothing else behind.
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(dialog.replaces(), "a model in " + path("exported"));
    QVERIFY2(dialog.estimate_label()->text().contains("; replaces a model in " + path("exported")),
             qPrintable(dialog.estimate_label()->text()));
    QVERIFY(dialog.export_button()->isEnabled());
    const QStringList before = QDir(path("exported")).entryList(QDir::Files);
    dialog.set_dtype("bfloat16");
    QCOMPARE(dialog.start(), QString());
    QTRY_VERIFY_WITH_TIMEOUT(!dialog.busy(), 120000);
    QVERIFY2(dialog.succeeded(), qPrintable(dialog.message() + dialog.log_view()->toPlainText()));
    QVERIFY(dialog.log_view()->toPlainText().contains("--dtype bfloat16 --force"));
    QCOMPARE(QDir(path("exported")).entryList(QDir::Files), before);
    QFile config(path("exported/config.json"));
    QVERIFY(config.open(QIODevice::ReadOnly));
    QCOMPARE(QJsonDocument::fromJson(config.readAll()).object().value("dtype").toString(),
             QString("bfloat16"));
    // Only the export itself is left in its parent (no staging or old folder).
    QCOMPARE(QDir(tmp_.path()).entryList({"*exported*"}, QDir::AllEntries | QDir::Hidden),
             QStringList{"exported"});
  }

  // A bf16 base model trained with float32 weights exports as bf16 by default (float32 doubled
  // the size of the model the user started from); a float32 base stays float32, and a choice
  // made before the sizes are read is kept.
  void export_defaults_to_the_base_models_precision() {
    for (const char* base_dtype : {"bfloat16", "float32"}) {
      const QString base = path(QString("base-%1").arg(base_dtype));
      QVERIFY(QDir().mkpath(base));
      write_file(base + "/config.json",
                 QString(R"({"model_type":"llama","torch_dtype":"%1"})").arg(base_dtype).toUtf8());
      RunRecord run = measurable_run(QString("precision-%1").arg(base_dtype));
      run.spec_json = QString(R"({"model":{"path":"%1"}})").arg(base);
      for (const bool choose_first : {false, true}) {
        ExportDialog dialog(run, studio_cli());
        if (choose_first) dialog.set_dtype("float32");
        QTRY_VERIFY_WITH_TIMEOUT(dialog.measured(), 20000);
        const QString expected = choose_first ? QString("float32") : QString::fromUtf8(base_dtype);
        QCOMPARE(dialog.dtype_combo()->currentData().toString(), expected);
        const QString label = dialog.dtype_combo()->currentText();
        if (!choose_first && expected == "bfloat16")
          QCOMPARE(label, QString("bfloat16 (as the base model, half the size)"));
        if (!choose_first && expected == "float32")
          QCOMPARE(label, QString("float32 (as trained, as the base model)"));
      }
    }
  }

  // Where an export can go: a new folder, an existing empty one, one holding an earlier export
  // (replaced, and said so); not a folder of other files (the export would take its place).
  // While the destination is checked, the dialog says "checking…" and Export waits.
  void export_accepts_empty_folders_and_says_what_it_replaces() {
    ExportDialog dialog(measurable_run("destinations-run"), studio_cli());
    dialog.show();
    QTRY_VERIFY_WITH_TIMEOUT(dialog.measured(), 20000);
    dialog.set_kind(ExportDialog::FullModel);

    // Typed, not yet checked: "checking…", Export off, and start() waits too.
    dialog.set_destination(path("new-export"));
    QVERIFY(!dialog.destination_checked());
    QVERIFY(!dialog.export_button()->isEnabled());
    QVERIFY2(dialog.estimate_label()->text().endsWith("; checking…"),
             qPrintable(dialog.estimate_label()->text()));
    QVERIFY(dialog.start().startsWith("Still checking whether " + path("new-export")));
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(dialog.destination_problem(), QString());
    QVERIFY(dialog.export_button()->isEnabled());
    QVERIFY(!QFileInfo::exists(path("new-export")));  // the check removed the folder it made
    // The free space said is the disk's, measured apart.
    QVERIFY2(dialog.estimate_label()->text().contains(
                 QString(" free on %1").arg(QStorageInfo(tmp_.path()).rootPath())),
             qPrintable(dialog.estimate_label()->text()));

    // An existing empty folder: accepted, nothing replaced, and left as it was.
    QVERIFY(QDir().mkpath(path("empty-folder")));
    dialog.set_destination(path("empty-folder"));
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(dialog.destination_problem(), QString());
    QCOMPARE(dialog.replaces(), QString());
    QVERIFY(dialog.export_button()->isEnabled());
    QVERIFY(QDir(path("empty-folder")).isEmpty());

    // A folder of other files: refused, since the export takes the folder's place.
    QVERIFY(QDir().mkpath(path("notes")) && QDir().mkpath(path("earlier")));
    write_file(path("notes/todo.txt"), "x");
    QString why = start_at(dialog, path("notes"));
    QVERIFY2(why.contains(path("notes") + " holds 1 file or folder and no earlier export"),
             qPrintable(why));
    QVERIFY(!dialog.export_button()->isEnabled());
    QVERIFY(dialog.status_label()->text().contains("choose a new or empty folder"));
    QCOMPARE(QDir(path("notes")).entryList(QDir::Files), QStringList{"todo.txt"});

    // An earlier export (config.json and weights): replaced, and the dialog says so.
    write_file(path("earlier/config.json"), "{}");
    write_file(path("earlier/model.safetensors"), "x");
    dialog.set_destination(path("earlier"));
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(dialog.destination_problem(), QString());
    QCOMPARE(dialog.replaces(), "a model in " + path("earlier"));
    QVERIFY(dialog.status_label()->text().isEmpty());  // the refusal above is gone

    // The run's own model folder is never a destination.
    why = start_at(dialog, path("destinations-run/model"));
    QVERIFY2(why.contains("is this run's own model folder"), qPrintable(why));

    // GGUF: a new file, a GGUF file from before (replaced), never another file or a folder.
    if (dialog.kinds().contains(ExportDialog::Gguf)) {
      dialog.set_kind(ExportDialog::Gguf);
      write_file(path("old.gguf"), QByteArray("GGUF\x03\0\0\0", 8));
      dialog.set_destination(path("old.gguf"));
      QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
      QCOMPARE(dialog.replaces(), "the GGUF file " + path("old.gguf"));
      why = start_at(dialog, path("notes/todo.txt"));
      QVERIFY2(why.contains("exists and is not a GGUF file"), qPrintable(why));
      why = start_at(dialog, path("empty-folder"));
      QVERIFY2(why.contains("is a folder; a GGUF export is one file"), qPrintable(why));
    }
  }

  // A destination whose disk does not answer (every open in the folder held, as on a dead
  // network mount) leaves the dialog working: the check runs on another thread, the event loop
  // keeps going, the dialog says it is still checking, and an answer for that destination that
  // comes after another was chosen is dropped.
  void a_hung_destination_does_not_freeze_the_dialog() {
    if (::geteuid() != 0) QSKIP("holding a folder's opens (fanotify) needs root");
    const QString hung = path("hung-disk");
    QVERIFY(QDir().mkpath(hung));
    HeldOpens held(hung);
    if (!held.error().isEmpty()) QSKIP(qPrintable(held.error()));
    ExportDialog dialog(measurable_run("hung-run"), studio_cli());
    dialog.show();
    QTRY_VERIFY_WITH_TIMEOUT(dialog.measured(), 20000);
    dialog.set_kind(ExportDialog::FullModel);
    dialog.set_destination(hung);  // an existing empty folder: the probe file is opened in it
    QTRY_COMPARE_WITH_TIMEOUT(held.waiting(), 1, 10000);
    QVERIFY(!held.openers().contains(this_thread_id()));  // not the GUI thread

    // The event loop runs while the check waits: a 10 ms timer keeps firing.
    int ticks = 0;
    QTimer timer;
    connect(&timer, &QTimer::timeout, [&] { ++ticks; });
    timer.start(10);
    QElapsedTimer clock;
    clock.start();
    QTest::qWait(500);
    QVERIFY2(ticks >= 10, qPrintable(QString("%1 ticks in %2 ms").arg(ticks).arg(clock.elapsed())));
    QCOMPARE(held.waiting(), 1);
    QVERIFY(!dialog.destination_checked());
    QVERIFY(!dialog.export_button()->isEnabled());
    QVERIFY(dialog.start().startsWith("Still checking"));
    QTRY_VERIFY_WITH_TIMEOUT(dialog.estimate_label()->text().contains("slow to answer"), 10000);

    // Another destination meanwhile; then the disk answers: only the new one's answer counts.
    dialog.set_destination(path("after-the-hang"));
    QSignalSpy answers(dialog.findChild<WriteChecker*>(), &WriteChecker::checked);
    QTest::qWait(400);  // past the typing delay: the new check waits behind the held one
    QVERIFY(!dialog.destination_checked());
    held.release();
    QTRY_VERIFY_WITH_TIMEOUT(dialog.destination_checked(), 20000);
    QCOMPARE(answers.count(), 1);
    QCOMPARE(dialog.findChild<WriteChecker*>()->result().path, path("after-the-hang"));
    QCOMPARE(dialog.destination_problem(), QString());
    QVERIFY(dialog.export_button()->isEnabled());
    QVERIFY(QDir(hung).isEmpty());  // the held probe was removed once it could be
  }

  void export_to_an_unwritable_folder_says_why() {
    ExportDialog dialog(measurable_run("unwritable-run"), studio_cli());
    dialog.show();
    QTRY_VERIFY_WITH_TIMEOUT(dialog.measured(), 20000);
    dialog.set_kind(ExportDialog::FullModel);

    // Under a file: not a folder.
    write_file(path("a-file"), "x");
    QString why = start_at(dialog, path("a-file/export"));
    QVERIFY2(why.contains(path("a-file") + " is a file, not a folder"), qPrintable(why));
    QVERIFY(!dialog.busy());
    QVERIFY(!dialog.export_button()->isEnabled());
    // The size line says why instead of the free space ("0 B free" on the wrong disk).
    bool estimate_says_why = false;
    for (QLabel* label : dialog.findChildren<QLabel*>()) {
      QVERIFY2(!label->text().contains(" free on "), qPrintable(label->text()));
      estimate_says_why |= label->text().contains("cannot write there: ");
    }
    QVERIFY(estimate_says_why);

    // A read-only file system, where this machine has one mounted.
    for (const QStorageInfo& volume : QStorageInfo::mountedVolumes()) {
      if (!volume.isReadOnly() || !QFileInfo(volume.rootPath()).isDir()) continue;
      why = start_at(dialog, QDir(volume.rootPath()).filePath("tessera-export-test"));
      QVERIFY2(why.contains("read-only file system"), qPrintable(why));
      break;
    }
    // A folder inside a read-only mount of our own (root writes anywhere else): the check
    // writes, so it gets the system's answer, and names the folder it could not make.
    if (const QString no_mount = mount_tmpfs(path("read-only"), "ro,size=1m"); no_mount.isEmpty()) {
      why = start_at(dialog, path("read-only/models/export"));
      QVERIFY2(why.contains(path("read-only/models") + " is on a read-only file system"),
               qPrintable(why));
      QVERIFY2(
          dialog.estimate_label()->text().contains(
              "cannot write there: " + path("read-only/models") + " is on a read-only file system"),
          qPrintable(dialog.estimate_label()->text()));
      QVERIFY(!dialog.export_button()->isEnabled());
    } else {
      qInfo("no read-only mount of our own: %s", qPrintable(no_mount));
    }
    // No permission (root may write anywhere, so only for other users).
    if (::geteuid() != 0) {
      QVERIFY(QDir().mkpath(path("locked")));
      QVERIFY(QFile::setPermissions(path("locked"), QFile::ReadOwner | QFile::ExeOwner));
      why = start_at(dialog, path("locked/export"));
      QFile::setPermissions(path("locked"), QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
      QVERIFY2(why.contains("permission denied for " + path("locked/export")), qPrintable(why));
    }
  }

  // Every page at 1280×720, light and dark (at QT_SCALE_FACTOR=2 from the second ctest entry).
  void screenshots_of_every_page() {
    if (!store_) QSKIP("no store");
    record_run("screenshot-run");
    const QString scale = qEnvironmentVariableIsSet("QT_SCALE_FACTOR")
                              ? QString("@%1x").arg(qEnvironmentVariable("QT_SCALE_FACTOR"))
                              : QString();
    auto window = open_window();
    QSignalSpy replayed(window->runs_page(), &RunsPage::replayed);
    window->runs_page()->open_run("screenshot-run");
    QVERIFY(replayed.wait(10000));
    const struct {
      MainWindow::Page page;
      const char* name;
    } pages[] = {{MainWindow::NewFineTune, "new-fine-tune"},
                 {MainWindow::Runs, "runs"},
                 {MainWindow::Models, "models"},
                 {MainWindow::Datasets, "datasets"},
                 {MainWindow::Nodes, "nodes"},
                 {MainWindow::Settings, "settings"}};
    for (const char* theme : {"light", "dark"}) {
      window->theme_combo()->setCurrentIndex(window->theme_combo()->findData(theme));
      for (const auto& p : pages) {
        window->show_page(p.page);
        QTest::qWait(50);  // the charts lay out their axes on a queued call
        screenshot(window.get(), QString("desktop-%1-%2%3").arg(p.name, theme, scale));
        // Nothing cut: the window keeps 1280×720 (no page forces it larger), no page scrolls
        // sideways, and no chart elides its text.
        QCOMPARE(window->size(), QSize(1280, 720));
        const QSize minimum = window->minimumSizeHint();
        QVERIFY2(minimum.width() <= 1280 && minimum.height() <= 720,
                 qPrintable(QString("%1: minimum %2×%3")
                                .arg(p.name)
                                .arg(minimum.width())
                                .arg(minimum.height())));
        for (QScrollArea* area : window->page_widget(p.page)->findChildren<QScrollArea*>())
          if (area->isVisible())
            QVERIFY2(!area->horizontalScrollBar()->isVisible(),
                     qPrintable(QString("%1 scrolls sideways").arg(p.name)));
        const QStringList elided = elided_chart_text(window.get());
        QVERIFY2(elided.isEmpty(),
                 qPrintable(QString("%1, %2: %3").arg(p.name, theme, elided.join("; "))));
      }
    }
    // The smallest window the studio takes: the runs page with a run open, for a look.
    window->theme_combo()->setCurrentIndex(window->theme_combo()->findData("light"));
    window->resize(1024, 600);
    QTRY_COMPARE(window->size(), QSize(1024, 600));
    window->show_page(MainWindow::Runs);
    QTest::qWait(50);
    screenshot(window.get(), QString("desktop-runs-1024x600%1").arg(scale));
  }
};

QTEST_MAIN(DesktopTest)
#include "test_desktop.moc"
