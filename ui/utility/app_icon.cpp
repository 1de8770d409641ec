#include "ui/utility/app_icon.h"

#include <QColor>
#include <QDir>
#include <QPainter>
#include <QPainterPath>

namespace tessera::ui {

QImage app_icon_image(int size) {
  QImage image(size, size, QImage::Format_ARGB32_Premultiplied);
  image.fill(Qt::transparent);
  QPainter painter(&image);
  painter.setRenderHint(QPainter::Antialiasing);
  const double s = size;
  // A dark rounded square, then three rows of tiles whose colours run teal → amber → coral.
  QPainterPath back;
  back.addRoundedRect(QRectF(0.03 * s, 0.03 * s, 0.94 * s, 0.94 * s), 0.2 * s, 0.2 * s);
  painter.fillPath(back, QColor(0x1f, 0x29, 0x37));
  const QColor colours[3][3] = {
      {QColor(0x2a, 0x9d, 0x8f), QColor(0x2a, 0x9d, 0x8f), QColor(0xe9, 0xc4, 0x6a)},
      {QColor(0x2a, 0x9d, 0x8f), QColor(0xe9, 0xc4, 0x6a), QColor(0xf4, 0xa2, 0x61)},
      {QColor(0xe9, 0xc4, 0x6a), QColor(0xf4, 0xa2, 0x61), QColor(0xe7, 0x6f, 0x51)}};
  const double margin = 0.16 * s, gap = 0.05 * s;
  const double tile = (s - 2 * margin - 2 * gap) / 3;
  for (int row = 0; row < 3; ++row)
    for (int column = 0; column < 3; ++column) {
      QPainterPath path;
      path.addRoundedRect(
          QRectF(margin + column * (tile + gap), margin + row * (tile + gap), tile, tile),
          0.18 * tile, 0.18 * tile);
      painter.fillPath(path, colours[row][column]);
    }
  return image;
}

const QList<int>& app_icon_sizes() {
  static const QList<int> sizes{16, 24, 32, 48, 64, 128, 256, 512};
  return sizes;
}

QIcon app_icon() {
  QIcon icon;
  for (int size : app_icon_sizes()) icon.addPixmap(QPixmap::fromImage(app_icon_image(size)));
  return icon;
}

QString write_app_icons(const QString& folder) {
  for (int size : app_icon_sizes()) {
    const QString dir = QStringLiteral("%1/%2x%2/apps").arg(folder).arg(size);
    const QString file = dir + "/tessera.png";
    if (!QDir().mkpath(dir) || !app_icon_image(size).save(file, "PNG"))
      return QStringLiteral("cannot write %1").arg(QDir::toNativeSeparators(file));
  }
  return {};
}

}  // namespace tessera::ui
