// "Try it" (ui/widgets/chat_pane.*) against real `tessera-cli generate` children: an empty
// reply explained from the ids (a demo model whose lm_head makes the EOS token win at once), a
// reply ending mid-character explained, the base model's answer beside the fine-tuned one
// (each equal to what `generate` prints for its folder), and errors in words for a missing
// model folder and a folder generate cannot load.
#include <QCheckBox>
#include <QDir>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QPlainTextEdit>
#include <QProcess>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTemporaryDir>
#include <QTest>

#include "tests/ui/studio_fixture.h"
#include "ui/models/runs_db.h"
#include "ui/widgets/chat_pane.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;

namespace {

const QString kPrompt = "first kiwo";
constexpr int kNewTokens = 8;

// argv: source folder, destination, how. Copies the demo model and changes its lm_head:
//   eos_first: the EOS row is three times the row of the token the base model picks first
//              (argv[4]), so that its logit wins at the first step: the reply is only EOS;
//   shifted:   the byte rows moved by one, so the model answers differently from the base.
const char* kEditHead = R"(
import shutil, sys
from safetensors.torch import load_file, save_file
src, dst, how = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.copytree(src, dst)
w = load_file(dst + "/model.safetensors")
head = w["lm_head.weight"].clone()
if how == "eos_first":
    head[257] = 3 * head[int(sys.argv[4])]
else:
    head[:256] = head[:256].roll(1, 0)
w["lm_head.weight"] = head
save_file(w, dst + "/model.safetensors", metadata={"format": "pt"})
)";

}  // namespace

class TryItTest : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;
  QString cli_, base_;

  // `tessera-cli generate` as the pane runs it (chat template; greedy unless `sampling` gives a
  // seed), --json's object.
  QJsonObject reference(const QString& model_dir, const QStringList& sampling = {"--greedy"}) {
    QProcess p;
    p.start(cli_, QStringList{"generate", "--model", model_dir, "--prompt", kPrompt, "--chat",
                              "--max-new-tokens", QString::number(kNewTokens), "--json"} +
                      sampling);
    if (!p.waitForFinished(120000) || p.exitCode() != 0) {
      qWarning() << p.readAllStandardError();
      return {};
    }
    return QJsonDocument::fromJson(p.readAllStandardOutput()).object();
  }

  bool edit_head(const QString& dst, const QString& how, const QString& arg = {}) {
    QProcess p;
    QStringList args = {"-c", kEditHead, base_, dst, how};
    if (!arg.isEmpty()) args << arg;
    p.start(TESSERA_PYTHON, args);
    if (!p.waitForFinished(180000) || p.exitCode() != 0) {
      qWarning() << p.readAllStandardError();
      return false;
    }
    return true;
  }

  // A finished run in `name` whose RUN/model is `model` (nothing when empty) and whose job
  // spec names the demo's base model.
  RunRecord run_with(const QString& name, const QString& model) {
    RunRecord run;
    run.id = name;
    run.name = name;
    run.method = "full";
    run.status = "completed";
    run.output_dir = tmp_.filePath("runs/" + name);
    QDir().mkpath(run.output_dir);
    if (!model.isEmpty()) QDir().rename(model, QDir(run.output_dir).filePath("model"));
    run.spec_json = QJsonDocument(QJsonObject{{"model", QJsonObject{{"path", base_}}}}).toJson();
    return run;
  }

  static bool ask(ChatPane& pane, const QString& prompt) {
    QSignalSpy replied(&pane, &ChatPane::replyFinished);
    pane.max_new_tokens()->setValue(kNewTokens);
    pane.send(prompt);
    // A reply that cannot start (no model folder) finishes inside send(): waiting for another
    // signal would only time out.
    if (replied.isEmpty() && !replied.wait(180000)) return false;
    return replied.first().first().toBool();
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    isolate_settings(tmp_.path());
    cli_ = training_cli();
    if (cli_.isEmpty()) QSKIP("tessera-cli here cannot generate (no `run`: a torch-free build)");
    const QString demo = tmp_.filePath("demo");
    const QString error = make_demo(cli_, demo);
    QVERIFY2(error.isEmpty(), qPrintable(error));
    base_ = QDir(demo).filePath("base");
  }

  // A model whose first token is EOS: the reply is empty and the pane says why.
  void empty_reply_is_explained() {
    const QJsonObject base = reference(base_);
    QVERIFY(!base.isEmpty());
    const QString first = QString::number(base["generated_ids"].toArray().at(0).toInteger());
    QVERIFY(edit_head(tmp_.filePath("eos_first"), "eos_first", first));
    const RunRecord run = run_with("eos-first", tmp_.filePath("eos_first"));
    const QJsonObject expected = reference(QDir(run.output_dir).filePath("model"));
    QVERIFY(expected["generated_ids"].toArray() == QJsonArray{257});
    QCOMPARE(expected["stop_reason"].toString(), "eos");

    ChatPane pane;
    pane.set_run(run, cli_);
    QVERIFY(pane.greedy()->isChecked());  // greedy by default: replies are reproducible
    QVERIFY(ask(pane, kPrompt));
    QCOMPARE(pane.last_reply(), QString());
    QVERIFY2(pane.last_note().contains("only the end-of-turn token <|eos|>"),
             qPrintable(pane.last_note()));
    QVERIFY(pane.transcript()->toPlainText().contains(pane.last_note()));
    QVERIFY(pane.last_error().isEmpty());
  }

  // The base model's answer beside the fine-tuned one, each what generate prints for its
  // folder; the demo base's 8 tokens end inside a character, which the pane explains.
  void base_and_fine_tuned_side_by_side() {
    QVERIFY(edit_head(tmp_.filePath("shifted"), "shifted"));
    const RunRecord run = run_with("shifted", tmp_.filePath("shifted"));
    const QString model_dir = QDir(run.output_dir).filePath("model");
    const QJsonObject tuned = reference(model_dir);
    const QJsonObject base = reference(base_);
    QVERIFY(!tuned.isEmpty() && !base.isEmpty());
    QVERIFY(tuned["generated_ids"] != base["generated_ids"]);

    ChatPane pane;
    pane.resize(1000, 600);
    pane.show();
    pane.set_run(run, cli_);
    QCOMPARE(pane.base_folder(), QFileInfo(base_).absoluteFilePath());
    QVERIFY(pane.compare()->isEnabled());
    QVERIFY(!pane.base_transcript()->isVisible());
    pane.compare()->setChecked(true);
    QVERIFY(pane.base_transcript()->isVisible());
    QCOMPARE(pane.tuned_title()->text(), "Fine-tuned: shifted");
    QCOMPARE(pane.base_title()->text(), "Base: base");
    QVERIFY(ask(pane, kPrompt));
    QCOMPARE(pane.last_reply(), tuned["text"].toString().trimmed());
    QCOMPARE(pane.last_base_reply(), base["text"].toString().trimmed());
    QVERIFY(pane.last_reply() != pane.last_base_reply());
    QVERIFY(pane.transcript()->toPlainText().contains("Model: " + pane.last_reply()));
    QVERIFY(pane.base_transcript()->toPlainText().contains("You: " + kPrompt));
    QVERIFY(pane.base_transcript()->toPlainText().contains("Model: " + pane.last_base_reply()));

    // The base's reply: random bytes cut off by max new tokens inside a character.
    QCOMPARE(base["stop_reason"].toString(), "max_new_tokens");
    QVERIFY(base["text"].toString().endsWith(QChar(0xFFFD)));
    QVERIFY2(pane.last_base_note().contains("ended mid-character (invalid UTF-8)"),
             qPrintable(pane.last_base_note()));
    screenshot(&pane, "try-it-compare");
  }

  // Sampled: both models get the message's seed, and each reply is what generate gives for it.
  void sampled_replies_share_a_seed() {
    QVERIFY(edit_head(tmp_.filePath("sampled"), "shifted"));
    const RunRecord run = run_with("sampled", tmp_.filePath("sampled"));
    ChatPane pane;
    pane.set_run(run, cli_);
    pane.greedy()->setChecked(false);
    pane.compare()->setChecked(true);
    QVERIFY(ask(pane, kPrompt));
    QVERIFY(pane.last_seed() >= 0);
    const QStringList seed = {"--seed", QString::number(pane.last_seed())};
    QCOMPARE(pane.last_reply(),
             reference(QDir(run.output_dir).filePath("model"), seed)["text"].toString().trimmed());
    QCOMPARE(pane.last_base_reply(), reference(base_, seed)["text"].toString().trimmed());
  }

  void missing_model_folder_in_words() {
    const RunRecord run = run_with("no-model", {});
    ChatPane pane;
    pane.set_run(run, cli_);
    QVERIFY(!ask(pane, kPrompt));
    const QString folder = QDir::toNativeSeparators(QDir(run.output_dir).filePath("model"));
    QVERIFY2(pane.last_error().contains("The model folder " + folder + " does not exist"),
             qPrintable(pane.last_error()));
    QVERIFY(pane.last_error().contains("Run the fine-tune again"));
    QVERIFY(pane.transcript()->toPlainText().contains(pane.last_error()));
    QVERIFY(!pane.busy());
  }

  void generate_failure_in_words() {
    const RunRecord run = run_with("empty-model", {});
    QDir().mkpath(QDir(run.output_dir).filePath("model"));
    ChatPane pane;
    pane.set_run(run, cli_);
    QVERIFY(!ask(pane, kPrompt));
    QVERIFY2(pane.last_error().startsWith("Generation failed: ") &&
                 pane.last_error().contains("tokenizer.json"),
             qPrintable(pane.last_error()));
    QVERIFY(pane.transcript()->toPlainText().contains(pane.last_error()));
  }
};

QTEST_MAIN(TryItTest)
#include "test_try_it.moc"
