#include "ui/pages/runs_page.h"

#include <QCheckBox>
#include <QCoreApplication>
#include <QDateTime>
#include <QDir>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
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

namespace {}  // namespace

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
  // The name takes the width left (cut with "…", whole in its tooltip), so every column shows
  // in a small window: at 1024×600 the losses ran off the edge ("Final e").
  table_->horizontalHeader()->setSectionResizeMode(int(RunsTableModel::Column::Name),
                                                   QHeaderView::Stretch);
  table_->setAccessibleName(tr("Runs"));
  top_layout->addWidget(table_, 1);
  auto* buttons = new QHBoxLayout;
  open_ = new QPushButton(tr("&Open"));
  compare_button_ = new QPushButton(tr("&Compare"));
  compare_button_->setToolTip(tr("Overlay the loss curves of the selected runs"));
  delete_ = new QPushButton(tr("&Delete…"));
  auto* refresh_button = new QPushButton(tr("R&efresh"));
  buttons->addWidget(open_);
  buttons->addWidget(compare_button_);
  buttons->addWidget(delete_);
  buttons->addStretch(1);
  buttons->addWidget(refresh_button);
  top_layout->addLayout(buttons);
  split->addWidget(top);

  tabs_ = new QTabWidget;
  dashboard_ = new RunDashboard;
  compare_ = new LineChart(tr("Training loss"), tr("step"), tr("loss"));
  compare_->set_empty_text(tr("select two runs and press Compare"));
  compare_eval_ = new LineChart(tr("Evaluation loss"), tr("step"), tr("loss"));
  compare_eval_->set_empty_text(tr("no evaluation recorded"));
  compare_throughput_ = new LineChart(
      tr("Throughput (tokens/s, %1-step mean)").arg(kThroughputWindow), tr("step"), tr("tokens/s"));
  compare_throughput_->set_empty_text(tr("no throughput recorded"));
  auto make_table = [](const QString& name) {
    auto* table = new QTableWidget;
    table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    table->setAccessibleName(name);
    table->horizontalHeader()->setStretchLastSection(true);
    return table;
  };
  // Beside the curves, the final figures and what the runs were launched with differently.
  auto* compare_page = new QWidget;
  auto* compare_layout = new QGridLayout(compare_page);
  compare_layout->setContentsMargins(0, 0, 0, 0);
  compare_metrics_ = make_table(tr("Final figures"));
  compare_differences_label_ = new QLabel;
  compare_differences_label_->setWordWrap(true);
  compare_differences_label_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  compare_differences_ = make_table(tr("Settings that differ"));
  auto* tables = new QWidget;
  auto* tables_layout = new QVBoxLayout(tables);
  tables_layout->setContentsMargins(0, 0, 0, 0);
  tables_layout->addWidget(new QLabel(tr("Final figures:")));
  tables_layout->addWidget(compare_metrics_, 1);
  tables_layout->addWidget(compare_differences_label_);
  tables_layout->addWidget(compare_differences_, 1);
  compare_layout->addWidget(compare_, 0, 0);
  compare_layout->addWidget(compare_eval_, 0, 1);
  compare_layout->addWidget(compare_throughput_, 1, 0);
  compare_layout->addWidget(tables, 1, 1);
  compare_layout->setColumnStretch(0, 1);
  compare_layout->setColumnStretch(1, 1);
  compare_layout->setRowStretch(0, 1);
  compare_layout->setRowStretch(1, 1);
  tabs_->addTab(dashboard_, tr("Run"));
  tabs_->addTab(compare_page, tr("Compare"));
  chat_ = new ChatPane;
  tabs_->addTab(chat_, tr("Try it"));
  split->addWidget(tabs_);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 3);
  split->setSizes({fontMetrics().height() * 9, fontMetrics().height() * 40});
  layout->addWidget(split);
  history_ = split;
  empty_ = new QWidget;
  auto* empty_layout = new QVBoxLayout(empty_);
  empty_text_ = new QLabel(
      tr("<b>No runs yet.</b> A run is one fine-tune: its live charts, log and results appear "
         "here, and stay after it ends so you can compare, resume, export or try it.<br><br>"
         "Start one from <b>New fine-tune</b> with a model and a dataset, or try the demo: a "
         "tiny model and dataset made on this machine, no download, a few minutes of training "
         "on a CPU."));
  empty_text_->setWordWrap(true);
  empty_layout->addWidget(empty_text_);
  auto* empty_buttons = new QHBoxLayout;
  auto* start_button = new QPushButton(tr("&New fine-tune"));
  auto* demo_button = new QPushButton(tr("Try with the &demo model"));
  empty_buttons->addWidget(start_button);
  empty_buttons->addWidget(demo_button);
  empty_buttons->addStretch(1);
  empty_layout->addLayout(empty_buttons);
  empty_layout->addStretch(1);
  empty_->setVisible(false);
  layout->addWidget(empty_);
  connect(start_button, &QPushButton::clicked, this, &RunsPage::newFineTuneRequested);
  connect(demo_button, &QPushButton::clicked, this, &RunsPage::demoRequested);

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
    const QStringList ids = selected_ids();
    open_->setEnabled(ids.size() == 1);
    compare_button_->setEnabled(ids.size() >= 2);
    // The run this studio trains now is not deleted under it (its folder is being written).
    delete_->setEnabled(ids.size() == 1 && ids.first() != live_id_);
    delete_->setToolTip(ids.size() == 1 && ids.first() == live_id_
                            ? tr("The run is training: stop it first")
                            : QString());
    // One click opens a run: the dashboard shows the run selected.
    if (ids.size() == 1 && ids.first() != shown_id_) open_run(ids.first());
  });
  connect(&list_watcher_, &QFutureWatcher<QList<RunRecord>>::finished, this, [this] {
    try {
      show_runs(list_watcher_.result());
      load_error_->setVisible(false);
      update_empty_state();
    } catch (...) {
      // The list shown stays (it is the last one read); the error says why it is not newer.
      load_error_->setText(
          tr("The run history could not be read: %1").arg(current_exception_text()));
      load_error_->setVisible(true);
      update_empty_state();
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
    // A later click (or a live run) may have asked for another run meanwhile.
    if (replay_id_ != shown_id_ || replay_id_ == live_id_) return;
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

void RunsPage::update_empty_state() {
  // A history that could not be read is not empty: its error shows above the list.
  const bool empty = model_->runs().isEmpty() && live_id_.isEmpty() && load_error_->isHidden();
  history_->setVisible(!empty);
  empty_->setVisible(empty);
}

void RunsPage::refresh() {
  if (list_watcher_.isRunning()) return;
  list_watcher_.setFuture(store_->list_runs_async());
}

void RunsPage::show_runs(QList<RunRecord> runs) {
  QStringList selected = selected_ids();
  if (selected.isEmpty() && !shown_id_.isEmpty()) selected << shown_id_;
  model_->set_runs(std::move(runs));
  for (const QString& id : selected)
    if (const int row = model_->row_of(id); row >= 0)
      table_->selectionModel()->select(model_->index(row, 0),
                                       QItemSelectionModel::Select | QItemSelectionModel::Rows);
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

void RunsPage::select_only(const QString& id) {
  if (selected_ids() == QStringList{id}) return;
  const int row = model_->row_of(id);
  if (row < 0) {
    table_->clearSelection();  // not listed yet: the next refresh selects it
    return;
  }
  table_->selectionModel()->select(model_->index(row, 0),
                                   QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
  table_->scrollTo(model_->index(row, 0));
}

void RunsPage::open_run(const QString& id) {
  shown_id_ = id;
  select_only(id);
  if (id == live_id_) {
    tabs_->setCurrentWidget(dashboard_);
    return;
  }
  replay_id_ = id;
  replay_watcher_.setFuture(store_->load_series_async(id));
}

void RunsPage::show_live(RunMonitor* monitor, const RunSeries* recorded) {
  live_id_ = shown_id_ = monitor->run().id;
  update_empty_state();
  select_only(live_id_);
  tabs_->setCurrentWidget(dashboard_);
  if (recorded) dashboard_->show_replay(monitor->run(), *recorded);
  dashboard_->attach(monitor, /*keep_shown=*/recorded != nullptr);
  refresh();
}

void RunsPage::try_run(const RunRecord& run) {
  chat_->set_run(run, settings::cli_program());
  tabs_->setCurrentWidget(chat_);
  chat_->prompt_edit()->setFocus(Qt::OtherFocusReason);  // the next keys are the message
}

ExportDialog* RunsPage::export_run(const RunRecord& run) {
  auto* dialog = new ExportDialog(run, settings::cli_program(), this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->show();
  return dialog;
}

namespace {

// Job-spec keys in words; a key not listed reads as its path with spaces ("dataset columns
// input").
QString setting_name(const std::string& key) {
  static const std::map<std::string, const char*> kNames = {
      {"training.learning_rate", "learning rate"},
      {"training.steps", "steps"},
      {"training.epochs", "epochs"},
      {"training.batch_size", "batch size"},
      {"training.gradient_accumulation", "gradient accumulation"},
      {"training.warmup_steps", "warm-up steps"},
      {"training.weight_decay", "weight decay"},
      {"training.max_grad_norm", "gradient clipping norm"},
      {"training.schedule", "learning-rate schedule"},
      {"training.seed", "seed"},
      {"training.eval_every", "evaluate every (steps)"},
      {"training.log_every", "log every (steps)"},
      {"training.save_every", "checkpoint every (steps)"},
      {"training.keep_last", "checkpoints kept"},
      {"training.activation_checkpointing", "activation checkpointing"},
      {"method.type", "method"},
      {"method.rank", "LoRA rank"},
      {"method.alpha", "LoRA alpha"},
      {"method.dropout", "LoRA dropout"},
      {"method.targets", "LoRA targets"},
      {"model.path", "model folder"},
      {"model.hub_id", "model"},
      {"model.revision", "model revision"},
      {"dataset.train", "training data"},
      {"dataset.validation", "validation data"},
      {"dataset.validation_split", "validation share"},
      {"dataset.format", "data format"},
      {"dataset.max_length", "sequence length"},
      {"dataset.packing", "packing"},
      {"dataset.hub_id", "dataset"},
      {"dataset.config", "dataset config"},
      {"dataset.revision", "dataset revision"},
      {"dataset.skip_bad_rows", "skip bad rows"},
      {"precision", "precision"},
      {"strategy.name", "strategy"},
  };
  if (const auto it = kNames.find(key); it != kNames.end())
    return QCoreApplication::translate("RunsPage", it->second);
  QString words = QString::fromStdString(key);
  if (words.startsWith("strategy.options."))
    words = QCoreApplication::translate("RunsPage", "strategy option %1").arg(words.mid(17));
  return words.replace('.', ' ').replace('_', ' ');
}

// A spec value as a person writes it: small and large numbers in short scientific notation
// ("3e-4", "1.5e+06" → "1.5e6"), strings bare, the rest as JSON.
std::string setting_value(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (v != 0 && (std::abs(v) < 1e-2 || std::abs(v) >= 1e6)) {
      QString text = QString::number(v, 'e', 2);  // "3.00e-04"
      const auto e = text.indexOf('e');
      QString mantissa = text.left(e), exponent = text.mid(e + 1);
      while (mantissa.contains('.') && (mantissa.endsWith('0') || mantissa.endsWith('.')))
        mantissa.chop(1);
      const bool negative = exponent.startsWith('-');
      exponent = exponent.mid(1);
      while (exponent.size() > 1 && exponent.startsWith('0')) exponent.remove(0, 1);
      return (mantissa + "e" + (negative ? "-" : "") + exponent).toStdString();
    }
    return QString::number(v, 'g', 6).toStdString();
  }
  return j.dump();
}

// "training.learning_rate" -> "3e-4": every leaf of a job spec, by its dotted path.
void flatten(const nlohmann::json& j, const std::string& path,
             std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [key, value] : j.items())
      flatten(value, path.empty() ? key : path + "." + key, out);
    return;
  }
  out[path] = setting_value(j);
}

QString loss_cell(double v) {
  return present(v) ? QString::number(v, 'f', 4) : QString("—");
}

}  // namespace

QStringList RunsPage::run_labels(const QStringList& ids) const {
  // The run's name; two runs of one name are told apart by when they started.
  QStringList names;
  for (const QString& id : ids) {
    const RunRecord* run = find(id);
    names << (run && !run->name.isEmpty() ? run->name : id);
  }
  QStringList labels = names;
  for (int i = 0; i < ids.size(); ++i) {
    if (names.count(names[i]) < 2) continue;
    const RunRecord* run = find(ids[i]);
    labels[i] += run && present(run->started_at)
                     ? QDateTime::fromMSecsSinceEpoch(qint64(run->started_at * 1000))
                           .toString(" (yyyy-MM-dd hh:mm:ss)")
                     : " (" + ids[i] + ")";
  }
  return labels;
}

QString RunsPage::compare_summary() const {
  return compare_differences_label_->text();
}

void RunsPage::show_spec_differences(const QStringList& ids) {
  const QStringList labels = run_labels(ids);
  std::vector<std::map<std::string, std::string>> specs;
  std::set<std::string> keys;
  for (const QString& id : ids) {
    const RunRecord* found = find(id);
    std::map<std::string, std::string> flat;
    const auto doc =
        nlohmann::json::parse(found ? found->spec_json.toStdString() : "", nullptr, false);
    if (!doc.is_discarded()) flatten(doc, "", flat);
    for (const char* own : {"name", "output.dir", "output.resume"}) flat.erase(own);  // per run
    for (const auto& [key, value] : flat) keys.insert(key);
    specs.push_back(std::move(flat));
  }
  std::vector<std::string> rows;
  for (const std::string& key : keys) {
    std::set<std::string> values;
    for (const auto& spec : specs) values.insert(spec.count(key) ? spec.at(key) : "—");
    if (values.size() > 1) rows.push_back(key);
  }
  compare_differences_->clear();
  compare_differences_->setColumnCount(int(labels.size()));
  compare_differences_->setHorizontalHeaderLabels(labels);
  compare_differences_->setRowCount(int(rows.size()));
  QStringList sentences;
  for (int row = 0; row < int(rows.size()); ++row) {
    const std::string& key = rows[std::size_t(row)];
    auto* header = new QTableWidgetItem(setting_name(key));
    header->setToolTip(QString::fromStdString(key));  // the job.json field
    compare_differences_->setVerticalHeaderItem(row, header);
    QStringList values;
    for (int col = 0; col < int(specs.size()); ++col) {
      const auto& spec = specs[std::size_t(col)];
      const auto it = spec.find(key);
      values << (it == spec.end() ? QString("—") : QString::fromStdString(it->second));
      compare_differences_->setItem(row, col, new QTableWidgetItem(values.last()));
    }
    sentences << setting_name(key) + " " + values.join(tr(" vs "));
  }
  compare_differences_label_->setText(
      rows.empty() ? tr("The runs' job specs are the same (but for their names and folders).")
                   : tr("Settings that differ: %1.").arg(sentences.join("; ")));
  compare_differences_->resizeColumnsToContents();
  compare_differences_label_->setToolTip(tr("Columns in order: %1").arg(labels.join(tr(" vs "))));
}

void RunsPage::show_run_metrics(int column, const RunRecord& run, const RunSeries& series) {
  auto set_row = [this, column](const QString& name, const QString& value) {
    int row = 0;
    while (row < compare_metrics_->rowCount() &&
           compare_metrics_->verticalHeaderItem(row)->text() != name)
      ++row;
    if (row == compare_metrics_->rowCount()) {
      compare_metrics_->setRowCount(row + 1);
      compare_metrics_->setVerticalHeaderItem(row, new QTableWidgetItem(name));
      for (int col = 0; col < compare_metrics_->columnCount(); ++col)
        compare_metrics_->setItem(row, col, new QTableWidgetItem("—"));
    }
    auto* item = new QTableWidgetItem(value);
    item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    compare_metrics_->setItem(row, column, item);
  };
  const bool ended = run.status != "running" && run.status != "starting";
  double last_loss = kMissing, last_eval = kMissing, tokens_sum = 0;
  int tokens_count = 0;
  std::int64_t last_step = 0;
  for (const MetricPoint& p : series.metrics) {
    if (present(p.loss)) last_loss = p.loss, last_step = std::max(last_step, p.step);
    if (present(p.eval_loss)) last_eval = p.eval_loss;
    if (present(p.tokens_per_s)) tokens_sum += p.tokens_per_s, ++tokens_count;
  }
  const QString running = tr("(running)");
  set_row(tr("final loss"), ended ? loss_cell(last_loss) : running);
  set_row(tr("final eval loss"), ended ? loss_cell(last_eval) : running);
  set_row(tr("steps"), run.total_steps > 0
                           ? QString("%1 / %2").arg(run.steps_done).arg(run.total_steps)
                           : QString::number(last_step));
  set_row(tr("tokens/s (mean)"),
          tokens_count > 0 ? QString::number(tokens_sum / tokens_count, 'f', 0) : QString("—"));
  set_row(tr("duration"), present(run.started_at) && present(run.ended_at)
                              ? format_duration(run.ended_at - run.started_at)
                              : running);
  // The largest memory in use per tier, where the run reported memory.
  std::map<QString, double> peaks;
  for (const MemorySample& m : series.memory) peaks[m.tier] = std::max(peaks[m.tier], m.used);
  for (const auto& [tier, bytes] : peaks)
    set_row(tr("peak %1 memory").arg(tier), format_bytes(bytes));
}

void RunsPage::compare(const QStringList& ids) {
  compare_->clear();
  compare_eval_->clear();
  compare_throughput_->clear();
  tabs_->setCurrentWidget(compare_->parentWidget());
  show_spec_differences(ids);
  const QStringList labels = run_labels(ids);
  compare_metrics_->clear();
  compare_metrics_->setRowCount(0);
  compare_metrics_->setColumnCount(int(ids.size()));
  compare_metrics_->setHorizontalHeaderLabels(labels);
  compare_pending_ = int(ids.size());
  for (int column = 0; column < ids.size(); ++column) {
    const QString id = ids[column], label = labels[column];
    // The same colour for a run in each chart.
    compare_->define_series(label, column, false);
    compare_eval_->define_series(label, column, false);
    compare_throughput_->define_series(label, column, false);
    auto* watcher = new QFutureWatcher<RunSeries>(this);
    connect(watcher, &QFutureWatcher<RunSeries>::finished, this,
            [this, watcher, id, label, column] {
              RunSeries series;
              try {
                series = watcher->result();
              } catch (...) {
              }
              QList<QPointF> loss, eval, throughput;
              TrailingMean trend(kThroughputWindow);
              for (const MetricPoint& p : series.metrics) {
                const double x = double(p.step);
                if (present(p.loss)) loss.push_back({x, p.loss});
                if (present(p.eval_loss)) eval.push_back({x, p.eval_loss});
                if (present(p.tokens_per_s)) {
                  throughput.push_back({x, trend.add(p.tokens_per_s)});
                }
              }
              compare_->append(label, loss);
              compare_eval_->append(label, eval);
              compare_throughput_->append(label, throughput);
              if (const RunRecord* run = find(id)) show_run_metrics(column, *run, series);
              compare_metrics_->resizeColumnsToContents();
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
  if (!found || found->id == live_id_) return;
  const RunRecord run = *found;
  // Another process may still be writing a run that reads as running: its history entry may go,
  // its folder stays.
  const bool may_be_training = run.status == "running" || run.status == "starting";
  QMessageBox box(
      QMessageBox::Question, tr("Delete run"),
      tr("Delete the run “%1” from the history?").arg(run.name.isEmpty() ? run.id : run.name),
      QMessageBox::Cancel, this);
  auto* del = box.addButton(tr("Delete"), QMessageBox::DestructiveRole);
  QCheckBox files(may_be_training
                      ? tr("Its folder %1 stays: the run may still be training").arg(run.output_dir)
                      : tr("Also delete its folder %1").arg(run.output_dir));
  files.setEnabled(!may_be_training && !run.output_dir.isEmpty() && QDir(run.output_dir).exists());
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
  connect(watcher, &QFutureWatcher<void>::finished, this, [this, watcher, id] {
    watcher->deleteLater();
    if (id == shown_id_ && id != live_id_) {  // the dashboard must not show a deleted run
      shown_id_.clear();
      dashboard_->clear();
    }
    refresh();
  });
  auto db_done = store_->delete_run_async(id);
  watcher->setFuture(QtConcurrent::run([db_done, folder, delete_files]() mutable {
    db_done.waitForFinished();
    if (delete_files && !folder.isEmpty()) QDir(folder).removeRecursively();
  }));
}

}  // namespace tessera::ui
