#pragma once
// Help → User guide (F1): docs/user-guide.md, shipped in the app as the Qt resource
// :/docs/user-guide.md, rendered as Markdown. Links to the web open in the browser.
#include <QDialog>

class QTextBrowser;

namespace tessera::ui {

class UserGuideWindow : public QDialog {
  Q_OBJECT
 public:
  explicit UserGuideWindow(QWidget* parent = nullptr);
  QTextBrowser* browser() const { return browser_; }

 private:
  QTextBrowser* browser_;
};

// The guide's Markdown from the resource ("" when the resource is missing).
QString user_guide_markdown();

}  // namespace tessera::ui
