#include "ui/models/hub_dataset_results_model.h"

#include <QRegularExpression>

#include "ui/models/hub_results_model.h"

namespace tessera::ui {

QStringList tag_values(const hf::hub::SearchHit& hit, const QString& prefix) {
  QStringList values;
  const std::string start = prefix.toStdString() + ":";
  for (const std::string& tag : hit.tags)
    if (tag.starts_with(start)) values << QString::fromStdString(tag.substr(start.size()));
  return values;
}

QString size_category_text(const QString& category) {
  static const QRegularExpression between(R"(^(\w+)<n<(\w+)$)");
  static const QRegularExpression below(R"(^n<(\w+)$)");
  static const QRegularExpression above(R"(^n>(\w+)$)");
  if (const auto m = between.match(category); m.hasMatch())
    return m.captured(1) + "–" + m.captured(2);
  if (const auto m = below.match(category); m.hasMatch())
    return QObject::tr("under %1").arg(m.captured(1));
  if (const auto m = above.match(category); m.hasMatch())
    return QObject::tr("over %1").arg(m.captured(1));
  return category;
}

void HubDatasetResultsModel::clear() {
  beginResetModel();
  hits_.clear();
  endResetModel();
}

void HubDatasetResultsModel::append(const std::vector<hf::hub::SearchHit>& hits) {
  if (hits.empty()) return;
  beginInsertRows({}, int(hits_.size()), int(hits_.size() + hits.size()) - 1);
  for (const auto& h : hits) hits_.push_back(h);
  endInsertRows();
}

int HubDatasetResultsModel::row_of(const QString& repo_id) const {
  for (int row = 0; row < hits_.size(); ++row)
    if (QString::fromStdString(hits_[row].id) == repo_id) return row;
  return -1;
}

int HubDatasetResultsModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : int(hits_.size());
}

int HubDatasetResultsModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant HubDatasetResultsModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= hits_.size()) return {};
  const hf::hub::SearchHit& hit = hits_[index.row()];
  const Column column = Column(index.column());
  if (role == RepoIdRole) return QString::fromStdString(hit.id);
  if (role == Qt::TextAlignmentRole && column == Column::Downloads)
    return int(Qt::AlignRight | Qt::AlignVCenter);
  if (role == Qt::ToolTipRole) {
    if (column == Column::Name && !hit.gated.empty())
      return tr("Gated: accept its terms on the Hub with the account of your token");
    if (column == Column::Rows) return tr("The number of rows, as the Hub's size category says");
    return {};
  }
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case Column::Name:
      return QString::fromStdString(hit.id) + (hit.gated.empty() ? "" : tr(" (gated)"));
    case Column::Rows: {
      const QStringList sizes = tag_values(hit, "size_categories");
      return sizes.isEmpty() ? QString("—") : size_category_text(sizes.front());
    }
    case Column::Formats: {
      const QStringList formats = tag_values(hit, "format");
      return formats.isEmpty() ? QString("—") : formats.join(", ");
    }
    case Column::License: {
      const QStringList licenses = tag_values(hit, "license");
      return licenses.isEmpty() ? QString("—") : licenses.join(", ");
    }
    case Column::Downloads:
      return human_downloads(hit.downloads);
  }
  return {};
}

QVariant HubDatasetResultsModel::headerData(int section, Qt::Orientation orientation,
                                            int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  switch (Column(section)) {
    case Column::Name:
      return tr("Dataset");
    case Column::Rows:
      return tr("Rows");
    case Column::Formats:
      return tr("Format");
    case Column::License:
      return tr("License");
    case Column::Downloads:
      return tr("Downloads");
  }
  return {};
}

}  // namespace tessera::ui
