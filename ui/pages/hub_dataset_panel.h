#pragma once
// The Datasets page's "Hugging Face Hub" side: a dataset search (text, task / format / license
// filters, sort, paging, the same states as the Models page's; widgets/hub_search_view.h) beside
// the selected dataset: its license and access, its configs and splits (Client::dataset_layout),
// a preview of a split's first rows before anything is downloaded (the Hub's dataset viewer, or
// the first lines of a JSONL / CSV file; where none is offered, why, in place of the rows), its
// card, and the splits to train and validate on with what they weigh. "Download and use" hands
// that choice to the page, which has the download tray fetch it.
//
// Every Hub call runs on the panel's pool with a busy indicator; an answer for a dataset, config
// or split that is no longer the one shown is dropped, and the destructor waits for the pool.
#include <QHash>
#include <QThreadPool>
#include <QWidget>

#include "ui/models/hub_dataset_calls.h"

class QComboBox;
class QLabel;
class QProgressBar;
class QPushButton;
class QStackedWidget;
class QTabWidget;
class QTableWidget;

namespace tessera::ui {

class CardView;
class HubDatasetResultsModel;
class HubSearchView;
class HubToken;

class HubDatasetPanel : public QWidget {
  Q_OBJECT
 public:
  explicit HubDatasetPanel(HubToken* token, QWidget* parent = nullptr);
  ~HubDatasetPanel() override;

  void search(const QString& text);
  void select_repo(const QString& repo_id);
  QString selected_repo() const;
  // A search, or any Hub call of the panel, is running (one for an older selection included:
  // its answer will be dropped).
  bool busy() const;

  // The selected dataset's facts and layout, once read (nullptr before, or when it failed).
  const HubDatasetInfo* info() const;
  // What "Download and use" would fetch now.
  HubDatasetChoice choice() const;
  // The message shown in place of the preview's rows ("" while the rows show).
  QString preview_message() const;
  // The selected dataset's facts, or why they could not be read (for tests and copying).
  QString facts_text() const;

  HubSearchView* search_view() const { return search_; }
  HubDatasetResultsModel* results() const { return model_; }
  QComboBox* config_combo() const { return config_; }
  QComboBox* split_combo() const { return split_; }
  QComboBox* train_combo() const { return train_; }
  QComboBox* validation_combo() const { return validation_; }
  QTableWidget* preview_table() const { return rows_; }
  CardView* card_view() const { return card_; }
  QTabWidget* tabs() const { return tabs_; }
  QPushButton* use_button() const { return use_; }
  QLabel* download_label() const { return size_; }  // what "Download and use" would fetch
  QPushButton* back_button() const { return back_; }

 Q_SIGNALS:
  void downloadRequested(const tessera::ui::HubDatasetChoice& choice);
  void backRequested();
  void layoutShown();   // the selected dataset's configs and splits (or why none) are shown
  void previewShown();  // the preview's rows (or why none) are shown
  void cardShown();

 private:
  void show_dataset(const QString& repo_id);
  void show_info(const HubDatasetInfo& info);
  void fill_splits();      // the config chosen: its splits in the split, train, validation combos
  void request_preview();  // the config and split chosen: their rows
  void show_preview(const HubRowsPreview& preview);
  void request_card();
  void update_choice();  // the size and the Download button for the splits chosen
  void update_busy();
  const hf::hub::DatasetConfig* current_config() const;

  HubToken* token_;
  HubSearchView* search_;
  HubDatasetResultsModel* model_;
  QPushButton* back_;
  QLabel* title_;
  QLabel* facts_;
  QProgressBar* busy_;
  QLabel* busy_text_;
  QComboBox* config_;
  QComboBox* split_;
  QTabWidget* tabs_;
  QStackedWidget* preview_stack_;  // the rows, or why there are none
  QTableWidget* rows_;
  QLabel* rows_caption_;
  QLabel* preview_message_;
  CardView* card_;
  QComboBox* train_;
  QComboBox* validation_;
  QLabel* size_;
  QPushButton* use_;
  QWidget* detail_;

  QThreadPool pool_;
  QString shown_repo_;                       // the dataset the detail is for
  QHash<QString, HubDatasetInfo> infos_;     // repository → what was read (successes only)
  QHash<QString, HubRowsPreview> previews_;  // "repo\nconfig\nsplit" → rows or a lasting refusal
  QHash<QString, QString> cards_;
  int layout_generation_ = 0;  // answers for an older selection are dropped
  int preview_generation_ = 0;
  bool layout_running_ = false;
  bool preview_running_ = false;
  bool filling_ = false;  // combos being filled: their signals are not choices
};

}  // namespace tessera::ui
