#pragma once
// A folder on a "hung disk" without FUSE or a network mount: every open of a file directly in the
// folder waits until the test lets it go, as an open on an NFS mount whose server went away
// waits. It uses fanotify permission events (FAN_OPEN_PERM), which need root (CAP_SYS_ADMIN); a
// thread of its own answers them, so a GUI thread that opened a file there would block too, and
// the test would see its event loop stop. Each open's thread id is recorded (FAN_REPORT_TID).
#include <fcntl.h>
#include <poll.h>
#include <sys/fanotify.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <QByteArray>
#include <QFile>
#include <QList>
#include <QString>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::ui::testing {

inline pid_t this_thread_id() {
  return pid_t(::syscall(SYS_gettid));
}

class HeldOpens {
 public:
  // Holds the opens in `dir` until release(), or `limit` after each one began (so a test that
  // fails never hangs on it).
  explicit HeldOpens(const QString& dir, std::chrono::milliseconds limit = std::chrono::seconds(20))
      : limit_(limit) {
    fd_ = ::fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_TID,
                          O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      error_ = QString("fanotify_init: %1").arg(std::strerror(errno));
      return;
    }
    const QByteArray path = QFile::encodeName(dir);
    if (::fanotify_mark(fd_, FAN_MARK_ADD, FAN_OPEN_PERM | FAN_EVENT_ON_CHILD, AT_FDCWD,
                        path.constData()) != 0) {
      error_ = QString("fanotify_mark %1: %2").arg(dir, std::strerror(errno));
      ::close(fd_);
      fd_ = -1;
      return;
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~HeldOpens() {
    stop_ = true;
    release_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  HeldOpens(const HeldOpens&) = delete;
  HeldOpens& operator=(const HeldOpens&) = delete;

  QString error() const { return error_; }  // "" when the folder is held
  int waiting() const { return waiting_; }  // opens blocked now
  QList<pid_t> openers() const {            // the thread of each open seen
    std::lock_guard<std::mutex> locked(lock_);
    return openers_;
  }
  void release() { release_ = true; }  // lets every open go, now and later

 private:
  struct Held {
    int fd;
    std::chrono::steady_clock::time_point since;
  };

  void serve() {
    std::vector<Held> held;
    while (!stop_ || !held.empty()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) {
        alignas(fanotify_event_metadata) char buffer[4096];
        const ssize_t n = ::read(fd_, buffer, sizeof buffer);
        auto* event = reinterpret_cast<fanotify_event_metadata*>(buffer);
        for (ssize_t left = n; left > 0 && FAN_EVENT_OK(event, left);
             event = FAN_EVENT_NEXT(event, left)) {
          if (event->fd < 0) continue;
          {
            std::lock_guard<std::mutex> locked(lock_);
            openers_ << pid_t(event->pid);
          }
          held.push_back({event->fd, std::chrono::steady_clock::now()});
        }
      }
      const auto now = std::chrono::steady_clock::now();
      for (auto it = held.begin(); it != held.end();) {
        if (release_ || now - it->since > limit_) {
          const fanotify_response answer{it->fd, FAN_ALLOW};
          (void)!::write(fd_, &answer, sizeof answer);
          ::close(it->fd);
          it = held.erase(it);
        } else {
          ++it;
        }
      }
      waiting_ = int(held.size());
    }
  }

  std::chrono::milliseconds limit_;
  int fd_ = -1;
  QString error_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, release_{false};
  std::atomic<int> waiting_{0};
  mutable std::mutex lock_;
  QList<pid_t> openers_;  // guarded by lock_
};

}  // namespace tessera::ui::testing
