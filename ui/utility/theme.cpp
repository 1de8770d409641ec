#include "ui/utility/theme.h"

#include <QApplication>
#include <QStyle>
#include <QStyleFactory>

namespace tessera::ui {

namespace {

struct PlatformLook {
  QString style;
  QPalette palette;
};

const PlatformLook& platform_look() {
  static const PlatformLook look{QApplication::style()->name(), QApplication::palette()};
  return look;
}

void use_style(const QString& name) {
  if (QApplication::style()->name().compare(name, Qt::CaseInsensitive) == 0) return;
  if (QStyle* style = QStyleFactory::create(name)) QApplication::setStyle(style);
}

}  // namespace

QPalette dark_palette() {
  const QColor window(0x2b, 0x2b, 0x2b), base(0x1e, 0x1e, 0x1e), button(0x35, 0x35, 0x35);
  const QColor text(0xe0, 0xe0, 0xe0), disabled(0x80, 0x80, 0x80);
  QPalette p;
  p.setColor(QPalette::Window, window);
  p.setColor(QPalette::WindowText, text);
  p.setColor(QPalette::Base, base);
  p.setColor(QPalette::AlternateBase, window);
  p.setColor(QPalette::ToolTipBase, button);
  p.setColor(QPalette::ToolTipText, text);
  p.setColor(QPalette::PlaceholderText, disabled);
  p.setColor(QPalette::Text, text);
  p.setColor(QPalette::Button, button);
  p.setColor(QPalette::ButtonText, text);
  p.setColor(QPalette::BrightText, QColor(0xff, 0x6b, 0x6b));
  p.setColor(QPalette::Light, QColor(0x4a, 0x4a, 0x4a));
  p.setColor(QPalette::Midlight, QColor(0x40, 0x40, 0x40));
  p.setColor(QPalette::Mid, QColor(0x60, 0x60, 0x60));
  p.setColor(QPalette::Dark, QColor(0x18, 0x18, 0x18));
  p.setColor(QPalette::Shadow, Qt::black);
  p.setColor(QPalette::Highlight, QColor(0x2f, 0x65, 0xca));
  p.setColor(QPalette::HighlightedText, Qt::white);
  p.setColor(QPalette::Link, QColor(0x6c, 0xb4, 0xff));
  p.setColor(QPalette::LinkVisited, QColor(0xb3, 0x9d, 0xff));
  for (QPalette::ColorRole role : {QPalette::WindowText, QPalette::Text, QPalette::ButtonText})
    p.setColor(QPalette::Disabled, role, disabled);
  return p;
}

void apply_theme(const QString& theme) {
  const PlatformLook& platform = platform_look();
  if (theme == "light" || theme == "dark") {
    use_style("Fusion");
    QApplication::setPalette(theme == "dark" ? dark_palette()
                                             : QApplication::style()->standardPalette());
  } else {
    use_style(platform.style);
    QApplication::setPalette(platform.palette);
  }
}

}  // namespace tessera::ui
