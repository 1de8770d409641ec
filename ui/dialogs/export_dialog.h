#pragma once
// Exporting a finished run: the full model as a HuggingFace folder (the run's model/ written
// again in a chosen dtype by `tessera-cli export`), or for LoRA runs the merged model or the
// LoRA adapter (adapter/ copied, PEFT format); or the model as one GGUF file for llama.cpp,
// Ollama and LM Studio (`tessera-cli export --format gguf`, offered for the families that have a
// GGUF naming). It measures the size, and checks the destination by writing there (a worker
// thread: ui/utility/folder_check.h) for the reason it cannot be written, the free space, and an
// earlier export it would replace; then it works in a child process or a pool thread with
// progress. The GUI never waits: Export stays off until the destination's answer is in.
#include <QDialog>
#include <QFutureWatcher>
#include <QProcess>
#include <QStringList>
#include <QTimer>

#include "ui/models/runs_db.h"
#include "ui/utility/folder_check.h"

class QComboBox;
class QFormLayout;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;

namespace tessera::ui {

class ExportDialog : public QDialog {
  Q_OBJECT
 public:
  enum Kind { FullModel, MergedModel, LoraAdapter, Gguf };
  ExportDialog(RunRecord run, QString cli, QWidget* parent = nullptr);
  ~ExportDialog() override;

  QList<Kind> kinds() const;  // what this run offers
  void set_kind(Kind kind);
  Kind kind() const;
  void set_dtype(const QString& dtype);       // float32 | bfloat16
  void set_gguf_type(const QString& type);    // f16 | q8_0 | bf16 | f32
  void set_destination(const QString& path);  // a folder, or for Gguf a file
  // Starts the export; "" when started, else why not (also shown in the dialog).
  QString start();
  bool measured() const { return measured_; }  // the size estimate is ready
  // The destination as it is now was checked (created and written in, off the GUI thread).
  bool destination_checked() const;
  // Why the checked destination cannot take this export ("" when it can), and what it replaces
  // there ("a model in /x/export", "the GGUF file /x/m.gguf"; "" for a new or empty one).
  QString destination_problem() const;
  QString replaces() const;
  QLabel* estimate_label() const { return estimate_; }
  bool busy() const;
  bool succeeded() const { return succeeded_; }
  const QString& message() const { return message_; }
  QString destination() const;
  quint64 estimated_bytes() const;  // for the current kind and dtype

  QComboBox* kind_combo() const { return kind_; }
  QComboBox* dtype_combo() const { return dtype_; }
  QComboBox* gguf_type_combo() const { return gguf_type_; }
  QProgressBar* progress_bar() const { return progress_; }
  QLabel* status_label() const { return status_; }
  QPushButton* export_button() const { return export_; }
  // Shown after a successful export; opens exported_folder() with QDesktopServices.
  QPushButton* open_folder_button() const { return open_folder_; }
  QString exported_folder() const;
  QPlainTextEdit* log_view() const { return log_; }

 Q_SIGNALS:
  void exportFinished(bool ok, const QString& message);

 private:
  void update_estimate();
  void check_destination();  // asks the write check for the destination now
  WriteTarget destination_target() const;
  // What the check's answer means for this kind of export.
  struct Verdict {
    QString problem, advice;  // why not, and what to do
    QString replaces;         // an earlier export the new one replaces (then --force)
  };
  Verdict verdict() const;
  void update_kind();  // shows the options of the chosen kind, and its default destination
  QString default_destination() const;
  QString export_folder() const;  // the folder written: the destination, or a GGUF file's folder
  void finish(bool ok, const QString& message);
  void on_stderr();

  RunRecord run_;
  QString cli_;
  QComboBox* kind_;
  QComboBox* dtype_;
  QComboBox* gguf_type_;
  QLineEdit* destination_;
  QFormLayout* form_;
  QLabel* destination_label_;
  QString last_default_destination_;  // replaced on a kind change unless the user edited it
  QLabel* estimate_;
  QLabel* status_;
  QProgressBar* progress_;
  QPlainTextEdit* log_;
  QPushButton* export_;
  QPushButton* open_folder_;
  QProcess* process_ = nullptr;
  QByteArray stderr_partial_;
  QStringList stderr_tail_;
  QFutureWatcher<QString> copy_watcher_;
  WriteChecker* checker_;
  QTimer check_delay_;  // one check after a burst of typing, not one per key
  bool status_is_refusal_ = false;
  struct Sizes {
    quint64 model_weights = 0, model_other = 0, adapter = 0;
    int model_dtype_bytes = 4;        // from config.json: 2 for bf16/fp16, else 4
    QString model_dtype = "float32";  // the run's model/ as config.json names it
    QString base_dtype;  // the base model's (job spec's model), empty when it is not at hand
    QString model_canonical, adapter_canonical;  // the run's own folders, never a destination
  };
  QFutureWatcher<Sizes> size_watcher_;
  Sizes sizes_;
  bool measured_ = false;
  bool dtype_chosen_ = false;  // the user (or set_dtype) picked the precision: it stays
  void label_dtypes();         // "as trained", "as the base model" beside the matching dtypes
  bool succeeded_ = false;
  QString message_;
};

}  // namespace tessera::ui
