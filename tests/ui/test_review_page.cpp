// The wizard's Review step: the job in words (what the spec says and what `tessera-cli plan`
// says for it), the run's editable name as the runs database and the dashboard show it, and the
// run's folder: chosen, and checked before launch by writing in it, with the system's reason
// for a folder that cannot be written.
#include <unistd.h>

#include <QDir>
#include <QDoubleSpinBox>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QScrollArea>
#include <QSettings>
#include <QSpinBox>
#include <QTabWidget>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <cmath>
#include <memory>

#include "job/job_spec.h"
#include "tests/ui/studio_fixture.h"
#include "ui/main_window.h"
#include "ui/models/model_info.h"
#include "ui/models/runs_db.h"
#include "ui/models/runs_table_model.h"
#include "ui/pages/hardware_page.h"
#include "ui/pages/run_dashboard.h"
#include "ui/pages/runs_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/widgets/pair_view.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;

class TestReviewPage : public QObject {
  Q_OBJECT

  QTemporaryDir tmp_;
  QString model_, dataset_;
  qint64 parameters_ = 0;
  std::unique_ptr<RunsStore> store_;
  QStringList mounts_;     // file systems a test mounted, unmounted at its end
  QString named_run_job_;  // the job.json of the renamed real run (for the calibrated time)

  QString path(const QString& name) const { return QDir(tmp_.path()).filePath(name); }

  // A tessera-cli that lists `run` (and no `plan`): Review gets to its folder checks.
  QString fake_cli() {
    const QString fake = path("fake-cli.sh");
    if (!QFileInfo::exists(fake)) {
      write_file(fake,
                 "#!/bin/sh\necho 'usage: tessera-cli COMMAND [ARGS]'\necho\n"
                 "echo 'commands:'\necho '  run          Run a job spec'\n");
      QFile::setPermissions(fake, QFile::permissions(fake) | QFile::ExeOwner);
    }
    return fake;
  }

  // `wizard` on the tiny Llama and the dataset, at Review, once nothing is missing.
  void fill_wizard(FineTuneWizard* wizard, const QString& method, int steps) {
    wizard->model_page()->choose_folder(model_);
    wizard->dataset_page()->max_length()->setValue(32);
    wizard->dataset_page()->choose_file(dataset_);
    wizard->method_page()->set_method(method);
    wizard->method_page()->set_steps(steps);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    wizard->go_to(FineTuneWizard::ReviewStep);
  }

  // `tessera-cli plan FILE --json [extra]`, run here, apart from the studio.
  QJsonObject plan_of(const QString& job_file, const QStringList& extra = {}) {
    QProcess plan;
    plan.start(studio_cli(), QStringList{"plan", job_file, "--json"} + extra);
    if (!plan.waitForFinished(120000)) return {};
    return QJsonDocument::fromJson(plan.readAllStandardOutput()).object();
  }

  // A tmpfs mounted at `dir` with `options`; "" or why it could not be.
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

  // A wizard whose tessera-cli can `run`, at Review, its runs in `folder`; Launch's state once
  // the folder was checked.
  void review_with_folder(MainWindow& window, const QString& folder) {
    window.cli_probe()->probe(fake_cli());
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    FineTuneWizard* wizard = window.wizard();
    fill_wizard(wizard, "lora", 10);
    wizard->review_page()->choose_runs_folder(folder);
    QCOMPARE(QString::fromStdString(wizard->build_spec().output.dir),
             QDir(folder).filePath(wizard->run_id()));
    QTRY_VERIFY_WITH_TIMEOUT(wizard->review_page()->folder_checked(), 20000);
  }

  // Launch is disabled and the page says `reason` about `folder`.
  void expect_blocked(ReviewPage* review, const QString& reason) {
    QVERIFY2(review->folder_problem().contains(reason), qPrintable(review->folder_problem()));
    QVERIFY(!review->launch_button()->isEnabled());
    QVERIFY(review->folder_problem_label()->isVisible());
    QVERIFY2(review->folder_problem_label()->text().contains(reason),
             qPrintable(review->folder_problem_label()->text()));
    // The card agrees with the button.
    QVERIFY2(review->readiness_text().startsWith("Not ready: the run folder cannot be written"),
             qPrintable(review->readiness_text()));
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    QCoreApplication::setOrganizationName("TesseraTest");
    QCoreApplication::setApplicationName("tessera-review-test");
    isolate_settings(tmp_.path());
    model_ = path("tiny-llama");
    QString error;
    parameters_ = make_tiny_llama(model_, &error);
    QVERIFY2(parameters_ > 0, qPrintable(error));
    QByteArray rows;
    for (int i = 0; i < 60; ++i)
      rows += QString(R"({"instruction": "Count to %1.", "output": "%2"})")
                  .arg(i)
                  .arg(QString("one ").repeated(i % 7 + 1).trimmed())
                  .toUtf8() +
              '\n';
    dataset_ = path("train.jsonl");
    write_file(dataset_, rows);
    store_ = std::make_unique<RunsStore>(path("runs.sqlite"));
  }

  void cleanup() {
    for (const QString& dir : mounts_) QProcess::execute("umount", {dir});
    mounts_.clear();
  }

  void cleanupTestCase() {
    cleanup();
    QSettings().remove("paths/cli");
    store_.reset();
  }

  // Each line of the summary is the spec's value, and strategy / time / memory are what
  // `tessera-cli plan` says for the same job, run here on its own.
  void summary_says_the_spec_and_the_plan() {
    QSettings().setValue("paths/cli", studio_cli());
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    FineTuneWizard* wizard = window.wizard();
    if (!wizard->hardware_step_available()) QSKIP("this tessera-cli has no `plan`");
    fill_wizard(wizard, "lora", 20);
    wizard->dataset_page()->validation_split()->setValue(10);
    ReviewPage* review = wizard->review_page();
    QTRY_COMPARE_WITH_TIMEOUT(wizard->build_spec().dataset.validation_split, 0.1, 10000);
    QTRY_VERIFY2_WITH_TIMEOUT(
        review->summary_value("Memory").contains("peak"),
        qPrintable(review->summary_value("Memory") + " | " + review->summary_value("Strategy") +
                   " | " + review->summary_value("Time")),
        120000);
    const tessera::job::JobSpec spec = wizard->build_spec();

    QCOMPARE(review->summary_value("Model"),
             QString("tiny-llama, %1 parameters").arg(human_count(quint64(parameters_))));
    QCOMPARE(review->summary_value("Data"),
             QString("train.jsonl: 60 rows, 54 to train on and 6 (10%) held out for "
                     "validation; sequences up to 32 tokens"));
    QCOMPARE(review->summary_value("Method"),
             QString("LoRA, rank %1 (alpha %2)")
                 .arg(spec.method.lora_rank)
                 .arg(QString::number(spec.method.lora_alpha, 'g', 6)));
    QCOMPARE(review->summary_value("Length"), QString("20 steps"));
    QCOMPARE(review->summary_value("Batch"),
             QString("%1 sequences per step").arg(spec.training.batch_size));
    QVERIFY(review->summary_value("Learning rate")
                .startsWith(QString::number(spec.training.learning_rate, 'g', 6) + ", "));
    QCOMPARE(review->summary_value("Precision"), QString::fromStdString(spec.precision));
    QCOMPARE(review->summary_value("Run folder"), QString::fromStdString(spec.output.dir));
    QVERIFY(QString::fromStdString(spec.output.dir)
                .startsWith(QDir(path("runs")).filePath(wizard->run_id())));
    QVERIFY(review->summary_value("Changed to fit").isEmpty());  // the tiny job fits as set

    // The same job planned apart from the studio.
    const QString job_file = path("summary-job.json");
    QCOMPARE(review->save_spec(job_file), QString());
    const QJsonObject plan = plan_of(job_file);
    QVERIFY(plan.contains("fits"));
    // The explanation ends with the memory available now, which moves between two plans.
    const QString explanation = plan.value("explanation").toString();
    QVERIFY2(review->summary_value("Strategy")
                 .startsWith(plan.value("strategy").toString() + ": " +
                             explanation.section(':', 0, 0) + ":"),
             qPrintable(review->summary_value("Strategy") + "\nvs\n" + explanation));
    const QJsonObject time = plan.value("time").toObject();
    QVERIFY(!time.value("calibrated").toBool());  // nothing ran in this settings folder yet
    QCOMPARE(review->summary_value("Time"),
             plan_time_text(time) +
                 " (rough: no run of this job has been measured on this machine yet)");
    // The Hardware & strategy page shows the same figure.
    QVERIFY2(wizard->hardware_page()->time_label()->text().contains(plan_time_text(time)),
             qPrintable(wizard->hardware_page()->time_label()->text()));
    const QJsonArray memory = plan.value("memory").toArray();
    QVERIFY(!memory.isEmpty());
    for (const QJsonValue& v : memory) {
      const QJsonObject tier = v.toObject();
      const QString said = QString("%1 (%2): peak %3 of ")
                               .arg(tier.value("tier").toString(), tier.value("device").toString(),
                                    human_bytes(quint64(tier.value("peak").toDouble())));
      QVERIFY2(review->summary_value("Memory").contains(said),
               qPrintable(review->summary_value("Memory") + "\nlacks\n" + said));
    }

    // The job spec is one click away, and it is the spec.
    QTabWidget* tabs = review->tabs();
    QCOMPARE(tabs->tabText(1), QString("Job spec"));
    tabs->setCurrentIndex(1);
    const auto shown = tessera::job::parse_job_spec(
        nlohmann::json::parse(review->spec_text().toStdString()), "review");
    QVERIFY(tessera::job::to_json(shown) == tessera::job::to_json(spec));
    tabs->setCurrentIndex(0);
    screenshot(&window, "review-summary");
  }

  // What the plan changes of the user's choices to fit is said in the summary.
  // QLoRA is a method card beside LoRA with its base's format: the job, the summary and the plan
  // of the same job apart from the studio all carry it, and going back to LoRA drops it.
  void qlora_is_chosen_with_its_base_and_planned() {
    QSettings().setValue("paths/cli", studio_cli());
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    FineTuneWizard* wizard = window.wizard();
    if (!wizard->hardware_step_available()) QSKIP("this tessera-cli has no `plan`");
    fill_wizard(wizard, "qlora", 10);
    MethodPage* method = wizard->method_page();
    QCOMPARE(method->method(), QString("lora"));
    QCOMPARE(method->quantize(), QString("nf4"));
    QVERIFY(method->double_quant());  // by default, as the QLoRA paper trains
    const tessera::job::JobSpec spec = wizard->build_spec();
    QCOMPARE(QString::fromStdString(spec.method.type), QString("lora"));
    QCOMPARE(QString::fromStdString(spec.method.quantize), QString("nf4"));
    QVERIFY(spec.method.double_quant);
    ReviewPage* review = wizard->review_page();
    QTRY_COMPARE_WITH_TIMEOUT(
        review->summary_value("Method"),
        QString("QLoRA (NF4 base, double-quantized scales), rank %1 (alpha %2)")
            .arg(spec.method.lora_rank)
            .arg(QString::number(spec.method.lora_alpha, 'g', 6)),
        10000);
    const QString job_file = path("qlora-job.json");
    QCOMPARE(review->save_spec(job_file), QString());
    const QJsonObject plan = plan_of(job_file);
    QCOMPARE(plan.value("settings").toObject().value("quantize").toString(), QString("nf4"));
    QVERIFY(plan.value("settings").toObject().value("double_quant").toBool());
    QVERIFY2(plan.value("explanation").toString().startsWith("QLoRA (rank"),
             qPrintable(plan.value("explanation").toString()));
    // int8 rows have no block scales to quantize: the choice is off, and so is the spec's.
    MethodPage int8_page;
    int8_page.set_method("qlora");
    tessera::job::MethodSpec int8_method = spec.method;
    int8_method.quantize = "int8";
    int8_method.double_quant = false;
    int8_page.load_spec(int8_method, spec.training, "fp32");
    QCOMPARE(int8_page.quantize(), QString("int8"));
    QVERIFY(!int8_page.double_quant());
    QVERIFY(!int8_page.method_spec().double_quant);
    method->set_method("lora");
    QCOMPARE(method->quantize(), QString("none"));
    QCOMPARE(QString::fromStdString(wizard->build_spec().method.quantize), QString("none"));
  }

  // Preference tuning: a dataset of pairs with the supervised objective is a problem of the
  // Method step (naming the objectives that take pairs); DPO chosen, the spec carries it, the
  // summary says it, and the plan takes the job; KTO on pairs is a problem again.
  void preference_objective_and_dataset_agree() {
    QSettings().setValue("paths/cli", studio_cli());
    QByteArray pairs;
    for (int i = 0; i < 24; ++i)
      pairs += QString(R"({"prompt": "Count to %1.", "chosen": " %2", "rejected": " %3"})")
                   .arg(i)
                   .arg(QString("one ").repeated(i % 5 + 1).trimmed())
                   .arg(QString("two ").repeated(i % 3 + 1).trimmed())
                   .toUtf8() +
               '\n';
    const QString pairs_file = path("pairs.jsonl");
    write_file(pairs_file, pairs);
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    FineTuneWizard* wizard = window.wizard();
    wizard->model_page()->choose_folder(model_);
    wizard->dataset_page()->max_length()->setValue(32);
    wizard->dataset_page()->choose_file(pairs_file);
    MethodPage* method = wizard->method_page();
    method->set_method("lora");
    method->set_steps(4);
    QTRY_COMPARE_WITH_TIMEOUT(wizard->dataset_page()->analysis().format, QString("preference"),
                              30000);
    // The preview shows a pair side by side: the first row's, then the row picked.
    DatasetPage* data = wizard->dataset_page();
    QVERIFY(!data->pair_view()->isHidden());
    QCOMPARE(data->pair_view()->prompt_text(), QString("Count to 0."));
    QCOMPARE(data->pair_view()->chosen_text().trimmed(), QString("one"));
    QCOMPARE(data->pair_view()->rejected_text().trimmed(), QString("two"));
    data->preview_table()->setCurrentCell(3, 0);
    QCOMPARE(data->pair_view()->chosen_text().trimmed(), QString("one one one one"));
    QCOMPARE(data->pair_view()->rejected_text().trimmed(), QString("two"));
    QVERIFY2(data->pair_view()->title().contains("row 4"), qPrintable(data->pair_view()->title()));
    wizard->go_to(FineTuneWizard::DatasetStep);
    // The page scrolls in a window this small: to the pair, as a person would.
    for (QWidget* w = data->pair_view(); w != nullptr; w = w->parentWidget())
      if (auto* area = qobject_cast<QScrollArea*>(w)) area->ensureWidgetVisible(data->pair_view());
    screenshot(&window, "dataset-page-pairs");
    QCOMPARE(method->objective(), QString("sft"));
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().join(" | ").contains("preference pairs"), 10000);
    QVERIFY(wizard->missing().join(" | ").contains("DPO, IPO, SimPO or ORPO"));
    method->set_objective("dpo");
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    wizard->go_to(FineTuneWizard::MethodStep);
    screenshot(&window, "method-page-dpo");
    const tessera::job::JobSpec spec = wizard->build_spec();
    QVERIFY(spec.method.preference.has_value());
    QCOMPARE(QString::fromStdString(spec.method.preference->loss), QString("dpo"));
    QCOMPARE(spec.method.preference->beta, 0.1);
    wizard->go_to(FineTuneWizard::ReviewStep);
    ReviewPage* review = wizard->review_page();
    QTRY_COMPARE_WITH_TIMEOUT(review->summary_value("Objective"),
                              QString("DPO, β 0.1 (preference tuning)"), 10000);
    const QString job_file = path("dpo-job.json");
    QCOMPARE(review->save_spec(job_file), QString());
    const QJsonObject plan = plan_of(job_file);
    QVERIFY2(!plan.isEmpty(), "tessera-cli plan refused the DPO job");
    // A cloned run's objective comes back with it.
    MethodPage clone;
    clone.load_spec(spec.method, spec.training, "fp32");
    QCOMPARE(clone.objective(), QString("dpo"));
    QCOMPARE(QString::fromStdString(clone.method_spec().preference->loss), QString("dpo"));
    method->set_objective("kto");
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().join(" | ").contains("KTO trains on examples"),
                             10000);
  }

  void summary_says_what_the_plan_changed() {
    CliProbe probe;
    ReviewPage review(&probe);
    tessera::job::JobSpec spec;
    spec.name = "big batch";
    spec.model.path = model_.toStdString();
    spec.dataset.train_files = {dataset_.toStdString()};
    spec.dataset.max_length = 128;
    spec.method.type = "full";
    spec.training.steps = 10;
    // Past what 1 GiB holds at the dataset's longest row (the plan reads every row of a small
    // dataset and plans for its longest: at 1024 the counting rows fit at once).
    spec.training.batch_size = 65536;
    spec.output.dir = path("runs/big-batch").toStdString();
    const QString job_file = path("big-batch.json");
    tessera::job::save_job_spec(spec, job_file.toStdString());
    // A small simulated memory: the planner splits the batch into micro-batches.
    const QJsonObject plan = plan_of(job_file, {"--simulate-host-memory", "1GiB"});
    QVERIFY(plan.value("fits").toBool());
    const QJsonObject settings = plan.value("settings").toObject();
    QVERIFY(settings.value("micro_batch").toInteger() < 65536);
    ReviewFacts facts;
    facts.planner_available = true;
    facts.plan = plan;
    review.show_spec(spec, {}, facts);
    QCOMPARE(review.summary_value("Changed to fit"),
             QString("as set, the job does not fit at once; the engine will use micro-batch %1 "
                     "with %2 accumulation steps")
                 .arg(settings.value("micro_batch").toInteger())
                 .arg(settings.value("gradient_accumulation").toInteger()));
    QCOMPARE(review.summary_value("Batch"), QString("65536 sequences per step"));
  }

  // The default name is "model · method · time", the user can rename the run, and the new name
  // is what the runs database and the dashboard show.
  void renaming_the_run_reaches_the_database_and_the_dashboard() {
    const QString cli = training_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli cannot train (no `run`)");
    QSettings().setValue("paths/cli", cli);
    const QString demo = path("demo");
    QCOMPARE(make_demo(cli, demo), QString());
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    FineTuneWizard* wizard = window.wizard();
    wizard->model_page()->choose_folder(demo + "/base");
    wizard->dataset_page()->max_length()->setValue(32);
    wizard->dataset_page()->choose_file(demo + "/train.jsonl");
    wizard->method_page()->set_method("lora");
    wizard->method_page()->set_steps(8);  // the 5 steps after the first calibrate the plan
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    wizard->go_to(FineTuneWizard::ReviewStep);
    ReviewPage* review = wizard->review_page();
    const QRegularExpression default_name(R"(^base · LoRA · \d{1,2} \S+ \d\d:\d\d$)");
    QVERIFY2(default_name.match(review->name_edit()->text()).hasMatch(),
             qPrintable(review->name_edit()->text()));
    QCOMPARE(QString::fromStdString(wizard->build_spec().name), review->name_edit()->text());

    const QString name = "kiwi counting, second try";
    review->name_edit()->setFocus();
    QTest::keyClick(review->name_edit(), Qt::Key_A, Qt::ControlModifier);
    QTest::keyClicks(review->name_edit(), name);
    QCOMPARE(QString::fromStdString(wizard->build_spec().name), name);
    QVERIFY(review->spec_text().contains(QString("\"name\": \"%1\"").arg(name)));
    // The folder keeps the run id whatever the name says.
    QCOMPARE(QFileInfo(QString::fromStdString(wizard->build_spec().output.dir)).fileName(),
             wizard->run_id());

    QTRY_VERIFY_WITH_TIMEOUT(review->launch_button()->isEnabled(), 120000);
    const QString run_id = wizard->run_id();
    QTest::mouseClick(review->launch_button(), Qt::LeftButton);
    RunDashboard* dashboard = window.runs_page()->dashboard();
    QCOMPARE(dashboard->title_label()->text(), name);
    QCOMPARE(wait_for_run_end(dashboard), QString("completed"));
    store_->flush();
    DbConnection c(store_->path());
    const auto run = find_run(c.db(), run_id);
    QVERIFY(run);
    QCOMPARE(run->name, name);
    named_run_job_ = QDir(run->output_dir).filePath("job.json");
    QTRY_VERIFY_WITH_TIMEOUT(window.runs_page()->runs_model()->row_of(run_id) >= 0, 10000);
    const RunsTableModel* model = window.runs_page()->runs_model();
    QCOMPARE(
        model->index(model->row_of(run_id), int(RunsTableModel::Column::Name)).data().toString(),
        name);
    // A new run in the wizard gets its own default name again.
    QVERIFY(wizard->run_id() != run_id);
    QVERIFY(review->custom_name().isEmpty());
    QVERIFY(default_name.match(QString::fromStdString(wizard->build_spec().name)).hasMatch());
  }

  // Once a run of the job trained on this machine, Review's time is the calibrated one.
  void after_a_run_the_time_is_calibrated_on_this_machine() {
    if (named_run_job_.isEmpty()) QSKIP("no real run (this tessera-cli cannot train)");
    const QJsonObject plan = plan_of(named_run_job_);
    const QJsonObject time = plan.value("time").toObject();
    QVERIFY2(time.value("calibrated").toBool(), qPrintable(time.value("source").toString()));
    CliProbe probe;
    ReviewPage review(&probe);
    ReviewFacts facts;
    facts.planner_available = true;
    facts.plan = plan;
    review.show_spec(tessera::job::load_job_spec(named_run_job_.toStdString()), {}, facts);
    QCOMPARE(review.summary_value("Time"), plan_time_text(time) + " (calibrated on this machine)");
  }

  // A runs folder under a regular file: "not a folder", and Launch is blocked with that.
  void a_folder_under_a_file_blocks_launch() {
    const QString file = path("notes.txt");
    write_file(file, "not a folder");
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    review_with_folder(window, file + "/runs");
    expect_blocked(window.wizard()->review_page(), file + " is a file, not a folder");
    QCOMPARE(window.wizard()->review_page()->launch_button()->text(),
             QString("Choose a folder the run can be written in"));
    QVERIFY(QFileInfo(file).isFile());  // the check left it as it was
    screenshot(&window, "review-folder-not-a-folder");
  }

  // A read-only file system (a tmpfs mounted read-only: root writes anywhere else).
  void a_read_only_file_system_blocks_launch() {
    const QString dir = path("read-only");
    if (const QString why = mount_tmpfs(dir, "ro,size=1m"); !why.isEmpty()) QSKIP(qPrintable(why));
    MainWindow window(store_.get());
    window.show();
    window.show_page(MainWindow::NewFineTune);
    review_with_folder(window, dir);
    expect_blocked(window.wizard()->review_page(), "is on a read-only file system");
  }

  // A full disk (a small tmpfs filled up): the check writes, so it finds out.
  void a_full_disk_blocks_launch() {
    const QString dir = path("full");
    if (const QString why = mount_tmpfs(dir, "size=64k"); !why.isEmpty()) QSKIP(qPrintable(why));
    {
      QFile filler(QDir(dir).filePath("filler"));
      QVERIFY(filler.open(QIODevice::WriteOnly));
      const QByteArray block(4096, 'x');
      while (filler.write(block) == block.size() && filler.flush()) {
      }
    }
    MainWindow window(store_.get());
    window.show();
    window.show_page(MainWindow::NewFineTune);
    review_with_folder(window, dir);
    expect_blocked(window.wizard()->review_page(), "no space left on the disk holding");
    QCOMPARE(QDir(dir).entryList(QDir::AllEntries | QDir::NoDotAndDotDot),
             QStringList{"filler"});  // the check cleaned up after itself
  }

  // Permission bits: only meaningful when not root (root writes in a 0555 folder).
  void a_folder_without_permission_blocks_launch() {
    if (::geteuid() == 0) QSKIP("root ignores permission bits");
    const QString dir = path("locked");
    QVERIFY(QDir().mkpath(dir));
    QFile::setPermissions(dir, QFile::ReadOwner | QFile::ExeOwner | QFile::ReadGroup |
                                   QFile::ExeGroup | QFile::ReadOther | QFile::ExeOther);
    MainWindow window(store_.get());
    window.show();
    window.show_page(MainWindow::NewFineTune);
    review_with_folder(window, dir);
    expect_blocked(window.wizard()->review_page(), "permission denied");
  }

  // The run's own folder already there and empty (made by hand, say): accepted and left as it
  // was; with files in it, it is another run's, and Launch is blocked with that.
  void an_existing_empty_run_folder_is_accepted() {
    const QString runs = path("premade");
    MainWindow window(store_.get());
    window.show();
    window.show_page(MainWindow::NewFineTune);
    const QString run_dir = QDir(runs).filePath(window.wizard()->run_id());
    QVERIFY(QDir().mkpath(run_dir));
    review_with_folder(window, runs);
    ReviewPage* review = window.wizard()->review_page();
    QCOMPARE(review->folder_problem(), QString());
    QVERIFY(review->launch_button()->isEnabled());
    QVERIFY(QFileInfo(run_dir).isDir());
    QVERIFY(QDir(run_dir).isEmpty());  // the probe file is gone, the folder stays

    write_file(QDir(run_dir).filePath("events.jsonl"), "{}\n");
    review->check_folder();
    QVERIFY(!review->folder_checked());  // asked again: Launch waits for the new answer
    QVERIFY(!review->launch_button()->isEnabled());
    QCOMPARE(review->launch_button()->text(), QString("Checking the run folder…"));
    QCOMPARE(review->folder_problem_label()->text(),
             QString("Checking whether the run folder can be written…"));
    QTRY_VERIFY_WITH_TIMEOUT(review->folder_checked(), 20000);
    expect_blocked(review, run_dir + " already holds 1 file or folder");
  }

  // Going to Review while step 4 still plans: Next does not wait, Review does. It says it is
  // planning, Launch waits ("Waiting for the plan…": the plan can still say the job does not
  // fit), and the plan shows on Review once it is in, with Launch offered then.
  void review_waits_for_the_plan_in_progress() {
    const QString cli = training_cli();
    if (cli.isEmpty()) QSKIP("this tessera-cli has no `run`");
    QSettings().setValue("paths/cli", cli);
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    FineTuneWizard* wizard = window.wizard();
    if (!wizard->hardware_step_available()) QSKIP("this tessera-cli has no `plan`");
    wizard->model_page()->choose_folder(model_);
    wizard->dataset_page()->max_length()->setValue(32);
    wizard->dataset_page()->choose_file(dataset_);
    wizard->method_page()->set_method("lora");
    wizard->method_page()->set_steps(12);
    QTRY_VERIFY_WITH_TIMEOUT(wizard->missing().isEmpty(), 30000);
    wizard->go_to(FineTuneWizard::HardwareStep);
    HardwarePage* hardware = wizard->hardware_page();
    QVERIFY(hardware->planning());
    QVERIFY(wizard->next_button()->isEnabled());
    QTest::mouseClick(wizard->next_button(), Qt::LeftButton);
    QCOMPARE(wizard->current_page(), int(FineTuneWizard::ReviewStep));
    ReviewPage* review = wizard->review_page();
    QVERIFY(hardware->planning());
    QCOMPARE(review->summary_value("Time"), QString("planning…"));
    QVERIFY(!review->launch_button()->isEnabled());
    QCOMPARE(review->launch_button()->text(), QString("Waiting for the plan…"));
    // The run folder's answer comes in meanwhile; Launch still waits for the plan.
    QTRY_VERIFY_WITH_TIMEOUT(review->folder_checked(), 20000);
    if (hardware->planning()) {
      QVERIFY(!review->launch_button()->isEnabled());
      QCOMPARE(review->launch_button()->text(), QString("Waiting for the plan…"));
    }
    QTRY_VERIFY_WITH_TIMEOUT(!hardware->planning(), 120000);
    QVERIFY(hardware->plan_is_for(wizard->build_spec()));
    QVERIFY(hardware->fits());
    QCOMPARE(review->summary_value("Time"),
             plan_time_text(hardware->plan_json().value("time").toObject()) +
                 " (rough: no run of this job has been measured on this machine yet)");
    QVERIFY(review->launch_button()->isEnabled());
    QCOMPARE(review->launch_button()->text(), QString("&Launch"));
    QSettings().remove("paths/cli");
  }

  // Another folder for runs: the run's folder (named by its id) is made there at launch, and the
  // database records it there; a folder that can be written lets Launch go.
  void choosing_another_folder_puts_the_run_there() {
    const QString elsewhere = path("elsewhere/runs");
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    review_with_folder(window, elsewhere);
    ReviewPage* review = window.wizard()->review_page();
    QCOMPARE(review->folder_problem(), QString());
    QVERIFY(!review->folder_problem_label()->isVisible());
    QVERIFY(!QFileInfo::exists(path("elsewhere")));  // the check removed what it made
    QVERIFY(review->launch_button()->isEnabled());
    QVERIFY(review->output_label()->text().contains(elsewhere));
    const QString run_id = window.wizard()->run_id();
    QTest::mouseClick(review->launch_button(), Qt::LeftButton);
    const QString run_dir = QDir(elsewhere).filePath(run_id);
    QVERIFY(QFileInfo::exists(run_dir + "/job.json"));
    const auto job = tessera::job::load_job_spec((run_dir + "/job.json").toStdString());
    QCOMPARE(QString::fromStdString(job.output.dir), run_dir);
    store_->flush();
    DbConnection c(store_->path());
    const auto run = find_run(c.db(), run_id);
    QVERIFY(run);
    QCOMPARE(run->output_dir, run_dir);
    // The next run goes there too.
    QCOMPARE(QFileInfo(QString::fromStdString(window.wizard()->build_spec().output.dir)).path(),
             elsewhere);
    // The fake tessera-cli's "run" ends at once; wait for that before the window closes.
    wait_for_run_end(window.runs_page()->dashboard(), 30000);
  }
};

QTEST_MAIN(TestReviewPage)
#include "test_review_page.moc"
