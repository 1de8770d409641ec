#pragma once
// A one-line label that cuts a long text to its width (in the middle by default, so a path
// keeps its start and its last folder) and shows the full text in its tooltip. It never widens
// its window.
#include <QLabel>

namespace tessera::ui {

class ElidedLabel : public QLabel {
  Q_OBJECT
 public:
  explicit ElidedLabel(Qt::TextElideMode mode = Qt::ElideMiddle, QWidget* parent = nullptr);
  void set_full_text(const QString& text);
  const QString& full_text() const { return full_text_; }

 protected:
  void resizeEvent(QResizeEvent* event) override;

 private:
  void elide();
  QString full_text_;
  Qt::TextElideMode mode_;
};

}  // namespace tessera::ui
