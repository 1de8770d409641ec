#pragma once
// "Try it": a chat pane on a finished run's model. Each prompt runs `tessera-cli generate
// --model <run>/model [--chat] --prompt … --json-lines` in a child process; the reply streams
// from its {"text": …} lines and ends as the final object's text (the tokenizer's decode of the
// generated ids). A reply that is empty or not valid UTF-8 is explained from that object's ids
// and stop reason. "Compare with the base model" runs the same prompt and settings on the
// run's base model (job spec model.path, or the Hub snapshot of model.hub_id in the cache)
// after the fine-tuned one, in a second column. The pane names exactly which folders are loaded.
#include <QProcess>
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
  // Ignored while a reply is streaming. With "Compare" checked the base model answers after
  // the fine-tuned one; replyFinished comes once both have.
  void send(const QString& prompt);
  void cancel();
  bool busy() const;
  const QString& model_folder() const { return tuned_.model_dir; }
  const QString& base_folder() const { return base_.model_dir; }
  bool chat_mode() const { return tuned_.chat_template; }  // --chat (the model has a template)
  // The --seed of the last sampled message (both models get it), -1 after a greedy one.
  qint64 last_seed() const { return seed_; }

  // The last reply of the fine-tuned model (trimmed), what went wrong (in words, with what to
  // do) and the explanation of an empty or invalid reply; the same for the base model.
  const QString& last_reply() const { return tuned_.reply; }
  const QString& last_error() const { return tuned_.error; }
  const QString& last_note() const { return tuned_.note; }
  const QString& last_base_reply() const { return base_.reply; }
  const QString& last_base_error() const { return base_.error; }
  const QString& last_base_note() const { return base_.note; }

  QLabel* model_label() const { return model_label_; }
  QLabel* tuned_title() const { return tuned_.title; }
  QLabel* base_title() const { return base_.title; }
  QPlainTextEdit* transcript() const { return tuned_.transcript; }
  QPlainTextEdit* base_transcript() const { return base_.transcript; }
  QLineEdit* prompt_edit() const { return prompt_; }
  QPushButton* send_button() const { return send_; }
  QSpinBox* max_new_tokens() const { return max_new_tokens_; }
  QCheckBox* greedy() const { return greedy_; }
  QCheckBox* compare() const { return compare_; }

 Q_SIGNALS:
  void replyFinished(bool ok);

 private:
  // One model's side of the conversation and its generate child.
  struct Column {
    QString model_dir;
    bool chat_template = false;
    QLabel* title = nullptr;
    QPlainTextEdit* transcript = nullptr;
    QProcess* process = nullptr;
    QByteArray pending;    // stdout after the last complete line
    int reply_start = -1;  // where this reply begins in the transcript
    QString streamed;      // the text pieces so far
    bool got_result = false;
    QString reply, error, note;
  };

  void start(Column& column, const QString& prompt);
  void on_stdout(Column& column);
  void on_line(Column& column, const QByteArray& line);
  void on_finished(Column& column, int code, QProcess::ExitStatus status);
  void finish_message();
  void drop_children();
  void show_problem(Column& column, const QString& text, QString Column::*field);
  void update_buttons();

  QString cli_;
  QString prompt_text_;   // the message being answered
  QString base_problem_;  // why there is no base model to compare with ("" when there is)
  bool cancelled_ = false;
  qint64 seed_ = -1;
  bool ok_so_far_ = true;
  Column tuned_, base_;
  QLabel* model_label_;
  QLineEdit* prompt_;
  QPushButton* send_;
  QPushButton* cancel_;
  QSpinBox* max_new_tokens_;
  QCheckBox* greedy_;
  QCheckBox* compare_;
};

}  // namespace tessera::ui
