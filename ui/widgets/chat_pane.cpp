#include "ui/widgets/chat_pane.h"

#include <QCheckBox>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QRandomGenerator>
#include <QSpinBox>
#include <QTextCursor>
#include <QVBoxLayout>

#include "ui/models/base_model.h"

namespace tessera::ui {

namespace {

// The model has a chat template when tokenizer_config.json carries one or a
// chat_template.jinja file sits next to it (as transformers saves them).
bool has_chat_template(const QString& model_dir) {
  const QDir dir(model_dir);
  if (QFileInfo::exists(dir.filePath("chat_template.jinja"))) return true;
  QFile config(dir.filePath("tokenizer_config.json"));
  if (!config.open(QIODevice::ReadOnly) || config.size() > (64 << 20)) return false;
  return QJsonDocument::fromJson(config.readAll()).object().contains("chat_template");
}

bool has_printable_text(const QString& text) {
  for (QChar c : text)
    if (c.isPrint() && !c.isSpace()) return true;
  return false;
}

// Why a reply shows nothing or shows U+FFFD, from generate's final JSON object; "" when the
// reply is ordinary text.
QString explain_reply(const QJsonObject& result) {
  const QJsonArray ids = result.value("generated_ids").toArray();
  const QString text = result.value("text").toString();
  const bool at_eos = result.value("stop_reason").toString() == "eos";
  if (ids.isEmpty())
    return result.value("max_new_tokens").toInteger() == 0
               ? ChatPane::tr("The model stopped at once (max new tokens is 0?).")
               : ChatPane::tr("The model stopped at once, without a token.");
  if (!has_printable_text(text)) {
    if (ids.size() == 1 && at_eos) {
      const QString token = result.value("tokens").toArray().at(0).toString();
      return ChatPane::tr(
                 "The model produced only the end-of-turn token %1: it answered with "
                 "an empty reply.")
          .arg(token.isEmpty() ? QString::number(ids.at(0).toInteger()) : token);
    }
    QStringList listed;
    for (qsizetype i = 0; i < ids.size() && i < 16; ++i)
      listed << QString::number(ids.at(i).toInteger());
    if (ids.size() > 16) listed << QStringLiteral("…");
    return ChatPane::tr("The reply is %n token(s) that decode to no printable text (ids %1).",
                        nullptr, int(ids.size()))
        .arg(listed.join(", "));
  }
  const int invalid = result.value("replacement_chars").toInt();
  if (text.endsWith(QChar(0xFFFD))) {
    QString note = at_eos ? ChatPane::tr(
                                "The reply ended mid-character (invalid UTF-8): the "
                                "model stopped before the last character's bytes were "
                                "complete.")
                          : ChatPane::tr(
                                "The reply ended mid-character (invalid UTF-8): max new "
                                "tokens cut the last character's bytes short. Allow "
                                "more new tokens.");
    if (invalid > 1)
      note += ' ' + ChatPane::tr(
                        "%n more place(s) where the bytes do not form a character are "
                        "shown as �.",
                        nullptr, invalid - 1);
    return note;
  }
  if (invalid > 0)
    return ChatPane::tr(
        "The reply is not all valid UTF-8: %n place(s) where the model's bytes do "
        "not form a character are shown as �.",
        nullptr, invalid);
  return {};
}

}  // namespace

ChatPane::ChatPane(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  model_label_ = new QLabel(tr("Open a completed run and press “Try it”."));
  model_label_->setWordWrap(true);
  model_label_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(model_label_);
  auto* columns = new QHBoxLayout;
  for (Column* column : {&tuned_, &base_}) {
    auto* box = new QVBoxLayout;
    column->title = new QLabel;
    column->title->setWordWrap(true);
    column->title->setTextInteractionFlags(Qt::TextSelectableByMouse);
    column->transcript = new QPlainTextEdit;
    column->transcript->setReadOnly(true);
    box->addWidget(column->title);
    box->addWidget(column->transcript, 1);
    columns->addLayout(box, 1);
  }
  tuned_.transcript->setPlaceholderText(tr("The conversation appears here."));
  tuned_.transcript->setAccessibleName(tr("Conversation with the fine-tuned model"));
  base_.transcript->setAccessibleName(tr("Conversation with the base model"));
  layout->addLayout(columns, 1);
  auto* options = new QHBoxLayout;
  max_new_tokens_ = new QSpinBox;
  max_new_tokens_->setRange(1, 4096);
  max_new_tokens_->setValue(64);
  max_new_tokens_->setToolTip(tr("The longest reply, in tokens"));
  auto* max_label = new QLabel(tr("&Max new tokens:"));
  max_label->setBuddy(max_new_tokens_);
  greedy_ = new QCheckBox(tr("&Greedy (always the most likely token)"));
  greedy_->setToolTip(
      tr("On: the same prompt always gets the same reply, so the base and "
         "fine-tuned answers can be compared. Off: sample with the model's "
         "generation settings"));
  greedy_->setChecked(true);
  compare_ = new QCheckBox(tr("Compare with the &base model"));
  options->addWidget(max_label);
  options->addWidget(max_new_tokens_);
  options->addWidget(greedy_);
  options->addWidget(compare_);
  options->addStretch(1);
  layout->addLayout(options);
  auto* row = new QHBoxLayout;
  prompt_ = new QLineEdit;
  prompt_->setPlaceholderText(tr("Type a message and press Enter"));
  prompt_->setAccessibleName(tr("Message"));
  send_ = new QPushButton(tr("&Send"));
  cancel_ = new QPushButton(tr("Stop"));
  row->addWidget(prompt_, 1);
  row->addWidget(send_);
  row->addWidget(cancel_);
  layout->addLayout(row);
  connect(send_, &QPushButton::clicked, this, [this] { send(prompt_->text()); });
  connect(prompt_, &QLineEdit::returnPressed, this, [this] { send(prompt_->text()); });
  connect(cancel_, &QPushButton::clicked, this, &ChatPane::cancel);
  connect(compare_, &QCheckBox::toggled, this, [this](bool on) {
    base_.title->setVisible(on);
    base_.transcript->setVisible(on);
  });
  base_.title->hide();
  base_.transcript->hide();
  update_buttons();
}

ChatPane::~ChatPane() {
  drop_children();
}

// Ends a reply's children without a word in the transcript (it is about to be cleared).
void ChatPane::drop_children() {
  for (Column* column : {&tuned_, &base_}) {
    QProcess* p = column->process;
    if (p && p->state() != QProcess::NotRunning) {
      p->disconnect(this);
      p->kill();
      p->waitForFinished(2000);
    }
  }
  prompt_text_.clear();
}

bool ChatPane::busy() const {
  for (const Column* column : {&tuned_, &base_})
    if (column->process && column->process->state() != QProcess::NotRunning) return true;
  return !prompt_text_.isEmpty();  // between the fine-tuned reply and the base model's start
}

void ChatPane::set_run(const RunRecord& run, const QString& cli) {
  drop_children();
  cli_ = cli;
  tuned_.model_dir = QDir(run.output_dir).filePath("model");
  tuned_.chat_template = has_chat_template(tuned_.model_dir);
  QString base_name;
  base_problem_.clear();
  base_.model_dir = base_model_folder(run, &base_name, &base_problem_);
  base_.chat_template = !base_.model_dir.isEmpty() && has_chat_template(base_.model_dir);

  QString text = tr("Model: %1").arg(QDir::toNativeSeparators(tuned_.model_dir));
  if (run.method == "lora") text += tr(" (the base model with this run's LoRA adapter merged)");
  text += "\n" + (tuned_.chat_template ? tr("Prompts go through the model's chat template.")
                                       : tr("This model has no chat template: the prompt is "
                                            "continued as plain text."));
  model_label_->setText(text);
  const QString run_name = run.name.isEmpty() ? QFileInfo(run.output_dir).fileName() : run.name;
  tuned_.title->setText(tr("Fine-tuned: %1").arg(run_name));
  tuned_.title->setToolTip(QDir::toNativeSeparators(tuned_.model_dir));
  if (base_.model_dir.isEmpty()) {
    base_.title->setText(tr("Base model"));
    compare_->setChecked(false);
    compare_->setEnabled(false);
    compare_->setToolTip(base_problem_);
  } else {
    QString title = tr("Base: %1").arg(base_name);
    if (tuned_.chat_template && !base_.chat_template)
      title += tr(" (no chat template: the prompt is continued as plain text)");
    base_.title->setText(title);
    base_.title->setToolTip(QDir::toNativeSeparators(base_.model_dir));
    compare_->setEnabled(true);
    compare_->setToolTip(tr("Ask %1 too, with the same prompt and settings, and show its answer "
                            "beside the fine-tuned one")
                             .arg(QDir::toNativeSeparators(base_.model_dir)));
  }
  for (Column* column : {&tuned_, &base_}) {
    column->transcript->clear();
    column->reply.clear();
    column->error.clear();
    column->note.clear();
  }
  update_buttons();
}

void ChatPane::send(const QString& prompt) {
  if (busy() || tuned_.model_dir.isEmpty() || prompt.trimmed().isEmpty()) return;
  prompt_text_ = prompt;
  ok_so_far_ = true;
  cancelled_ = false;
  // Sampled replies of both models draw from the same seed, so a comparison can be repeated.
  seed_ = greedy_->isChecked() ? -1 : QRandomGenerator::global()->bounded(qint64(1) << 31);
  for (Column* column : {&tuned_, &base_}) {
    column->reply.clear();
    column->error.clear();
    column->note.clear();
  }
  prompt_->clear();
  start(tuned_, prompt);
}

void ChatPane::start(Column& column, const QString& prompt) {
  column.transcript->appendPlainText(tr("You: %1").arg(prompt));
  column.transcript->appendPlainText(tr("Model: "));
  QTextCursor end(column.transcript->document());
  end.movePosition(QTextCursor::End);
  column.reply_start = end.position();
  column.pending.clear();
  column.streamed.clear();
  column.got_result = false;
  if (!QFileInfo(column.model_dir).isDir()) {
    show_problem(column,
                 tr("The model folder %1 does not exist: the run's files were moved or deleted. "
                    "Run the fine-tune again, or open a run whose folder is still there.")
                     .arg(QDir::toNativeSeparators(column.model_dir)),
                 &Column::error);
    on_finished(column, -1, QProcess::NormalExit);
    return;
  }
  QStringList args = {"generate",
                      "--model",
                      column.model_dir,
                      "--prompt",
                      prompt,
                      "--max-new-tokens",
                      QString::number(max_new_tokens_->value()),
                      "--json-lines"};
  if (tuned_.chat_template && column.chat_template) args << "--chat";
  if (seed_ < 0)
    args << "--greedy";
  else
    args << "--seed" << QString::number(seed_);
  if (column.process) column.process->deleteLater();
  column.process = new QProcess(this);
  Column* c = &column;
  connect(column.process, &QProcess::readyReadStandardOutput, this, [this, c] { on_stdout(*c); });
  connect(column.process, &QProcess::finished, this,
          [this, c](int code, QProcess::ExitStatus status) { on_finished(*c, code, status); });
  connect(column.process, &QProcess::errorOccurred, this, [this, c](QProcess::ProcessError e) {
    if (e != QProcess::FailedToStart) return;
    show_problem(*c,
                 tr("Could not start %1 (%2). Set the path of tessera-cli in Settings.")
                     .arg(QDir::toNativeSeparators(cli_), c->process->errorString()),
                 &Column::error);
    on_finished(*c, -1, QProcess::NormalExit);
  });
  column.process->start(cli_, args);
  update_buttons();
}

void ChatPane::cancel() {
  if (!busy()) return;
  cancelled_ = true;
  for (Column* column : {&tuned_, &base_})
    if (column->process && column->process->state() != QProcess::NotRunning)
      column->process->kill();
}

void ChatPane::on_stdout(Column& column) {
  column.pending += column.process->readAllStandardOutput();
  qsizetype newline = -1;
  while ((newline = column.pending.indexOf('\n')) >= 0) {
    const QByteArray line = column.pending.left(newline);
    column.pending.remove(0, newline + 1);
    if (!line.trimmed().isEmpty()) on_line(column, line);
  }
}

void ChatPane::on_line(Column& column, const QByteArray& line) {
  const QJsonObject object = QJsonDocument::fromJson(line).object();
  QTextCursor cursor(column.transcript->document());
  cursor.movePosition(QTextCursor::End);
  if (!object.contains("generated_ids")) {  // a piece of the reply, never part of a character
    const QString piece = object.value("text").toString();
    column.streamed += piece;
    cursor.insertText(piece);
    column.transcript->ensureCursorVisible();
    return;
  }
  // The result: its text is the tokenizer's decode of every generated id. The pieces add up to
  // it; should they not, the transcript shows the decode.
  column.got_result = true;
  const QString text = object.value("text").toString();
  if (text != column.streamed) {
    cursor.setPosition(column.reply_start, QTextCursor::KeepAnchor);
    cursor.insertText(text);
  }
  column.reply = text.trimmed();
  const QString note = explain_reply(object);
  if (!note.isEmpty()) show_problem(column, note, &Column::note);
}

void ChatPane::on_finished(Column& column, int code, QProcess::ExitStatus status) {
  if (column.process && column.process->state() == QProcess::NotRunning &&
      column.process->bytesAvailable() > 0)
    on_stdout(column);
  const bool started = code != -1 || status != QProcess::NormalExit;
  if (started && column.error.isEmpty()) {
    if (cancelled_) {
      show_problem(column, tr("Stopped."), &Column::error);
    } else if (status == QProcess::CrashExit) {
      show_problem(column, tr("Generation ended before it finished (the process crashed)."),
                   &Column::error);
    } else if (code != 0) {
      const QString err = QString::fromUtf8(column.process->readAllStandardError()).trimmed();
      show_problem(
          column,
          tr("Generation failed: %1").arg(err.isEmpty() ? tr("exit code %1").arg(code) : err),
          &Column::error);
    } else if (!column.got_result) {
      show_problem(column, tr("Generation ended without its result: update tessera-cli."),
                   &Column::error);
    }
  }
  if (!column.error.isEmpty()) ok_so_far_ = false;
  if (&column == &tuned_ && compare_->isChecked() && !base_.model_dir.isEmpty() && !cancelled_) {
    start(base_, prompt_text_);
    return;
  }
  finish_message();
}

void ChatPane::finish_message() {
  prompt_text_.clear();
  update_buttons();
  Q_EMIT replyFinished(ok_so_far_);
}

void ChatPane::show_problem(Column& column, const QString& text, QString Column::*field) {
  column.*field = text;
  column.transcript->appendPlainText(tr("[%1]").arg(text));
  column.transcript->ensureCursorVisible();
}

void ChatPane::update_buttons() {
  const bool ready = !tuned_.model_dir.isEmpty();
  send_->setEnabled(ready && !busy());
  prompt_->setEnabled(ready);
  cancel_->setEnabled(busy());
}

}  // namespace tessera::ui
