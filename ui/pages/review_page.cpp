#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QFontDatabase>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QJsonArray>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QScrollArea>
#include <QTabWidget>
#include <QVBoxLayout>
#include <cmath>

#include "core/error.h"
#include "ui/models/dataset_analysis.h"
#include "ui/models/hub_calls.h"
#include "ui/models/model_info.h"
#include "ui/pages/hardware_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/error_text.h"
#include "ui/utility/folder_check.h"
#include "ui/utility/studio_settings.h"

namespace tessera::ui {

namespace {

QString number_text(double value) {
  return QString::number(value, 'g', 6);
}

// "train.jsonl: 60 rows, 54 to train on and 6 (10%) held out for validation"; the held-out
// count rounds up as the engine's split does (data/split.h).
QString data_text(const job::DatasetSpec& d, std::uint64_t rows, std::uint64_t skipped,
                  const QString& skipped_where) {
  QString text = dataset_display_name(d);
  if (!d.validation_files.empty()) {
    if (rows > 0) text += QObject::tr(": %1 rows to train on").arg(rows);
    QStringList names;
    for (const std::string& f : d.validation_files)
      names << QFileInfo(QString::fromStdString(f)).fileName();
    text += QObject::tr("; validation from %1").arg(names.join(", "));
  } else if (d.validation_split > 0) {
    if (rows > 0) {
      const auto held = std::uint64_t(std::ceil(d.validation_split * double(rows)));
      text += QObject::tr(": %1 rows, %2 to train on and %3 (%4%) held out for validation")
                  .arg(rows)
                  .arg(rows - std::min(held, rows))
                  .arg(held)
                  .arg(number_text(d.validation_split * 100));
    } else {
      text +=
          QObject::tr(", %1% held out for validation").arg(number_text(d.validation_split * 100));
    }
  } else {
    if (rows > 0) text += QObject::tr(": %1 rows to train on").arg(rows);
    text += QObject::tr(", no validation");
  }
  text += QObject::tr("; sequences up to %1 tokens").arg(d.max_length);
  if (d.skip_bad_rows)
    text +=
        skipped > 0
            ? QObject::tr("; %1 that cannot be used will be skipped%2")
                  .arg(count_text(qint64(skipped), QObject::tr("1 row"), QObject::tr("%1 rows")),
                       skipped_where.isEmpty() ? QString() : " (" + skipped_where + ")")
            : QObject::tr("; rows that cannot be used are skipped");
  return text;
}

// Each tier's peak against its capacity, as `tessera-cli plan` prints them.
QString memory_text(const QJsonArray& memory) {
  QStringList tiers;
  for (const QJsonValue& v : memory) {
    const QJsonObject t = v.toObject();
    tiers << QObject::tr("%1 (%2): peak %3 of %4")
                 .arg(t.value("tier").toString(), t.value("device").toString(),
                      human_bytes(std::uint64_t(t.value("peak").toDouble())),
                      human_bytes(std::uint64_t(t.value("budget").toDouble())));
  }
  return tiers.join("; ");
}

}  // namespace

ReviewPage::ReviewPage(CliProbe* probe, QWidget* parent) : QWidget(parent), probe_(probe) {
  auto* layout = new QVBoxLayout(this);
  readiness_ = new QLabel;
  readiness_->setWordWrap(true);
  readiness_->setFrameShape(QFrame::StyledPanel);
  readiness_->setMargin(fontMetrics().height() / 2);
  layout->addWidget(readiness_);

  auto* name_row = new QFormLayout;
  name_ = new QLineEdit;
  name_->setToolTip(tr("What the Runs page, the dashboard and Compare call this run"));
  name_row->addRow(tr("Run na&me:"), name_);
  layout->addLayout(name_row);

  tabs_ = new QTabWidget;
  auto* summary_page = new QWidget;
  summary_ = new QFormLayout(summary_page);
  summary_->setRowWrapPolicy(QFormLayout::WrapLongRows);
  summary_->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  for (const QString& label : QStringList{"Model", "Data", "Method", "Objective", "Length", "Batch",
                                          "Learning rate", "Precision", "Processes", "Strategy",
                                          "Changed to fit", "Time", "Memory", "Run folder"}) {
    auto* value = new QLabel;
    value->setWordWrap(true);
    value->setTextInteractionFlags(Qt::TextSelectableByMouse);
    summary_->addRow(label + ":", value);
    summary_rows_.append({label, value});
  }
  auto* scroll = new QScrollArea;
  scroll->setWidget(summary_page);
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  tabs_->addTab(scroll, tr("Summary"));
  json_ = new QPlainTextEdit;
  json_->setReadOnly(true);
  json_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  json_->setLineWrapMode(QPlainTextEdit::NoWrap);
  json_->setToolTip(tr("What `tessera-cli run` will execute"));
  tabs_->addTab(json_, tr("Job spec"));
  layout->addWidget(tabs_, 1);

  auto* folder_row = new QHBoxLayout;
  output_ = new QLabel;
  output_->setWordWrap(true);
  output_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  choose_folder_ = new QPushButton(tr("F&older…"));
  choose_folder_->setToolTip(tr("Choose the folder this run's own folder is made in"));
  folder_row->addWidget(output_, 1);
  folder_row->addWidget(choose_folder_);
  layout->addLayout(folder_row);
  folder_problem_ = new QLabel;
  folder_problem_->setWordWrap(true);
  folder_problem_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  folder_problem_->setVisible(false);
  layout->addWidget(folder_problem_);
  folder_checker_ = new WriteChecker(this);

  auto* buttons = new QHBoxLayout;
  save_ = new QPushButton(tr("&Save job spec…"));
  save_->setToolTip(tr("Write the job spec to a file; `tessera-cli run FILE` runs it headless"));
  launch_ = new QPushButton(tr("&Launch"));
  launch_->setDefault(true);
  buttons->addWidget(save_);
  buttons->addStretch(1);
  buttons->addWidget(launch_);
  layout->addLayout(buttons);

  connect(name_, &QLineEdit::textEdited, this, [this](const QString& text) {
    custom_name_ = text.trimmed();
    Q_EMIT nameChanged();
  });
  connect(choose_folder_, &QPushButton::clicked, this, [this] {
    const QString dir =
        QFileDialog::getExistingDirectory(this, tr("Folder for runs"), runs_folder());
    if (!dir.isEmpty()) choose_runs_folder(dir);
  });
  // The checker drops answers for a folder asked before the latest, so this is the run's.
  connect(folder_checker_, &WriteChecker::checked, this, [this] {
    const WriteCheck& check = folder_checker_->result();
    folder_problem_text_ = check.problem;
    QString advice = check.advice;
    if (folder_problem_text_.isEmpty() && check.found == WriteCheck::Found::Folder) {
      // Every run has a folder of its own: an empty one is fine, one with files is another's.
      folder_problem_text_ = tr("%1 already holds %2")
                                 .arg(check.path, count_text(check.entries, tr("1 file or folder"),
                                                             tr("%1 files and folders")));
      advice = tr("A run needs a new or empty folder: choose another folder for runs.");
    }
    folder_problem_->setStyleSheet("color: #c0392b");
    folder_problem_->setText(
        tr("⚠ The run cannot be written there: %1. %2").arg(folder_problem_text_, advice));
    folder_problem_->setVisible(!folder_problem_text_.isEmpty());
    update_launch();
  });
  connect(folder_checker_, &WriteChecker::slowed, this, [this] {
    folder_problem_->setText(tr("Still checking whether %1 can be written: its disk is slow to "
                                "answer (a network folder that is not reachable?).")
                                 .arg(folder_checker_->asked()));
  });
  connect(save_, &QPushButton::clicked, this, [this] {
    QString file = QFileDialog::getSaveFileName(
        this, tr("Save job spec"),
        QDir(settings::last_folder("spec"))
            .filePath(QFileInfo(QString::fromStdString(spec_.output.dir)).fileName() + ".json"),
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

void ReviewPage::reset_name() {
  custom_name_.clear();
  name_->clear();
}

QString ReviewPage::runs_folder() const {
  return chosen_folder_.isEmpty() ? settings::runs_root() : chosen_folder_;
}

void ReviewPage::choose_runs_folder(const QString& folder) {
  const QString dir = QDir::cleanPath(QFileInfo(folder).absoluteFilePath());
  // The Settings' folder again: follow Settings from now on.
  chosen_folder_ = dir == QDir::cleanPath(settings::runs_root()) ? QString() : dir;
  Q_EMIT folderChanged();
}

void ReviewPage::show_spec(const job::JobSpec& spec, const QStringList& missing,
                           const ReviewFacts& facts) {
  const bool new_folder = spec.output.dir != spec_.output.dir;
  spec_ = spec;
  missing_ = missing;
  planning_ = facts.planning;
  json_->setPlainText(QString::fromStdString(job::to_json(spec).dump(2)));
  // The default name follows the choices until the user types one; never while they edit.
  const QString name = QString::fromStdString(spec.name);
  if (custom_name_.isEmpty() && !name_->hasFocus() && name_->text() != name) name_->setText(name);
  name_->setPlaceholderText(name);
  output_->setText(tr("Run folder (new for this run): %1")
                       .arg(QDir::toNativeSeparators(QString::fromStdString(spec.output.dir))));
  ready_text_ = tr("✔ Ready: %1 on %2, %3.")
                    .arg(QString::fromStdString(spec.method.type),
                         QFileInfo(QString::fromStdString(spec.model.path)).fileName(),
                         dataset_display_name(spec.dataset));
  if (missing.isEmpty() && planning_)
    readiness_->setText(tr("Planning %1 on %2, %3 for this machine…")
                            .arg(QString::fromStdString(spec.method.type),
                                 QFileInfo(QString::fromStdString(spec.model.path)).fileName(),
                                 dataset_display_name(spec.dataset)));
  else if (missing.isEmpty())
    readiness_->setText(ready_text_);  // update_launch says otherwise where the folder stops it
  else
    readiness_->setText(tr("Not ready: %1.").arg(missing.join("; ")));
  show_summary(facts);
  if (new_folder) check_folder();
  update_launch();
}

void ReviewPage::show_summary(const ReviewFacts& facts) {
  const job::JobSpec& s = spec_;
  QMap<QString, QString> rows;
  if (!s.model.path.empty() || !s.model.hub_id.empty()) {
    QString model =
        facts.model_name.isEmpty() ? QString::fromStdString(s.model.path) : facts.model_name;
    if (facts.parameters > 0) model += tr(", %1 parameters").arg(human_count(facts.parameters));
    rows["Model"] = model;
  }
  if (!s.dataset.train_files.empty() || !s.dataset.hub_id.empty())
    rows["Data"] =
        data_text(s.dataset, facts.dataset_rows, facts.skipped_rows, facts.skipped_where);
  const QString base = s.method.quantize == "int8"
                           ? QString("int8")
                           : QString::fromStdString(s.method.quantize).toUpper();
  const QString scales = s.method.double_quant ? tr(", double-quantized scales") : QString();
  rows["Method"] = s.method.type != "lora" ? tr("full fine-tuning (every parameter is trained)")
                   : s.method.quantize != "none" ? tr("QLoRA (%1 base%2), rank %3 (alpha %4)")
                                                       .arg(base)
                                                       .arg(scales)
                                                       .arg(s.method.lora_rank)
                                                       .arg(number_text(s.method.lora_alpha))
                                                 : tr("LoRA, rank %1 (alpha %2)")
                                                       .arg(s.method.lora_rank)
                                                       .arg(number_text(s.method.lora_alpha));
  if (const auto& p = s.method.preference)
    rows["Objective"] = tr("%1, β %2 (preference tuning)")
                            .arg(QString::fromStdString(p->loss).toUpper())
                            .arg(number_text(p->beta));
  rows["Length"] = s.training.steps
                       ? tr("%1 steps").arg(*s.training.steps)
                       : tr("%1 epochs").arg(number_text(s.training.epochs.value_or(0)));
  rows["Batch"] = s.training.gradient_accumulation > 1
                      ? tr("%1 × %2 accumulation steps = %3 sequences per step")
                            .arg(s.training.batch_size)
                            .arg(s.training.gradient_accumulation)
                            .arg(s.training.batch_size * s.training.gradient_accumulation)
                      : tr("%1 sequences per step").arg(s.training.batch_size);
  if (s.training.activation_checkpointing) rows["Batch"] += tr(", activation checkpointing on");
  rows["Learning rate"] =
      tr("%1, %2 schedule, %3 warm-up steps")
          .arg(number_text(s.training.learning_rate), QString::fromStdString(s.training.schedule))
          .arg(s.training.warmup_steps);
  rows["Precision"] = QString::fromStdString(s.precision);
  rows["Run folder"] = QDir::toNativeSeparators(QString::fromStdString(s.output.dir));

  // Several processes: started with `tessera-cli launch` (the spec's "nodes").
  int processes = 1;
  QStringList where;
  if (s.nodes) {
    processes = 0;
    for (const job::NodeRanks& r : s.nodes->ranks_per_node) {
      processes += r.nproc;
      where << (r.name == job::kLocalNode
                    ? tr("%1 on this machine").arg(r.nproc)
                    : tr("%1 on %2").arg(r.nproc).arg(QString::fromStdString(r.name)));
    }
  }
  rows["Processes"] =
      processes == 1
          ? tr("1 process on this machine")
          : tr("%1 processes: %2 (tessera-cli launch)").arg(processes).arg(where.join(", "));

  // Strategy, time and memory are the plan's (the Hardware & strategy step's, same figures).
  const QString strategy = QString::fromStdString(s.strategy.name);
  if (!facts.plan.isEmpty()) {
    rows["Strategy"] = tr("%1: %2").arg(facts.plan.value("strategy").toString(),
                                        facts.plan.value("explanation").toString());
    const QStringList changes = plan_changes(facts.plan, s);
    if (!changes.isEmpty())
      rows["Changed to fit"] = tr("as set, the job does not fit at once; the engine will use %1")
                                   .arg(changes.join(", "));
    const QJsonObject time = facts.plan.value("time").toObject();
    rows["Time"] = plan_time_text(time) + " " +
                   (time.value("calibrated").toBool()
                        ? tr("(calibrated on this machine)")
                        : tr("(rough: no run of this job has been measured on this machine yet)"));
    rows["Memory"] = memory_text(facts.plan.value("memory").toArray());
  } else {
    QString why;
    if (!facts.planner_available)
      why = tr("not estimated: this tessera-cli has no `plan` command");
    else if (facts.planning)
      why = tr("planning…");
    else if (!facts.plan_error.isEmpty())
      why = tr("no plan: %1").arg(facts.plan_error);
    else
      why = tr("estimated once the job is complete");
    rows["Strategy"] =
        strategy == "auto" ? tr("auto (chosen for this machine when the run starts)") : strategy;
    rows["Time"] = why;
    rows["Memory"] = why;
  }
  for (const auto& [label, value] : summary_rows_) {
    const QString text = rows.value(label);
    value->setText(text);
    summary_->setRowVisible(value, !text.isEmpty());
  }
}

QString ReviewPage::summary_value(const QString& label) const {
  for (const auto& [l, value] : summary_rows_)
    if (l == label) return value->text();
  return {};
}

QString ReviewPage::summary_text() const {
  QStringList lines;
  for (const auto& [label, value] : summary_rows_)
    if (!value->text().isEmpty()) lines << label + ": " + value->text();
  return lines.join('\n');
}

QString ReviewPage::spec_text() const {
  return json_->toPlainText();
}

bool ReviewPage::folder_checked() const {
  return !spec_.output.dir.empty() &&
         folder_checker_->answered(QString::fromStdString(spec_.output.dir), WriteTarget::Folder);
}

void ReviewPage::check_folder() {
  if (spec_.output.dir.empty()) return;
  // Off the GUI thread: a folder on a network mount that does not answer must not freeze the
  // window. Launch waits for the answer.
  folder_checker_->check(QString::fromStdString(spec_.output.dir), WriteTarget::Folder);
  folder_problem_->setStyleSheet({});
  folder_problem_->setText(tr("Checking whether the run folder can be written…"));
  folder_problem_->setVisible(true);
  update_launch();
}

void ReviewPage::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  check_folder();  // the disk may have changed since the last look
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

QString ReviewPage::readiness_text() const {
  return readiness_->text();
}

void ReviewPage::update_launch() {
  save_->setEnabled(missing_.isEmpty());
  // The card says what the Launch button says: a folder the run cannot be written in stops it
  // (the card read "✔ Ready" beside a disabled Launch).
  if (missing_.isEmpty() && !planning_ && !ready_text_.isEmpty())
    readiness_->setText(
        folder_checked() && !folder_problem_text_.isEmpty()
            ? tr("Not ready: the run folder cannot be written: %1").arg(folder_problem_text_)
            : ready_text_);
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
  if (planning_) {
    // The plan can still say the job does not fit (step 4 then blocks): never launch before it.
    launch_->setEnabled(false);
    launch_->setText(tr("Waiting for the plan…"));
    return;
  }
  if (!folder_checked()) {
    launch_->setEnabled(false);
    launch_->setText(tr("Checking the run folder…"));
    return;
  }
  if (!folder_problem_text_.isEmpty()) {
    launch_->setEnabled(false);
    launch_->setText(tr("Choose a folder the run can be written in"));
    launch_->setToolTip(folder_problem_text_);
    return;
  }
  launch_->setEnabled(true);
  launch_->setText(tr("&Launch"));
}

}  // namespace tessera::ui
