#include "ui/runs_page.h"

#include <QCheckBox>
#include <QDateTime>
#include <QDir>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QSplitter>
#include <QTabWidget>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ui/charts.h"
#include "ui/chat_pane.h"
#include "ui/export_dialog.h"
#include "ui/run_dashboard.h"
#include "ui/run_monitor.h"
#include "ui/studio_settings.h"

namespace tessera::ui {

namespace {
QString loss_text(double v) {
  return present(v) ? QString::number(v, 'f', 4) : QString("—");
}
}  // namespace

RunsPage::RunsPage(RunsStore* store, QWidget* parent) : QWidget(parent), store_(store) {
  auto* layout = new QVBoxLayout(this);
  auto* split = new QSplitter(Qt::Vertical);
  auto* top = new QWidget;
  auto* top_layout = new QVBoxLayout(top);
  top_layout->setContentsMargins(0, 0, 0, 0);
  table_ = new QTableWidget;
  table_->setColumnCount(10);
  table_->setHorizontalHeaderLabels({tr("Name"), tr("Model"), tr("Dataset"), tr("Method"),
                                     tr("Status"), tr("Progress"), tr("Started"), tr("Duration"),
                                     tr("Final loss"), tr("Final eval loss")});
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::ExtendedSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->setVisible(false);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->setAccessibleName(tr("Runs"));
  top_layout->addWidget(table_, 1);
  auto* buttons = new QHBoxLayout;
  open_ = new QPushButton(tr("&Open"));
  compare_button_ = new QPushButton(tr("&Compare"));
  compare_button_->setToolTip(tr("Overlay the loss curves of the selected runs"));
  delete_ = new QPushButton(tr("&Delete…"));
  auto* refresh_button = new QPushButton(tr("&Refresh"));
  buttons->addWidget(open_);
  buttons->addWidget(compare_button_);
  buttons->addWidget(delete_);
  buttons->addStretch(1);
  buttons->addWidget(refresh_button);
  top_layout->addLayout(buttons);
  split->addWidget(top);

  tabs_ = new QTabWidget;
  dashboard_ = new RunDashboard;
  compare_ = new LineChart(tr("Loss comparison"), tr("step"), tr("training loss"));
  compare_->set_empty_text(tr("select two runs and press Compare"));
  // Next to the curves, what the runs were launched with differently.
  auto* compare_page = new QWidget;
  auto* compare_layout = new QVBoxLayout(compare_page);
  compare_layout->setContentsMargins(0, 0, 0, 0);
  compare_differences_label_ = new QLabel;
  compare_differences_ = new QTableWidget;
  compare_differences_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  compare_differences_->setAccessibleName(tr("Settings that differ"));
  compare_differences_->horizontalHeader()->setStretchLastSection(true);
  compare_layout->addWidget(compare_, 3);
  compare_layout->addWidget(compare_differences_label_);
  compare_layout->addWidget(compare_differences_, 1);
  tabs_->addTab(dashboard_, tr("Run"));
  tabs_->addTab(compare_page, tr("Compare"));
  chat_ = new ChatPane;
  tabs_->addTab(chat_, tr("Try it"));
  split->addWidget(tabs_);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 3);
  split->setSizes({fontMetrics().height() * 9, fontMetrics().height() * 40});
  layout->addWidget(split);

  connect(refresh_button, &QPushButton::clicked, this, &RunsPage::refresh);
  connect(dashboard_, &RunDashboard::resumeRequested, this, &RunsPage::resumeRequested);
  connect(dashboard_, &RunDashboard::cloneRequested, this, &RunsPage::cloneRequested);
  connect(dashboard_, &RunDashboard::exportRequested, this,
          [this](const RunRecord& run) { export_run(run); });
  connect(dashboard_, &RunDashboard::tryRequested, this, &RunsPage::try_run);
  connect(open_, &QPushButton::clicked, this, [this] {
    const auto ids = selected_ids();
    if (!ids.isEmpty()) open_run(ids.first());
  });
  connect(table_, &QTableWidget::cellActivated, this, [this](int row, int) {
    if (row >= 0 && row < runs_.size()) open_run(runs_[row].id);
  });
  connect(compare_button_, &QPushButton::clicked, this, [this] { compare(selected_ids()); });
  connect(delete_, &QPushButton::clicked, this, &RunsPage::ask_delete);
  connect(table_, &QTableWidget::itemSelectionChanged, this, [this] {
    const auto n = selected_ids().size();
    open_->setEnabled(n == 1);
    compare_button_->setEnabled(n >= 2);
    delete_->setEnabled(n == 1);
  });
  connect(&list_watcher_, &QFutureWatcher<QList<RunRecord>>::finished, this, [this] {
    try {
      runs_ = list_watcher_.result();
    } catch (...) {
      runs_.clear();
    }
    fill_table();
    Q_EMIT refreshed();
    if (refresh_again_) {
      refresh_again_ = false;
      refresh();
    }
  });
  connect(&replay_watcher_, &QFutureWatcher<RunSeries>::finished, this, [this] {
    RunSeries series;
    try {
      series = replay_watcher_.result();
    } catch (...) {
    }
    for (const RunRecord& r : runs_)
      if (r.id == replay_id_) dashboard_->show_replay(r, series);
    tabs_->setCurrentWidget(dashboard_);
    Q_EMIT replayed(replay_id_);
  });
  connect(store_, &RunsStore::written, this, [this](const QString& id) {
    // A finished live run changes its row: refresh (cheap, asynchronous) at most then.
    if (id != live_id_) return;
    if (list_watcher_.isRunning())
      refresh_again_ = true;
    else
      refresh();
  });
  open_->setEnabled(false);
  compare_button_->setEnabled(false);
  delete_->setEnabled(false);
  refresh();
}

void RunsPage::refresh() {
  if (list_watcher_.isRunning()) return;
  list_watcher_.setFuture(store_->list_runs_async());
}

namespace {
// "120 / 5000 (2%)"; a running run never shows 100% (its last step still has to be saved).
QString progress_text(const RunRecord& r) {
  if (r.total_steps <= 0) return QString("—");
  int percent = int(100 * r.steps_done / r.total_steps);
  if (r.status == "running") percent = std::min(percent, 99);
  return QString("%1 / %2 (%3%)").arg(r.steps_done).arg(r.total_steps).arg(percent);
}
}  // namespace

void RunsPage::fill_table() {
  const QStringList selected = selected_ids();
  table_->setRowCount(int(runs_.size()));
  const double now = double(QDateTime::currentMSecsSinceEpoch()) / 1000;
  for (int row = 0; row < runs_.size(); ++row) {
    const RunRecord& r = runs_[row];
    QString status = r.status;
    if (!r.failure.isEmpty()) status += ": " + r.failure.section('\n', 0, 0);
    const double end = present(r.ended_at) ? r.ended_at : now;
    const QStringList cells = {
        r.name.isEmpty() ? r.id : r.name,
        r.model,
        r.dataset,
        r.method,
        status,
        progress_text(r),
        present(r.started_at) ? QDateTime::fromMSecsSinceEpoch(qint64(r.started_at * 1000))
                                    .toString("yyyy-MM-dd hh:mm")
                              : QString("—"),
        present(r.started_at) ? format_duration(end - r.started_at) : QString("—"),
        loss_text(r.final_loss),
        loss_text(r.final_eval_loss)};
    for (int c = 0; c < cells.size(); ++c) {
      auto* item = new QTableWidgetItem(cells[c]);
      item->setData(Qt::UserRole, r.id);
      if (c == 4 && !r.failure.isEmpty()) item->setToolTip(r.failure);
      table_->setItem(row, c, item);
    }
    if (selected.contains(r.id)) table_->selectRow(row);
  }
  table_->resizeColumnsToContents();
  // A long failure reason stays readable in the tooltip without pushing the losses away.
  table_->setColumnWidth(4,
                         std::min(table_->columnWidth(4), fontMetrics().averageCharWidth() * 32));
}

QStringList RunsPage::selected_ids() const {
  QStringList ids;
  for (const QModelIndex& index : table_->selectionModel()->selectedRows())
    if (index.row() < runs_.size()) ids << runs_[index.row()].id;
  return ids;
}

void RunsPage::open_run(const QString& id) {
  if (id == live_id_) {
    tabs_->setCurrentWidget(dashboard_);
    return;
  }
  replay_id_ = id;
  replay_watcher_.setFuture(store_->load_series_async(id));
}

void RunsPage::show_live(RunMonitor* monitor, const RunSeries* recorded) {
  live_id_ = monitor->run().id;
  tabs_->setCurrentWidget(dashboard_);
  if (recorded) dashboard_->show_replay(monitor->run(), *recorded);
  dashboard_->attach(monitor, /*keep_shown=*/recorded != nullptr);
  refresh();
}

void RunsPage::try_run(const RunRecord& run) {
  chat_->set_run(run, settings::cli_program());
  tabs_->setCurrentWidget(chat_);
}

ExportDialog* RunsPage::export_run(const RunRecord& run) {
  auto* dialog = new ExportDialog(run, settings::cli_program(), this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->show();
  return dialog;
}

namespace {
// "training.learning_rate" -> "0.0002": every leaf of a job spec, by its dotted path.
void flatten(const nlohmann::json& j, const std::string& path,
             std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [key, value] : j.items())
      flatten(value, path.empty() ? key : path + "." + key, out);
    return;
  }
  out[path] = j.is_string() ? j.get<std::string>() : j.dump();
}
}  // namespace

void RunsPage::show_spec_differences(const QStringList& ids) {
  QStringList labels;
  std::vector<std::map<std::string, std::string>> specs;
  std::set<std::string> keys;
  for (const QString& id : ids) {
    RunRecord run;
    for (const RunRecord& r : runs_)
      if (r.id == id) run = r;
    labels << (run.name.isEmpty() ? id : run.name);
    std::map<std::string, std::string> flat;
    const auto doc = nlohmann::json::parse(run.spec_json.toStdString(), nullptr, false);
    if (!doc.is_discarded()) flatten(doc, "", flat);
    for (const char* own : {"name", "output.dir", "output.resume"}) flat.erase(own);  // per run
    for (const auto& [key, value] : flat) keys.insert(key);
    specs.push_back(std::move(flat));
  }
  QStringList rows;
  for (const std::string& key : keys) {
    std::set<std::string> values;
    for (const auto& spec : specs) values.insert(spec.count(key) ? spec.at(key) : "—");
    if (values.size() > 1) rows << QString::fromStdString(key);
  }
  compare_differences_->clear();
  compare_differences_->setColumnCount(int(labels.size()));
  compare_differences_->setHorizontalHeaderLabels(labels);
  compare_differences_->setRowCount(int(rows.size()));
  compare_differences_->setVerticalHeaderLabels(rows);
  for (int row = 0; row < rows.size(); ++row)
    for (int col = 0; col < int(specs.size()); ++col) {
      const auto it = specs[std::size_t(col)].find(rows[row].toStdString());
      compare_differences_->setItem(row, col,
                                    new QTableWidgetItem(it == specs[std::size_t(col)].end()
                                                             ? QString("—")
                                                             : QString::fromStdString(it->second)));
    }
  compare_differences_label_->setText(
      rows.isEmpty() ? tr("The runs' job specs are the same (but for their names and folders).")
                     : tr("Settings that differ (%1):").arg(rows.size()));
}

void RunsPage::compare(const QStringList& ids) {
  compare_->clear();
  tabs_->setCurrentWidget(compare_->parentWidget());
  show_spec_differences(ids);
  compare_pending_ = int(ids.size());
  for (const QString& id : ids) {
    QString label = id;
    for (const RunRecord& r : runs_)
      if (r.id == id && !r.name.isEmpty()) label = r.name;
    auto* watcher = new QFutureWatcher<RunSeries>(this);
    connect(watcher, &QFutureWatcher<RunSeries>::finished, this, [this, watcher, label] {
      QList<QPointF> points;
      try {
        for (const MetricPoint& p : watcher->result().metrics)
          if (present(p.loss)) points.push_back({double(p.step), p.loss});
      } catch (...) {
      }
      compare_->append(label, points);
      watcher->deleteLater();
      if (--compare_pending_ == 0) Q_EMIT compared();
    });
    watcher->setFuture(store_->load_series_async(id));
  }
}

void RunsPage::ask_delete() {
  const auto ids = selected_ids();
  if (ids.size() != 1) return;
  RunRecord run;
  for (const RunRecord& r : runs_)
    if (r.id == ids.first()) run = r;
  QMessageBox box(
      QMessageBox::Question, tr("Delete run"),
      tr("Delete the run “%1” from the history?").arg(run.name.isEmpty() ? run.id : run.name),
      QMessageBox::Cancel, this);
  auto* del = box.addButton(tr("Delete"), QMessageBox::DestructiveRole);
  QCheckBox files(tr("Also delete its folder %1").arg(run.output_dir));
  files.setEnabled(!run.output_dir.isEmpty() && QDir(run.output_dir).exists());
  box.setCheckBox(&files);
  box.setDefaultButton(QMessageBox::Cancel);
  box.exec();
  if (box.clickedButton() != del) return;
  delete_run(run.id, files.isChecked());
}

void RunsPage::delete_run(const QString& id, bool delete_files) {
  QString folder;
  for (const RunRecord& r : runs_)
    if (r.id == id) folder = r.output_dir;
  auto* watcher = new QFutureWatcher<void>(this);
  connect(watcher, &QFutureWatcher<void>::finished, this, [this, watcher] {
    watcher->deleteLater();
    refresh();
  });
  auto db_done = store_->delete_run_async(id);
  watcher->setFuture(QtConcurrent::run([db_done, folder, delete_files]() mutable {
    db_done.waitForFinished();
    if (delete_files && !folder.isEmpty()) QDir(folder).removeRecursively();
  }));
}

}  // namespace tessera::ui
