#pragma once
// A preference pair as the Dataset page shows it (issue 27): the prompt over the chosen and the
// rejected completions side by side, so a person sees what the objective pushes apart — the
// row picked in the preview table, the first one at first.
#include <QGroupBox>

class QLabel;
class QPlainTextEdit;

namespace tessera::ui {

class PairView : public QGroupBox {
  Q_OBJECT
 public:
  explicit PairView(QWidget* parent = nullptr);
  // Row `row` (0-based, of the preview) with its three cells as the file holds them (text, or a
  // chat message list as JSON).
  void show_pair(int row, const QString& prompt, const QString& chosen, const QString& rejected);
  QString prompt_text() const;
  QString chosen_text() const;
  QString rejected_text() const;

 private:
  QString prompt_value_;
  QLabel* prompt_;
  QPlainTextEdit* chosen_;
  QPlainTextEdit* rejected_;
};

}  // namespace tessera::ui
