#pragma once
// What a Hub search view (widgets/hub_search_view.h) needs of the table model it fills: the
// search clears it, appends each page's hits, and finds a repository's row. The models' and the
// datasets' result models derive from it and add their own columns.
#include <QAbstractTableModel>
#include <vector>

#include "hf/hub/client.h"

namespace tessera::ui {

class HubHitsModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  static constexpr int RepoIdRole = Qt::UserRole;  // "org/name", in every cell

  using QAbstractTableModel::QAbstractTableModel;

  virtual void clear() = 0;
  virtual void append(const std::vector<hf::hub::SearchHit>& hits) = 0;
  virtual int row_of(const QString& repo_id) const = 0;  // -1 when absent
};

}  // namespace tessera::ui
