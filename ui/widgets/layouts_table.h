#pragma once
// The layouts the planner weighed for a job of several processes (`plan --json`'s "strategies"),
// as a table a person can sort by any column and pick from: the layout (ddp, zero stage 2,
// hybrid tp 2 × pp 2 with ZeRO-1, …), whether it fits, the micro-batch it fits with, its peak
// per rank, step time, communication and pipeline bubble; the planner's choice marked, each
// row's tooltip saying why it lost. Picking a row (double-click, Enter or "Use this layout")
// emits its strategy key, which the Hardware page turns into the job's strategy.
#include <QJsonArray>
#include <QJsonObject>
#include <QWidget>

class QLabel;
class QPushButton;
class QSortFilterProxyModel;
class QStandardItemModel;
class QTableView;

namespace tessera::ui {

class LayoutsTable : public QWidget {
  Q_OBJECT
 public:
  enum Column { Layout, Fits, MicroBatch, Peak, StepTime, Communication, Bubble, ColumnCount };
  // The data a strategy list keys a layout by: "ddp", "zero:2", "gemini",
  // "hybrid:<tp>x<pp>x<zero stage>x<sequence parallel 0 | 1>".
  static QString key_of(const QJsonObject& strategy);
  static QString hybrid_key(int tp, int pp, int zero_stage, bool sequence_parallel);

  explicit LayoutsTable(QWidget* parent = nullptr);
  // The plan's "strategies" (empty: the table is cleared).
  void show_layouts(const QJsonArray& strategies);
  int row_count() const;
  // The layout key of the row shown at `row` (in the table's current sort order).
  QString key_at(int row) const;
  QTableView* view() const { return view_; }
  QPushButton* use_button() const { return use_; }
  QSortFilterProxyModel* sorted() const { return sorted_; }

 Q_SIGNALS:
  void layoutPicked(const QString& key);

 private:
  void pick_current();

  QStandardItemModel* model_;
  QSortFilterProxyModel* sorted_;
  QTableView* view_;
  QLabel* note_;
  QPushButton* use_;
};

}  // namespace tessera::ui
