#include "ui/models/hub_results_model.h"

#include <QBrush>
#include <QColor>
#include <QLocale>

#include "ui/models/model_info.h"

namespace tessera::ui {

QString human_downloads(std::int64_t n) {
  return n >= 1000 ? human_count(std::uint64_t(n)) : QString::number(n);
}

namespace {

QString failure_text(const HubFailure& f) {
  switch (f.problem) {
    case HubProblem::NeedsToken:
      return QObject::tr("needs a token");
    case HubProblem::TokenRejected:
      return QObject::tr("token rejected");
    case HubProblem::Gated:
      return QObject::tr("gated: accept its license");
    case HubProblem::RateLimited:
      return QObject::tr("rate limited");
    case HubProblem::Offline:
      return QObject::tr("offline");
    default:
      return QObject::tr("cannot check");
  }
}

}  // namespace

void HubResultsModel::clear() {
  beginResetModel();
  rows_.clear();
  endResetModel();
}

void HubResultsModel::append(const std::vector<hf::hub::SearchHit>& hits) {
  if (hits.empty()) return;
  beginInsertRows({}, int(rows_.size()), int(rows_.size() + hits.size()) - 1);
  for (const auto& h : hits) rows_.push_back({h, std::nullopt});
  endInsertRows();
}

void HubResultsModel::set_check(const HubModelCheck& check) {
  const int row = row_of(check.repo_id);
  if (row < 0) return;
  rows_[row].check = check;
  Q_EMIT dataChanged(index(row, 0), index(row, kColumnCount - 1));
}

void HubResultsModel::set_fit_heading(const QString& method) {
  fit_heading_ = method;
  Q_EMIT headerDataChanged(Qt::Horizontal, int(Column::Fit), int(Column::Fit));
}

void HubResultsModel::reset_checks() {
  for (Row& r : rows_) r.check.reset();
  if (!rows_.isEmpty()) Q_EMIT dataChanged(index(0, 0), index(rowCount() - 1, kColumnCount - 1));
}

int HubResultsModel::row_of(const QString& repo_id) const {
  for (int row = 0; row < rows_.size(); ++row)
    if (QString::fromStdString(rows_[row].hit.id) == repo_id) return row;
  return -1;
}

int HubResultsModel::pending_checks() const {
  int n = 0;
  for (const Row& r : rows_) n += r.check ? 0 : 1;
  return n;
}

int HubResultsModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : int(rows_.size());
}

int HubResultsModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QString HubResultsModel::text(const Row& r, Column column) const {
  const bool checked = r.check.has_value();
  const bool failed = checked && r.check->failure.failed();
  switch (column) {
    case Column::Name:
      return QString::fromStdString(r.hit.id) + (r.hit.gated.empty() ? "" : tr(" (gated)"));
    case Column::Size:
      if (!checked) return "…";
      return r.check->download_bytes >= 0 ? human_bytes(std::uint64_t(r.check->download_bytes))
                                          : QString("—");
    case Column::Downloads:
      return human_downloads(r.hit.downloads);
    case Column::License:
      if (checked && !r.check->license.isEmpty()) return r.check->license;
      for (const auto& t : r.hit.tags)
        if (t.starts_with("license:")) return QString::fromStdString(t.substr(8));
      return checked ? QString("—") : QString("…");
    case Column::Support:
      if (!checked) return tr("checking…");
      if (failed) return failure_text(r.check->failure);
      switch (r.check->support) {
        case HubModelCheck::Support::Supported:
          return "✔ " + r.check->model_type +
                 (r.check->stored_quantization.isEmpty()
                      ? QString()
                      : tr(" · %1 quantized").arg(r.check->stored_quantization));
        case HubModelCheck::Support::Unsupported:
          return r.check->model_type.isEmpty() ? tr("✘ not supported") : "✘ " + r.check->model_type;
        default:
          return "—";
      }
    case Column::Fit:
      if (!checked) return "…";
      return r.check->fit_text.isEmpty() ? QString("—") : r.check->fit_text;
  }
  return {};
}

QString HubResultsModel::tooltip(const Row& r, Column column) const {
  if (!r.check) return {};
  const HubModelCheck& c = *r.check;
  if (c.failure.failed() && (column == Column::Support || column == Column::Fit))
    return c.failure.message + (c.failure.hint.isEmpty() ? "" : "\n" + c.failure.hint);
  if (column == Column::Support)
    return c.support_reason + (c.support_hint.isEmpty() ? "" : "\n" + c.support_hint);
  if (column == Column::Fit) return c.fit_detail;
  if (column == Column::Size && c.download_bytes >= 0)
    return tr("%1 bytes: the safetensors weights, config and tokenizer files")
        .arg(QLocale().toString(qlonglong(c.download_bytes)));
  if (column == Column::Name && !r.hit.gated.empty())
    return tr("Gated: accept its license on the Hub with the account of your token");
  return {};
}

QVariant HubResultsModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rows_.size()) return {};
  const Row& r = rows_[index.row()];
  const Column column = Column(index.column());
  switch (role) {
    case Qt::DisplayRole:
      return text(r, column);
    case Qt::ToolTipRole:
      return tooltip(r, column);
    case RepoIdRole:
      return QString::fromStdString(r.hit.id);
    case Qt::TextAlignmentRole:
      if (column == Column::Size || column == Column::Downloads)
        return int(Qt::AlignRight | Qt::AlignVCenter);
      return {};
    case Qt::ForegroundRole:
      if (!r.check) return {};
      if (column == Column::Support) {
        if (r.check->failure.failed() || r.check->support == HubModelCheck::Support::Unsupported)
          return QBrush(QColor(0xc0, 0x39, 0x2b));
        if (r.check->support == HubModelCheck::Support::Supported)
          return QBrush(QColor(0x1e, 0x8c, 0x45));
      }
      if (column == Column::Fit) {
        if (r.check->fit == HubModelCheck::Fit::Fits) return QBrush(QColor(0x1e, 0x8c, 0x45));
        if (r.check->fit == HubModelCheck::Fit::FitsWithOtherMethod)
          return QBrush(QColor(0xb9, 0x77, 0x0e));
        if (r.check->fit == HubModelCheck::Fit::TooLarge) return QBrush(QColor(0xc0, 0x39, 0x2b));
      }
      return {};
    default:
      return {};
  }
}

QVariant HubResultsModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  switch (Column(section)) {
    case Column::Name:
      return tr("Model");
    case Column::Size:
      return tr("Download");
    case Column::Downloads:
      return tr("Downloads");
    case Column::License:
      return tr("License");
    case Column::Support:
      return tr("Tessera");
    case Column::Fit:
      return fit_heading_.isEmpty()
                 ? tr("Fits here")
                 : tr("Fits here (%1)").arg(fit_heading_ == "lora" ? tr("LoRA") : fit_heading_);
  }
  return {};
}

}  // namespace tessera::ui
