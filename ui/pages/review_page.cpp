#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QFontDatabase>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QVBoxLayout>

#include "core/error.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/error_text.h"
#include "ui/utility/studio_settings.h"

namespace tessera::ui {

ReviewPage::ReviewPage(CliProbe* probe, QWidget* parent) : QWidget(parent), probe_(probe) {
  auto* layout = new QVBoxLayout(this);
  readiness_ = new QLabel;
  readiness_->setWordWrap(true);
  readiness_->setFrameShape(QFrame::StyledPanel);
  readiness_->setMargin(fontMetrics().height() / 2);
  layout->addWidget(readiness_);
  output_ = new QLabel;
  output_->setWordWrap(true);
  output_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(output_);
  auto* box = new QGroupBox(tr("Job spec (what `tessera-cli run` will execute)"));
  auto* box_layout = new QVBoxLayout(box);
  json_ = new QPlainTextEdit;
  json_->setReadOnly(true);
  json_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  json_->setLineWrapMode(QPlainTextEdit::NoWrap);
  box_layout->addWidget(json_);
  layout->addWidget(box, 1);
  auto* buttons = new QHBoxLayout;
  save_ = new QPushButton(tr("&Save job spec…"));
  save_->setToolTip(tr("Write the job spec to a file; `tessera-cli run FILE` runs it headless"));
  launch_ = new QPushButton(tr("&Launch"));
  launch_->setDefault(true);
  buttons->addWidget(save_);
  buttons->addStretch(1);
  buttons->addWidget(launch_);
  layout->addLayout(buttons);

  connect(save_, &QPushButton::clicked, this, [this] {
    QString file = QFileDialog::getSaveFileName(
        this, tr("Save job spec"),
        QDir(settings::last_folder("spec")).filePath(QString::fromStdString(spec_.name) + ".json"),
        tr("Job spec (*.json)"));
    if (file.isEmpty()) return;
    settings::set_last_folder("spec", QFileInfo(file).absolutePath());
    QString error = save_spec(file);
    if (!error.isEmpty()) QMessageBox::warning(this, tr("Save job spec"), error);
  });
  connect(launch_, &QPushButton::clicked, this, [this] { Q_EMIT launchRequested(spec_); });
  connect(probe_, &CliProbe::probed, this, &ReviewPage::update_launch);
  update_launch();
}

void ReviewPage::show_spec(const job::JobSpec& spec, const QStringList& missing) {
  spec_ = spec;
  missing_ = missing;
  json_->setPlainText(QString::fromStdString(job::to_json(spec).dump(2)));
  output_->setText(
      tr("Output folder (new for this run): %1").arg(QString::fromStdString(spec.output.dir)));
  if (missing.isEmpty())
    readiness_->setText(tr("✔ Ready: %1 on %2, %3.")
                            .arg(QString::fromStdString(spec.method.type),
                                 QFileInfo(QString::fromStdString(spec.model.path)).fileName(),
                                 dataset_display_name(spec.dataset)));
  else
    readiness_->setText(tr("Not ready: %1.").arg(missing.join("; ")));
  update_launch();
}

QString ReviewPage::spec_text() const {
  return json_->toPlainText();
}

QString ReviewPage::save_spec(const QString& path) const {
  try {
    job::save_job_spec(spec_, path.toStdString());
  } catch (const Error& e) {
    return error_text(e);
  } catch (const std::exception& e) {
    return QString::fromStdString(e.what());
  }
  return {};
}

void ReviewPage::update_launch() {
  save_->setEnabled(missing_.isEmpty());
  if (!probe_->finished()) {
    launch_->setEnabled(false);
    launch_->setText(tr("Checking tessera-cli…"));
    return;
  }
  if (!probe_->ok() || !probe_->supports("run")) {
    launch_->setEnabled(false);
    launch_->setText(tr("Training is not available in this build"));
    launch_->setToolTip(probe_->ok() ? tr("%1 has no `run` command yet; save the job spec and "
                                          "run it with a tessera-cli that has one")
                                           .arg(probe_->program())
                                     : probe_->problem());
    return;
  }
  launch_->setToolTip({});
  if (!missing_.isEmpty()) {
    launch_->setEnabled(false);
    launch_->setText(missing_.first());  // the button names what is missing
    return;
  }
  launch_->setEnabled(true);
  launch_->setText(tr("&Launch"));
}

}  // namespace tessera::ui
