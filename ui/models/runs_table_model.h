#pragma once
// The runs history as a Qt table model (the Runs page's list): one row a run, in the order the
// database lists them, a column per Column. The run's id is under RunIdRole in every cell.
#include <QAbstractTableModel>
#include <QList>

#include "ui/models/runs_db.h"

namespace tessera::ui {

class RunsTableModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum class Column {
    Name,
    Model,
    Dataset,
    Method,
    Status,  // "failed: <first line of the reason>", the whole reason in the tooltip
    Progress,
    Started,
    Duration,
    FinalLoss,
    FinalEvalLoss,
  };
  static constexpr int kColumnCount = int(Column::FinalEvalLoss) + 1;
  static constexpr int RunIdRole = Qt::UserRole;

  using QAbstractTableModel::QAbstractTableModel;

  void set_runs(QList<RunRecord> runs);
  const QList<RunRecord>& runs() const { return runs_; }
  // The row of run `id`, or -1.
  int row_of(const QString& id) const;
  QModelIndex index_of(int row, Column column) const { return index(row, int(column)); }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  QString text(const RunRecord& run, Column column) const;
  QList<RunRecord> runs_;
};

}  // namespace tessera::ui
