#include "ui/dialogs/about_dialog.h"

#include <QDialogButtonBox>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QProcess>
#include <QTimer>
#include <QVBoxLayout>

namespace tessera::ui {

QStringList version_lines(const QByteArray& json) {
  const QJsonObject o = QJsonDocument::fromJson(json).object();
  if (!o.value("tessera").isString()) return {};
  const int gpus = o.value("gpu_count").toInt();
  // Where there is no CUDA runtime, why: the CUDA module's own account (no driver, not installed).
  QString cuda = QObject::tr("CUDA: none");
  if (o.value("cuda").isString())
    cuda = QObject::tr("CUDA %1").arg(o.value("cuda").toString());
  else if (o.value("cuda_module").isString())
    cuda = QObject::tr("CUDA: none (%1)").arg(o.value("cuda_module").toString());
  return {
      QObject::tr("Tessera %1").arg(o.value("tessera").toString()),
      o.value("libtorch").isString()
          ? QObject::tr("LibTorch %1").arg(o.value("libtorch").toString())
          : QObject::tr("LibTorch: not built in"),
      cuda,
      gpus > 0 ? QObject::tr("GPU: %n visible", nullptr, gpus) : QObject::tr("GPU: none visible")};
}

AboutDialog::AboutDialog(const QString& cli, QWidget* parent) : QDialog(parent), cli_(cli) {
  setWindowTitle(tr("About Tessera Studio"));
  auto* layout = new QVBoxLayout(this);
  auto* title =
      new QLabel(tr("<b>Tessera Studio</b><br>Fine-tunes HuggingFace models on this "
                    "machine; training runs in tessera-cli."));
  title->setWordWrap(true);
  layout->addWidget(title);
  versions_ = new QLabel(tr("Asking %1 for its versions…").arg(cli_));
  versions_->setWordWrap(true);
  versions_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(versions_);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  layout->addWidget(buttons);

  process_ = new QProcess(this);
  connect(process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError error) {
    if (error == QProcess::FailedToStart)
      show_versions({tr("Could not start %1: %2").arg(cli_, process_->errorString())});
  });
  connect(process_, &QProcess::finished, this, [this](int code, QProcess::ExitStatus status) {
    const QStringList lines = version_lines(process_->readAllStandardOutput());
    if (status == QProcess::NormalExit && code == 0 && !lines.isEmpty())
      show_versions(lines);
    else if (status == QProcess::NormalExit && code == 2)
      show_versions({tr("%1 has no version command (an older build)").arg(cli_)});
    else
      show_versions(
          {tr("%1 version failed: %2")
               .arg(cli_, QString::fromUtf8(process_->readAllStandardError()).trimmed())});
  });
  QTimer::singleShot(15000, this, [this] {
    if (finished_) return;
    process_->kill();
    show_versions({tr("%1 did not answer within 15 s").arg(cli_)});
  });
  process_->start(cli_, {"version", "--json"});
}

AboutDialog::~AboutDialog() {
  process_->disconnect(this);
  if (process_->state() != QProcess::NotRunning) {
    process_->kill();
    process_->waitForFinished(1000);
  }
}

void AboutDialog::show_versions(const QStringList& engine_lines) {
  if (finished_) return;
  finished_ = true;
  QStringList lines = engine_lines;
  lines << tr("Qt %1").arg(QString::fromLatin1(qVersion()));
  lines << tr("tessera-cli: %1").arg(cli_);
  versions_->setText(lines.join('\n'));
  Q_EMIT versionsShown();
}

QString AboutDialog::text() const {
  return versions_->text();
}

}  // namespace tessera::ui
