#pragma once
// Hub dataset search results as a Qt table model (the Datasets page's Hub list): one row a
// repository in the order the Hub sorted them, everything from the search's own answer (its
// tags say the size, formats and license; nothing is fetched per row).
#include <QList>

#include "ui/models/hub_hits_model.h"

namespace tessera::ui {

class HubDatasetResultsModel : public HubHitsModel {
  Q_OBJECT
 public:
  enum class Column {
    Name,     // "org/name", "(gated)" when it is
    Rows,     // the Hub's size category: "1K–10K"
    Formats,  // "json, parquet"
    License,
    Downloads,  // the Hub's count
  };
  static constexpr int kColumnCount = int(Column::Downloads) + 1;

  using HubHitsModel::HubHitsModel;

  void clear() override;
  void append(const std::vector<hf::hub::SearchHit>& hits) override;
  int row_of(const QString& repo_id) const override;
  const QList<hf::hub::SearchHit>& hits() const { return hits_; }
  QModelIndex index_of(int row, Column column) const { return index(row, int(column)); }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  QList<hf::hub::SearchHit> hits_;
};

// The values of `hit`'s tags "PREFIX:value" ("license", "format", "size_categories"), in order.
QStringList tag_values(const hf::hub::SearchHit& hit, const QString& prefix);
// The Hub's size category "1K<n<10K" as "1K–10K", "n<1K" as "under 1K", "n>1T" as "over 1T".
QString size_category_text(const QString& category);

}  // namespace tessera::ui
