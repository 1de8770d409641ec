#pragma once
// Help → About: the versions of Tessera, LibTorch and CUDA as the configured tessera-cli reports
// them (`tessera-cli version --json`, asked in a child: the studio itself links no LibTorch),
// whether it sees a GPU, and Qt's version in this process.
#include <QDialog>

class QLabel;
class QProcess;

namespace tessera::ui {

class AboutDialog : public QDialog {
  Q_OBJECT
 public:
  AboutDialog(const QString& cli, QWidget* parent = nullptr);
  ~AboutDialog() override;
  bool finished() const { return finished_; }  // the CLI answered (or could not be asked)
  QString text() const;                        // what the dialog says, as plain text

 Q_SIGNALS:
  void versionsShown();

 private:
  void show_versions(const QStringList& engine_lines);
  QString cli_;
  QLabel* versions_;
  QProcess* process_;
  bool finished_ = false;
};

// The lines About shows for `tessera-cli version --json` output: "Tessera 0.1.0",
// "LibTorch 2.15.0", "CUDA 13.2", "GPU: none visible". Empty when `json` is not that output.
QStringList version_lines(const QByteArray& json);

}  // namespace tessera::ui
