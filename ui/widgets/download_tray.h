#pragma once
// The download tray: Hub downloads owned by the main window, so they go on while the user moves
// between pages. One row per download (a model, or chosen files of a dataset at a revision):
// progress (bytes, rate), Pause (the client stops and keeps blobs/<etag>.incomplete), Resume
// (downloads again: the client resumes with Range), Cancel (stops and removes the partial files),
// and "ready" only once the client returned — every file verified (LFS SHA-256) and linked into
// the snapshot. "Fine-tune this model" / "Use this dataset" hand the snapshot folder to the
// wizard. Each download runs on a pool thread; its progress reaches the row through queued calls,
// and a row is never destroyed while its worker runs.
#include <QElapsedTimer>
#include <QFrame>
#include <QFuture>
#include <QList>
#include <atomic>
#include <memory>

#include "ui/models/hub_calls.h"

class QLabel;
class QProgressBar;
class QPushButton;
class QVBoxLayout;

namespace tessera::ui {

class HubToken;

class DownloadRow : public QFrame {
  Q_OBJECT
 public:
  enum class State { Downloading, Pausing, Paused, Cancelling, Cancelled, Failed, Ready };
  DownloadRow(HubDownloadRequest request, HubToken* token, QWidget* parent = nullptr);
  ~DownloadRow() override;  // stops the worker and waits for it (partial files stay)

  const HubDownloadRequest& request() const { return request_; }
  const QString& repo_id() const { return request_.repo_id; }
  State state() const { return state_; }
  QString status_text() const;
  const QString& snapshot() const { return snapshot_; }
  const HubFailure& failure() const { return failure_; }
  std::int64_t done_bytes() const { return done_bytes_; }
  QPushButton* pause_button() const { return pause_; }
  QPushButton* cancel_button() const { return cancel_; }
  QPushButton* use_button() const { return use_; }
  bool running() const { return future_.isRunning(); }

  void start();  // or resume
  void pause();
  void cancel();

 Q_SIGNALS:
  void stateChanged();
  void useRequested(const QString& snapshot);
  void dismissRequested();

 private:
  void progressed(std::int64_t done, std::int64_t total, int files_done, int files_total);
  void retrying(const QString& note, qint64 wait_ms);
  void finished(bool ok, bool cancelled, const QString& snapshot, const HubFailure& failure);
  void remove_partial_files();
  void set_state(State state);
  void update_view();

  HubDownloadRequest request_;
  HubToken* token_;
  State state_ = State::Paused;
  std::shared_ptr<std::atomic<bool>> stop_;
  QFuture<void> future_;
  std::int64_t done_bytes_ = 0;
  std::int64_t total_bytes_ = 0;
  int files_done_ = 0;
  int files_total_ = 0;
  double rate_bytes_per_s_ = 0;
  QElapsedTimer clock_;
  QList<QPair<qint64, std::int64_t>> samples_;  // (ms, done bytes) of the last seconds: the rate
  QString snapshot_;
  HubFailure failure_;
  QString retry_note_;         // a request waits to be tried again: why and for how long
  qint64 retry_until_ms_ = 0;  // on clock_
  QLabel* name_;
  QProgressBar* bar_;
  QLabel* status_;
  QPushButton* pause_;
  QPushButton* cancel_;
  QPushButton* use_;
  QPushButton* dismiss_;
};

class DownloadTray : public QFrame {
  Q_OBJECT
 public:
  explicit DownloadTray(HubToken* token, QWidget* parent = nullptr);
  ~DownloadTray() override;

  // Starts downloading `request`, or resumes its paused / failed row (a ready one stays ready).
  void download(const HubDownloadRequest& request);
  void download(const QString& model_repo_id);  // a model: what Tessera trains from, at main
  DownloadRow* row(const HubDownloadRequest& request) const;
  DownloadRow* row(const QString& model_repo_id) const;
  QList<DownloadRow*> rows() const { return rows_; }

 Q_SIGNALS:
  void useModel(const QString& snapshot);
  void useDataset(const tessera::ui::HubDownloadRequest& request, const QString& snapshot);
  void modelReady(const QString& repo_id);  // a model's download finished (the cache changed)
  // A dataset's download finished, verified: `snapshot` holds the request's files.
  void datasetReady(const tessera::ui::HubDownloadRequest& request, const QString& snapshot);

 private:
  HubToken* token_;
  QVBoxLayout* list_;
  QList<DownloadRow*> rows_;
};

}  // namespace tessera::ui
