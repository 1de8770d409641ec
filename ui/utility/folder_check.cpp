#include "ui/utility/folder_check.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QMutex>
#include <QStorageInfo>
#include <QStringList>
#include <QThreadPool>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

namespace tessera::ui {

namespace {

constexpr int kSlowMs = 2000;  // a local disk answers far sooner

QString clean_absolute(const QString& path) {
  if (path.trimmed().isEmpty()) return {};
  return QDir::cleanPath(QFileInfo(path).absoluteFilePath());  // no file system access
}

// `path` and the system's errno in words, and what to do about it.
void errno_problem(WriteCheck& check, const QString& path, int error) {
  switch (error) {
    case EROFS:
      check.problem = QObject::tr("%1 is on a read-only file system").arg(path);
      check.advice = QObject::tr("Choose a folder on a disk that can be written.");
      return;
    case EACCES:
    case EPERM:
      check.problem = QObject::tr("permission denied for %1").arg(path);
      check.advice =
          QObject::tr("Choose a folder you can write in, or get write permission there.");
      return;
    case ENOSPC:
      check.problem = QObject::tr("no space left on the disk holding %1").arg(path);
      check.advice = QObject::tr("Free some space there, or choose a folder on another disk.");
      return;
    case EDQUOT:
      check.problem = QObject::tr("your disk quota is used up on the disk holding %1").arg(path);
      check.advice = QObject::tr("Free some of your files there, or choose another disk.");
      return;
    case ENOTDIR:
      check.problem = QObject::tr("%1 is inside a file, not a folder").arg(path);
      check.advice = QObject::tr("Choose a folder.");
      return;
    case ENAMETOOLONG:
      check.problem = QObject::tr("%1: the name is too long for its file system").arg(path);
      check.advice = QObject::tr("Choose a shorter path.");
      return;
    case ENOENT:  // the parent exists, yet the system makes no folder there (/proc)
      check.problem =
          QObject::tr("folders cannot be created in %1").arg(QFileInfo(path).absolutePath());
      check.advice = QObject::tr("Choose a folder on a disk.");
      return;
    default:
      check.problem = QString("%1: %2").arg(path, QString::fromLocal8Bit(std::strerror(error)));
      check.advice = QObject::tr("Choose another folder.");
      return;
  }
}

bool regular_file(const QString& path) {
  struct stat st {};
  return ::stat(QFile::encodeName(path).constData(), &st) == 0 && S_ISREG(st.st_mode);
}

// What an existing folder holds: its entry count, and whether that is an earlier export.
void look_into_folder(WriteCheck& check) {
  DIR* dir = ::opendir(QFile::encodeName(check.path).constData());
  if (dir == nullptr) return;
  bool config = false, weights = false, adapter = false;
  while (const dirent* entry = ::readdir(dir)) {
    const QString name = QFile::decodeName(entry->d_name);
    if (name == "." || name == "..") continue;
    ++check.entries;
    config |= name == "config.json";
    weights |= name.endsWith(".safetensors") || name.startsWith("pytorch_model");
    adapter |= name == "adapter_config.json";
  }
  ::closedir(dir);
  check.found = check.entries == 0 ? WriteCheck::Found::EmptyFolder : WriteCheck::Found::Folder;
  const QDir folder(check.path);
  if (adapter && regular_file(folder.filePath("adapter_config.json")))
    check.holds = QObject::tr("a LoRA adapter");
  else if (config && weights && regular_file(folder.filePath("config.json")))
    check.holds = QObject::tr("a model");
}

// What is at `check.path` now.
void look_at_path(WriteCheck& check) {
  struct stat st {};
  if (::stat(QFile::encodeName(check.path).constData(), &st) != 0) return;  // Found::Nothing
  check.canonical = QFileInfo(check.path).canonicalFilePath();
  if (S_ISDIR(st.st_mode)) {
    look_into_folder(check);
    return;
  }
  check.found = WriteCheck::Found::File;
  QFile file(check.path);
  if (S_ISREG(st.st_mode) && file.open(QIODevice::ReadOnly) && file.read(4) == "GGUF")
    check.holds = QObject::tr("a GGUF file");
}

// Creates the missing folders up to `folder`, writes a synced block in it and removes all that.
void write_probe(WriteCheck& check) {
  const QString& target = check.folder;
  // The folders to create, deepest first, up to the nearest one that exists.
  QStringList missing;
  QString existing = target;
  struct stat st {};
  while (::stat(QFile::encodeName(existing).constData(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) return errno_problem(check, existing, errno);
    missing << existing;
    const QString parent = QFileInfo(existing).absolutePath();
    if (parent == existing) break;
    existing = parent;
  }
  if (!S_ISDIR(st.st_mode)) {
    check.problem = QObject::tr("%1 is a file, not a folder").arg(existing);
    check.advice = QObject::tr("Choose a folder, or move the file out of the way.");
    return;
  }
  QStorageInfo storage(existing);
  check.volume = storage.rootPath();

  QStringList created;  // removed afterwards, deepest last in the list
  for (auto it = missing.crbegin(); it != missing.crend() && check.problem.isEmpty(); ++it) {
    if (::mkdir(QFile::encodeName(*it).constData(), 0755) == 0)
      created << *it;
    else
      errno_problem(check, *it, errno);
  }
  if (check.problem.isEmpty()) {
    // A name of its own (an existing file is never touched); a block's worth, synced: a full
    // disk may accept the file and refuse its data.
    static std::atomic<int> counter{0};
    const QByteArray probe = QFile::encodeName(QDir(target).filePath(
        QString(".tessera-write-check-%1-%2").arg(::getpid()).arg(++counter)));
    const int fd = ::open(probe.constData(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      errno_problem(check, target, errno);
    } else {
      const std::vector<char> block(4096, '\0');
      const ssize_t written = ::write(fd, block.data(), block.size());
      if (written < 0 || ::fsync(fd) != 0)
        errno_problem(check, target, errno);
      else if (written != ssize_t(block.size()))  // a short write: the disk filled up
        errno_problem(check, target, ENOSPC);
      if (::close(fd) != 0 && check.problem.isEmpty()) errno_problem(check, target, errno);
      ::unlink(probe.constData());
    }
  }
  for (auto it = created.crbegin(); it != created.crend(); ++it)
    ::rmdir(QFile::encodeName(*it).constData());
  // The free space once the probe is gone (what the export or run will find).
  storage.refresh();
  if (storage.isValid() && storage.bytesAvailable() >= 0)
    check.bytes_free = storage.bytesAvailable();
}

// The one pool all checks run on, one at a time. Never destroyed: a pool waits for its threads
// when it goes, and a check stuck on a dead network mount must not hold up the studio's exit.
QThreadPool* check_pool() {
  static QThreadPool* pool = [] {
    auto* p = new QThreadPool;
    p->setMaxThreadCount(1);
    return p;
  }();
  return pool;
}

}  // namespace

QString nearest_existing_path(const QString& path) {
  QFileInfo info(path);
  while (!info.exists()) {
    const QString parent = info.absolutePath();
    if (parent == info.absoluteFilePath()) break;
    info = QFileInfo(parent);
  }
  return info.absoluteFilePath();
}

WriteCheck check_writable(const QString& path, WriteTarget target) {
  WriteCheck check;
  check.target = target;
  if (path.trimmed().isEmpty()) {
    check.problem = target == WriteTarget::File ? QObject::tr("no file name was given")
                                                : QObject::tr("no folder was given");
    check.advice = QObject::tr("Choose where to write.");
    return check;
  }
  check.path = clean_absolute(path);
  check.folder = target == WriteTarget::File ? QFileInfo(check.path).absolutePath() : check.path;
  look_at_path(check);
  if (target == WriteTarget::Folder && check.found == WriteCheck::Found::File) {
    check.problem = QObject::tr("%1 is a file, not a folder").arg(check.path);
    check.advice = QObject::tr("Choose a folder, or move the file out of the way.");
    return check;
  }
  write_probe(check);
  return check;
}

// The worker's way back to its checker: cut (under the lock) when the checker goes, so an
// answer that comes late is posted to nothing.
struct WriteChecker::Shared {
  QMutex lock;
  WriteChecker* owner = nullptr;  // guarded by lock
};

WriteChecker::WriteChecker(QObject* parent) : QObject(parent), shared_(std::make_shared<Shared>()) {
  shared_->owner = this;
  slow_timer_.setSingleShot(true);
  slow_timer_.setInterval(kSlowMs);
  connect(&slow_timer_, &QTimer::timeout, this, [this] {
    slow_ = true;
    Q_EMIT slowed();
  });
}

WriteChecker::~WriteChecker() {
  QMutexLocker locked(&shared_->lock);
  shared_->owner = nullptr;
}

bool WriteChecker::answered(const QString& path, WriteTarget target) const {
  return asked_ && !checking() && asked_path_ == clean_absolute(path) && asked_target_ == target;
}

void WriteChecker::check(const QString& path, WriteTarget target) {
  asked_ = true;
  asked_path_ = clean_absolute(path);
  asked_target_ = target;
  if (in_flight_) {  // one at a time: this one waits, replacing any that waited
    has_pending_ = true;
    pending_path_ = path;
    pending_target_ = target;
    return;
  }
  start(path, target);
}

void WriteChecker::start(const QString& path, WriteTarget target) {
  in_flight_ = true;
  slow_ = false;
  slow_timer_.start();
  const quint64 generation = ++generation_;
  std::shared_ptr<Shared> shared = shared_;
  check_pool()->start([shared, generation, path, target] {
    const WriteCheck result = check_writable(path, target);
    QMutexLocker locked(&shared->lock);
    if (WriteChecker* owner = shared->owner)
      QMetaObject::invokeMethod(
          owner, [owner, generation, result] { owner->answer(generation, result); },
          Qt::QueuedConnection);
  });
}

void WriteChecker::answer(quint64 generation, const WriteCheck& result) {
  if (generation != generation_) return;
  in_flight_ = false;
  slow_timer_.stop();
  slow_ = false;
  if (has_pending_) {  // asked again meanwhile: this answer is for an earlier request
    has_pending_ = false;
    start(pending_path_, pending_target_);
    return;
  }
  result_ = result;
  Q_EMIT checked();
}

}  // namespace tessera::ui
