#include "ui/utility/folder_check.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QObject>

namespace tessera::ui {

QString unwritable_reason(const QString& path) {
  if (path.isEmpty()) return QObject::tr("no folder was given");
  QFileInfo info(QDir::cleanPath(QDir(path).absolutePath()));
  // The nearest part of the path that exists: its kind and file system decide.
  while (!info.exists()) {
    const QFileInfo parent(info.absolutePath());
    if (parent.absoluteFilePath() == info.absoluteFilePath()) break;
    info = parent;
  }
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
