#pragma once
// "Try with the demo model": the first start's way in. Makes the offline demo model and dataset
// (`tessera-cli demo --no-train --out DIR`: DIR/base, DIR/train.jsonl) in a child with its
// progress, and says in a sentence where models come from otherwise.
#include <QFrame>
#include <QStringList>

class QLabel;
class QProcess;
class QProgressBar;
class QPushButton;

namespace tessera::ui {

class DemoOffer : public QFrame {
  Q_OBJECT
 public:
  explicit DemoOffer(QWidget* parent = nullptr);
  ~DemoOffer() override;
  // Runs `cli demo --no-train --out dir`; demoReady when it wrote the model, the dataset and
  // the demo's job spec (dir/job.json: its tuned length, batch, learning rate and steps).
  void make_demo(const QString& cli, const QString& dir);
  bool busy() const;
  QPushButton* try_button() const { return try_; }
  QLabel* status_label() const { return status_; }
  QProgressBar* progress_bar() const { return progress_; }

 Q_SIGNALS:
  void tryRequested();  // the button: the owner knows the CLI and the folder
  void demoReady(const QString& dir);

 private:
  void fail(const QString& why);
  QPushButton* try_;
  QLabel* status_;
  QProgressBar* progress_;
  QProcess* process_ = nullptr;
  QString cli_, dir_;
  QStringList stderr_lines_;
};

}  // namespace tessera::ui
