#include "ui/widgets/demo_offer.h"

#include <QDir>
#include <QFileInfo>
#include <QGridLayout>
#include <QLabel>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>

namespace tessera::ui {

DemoOffer::DemoOffer(QWidget* parent) : QFrame(parent) {
  setFrameShape(QFrame::StyledPanel);
  auto* layout = new QGridLayout(this);
  auto* text = new QLabel(
      tr("<b>New here?</b> Models come from a folder on this machine (a HuggingFace model "
         "folder), the HuggingFace cache that other tools downloaded into, or the Models page, "
         "which searches and downloads from the Hugging Face Hub. To start without a download, "
         "try the demo: a tiny model and a dataset of word puzzles made on this machine, which "
         "trains in minutes on a CPU."));
  text->setWordWrap(true);
  layout->addWidget(text, 0, 0, 1, 2);
  try_ = new QPushButton(tr("Try with the &demo model"));
  try_->setToolTip(
      tr("Makes the demo model and dataset (tessera-cli demo --no-train) and fills "
         "the wizard with them"));
  layout->addWidget(try_, 1, 0);
  progress_ = new QProgressBar;
  progress_->setVisible(false);
  layout->addWidget(progress_, 1, 1);
  status_ = new QLabel;
  status_->setWordWrap(true);
  status_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(status_, 2, 0, 1, 2);
  layout->setColumnStretch(1, 1);
  connect(try_, &QPushButton::clicked, this, &DemoOffer::tryRequested);
}

DemoOffer::~DemoOffer() {
  if (process_) {
    process_->disconnect(this);
    process_->kill();
    process_->waitForFinished(1000);
  }
}

bool DemoOffer::busy() const {
  return process_ != nullptr;
}

void DemoOffer::make_demo(const QString& cli, const QString& dir) {
  if (busy()) return;
  cli_ = cli;
  dir_ = dir;
  stderr_lines_.clear();
  try_->setEnabled(false);
  progress_->setRange(0, 0);  // the demo reports phases, not fractions
  progress_->setVisible(true);
  status_->setText(tr("Making the demo model and dataset in %1…").arg(dir));
  process_ = new QProcess(this);
  connect(process_, &QProcess::readyReadStandardError, this, [this] {
    for (const QByteArray& raw : process_->readAllStandardError().split('\n')) {
      QString line = QString::fromUtf8(raw).trimmed();
      if (line.isEmpty()) continue;
      stderr_lines_ << line;
      if (line.startsWith("== ")) status_->setText(line.mid(3));  // the demo's phases
    }
  });
  connect(process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError error) {
    if (error == QProcess::FailedToStart)
      fail(tr("Could not start %1 (%2). Check the tessera-cli path in Settings.")
               .arg(cli_, process_->errorString()));
  });
  connect(process_, &QProcess::finished, this, [this](int code, QProcess::ExitStatus status) {
    if (status == QProcess::NormalExit && code == 0 &&
        QFileInfo::exists(QDir(dir_).filePath("job.json"))) {
      process_->deleteLater();
      process_ = nullptr;
      progress_->setVisible(false);
      try_->setEnabled(true);
      status_->setText(tr("The demo model and dataset are in %1.").arg(dir_));
      Q_EMIT demoReady(dir_);
      return;
    }
    // The CLI's own "error: …" line says what went wrong; a build without LibTorch has no demo.
    QString why;
    for (const QString& line : stderr_lines_)
      if (line.startsWith("error: ")) why = line.mid(7);
    if (why.isEmpty() && stderr_lines_.join('\n').contains("unknown command"))
      why = tr("this tessera-cli has no demo command (it was built without LibTorch)");
    if (why.isEmpty() && status == QProcess::CrashExit) why = tr("tessera-cli crashed");
    if (why.isEmpty())
      why = stderr_lines_.isEmpty() ? tr("exit code %1").arg(code) : stderr_lines_.last();
    fail(tr("Could not make the demo: %1").arg(why));
  });
  process_->start(cli_, {"demo", "--no-train", "--out", dir_});
}

void DemoOffer::fail(const QString& why) {
  if (process_) {
    process_->deleteLater();
    process_ = nullptr;
  }
  progress_->setVisible(false);
  try_->setEnabled(true);
  status_->setText(why);
}

}  // namespace tessera::ui
