#include "ui/utility/write_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QObject>
#include <QStringList>
#include <cerrno>
#include <cstring>
#include <vector>

namespace tessera::ui {

namespace {

// `path` and the system's errno in words.
QString errno_problem(const QString& path, int error) {
  switch (error) {
    case EROFS:
      return QObject::tr("%1 is on a read-only file system").arg(path);
    case EACCES:
    case EPERM:
      return QObject::tr("%1: permission denied").arg(path);
    case ENOSPC:
      return QObject::tr("no space left on the disk holding %1").arg(path);
    case EDQUOT:
      return QObject::tr("%1: disk quota exceeded").arg(path);
    case ENOTDIR:
      return QObject::tr("%1 is inside a file, not a folder").arg(path);
    case ENOENT:  // the parent exists, yet the system makes no folder there (/proc)
      return QObject::tr("folders cannot be created in %1").arg(QFileInfo(path).absolutePath());
    default:
      return QString("%1: %2").arg(path, QString::fromLocal8Bit(std::strerror(error)));
  }
}

}  // namespace

QString new_folder_problem(const QString& folder) {
  const QString target = QDir::cleanPath(QFileInfo(folder).absoluteFilePath());
  // The folders to create, deepest first, up to the nearest one that exists.
  QStringList missing;
  QString existing = target;
  struct stat st {};
  while (::stat(QFile::encodeName(existing).constData(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) return errno_problem(existing, errno);
    missing << existing;
    const QString parent = QFileInfo(existing).absolutePath();
    if (parent == existing) break;
    existing = parent;
  }
  if (missing.isEmpty())
    return QObject::tr("%1 already exists; every run needs a new folder").arg(target);
  if (!S_ISDIR(st.st_mode)) return QObject::tr("%1 is a file, not a folder").arg(existing);

  QStringList created;  // removed afterwards, deepest first
  QString problem;
  for (auto it = missing.crbegin(); it != missing.crend() && problem.isEmpty(); ++it) {
    if (::mkdir(QFile::encodeName(*it).constData(), 0755) == 0)
      created << *it;
    else
      problem = errno_problem(*it, errno);
  }
  if (problem.isEmpty()) {
    // A block's worth, synced: a full disk may accept the file and refuse its data.
    const QByteArray probe = QFile::encodeName(QDir(target).filePath(".tessera-write-check"));
    const int fd = ::open(probe.constData(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      problem = errno_problem(target, errno);
    } else {
      const std::vector<char> block(4096, '\0');
      const ssize_t written = ::write(fd, block.data(), block.size());
      if (written < 0 || ::fsync(fd) != 0)
        problem = errno_problem(target, errno);
      else if (written != ssize_t(block.size()))  // a short write: the disk filled up
        problem = errno_problem(target, ENOSPC);
      if (::close(fd) != 0 && problem.isEmpty()) problem = errno_problem(target, errno);
      ::unlink(probe.constData());
    }
  }
  for (auto it = created.crbegin(); it != created.crend(); ++it)
    ::rmdir(QFile::encodeName(*it).constData());
  return problem;
}

}  // namespace tessera::ui
