#pragma once
// Whether a destination can be written, found out by writing: the missing folders are created,
// a small file is written, synced and removed, and then the folders the check made are removed
// again (only those). Permission bits say nothing for root, and neither they nor the mount flags
// tell a full disk; only the system's answer to a real write does. The check also says what is
// at the destination already (an empty folder, an earlier export it would replace, a file), and
// the free space on its disk. It touches the file system, which can take long (a network mount
// that does not answer), so the studio asks a WriteChecker, which runs it on a worker thread.
#include <QObject>
#include <QString>
#include <QTimer>
#include <memory>

namespace tessera::ui {

// The nearest path at or above `path` that exists (absolute): where a new folder's bytes would
// land, and whose kind and file system decide whether it can be made. (Stats the file system.)
QString nearest_existing_path(const QString& path);

enum class WriteTarget {
  Folder,  // the path is a folder to write in (made when missing)
  File,    // the path is a file to create; its folder is the one written in
};

struct WriteCheck {
  enum class Found {
    Nothing,      // nothing at the path yet
    EmptyFolder,  // an existing folder with nothing in it
    Folder,       // an existing folder holding `entries` files and folders
    File,         // an existing file (or anything else that is not a folder)
  };
  QString path;  // absolute and clean: the folder, or the file
  WriteTarget target = WriteTarget::Folder;
  QString folder;   // the folder written in: `path`, or the file's folder
  QString problem;  // "" when `folder` can be written, else why: "/mnt/cd is on a read-only
                    // file system", "permission denied for /data", "no space left on the disk
                    // holding /scratch", "/home/me/notes.txt is a file, not a folder"
  QString advice;   // what to do about `problem` ("" with it)
  Found found = Found::Nothing;
  qint64 entries = 0;  // for Found::Folder
  // An earlier export at the path that writing there replaces: "a model" (config.json with
  // weights), "a LoRA adapter" (adapter_config.json), "a GGUF file"; "" for anything else.
  QString holds;
  QString canonical;       // the path with links resolved, when it exists
  QString volume;          // the root of the file system written to
  qint64 bytes_free = -1;  // free to this user there (-1: unknown)
};

// Runs the check on the calling thread (it blocks as long as the file system does).
WriteCheck check_writable(const QString& path, WriteTarget target = WriteTarget::Folder);

// Runs check_writable on a worker thread and hands the answer back on this object's thread.
// Checks run one at a time for the whole process (two at once on nested paths would each see
// the other's folders); asking again while one runs replaces what waits, and an answer for a
// path asked before the latest one is dropped, never shown.
class WriteChecker : public QObject {
  Q_OBJECT
 public:
  explicit WriteChecker(QObject* parent = nullptr);
  ~WriteChecker() override;

  void check(const QString& path, WriteTarget target = WriteTarget::Folder);
  bool checking() const { return in_flight_ || has_pending_; }
  // The latest request's answer is in (and nothing newer is asked).
  bool answered(const QString& path, WriteTarget target) const;
  const WriteCheck& result() const { return result_; }  // the latest answer
  QString asked() const { return asked_path_; }         // the latest request's path
  // The check has run for longer than a disk normally takes (a hung network mount).
  bool slow() const { return slow_; }

 Q_SIGNALS:
  void checked();  // result() is the answer to the latest request
  void slowed();   // slow() became true

 private:
  struct Shared;
  void start(const QString& path, WriteTarget target);
  void answer(quint64 generation, const WriteCheck& result);

  std::shared_ptr<Shared> shared_;  // the worker's way back, cut when this object goes
  quint64 generation_ = 0;          // of the request in flight
  bool in_flight_ = false;
  bool has_pending_ = false;
  QString pending_path_;
  WriteTarget pending_target_ = WriteTarget::Folder;
  bool asked_ = false;
  QString asked_path_;  // clean, absolute
  WriteTarget asked_target_ = WriteTarget::Folder;
  WriteCheck result_;
  bool slow_ = false;
  QTimer slow_timer_;
};

}  // namespace tessera::ui
