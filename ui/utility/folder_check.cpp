#include "ui/utility/folder_check.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QObject>

namespace tessera::ui {

QString nearest_existing_path(const QString& path) {
  QFileInfo info(path);
  while (!info.exists()) {
    const QString parent = info.absolutePath();
    if (parent == info.absoluteFilePath()) break;
    info = QFileInfo(parent);
  }
  return info.absoluteFilePath();
}

QString unwritable_reason(const QString& path) {
  if (path.isEmpty()) return QObject::tr("no folder was given");
  const QFileInfo info(nearest_existing_path(QDir::cleanPath(QDir(path).absolutePath())));
  const QString where = QDir::toNativeSeparators(info.absoluteFilePath());
  if (!info.exists()) return QObject::tr("%1 does not exist").arg(where);
  if (!info.isDir())
    return QObject::tr("%1 is a file, not a folder, so nothing can be created under it").arg(where);
  const QByteArray native = QFile::encodeName(info.absoluteFilePath());
  struct statvfs fs {};
  if (::statvfs(native.constData(), &fs) == 0 && (fs.f_flag & ST_RDONLY) != 0)
    return QObject::tr("%1 is on a read-only file system").arg(where);
  if (::access(native.constData(), W_OK | X_OK) != 0)
    return QObject::tr("you have no permission to write in %1").arg(where);
  return {};
}

}  // namespace tessera::ui
