#pragma once
// The Runs page: the history from the runs database (name, model, dataset, method, status
// with the reason for a failure, start, duration, final losses), a dashboard for the open
// run (live or replayed; a click on a row opens it, and the row of the run shown is the one
// selected), comparing runs (training and evaluation loss, throughput, final figures and the
// job-spec settings that differ, in words), and delete.
#include <QFutureWatcher>
#include <QWidget>

#include "ui/models/runs_db.h"
#include "ui/models/runs_table_model.h"

class QLabel;
class QPushButton;
class QTableView;
class QTableWidget;
class QTabWidget;

namespace tessera::ui {

class ChatPane;
class ExportDialog;
class LineChart;
class RunDashboard;
class RunMonitor;

class RunsPage : public QWidget {
  Q_OBJECT
 public:
  RunsPage(RunsStore* store, QWidget* parent = nullptr);
  void refresh();                    // reloads the list (asynchronously)
  void open_run(const QString& id);  // replays it from the database
  // Follows a live run; a resumed run passes what it recorded before, drawn first.
  void show_live(RunMonitor* monitor, const RunSeries* recorded = nullptr);
  void try_run(const RunRecord& run);              // opens the chat pane on its model
  ExportDialog* export_run(const RunRecord& run);  // opens the export dialog (non-modal)
  void compare(const QStringList& ids);            // overlays the loss curves
  // Deletes the run's rows (and its folder when `delete_files`) without asking.
  void delete_run(const QString& id, bool delete_files);

  const QList<RunRecord>& runs() const { return model_->runs(); }
  bool loading() const {
    return list_watcher_.isRunning() || replay_watcher_.isRunning() || compare_pending_ > 0;
  }
  QTableView* table() const { return table_; }
  RunsTableModel* runs_model() const { return model_; }
  // Why the history could not be read (shown above the list); empty when it was.
  QString load_error() const;
  RunDashboard* dashboard() const { return dashboard_; }
  LineChart* compare_chart() const { return compare_; }
  LineChart* compare_eval_chart() const { return compare_eval_; }
  LineChart* compare_throughput_chart() const { return compare_throughput_; }
  // The compared runs' final figures: a row each (final loss, final eval loss, steps, mean
  // tokens/s, duration, peak memory per tier recorded), a column a run.
  QTableWidget* compare_metrics() const { return compare_metrics_; }
  // "learning rate 1e-4 vs 3e-4; steps 10 vs 20": the differences in words.
  QString compare_summary() const;
  // The job-spec settings that differ between the compared runs: a row each, a column a run.
  QTableWidget* compare_differences() const { return compare_differences_; }
  ChatPane* chat_pane() const { return chat_; }
  // Shown instead of the list and empty charts while there are no runs: what to do next.
  QWidget* empty_state() const { return empty_; }
  QLabel* empty_text() const { return empty_text_; }

 Q_SIGNALS:
  void refreshed();
  void replayed(const QString& id);
  void compared();
  void resumeRequested(const tessera::ui::RunRecord& run);
  void cloneRequested(const tessera::ui::RunRecord& run);
  void newFineTuneRequested();  // the empty state's buttons
  void demoRequested();

 private:
  void show_runs(QList<RunRecord> runs);
  const RunRecord* find(const QString& id) const;
  void show_spec_differences(const QStringList& ids);
  // Fills run `column`'s figures into the metrics table from its recorded series.
  void show_run_metrics(int column, const RunRecord& run, const RunSeries& series);
  // Selects run `id`'s row (alone) when it is not selected yet, so the list shows what the
  // dashboard shows.
  void select_only(const QString& id);
  QStringList run_labels(const QStringList& ids) const;
  QStringList selected_ids() const;
  void ask_delete();
  void update_empty_state();
  RunsStore* store_;
  RunsTableModel* model_;
  QLabel* load_error_;
  QTableView* table_;
  QPushButton* open_;
  QPushButton* compare_button_;
  QPushButton* delete_;
  QTabWidget* tabs_;
  QWidget* history_;  // the list, the dashboard and compare
  QWidget* empty_;
  QLabel* empty_text_;
  RunDashboard* dashboard_;
  LineChart* compare_;
  LineChart* compare_eval_;
  LineChart* compare_throughput_;
  QTableWidget* compare_metrics_;
  QLabel* compare_differences_label_;
  QTableWidget* compare_differences_;
  ChatPane* chat_;
  QFutureWatcher<QList<RunRecord>> list_watcher_;
  QFutureWatcher<RunSeries> replay_watcher_;
  QString replay_id_;
  int compare_pending_ = 0;
  bool refresh_again_ = false;  // a change arrived while the list was loading
  QString live_id_;
  QString shown_id_;  // the run the dashboard shows (or is loading)
};

}  // namespace tessera::ui
