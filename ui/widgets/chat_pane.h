#pragma once
// "Try it": a chat pane on a finished run's model. Each prompt runs `tessera-cli generate
// --model <run>/model [--chat] --prompt …` in a child process and the reply is shown as it
// streams from the child's stdout. The pane names exactly which folder is loaded.
#include <QProcess>
#include <QStringDecoder>
#include <QWidget>

#include "ui/models/runs_db.h"

class QCheckBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QPushButton;
class QSpinBox;

namespace tessera::ui {

class ChatPane : public QWidget {
  Q_OBJECT
 public:
  explicit ChatPane(QWidget* parent = nullptr);
  ~ChatPane() override;

  void set_run(const RunRecord& run, const QString& cli);
  void send(const QString& prompt);  // ignored while a reply is streaming
  void cancel();
  bool busy() const { return process_ && process_->state() != QProcess::NotRunning; }
  const QString& model_folder() const { return model_dir_; }
  bool chat_mode() const { return chat_template_; }  // --chat (the model has a chat template)
  const QString& last_reply() const { return reply_; }
  const QString& last_error() const { return error_; }

  QLabel* model_label() const { return model_label_; }
  QPlainTextEdit* transcript() const { return transcript_; }
  QLineEdit* prompt_edit() const { return prompt_; }
  QPushButton* send_button() const { return send_; }
  QSpinBox* max_new_tokens() const { return max_new_tokens_; }
  QCheckBox* greedy() const { return greedy_; }

 Q_SIGNALS:
  void replyFinished(bool ok);

 private:
  void on_stdout();
  void on_finished(int code, QProcess::ExitStatus status);
  void update_buttons();

  QString cli_;
  QString model_dir_;
  bool chat_template_ = false;
  QLabel* model_label_;
  QPlainTextEdit* transcript_;
  QLineEdit* prompt_;
  QPushButton* send_;
  QPushButton* cancel_;
  QSpinBox* max_new_tokens_;
  QCheckBox* greedy_;
  QProcess* process_ = nullptr;
  QStringDecoder decoder_{QStringDecoder::Utf8};
  QString reply_;
  QString error_;
};

}  // namespace tessera::ui
