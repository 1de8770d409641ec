#include "ui/pages/runs_page.h"

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
#include <QTableView>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ui/dialogs/export_dialog.h"
#include "ui/pages/run_dashboard.h"
#include "ui/utility/error_text.h"
#include "ui/utility/run_monitor.h"
#include "ui/utility/studio_settings.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/chat_pane.h"

namespace tessera::ui {

RunsPage::RunsPage(RunsStore* store, QWidget* parent) : QWidget(parent), store_(store) {
  auto* layout = new QVBoxLayout(this);
  auto* split = new QSplitter(Qt::Vertical);
  auto* top = new QWidget;
  auto* top_layout = new QVBoxLayout(top);
  top_layout->setContentsMargins(0, 0, 0, 0);
  load_error_ = new QLabel;
  load_error_->setWordWrap(true);
  load_error_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  load_error_->setStyleSheet(
      "QLabel { color: palette(bright-text); background: #b3261e; "
      "padding: 6px; border-radius: 3px; }");
  load_error_->setVisible(false);
  top_layout->addWidget(load_error_);
  model_ = new RunsTableModel(this);
  table_ = new QTableView;
  table_->setModel(model_);
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
  connect(table_, &QTableView::activated, this, [this](const QModelIndex& index) {
    open_run(index.data(RunsTableModel::RunIdRole).toString());
  });
  connect(compare_button_, &QPushButton::clicked, this, [this] { compare(selected_ids()); });
  connect(delete_, &QPushButton::clicked, this, &RunsPage::ask_delete);
  connect(table_->selectionModel(), &QItemSelectionModel::selectionChanged, this, [this] {
    const auto n = selected_ids().size();
    open_->setEnabled(n == 1);
    compare_button_->setEnabled(n >= 2);
    delete_->setEnabled(n == 1);
  });
  connect(&list_watcher_, &QFutureWatcher<QList<RunRecord>>::finished, this, [this] {
    try {
      show_runs(list_watcher_.result());
      load_error_->setVisible(false);
    } catch (...) {
      // The list shown stays (it is the last one read); the error says why it is not newer.
      load_error_->setText(
          tr("The run history could not be read: %1").arg(current_exception_text()));
      load_error_->setVisible(true);
    }
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
    if (const RunRecord* r = find(replay_id_)) dashboard_->show_replay(*r, series);
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

void RunsPage::show_runs(QList<RunRecord> runs) {
  const QStringList selected = selected_ids();
  model_->set_runs(std::move(runs));
  for (const QString& id : selected)
    if (const int row = model_->row_of(id); row >= 0) table_->selectRow(row);
  table_->resizeColumnsToContents();
  // A long failure reason stays readable in the tooltip without pushing the losses away.
  const int status = int(RunsTableModel::Column::Status);
  table_->setColumnWidth(
      status, std::min(table_->columnWidth(status), fontMetrics().averageCharWidth() * 32));
}

const RunRecord* RunsPage::find(const QString& id) const {
  const int row = model_->row_of(id);
  return row < 0 ? nullptr : &model_->runs()[row];
}

QString RunsPage::load_error() const {
  return load_error_->isHidden() ? QString() : load_error_->text();
}

QStringList RunsPage::selected_ids() const {
  QStringList ids;
  for (const QModelIndex& index : table_->selectionModel()->selectedRows())
    ids << index.data(RunsTableModel::RunIdRole).toString();
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
    const RunRecord* found = find(id);
    const RunRecord run = found ? *found : RunRecord{};
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
    const RunRecord* run = find(id);
    const QString label = run && !run->name.isEmpty() ? run->name : id;
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
  const RunRecord* found = find(ids.first());
  if (!found) return;
  const RunRecord run = *found;
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
  const RunRecord* run = find(id);
  const QString folder = run ? run->output_dir : QString();
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
