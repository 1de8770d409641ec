#include "ui/widgets/pair_view.h"

#include <QHBoxLayout>
#include <QLabel>
#include <QPlainTextEdit>
#include <QVBoxLayout>

namespace tessera::ui {

namespace {

// A read-only completion under its heading ("Chosen" in green, "Rejected" in red).
QWidget* completion_column(const QString& heading, const char* color, QPlainTextEdit** text) {
  auto* column = new QWidget;
  auto* layout = new QVBoxLayout(column);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(2);
  auto* title = new QLabel(QString("<b style='color:%1'>%2</b>").arg(color, heading));
  *text = new QPlainTextEdit;
  (*text)->setReadOnly(true);
  (*text)->setAccessibleName(heading);
  // Two lines at least; the page's splitters give it more.
  (*text)->setMinimumHeight((*text)->fontMetrics().lineSpacing() * 2 + 12);
  title->setBuddy(*text);
  layout->addWidget(title);
  layout->addWidget(*text);
  return column;
}

}  // namespace

PairView::PairView(QWidget* parent) : QGroupBox(tr("Pair"), parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(6, 4, 6, 4);
  layout->setSpacing(2);
  prompt_ = new QLabel;
  prompt_->setWordWrap(true);
  prompt_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* sides = new QHBoxLayout;
  sides->addWidget(completion_column(tr("Chosen"), "#1e8c45", &chosen_));
  sides->addWidget(completion_column(tr("Rejected"), "#c0392b", &rejected_));
  layout->addWidget(prompt_);
  layout->addLayout(sides);
  setToolTip(
      tr("The row picked in the preview: DPO, IPO, SimPO and ORPO raise the chosen "
         "completion's likelihood against the rejected one's for this prompt"));
}

void PairView::show_pair(int row, const QString& prompt, const QString& chosen,
                         const QString& rejected) {
  setTitle(tr("Pair (row %1)").arg(row + 1));
  prompt_value_ = prompt;
  prompt_->setText(tr("<b>Prompt</b> %1").arg(prompt.left(2000).toHtmlEscaped()));
  chosen_->setPlainText(chosen);
  rejected_->setPlainText(rejected);
}

QString PairView::prompt_text() const {
  return prompt_value_;
}

QString PairView::chosen_text() const {
  return chosen_->toPlainText();
}

QString PairView::rejected_text() const {
  return rejected_->toPlainText();
}

}  // namespace tessera::ui
