#pragma once
// The Models page's "Hugging Face Hub" side: a search (text, task / library / license filters,
// sort, paging; widgets/hub_search_view.h) whose results are a HubResultsModel; each result is
// then checked off the GUI thread (repository info and its config.json: size, license, whether
// Tessera supports the architecture, and the planner's fit badge for the wizard's method, checked
// again when the method changed). A result opens in a detail view (a page beside the results,
// "Back to results"): facts, fit and its explanation, the files Tessera would download and the
// card rendered as Markdown (fetched off the GUI thread, kept per repository). "Download" asks the
// main window's download tray for the model.
#include <QHash>
#include <QThreadPool>
#include <QWidget>
#include <functional>

#include "job/job_spec.h"
#include "ui/models/hub_calls.h"

class QComboBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QStackedWidget;
class QTableView;

namespace tessera::ui {

class CardView;
class HubModelDetail;
class HubResultsModel;
class HubSearchView;
class HubToken;

class HubPanel : public QWidget {
  Q_OBJECT
 public:
  // `spec` gives the wizard's current choices for the fit badges (called on the GUI thread).
  HubPanel(HubToken* token, std::function<job::JobSpec()> spec, QWidget* parent = nullptr);
  ~HubPanel() override;

  void search(const QString& text);  // a new search (page 1)
  void more();                       // the next page, appended
  void set_page_size(int n);
  bool busy() const;  // a search or a check is running

  // The selected result in the detail view (false when it is not among the results).
  bool show_details(const QString& repo_id);
  void show_results();
  bool details_shown() const;

  HubSearchView* search_view() const { return search_; }
  HubResultsModel* results() const { return model_; }
  QTableView* table() const;
  QLineEdit* search_edit() const;
  QComboBox* sort_combo() const;
  // "Task", "Library" or "License".
  QComboBox* filter_combo(const QString& name) const;
  QPushButton* more_button() const;
  QPushButton* download_button() const { return download_; }
  QPushButton* details_button() const { return details_; }
  HubModelDetail* detail() const { return detail_; }
  CardView* card_view() const;
  // The state shown instead of the table ("" while the table shows), and its kind.
  QString state_text() const;
  HubProblem state_problem() const;
  QString selected_repo() const;
  void select_repo(const QString& repo_id);

 protected:
  void showEvent(QShowEvent* event) override;

 Q_SIGNALS:
  void downloadRequested(const QString& repo_id);
  void searched();   // a search or page finished (its checks may still run)
  void checked();    // a row's check finished
  void cardShown();  // the detail view's card (or why there is none) is shown

 private:
  void update_selection();
  void update_detail();
  void check_rows(const std::vector<hf::hub::SearchHit>& hits);
  void show_card(const QString& repo_id);

  HubToken* token_;
  std::function<job::JobSpec()> spec_;
  QStackedWidget* pages_;  // the results, or one model's detail
  HubSearchView* search_;
  HubResultsModel* model_;
  QLabel* summary_;  // the selected result in one line, under the results
  QPushButton* details_;
  QPushButton* download_;
  HubModelDetail* detail_;
  QHash<QString, QString> cards_;  // repository → its card's Markdown (or a note that it has none)
  QThreadPool checks_;             // a few at a time, so one search does not flood the Hub
  int generation_ = 0;             // checks of an older search are dropped
  int running_checks_ = 0;
  QString checked_method_;  // the wizard's method the rows' fit badges were planned for
};

}  // namespace tessera::ui
