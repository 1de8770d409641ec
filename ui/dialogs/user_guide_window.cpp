#include "ui/dialogs/user_guide_window.h"

#include <QDialogButtonBox>
#include <QFile>
#include <QTextBrowser>
#include <QVBoxLayout>

namespace tessera::ui {

QString user_guide_markdown() {
  QFile file(":/docs/user-guide.md");
  return file.open(QIODevice::ReadOnly) ? QString::fromUtf8(file.readAll()) : QString();
}

UserGuideWindow::UserGuideWindow(QWidget* parent) : QDialog(parent) {
  setWindowTitle(tr("Tessera Studio user guide"));
  auto* layout = new QVBoxLayout(this);
  browser_ = new QTextBrowser;
  browser_->setOpenExternalLinks(true);
  const QString markdown = user_guide_markdown();
  if (markdown.isEmpty())
    browser_->setPlainText(
        tr("The user guide is missing from this build (the resource "
           ":/docs/user-guide.md)."));
  else
    browser_->setMarkdown(markdown);
  layout->addWidget(browser_, 1);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  layout->addWidget(buttons);
  resize(fontMetrics().averageCharWidth() * 90, fontMetrics().height() * 40);
}

}  // namespace tessera::ui
