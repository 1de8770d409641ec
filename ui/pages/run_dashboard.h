#pragma once
// The run dashboard: live (from a RunMonitor) or replayed (from the runs database) charts of
// training and evaluation loss, learning rate, tokens/s and memory per tier (with the disk
// tier's folder and chunk traffic when the run offloads to disk), each rank's figures in a job of
// several processes, a progress bar with ETA, the last error and the log. Live data is drawn at
// most ~25 times a second.
#include <QMap>
#include <QPointer>
#include <QTimer>
#include <QWidget>

#include "ui/models/run_data.h"
#include "ui/models/runs_db.h"
#include "ui/widgets/elided_label.h"

class QHBoxLayout;
class QLabel;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;
class QTableWidget;
class QTabWidget;

namespace tessera::ui {

class ElidedLabel;
class LineChart;
class MemoryChart;
class RunMonitor;
class TrafficChart;

class RunDashboard : public QWidget {
  Q_OBJECT
 public:
  explicit RunDashboard(QWidget* parent = nullptr);

  // Follows a live run; `keep_shown` keeps what is drawn (a resumed run continues its charts).
  void attach(RunMonitor* monitor, bool keep_shown = false);
  void show_replay(const RunRecord& run, const RunSeries& series);  // a past run
  void clear();

  LineChart* loss_chart() const { return loss_; }
  LineChart* lr_chart() const { return lr_; }
  LineChart* grad_norm_chart() const { return grad_norm_; }
  QTabWidget* step_tabs() const { return step_tabs_; }  // gradient norm, learning rate
  LineChart* throughput_chart() const { return throughput_; }
  // Preference tuning's charts (hidden until a step reports them).
  LineChart* rewards_chart() const { return rewards_; }
  LineChart* ranking_chart() const { return ranking_; }
  LineChart* kl_chart() const { return kl_; }
  MemoryChart* memory_chart(const QString& tier) const { return memory_.value(tier); }
  QTabWidget* memory_tabs() const { return memory_tabs_; }
  // The disk tier's chunk traffic and offload folder: nullptr until a disk-tier sample arrives.
  TrafficChart* traffic_chart() const { return traffic_; }
  ElidedLabel* disk_folder_label() const { return disk_folder_; }
  QLabel* disk_traffic_label() const { return disk_totals_; }
  // A job of several processes: each rank's latest loss, tokens/s and memory per tier (and its
  // node), a row per node when the ranks run on more than one, and the job's total (hidden
  // while the events carry no `ranks`).
  QTableWidget* ranks_table() const { return ranks_table_; }
  QProgressBar* progress_bar() const { return progress_; }
  QLabel* status_label() const { return status_; }
  QPushButton* stop_button() const { return stop_; }
  QPushButton* resume_button() const { return resume_; }
  QPushButton* export_button() const { return export_; }
  QPushButton* try_button() const { return try_; }
  QPushButton* clone_button() const { return clone_; }
  const RunRecord& run() const { return run_; }
  QLabel* error_label() const { return error_; }
  QLabel* title_label() const { return title_; }  // the run's name
  QLabel* eta_label() const { return eta_; }
  // The latest losses: "loss 0.8123 · eval loss 0.9012" while the run goes on, "final loss …"
  // once it has ended (a running run has no final loss yet).
  QLabel* loss_label() const { return losses_; }
  QPlainTextEdit* log_view() const { return log_; }
  // The run's own job.json and plan.json (what it was launched with, not the wizard's values).
  QPlainTextEdit* spec_view() const { return spec_view_; }
  QPlainTextEdit* plan_view() const { return plan_view_; }
  int repaints() const { return repaints_; }
  // Longest time one batch of new points took to draw into the charts (and paint), in ms.
  qint64 max_draw_ms() const { return max_draw_ms_; }

 Q_SIGNALS:
  void resumeRequested(const tessera::ui::RunRecord& run);
  void exportRequested(const tessera::ui::RunRecord& run);
  void tryRequested(const tessera::ui::RunRecord& run);
  void cloneRequested(const tessera::ui::RunRecord& run);

 private:
  void draw_pending();
  void append(const RunSeries& series);
  void set_status(const RunRecord& run);
  void on_finished(const QString& status, const QString& failure);
  void update_actions();
  // The bar at where an ended run stopped ("stopped at 142 / 200"), from its recorded steps.
  void show_end_progress(const RunRecord& run);
  void update_loss_label();
  // Stop, the second time (the run is already stopping): asks before ending it at once when
  // that loses the steps since its last checkpoint.
  void stop_now();
  // The run's job.json (unless `plan_only`) and plan.json into their views, and the plan's
  // estimated peaks onto the memory charts.
  void load_run_files(bool plan_only);
  // The tab of a tier's chart; the disk tier's also holds its folder and chunk traffic.
  QWidget* make_tier_tab(const QString& tier, MemoryChart* chart);
  void update_disk_labels(const MemorySample& latest);
  void update_ranks_table();
  // The traffic chart beside the disk chart when the dashboard is wide enough for both to be
  // readable, else in a tab of its own after the disk tier's. (The dashboard's width, not the
  // tabs': theirs follows what they hold.)
  void place_traffic_chart();

 protected:
  void resizeEvent(QResizeEvent* event) override;

 private:
  QPointer<RunMonitor> monitor_;
  QTimer repaint_timer_;
  QTimer stall_timer_;  // checks a live run for silence once a second
  QLabel* title_;
  ElidedLabel* status_;
  QLabel* error_;
  QProgressBar* progress_;
  QLabel* eta_;
  QLabel* losses_;
  double last_loss_ = kMissing, last_eval_loss_ = kMissing;  // the latest charted values
  QPushButton* stop_;
  QPushButton* resume_;
  QPushButton* export_;
  QPushButton* try_;
  QPushButton* clone_;
  RunRecord run_;
  LineChart* loss_;
  LineChart* lr_;
  LineChart* grad_norm_;
  QTabWidget* step_tabs_;
  LineChart* throughput_;
  LineChart* rewards_;
  LineChart* ranking_;
  LineChart* kl_;
  QTabWidget* memory_tabs_;
  QMap<QString, MemoryChart*> memory_;
  QWidget* disk_panel_ = nullptr;  // the disk tier's tab: folder, totals, charts
  QHBoxLayout* disk_charts_ = nullptr;
  TrafficChart* traffic_ = nullptr;
  ElidedLabel* disk_folder_ = nullptr;
  QLabel* disk_totals_ = nullptr;
  QWidget* ranks_panel_;
  QTableWidget* ranks_table_;
  QList<RankMetric> rank_metrics_;                // of the latest metric event with ranks
  double ranks_job_loss_ = kMissing;              // that event's loss (the mean over ranks)
  double ranks_job_tokens_per_s_ = kMissing;      // and its tokens_per_s (the job's)
  QMap<QString, QList<RankMemory>> rank_memory_;  // tier -> its latest memory event's ranks
  QPlainTextEdit* log_;
  QPlainTextEdit* spec_view_;
  QPlainTextEdit* plan_view_;
  QMap<QString, double> planned_peaks_;  // tier -> the plan's estimated peak (bytes)
  double t0_ = kMissing;
  double smoothed_loss_ = kMissing;  // debiased exponential moving average of the training loss
  int smoothed_count_ = 0;
  TrailingMean throughput_trend_{kThroughputWindow};  // the smoothed throughput
  int repaints_ = 0;
  qint64 max_draw_ms_ = 0;
};

}  // namespace tessera::ui
