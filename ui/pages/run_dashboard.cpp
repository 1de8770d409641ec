#include "ui/pages/run_dashboard.h"

#include <QApplication>
#include <QDateTime>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QFontDatabase>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QScrollArea>
#include <QSet>
#include <QSplitter>
#include <QStyle>
#include <QTabWidget>
#include <QTableWidget>
#include <QVBoxLayout>
#include <climits>

#include "ui/utility/run_monitor.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/elided_label.h"

namespace tessera::ui {

namespace {
constexpr int kRepaintIntervalMs = 40;  // at most 25 repaints a second
// Below this dashboard width (in average characters) the memory tabs show the disk chart and
// the chunk traffic chart in two tabs rather than side by side.
constexpr int kSideBySideChars = 170;
// Stop sends SIGINT: `tessera-cli run` finishes its step and saves a checkpoint of it before it
// ends, so stopping loses nothing and needs no confirmation.
QString kStopTip() {
  return QObject::tr(
      "Stop after the current step. The run first saves a checkpoint of that step, so no "
      "progress is lost: Resume continues from it.");
}
}  // namespace

RunDashboard::RunDashboard(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  title_ = new QLabel(tr("No run selected"));
  QFont big = title_->font();
  big.setPointSizeF(big.pointSizeF() * 1.3);
  big.setBold(true);
  title_->setFont(big);
  // A long status is cut with "…" rather than widening the window past small screens (the full
  // text is in the tooltip); cut without one it read "started 202".
  status_ = new ElidedLabel(Qt::ElideRight);
  status_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* header = new QHBoxLayout;
  header->addWidget(title_);
  header->addWidget(status_, 1);
  stop_ = new QPushButton(tr("&Stop"));
  stop_->setToolTip(kStopTip());
  stop_->setEnabled(false);
  resume_ = new QPushButton(tr("&Resume"));
  resume_->setEnabled(false);
  export_ = new QPushButton(tr("E&xport…"));
  export_->setToolTip(tr("Write the fine-tuned model (or its LoRA adapter) to a folder"));
  export_->setEnabled(false);
  try_ = new QPushButton(tr("&Try it"));
  try_->setToolTip(tr("Chat with the fine-tuned model"));
  try_->setEnabled(false);
  clone_ = new QPushButton(tr("Clo&ne…"));
  clone_->setToolTip(tr("A new run with this run's settings, opened in the wizard to change"));
  clone_->setEnabled(false);
  header->addWidget(clone_);
  header->addWidget(stop_);
  header->addWidget(resume_);
  header->addWidget(export_);
  header->addWidget(try_);
  layout->addLayout(header);

  auto* progress_row = new QHBoxLayout;
  progress_ = new QProgressBar;
  progress_->setRange(0, 1);
  progress_->setValue(0);
  progress_->setFormat(tr("waiting for the first event"));
  eta_ = new QLabel;
  losses_ = new QLabel;
  losses_->setObjectName("losses");
  losses_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  progress_row->addWidget(progress_, 1);
  progress_row->addWidget(losses_);
  progress_row->addWidget(eta_);
  layout->addLayout(progress_row);

  error_ = new QLabel;
  error_->setWordWrap(true);
  error_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  error_->setFrameShape(QFrame::StyledPanel);
  error_->setVisible(false);
  layout->addWidget(error_);

  auto* charts = new QWidget;
  auto* grid = new QGridLayout(charts);
  grid->setContentsMargins(0, 0, 0, 0);
  loss_ = new LineChart(tr("Loss"), tr("step"), tr("loss"));
  loss_->set_empty_text(tr("no step yet"));
  // Raw values faint under their smoothed trend, so a noisy series still reads as a line.
  loss_->define_series(tr("training loss"), 0, /*faint=*/true);
  loss_->define_series(tr("training loss (smoothed)"), 0, false);
  loss_->define_series(tr("evaluation loss"), 2, false);
  loss_->offer_log_scale();
  lr_ = new LineChart(tr("Learning rate"), tr("step"), tr("lr"));
  // The gradient's global norm before clipping, as each step reports it: spikes warn of an
  // unstable run before its loss shows it. It shares the learning rate's place (that chart is
  // mostly a flat line), first.
  grad_norm_ = new LineChart(tr("Gradient norm"), tr("step"), tr("norm"));
  grad_norm_->set_empty_text(tr("no step yet"));
  grad_norm_->define_series(tr("gradient norm"), 3, false);
  step_tabs_ = new QTabWidget;
  step_tabs_->setDocumentMode(true);
  step_tabs_->addTab(grad_norm_, tr("gradient norm"));
  step_tabs_->addTab(lr_, tr("learning rate"));
  throughput_ = new LineChart(tr("Throughput (tokens/s)"), tr("step"), tr("tokens/s"));
  throughput_->define_series(tr("tokens/s"), 0, /*faint=*/true);
  throughput_->define_series(tr("tokens/s (smoothed)"), 0, false);
  memory_tabs_ = new QTabWidget;
  memory_tabs_->setDocumentMode(true);
  auto* no_memory = new QLabel(tr("No memory report yet"));
  no_memory->setAlignment(Qt::AlignCenter);
  memory_tabs_->addTab(no_memory, tr("Memory"));
  // Preference tuning: the rewards and how often the chosen completion wins (KTO: the KL
  // estimate), shown once a step reports them.
  rewards_ = new LineChart(tr("Rewards"), tr("step"), tr("reward"));
  rewards_->define_series(tr("chosen"), 1, false);
  rewards_->define_series(tr("rejected"), 2, false);
  rewards_->define_series(tr("margin"), 0, false);
  ranking_ = new LineChart(tr("Pairs ranked right"), tr("step"), tr("share"));
  kl_ = new LineChart(tr("KL estimate (KTO)"), tr("step"), tr("KL"));
  rewards_->setVisible(false);
  ranking_->setVisible(false);
  kl_->setVisible(false);
  grid->addWidget(loss_, 0, 0);
  grid->addWidget(step_tabs_, 0, 1);
  grid->addWidget(throughput_, 1, 0);
  grid->addWidget(memory_tabs_, 1, 1);
  grid->addWidget(rewards_, 3, 0);
  grid->addWidget(ranking_, 3, 1);
  grid->addWidget(kl_, 3, 1);  // KTO's, in the place of the ranking (unpaired: none)
  // Equal halves, whatever the memory tabs hold (the disk tier's two charts ask for more).
  grid->setColumnStretch(0, 1);
  grid->setColumnStretch(1, 1);
  ranks_panel_ = new QWidget;
  auto* ranks_layout = new QVBoxLayout(ranks_panel_);
  ranks_layout->setContentsMargins(0, 0, 0, 0);
  auto* ranks_caption = new QLabel(tr("Per rank (latest report)"));
  ranks_table_ = new QTableWidget;
  ranks_table_->setObjectName("ranksTable");
  ranks_table_->setAccessibleName(tr("Per rank"));
  ranks_table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  ranks_table_->setSelectionMode(QAbstractItemView::NoSelection);
  ranks_table_->verticalHeader()->setVisible(false);
  ranks_table_->horizontalHeader()->setStretchLastSection(true);
  ranks_table_->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  ranks_layout->addWidget(ranks_caption);
  ranks_layout->addWidget(ranks_table_);
  ranks_panel_->setVisible(false);
  // As tall as its rows: the charts take the rest.
  ranks_panel_->setSizePolicy(QSizePolicy::Preferred, QSizePolicy::Maximum);
  grid->addWidget(ranks_panel_, 2, 0, 1, 2);
  grid->setRowStretch(0, 1);
  grid->setRowStretch(1, 1);
  grid->setRowStretch(3, 1);  // the preference charts' row, below the ranks (empty otherwise)

  log_ = new QPlainTextEdit;
  log_->setReadOnly(true);
  log_->setMaximumBlockCount(5000);
  log_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  log_->setPlaceholderText(tr("The run's log appears here."));
  auto make_file_view = [this](const QString& placeholder) {
    auto* view = new QPlainTextEdit;
    view->setReadOnly(true);
    view->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
    view->setPlaceholderText(placeholder);
    return view;
  };
  spec_view_ = make_file_view(tr("The run's job.json: the settings it was launched with."));
  plan_view_ = make_file_view(
      tr("The run's plan.json: with strategy auto, the settings the planner chose for it."));
  auto* details = new QTabWidget;
  details->setDocumentMode(true);
  details->addTab(log_, tr("&Log"));
  details->addTab(spec_view_, tr("&Job spec"));
  details->addTab(plan_view_, tr("Pl&an"));

  // Charts keep a readable size and scroll when the window is smaller than that, rather than
  // squeezing their axes into "…" or holding the window at a large minimum size.
  auto* charts_scroll = new QScrollArea;
  charts_scroll->setWidget(charts);
  charts_scroll->setWidgetResizable(true);
  charts_scroll->setFrameShape(QFrame::NoFrame);
  charts_scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  charts_scroll->setMinimumHeight(fontMetrics().height() * 8);
  auto* split = new QSplitter(Qt::Vertical);
  split->addWidget(charts_scroll);
  split->addWidget(details);
  split->setStretchFactor(0, 6);
  split->setStretchFactor(1, 1);
  split->setSizes({fontMetrics().height() * 30, fontMetrics().height() * 5});
  layout->addWidget(split, 1);

  repaint_timer_.setSingleShot(true);
  repaint_timer_.setInterval(kRepaintIntervalMs);
  connect(&repaint_timer_, &QTimer::timeout, this, &RunDashboard::draw_pending);
  stall_timer_.setInterval(1000);
  connect(&stall_timer_, &QTimer::timeout, this, [this] {
    if (!monitor_ || !monitor_->running()) {
      stall_timer_.stop();
      return;
    }
    // plan.json appears once a live run has planned.
    if (plan_view_->toPlainText().isEmpty()) load_run_files(/*plan_only=*/true);
    if (monitor_->stalled())
      eta_->setText(tr("⚠ stalled: no event for %1")
                        .arg(format_duration(double(monitor_->silent_ms()) / 1000.0)));
  });
  connect(stop_, &QPushButton::clicked, this, [this] {
    if (!monitor_ || !monitor_->running()) return;
    if (monitor_->stop_requested()) return stop_now();
    monitor_->stop();
    progress_->setFormat(tr("stopping after the current step (saving a checkpoint)…"));
    update_actions();
  });
  connect(resume_, &QPushButton::clicked, this, [this] {
    resume_->setEnabled(false);
    Q_EMIT resumeRequested(run_);
  });
  connect(export_, &QPushButton::clicked, this, [this] { Q_EMIT exportRequested(run_); });
  connect(try_, &QPushButton::clicked, this, [this] { Q_EMIT tryRequested(run_); });
  connect(clone_, &QPushButton::clicked, this, [this] { Q_EMIT cloneRequested(run_); });
}

void RunDashboard::clear() {
  if (monitor_) monitor_->disconnect(this);
  monitor_ = nullptr;
  loss_->clear();
  lr_->clear();
  grad_norm_->clear();
  for (LineChart* chart : {rewards_, ranking_, kl_}) {
    chart->clear();
    chart->setVisible(false);
  }
  throughput_->clear();
  memory_.clear();
  traffic_ = nullptr;
  disk_panel_ = nullptr;
  disk_charts_ = nullptr;
  disk_folder_ = nullptr;
  disk_totals_ = nullptr;
  while (memory_tabs_->count() > 1) {
    QWidget* tab = memory_tabs_->widget(1);  // a chart, the disk tier's panel, its traffic
    memory_tabs_->removeTab(1);
    tab->deleteLater();
  }
  memory_tabs_->setTabVisible(0, true);
  log_->clear();
  spec_view_->clear();
  plan_view_->clear();
  smoothed_loss_ = kMissing;
  smoothed_count_ = 0;
  throughput_trend_.clear();
  rank_metrics_.clear();
  rank_memory_.clear();
  ranks_job_loss_ = ranks_job_tokens_per_s_ = kMissing;
  ranks_table_->clear();
  ranks_table_->setRowCount(0);
  ranks_panel_->setVisible(false);
  error_->clear();
  error_->setVisible(false);
  progress_->setRange(0, 1);
  progress_->setValue(0);
  progress_->setFormat(tr("waiting for the first event"));
  eta_->clear();
  last_loss_ = last_eval_loss_ = kMissing;
  losses_->clear();
  run_ = {};
  update_actions();
  t0_ = kMissing;
  title_->setText(tr("No run selected"));
  status_->set_full_text({});
}

void RunDashboard::update_actions() {
  const bool live = monitor_ && monitor_->running();
  const bool stopping = live && monitor_->stop_requested();
  stop_->setEnabled(live);
  stop_->setText(stopping ? tr("Stop &now…") : tr("&Stop"));
  stop_->setToolTip(stopping ? tr("End the run at once, without waiting for its step and "
                                  "checkpoint: the steps since its last checkpoint are lost")
                             : kStopTip());
  const QString why_not = live                ? tr("the run is in progress")
                          : run_.id.isEmpty() ? tr("no run")
                                              : resume_blocker(run_);
  resume_->setEnabled(!live && why_not.isEmpty());
  resume_->setToolTip(why_not.isEmpty()
                          ? tr("Continue this run from its last checkpoint, in the same folder")
                          : tr("Cannot resume: %1").arg(why_not));
  const bool finished_model =
      !live && run_.status == "completed" && QFileInfo::exists(run_.output_dir + "/model");
  export_->setEnabled(finished_model);
  try_->setEnabled(finished_model);
  clone_->setEnabled(!run_.spec_json.isEmpty());
}

void RunDashboard::load_run_files(bool plan_only) {
  // Small files (a few KiB).
  auto read = [this](const char* name) {
    QFile file(QDir(run_.output_dir).filePath(name));
    const bool readable =
        !run_.output_dir.isEmpty() && file.open(QIODevice::ReadOnly) && file.size() < (1 << 20);
    return readable ? QString::fromUtf8(file.readAll()) : QString();
  };
  if (!plan_only) spec_view_->setPlainText(read("job.json"));
  plan_view_->setPlainText(read("plan.json"));
  // The plan's estimated peak per tier, drawn on the memory charts next to what is measured.
  planned_peaks_.clear();
  const QJsonObject plan = QJsonDocument::fromJson(plan_view_->toPlainText().toUtf8()).object();
  for (const QJsonValue& tier : plan.value("memory").toArray())
    planned_peaks_.insert(tier.toObject().value("tier").toString(),
                          tier.toObject().value("peak").toDouble());
  for (auto it = memory_.begin(); it != memory_.end(); ++it)
    it.value()->set_estimate(planned_peaks_.value(it.key()));
}

void RunDashboard::set_status(const RunRecord& run) {
  const bool other_run = run.id != run_.id;
  run_ = run;
  if (other_run) load_run_files(/*plan_only=*/false);
  title_->setText(run.name.isEmpty() ? run.id : run.name);
  title_->setToolTip(title_->text());
  QString text = run.status;
  if (present(run.started_at)) {
    text += " · " + tr("started %1")
                        .arg(QDateTime::fromMSecsSinceEpoch(qint64(run.started_at * 1000))
                                 .toString("yyyy-MM-dd hh:mm"));
    const double end =
        present(run.ended_at) ? run.ended_at : double(QDateTime::currentMSecsSinceEpoch()) / 1000;
    text += " · " + format_duration(end - run.started_at);
  }
  if (!run.model.isEmpty()) text += " · " + run.model;
  status_->set_full_text(text);
  if (!run.failure.isEmpty()) {
    error_->setText(tr("%1: %2").arg(run.status, run.failure));
    error_->setVisible(true);
  }
}

void RunDashboard::attach(RunMonitor* monitor, bool keep_shown) {
  if (keep_shown) {
    if (monitor_) monitor_->disconnect(this);
    error_->clear();
    error_->setVisible(false);
    progress_->setRange(0, 1);
    progress_->setValue(0);
    progress_->setFormat(tr("resuming: waiting for the first event"));
  } else {
    clear();
  }
  monitor_ = monitor;
  set_status(monitor->run());
  update_actions();
  connect(monitor, &RunMonitor::pendingAvailable, this, [this] {
    if (!repaint_timer_.isActive()) repaint_timer_.start();
  });
  connect(monitor, &RunMonitor::finished, this, &RunDashboard::on_finished);
  if (monitor->has_pending()) repaint_timer_.start();
  stall_timer_.start();
}

void RunDashboard::on_finished(const QString& status, const QString& failure) {
  draw_pending();
  if (monitor_) set_status(monitor_->run());
  if (plan_view_->toPlainText().isEmpty()) load_run_files(/*plan_only=*/true);
  update_actions();
  show_end_progress(run_);
  eta_->clear();
  update_loss_label();
  (void)status;
  (void)failure;
}

void RunDashboard::show_end_progress(const RunRecord& run) {
  if (run.status == "completed") {
    progress_->setRange(0, 1);
    progress_->setValue(1);
    progress_->setFormat(tr("completed"));
  } else if (run.total_steps > 0) {
    // Where it ended, not full and not empty: "stopped at 142 / 200".
    progress_->setRange(0, int(std::min<std::int64_t>(run.total_steps, INT_MAX)));
    progress_->setValue(int(std::clamp<std::int64_t>(run.steps_done, 0, run.total_steps)));
    progress_->setFormat(
        tr("%1 at %2 / %3").arg(run.status).arg(run.steps_done).arg(run.total_steps));
  } else {
    // Ended before its first training step.
    progress_->setRange(0, 1);
    progress_->setValue(0);
    progress_->setFormat(tr("%1 before the first step").arg(run.status));
  }
}

void RunDashboard::update_loss_label() {
  const bool ended = !run_.id.isEmpty() && run_.status != "running" && run_.status != "starting";
  // An ended run's final losses are the database's (the last recorded); while it runs, the
  // latest charted values, labelled as such.
  const double loss = ended && present(run_.final_loss) ? run_.final_loss : last_loss_;
  const double eval =
      ended && present(run_.final_eval_loss) ? run_.final_eval_loss : last_eval_loss_;
  QStringList parts;
  if (present(loss))
    parts << (ended ? tr("final loss %1") : tr("loss %1")).arg(QString::number(loss, 'f', 4));
  if (present(eval))
    parts << (ended ? tr("final eval loss %1") : tr("eval loss %1"))
                 .arg(QString::number(eval, 'f', 4));
  losses_->setText(parts.join(" · "));
}

void RunDashboard::stop_now() {
  const std::int64_t checkpoint = monitor_->last_checkpoint_step();
  const std::int64_t last = monitor_->last_step();
  const std::int64_t lost = last - std::max<std::int64_t>(checkpoint, 0);
  if (lost > 0) {
    const QString where =
        checkpoint >= 0 ? tr("Its last checkpoint is of step %1; it has trained to step %2.")
                              .arg(checkpoint)
                              .arg(last)
                        : tr("It has no checkpoint yet; it has trained to step %1.").arg(last);
    QMessageBox box(QMessageBox::Warning, tr("End the run now?"),
                    lost == 1 ? tr("Ending the run now loses 1 step of training.")
                              : tr("Ending the run now loses %1 steps of training.").arg(lost),
                    QMessageBox::Cancel, this);
    box.setInformativeText(where + " " +
                           tr("Cancel lets it finish its step and save a checkpoint of it."));
    auto* end_now = box.addButton(tr("End now"), QMessageBox::DestructiveRole);
    box.setDefaultButton(QMessageBox::Cancel);
    box.exec();
    if (box.clickedButton() != end_now || !monitor_) return;
  }
  monitor_->kill_now();
}

void RunDashboard::draw_pending() {
  if (!monitor_) return;
  QElapsedTimer clock;
  clock.start();
  RunSeries delta = monitor_->take_pending();
  if (!delta.empty() || !delta.last_error.isEmpty()) append(delta);
  repaint();  // paint now, so the time measured includes the charts' painting
  max_draw_ms_ = std::max(max_draw_ms_, clock.elapsed());
  set_status(monitor_->run());
  update_actions();
}

void RunDashboard::show_replay(const RunRecord& run, const RunSeries& series) {
  clear();
  set_status(run);
  update_actions();
  append(series);
  if (run.status != "running" && run.status != "starting") {
    show_end_progress(run);
  } else if (run.total_steps > 0) {  // a resumed run's recorded steps, until its progress comes
    progress_->setRange(0, int(std::min<std::int64_t>(run.total_steps, INT_MAX)));
    progress_->setValue(int(std::clamp<std::int64_t>(run.steps_done, 0, run.total_steps)));
    progress_->setFormat(tr("train: %1 / %2").arg(run.steps_done).arg(run.total_steps));
  }
  eta_->clear();
  update_loss_label();
}

QWidget* RunDashboard::make_tier_tab(const QString& tier, MemoryChart* chart) {
  if (tier == "device") {
    // The GPU's figures are the CUDA allocator's, not the process's: the tab says what they count
    // (how far they are checked on a GPU is the README's to say, not the studio's).
    auto* panel = new QWidget;
    auto* layout = new QVBoxLayout(panel);
    layout->setContentsMargins(0, 0, 0, 0);
    auto* note = new QLabel(
        tr("GPU memory of this rank as the CUDA caching allocator counts it, by category; "
           "reserved includes blocks the allocator keeps for reuse, and the card's total is "
           "cudaMemGetInfo's (other processes on the GPU are not in these figures)."));
    note->setObjectName("deviceTierNote");
    note->setWordWrap(true);
    layout->addWidget(note);
    layout->addWidget(chart, 1);
    return panel;
  }
  if (tier != "disk") return chart;
  auto* panel = disk_panel_ = new QWidget;
  auto* layout = new QVBoxLayout(panel);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(2);
  auto* info = new QHBoxLayout;
  info->setContentsMargins(4, 2, 4, 0);
  auto* folder_caption = new QLabel(tr("Folder:"));
  disk_folder_ = new ElidedLabel(Qt::ElideMiddle);
  disk_folder_->setObjectName("diskFolder");
  disk_totals_ = new QLabel;
  disk_totals_->setObjectName("diskTraffic");
  disk_totals_->setToolTip(
      tr("Chunk traffic between the offload folder and host memory since the run started"));
  info->addWidget(folder_caption);
  info->addWidget(disk_folder_, 1);
  info->addSpacing(fontMetrics().averageCharWidth() * 2);
  info->addWidget(disk_totals_);
  layout->addLayout(info);
  disk_charts_ = new QHBoxLayout;
  disk_charts_->setContentsMargins(0, 0, 0, 0);
  traffic_ = new TrafficChart;
  disk_charts_->addWidget(chart, 3);
  disk_charts_->addWidget(traffic_, 2);
  layout->addLayout(disk_charts_, 1);
  return panel;
}

void RunDashboard::place_traffic_chart() {
  if (!traffic_ || memory_tabs_->indexOf(disk_panel_) < 0) return;
  const bool side_by_side = width() >= fontMetrics().averageCharWidth() * kSideBySideChars;
  const int own_tab = memory_tabs_->indexOf(traffic_);
  if (side_by_side && own_tab >= 0) {
    const bool was_current = memory_tabs_->currentIndex() == own_tab;
    memory_tabs_->removeTab(own_tab);
    disk_charts_->addWidget(traffic_, 2);
    traffic_->show();
    if (was_current) memory_tabs_->setCurrentWidget(disk_panel_);
  } else if (!side_by_side && own_tab < 0) {
    disk_charts_->removeWidget(traffic_);
    memory_tabs_->insertTab(memory_tabs_->indexOf(disk_panel_) + 1, traffic_, tr("disk traffic"));
  }
}

void RunDashboard::resizeEvent(QResizeEvent* event) {
  QWidget::resizeEvent(event);
  place_traffic_chart();
}

void RunDashboard::update_disk_labels(const MemorySample& latest) {
  disk_folder_->set_full_text(latest.device);
  if (!present(latest.traffic.read_bytes) && !present(latest.traffic.written_bytes)) return;
  disk_totals_->setText(tr("read %1 · written %2")
                            .arg(format_bytes(latest.traffic.read_bytes),
                                 format_bytes(latest.traffic.written_bytes)));
}

void RunDashboard::append(const RunSeries& s) {
  ++repaints_;
  QList<QPointF> loss, smoothed, eval_loss, lr, grad_norm, tps, smoothed_tps, chosen, rejected,
      margin, accuracy, kl;
  for (const MetricPoint& p : s.metrics) {
    const double x = double(p.step);
    if (present(p.loss)) {
      loss.push_back({x, p.loss});
      // Debiased EMA (as TensorBoard smooths): the trend through a noisy loss.
      constexpr double kSmoothing = 0.9;
      smoothed_loss_ =
          (present(smoothed_loss_) ? smoothed_loss_ * kSmoothing : 0.0) + (1 - kSmoothing) * p.loss;
      ++smoothed_count_;
      smoothed.push_back({x, smoothed_loss_ / (1 - std::pow(kSmoothing, smoothed_count_))});
    }
    if (present(p.loss)) last_loss_ = p.loss;
    if (present(p.eval_loss)) {
      eval_loss.push_back({x, p.eval_loss});
      last_eval_loss_ = p.eval_loss;
    }
    if (present(p.lr)) lr.push_back({x, p.lr});
    if (present(p.grad_norm)) grad_norm.push_back({x, p.grad_norm});
    if (present(p.reward_chosen)) chosen.push_back({x, p.reward_chosen});
    if (present(p.reward_rejected)) rejected.push_back({x, p.reward_rejected});
    if (present(p.reward_margin)) margin.push_back({x, p.reward_margin});
    if (present(p.reward_accuracy)) accuracy.push_back({x, p.reward_accuracy});
    if (present(p.kl)) kl.push_back({x, p.kl});
    if (!p.ranks.isEmpty()) {
      rank_metrics_ = p.ranks;
      ranks_job_loss_ = p.loss;
      ranks_job_tokens_per_s_ = p.tokens_per_s;
    }
    if (present(p.tokens_per_s)) {
      tps.push_back({x, p.tokens_per_s});
      smoothed_tps.push_back({x, throughput_trend_.add(p.tokens_per_s)});
    }
  }
  if (!loss.isEmpty()) loss_->append(tr("training loss"), loss);
  if (!smoothed.isEmpty()) loss_->append(tr("training loss (smoothed)"), smoothed);
  if (!eval_loss.isEmpty()) loss_->append(tr("evaluation loss"), eval_loss);
  if (!lr.isEmpty()) lr_->append(tr("learning rate"), lr);
  if (!grad_norm.isEmpty()) grad_norm_->append(tr("gradient norm"), grad_norm);
  if (!tps.isEmpty()) throughput_->append(tr("tokens/s"), tps);
  if (!smoothed_tps.isEmpty()) throughput_->append(tr("tokens/s (smoothed)"), smoothed_tps);
  if (!margin.isEmpty()) {
    rewards_->setVisible(true);
    rewards_->append(tr("chosen"), chosen);
    rewards_->append(tr("rejected"), rejected);
    rewards_->append(tr("margin"), margin);
  }
  if (!accuracy.isEmpty()) {
    ranking_->setVisible(true);
    ranking_->append(tr("reward accuracy"), accuracy);
  }
  if (!kl.isEmpty()) {
    kl_->setVisible(true);
    kl_->append(tr("KL"), kl);
  }

  if (!s.memory.isEmpty()) {
    if (!present(t0_)) t0_ = s.memory.front().t;
    for (const MemorySample& m : s.memory) {
      if (memory_.contains(m.tier)) continue;
      auto* chart = new MemoryChart(m.tier);
      chart->set_estimate(planned_peaks_.value(m.tier));
      memory_.insert(m.tier, chart);
      QWidget* tab = make_tier_tab(m.tier, chart);
      memory_tabs_->addTab(tab, m.tier);
      memory_tabs_->setTabVisible(0, false);
      if (memory_tabs_->currentIndex() == 0) memory_tabs_->setCurrentWidget(tab);
    }
    place_traffic_chart();
    for (const MemorySample& m : s.memory)
      if (!m.ranks.isEmpty()) rank_memory_[m.tier] = m.ranks;
    for (MemoryChart* chart : memory_) chart->append(s.memory, t0_);
    if (traffic_) {
      traffic_->append(s.memory, t0_);
      for (auto it = s.memory.crbegin(); it != s.memory.crend(); ++it)
        if (it->tier == "disk") {
          update_disk_labels(*it);
          break;
        }
    }
  }

  if (s.has_progress) {
    if (s.total > 0) {
      progress_->setRange(0, 1000);
      progress_->setValue(int(std::clamp(double(s.done) / double(s.total), 0.0, 1.0) * 1000));
      progress_->setFormat(QString("%1: %2 / %3").arg(s.phase).arg(s.done).arg(s.total));
    } else {
      progress_->setRange(0, 0);  // busy: the phase has no known length
      progress_->setFormat(s.phase);
    }
    eta_->setText(present(s.eta_s) ? tr("ETA %1").arg(format_duration(s.eta_s)) : QString());
  }
  if (!s.last_error.isEmpty()) {
    error_->setText(s.last_error);
    error_->setVisible(true);
  }
  for (const QString& line : s.log) log_->appendPlainText(line);
  update_loss_label();
  if (!rank_metrics_.isEmpty() || !rank_memory_.isEmpty()) update_ranks_table();
}

void RunDashboard::update_ranks_table() {
  // The ranks either event names, in rank order; a rank's node from the memory events.
  QMap<int, QString> host_of;
  for (const QList<RankMemory>& tier : rank_memory_)
    for (const RankMemory& r : tier) host_of[r.rank] = r.host;
  for (const RankMetric& r : rank_metrics_)
    if (!host_of.contains(r.rank)) host_of[r.rank] = QString();
  const QStringList tiers = rank_memory_.keys();
  QStringList headers = {tr("Rank"), tr("Node"), tr("Loss"), tr("Tokens/s")};
  for (const QString& tier : tiers) headers << tr("Memory (%1)").arg(tier);
  // Strategy hybrid: each rank's place on the mesh and, with pipeline stages, how much of its
  // step it waited for the other stages (the pipeline's bubble as it saw it).
  const bool placed = std::any_of(rank_metrics_.cbegin(), rank_metrics_.cend(),
                                  [](const RankMetric& m) { return m.dp >= 0; });
  const bool pipelined =
      std::any_of(rank_metrics_.cbegin(), rank_metrics_.cend(),
                  [](const RankMetric& m) { return present(m.pipeline_idle_share); });
  const int place_column = int(headers.size());
  if (placed) headers << tr("Place (data · stage · tensor)");
  const int idle_column = int(headers.size());
  if (pipelined) headers << tr("Pipeline idle");
  QStringList hosts;
  for (const QString& h : host_of)
    if (!hosts.contains(h)) hosts << h;
  const bool per_node = hosts.size() > 1;
  const int rows = int(host_of.size()) + (per_node ? int(hosts.size()) : 0) + 1;
  ranks_table_->setColumnCount(int(headers.size()));
  ranks_table_->setHorizontalHeaderLabels(headers);
  ranks_table_->setRowCount(rows);
  auto set = [this](int row, int column, const QString& text, bool bold = false) {
    auto* item = new QTableWidgetItem(text);
    if (column >= 2) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    if (bold) {
      QFont f = item->font();
      f.setBold(true);
      item->setFont(f);
    }
    ranks_table_->setItem(row, column, item);
  };
  auto number_text = [](double v, int decimals) {
    return present(v) ? QString::number(v, 'f', decimals) : QString("—");
  };
  auto memory_of = [this](const QString& tier, int rank) {
    for (const RankMemory& r : rank_memory_.value(tier))
      if (r.rank == rank) return r.used;
    return kMissing;
  };
  int row = 0;
  for (auto it = host_of.cbegin(); it != host_of.cend(); ++it, ++row) {
    set(row, 0, QString::number(it.key()));
    set(row, 1, it.value());
    const auto metric = std::find_if(rank_metrics_.cbegin(), rank_metrics_.cend(),
                                     [&](const RankMetric& m) { return m.rank == it.key(); });
    set(row, 2, metric != rank_metrics_.cend() ? number_text(metric->loss, 4) : "—");
    set(row, 3, metric != rank_metrics_.cend() ? number_text(metric->tokens_per_s, 1) : "—");
    for (int t = 0; t < tiers.size(); ++t) {
      const double used = memory_of(tiers[t], it.key());
      set(row, 4 + t, present(used) ? format_bytes(used) : "—");
    }
    const bool has_metric = metric != rank_metrics_.cend();
    if (placed)
      set(row, place_column,
          has_metric && metric->dp >= 0
              ? tr("dp %1 · stage %2 · tp %3").arg(metric->dp).arg(metric->pp).arg(metric->tp)
              : "—");
    if (pipelined)
      set(row, idle_column,
          has_metric && present(metric->pipeline_idle_share)
              ? QString::number(100.0 * metric->pipeline_idle_share, 'f', 1) + " %"
              : "—");
  }
  // Per node: its ranks' memory and their throughputs added (each over its own step time).
  if (per_node)
    for (const QString& host : hosts) {
      double tokens = 0;
      bool any_tokens = false;
      for (const RankMetric& m : rank_metrics_)
        if (host_of.value(m.rank) == host && present(m.tokens_per_s)) {
          tokens += m.tokens_per_s;
          any_tokens = true;
        }
      set(row, 0, tr("node"), true);
      set(row, 1, host, true);
      set(row, 2, QString());
      set(row, 3, any_tokens ? number_text(tokens, 1) : "—", true);
      for (int t = 0; t < tiers.size(); ++t) {
        double used = 0;
        for (const RankMemory& r : rank_memory_.value(tiers[t]))
          if (r.host == host && present(r.used)) used += r.used;
        set(row, 4 + t, format_bytes(used), true);
      }
      ++row;
    }
  // The job: the event's own loss (the mean over ranks) and tokens/s (every rank's tokens over
  // the slowest rank's step time); memory summed over the ranks.
  set(row, 0, tr("job"), true);
  set(row, 1, per_node ? tr("%1 nodes").arg(hosts.size()) : hosts.value(0), true);
  set(row, 2, number_text(ranks_job_loss_, 4), true);
  set(row, 3, number_text(ranks_job_tokens_per_s_, 1), true);
  for (int t = 0; t < tiers.size(); ++t) {
    double used = 0;
    for (const RankMemory& r : rank_memory_.value(tiers[t]))
      if (present(r.used)) used += r.used;
    set(row, 4 + t, format_bytes(used), true);
  }
  ranks_table_->item(row, 0)->setToolTip(
      tr("Loss: the mean over the ranks. Tokens/s: every rank's tokens over the slowest rank's "
         "step time. Memory: the ranks' added up."));
  ranks_table_->resizeColumnsToContents();
  ranks_table_->setFixedHeight(ranks_table_->horizontalHeader()->height() +
                               ranks_table_->verticalHeader()->length() +
                               2 * ranks_table_->frameWidth());
  ranks_panel_->setVisible(true);
}

}  // namespace tessera::ui
