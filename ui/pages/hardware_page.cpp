#include "ui/pages/hardware_page.h"

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QComboBox>
#include <QCursor>
#include <QDir>
#include <QFileInfo>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHorizontalStackedBarSeries>
#include <QJsonArray>
#include <QJsonDocument>
#include <QLabel>
#include <QListWidget>
#include <QPushButton>
#include <QSlider>
#include <QSpinBox>
#include <QThread>
#include <QToolTip>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "job/strategies.h"
#include "ui/pages/run_dashboard.h"
#include "ui/utility/folder_check.h"
#include "ui/utility/studio_settings.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/layouts_table.h"

namespace tessera::ui {

namespace {

constexpr int kDebounceMs = 300;
constexpr int kOffloadStepPercent = 25;  // the slider's notches: 0, 25, 50, 75, 100%

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

// The same batch size as the Method page's (training.batch_size), said the same way: they read
// "per micro-batch" there and "per optimizer step" here.
QString batch_tip(std::int64_t accumulation) {
  const QString step = accumulation > 1
                           ? QObject::tr("this × %1 (the gradient accumulation)").arg(accumulation)
                           : QObject::tr("this (gradient accumulation 1)");
  return QObject::tr(
             "The Method page's batch size: sequences per micro-batch; a step trains %1. "
             "When a micro-batch does not fit, the plan splits it into smaller ones with "
             "more accumulation, keeping the sequences per step, and says so")
      .arg(step);
}

QString speed_text(double bytes_per_s) {
  return QString("%1 MB/s").arg(bytes_per_s / 1e6, 0, 'f', 0);
}

struct Category {
  const char* key;
  const char* label;
  int color;  // series_color(): the first four as the dashboard's memory charts draw them
};
constexpr Category kCategories[] = {{"weights", "weights", 0},
                                    {"gradients", "gradients", 1},
                                    {"optimizer", "optimizer state", 2},
                                    {"activations", "activations", 3},
                                    // ddp's and zero's, and sharded gemini's (they were drawn
                                    // as "runtime and peaks")
                                    {"gradient_buckets", "gradient buckets", 4},
                                    {"gathered_chunks", "gathered chunks", 5},
                                    // last: the peak beyond the categories is added to it
                                    {"runtime", "runtime and peaks", 7}};

QString percent_text(double fraction) {
  return QString("%1%").arg(std::lround(fraction * 100));
}

QString first_line_of(const QByteArray& text) {
  for (const QByteArray& line : text.split('\n'))
    if (!line.trimmed().isEmpty()) return QString::fromUtf8(line.trimmed());
  return {};
}

// A hybrid layout in the strategy list (its data: LayoutsTable::hybrid_key, which
// strategy_spec reads back) and its text.
QString hybrid_label(int tp, int pp, int zero_stage, bool sequence_parallel) {
  QString label = HardwarePage::tr("hybrid: tensor %1 × pipeline %2").arg(tp).arg(pp);
  if (sequence_parallel) label += HardwarePage::tr(", sequence parallel");
  if (zero_stage > 0) label += HardwarePage::tr(", ZeRO-%1").arg(zero_stage);
  return label;
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

  // Processes: on this machine, and one on each paired node chosen.
  auto* processes_box = new QGroupBox(tr("Processes"));
  auto* processes_layout = new QVBoxLayout(processes_box);
  auto* processes_row = new QHBoxLayout;
  processes_ = new QSpinBox;
  processes_->setRange(1, std::max(1, QThread::idealThreadCount()));
  processes_->setToolTip(
      tr("Training processes (ranks) on this machine, each with its share of the cores; above "
         "one the job runs with a strategy that distributes (tessera-cli launch)"));
  auto* processes_label = new QLabel(tr("Processes on this &machine:"));
  processes_label->setBuddy(processes_);
  distributed_ = new QComboBox;
  distributed_->addItem(tr("auto (the planner chooses)"), QString("auto"));
  distributed_->setToolTip(
      tr("How the processes share the work: the strategies that distribute, as the planner "
         "lists them for this job"));
  distributed_->setEnabled(false);
  // Hybrid's layouts have long names ("hybrid: tensor 2 × pipeline 2, sequence parallel").
  distributed_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  auto* distributed_label = new QLabel(tr("S&trategy:"));
  distributed_label->setBuddy(distributed_);
  processes_row->addWidget(processes_label);
  processes_row->addWidget(processes_);
  processes_row->addSpacing(fontMetrics().averageCharWidth() * 2);
  processes_row->addWidget(distributed_label);
  processes_row->addWidget(distributed_);
  processes_row->addStretch(1);
  processes_layout->addLayout(processes_row);
  auto* nodes_label = new QLabel(tr("Paired nod&es (one process each):"));
  nodes_list_ = new QListWidget;
  nodes_list_->setAccessibleName(tr("Paired nodes"));
  nodes_list_->setMaximumHeight(fontMetrics().height() * 5);
  nodes_label->setBuddy(nodes_list_);
  processes_layout->addWidget(nodes_label);
  processes_layout->addWidget(nodes_list_);
  processes_note_ = new QLabel;
  processes_note_->setWordWrap(true);
  processes_note_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  processes_layout->addWidget(processes_note_);
  // Every layout the planner weighed for the processes, to sort and pick from.
  layouts_ = new LayoutsTable;
  layouts_->setVisible(false);
  processes_layout->addWidget(layouts_);
  connect(layouts_, &LayoutsTable::layoutPicked, this, [this](const QString& key) {
    const int index = distributed_->findData(key);
    if (index >= 0) distributed_->setCurrentIndex(index);  // plans the job again
  });
  layout->addWidget(processes_box);
  const auto processes_changed = [this] {
    if (loading_overrides_) return;
    update_processes();
    Q_EMIT strategyChanged();
  };
  connect(processes_, &QSpinBox::valueChanged, this, processes_changed);
  connect(nodes_list_, &QListWidget::itemChanged, this, processes_changed);
  connect(distributed_, &QComboBox::currentIndexChanged, this, [this, processes_changed] {
    // The sliders' shares are gemini's: a strategy of several processes chosen that is not
    // gemini drops them (they would not apply), and the sliders show its plan again.
    if (!loading_overrides_ && distributed_choice() != "gemini" && offload_override_ >= 0) {
      offload_override_ = -1;
      param_override_ = -1;
    }
    processes_changed();
  });

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
  alternatives_ = new QLabel;
  alternatives_->setWordWrap(true);
  alternatives_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  alternatives_->setVisible(false);
  time_->setWordWrap(true);
  strategy_layout->addWidget(strategy_);
  strategy_layout->addWidget(reasons_);
  strategy_layout->addWidget(time_);
  strategy_layout->addWidget(alternatives_);
  strategy_layout->addWidget(warning_);
  layout->addWidget(strategy_box);

  auto* chart = new QChart;
  chart->setTitle(tr("Estimated peak memory of each tier against its capacity"));
  // Qt's legend cut its nine entries to "optimizer…", "gradient …" and showed no figures: the
  // legend is text under the chart instead, a line per tier with each part's bytes.
  chart->legend()->hide();
  chart->setBackgroundBrush(palette().color(QPalette::Base));
  chart->setTitleBrush(palette().color(QPalette::Text));
  series_ = new QHorizontalStackedBarSeries;
  for (const Category& c : kCategories) {
    sets_ << new QBarSet(tr(c.label));
    sets_.back()->setColor(series_color(c.color));
    sets_.back()->setBorderColor(series_color(c.color));
  }
  sets_ << new QBarSet(tr("free (usable)")) << new QBarSet(tr("headroom kept free"));
  sets_[sets_.size() - 2]->setColor(palette().color(QPalette::Midlight));
  sets_.back()->setColor(palette().color(QPalette::Mid));
  series_->append(sets_);
  chart->addSeries(series_);
  tiers_axis_ = new QBarCategoryAxis;
  bytes_axis_ = new QValueAxis;
  // Each bar is scaled to its own tier: the disk's free space dwarfs the RAM.
  bytes_axis_->setTitleText(tr("% of the tier's capacity"));
  bytes_axis_->setLabelFormat("%.0f");
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
  memory_legend_ = new QLabel;
  memory_legend_->setObjectName("memoryLegend");
  memory_legend_->setTextFormat(Qt::RichText);
  memory_legend_->setWordWrap(true);
  memory_legend_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(memory_legend_);
  for (int i = 0; i < sets_.size(); ++i)
    connect(sets_[i], &QBarSet::hovered, this, [this, i](bool status, int index) {
      if (!status || index < 0 || index >= shown_tiers_.size()) return QToolTip::hideText();
      QToolTip::showText(
          QCursor::pos(),
          tr("%1: %2 %3 of %4")
              .arg(shown_tiers_[index], sets_[i]->label(), bytes_text(shown_bytes(index, i)),
                   bytes_text(shown_capacity(index))),
          chart_view_);
    });
  disk_ = new QLabel;
  disk_->setWordWrap(true);
  disk_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  disk_->setVisible(false);
  layout->addWidget(disk_);

  auto* override_box = new QGroupBox(tr("Override"));
  auto* override_layout = new QVBoxLayout(override_box);
  auto* form = new QHBoxLayout;
  override_layout->addLayout(form);
  batch_ = new QSpinBox;
  batch_->setRange(1, 65536);
  batch_->setToolTip(batch_tip(1));
  checkpointing_ = new QCheckBox(tr("&Activation checkpointing"));
  checkpointing_->setToolTip(
      tr("Recompute activations in the backward pass: less memory, about a third more time"));
  precision_ = new QComboBox;
  precision_->addItem("fp32", "fp32");
  precision_->addItem("bf16", "bf16");
  precision_->setToolTip(tr("bf16 halves the weights' memory where the hardware supports it"));
  auto* batch_label = new QLabel(tr("Batch si&ze:"));
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

  // Optimizer state and parameters off the tier that computes (full fine-tuning): strategy
  // gemini, on disk where it computes on the CPU, in host RAM where it computes on a GPU.
  // Their tooltips say where the share goes (update_offload).
  const auto make_slider = [this] {
    auto* slider = new QSlider(Qt::Horizontal);
    slider->setRange(0, 100 / kOffloadStepPercent);
    slider->setSingleStep(1);
    slider->setPageStep(1);
    slider->setTickPosition(QSlider::TicksBelow);
    slider->setTickInterval(1);
    slider->setMinimumWidth(fontMetrics().averageCharWidth() * 24);
    return slider;
  };
  const int label_width = std::max(fontMetrics().horizontalAdvance(tr("&Optimizer state on disk:")),
                                   fontMetrics().horizontalAdvance(tr("Pa&rameters on disk:")));
  offload_row_ = new QWidget;
  auto* offload_layout = new QHBoxLayout(offload_row_);
  offload_layout->setContentsMargins(0, 0, 0, 0);
  offload_ = make_slider();
  offload_label_ = new QLabel(tr("&Optimizer state on disk:"));
  offload_label_->setBuddy(offload_);
  offload_label_->setMinimumWidth(label_width);
  offload_value_ = new QLabel;
  offload_value_->setMinimumWidth(fontMetrics().horizontalAdvance(tr("100% (auto)")));
  offload_reset_ = new QPushButton(tr("Let the planner &choose"));
  offload_reset_->setToolTip(
      tr("Drop the override: the planner moves optimizer state off the memory that computes (to "
         "disk on the CPU, to RAM on a GPU) only when the job does not fit there otherwise, and "
         "parameters only when that is not enough"));
  offload_layout->addWidget(offload_label_);
  offload_layout->addWidget(offload_);
  offload_layout->addWidget(offload_value_);
  offload_layout->addWidget(offload_reset_);
  offload_layout->addStretch(1);
  param_row_ = new QWidget;
  auto* param_layout = new QHBoxLayout(param_row_);
  param_layout->setContentsMargins(0, 0, 0, 0);
  param_offload_ = make_slider();
  param_label_ = new QLabel(tr("Pa&rameters on disk:"));
  param_label_->setBuddy(param_offload_);
  param_label_->setMinimumWidth(label_width);
  param_offload_value_ = new QLabel;
  param_offload_value_->setMinimumWidth(fontMetrics().horizontalAdvance(tr("100% (auto)")));
  param_layout->addWidget(param_label_);
  param_layout->addWidget(param_offload_);
  param_layout->addWidget(param_offload_value_);
  param_layout->addStretch(1);
  offload_note_ = new QLabel;
  offload_note_->setWordWrap(true);
  offload_note_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  override_layout->addWidget(offload_row_);
  override_layout->addWidget(param_row_);
  override_layout->addWidget(offload_note_);
  offload_row_->setVisible(false);
  param_row_->setVisible(false);
  offload_note_->setVisible(false);
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
  connect(offload_, &QSlider::valueChanged, this,
          [this](int notch) { offload_moved(/*parameters=*/false, notch); });
  connect(param_offload_, &QSlider::valueChanged, this,
          [this](int notch) { offload_moved(/*parameters=*/true, notch); });
  connect(offload_reset_, &QPushButton::clicked, this, &HardwarePage::clear_offload_override);
  update_processes();
}

HardwarePage::~HardwarePage() {
  for (QProcess* p : {profile_process_, plan_process_, nodes_process_}) {
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
  refresh_nodes();
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

namespace {
bool running(const QProcess* p) {
  return p && p->state() != QProcess::NotRunning;
}
}  // namespace

bool HardwarePage::busy() const {
  return running(profile_process_) || planning();
}

bool HardwarePage::planning() const {
  return running(plan_process_) || debounce_.isActive();
}

QString HardwarePage::explanation() const {
  return plan_.value("explanation").toString();
}

int HardwarePage::local_processes() const {
  return processes_->value();
}

QStringList HardwarePage::chosen_nodes() const {
  QStringList names;
  for (int i = 0; i < nodes_list_->count(); ++i)
    if (nodes_list_->item(i)->checkState() == Qt::Checked)
      names << nodes_list_->item(i)->data(Qt::UserRole).toString();
  return names;
}

std::optional<job::NodesSpec> HardwarePage::nodes_spec() const {
  if (total_processes() <= 1) return std::nullopt;
  job::NodesSpec nodes = loaded_nodes_spec_.value_or(job::NodesSpec{});
  const auto loaded = nodes.ranks_per_node;
  nodes.ranks_per_node = {{job::kLocalNode, local_processes()}};
  for (const QString& name : chosen_nodes()) {
    job::NodeRanks ranks{name.toStdString(), 1};
    for (const job::NodeRanks& r : loaded)  // a cloned job's ranks on that node
      if (r.name == ranks.name) ranks.nproc = r.nproc;
    nodes.ranks_per_node.push_back(ranks);
  }
  return nodes;
}

void HardwarePage::load_nodes(const std::optional<job::NodesSpec>& nodes) {
  loaded_nodes_spec_ = nodes;
  loaded_nodes_.clear();
  int local = 1;
  if (nodes)
    for (const job::NodeRanks& r : nodes->ranks_per_node) {
      if (r.name == job::kLocalNode)
        local = r.nproc;
      else
        loaded_nodes_ << QString::fromStdString(r.name);
    }
  loading_overrides_ = true;
  processes_->setMaximum(std::max(processes_->maximum(), local));
  processes_->setValue(local);
  for (int i = 0; i < nodes_list_->count(); ++i) {
    QListWidgetItem* item = nodes_list_->item(i);
    item->setCheckState(
        loaded_nodes_.contains(item->data(Qt::UserRole).toString()) ? Qt::Checked : Qt::Unchecked);
  }
  loading_overrides_ = false;
  update_processes();
}

void HardwarePage::refresh_nodes() {
  if (cli_.isEmpty() || nodes_process_) return;
  nodes_process_ = new QProcess(this);
  connect(nodes_process_, &QProcess::finished, this, [this, p = nodes_process_](int code) {
    p->deleteLater();
    nodes_process_ = nullptr;
    if (code != 0) return update_processes();  // a tessera-cli without nodes: none to offer
    const QStringList checked = chosen_nodes() + loaded_nodes_;
    loading_overrides_ = true;
    nodes_list_->clear();
    for (const QJsonValue& v : QJsonDocument::fromJson(p->readAllStandardOutput()).array()) {
      const QJsonObject node = v.toObject();
      const QString name = node.value("name").toString();
      auto* item = new QListWidgetItem(tr("%1 (%2:%3)")
                                           .arg(name, node.value("address").toString())
                                           .arg(node.value("port").toInt()),
                                       nodes_list_);
      item->setData(Qt::UserRole, name);
      item->setFlags(item->flags() | Qt::ItemIsUserCheckable);
      item->setCheckState(checked.contains(name) ? Qt::Checked : Qt::Unchecked);
    }
    loading_overrides_ = false;
    update_processes();
  });
  connect(nodes_process_, &QProcess::errorOccurred, this,
          [this, p = nodes_process_](QProcess::ProcessError e) {
            if (e != QProcess::FailedToStart) return;
            p->deleteLater();
            nodes_process_ = nullptr;
          });
  nodes_process_->start(cli_, {"nodes", "list", "--json"});
}

void HardwarePage::update_processes() {
  const int cores = profile_.value("cpu").toObject().value("logical_cores").toInt();
  if (cores > 0 && processes_->maximum() != std::max(cores, processes_->value())) {
    const bool was = loading_overrides_;
    loading_overrides_ = true;
    processes_->setMaximum(std::max(cores, processes_->value()));
    loading_overrides_ = was;
  }
  const int total = total_processes();
  distributed_->setEnabled(total > 1);
  const QStringList nodes = chosen_nodes();
  QString note;
  if (total == 1)
    note = tr("One process on this machine.");
  else if (nodes.isEmpty())
    note = tr("%1 processes on this machine, started with tessera-cli launch; the plan below is "
              "per process.")
               .arg(total);
  else
    note = tr("%1 processes: %2 on this machine and one on %3, started with tessera-cli launch "
              "after every node's pre-flight checks (see Nodes); the plan below is per process.")
               .arg(total)
               .arg(local_processes())
               .arg(nodes.join(", "));
  if (nodes_list_->count() == 0)
    note += " " + tr("No paired node: pair other machines on the Nodes page to use them here.");
  // A hybrid layout's batch is each data-parallel replica's (its tp · pp ranks share every
  // micro-batch): say what a step then trains, against whole replicas on every process (what
  // auto's rows of it assume).
  const job::StrategySpec chosen =
      total > 1 && have_spec_ ? strategy_spec(spec_.method.type) : job::StrategySpec{};
  if (chosen.name == "hybrid") {
    const int split =
        std::max(1, chosen.options.value("tp_size", 1) * chosen.options.value("pp_size", 1));
    const qint64 per_replica =
        qint64(spec_.training.batch_size) * qint64(spec_.training.gradient_accumulation);
    if (split > 1 && total % split == 0)
      note += " " + tr("With hybrid the batch is each data-parallel replica's and its %1 ranks "
                       "share every micro-batch: a step trains %2 sequences on %3 replica(s), "
                       "where a layout of whole replicas on every process trains %4. Multiply "
                       "gradient accumulation by %1 on the Method page to train as many.")
                        .arg(split)
                        .arg(per_replica * (total / split))
                        .arg(total / split)
                        .arg(per_replica * total);
  }
  processes_note_->setText(note);
  update_offload();
}

void HardwarePage::learn_strategies(const QJsonObject& plan) {
  if (plan.value("ranks").toObject().value("processes").toInt() <= 1) return;
  for (const QJsonValue& v : plan.value("strategies").toArray()) {
    const QJsonObject s = v.toObject();
    const QString name = s.value("strategy").toString();
    const int stage = s.value("zero_stage").toInt();
    // hybrid's layouts: one entry each.
    const int tp = s.value("tp_size").toInt(1), pp = s.value("pp_size").toInt(1);
    const bool hybrid = name == "hybrid";
    const bool sequence = s.value("sequence_parallel").toBool();
    const QString key = LayoutsTable::key_of(s);
    if (name.isEmpty() || distributed_->findData(key) >= 0) continue;
    const bool was = loading_overrides_;
    loading_overrides_ = true;
    distributed_->addItem(hybrid      ? hybrid_label(tp, pp, stage, sequence)
                          : stage > 0 ? tr("%1 stage %2").arg(name).arg(stage)
                                      : name,
                          key);
    loading_overrides_ = was;
  }
}

QString HardwarePage::distributed_choice() const {
  return distributed_->currentData().toString().section(':', 0, 0);
}

// The shares the sliders override, on gemini's options: off the device it computes on.
void HardwarePage::set_offload_options(job::StrategySpec& s) const {
  const SliderOptions keys = slider_options(gemini_on_device());
  s.options[keys.optimizer] = offload_override_ / 100.0;
  if (param_override_ > 0)
    s.options[keys.parameters] = param_override_ / 100.0;
  else
    s.options.erase(keys.parameters);
}

bool HardwarePage::gemini_on_device() const {
  const std::string device =
      loaded_strategy_.name == "gemini"
          ? job::strategy_option("gemini", loaded_strategy_.options, "device")
          : std::string("auto");
  if (device == "simulated") return true;  // the tests' device
  const int gpus = int(profile_.value("gpus").toArray().size());
  return job::device_for("gemini", device, total_processes(), local_processes(), gpus).device ==
         "cuda";
}

HardwarePage::SliderOptions HardwarePage::slider_options(bool on_device) {
  if (on_device) return {"host_optim_frac", "host_param_frac"};
  return {"offload_optim_frac", "offload_param_frac"};
}

job::StrategySpec HardwarePage::strategy_spec(const std::string& method) const {
  if (total_processes() > 1) {
    const QString choice = distributed_->currentData().toString();
    job::StrategySpec s;
    s.name = distributed_choice().toStdString();
    if (s.name == loaded_strategy_.name) s.options = loaded_strategy_.options;  // a clone's
    // gemini sharded over the processes, with the sliders' shares off the memory that computes
    // (offload_moved chose it in the list).
    if (s.name == "gemini" && offload_override_ >= 0 && method == "full") set_offload_options(s);
    if (s.name == "hybrid" && choice.contains(':')) {
      const QStringList sizes = choice.section(':', 1).split('x');
      s.options["tp_size"] = sizes.value(0).toInt();
      s.options["pp_size"] = sizes.value(1).toInt();
      if (sizes.value(2).toInt() > 0)
        s.options["zero_stage"] = sizes.value(2).toInt();
      else
        s.options.erase("zero_stage");
      if (sizes.value(3).toInt() > 0)
        s.options["sequence_parallel"] = true;
      else
        s.options.erase("sequence_parallel");
    } else if (choice.contains(':')) {
      s.options["stage"] = choice.section(':', 1).toInt();
    }
    return s;
  }
  if (offload_override_ < 0 || method != "full") return loaded_strategy_;
  job::StrategySpec s;
  if (loaded_strategy_.name == "gemini") s = loaded_strategy_;  // its other options kept
  s.name = "gemini";
  set_offload_options(s);
  return s;
}

void HardwarePage::select_distributed(const QString& key, const QString& label) {
  loading_overrides_ = true;
  if (distributed_->findData(key) < 0) distributed_->addItem(label, key);
  distributed_->setCurrentIndex(distributed_->findData(key));
  loading_overrides_ = false;
}

void HardwarePage::load_strategy(const job::StrategySpec& strategy) {
  loaded_strategy_ = strategy;
  // A job of several processes names one of these (gemini: of one process too; the list is
  // read only above one).
  if (strategy.name == "ddp" || strategy.name == "zero" || strategy.name == "gemini") {
    QString key = QString::fromStdString(strategy.name);
    if (strategy.name == "zero") key += QString(":%1").arg(strategy.options.value("stage", 1));
    select_distributed(key, key.contains(':') ? tr("zero stage %1").arg(key.section(':', 1)) : key);
  }
  if (strategy.name == "hybrid") {  // its layout, as learn_strategies keys it
    const int tp = strategy.options.value("tp_size", 2), pp = strategy.options.value("pp_size", 1);
    const int zero_stage = strategy.options.value("zero_stage", 0);
    const bool sequence = strategy.options.value("sequence_parallel", false);
    select_distributed(LayoutsTable::hybrid_key(tp, pp, zero_stage, sequence),
                       hybrid_label(tp, pp, zero_stage, sequence));
  }
  offload_override_ = -1;
  param_override_ = -1;
  if (strategy.name == "gemini") {
    const auto notch = [&](const std::string& key) {
      const double frac = strategy.options.value(key, 0.0);
      return int(std::lround(frac * 100 / kOffloadStepPercent)) * kOffloadStepPercent;
    };
    const SliderOptions keys = slider_options(gemini_on_device());
    offload_override_ = notch(keys.optimizer);
    param_override_ = notch(keys.parameters);
  }
  update_offload();
}

void HardwarePage::clear_offload_override() {
  if (offload_override_ < 0 && loaded_strategy_.name != "gemini") return;
  offload_override_ = -1;
  param_override_ = -1;
  loaded_strategy_ = {};
  loading_overrides_ = true;  // several processes: the planner chooses their strategy again
  distributed_->setCurrentIndex(distributed_->findData(QString("auto")));
  loading_overrides_ = false;
  update_processes();
  Q_EMIT strategyChanged();
}

void HardwarePage::offload_moved(bool parameters, int notch) {
  if (loading_overrides_) return;
  // The other slider stays where it stands (the planner's choice when it was auto).
  offload_override_ = (parameters ? offload_->value() : notch) * kOffloadStepPercent;
  param_override_ = (parameters ? notch : param_offload_->value()) * kOffloadStepPercent;
  if (total_processes() > 1 && distributed_choice() != "gemini") {
    // Several processes: the shares are gemini's, sharded over them; the list says so.
    select_distributed("gemini", "gemini");
    update_processes();  // its note and the sliders
  } else {
    update_offload();
  }
  Q_EMIT strategyChanged();
}

void HardwarePage::update_offload() {
  // gemini's shares, of one process or sharded over several: on disk where it computes on the
  // CPU, in host RAM where it computes on a GPU.
  const bool shown =
      have_spec_ && spec_.method.type == "full" && (!profile_.isEmpty() || !plan_.isEmpty());
  offload_row_->setVisible(shown);
  param_row_->setVisible(shown);
  offload_note_->setVisible(shown);
  if (!shown) return;
  const bool on_device = gemini_on_device();
  const SliderOptions keys = slider_options(on_device);
  // Where the sliders put their share, and where the rest stays.
  const QString away = on_device ? tr("in RAM") : tr("on disk");
  const QString home = on_device ? tr("on the GPU") : tr("in RAM");
  offload_label_->setText(on_device ? tr("&Optimizer state in RAM:")
                                    : tr("&Optimizer state on disk:"));
  param_label_->setText(on_device ? tr("Pa&rameters in RAM:") : tr("Pa&rameters on disk:"));
  offload_->setToolTip(
      on_device ? tr("The share of the optimizer state (Adam moments and float32 masters) kept in "
                     "host RAM instead of on the GPU, updated there by the CPU Adam from "
                     "gradients copied down: less GPU memory, more copies in each step "
                     "(strategy gemini, host_optim_frac)")
                : tr("The share of the optimizer state (Adam moments, and float32 masters in "
                     "bf16) kept in files on disk instead of in RAM: less memory, more disk "
                     "traffic in each optimizer update (strategy gemini, offload_optim_frac)"));
  param_offload_->setToolTip(
      on_device ? tr("The share of the parameter chunks kept in host RAM instead of on the GPU, "
                     "copied up block by block as the model uses them: less GPU memory, more "
                     "copies in every forward and backward (strategy gemini, host_param_frac)")
                : tr("The share of the parameters (every weight, in the training precision) kept "
                     "in files on disk instead of in RAM, read back block by block as the model "
                     "uses them: less memory, much more disk traffic in every forward and "
                     "backward (strategy gemini, offload_param_frac)"));
  const QJsonObject s = plan_.value("settings").toObject();
  const double planned = s.value(QString::fromStdString(keys.optimizer)).toDouble();
  const double planned_params = s.value(QString::fromStdString(keys.parameters)).toDouble();
  loading_overrides_ = true;  // the positions shown, not the user's move
  if (offload_override_ >= 0) {
    offload_->setValue(offload_override_ / kOffloadStepPercent);
    offload_value_->setText(QString("%1%").arg(offload_override_));
    param_offload_->setValue(std::max(param_override_, 0) / kOffloadStepPercent);
    param_offload_value_->setText(QString("%1%").arg(std::max(param_override_, 0)));
  } else {
    offload_->setValue(int(std::lround(planned * 100 / kOffloadStepPercent)));
    offload_value_->setText(tr("%1 (auto)").arg(percent_text(planned)));
    param_offload_->setValue(int(std::lround(planned_params * 100 / kOffloadStepPercent)));
    param_offload_value_->setText(tr("%1 (auto)").arg(percent_text(planned_params)));
  }
  loading_overrides_ = false;
  offload_reset_->setVisible(offload_override_ >= 0);
  const QString named = total_processes() > 1 ? distributed_choice() : QString();
  if (offload_override_ < 0 && !named.isEmpty() && named != "auto") {
    offload_note_->setText(
        named == "gemini"
            ? tr("Strategy gemini with the optimizer state and the parameters %1. Move a slider "
                 "to keep that share of each process's shards %2.")
                  .arg(home, away)
            : tr("Strategy %1 keeps the optimizer state and the parameters %2. Move a slider to "
                 "train with gemini instead, sharded over the processes with that share of each "
                 "one's %3.")
                  .arg(distributed_->currentText(), home, away));
    return;
  }
  if (offload_override_ < 0) {
    QString note;
    if (planned_params > 0)
      note = tr("The planner's choice: %1 of the optimizer state and %2 of the parameters %3, "
                "the least that lets this job fit %4.")
                 .arg(percent_text(planned), percent_text(planned_params), away, home);
    else if (planned > 0)
      note = tr("The planner's choice: %1 of the optimizer state %2, the least that lets this "
                "job fit %3.")
                 .arg(percent_text(planned), away, home);
    else
      note = tr("The planner's choice: all of the optimizer state and the parameters %1. Move a "
                "slider to keep part of them %2 instead.")
                 .arg(home, away);
    // On a GPU the planner spills to disk only past host RAM.
    const double disk_optim = s.value("offload_optim_frac").toDouble();
    const double disk_params = s.value("offload_param_frac").toDouble();
    if (on_device && (disk_optim > 0 || disk_params > 0))
      note += " " + tr("It also keeps %1 of the optimizer state and %2 of the parameters on disk.")
                        .arg(percent_text(disk_optim), percent_text(disk_params));
    offload_note_->setText(note);
    return;
  }
  const QString optim = tr("%1% of the optimizer state").arg(offload_override_);
  const QString params = tr("%1% of the parameters").arg(param_override_);
  QString note = tr("Override: strategy gemini with %1 %2.")
                     .arg(param_override_ <= 0     ? optim
                          : offload_override_ == 0 ? params
                                                   : tr("%1 and %2").arg(optim, params),
                          away);
  const QJsonObject time = plan_.value("time").toObject();
  const bool current = plan_is_for([this] {
    job::JobSpec spec = spec_;
    spec.strategy = strategy_spec(spec_.method.type);
    return spec;
  }());
  if (offload_override_ == 0 && param_override_ <= 0)
    note += " " + tr("Everything stays %1, even when it would not fit.").arg(home);
  else if (on_device)
    note += " " + tr("Less GPU memory, more copies between RAM and the GPU in each step.");
  else if (current && time.value("disk_bytes_per_step").toDouble() > 0)
    note += tr(" Less RAM; each step reads and writes %1 on disk.")
                .arg(bytes_text(time.value("disk_bytes_per_step").toDouble()));
  else
    note += tr(" Less RAM, more disk traffic per step.");
  offload_note_->setText(note);
}

void HardwarePage::plan(const job::JobSpec& spec) {
  spec_ = spec;
  have_spec_ = true;
  loading_overrides_ = true;  // the spec's values, not the user's edit
  batch_->setValue(int(std::clamp<std::int64_t>(spec.training.batch_size, 1, 65536)));
  batch_->setToolTip(batch_tip(spec.training.gradient_accumulation));
  checkpointing_->setChecked(spec.training.activation_checkpointing);
  if (const int i = precision_->findData(QString::fromStdString(spec.precision)); i >= 0)
    precision_->setCurrentIndex(i);
  loading_overrides_ = false;
  update_offload();
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
  profile_process_->start(
      cli_, {"profile", "--json", "--dir", nearest_existing_path(settings::runs_root())});
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
  update_processes();
  Q_EMIT profiled();
}

void HardwarePage::start_plan() {
  if (!have_spec_ || cli_.isEmpty()) return;
  if (plan_process_) {
    replan_ = true;  // the running plan is for an older spec
    return;
  }
  if (!tmp_.isValid()) return show_plan_error(tr("cannot create a temporary folder"));
  planning_spec_ = spec_;
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
            // A newer spec is waiting: this plan is stale, the latest one is shown.
            if (replan_ || debounce_.isActive()) {
              replan_ = false;
              if (!debounce_.isActive()) start_plan();
              return;
            }
            // A job that does not fit exits 2 and still prints the plan.
            const auto doc = QJsonDocument::fromJson(p->readAllStandardOutput());
            if (status == QProcess::NormalExit && (code == 0 || code == 2) && doc.isObject() &&
                doc.object().contains("fits")) {
              show_plan(doc.object());
            } else {
              const QString why = first_line_of(p->readAllStandardError());
              show_plan_error(why.isEmpty() ? tr("exit code %1").arg(code) : why);
            }
          });
  connect(plan_process_, &QProcess::errorOccurred, this,
          [this, p = plan_process_](QProcess::ProcessError e) {
            if (e != QProcess::FailedToStart) return;
            p->deleteLater();
            plan_process_ = nullptr;
            show_plan_error(tr("could not start %1: %2").arg(cli_, p->errorString()));
          });
  QStringList args{"plan", file, "--json"};
  // The disk tier's time needs the disk's speed: `profile` measured the runs folder and cached
  // it, so when the plan's folder is that one the measurement is reused, not repeated.
  const QJsonObject disk = profile_.value("disk").toObject();
  if (disk.value("measured").toBool() &&
      // The output folder, or its nearest existing parent before the first run (as plan does).
      QFileInfo(disk.value("path").toString()).absoluteFilePath() ==
          nearest_existing_path(QString::fromStdString(spec_.output.dir)))
    args << "--measure-disk";
  plan_process_->start(cli_, args);
}

void HardwarePage::show_plan_error(const QString& message) {
  plan_ = {};
  plan_error_ = message;
  planned_spec_ = planning_spec_;
  fits_ = false;
  strategy_->setText(tr("No plan: %1").arg(message));
  reasons_->clear();
  time_->clear();
  alternatives_->setVisible(false);
  layouts_->show_layouts({});
  layouts_->setVisible(false);
  show_memory({});
  update_offload();
  Q_EMIT planned();
}

void HardwarePage::show_plan(const QJsonObject& plan) {
  plan_ = plan;
  plan_error_.clear();
  planned_spec_ = planning_spec_;
  fits_ = plan.value("fits").toBool();
  learn_strategies(plan);
  const bool several = plan.value("ranks").toObject().value("processes").toInt() > 1;
  layouts_->show_layouts(several ? plan.value("strategies").toArray() : QJsonArray());
  layouts_->setVisible(several && layouts_->row_count() > 1);
  strategy_->setText(plan.value("explanation").toString());
  QStringList reasons;
  for (const QJsonValue& r : plan.value("reasons").toArray()) reasons << "• " + r.toString();
  reasons_->setText(reasons.join('\n'));

  const QJsonObject time = plan.value("time").toObject();
  // Measured on this machine (a run of this or a similar job) or the cost model's, said so.
  QString time_text = (time.value("calibrated").toBool() ? tr("Time: %1") : tr("Time (rough): %1"))
                          .arg(plan_time_text(time));
  const QString source = time.value("source").toString();
  if (!source.isEmpty()) time_text += "\n" + tr("(%1)").arg(source);
  time_->setText(time_text);

  QStringList alternatives;
  for (const QJsonValue& a : plan.value("alternatives").toArray())
    alternatives << "• " + a.toObject().value("summary").toString();
  alternatives_->setText(tr("Alternatives:\n%1").arg(alternatives.join('\n')));
  alternatives_->setVisible(!alternatives.isEmpty());

  const QStringList changes = plan_changes(plan, planned_spec_);
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

  show_memory(plan.value("memory").toArray());
  update_offload();
  Q_EMIT planned();
}

void HardwarePage::show_memory(const QJsonArray& memory) {
  // One bar per tier: what holds the memory, then what is left of the usable budget, then the
  // headroom the plan keeps free; the bar's end is the tier's capacity (or the peak beyond it).
  // Each bar is in percent of its own tier's capacity, so the host and disk bars both read.
  for (QBarSet* set : sets_) set->remove(0, set->count());
  shown_tiers_.clear();
  shown_capacity_.clear();
  shown_bytes_.clear();
  const int categories = int(std::size(kCategories));
  QStringList names;
  QStringList legend;  // a line per tier, the last tier first (as the bars are walked)
  QString disk_text;
  double widest = 100;
  // The first tier at the top: a horizontal bar chart draws its first category at the bottom.
  for (auto v = memory.end(); v != memory.begin();) {
    const QJsonObject t = (*--v).toObject();
    const QString tier = t.value("tier").toString();
    const double budget = t.value("budget").toDouble();
    QString name =
        tier == "disk"
            ? tr("disk, %1 free").arg(bytes_text(budget))
            : tr("%1 (%2), %3").arg(tier, t.value("device").toString(), bytes_text(budget));
    if (t.value("simulated").toBool()) name += tr(", simulated");
    names << name;
    const QJsonObject by = t.value("by_category").toObject();
    QList<double> bytes;
    double used = 0;
    for (int i = 0; i < categories; ++i) {
      bytes << by.value(kCategories[i].key).toDouble();
      used += bytes.back();
    }
    // The peak may exceed the sum of the categories: the load peak (weights + the mapped
    // checkpoint), the export peak, or the runtime's measured floor. That part is drawn with the
    // runtime, so the bar still ends at the tier's capacity. The disk holds only what is
    // offloaded: its training peak (its `peak` carries the RAM's runtime floor).
    const double peak = std::max(used, tier == "disk" ? t.value("training_peak").toDouble(used)
                                                      : t.value("peak").toDouble());
    bytes[categories - 1] += peak - used;
    const double usable = t.value("usable_after_headroom").toDouble(budget);
    bytes << std::max(0.0, usable - peak) << std::max(0.0, budget - std::max(usable, peak));
    const double scale = budget > 0 ? 100.0 / budget : 0.0;
    for (int i = 0; i < int(bytes.size()); ++i) *sets_[i] << bytes[i] * scale;
    widest = std::max(widest, peak * scale);
    shown_tiers_ << tier;
    shown_capacity_ << budget;
    shown_bytes_ << bytes;
    QStringList parts;
    for (int i = 0; i < int(bytes.size()); ++i)
      if (bytes[i] > 0)
        parts << QString("<span style=\"color:%1\">■</span>&nbsp;%2&nbsp;<b>%3</b>")
                     .arg(sets_[i]->color().name(),
                          sets_[i]->label().toHtmlEscaped().replace(' ', "&nbsp;"),
                          format_bytes(bytes[i]).replace(' ', "&nbsp;"));
    legend.prepend(name.toHtmlEscaped() + ": " + parts.join(" &nbsp; "));
    if (tier == "disk") {
      QStringList held;
      for (int i = 0; i < categories; ++i)
        if (bytes[i] > 0)
          held << tr("%1 of %2").arg(bytes_text(bytes[i]), tr(kCategories[i].label));
      disk_text = tr("Disk tier: %1 (%2 free), holding %3.")
                      .arg(t.value("device").toString(), bytes_text(budget),
                           held.isEmpty() ? tr("nothing") : held.join(tr(" and ")));
    }
  }
  disk_->setText(disk_text);
  disk_->setVisible(!disk_text.isEmpty());
  memory_legend_->setText(legend.join("<br>"));
  tiers_axis_->clear();
  tiers_axis_->append(names);
  bytes_axis_->setRange(0, widest);
  bytes_axis_->setTickCount(5);  // 0, 25, 50, 75, 100
  if (widest > 100) bytes_axis_->applyNiceNumbers();
}

QString plan_time_text(const QJsonObject& time) {
  QString text =
      QObject::tr("%1 per step").arg(format_step_time(time.value("seconds_per_step").toDouble()));
  if (!time.value("total_seconds").isNull()) {
    text += QObject::tr(", %1 in total for %2 steps")
                .arg(format_step_time(time.value("total_seconds").toDouble()))
                .arg(time.value("steps").toInteger());
    const qint64 evaluations = time.value("evaluations").toInteger();
    const QString each = format_step_time(time.value("seconds_per_evaluation").toDouble());
    if (evaluations == 1)
      text += QObject::tr(" and 1 evaluation (%1)").arg(each);
    else if (evaluations > 1)
      text += QObject::tr(" and %1 evaluations (%2 each)").arg(evaluations).arg(each);
  }
  if (time.value("disk_bytes_per_step").toDouble() > 0) {
    if (time.value("disk_seconds_per_step").toDouble() > 0)
      text += QObject::tr("; the disk's share: %1 per step for %2 read and written")
                  .arg(format_step_time(time.value("disk_seconds_per_step").toDouble()),
                       bytes_text(time.value("disk_bytes_per_step").toDouble()));
    else
      text += QObject::tr(
                  "; plus %1 read and written on disk per step (its speed was not "
                  "measured)")
                  .arg(bytes_text(time.value("disk_bytes_per_step").toDouble()));
  }
  return text;
}

QStringList plan_changes(const QJsonObject& plan, const job::JobSpec& asked) {
  const QJsonObject s = plan.value("settings").toObject();
  QStringList changes;
  if (s.value("micro_batch").toInteger() < asked.training.batch_size)
    changes << QObject::tr("micro-batch %1 with %2 accumulation steps")
                   .arg(s.value("micro_batch").toInteger())
                   .arg(s.value("gradient_accumulation").toInteger());
  if (s.value("activation_checkpointing").toBool() && !asked.training.activation_checkpointing)
    changes << QObject::tr("activation checkpointing");
  if (s.value("method").toString().toStdString() != asked.method.type)
    changes << QObject::tr("%1 instead of %2")
                   .arg(s.value("method").toString(), QString::fromStdString(asked.method.type));
  if (s.value("precision").toString().toStdString() != asked.precision)
    changes << QObject::tr("%1 instead of %2")
                   .arg(s.value("precision").toString(), QString::fromStdString(asked.precision));
  if (asked.strategy.name == "auto" && s.value("strategy").toString() == "gemini") {
    changes << QObject::tr("%1 of the optimizer state on disk")
                   .arg(percent_text(s.value("offload_optim_frac").toDouble()));
    if (s.value("offload_param_frac").toDouble() > 0)
      changes << QObject::tr("%1 of the parameters on disk")
                     .arg(percent_text(s.value("offload_param_frac").toDouble()));
  }
  return changes;
}

}  // namespace tessera::ui
