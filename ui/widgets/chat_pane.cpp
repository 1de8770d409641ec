#include "ui/widgets/chat_pane.h"

#include <QCheckBox>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QTextCursor>
#include <QVBoxLayout>

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

}  // namespace

ChatPane::ChatPane(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  model_label_ = new QLabel(tr("Open a completed run and press “Try it”."));
  model_label_->setWordWrap(true);
  model_label_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(model_label_);
  transcript_ = new QPlainTextEdit;
  transcript_->setReadOnly(true);
  transcript_->setPlaceholderText(tr("The conversation appears here."));
  transcript_->setAccessibleName(tr("Conversation"));
  layout->addWidget(transcript_, 1);
  auto* options = new QHBoxLayout;
  max_new_tokens_ = new QSpinBox;
  max_new_tokens_->setRange(1, 4096);
  max_new_tokens_->setValue(64);
  max_new_tokens_->setToolTip(tr("The longest reply, in tokens"));
  auto* max_label = new QLabel(tr("&Max new tokens:"));
  max_label->setBuddy(max_new_tokens_);
  greedy_ = new QCheckBox(tr("&Greedy (always the most likely token)"));
  greedy_->setToolTip(tr("Off: sample with the model's generation settings"));
  options->addWidget(max_label);
  options->addWidget(max_new_tokens_);
  options->addWidget(greedy_);
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
  update_buttons();
}

ChatPane::~ChatPane() {
  if (process_ && process_->state() != QProcess::NotRunning) {
    process_->disconnect(this);
    process_->kill();
    process_->waitForFinished(2000);
  }
}

void ChatPane::set_run(const RunRecord& run, const QString& cli) {
  cancel();
  cli_ = cli;
  model_dir_ = QDir(run.output_dir).filePath("model");
  chat_template_ = has_chat_template(model_dir_);
  QString text = tr("Model: %1").arg(QDir::toNativeSeparators(model_dir_));
  if (run.method == "lora") text += tr(" (the base model with this run's LoRA adapter merged)");
  text += "\n" + (chat_template_ ? tr("Prompts go through the model's chat template.")
                                 : tr("This model has no chat template: the prompt is continued "
                                      "as plain text."));
  model_label_->setText(text);
  transcript_->clear();
  reply_.clear();
  error_.clear();
  update_buttons();
}

void ChatPane::send(const QString& prompt) {
  if (busy() || model_dir_.isEmpty() || prompt.trimmed().isEmpty()) return;
  reply_.clear();
  error_.clear();
  decoder_.resetState();
  transcript_->appendPlainText(tr("You: %1").arg(prompt));
  transcript_->appendPlainText(tr("Model: "));
  prompt_->clear();
  QStringList args = {"generate",
                      "--model",
                      model_dir_,
                      "--prompt",
                      prompt,
                      "--max-new-tokens",
                      QString::number(max_new_tokens_->value())};
  if (chat_template_) args << "--chat";
  if (greedy_->isChecked()) args << "--greedy";
  if (process_) process_->deleteLater();
  process_ = new QProcess(this);
  connect(process_, &QProcess::readyReadStandardOutput, this, &ChatPane::on_stdout);
  connect(process_, &QProcess::finished, this, &ChatPane::on_finished);
  connect(process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError e) {
    if (e != QProcess::FailedToStart) return;
    error_ = tr("could not start %1: %2").arg(cli_, process_->errorString());
    transcript_->appendPlainText(tr("[%1]").arg(error_));
    update_buttons();
    Q_EMIT replyFinished(false);
  });
  process_->start(cli_, args);
  update_buttons();
}

void ChatPane::cancel() {
  if (busy()) process_->kill();
}

void ChatPane::on_stdout() {
  // Tokens arrive as they are generated; a UTF-8 sequence may be split between reads.
  const QString text = decoder_.decode(process_->readAllStandardOutput());
  if (text.isEmpty()) return;
  reply_ += text;
  QTextCursor cursor(transcript_->document());
  cursor.movePosition(QTextCursor::End);
  cursor.insertText(text);
  transcript_->ensureCursorVisible();
}

void ChatPane::on_finished(int code, QProcess::ExitStatus status) {
  on_stdout();
  reply_ = reply_.trimmed();
  const bool ok = status == QProcess::NormalExit && code == 0;
  if (!ok) {
    const QString err = QString::fromUtf8(process_->readAllStandardError()).trimmed();
    error_ = status == QProcess::CrashExit ? tr("generation was stopped or crashed")
                                           : (err.isEmpty() ? tr("exit code %1").arg(code) : err);
    transcript_->appendPlainText(tr("[%1]").arg(error_));
  }
  update_buttons();
  Q_EMIT replyFinished(ok);
}

void ChatPane::update_buttons() {
  const bool ready = !model_dir_.isEmpty();
  send_->setEnabled(ready && !busy());
  prompt_->setEnabled(ready);
  cancel_->setEnabled(busy());
}

}  // namespace tessera::ui
