#include "ui/hardware_page.h"

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QFileInfo>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHorizontalStackedBarSeries>
#include <QJsonArray>
#include <QJsonDocument>
#include <QLabel>
#include <QSpinBox>
#include <QVBoxLayout>
#include <QValueAxis>
#include <cmath>

#include "core/error.h"
#include "ui/run_dashboard.h"
#include "ui/studio_settings.h"

namespace tessera::ui {

namespace {

constexpr int kDebounceMs = 300;

// The process-wide profile: the machine does not change while the studio runs, and the disk
// measurement takes seconds.
QJsonObject& cached_profile() {
  static QJsonObject profile;
  return profile;
}

double gib(double bytes) {
  return bytes / double(1ull << 30);
}

QString bytes_text(double bytes) {
  if (bytes >= double(1ull << 30)) return QString("%1 GiB").arg(gib(bytes), 0, 'f', 2);
  return QString("%1 MiB").arg(bytes / double(1ull << 20), 0, 'f', 0);
}

QString step_time_text(double seconds) {
  if (seconds > 0 && seconds < 1) return QString("%1 ms").arg(seconds * 1000, 0, 'f', 0);
  return format_duration(seconds);
}

QString speed_text(double bytes_per_s) {
  return QString("%1 MB/s").arg(bytes_per_s / 1e6, 0, 'f', 0);
}

struct Category {
  const char* key;
  const char* label;
};
constexpr Category kCategories[] = {{"weights", "weights"},
                                    {"gradients", "gradients"},
                                    {"optimizer", "optimizer state"},
                                    {"activations", "activations"},
                                    {"runtime", "runtime (and load or export peak)"}};

QString first_line_of(const QByteArray& text) {
  for (const QByteArray& line : text.split('\n'))
    if (!line.trimmed().isEmpty()) return QString::fromUtf8(line.trimmed());
  return {};
}

}  // namespace

HardwarePage::HardwarePage(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  auto* machine_box = new QGroupBox(tr("This machine"));
  auto* machine_layout = new QVBoxLayout(machine_box);
  machine_ = new QLabel(tr("Profiling this machine…"));
  machine_->setWordWrap(true);
  machine_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  machine_layout->addWidget(machine_);
  layout->addWidget(machine_box);

  auto* strategy_box = new QGroupBox(tr("Strategy"));
  auto* strategy_layout = new QVBoxLayout(strategy_box);
  strategy_ = new QLabel(tr("Waiting for the job's settings…"));
  strategy_->setWordWrap(true);
  strategy_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  QFont bold = strategy_->font();
  bold.setBold(true);
  strategy_->setFont(bold);
  reasons_ = new QLabel;
  reasons_->setWordWrap(true);
  reasons_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  time_ = new QLabel;
  warning_ = new QLabel;
  warning_->setWordWrap(true);
  warning_->setFrameShape(QFrame::StyledPanel);
  warning_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  warning_->setVisible(false);
  strategy_layout->addWidget(strategy_);
  strategy_layout->addWidget(reasons_);
  strategy_layout->addWidget(time_);
  strategy_layout->addWidget(warning_);
  layout->addWidget(strategy_box);

  auto* chart = new QChart;
  chart->setTitle(tr("Estimated peak memory against what is usable"));
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setBackgroundBrush(palette().color(QPalette::Base));
  chart->setTitleBrush(palette().color(QPalette::Text));
  chart->legend()->setLabelColor(palette().color(QPalette::Text));
  series_ = new QHorizontalStackedBarSeries;
  for (const Category& c : kCategories) sets_ << new QBarSet(tr(c.label));
  sets_ << new QBarSet(tr("free (usable)")) << new QBarSet(tr("headroom kept free"));
  sets_[sets_.size() - 2]->setColor(palette().color(QPalette::Midlight));
  sets_.back()->setColor(palette().color(QPalette::Mid));
  series_->append(sets_);
  chart->addSeries(series_);
  tiers_axis_ = new QBarCategoryAxis;
  bytes_axis_ = new QValueAxis;
  bytes_axis_->setTitleText(tr("GiB"));
  bytes_axis_->setLabelFormat("%.2f");
  for (QAbstractAxis* axis :
       {static_cast<QAbstractAxis*>(tiers_axis_), static_cast<QAbstractAxis*>(bytes_axis_)}) {
    axis->setLabelsColor(palette().color(QPalette::Text));
    axis->setTitleBrush(palette().color(QPalette::Text));
  }
  chart->addAxis(tiers_axis_, Qt::AlignLeft);
  chart->addAxis(bytes_axis_, Qt::AlignBottom);
  series_->attachAxis(tiers_axis_);
  series_->attachAxis(bytes_axis_);
  chart_view_ = new QChartView(chart);
  chart_view_->setRenderHint(QPainter::Antialiasing);
  chart_view_->setMinimumHeight(fontMetrics().height() * 12);
  layout->addWidget(chart_view_, 1);

  auto* override_box = new QGroupBox(tr("Override"));
  auto* form = new QHBoxLayout(override_box);
  batch_ = new QSpinBox;
  batch_->setRange(1, 65536);
  batch_->setToolTip(
      tr("Sequences per optimizer step; the engine splits it into micro-batches "
         "with gradient accumulation when it does not fit at once"));
  checkpointing_ = new QCheckBox(tr("&Activation checkpointing"));
  checkpointing_->setToolTip(
      tr("Recompute activations in the backward pass: less memory, about a third more time"));
  precision_ = new QComboBox;
  precision_->addItem("fp32", "fp32");
  precision_->addItem("bf16", "bf16");
  precision_->setToolTip(tr("bf16 halves the weights' memory where the hardware supports it"));
  auto* batch_label = new QLabel(tr("&Batch size:"));
  batch_label->setBuddy(batch_);
  auto* precision_label = new QLabel(tr("&Precision:"));
  precision_label->setBuddy(precision_);
  form->addWidget(batch_label);
  form->addWidget(batch_);
  form->addSpacing(fontMetrics().averageCharWidth() * 2);
  form->addWidget(checkpointing_);
  form->addSpacing(fontMetrics().averageCharWidth() * 2);
  form->addWidget(precision_label);
  form->addWidget(precision_);
  form->addStretch(1);
  layout->addWidget(override_box);

  debounce_.setSingleShot(true);
  debounce_.setInterval(kDebounceMs);
  connect(&debounce_, &QTimer::timeout, this, &HardwarePage::start_plan);
  auto changed = [this] {
    if (loading_overrides_) return;
    Q_EMIT overridesChanged(batch_->value(), checkpointing_->isChecked(),
                            precision_->currentData().toString());
  };
  connect(batch_, &QSpinBox::valueChanged, this, changed);
  connect(checkpointing_, &QCheckBox::toggled, this, changed);
  connect(precision_, &QComboBox::currentIndexChanged, this, changed);
}

HardwarePage::~HardwarePage() {
  for (QProcess* p : {profile_process_, plan_process_}) {
    if (p && p->state() != QProcess::NotRunning) {
      p->disconnect(this);
      p->kill();
      p->waitForFinished(2000);
    }
  }
}

void HardwarePage::set_cli(const QString& cli) {
  if (cli == cli_) return;
  cli_ = cli;
  warning_->setVisible(false);
  start_profile();
  if (have_spec_) debounce_.start();
}

void HardwarePage::set_unavailable(const QString& why) {
  machine_->setText(why);
  strategy_->setText(why);
}

void HardwarePage::set_waiting(const QString& why) {
  strategy_->setText(why);
  if (cached_profile().isEmpty() && !profile_process_) start_profile();
}

bool HardwarePage::busy() const {
  const auto running = [](QProcess* p) { return p && p->state() != QProcess::NotRunning; };
  return running(profile_process_) || running(plan_process_) || debounce_.isActive();
}

QString HardwarePage::explanation() const {
  return plan_.value("explanation").toString();
}

void HardwarePage::plan(const job::JobSpec& spec) {
  spec_ = spec;
  have_spec_ = true;
  loading_overrides_ = true;  // the spec's values, not the user's edit
  batch_->setValue(int(std::clamp<std::int64_t>(spec.training.batch_size, 1, 65536)));
  checkpointing_->setChecked(spec.training.activation_checkpointing);
  if (const int i = precision_->findData(QString::fromStdString(spec.precision)); i >= 0)
    precision_->setCurrentIndex(i);
  loading_overrides_ = false;
  if (cached_profile().isEmpty() && !profile_process_) start_profile();
  debounce_.start();
}

void HardwarePage::start_profile() {
  if (!cached_profile().isEmpty()) {
    profile_ = cached_profile();
    show_profile();
    return;
  }
  if (cli_.isEmpty()) return;
  if (profile_process_) return;  // already asking
  profile_process_ = new QProcess(this);
  connect(profile_process_, &QProcess::finished, this,
          [this, p = profile_process_](int code, QProcess::ExitStatus status) {
            p->deleteLater();
            profile_process_ = nullptr;
            const auto doc = QJsonDocument::fromJson(p->readAllStandardOutput());
            if (status != QProcess::NormalExit || code != 0 || !doc.isObject()) {
              const QString why = first_line_of(p->readAllStandardError());
              machine_->setText(tr("Could not profile this machine (%1 profile): %2")
                                    .arg(cli_, why.isEmpty() ? tr("exit code %1").arg(code) : why));
              Q_EMIT profiled();
              return;
            }
            cached_profile() = doc.object();
            profile_ = doc.object();
            show_profile();
          });
  connect(profile_process_, &QProcess::errorOccurred, this,
          [this, p = profile_process_](QProcess::ProcessError e) {
            if (e != QProcess::FailedToStart) return;
            machine_->setText(tr("Could not start %1: %2").arg(cli_, p->errorString()));
            p->deleteLater();
            profile_process_ = nullptr;
            Q_EMIT profiled();
          });
  // The disk is the runs folder's: that is where checkpoints and spilled state go.
  QString dir = settings::runs_root();
  for (QFileInfo info(dir); !info.exists() && info.absolutePath() != info.absoluteFilePath();
       info = QFileInfo(info.absolutePath()))
    dir = info.absolutePath();
  profile_process_->start(cli_, {"profile", "--json", "--dir", dir});
}

void HardwarePage::show_profile() {
  const QJsonObject cpu = profile_.value("cpu").toObject();
  const QJsonObject mem = profile_.value("memory").toObject();
  QStringList isa;
  const QJsonObject flags = cpu.value("isa").toObject();
  for (auto it = flags.begin(); it != flags.end(); ++it)
    if (it.value().toBool()) isa << it.key();
  QStringList lines;
  lines << tr("CPU: %1 — %2 cores (%3 threads), %4")
               .arg(cpu.value("model").toString())
               .arg(cpu.value("physical_cores").toInt())
               .arg(cpu.value("logical_cores").toInt())
               .arg(isa.isEmpty() ? tr("no AVX2") : isa.join(", "));
  QString ram = tr("RAM: %1 total, %2 available, %3 usable by a job")
                    .arg(bytes_text(mem.value("total").toDouble()),
                         bytes_text(mem.value("available").toDouble()),
                         bytes_text(mem.value("usable").toDouble()));
  if (mem.value("simulated").toBool()) ram += tr(" (simulated budget)");
  if (!mem.value("cgroup_limit").isNull())
    ram += tr(", container limit %1").arg(bytes_text(mem.value("cgroup_limit").toDouble()));
  lines << ram;
  if (profile_.value("disk").isObject()) {
    const QJsonObject disk = profile_.value("disk").toObject();
    QString text =
        tr("Disk: %1 free at %2")
            .arg(bytes_text(disk.value("free").toDouble()), disk.value("path").toString());
    if (disk.value("measured").toBool())
      text += tr(", write %1, read %2")
                  .arg(speed_text(disk.value("write_bytes_per_s").toDouble()),
                       speed_text(disk.value("read_bytes_per_s").toDouble()));
    lines << text;
  }
  const QJsonArray gpus = profile_.value("gpus").toArray();
  if (gpus.isEmpty()) {
    lines << tr("GPU: none (training runs on the CPU)");
  } else {
    for (const QJsonValue& g : gpus)
      lines << tr("GPU: %1, %2")
                   .arg(g.toObject().value("name").toString(),
                        bytes_text(g.toObject().value("memory").toDouble()));
  }
  if (profile_.contains("os")) lines << tr("OS: %1").arg(profile_.value("os").toString());
  machine_->setText(lines.join('\n'));
  Q_EMIT profiled();
}

void HardwarePage::start_plan() {
  if (!have_spec_ || cli_.isEmpty()) return;
  if (plan_process_) {
    replan_ = true;  // the running plan is for an older spec
    return;
  }
  if (!tmp_.isValid()) return show_plan_error(tr("cannot create a temporary folder"));
  const QString file = QDir(tmp_.path()).filePath("job.json");
  try {
    job::save_job_spec(spec_, file.toStdString());
  } catch (const Error& e) {
    return show_plan_error(QString::fromStdString(e.what()));
  }
  strategy_->setText(tr("Planning…"));
  plan_process_ = new QProcess(this);
  connect(plan_process_, &QProcess::finished, this,
          [this, p = plan_process_](int code, QProcess::ExitStatus status) {
            p->deleteLater();
            plan_process_ = nullptr;
            // A job that does not fit exits 2 and still prints the plan.
            const auto doc = QJsonDocument::fromJson(p->readAllStandardOutput());
            if (status == QProcess::NormalExit && (code == 0 || code == 2) && doc.isObject() &&
                doc.object().contains("fits")) {
              show_plan(doc.object());
            } else {
              const QString why = first_line_of(p->readAllStandardError());
              show_plan_error(why.isEmpty() ? tr("exit code %1").arg(code) : why);
            }
            if (replan_) {
              replan_ = false;
              start_plan();
            }
          });
  connect(plan_process_, &QProcess::errorOccurred, this,
          [this, p = plan_process_](QProcess::ProcessError e) {
            if (e != QProcess::FailedToStart) return;
            p->deleteLater();
            plan_process_ = nullptr;
            show_plan_error(tr("could not start %1: %2").arg(cli_, p->errorString()));
          });
  plan_process_->start(cli_, {"plan", file, "--json"});
}

void HardwarePage::show_plan_error(const QString& message) {
  plan_ = {};
  fits_ = false;
  strategy_->setText(tr("No plan: %1").arg(message));
  reasons_->clear();
  time_->clear();
  for (QBarSet* set : sets_) set->remove(0, set->count());
  Q_EMIT planned();
}

void HardwarePage::show_plan(const QJsonObject& plan) {
  plan_ = plan;
  fits_ = plan.value("fits").toBool();
  strategy_->setText(plan.value("explanation").toString());
  QStringList reasons;
  for (const QJsonValue& r : plan.value("reasons").toArray()) reasons << "• " + r.toString();
  reasons_->setText(reasons.join('\n'));

  const QJsonObject time = plan.value("time").toObject();
  QString time_text = tr("Time (rough): %1 per step")
                          .arg(step_time_text(time.value("seconds_per_step").toDouble()));
  if (!time.value("total_seconds").isNull())
    time_text += tr(", %1 in total for %2 steps")
                     .arg(format_duration(time.value("total_seconds").toDouble()))
                     .arg(time.value("steps").toInteger());
  time_->setText(time_text);

  // What the user asked for against what the plan had to do to fit.
  const QJsonObject s = plan.value("settings").toObject();
  QStringList changes;
  if (s.value("micro_batch").toInteger() < spec_.training.batch_size)
    changes << tr("micro-batch %1 with %2 accumulation steps")
                   .arg(s.value("micro_batch").toInteger())
                   .arg(s.value("gradient_accumulation").toInteger());
  if (s.value("activation_checkpointing").toBool() && !spec_.training.activation_checkpointing)
    changes << tr("activation checkpointing");
  if (s.value("method").toString().toStdString() != spec_.method.type)
    changes << tr("%1 instead of %2")
                   .arg(s.value("method").toString(), QString::fromStdString(spec_.method.type));
  if (s.value("precision").toString().toStdString() != spec_.precision)
    changes << tr("%1 instead of %2")
                   .arg(s.value("precision").toString(), QString::fromStdString(spec_.precision));
  if (!fits_) {
    QString text = tr("⚠ These settings will not fit on this machine: %1")
                       .arg(plan.value("explanation").toString());
    warning_->setText(text);
    warning_->setVisible(true);
  } else if (!changes.isEmpty()) {
    warning_->setText(tr("⚠ As set, this job does not fit at once; the engine will use %1.")
                          .arg(changes.join(", ")));
    warning_->setVisible(true);
  } else {
    warning_->setVisible(false);
  }

  // One bar per tier: what holds the memory, then what is left of the usable budget, then the
  // headroom the plan keeps free; the bar's end is the tier's capacity (or the peak beyond it).
  for (QBarSet* set : sets_) set->remove(0, set->count());
  QBarSet* free_set = sets_[sets_.size() - 2];
  QBarSet* headroom_set = sets_.back();
  QStringList tiers;
  const QJsonArray memory = plan.value("memory").toArray();
  double widest = 0;
  for (const QJsonValue& v : memory) {
    const QJsonObject t = v.toObject();
    QString name = t.value("tier").toString() + " (" + t.value("device").toString() + ")";
    if (t.value("simulated").toBool()) name += tr(", simulated");
    tiers << name;
    const QJsonObject by = t.value("by_category").toObject();
    double used = 0;
    for (int i = 0; i < int(std::size(kCategories)); ++i) {
      const double bytes = by.value(kCategories[i].key).toDouble();
      used += bytes;
      *sets_[i] << gib(bytes);
    }
    // The peak may exceed the sum of the categories: the load peak (weights + the mapped
    // checkpoint), the export peak, or the runtime's measured floor. That part is drawn with the
    // runtime, so the bar still ends at the tier's capacity.
    const double peak = std::max(used, t.value("peak").toDouble());
    QBarSet* runtime_set = sets_[int(std::size(kCategories)) - 1];
    if (peak > used)
      runtime_set->replace(runtime_set->count() - 1,
                           runtime_set->at(runtime_set->count() - 1) + gib(peak - used));
    const double budget = t.value("budget").toDouble();
    const double usable = t.value("usable_after_headroom").toDouble(budget);
    *free_set << gib(std::max(0.0, usable - peak));
    *headroom_set << gib(std::max(0.0, budget - std::max(usable, peak)));
    widest = std::max({widest, peak, budget});
  }
  tiers_axis_->clear();
  tiers_axis_->append(tiers);
  bytes_axis_->setRange(0, std::max(gib(widest) * 1.05, 0.01));
  Q_EMIT planned();
}

}  // namespace tessera::ui
