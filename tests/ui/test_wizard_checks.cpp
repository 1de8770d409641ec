// The wizard checks each step before going on: Next is off with the reason beside it, the
// steps list reaches no step past an incomplete one, and the Dataset page applies the run's
// own rules (its reader, its example builder with the page's sequence length, the model's
// context), so Review never says Ready for a run that fails. The bad-row case is run for real.
#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QDir>
#include <QLabel>
#include <QListWidget>
#include <QProcess>
#include <QPushButton>
#include <QRegularExpression>
#include <QSpinBox>
#include <QTemporaryDir>
#include <QtTest/QtTest>

#include "job/job_spec.h"
#include "tests/ui/studio_fixture.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;

class WizardChecksTest : public QObject {
  Q_OBJECT

  QTemporaryDir tmp_;
  QString demo_;  // tessera-cli demo --no-train: base/ (a Llama with 256 positions), train.jsonl
  // Probed before any wizard is made, so the wizards here have no Hardware step (no planning
  // children): the checks under test are the Model and Dataset steps'.
  CliProbe probe_;

  QString path(const QString& name) const { return tmp_.filePath(name); }

  // The first `n` rows of the demo's training set, each a JSON line.
  QList<QByteArray> demo_rows(int n) const {
    QFile f(demo_ + "/train.jsonl");
    if (!f.open(QIODevice::ReadOnly)) return {};
    QList<QByteArray> rows;
    while (rows.size() < n && !f.atEnd()) rows << f.readLine().trimmed();
    return rows;
  }

  // A wizard with the demo model chosen.
  static void choose_demo_model(FineTuneWizard& wizard, const QString& demo) {
    wizard.model_page()->choose_folder(demo + "/base");
    QTRY_VERIFY_WITH_TIMEOUT(wizard.model_page()->ready(), 20000);
  }

  static void wait_for_analysis(DatasetPage* page) {
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 30000);
  }

  // Clicks the steps list's item for `step` as a user would.
  static void click_step(FineTuneWizard& wizard, int step) {
    QListWidget* list = wizard.steps_list();
    const QRect rect = list->visualItemRect(list->item(step));
    QTest::mouseClick(list->viewport(), Qt::LeftButton, {}, rect.center());
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    isolate_settings(tmp_.path());
    demo_ = path("demo");
    const QString error = make_demo(studio_cli(), demo_);
    QVERIFY2(error.isEmpty(), qPrintable(error));
    probe_.probe(studio_cli());
    QTRY_VERIFY_WITH_TIMEOUT(probe_.finished(), 20000);
  }

  void next_waits_for_each_step_and_says_why() {
    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    QCOMPARE(wizard.current_page(), int(FineTuneWizard::ModelStep));
    QVERIFY(!wizard.next_button()->isEnabled());
    QCOMPARE(wizard.reason_label()->text(), QString("Choose a model to go on"));
    QVERIFY(wizard.reason_label()->isVisible());
    // The steps list cannot jump past the incomplete Model step.
    QVERIFY(!(wizard.steps_list()->item(FineTuneWizard::DatasetStep)->flags() & Qt::ItemIsEnabled));
    click_step(wizard, FineTuneWizard::ReviewStep);
    QCOMPARE(wizard.current_page(), int(FineTuneWizard::ModelStep));
    screenshot(&wizard, "wizard-checks-1-no-model");

    wizard.model_page()->choose_folder(demo_ + "/base");
    QCOMPARE(wizard.reason_label()->text(), QString("Wait for the model check"));
    QTRY_VERIFY_WITH_TIMEOUT(wizard.model_page()->ready(), 20000);
    QVERIFY(wizard.next_button()->isEnabled());
    QCOMPARE(wizard.reason_label()->text(), QString());
    QVERIFY(wizard.steps_list()->item(FineTuneWizard::DatasetStep)->flags() & Qt::ItemIsEnabled);
    // Method needs a dataset first.
    QVERIFY(!(wizard.steps_list()->item(FineTuneWizard::MethodStep)->flags() & Qt::ItemIsEnabled));
    click_step(wizard, FineTuneWizard::MethodStep);
    QCOMPARE(wizard.current_page(), int(FineTuneWizard::ModelStep));

    QTest::mouseClick(wizard.next_button(), Qt::LeftButton);
    QCOMPARE(wizard.current_page(), int(FineTuneWizard::DatasetStep));
    QVERIFY(!wizard.next_button()->isEnabled());
    QCOMPARE(wizard.reason_label()->text(), QString("Choose a dataset file"));
    QVERIFY(wizard.missing().contains("Choose a dataset file"));
    wizard.dataset_page()->max_length()->setValue(32);
    wizard.dataset_page()->choose_file(demo_ + "/train.jsonl");
    QCOMPARE(wizard.reason_label()->text(), QString("Wait for the dataset check"));
    QVERIFY(!wizard.next_button()->isEnabled());
    wait_for_analysis(wizard.dataset_page());
    QVERIFY2(wizard.next_button()->isEnabled(), qPrintable(wizard.reason_label()->text()));
    QVERIFY(wizard.missing().isEmpty());
    // Every step is reachable now, Review included.
    click_step(wizard, FineTuneWizard::ReviewStep);
    QCOMPARE(wizard.current_page(), int(FineTuneWizard::ReviewStep));
  }

  void sequence_length_over_the_context_is_flagged_and_not_ready() {
    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    // The default (512) is above the demo model's max_position_embeddings (256): the default
    // becomes the model's context.
    QCOMPARE(page->max_length()->value(), 512);
    page->choose_file(demo_ + "/train.jsonl");
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy() && page->max_length()->value() == 256, 30000);
    QCOMPARE(page->analysis().model_context, std::int64_t(256));
    QVERIFY(!page->context_label()->isVisible());
    QVERIFY2(wizard.missing().isEmpty(), qPrintable(wizard.missing().join("; ")));

    // Chosen by the user, 512 is flagged at once, and still after the analysis.
    page->max_length()->setValue(512);
    QVERIFY(page->context_label()->isVisible());
    QVERIFY(!wizard.next_button()->isEnabled());
    wait_for_analysis(page);
    QCOMPARE(page->max_length()->value(), 512);
    QVERIFY(page->context_label()->isVisible());
    QVERIFY2(page->context_label()->text().contains("512") &&
                 page->context_label()->text().contains("256 positions"),
             qPrintable(page->context_label()->text()));
    QVERIFY(!wizard.next_button()->isEnabled());
    QCOMPARE(wizard.reason_label()->text(),
             QString("Lower the sequence length to 256 or less (the model's context)"));
    QVERIFY(!wizard.missing().isEmpty());
    QVERIFY(!wizard.step_reachable(FineTuneWizard::ReviewStep));
    screenshot(&wizard, "wizard-checks-2-context");
    // The fix beside it.
    QCOMPARE(page->fit_context_button()->text(), QString("Use 256 tokens"));
    QTest::mouseClick(page->fit_context_button(), Qt::LeftButton);
    QCOMPARE(page->max_length()->value(), 256);
    QVERIFY(!page->context_label()->isVisible());
    wait_for_analysis(page);
    QVERIFY2(wizard.missing().isEmpty(), qPrintable(wizard.missing().join("; ")));
  }

  void bad_rows_block_the_launch_and_are_skipped_when_chosen() {
    // Three rows the run cannot train on: one without its output column, one whose prompt
    // leaves no response token within 32 tokens, one that is not JSON.
    QList<QByteArray> rows = demo_rows(40);
    QCOMPARE(rows.size(), 40);
    rows[2] = "{\"instruction\":\"first abcde\"}";
    rows[6] = "{\"instruction\":\"upper " + QByteArray(80, 'x') + "\",\"output\":\"X\"}";
    rows[9] = "{\"instruction\":\"first abc\", \"output\":";
    const QString file = path("bad-rows.jsonl");
    write_file(file, rows.join('\n') + '\n');

    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    page->max_length()->setValue(32);
    page->validation_split()->setValue(0);  // every row trains: the run's skip count is all
    page->choose_file(file);
    wait_for_analysis(page);
    const DatasetAnalysis& a = page->analysis();
    QVERIFY2(a.error.isEmpty(), qPrintable(a.error));
    QVERIFY(a.rows_checked);
    QCOMPARE(a.bad_rows, std::uint64_t(3));
    const QString listed = page->bad_rows_label()->text();
    QVERIFY(page->bad_rows_label()->isVisible());
    QVERIFY2(listed.contains("3 rows cannot be trained on"), qPrintable(listed));
    QVERIFY2(listed.contains("bad-rows.jsonl:3: column 'output' (output) is missing"),
             qPrintable(listed));
    // The demo model has a chat template: the instruction is its user turn.
    QVERIFY2(listed.contains("bad-rows.jsonl:7: no assistant token is left within max_length 32"),
             qPrintable(listed));
    QVERIFY2(listed.contains("bad-rows.jsonl:10") && listed.contains("invalid JSON"),
             qPrintable(listed));
    QVERIFY(!listed.contains(tmp_.path()));  // the file's name, not its folder
    QVERIFY(!wizard.next_button()->isEnabled());
    QCOMPARE(wizard.reason_label()->text(),
             QString("Fix the dataset: 3 rows cannot be trained on, or tick \"Skip bad rows\""));
    QVERIFY(!wizard.missing().isEmpty());
    screenshot(&wizard, "wizard-checks-3-bad-rows");

    wizard.method_page()->set_steps(2);
    const QString cli = training_cli();
    if (!cli.isEmpty()) {
      // The run agrees: without skipping it fails on the first bad row.
      const auto [code, log] = run(cli, wizard.build_spec(), "no-skip");
      QVERIFY2(code != 0, qPrintable(log));
      QVERIFY2(log.contains("bad-rows.jsonl:"), qPrintable(log));
    }

    QTest::mouseClick(page->skip_bad_rows_box(), Qt::LeftButton);
    QVERIFY(page->skip_bad_rows_box()->isChecked());
    QVERIFY2(page->bad_rows_label()->text().startsWith("⚠ 3 rows will be skipped"),
             qPrintable(page->bad_rows_label()->text()));
    QCOMPARE(page->rows_to_skip(), std::uint64_t(3));
    QVERIFY2(wizard.missing().isEmpty(), qPrintable(wizard.missing().join("; ")));
    QVERIFY(wizard.next_button()->isEnabled());
    wizard.go_to(FineTuneWizard::ReviewStep);
    const QString data = wizard.review_page()->summary_value("Data");
    QVERIFY2(data.contains("3 rows that cannot be used will be skipped"), qPrintable(data));
    const tessera::job::JobSpec spec = wizard.build_spec();
    QVERIFY(spec.dataset.skip_bad_rows);
    QVERIFY(tessera::job::to_json(spec).dump().find("\"skip_bad_rows\":true") != std::string::npos);

    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `run` (built without LibTorch)");
    // The run completes and skips exactly those rows (the reader's and the tokenizer's).
    const auto [code, log] = run(cli, spec, "skip");
    QVERIFY2(code == 0, qPrintable(log));
    int skipped = 0;
    QRegularExpression counted("(\\d+) rows? skipped");
    for (auto it = counted.globalMatch(log); it.hasNext();)
      skipped += it.next().captured(1).toInt();
    QVERIFY2(skipped == 3, qPrintable(log));
    QVERIFY2(log.contains("37 training"), qPrintable(log));
  }

  void a_column_missing_from_every_row_is_named_and_mapped() {
    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    page->max_length()->setValue(64);

    // Only an instruction column: detection reads plain text, and the page says why.
    const QString only = path("instructions-only.jsonl");
    write_file(only,
               "{\"instruction\":\"first abc\"}"
               "\n"
               "{\"instruction\":\"last xyz\"}"
               "\n");
    page->choose_file(only);
    wait_for_analysis(page);
    QCOMPARE(page->analysis().format, QString("text"));
    QVERIFY(page->format_note_label()->isVisible());
    const QString note = page->format_note_label()->text();
    QVERIFY2(note.contains("'instruction'") && note.contains("'output'") &&
                 note.contains("the columns are: instruction"),
             qPrintable(note));
    QCOMPARE(page->use_format_button()->text(), QString("Use the instruction format"));
    QTest::mouseClick(page->use_format_button(), Qt::LeftButton);
    wait_for_analysis(page);
    QCOMPARE(page->format_combo()->currentData().toString(), QString("instruction"));
    QCOMPARE(page->analysis().missing_roles, QStringList{"output"});
    QVERIFY(page->role_combo("output"));
    QCOMPARE(page->role_combo("output")->currentText(), QString("(choose a column)"));
    QVERIFY(!page->format_note_label()->isVisible());

    // An answer column under another name: the mapping is offered, and chosen in the GUI.
    const QString renamed = path("renamed-answer.jsonl");
    write_file(renamed,
               "{\"instruction\":\"first abc\",\"reply\":\"a\"}"
               "\n"
               "{\"instruction\":\"last xyz\",\"reply\":\"z\"}"
               "\n");
    page->set_format("auto");
    page->choose_file(renamed);
    wait_for_analysis(page);
    QCOMPARE(page->analysis().format, QString("instruction"));
    QCOMPARE(page->analysis().missing_roles, QStringList{"output"});
    const QString status = page->status_label()->text();
    QVERIFY2(status.contains("'output'") && status.contains("instruction, reply"),
             qPrintable(status));
    QVERIFY2(!status.contains("--column") && !status.contains("--format"), qPrintable(status));
    QCOMPARE(wizard.reason_label()->text(),
             QString("Choose the column for 'output' under \"Format and columns\""));
    screenshot(&wizard, "wizard-checks-4-missing-column");
    QComboBox* output = page->role_combo("output");
    QVERIFY(output);
    output->setCurrentIndex(output->findData("reply"));
    wait_for_analysis(page);
    QVERIFY2(page->ready(), qPrintable(page->problem()));
    QCOMPARE(page->analysis().mapping.value("output"), QString("reply"));
    QCOMPARE(wizard.build_spec().dataset.columns.at("output"), std::string("reply"));
  }

  void a_forced_format_keeps_the_column_drop_downs() {
    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    page->max_length()->setValue(32);
    page->choose_file(demo_ + "/train.jsonl");
    wait_for_analysis(page);
    page->set_format("classification");  // instruction/output rows: no label column
    wait_for_analysis(page);
    QCOMPARE(page->analysis().format, QString("classification"));
    QVERIFY(page->role_combo("text"));
    QVERIFY(page->role_combo("label"));
    QCOMPARE(page->role_combo("label")->currentText(), QString("(choose a column)"));
    QVERIFY(page->role_combo("label")->findData("output") >= 0);
    const QString status = page->status_label()->text();
    QVERIFY2(status.contains("'label'") && !status.contains("--column"), qPrintable(status));
    QVERIFY(!wizard.next_button()->isEnabled());
    screenshot(&wizard, "wizard-checks-5-forced-format");

    page->set_format("chat");  // no messages column either
    wait_for_analysis(page);
    QVERIFY(page->role_combo("messages"));
    QCOMPARE(page->role_combo("messages")->count(), 3);  // the placeholder and two columns
    QCOMPARE(wizard.reason_label()->text(),
             QString("Choose the column for 'messages' under \"Format and columns\""));
  }

  void a_file_in_another_encoding_is_explained_in_gui_words() {
    FineTuneWizard wizard(&probe_);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    // A Latin-1 header: the whole file is unreadable as UTF-8, not one bad row.
    const QString latin1 = path("latin1.csv");
    write_file(latin1, "r\xe9ponse,text\nun,deux\n");
    page->choose_file(latin1);
    wait_for_analysis(page);
    const QString status = page->status_label()->text();
    QVERIFY2(status.contains("latin1.csv") && status.contains("UTF-8"), qPrintable(status));
    QVERIFY2(status.contains("Save As…, encoding UTF-8"), qPrintable(status));
    QVERIFY2(!status.contains("iconv"), qPrintable(status));
    QVERIFY(!wizard.next_button()->isEnabled());
  }

  void a_png_named_jsonl_is_not_a_text_file() {
    FineTuneWizard wizard(&probe_);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    const QString png = path("picture.jsonl");
    // A PNG's signature and header chunk, then pixel bytes that are not UTF-8.
    write_file(png, QByteArray::fromHex("89504e470d0a1a0a0000000d4948445200000010") +
                        QByteArray(64, '\xff'));
    page->choose_file(png);
    wait_for_analysis(page);
    const QString status = page->status_label()->text();
    QVERIFY2(status.contains("picture.jsonl: not a text file (it looks like a PNG image)"),
             qPrintable(status));
    QVERIFY2(!status.contains("iconv") && !status.contains("UTF-8"), qPrintable(status));
    QVERIFY(wizard.reason_label()->text().startsWith("Fix the dataset: "));
    QVERIFY(wizard.reason_label()->text().contains("PNG image"));

    const QString zipped = path("data.jsonl");
    write_file(zipped, QByteArray("\x1f\x8b\x08\x00", 4) + QByteArray(32, '\x01'));
    page->choose_file(zipped);
    wait_for_analysis(page);
    QVERIFY2(page->status_label()->text().contains("(it looks like a gzip archive)"),
             qPrintable(page->status_label()->text()));
  }

 private:
  // `tessera-cli run` on `spec` (its output in a fresh folder named `name`): the exit code
  // and stdout + stderr.
  std::pair<int, QString> run(const QString& cli, tessera::job::JobSpec spec, const QString& name) {
    spec.output.dir = path("runs/" + name).toStdString();
    const QString job = path(name + ".json");
    tessera::job::save_job_spec(spec, job.toStdString());
    QProcess process;
    process.setProcessChannelMode(QProcess::MergedChannels);
    process.start(cli, {"run", job});
    if (!process.waitForFinished(300000)) return {-1, "the run took over 5 minutes"};
    return {process.exitCode(), QString::fromUtf8(process.readAll())};
  }
};

QTEST_MAIN(WizardChecksTest)
#include "test_wizard_checks.moc"
