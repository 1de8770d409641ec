#pragma once
// One Hub model in full, for the Models page's Hub side (a page beside its results, with "Back to
// results"): its name, license, access (open or gated), what Tessera would download (size and
// the files), whether Tessera can train it, the planner's fit badge with its explanation, and its
// card rendered as Markdown. It shows what the panel gives it; it asks the Hub nothing itself.
#include <QWidget>
#include <optional>

#include "ui/models/hub_calls.h"

class QLabel;
class QPushButton;
class QTabWidget;
class QTableWidget;

namespace tessera::ui {

class CardView;

class HubModelDetail : public QWidget {
  Q_OBJECT
 public:
  explicit HubModelDetail(QWidget* parent = nullptr);

  // The model of a search hit and its check (nullopt while the check runs).
  void show_model(const hf::hub::SearchHit& hit, const std::optional<HubModelCheck>& check);
  const QString& repo_id() const { return repo_id_; }

  CardView* card_view() const { return card_; }
  QTableWidget* files_table() const { return files_; }
  QPushButton* back_button() const { return back_; }
  QPushButton* download_button() const { return download_; }
  // Every fact shown above the tabs, as text (for tests and copying).
  QString facts_text() const;

 Q_SIGNALS:
  void backRequested();
  void downloadRequested(const QString& repo_id);

 private:
  QString repo_id_;
  QPushButton* back_;
  QPushButton* open_;
  QPushButton* download_;
  QLabel* title_;
  QLabel* support_;
  QLabel* license_;
  QLabel* access_;
  QLabel* size_;
  QLabel* fit_;
  QLabel* popularity_;
  QTabWidget* tabs_;
  CardView* card_;
  QTableWidget* files_;
};

}  // namespace tessera::ui
