#pragma once
// The Models page's "Hugging Face Hub" side: a search (text, sort, paging) whose results are a
// HubResultsModel; each result is then checked off the GUI thread (repository info and its
// config.json: size, license, whether Tessera supports the architecture, and the planner's fit
// badge for the wizard's method, checked again when the method changed), and the selected
// model's card (README.md, rendered as Markdown, fetched off the GUI thread). Distinct states
// instead of an empty list: offline, token rejected, needs a token, gated, rate limited,
// unreachable, no results. "Download" asks the main window's download tray for the selected model.
#include <QFutureWatcher>
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
class QTextBrowser;

namespace tessera::ui {

class HubResultsModel;
class HubToken;

class HubPanel : public QWidget {
  Q_OBJECT
 public:
  // `spec` gives the wizard's current choices for the fit badges (called on the GUI thread).
  HubPanel(HubToken* token, std::function<job::JobSpec()> spec, QWidget* parent = nullptr);
  ~HubPanel() override;

  void search(const QString& text);  // a new search (page 1)
  void more();                       // the next page, appended
  void set_page_size(int n) { page_size_ = n; }
  bool busy() const;  // a search or a check is running

  HubResultsModel* results() const { return model_; }
  QTableView* table() const { return table_; }
  QLineEdit* search_edit() const { return text_; }
  QComboBox* sort_combo() const { return sort_; }
  QPushButton* more_button() const { return more_; }
  QPushButton* download_button() const { return download_; }
  QTextBrowser* card_view() const { return card_; }
  // The state shown instead of the table ("" while the table shows), and its kind.
  QString state_text() const;
  HubProblem state_problem() const { return state_problem_; }
  QString selected_repo() const;
  void select_repo(const QString& repo_id);

 protected:
  void showEvent(QShowEvent* event) override;

 Q_SIGNALS:
  void downloadRequested(const QString& repo_id);
  void searched();   // a search or page finished (its checks may still run)
  void checked();    // a row's check finished
  void cardShown();  // the selected model's card (or why there is none) is shown

 private:
  void start_search(const hf::hub::SearchQuery& query, bool append);
  void show_state(HubProblem problem, const QString& title, const QString& detail);
  void show_failure(const HubFailure& failure);
  void update_selection();
  void check_rows(const std::vector<hf::hub::SearchHit>& hits);
  void show_card(const QString& repo_id);

  HubToken* token_;
  std::function<job::JobSpec()> spec_;
  QLineEdit* text_;
  QComboBox* sort_;
  QPushButton* go_;
  QStackedWidget* stack_;
  QTableView* table_;
  HubResultsModel* model_;
  QLabel* state_title_;
  QLabel* state_detail_;
  QLabel* status_;
  QLabel* detail_;
  QTextBrowser* card_;
  QHash<QString, QString> cards_;  // repository → its card's Markdown (or a note that it has none)
  QPushButton* more_;
  QPushButton* download_;
  QFutureWatcher<HubSearchResult> search_watcher_;
  QThreadPool checks_;  // a few at a time, so one search does not flood the Hub
  int generation_ = 0;  // results of an older search are dropped
  int running_checks_ = 0;
  bool searching_ = false;  // until the search's result is shown (not only computed)
  bool appending_ = false;
  int page_size_ = 20;
  std::string next_page_url_;
  QString last_text_;
  QString checked_method_;  // the wizard's method the rows' fit badges were planned for
  HubProblem state_problem_ = HubProblem::None;
};

}  // namespace tessera::ui
