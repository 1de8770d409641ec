#pragma once
// Hub search results as a Qt table model (the Models page's Hub list): one row a repository in
// the order the Hub sorted them, a column per Column. The search fills name, downloads and
// likes at once; size, license, support and fit arrive per row when its check (hub_calls.h)
// finishes.
#include <QList>
#include <optional>

#include "ui/models/hub_calls.h"
#include "ui/models/hub_hits_model.h"

namespace tessera::ui {

class HubResultsModel : public HubHitsModel {
  Q_OBJECT
 public:
  enum class Column {
    Name,       // "org/name", with a lock when gated
    Size,       // what Tessera would download
    Downloads,  // the Hub's count
    License,
    Support,  // "✔ llama", "✘ …" (the reason in the tooltip), "checking…"
    Fit,      // the planner's badge for the wizard's method (its explanation in the tooltip)
  };
  static constexpr int kColumnCount = int(Column::Fit) + 1;

  struct Row {
    hf::hub::SearchHit hit;
    std::optional<HubModelCheck> check;  // empty while it runs
  };

  using HubHitsModel::HubHitsModel;

  void clear() override;
  void append(const std::vector<hf::hub::SearchHit>& hits) override;
  // The check of `repo_id`'s row (ignored when the row is gone: a newer search replaced it).
  void set_check(const HubModelCheck& check);
  void set_fit_heading(const QString& method);
  void reset_checks();  // every row back to "checking…" (the checks run again)
  const QList<Row>& rows() const { return rows_; }
  int row_of(const QString& repo_id) const override;
  int pending_checks() const;
  QModelIndex index_of(int row, Column column) const { return index(row, int(column)); }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  QString text(const Row& row, Column column) const;
  QString tooltip(const Row& row, Column column) const;
  QList<Row> rows_;
  QString fit_heading_;
};

// "1.2M", "53K", "17"
QString human_downloads(std::int64_t n);

}  // namespace tessera::ui
