#include "ui/widgets/download_tray.h"

#include <sys/file.h>
#include <unistd.h>

#include <QHBoxLayout>
#include <QLabel>
#include <QMetaObject>
#include <QProgressBar>
#include <QPushButton>
#include <QTimer>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "hf/hub/client.h"
#include "ui/models/model_info.h"
#include "ui/utility/hub_token.h"

namespace tessera::ui {

namespace hub = hf::hub;
namespace fs = std::filesystem;

namespace {

QString bytes_text(std::int64_t n) {
  return human_bytes(std::uint64_t(std::max<std::int64_t>(0, n)));
}

// Removes blobs/*.incomplete of the repository in the cache, each only when its blob lock can be
// taken at once (a file another process is writing is left alone). Blocking file work: call it
// off the GUI thread.
void remove_incomplete_blobs(const hub::Settings& settings, const std::string& repo_id,
                             hub::RepoType type) {
  const hub::CacheRepo repo(settings.cache_dir, repo_id, type);
  std::error_code ec;
  for (fs::directory_iterator it(repo.dir() / "blobs", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string suffix = ".incomplete";
    if (!name.ends_with(suffix)) continue;
    const std::string etag = name.substr(0, name.size() - suffix.size());
    const fs::path lock = repo.lock_path(etag);
    fs::create_directories(lock.parent_path(), ec);
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code rm;
      fs::remove(it->path(), rm);
      ::flock(fd, LOCK_UN);
    }
    ::close(fd);
  }
}

}  // namespace

DownloadRow::DownloadRow(HubDownloadRequest request, HubToken* token, QWidget* parent)
    : QFrame(parent), request_(std::move(request)), token_(token) {
  setFrameShape(QFrame::StyledPanel);
  setObjectName("download:" + request_.repo_id);
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(6, 3, 6, 3);
  name_ = new QLabel(request_.label.isEmpty() ? request_.repo_id : request_.label);
  name_->setToolTip(request_.include.isEmpty() ? request_.repo_id
                                               : tr("%1 at %2: %3")
                                                     .arg(request_.repo_id, request_.revision,
                                                          request_.include.join(", ")));
  QFont f = name_->font();
  f.setBold(true);
  name_->setFont(f);
  bar_ = new QProgressBar;
  bar_->setRange(0, 1000);
  bar_->setTextVisible(false);
  bar_->setMaximumHeight(fontMetrics().height());
  status_ = new QLabel;
  status_->setMinimumWidth(fontMetrics().averageCharWidth() * 38);
  pause_ = new QPushButton(tr("Pause"));
  cancel_ = new QPushButton(tr("Cancel"));
  const bool dataset = request_.type == hub::RepoType::Dataset;
  use_ = new QPushButton(dataset ? tr("Use this dataset") : tr("Fine-tune this model"));
  use_->setToolTip(dataset ? tr("Choose these files as the New fine-tune wizard's dataset")
                           : tr("Choose this model in the New fine-tune wizard"));
  dismiss_ = new QPushButton(tr("Dismiss"));
  layout->addWidget(name_);
  layout->addWidget(bar_, 1);
  layout->addWidget(status_);
  layout->addWidget(pause_);
  layout->addWidget(cancel_);
  layout->addWidget(use_);
  layout->addWidget(dismiss_);
  connect(pause_, &QPushButton::clicked, this, [this] {
    if (state_ == State::Downloading)
      pause();
    else if (state_ == State::Paused || state_ == State::Failed)
      start();
  });
  connect(cancel_, &QPushButton::clicked, this, &DownloadRow::cancel);
  connect(use_, &QPushButton::clicked, this, [this] { Q_EMIT useRequested(snapshot_); });
  connect(dismiss_, &QPushButton::clicked, this, &DownloadRow::dismissRequested);
  update_view();
}

DownloadRow::~DownloadRow() {
  if (stop_) *stop_ = true;
  future_.waitForFinished();
}

void DownloadRow::start() {
  if (state_ == State::Downloading || state_ == State::Pausing || state_ == State::Cancelling)
    return;
  future_.waitForFinished();  // a stopped worker that has not quite returned yet
  failure_ = {};
  stop_ = std::make_shared<std::atomic<bool>>(false);
  samples_.clear();
  rate_bytes_per_s_ = 0;
  clock_.start();
  set_state(State::Downloading);
  retry_note_.clear();
  hub::Settings settings = hub_settings(token_ ? token_->keychain_token() : std::string());
  // A rate limit's Retry-After may hold the download for minutes: the row says why it waits.
  settings.on_retry = [this](const hub::RetryNotice& n) {
    const QString note = QString::fromStdString(hub::describe(n));
    const qint64 wait_ms = qint64(std::ceil(n.wait_s * 1000.0));
    QMetaObject::invokeMethod(
        this, [this, note, wait_ms] { retrying(note, wait_ms); }, Qt::QueuedConnection);
  };
  future_ = QtConcurrent::run([this, settings, stop = stop_, request = request_] {
    // `this` outlives the worker: the destructor waits for it. Calls into the row are queued.
    const std::string repo = request.repo_id.toStdString();
    hub::DownloadParams params;
    params.type = request.type;
    params.revision = request.revision.toStdString();
    for (const QString& pattern : request.include) params.include.push_back(pattern.toStdString());
    params.cancel = stop.get();
    params.on_progress = [this](const hub::DownloadProgress& p) {
      QMetaObject::invokeMethod(
          this,
          [this, done = p.done_bytes, total = p.total_bytes, fd = p.files_done,
           ft = p.files_total] { progressed(done, total, fd, ft); },
          Qt::QueuedConnection);
    };
    bool ok = false;
    bool cancelled = false;
    QString snapshot;
    HubFailure failure;
    try {
      hub::Client client(settings);
      const hub::DownloadResult result = client.download(repo, params);
      snapshot = QString::fromStdString(result.snapshot.string());
      ok = true;
    } catch (const hub::DownloadCancelled&) {
      cancelled = true;
    } catch (const std::exception& e) {
      failure = hub_failure(e, !settings.token.empty());
      cancelled = stop->load();
    }
    QMetaObject::invokeMethod(
        this,
        [this, ok, cancelled, snapshot, failure] { finished(ok, cancelled, snapshot, failure); },
        Qt::QueuedConnection);
  });
}

void DownloadRow::pause() {
  if (state_ != State::Downloading) return;
  set_state(State::Pausing);
  *stop_ = true;
}

void DownloadRow::cancel() {
  if (state_ == State::Downloading || state_ == State::Pausing) {
    set_state(State::Cancelling);
    *stop_ = true;  // finished() removes the partial files once the worker stopped
    return;
  }
  if (state_ == State::Paused || state_ == State::Failed) {
    set_state(State::Cancelling);
    remove_partial_files();
  }
}

void DownloadRow::remove_partial_files() {
  future_ = QtConcurrent::run([this, settings = hub_settings(std::string()),
                               repo = request_.repo_id.toStdString(), type = request_.type] {
    remove_incomplete_blobs(settings, repo, type);
    QMetaObject::invokeMethod(
        this, [this] { set_state(State::Cancelled); }, Qt::QueuedConnection);
  });
}

void DownloadRow::progressed(std::int64_t done, std::int64_t total, int files_done,
                             int files_total) {
  if (state_ != State::Downloading) return;  // a report queued before a pause
  done_bytes_ = done;
  total_bytes_ = total;
  files_done_ = files_done;
  files_total_ = files_total;
  const qint64 now = clock_.elapsed();
  samples_.push_back({now, done});
  while (samples_.size() > 2 && now - samples_.front().first > 3000) samples_.pop_front();
  const qint64 span_ms = now - samples_.front().first;
  if (span_ms > 200)
    rate_bytes_per_s_ = double(done - samples_.front().second) * 1000.0 / double(span_ms);
  update_view();
}

void DownloadRow::retrying(const QString& note, qint64 wait_ms) {
  if (state_ != State::Downloading) return;
  retry_note_ = note;
  retry_until_ms_ = clock_.elapsed() + wait_ms;
  update_view();
  // The note goes when the wait is over, whether or not bytes come.
  QTimer::singleShot(std::max<qint64>(0, wait_ms) + 50, this, [this] { update_view(); });
}

void DownloadRow::finished(bool ok, bool cancelled, const QString& snapshot,
                           const HubFailure& failure) {
  if (ok) {
    snapshot_ = snapshot;
    done_bytes_ = total_bytes_;
    files_done_ = files_total_;
    set_state(State::Ready);
    return;
  }
  if (state_ == State::Cancelling) {
    remove_partial_files();
    return;
  }
  if (cancelled) {
    set_state(State::Paused);
    return;
  }
  failure_ = failure;
  set_state(State::Failed);
}

void DownloadRow::set_state(State state) {
  state_ = state;
  update_view();
  Q_EMIT stateChanged();
}

QString DownloadRow::status_text() const {
  const QString amounts =
      total_bytes_ > 0 ? tr("%1 of %2").arg(bytes_text(done_bytes_), bytes_text(total_bytes_))
                       : QString();
  switch (state_) {
    case State::Downloading:
      if (!retry_note_.isEmpty() && clock_.elapsed() < retry_until_ms_)
        return amounts.isEmpty() ? retry_note_ : amounts + " · " + retry_note_;
      if (total_bytes_ <= 0) return tr("Starting…");
      return amounts + (rate_bytes_per_s_ > 0
                            ? tr(" · %1/s").arg(bytes_text(std::int64_t(rate_bytes_per_s_)))
                            : QString());
    case State::Pausing:
      return tr("Pausing…");
    case State::Paused:
      return amounts.isEmpty() ? tr("Paused") : tr("Paused at %1").arg(amounts);
    case State::Cancelling:
      return tr("Cancelling…");
    case State::Cancelled:
      return tr("Cancelled; partial files removed");
    case State::Failed:
      return tr("Failed: %1").arg(failure_.message.section('\n', 0, 0));
    case State::Ready:
      return tr("Ready: %1, %2, verified")
          .arg(count_text(files_total_, tr("1 file"), tr("%1 files")), bytes_text(total_bytes_));
  }
  return {};
}

void DownloadRow::update_view() {
  status_->setText(status_text());
  status_->setToolTip(state_ == State::Failed  ? failure_.message + "\n" + failure_.hint
                      : state_ == State::Ready ? snapshot_
                                               : QString());
  bar_->setValue(total_bytes_ > 0 ? int(1000 * done_bytes_ / total_bytes_) : 0);
  bar_->setVisible(state_ != State::Ready && state_ != State::Cancelled);
  pause_->setText(state_ == State::Downloading || state_ == State::Pausing ? tr("Pause")
                  : state_ == State::Failed                                ? tr("Retry")
                                                                           : tr("Resume"));
  pause_->setVisible(state_ == State::Downloading || state_ == State::Pausing ||
                     state_ == State::Paused || state_ == State::Failed);
  pause_->setEnabled(state_ != State::Pausing);
  pause_->setToolTip(state_ == State::Downloading
                         ? tr("Stop now and keep what was received; Resume continues from there")
                         : tr("Continue from what was already received"));
  cancel_->setVisible(state_ == State::Downloading || state_ == State::Pausing ||
                      state_ == State::Paused || state_ == State::Failed);
  cancel_->setToolTip(tr("Stop and remove the partial files"));
  use_->setVisible(state_ == State::Ready);
  dismiss_->setVisible(state_ == State::Ready || state_ == State::Cancelled ||
                       state_ == State::Failed);
}

DownloadTray::DownloadTray(HubToken* token, QWidget* parent) : QFrame(parent), token_(token) {
  setFrameShape(QFrame::NoFrame);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* title = new QLabel(tr("Downloads"));
  QFont f = title->font();
  f.setBold(true);
  title->setFont(f);
  layout->addWidget(title);
  list_ = new QVBoxLayout;
  list_->setSpacing(2);
  layout->addLayout(list_);
  setVisible(false);
}

DownloadTray::~DownloadTray() {
  for (DownloadRow* r : rows_) r->pause();  // every worker is told at once; rows wait in turn
}

DownloadRow* DownloadTray::row(const HubDownloadRequest& request) const {
  for (DownloadRow* r : rows_)
    if (r->request().same_files(request)) return r;
  return nullptr;
}

DownloadRow* DownloadTray::row(const QString& model_repo_id) const {
  HubDownloadRequest request;
  request.repo_id = model_repo_id;
  return row(request);
}

void DownloadTray::download(const QString& model_repo_id) {
  HubDownloadRequest request;
  request.repo_id = model_repo_id;
  download(request);
}

void DownloadTray::download(const HubDownloadRequest& request) {
  DownloadRow* r = row(request);
  if (r == nullptr || r->state() == DownloadRow::State::Cancelled) {
    if (r != nullptr) {
      rows_.removeOne(r);
      r->deleteLater();
    }
    r = new DownloadRow(request, token_, this);
    rows_.push_back(r);
    list_->addWidget(r);
    connect(r, &DownloadRow::useRequested, this, [this, r](const QString& snapshot) {
      if (r->request().type == hub::RepoType::Dataset)
        Q_EMIT useDataset(r->request(), snapshot);
      else
        Q_EMIT useModel(snapshot);
    });
    connect(r, &DownloadRow::stateChanged, this, [this, r] {
      if (r->state() != DownloadRow::State::Ready) return;
      if (r->request().type == hub::RepoType::Dataset)
        Q_EMIT datasetReady(r->request(), r->snapshot());
      else
        Q_EMIT modelReady(r->repo_id());
    });
    connect(r, &DownloadRow::dismissRequested, this, [this, r] {
      if (r->running()) return;
      rows_.removeOne(r);
      r->deleteLater();
      setVisible(!rows_.isEmpty());
    });
  }
  setVisible(true);
  // A dataset asked for again is checked again (quick when its files are all in the cache), so
  // the page that asked hears "ready" from a verified snapshot.
  if (r->state() == DownloadRow::State::Ready && request.type == hub::RepoType::Model) return;
  if (!r->running()) r->start();
}

}  // namespace tessera::ui
