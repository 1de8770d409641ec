#include "ui/models/runs_table_model.h"

#include <QDateTime>
#include <algorithm>

namespace tessera::ui {

namespace {

QString loss_text(double v) {
  return present(v) ? QString::number(v, 'f', 4) : QString("—");
}

bool still_going(const RunRecord& r) {
  return r.status == "running" || r.status == "starting";
}

// "120 / 5000 (2%)"; a running run never shows 100% (its last step still has to be saved).
QString progress_text(const RunRecord& r) {
  if (r.total_steps <= 0) return QString("—");
  int percent = int(100 * r.steps_done / r.total_steps);
  if (r.status == "running") percent = std::min(percent, 99);
  return QString("%1 / %2 (%3%)").arg(r.steps_done).arg(r.total_steps).arg(percent);
}

}  // namespace

void RunsTableModel::set_runs(QList<RunRecord> runs) {
  beginResetModel();
  runs_ = std::move(runs);
  endResetModel();
}

int RunsTableModel::row_of(const QString& id) const {
  for (int row = 0; row < runs_.size(); ++row)
    if (runs_[row].id == id) return row;
  return -1;
}

int RunsTableModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : int(runs_.size());
}

int RunsTableModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QString RunsTableModel::text(const RunRecord& r, Column column) const {
  switch (column) {
    case Column::Name:
      return r.name.isEmpty() ? r.id : r.name;
    case Column::Model:
      return r.model;
    case Column::Dataset:
      return r.dataset;
    case Column::Method:
      return r.method;
    case Column::Status: {
      // A run's history outlives its folder: the row says when the folder is gone, so a
      // "completed" run is not taken for one whose model can still be exported or resumed.
      const QString status = r.folder_missing ? tr("%1, folder missing").arg(r.status) : r.status;
      return r.failure.isEmpty() ? status : status + ": " + r.failure.section('\n', 0, 0);
    }
    case Column::Progress:
      return progress_text(r);
    case Column::Started:
      return present(r.started_at) ? QDateTime::fromMSecsSinceEpoch(qint64(r.started_at * 1000))
                                         .toString("yyyy-MM-dd hh:mm")
                                   : QString("—");
    case Column::Duration: {
      if (!present(r.started_at)) return QString("—");
      // A run still going counts up to now.
      const double end =
          present(r.ended_at) ? r.ended_at : double(QDateTime::currentMSecsSinceEpoch()) / 1000;
      return format_duration(end - r.started_at);
    }
    // A run still going has no final loss yet (its latest is in the tooltip, labelled so).
    case Column::FinalLoss:
      return still_going(r) ? QString() : loss_text(r.final_loss);
    case Column::FinalEvalLoss:
      return still_going(r) ? QString() : loss_text(r.final_eval_loss);
  }
  return {};
}

QVariant RunsTableModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= runs_.size() || index.column() >= kColumnCount) return {};
  const RunRecord& r = runs_[index.row()];
  const auto column = Column(index.column());
  switch (role) {
    case Qt::DisplayRole:
      return text(r, column);
    case Qt::ToolTipRole:
      if (column == Column::Status && r.folder_missing)
        return tr("The run's folder %1 is no longer there (moved or deleted): its model, "
                  "checkpoints and events went with it. The history keeps its charts.")
                   .arg(r.output_dir) +
               (r.failure.isEmpty() ? QString() : "\n\n" + r.failure);
      if (column == Column::Status && !r.failure.isEmpty()) return r.failure;
      if (column == Column::Name)
        return r.output_dir.isEmpty() ? text(r, column) : text(r, column) + "\n" + r.output_dir;
      if (column == Column::FinalLoss && still_going(r) && present(r.final_loss))
        return tr("still running: latest loss %1").arg(loss_text(r.final_loss));
      if (column == Column::FinalEvalLoss && still_going(r) && present(r.final_eval_loss))
        return tr("still running: latest eval loss %1").arg(loss_text(r.final_eval_loss));
      return {};
    case Qt::TextAlignmentRole:
      if (column == Column::Progress || column == Column::Duration || column == Column::FinalLoss ||
          column == Column::FinalEvalLoss)
        return int(Qt::AlignRight | Qt::AlignVCenter);
      return {};
    case RunIdRole:
      return r.id;
    default:
      return {};
  }
}

QVariant RunsTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  switch (Column(section)) {
    case Column::Name:
      return tr("Name");
    case Column::Model:
      return tr("Model");
    case Column::Dataset:
      return tr("Dataset");
    case Column::Method:
      return tr("Method");
    case Column::Status:
      return tr("Status");
    case Column::Progress:
      return tr("Progress");
    case Column::Started:
      return tr("Started");
    case Column::Duration:
      return tr("Duration");
    case Column::FinalLoss:
      return tr("Final loss");
    case Column::FinalEvalLoss:
      return tr("Final eval loss");
  }
  return {};
}

}  // namespace tessera::ui
