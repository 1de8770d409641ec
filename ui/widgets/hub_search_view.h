#pragma once
// The Hub search both Hub panels share (models on the Models page, datasets on the Datasets page):
// a search row, tag filters and the sort order (changing one searches again), the results table
// over the caller's HubHitsModel, or in its place a state that says why there is nothing to show
// (before the first search, no results, offline, needs a token, token rejected, gated, rate
// limited, unreachable), "More results" following the Hub's next page, and a status line beside
// the caller's buttons. The search runs on a pool thread; the result of an older search is
// dropped, and the destructor waits for a search in flight.
#include <QFutureWatcher>
#include <QList>
#include <QMap>
#include <QWidget>

#include "ui/models/hub_calls.h"

class QComboBox;
class QHBoxLayout;
class QLabel;
class QLineEdit;
class QPushButton;
class QStackedWidget;
class QTableView;
class QVBoxLayout;

namespace tessera::ui {

class ElidedLabel;
class HubHitsModel;
class HubToken;

// The words of one panel.
struct HubSearchTexts {
  QString placeholder;  // of the search field: "Search the Hub: qwen, llama, smol…"
  QString table_name;   // the table's accessible name: "Hub models"
  QString intro_title;  // shown before the first search
  QString intro_detail;
  QString no_results;       // "No models match \"%1\"" (%1: the text searched)
  QString no_results_hint;  // what to try instead
  QString local_note;       // what works without the Hub ("Models already downloaded are …")
};

// "1 result", "20 results"
QString results_text(int rows);

// One choice of a tag filter: its label and the Hub tag it searches with.
struct HubFilterChoice {
  QString label;
  QString tag;  // "text-generation", "license:mit", "transformers"
};

class HubSearchView : public QWidget {
  Q_OBJECT
 public:
  HubSearchView(hf::hub::RepoType type, HubToken* token, HubHitsModel* results,
                HubSearchTexts texts, QWidget* parent = nullptr);
  ~HubSearchView() override;

  // A filter combo named `name` (for filter_combo): `any` (no tag) first, then `choices`.
  QComboBox* add_filter(const QString& name, const QString& any,
                        const QList<HubFilterChoice>& choices);
  void add_button(QPushButton* button);  // at the bottom, after "More results"
  void add_footer(QWidget* widget);      // under the results, above the status line

  void search(const QString& text);  // a new search (page 1) with the filters and sort chosen
  void more();                       // the next page, appended
  void set_page_size(int n) { page_size_ = n; }
  bool searching() const { return searching_; }
  std::vector<std::string> filters() const;  // the tags the filters choose
  void set_status(const QString& text);
  bool showing_results() const;  // the table, not a state, is shown

  HubHitsModel* results() const { return model_; }
  QTableView* table() const { return table_; }
  QLineEdit* search_edit() const { return text_; }
  QComboBox* sort_combo() const { return sort_; }
  QComboBox* filter_combo(const QString& name) const { return filters_.value(name); }
  QPushButton* more_button() const { return more_; }
  // The state shown instead of the table ("" while the table shows), and its kind.
  QString state_text() const;
  HubProblem state_problem() const { return state_problem_; }
  QString selected_repo() const;
  void select_repo(const QString& repo_id);

 Q_SIGNALS:
  void searchStarted(bool append);
  // A page arrived and its hits are in the model (none when the search failed).
  void pageLoaded(const std::vector<hf::hub::SearchHit>& hits);
  void searched();  // a search or page finished and is shown
  void selectionChanged();
  void activated(const QString& repo_id);  // a row double-clicked (or Return pressed)

 private:
  void start_search(const hf::hub::SearchQuery& query, bool append);
  void show_state(HubProblem problem, const QString& title, const QString& detail);
  void show_failure(const HubFailure& failure);
  void search_again();  // a filter or the sort changed

  hf::hub::RepoType type_;
  HubToken* token_;
  HubHitsModel* model_;
  HubSearchTexts texts_;
  QLineEdit* text_;
  QPushButton* go_;
  QHBoxLayout* filter_row_;
  QMap<QString, QComboBox*> filters_;
  QComboBox* sort_;
  QStackedWidget* stack_;
  QTableView* table_;
  QLabel* state_title_;
  QLabel* state_detail_;
  QVBoxLayout* footer_;
  ElidedLabel* status_;  // never widens the panel
  QPushButton* more_;
  QHBoxLayout* buttons_;
  QFutureWatcher<HubSearchResult> watcher_;
  bool searching_ = false;  // until the search's result is shown (not only computed)
  bool searched_once_ = false;
  bool appending_ = false;
  int page_size_ = 20;
  std::string next_page_url_;
  QString last_text_;
  HubProblem state_problem_ = HubProblem::None;
};

}  // namespace tessera::ui
