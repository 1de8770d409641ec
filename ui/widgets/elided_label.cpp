#include "ui/widgets/elided_label.h"

#include <QFontMetrics>
#include <QResizeEvent>
#include <algorithm>

namespace tessera::ui {

ElidedLabel::ElidedLabel(Qt::TextElideMode mode, QWidget* parent) : QLabel(parent), mode_(mode) {
  setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
}

void ElidedLabel::set_full_text(const QString& text) {
  if (text == full_text_) return;
  full_text_ = text;
  setToolTip(text);
  elide();
}

void ElidedLabel::resizeEvent(QResizeEvent* event) {
  QLabel::resizeEvent(event);
  elide();
}

void ElidedLabel::elide() {
  setText(fontMetrics().elidedText(full_text_, mode_, std::max(0, contentsRect().width())));
}

}  // namespace tessera::ui
