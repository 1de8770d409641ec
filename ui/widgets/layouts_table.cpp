#include "ui/widgets/layouts_table.h"

#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSortFilterProxyModel>
#include <QStandardItemModel>
#include <QTableView>
#include <QVBoxLayout>

#include "ui/models/run_data.h"
#include "ui/widgets/charts.h"

namespace tessera::ui {

namespace {

constexpr int kKeyRole = Qt::UserRole + 1;  // on the Layout column: the strategy key
constexpr int kSortRole = Qt::UserRole;     // every column: what it sorts by

QStandardItem* item(const QString& text, const QVariant& sort_by, const QString& tip) {
  auto* it = new QStandardItem(text);
  it->setData(sort_by, kSortRole);
  it->setToolTip(tip);
  it->setEditable(false);
  return it;
}

}  // namespace

QString LayoutsTable::hybrid_key(int tp, int pp, int zero_stage, bool sequence_parallel) {
  return QString("hybrid:%1x%2x%3x%4")
      .arg(tp)
      .arg(pp)
      .arg(zero_stage)
      .arg(sequence_parallel ? 1 : 0);
}

QString LayoutsTable::key_of(const QJsonObject& s) {
  const QString name = s.value("strategy").toString();
  const int stage = s.value("zero_stage").toInt();
  if (name == "hybrid")
    return hybrid_key(s.value("tp_size").toInt(1), s.value("pp_size").toInt(1), stage,
                      s.value("sequence_parallel").toBool());
  return stage > 0 ? QString("%1:%2").arg(name).arg(stage) : name;
}

LayoutsTable::LayoutsTable(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  model_ = new QStandardItemModel(0, ColumnCount, this);
  model_->setHorizontalHeaderLabels({tr("Layout"), tr("Fits"), tr("Micro-batch"),
                                     tr("Peak per rank"), tr("Step time"), tr("Communication"),
                                     tr("Bubble")});
  sorted_ = new QSortFilterProxyModel(this);
  sorted_->setSourceModel(model_);
  sorted_->setSortRole(kSortRole);
  view_ = new QTableView;
  view_->setModel(sorted_);
  view_->setSortingEnabled(true);
  view_->setSelectionBehavior(QAbstractItemView::SelectRows);
  view_->setSelectionMode(QAbstractItemView::SingleSelection);
  view_->verticalHeader()->setVisible(false);
  view_->horizontalHeader()->setSectionResizeMode(Layout, QHeaderView::Stretch);
  for (int c = Fits; c < ColumnCount; ++c)
    view_->horizontalHeader()->setSectionResizeMode(c, QHeaderView::ResizeToContents);
  view_->setMinimumHeight(view_->fontMetrics().height() * 8);
  view_->setAccessibleName(tr("Layouts the planner weighed"));
  note_ = new QLabel(
      tr("Per rank, by the planner's cost model. ✓ marks its choice; click a heading to sort, "
         "hover a row for why it lost, double-click a row (or select it and press Use this "
         "layout) to run it."));
  note_->setWordWrap(true);
  use_ = new QPushButton(tr("&Use this layout"));
  use_->setEnabled(false);
  auto* row = new QHBoxLayout;
  row->addWidget(note_, 1);
  row->addWidget(use_);
  layout->addWidget(view_);
  layout->addLayout(row);
  connect(view_, &QTableView::activated, this, [this] { pick_current(); });
  connect(use_, &QPushButton::clicked, this, [this] { pick_current(); });
  connect(view_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
          [this] { use_->setEnabled(view_->selectionModel()->hasSelection()); });
}

void LayoutsTable::show_layouts(const QJsonArray& strategies) {
  view_->setSortingEnabled(false);
  model_->removeRows(0, model_->rowCount());
  int order = 0;
  for (const QJsonValue& v : strategies) {
    const QJsonObject s = v.toObject();
    const bool chosen = s.value("chosen").toBool();
    const bool fits = s.value("fits").toBool();
    const QString tip = s.value("summary").toString();
    const QString name = s.value("layout").toString(s.value("strategy").toString());
    QList<QStandardItem*> cells;
    // The planner's order sorts the Layout column (its choice first).
    auto* layout = item((chosen ? "✓ " : "") + name, order++, tip);
    layout->setData(key_of(s), kKeyRole);
    if (chosen) {
      QFont bold = layout->font();
      bold.setBold(true);
      layout->setFont(bold);
    }
    cells << layout;
    cells << item(fits ? tr("yes") : tr("no"), fits ? 0 : 1, tip);
    const qint64 micro = s.value("micro_batch").toInteger();
    const bool checkpointing = s.value("activation_checkpointing").toBool();
    cells << item(checkpointing ? tr("%1, checkpointing").arg(micro) : QString::number(micro),
                  micro * 2 + (checkpointing ? 0 : 1), tip);
    const double peak = s.value("peak_per_rank").toDouble();
    cells << item(format_bytes(peak), peak, tip);
    const double step = s.value("seconds_per_step").toDouble();
    cells << item(format_step_time(step), step, tip);
    const double communication = s.value("communication_seconds_per_step").toDouble();
    cells << item(format_step_time(communication), communication, tip);
    const double bubble = s.value("bubble").toDouble();
    cells << item(bubble > 0 ? QString("%1%").arg(bubble * 100, 0, 'f', 0) : QString(), bubble,
                  tip);
    for (QStandardItem* cell : cells)
      if (!fits) cell->setForeground(palette().brush(QPalette::Disabled, QPalette::Text));
    model_->appendRow(cells);
  }
  view_->setSortingEnabled(true);
  view_->sortByColumn(Layout, Qt::AscendingOrder);
  // A new plan starts at its choice: the view may have been scrolled to a row picked before.
  view_->scrollToTop();
  use_->setEnabled(false);
}

int LayoutsTable::row_count() const {
  return sorted_->rowCount();
}

QString LayoutsTable::key_at(int row) const {
  return sorted_->index(row, Layout).data(kKeyRole).toString();
}

void LayoutsTable::pick_current() {
  const QModelIndex current = view_->currentIndex();
  if (!current.isValid()) return;
  const QString key = key_at(current.row());
  if (!key.isEmpty()) Q_EMIT layoutPicked(key);
}

}  // namespace tessera::ui
