#pragma once
// Tessera's icon, drawn rather than stored: a mosaic of nine tiles (a tessera is one tile of a
// mosaic). The window's icon, and the PNGs the package installs (tessera --write-icons).
#include <QIcon>
#include <QImage>
#include <QString>

namespace tessera::ui {

// The icon at `size` × `size` pixels, on a transparent background.
QImage app_icon_image(int size);
// Every size of app_icon_sizes() in one QIcon.
QIcon app_icon();
// The sizes the package installs under share/icons/hicolor.
const QList<int>& app_icon_sizes();
// Writes `folder`/<N>x<N>/apps/tessera.png for each size (hicolor's layout). Returns "" or why
// not, naming the file.
QString write_app_icons(const QString& folder);

}  // namespace tessera::ui
