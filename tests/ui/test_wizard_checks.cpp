// The wizard checks each step before going on: Next is off with the reason beside it, the
// steps list reaches no step past an incomplete one, and the Dataset page applies the run's
// own rules (its reader, its example builder with the page's sequence length, the model's
// context), so Review never says Ready for a run that fails. The bad-row case is run for real.
#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QLabel>
#include <QListWidget>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QSpinBox>
#include <QTemporaryDir>
#include <QTimer>
#include <QtTest/QtTest>

#include "core/files.h"
#include "hf/model_folder.h"
#include "job/job_spec.h"
#include "plan/planner.h"
#include "tests/ui/studio_fixture.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;

namespace {

// argv: output folder, a folder whose tokenizer.json to use. A GPT-2 with random weights and 64
// learned positions (n_positions), MiniLM's WordPiece tokenizer, no chat template.
const char* kMakeTinyGpt2 = R"(
import json, os, shutil, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel
out, tok = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                    bos_token_id=101, eos_token_id=102)
GPT2LMHeadModel(config).save_pretrained(out, safe_serialization=True)
shutil.copy(os.path.join(tok, "tokenizer.json"), out)
tc = json.load(open(os.path.join(tok, "tokenizer_config.json")))
tc.update({"bos_token": "[CLS]", "eos_token": "[SEP]", "pad_token": "[PAD]", "model_max_length": 64})
json.dump(tc, open(os.path.join(out, "tokenizer_config.json"), "w"))
)";

// The count in the run's log line "`prefix`: N rows skipped" (0 when it has none).
int logged_skips(const QString& log, const QString& prefix) {
  const QRegularExpression line("^" + QRegularExpression::escape(prefix) + ": (\\d+) rows? skipped",
                                QRegularExpression::MultilineOption);
  const auto match = line.match(log);
  return match.hasMatch() ? match.captured(1).toInt() : 0;
}

// "N training and M validation sequences" from the run's log ({-1, -1} when absent).
std::pair<int, int> logged_sequences(const QString& log) {
  const auto match =
      QRegularExpression("(\\d+) training and (\\d+) validation sequences").match(log);
  if (!match.hasMatch()) return {-1, -1};
  return {match.captured(1).toInt(), match.captured(2).toInt()};
}

}  // namespace

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

  // Packing applies to text data: for instruction rows the box is unticked and disabled (it
  // read "Pack text documents" ticked beside rows that are never packed), and the user's choice
  // comes back with text data.
  void packing_is_shown_off_for_data_it_does_not_apply_to() {
    const QString instructions = path("packing-instructions.jsonl");
    write_file(instructions, demo_rows(20).join('\n') + '\n');
    const QString text = path("packing-text.jsonl");
    QByteArray text_rows;
    for (int i = 0; i < 20; ++i)
      text_rows += "{\"text\":\"document " + QByteArray::number(i) + "\"}\n";
    write_file(text, text_rows);

    FineTuneWizard wizard(&probe_);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    QCheckBox* packing = page->packing();
    page->choose_file(instructions);
    wait_for_analysis(page);
    QCOMPARE(page->analysis().format, QString("instruction"));
    QVERIFY(!packing->isEnabled() && !packing->isChecked());
    QVERIFY(packing->toolTip().startsWith("Off for instruction data"));
    QVERIFY(page->dataset_spec().packing);  // the choice is kept, and the engine packs text only

    page->choose_file(text);
    wait_for_analysis(page);
    QCOMPARE(page->analysis().format, QString("text"));
    QVERIFY(packing->isEnabled() && packing->isChecked());
    packing->setChecked(false);  // the user's choice now
    wait_for_analysis(page);
    QVERIFY(!page->dataset_spec().packing);
    page->choose_file(instructions);
    wait_for_analysis(page);
    QVERIFY(!packing->isEnabled() && !packing->isChecked());
    page->choose_file(text);
    wait_for_analysis(page);
    QVERIFY(packing->isEnabled() && !packing->isChecked());
    QVERIFY(!page->dataset_spec().packing);
  }

  // The method cards say what each method would need for this model, batch and length, by the
  // planner's estimate (which tests/parity/test_plan_estimate.py holds against measured peaks);
  // they follow the batch.
  void method_cards_show_the_memory_each_method_needs() {
    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::MethodStep);
    MethodPage* page = wizard.method_page();
    auto peak = [&](const char* type, const char* quantize, bool double_quant = false) {
      tessera::job::JobSpec spec = wizard.build_spec();
      spec.method.type = type;
      spec.method.quantize = quantize;
      spec.method.double_quant = double_quant;
      const auto folder = tessera::hf::ModelFolder::open((demo_ + "/base").toStdString());
      return tessera::plan::estimate_memory(folder.config(),
                                            tessera::plan::settings_as_written(spec),
                                            folder.checkpoint_bytes())
          .peak();
    };
    const std::uint64_t full = peak("full", "none"), lora = peak("lora", "none");
    QVERIFY(full > lora);
    for (const auto& [card, bytes] : {std::pair{"full", full}, std::pair{"lora", lora},
                                      std::pair{"qlora", peak("lora", "nf4", true)}}) {
      const QString text = page->memory_text(card);
      QVERIFY2(text.contains(QString("About <b>%1</b>")
                                 .arg(QString::fromStdString(tessera::core::human_bytes(bytes)))),
               qPrintable(card + QString(": ") + text));
    }
    const QString before = page->memory_text("full");
    page->set_overrides(64, false, "fp32");
    QTRY_VERIFY(page->memory_text("full") != before);
    QVERIFY2(page->memory_text("full").contains("batch 64 × up to"),
             qPrintable(page->memory_text("full")));
    QVERIFY(page->memory_text("full").contains(
        QString::fromStdString(tessera::core::human_bytes(peak("full", "none")))));
    screenshot(&wizard, "wizard-method-cards-memory");

    // The QLoRA card plans the base format in its combo while another card is chosen: a spec
    // of int8 QLoRA loaded, then LoRA chosen, leaves int8 there (it read nf4).
    tessera::job::JobSpec int8 = wizard.build_spec();
    int8.method.type = "lora";
    int8.method.quantize = "int8";
    page->load_spec(int8.method, int8.training, QString::fromStdString(int8.precision));
    page->set_method("lora");
    const QString int8_peak =
        QString("About <b>%1</b>")
            .arg(QString::fromStdString(tessera::core::human_bytes(peak("lora", "int8"))));
    QVERIFY(peak("lora", "int8") != peak("lora", "nf4", true));
    QTRY_VERIFY2(page->memory_text("qlora").contains(int8_peak),
                 qPrintable(page->memory_text("qlora")));
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

  void a_large_file_is_checked_once_on_a_worker_with_progress() {
    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    page->max_length()->setValue(32);
    // The GUI thread keeps answering while the 20000 rows are tokenized: a timer's ticks, and
    // the progress bar's text seen on the way.
    QElapsedTimer clock;
    qint64 last_tick = 0, longest_gap = 0;
    QString progress_text;
    QTimer tick;
    tick.setInterval(20);
    connect(&tick, &QTimer::timeout, this, [&] {
      const qint64 now = clock.elapsed();
      longest_gap = std::max(longest_gap, now - last_tick);
      last_tick = now;
      if (page->progress_bar()->isVisible()) progress_text = page->progress_bar()->text();
    });
    clock.start();
    tick.start();
    page->choose_file(demo_ + "/train.jsonl");
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 120000);
    tick.stop();
    const qint64 checked_ms = clock.elapsed();
    QVERIFY2(progress_text.contains(QRegularExpression("^\\d+ of 20000 rows$")),
             qPrintable(progress_text));
    QVERIFY2(
        longest_gap < 1000,
        qPrintable(
            QString("the GUI thread was blocked %1 ms of %2 ms").arg(longest_gap).arg(checked_ms)));
    QVERIFY(!page->progress_bar()->isVisible());
    const DatasetAnalysis& a = page->analysis();
    QCOMPARE(a.num_rows, std::uint64_t(20000));
    // Every row was built (no sample): the statistics are of the training share that trains,
    // 5 % held out as the run's split does (rounded up).
    QVERIFY(a.rows_checked);
    QCOMPARE(a.validation_rows, std::uint64_t(1000));
    QCOMPARE(a.training_rows, std::uint64_t(19000));
    QCOMPARE(a.measured, a.training_rows - a.training_bad_rows);
    std::uint64_t histogram_total = 0;
    for (std::uint64_t c : a.bin_counts) histogram_total += c;
    QCOMPARE(histogram_total, a.measured);
    QVERIFY2(
        page->truncation_label()->text().startsWith(
            QString("%1 training examples (every row but the validation share)").arg(a.measured)),
        qPrintable(page->truncation_label()->text()));

    // Another split is counted from the rows already built: no new tokenizing, no progress.
    progress_text.clear();
    tick.start();
    clock.restart();
    page->validation_split()->setValue(10);
    QVERIFY(page->busy());
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 30000);
    tick.stop();
    const qint64 recount_ms = clock.elapsed();
    QCOMPARE(page->analysis().validation_rows, std::uint64_t(2000));
    QCOMPARE(page->analysis().training_rows, std::uint64_t(18000));
    QVERIFY2(progress_text.isEmpty(), qPrintable(progress_text));
    QVERIFY2(recount_ms * 4 < checked_ms,
             qPrintable(QString("recount %1 ms, check %2 ms").arg(recount_ms).arg(checked_ms)));
    qInfo("20000 rows checked in %lld ms (longest GUI gap %lld ms); recounted in %lld ms",
          checked_ms, longest_gap, recount_ms);

    // A change while the rows are checked stops that check: the page shows the new settings'.
    page->max_length()->setValue(64);
    QTRY_VERIFY_WITH_TIMEOUT(page->progress_bar()->isVisible(), 30000);
    page->max_length()->setValue(48);
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 120000);
    QCOMPARE(page->analysis().max_length, std::int64_t(48));
    QVERIFY(page->analysis().rows_checked && !page->analysis().cancelled);
  }

  void packing_counts_the_training_share_as_the_run_does() {
    // 12 short documents: byte-level tokens, so the shares' token counts are small.
    QByteArray rows;
    for (int i = 0; i < 12; ++i)
      rows += "{\"text\":\"document " + QByteArray::number(i) + " says hi\"}\n";
    const QString file = path("short-texts.jsonl");
    write_file(file, rows);
    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    page->max_length()->setValue(16);
    page->validation_split()->setValue(25);  // 3 of the 12 rows held out
    page->choose_file(file);
    wait_for_analysis(page);
    const DatasetAnalysis& a = page->analysis();
    QCOMPARE(a.format, QString("text"));
    QVERIFY(a.packs);
    QCOMPARE(a.training_rows, std::uint64_t(9));
    QCOMPARE(a.validation_rows, std::uint64_t(3));
    const std::uint64_t training_tokens = a.good_tokens,
                        validation_tokens = a.validation_good_tokens;
    QVERIFY2(page->ready(), qPrintable(page->problem()));
    wizard.method_page()->set_steps(2);

    const QString cli = training_cli();
    if (cli.isEmpty()) QSKIP("this build's tessera-cli has no `run` (built without LibTorch)");
    // The run's own count of the training share's tokens: its 16-token blocks and the tail it
    // leaves out.
    {
      const auto [code, log] = run(cli, wizard.build_spec(), "packed-16");
      QVERIFY2(code == 0, qPrintable(log));
      const auto [blocks, validation_blocks] = logged_sequences(log);
      const auto tail = QRegularExpression("the last (\\d+) tokens did not fill").match(log);
      const std::uint64_t left_out = tail.hasMatch() ? tail.captured(1).toULongLong() : 0;
      QCOMPARE(std::uint64_t(blocks) * 16 + left_out, training_tokens);
      QCOMPARE(std::uint64_t(validation_blocks), validation_tokens / 16);
    }

    // One token more than the training share has: every row together would fill it, the
    // training share alone does not, and the run fails.
    QVERIFY(training_tokens + 1 < training_tokens + validation_tokens);
    page->max_length()->setValue(int(training_tokens + 1));
    wait_for_analysis(page);
    QVERIFY2(page->problem().startsWith(
                 QString("Lower the sequence length to %1 or less, or turn packing off: the "
                         "training rows' %1 tokens")
                     .arg(training_tokens)),
             qPrintable(page->problem()));
    QVERIFY(!wizard.next_button()->isEnabled());
    {
      const auto [code, log] = run(cli, wizard.build_spec(), "packed-train-short");
      QVERIFY2(code != 0 && log.contains("no training examples"), qPrintable(log));
    }

    // The validation share is packed apart: too few tokens there fail the run as well.
    page->max_length()->setValue(int(validation_tokens + 1));
    wait_for_analysis(page);
    QVERIFY2(page->problem().startsWith("Raise the validation split, lower the sequence length "
                                        "to " +
                                        QString::number(validation_tokens)),
             qPrintable(page->problem()));
    {
      const auto [code, log] = run(cli, wizard.build_spec(), "packed-validation-short");
      QVERIFY2(code != 0 && log.contains("no validation examples"), qPrintable(log));
    }
  }

  void truncation_counts_only_the_rows_that_train() {
    // 20 rows at 32 tokens: 3 answers longer than that (truncated, still trained on) and 2
    // prompts longer than that (no answer token left: skipped).
    QList<QByteArray> rows = demo_rows(20);
    for (int i : {1, 4, 7})
      rows[i] = "{\"instruction\":\"upper abc\",\"output\":\"" + QByteArray(50, 'A') + "\"}";
    for (int i : {2, 5})
      rows[i] = "{\"instruction\":\"first " + QByteArray(60, 'x') + "\",\"output\":\"x\"}";
    const QString file = path("long-rows.jsonl");
    write_file(file, rows.join('\n') + '\n');
    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    page->max_length()->setValue(32);
    page->validation_split()->setValue(0);
    page->choose_file(file);
    wait_for_analysis(page);
    const DatasetAnalysis& a = page->analysis();
    QCOMPARE(a.bad_rows, std::uint64_t(2));
    QCOMPARE(a.measured, std::uint64_t(18));
    QCOMPARE(a.truncated, std::uint64_t(3));
    const QString text = page->truncation_label()->text();
    QVERIFY2(text.startsWith("18 training examples (every row but the rows skipped)"),
             qPrintable(text));
    QVERIFY2(text.contains("16.7 % (3) are longer than 32 tokens and will be truncated"),
             qPrintable(text));
  }

  void learned_positions_block_only_what_fails() {
    const QString minilm = locate_minilm();
    if (!QFileInfo::exists(minilm + "/tokenizer.json"))
      QSKIP("MiniLM's tokenizer is not installed");
    const QString gpt2 = path("tiny-gpt2");
    QProcess python;
    python.setProcessChannelMode(QProcess::MergedChannels);
    python.start(TESSERA_PYTHON, {"-c", kMakeTinyGpt2, gpt2, minilm});
    QVERIFY2(python.waitForFinished(180000) && python.exitCode() == 0,
             qPrintable(QString::fromUtf8(python.readAll())));
    // Every row shorter than the 64 positions (WordPiece: a few tokens each).
    QList<QByteArray> rows = demo_rows(24);
    const QString short_rows = path("short-rows.jsonl");
    write_file(short_rows, rows.join('\n') + '\n');
    // One answer of 80 words: longer than the 64 positions, and trained on (truncated).
    QByteArray long_answer;
    for (int i = 0; i < 80; ++i) long_answer += "word ";
    rows[3] = "{\"instruction\":\"repeat\",\"output\":\"" + long_answer.trimmed() + "\"}";
    const QString long_row = path("one-long-row.jsonl");
    write_file(long_row, rows.join('\n') + '\n');

    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    wizard.model_page()->choose_folder(gpt2);
    QTRY_VERIFY_WITH_TIMEOUT(wizard.model_page()->ready(), 20000);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    page->max_length()->setValue(128);
    page->validation_split()->setValue(0);
    page->choose_file(short_rows);
    wait_for_analysis(page);
    const DatasetAnalysis& a = page->analysis();
    QCOMPARE(a.model_context, std::int64_t(64));
    QVERIFY(a.learned_positions);
    QCOMPARE(a.format, QString("instruction"));
    QVERIFY(a.longest_row > 0 && a.longest_row <= 64);
    QVERIFY2(wizard.missing().isEmpty(), qPrintable(wizard.missing().join("; ")));
    QVERIFY(page->context_label()->isVisible());
    const QString info = page->context_label()->text();
    QVERIFY2(info.startsWith("ℹ Sequence length 128 is above the model's context (gpt2 has 64 "
                             "positions), but no row is longer than " +
                             QString::number(a.longest_row) + " tokens"),
             qPrintable(info));
    screenshot(&wizard, "wizard-checks-6-learned-positions-unused");
    wizard.method_page()->set_steps(2);
    const QString cli = training_cli();
    if (!cli.isEmpty()) {
      const auto [code, log] = run(cli, wizard.build_spec(), "gpt2-short-rows");
      QVERIFY2(code == 0, qPrintable(log));
    }

    page->choose_file(long_row);
    wait_for_analysis(page);
    QVERIFY(page->analysis().longest_row > 64);
    const QString blocked = page->context_label()->text();
    QVERIFY2(blocked.startsWith("✘ Sequence length 128 is above the model's context: gpt2 has "
                                "64 positions, and 1 row is longer (the longest has " +
                                QString::number(page->analysis().longest_row) + " tokens)"),
             qPrintable(blocked));
    QCOMPARE(wizard.reason_label()->text(),
             QString("Lower the sequence length to 64 or less (the model's context)"));
    if (!cli.isEmpty()) {
      const auto [code, log] = run(cli, wizard.build_spec(), "gpt2-long-row");
      QVERIFY2(code != 0 && log.contains("n_positions"), qPrintable(log));
    }
    // Truncated to the context, the long row trains.
    QTest::mouseClick(page->fit_context_button(), Qt::LeftButton);
    wait_for_analysis(page);
    QVERIFY(!page->context_label()->isVisible());
    QVERIFY2(wizard.missing().isEmpty(), qPrintable(wizard.missing().join("; ")));
    if (!cli.isEmpty()) {
      const auto [code, log] = run(cli, wizard.build_spec(), "gpt2-long-row-64");
      QVERIFY2(code == 0, qPrintable(log));
    }

    // Packed text: every block is the sequence length, longer than the positions.
    QByteArray texts;
    for (int i = 0; i < 40; ++i)
      texts += "{\"text\":\"a few words of text number " + QByteArray::number(i) + "\"}\n";
    const QString text_file = path("texts.jsonl");
    write_file(text_file, texts);
    page->choose_file(text_file);
    page->max_length()->setValue(128);
    wait_for_analysis(page);
    QVERIFY(page->analysis().packs);
    QVERIFY(page->analysis().longest_row <= 64);
    QVERIFY2(page->context_label()->text().contains("packing makes every sequence 128 tokens long"),
             qPrintable(page->context_label()->text()));
    QVERIFY(!wizard.next_button()->isEnabled());
    if (!cli.isEmpty()) {
      const auto [code, log] = run(cli, wizard.build_spec(), "gpt2-packed");
      QVERIFY2(code != 0 && log.contains("n_positions"), qPrintable(log));
    }
  }

  void skipped_rows_are_counted_per_share_as_the_run_logs_them() {
    // 40 rows, 10 held out: a row that is not JSON, and rows without their output column
    // spread over the file, so both shares have some whatever the seed.
    QList<QByteArray> rows = demo_rows(41);
    for (int i : {0, 3, 8, 13, 17, 22, 26, 31, 35, 39})
      rows[i] = "{\"instruction\":\"first abcde\"}";
    rows[20] = "{\"instruction\":\"first abc\", \"output\":";
    const QString file = path("bad-rows-both-shares.jsonl");
    write_file(file, rows.join('\n') + '\n');

    FineTuneWizard wizard(&probe_);
    wizard.resize(1100, 760);
    wizard.show();
    choose_demo_model(wizard, demo_);
    wizard.go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = wizard.dataset_page();
    page->max_length()->setValue(32);
    page->validation_split()->setValue(25);
    page->choose_file(file);
    wait_for_analysis(page);
    QTest::mouseClick(page->skip_bad_rows_box(), Qt::LeftButton);
    wizard.method_page()->set_steps(2);
    const QString cli = training_cli();
    for (const std::uint64_t seed : {std::uint64_t(42), std::uint64_t(3)}) {
      auto training = wizard.method_page()->training_spec();
      training.seed = seed;
      wizard.method_page()->load_spec(wizard.method_page()->method_spec(), training,
                                      wizard.method_page()->precision());
      wait_for_analysis(page);
      const DatasetAnalysis& a = page->analysis();
      QCOMPARE(a.counted_seed, seed);
      QCOMPARE(a.unreadable_rows, std::uint64_t(1));
      QCOMPARE(a.validation_rows, std::uint64_t(10));  // of the 40 readable rows
      QCOMPARE(a.training_bad_rows + a.validation_bad_rows, std::uint64_t(10));
      QVERIFY(a.validation_bad_rows > 0 && a.training_bad_rows > 0);
      const QString where = QString(
                                "1 unreadable, %1 of the 30 training rows and %2 of the 10 "
                                "validation rows")
                                .arg(a.training_bad_rows)
                                .arg(a.validation_bad_rows);
      QCOMPARE(page->skipped_rows_text(), where);
      QVERIFY2(page->bad_rows_label()->text().startsWith("⚠ 11 rows will be skipped (" + where),
               qPrintable(page->bad_rows_label()->text()));
      QVERIFY2(wizard.missing().isEmpty(), qPrintable(wizard.missing().join("; ")));
      wizard.go_to(FineTuneWizard::ReviewStep);
      const QString data = wizard.review_page()->summary_value("Data");
      QVERIFY2(data.contains("11 rows that cannot be used will be skipped (" + where + ")"),
               qPrintable(data));
      wizard.go_to(FineTuneWizard::DatasetStep);
      if (cli.isEmpty()) continue;
      // The run's log says the same numbers.
      const auto [code, log] = run(cli, wizard.build_spec(), QString("shares-seed-%1").arg(seed));
      QVERIFY2(code == 0, qPrintable(log));
      QCOMPARE(logged_skips(log, "unreadable rows"), 1);
      QCOMPARE(logged_skips(log, "training rows"), int(a.training_bad_rows));
      QCOMPARE(logged_skips(log, "validation rows"), int(a.validation_bad_rows));
      QCOMPARE(logged_sequences(log),
               std::make_pair(int(a.good_rows), int(a.validation_good_rows)));
    }
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
