#pragma once
// The studio's main window: a sidebar (New fine-tune, Runs, Models, Datasets, Nodes, Settings) over
// a stack of pages. Remembers its size, position and the last folders (QSettings).
#include <QMainWindow>
#include <QMap>
#include <QPointer>

#include "job/job_spec.h"
#include "ui/dialogs/about_dialog.h"  // QPointer needs the complete types
#include "ui/dialogs/user_guide_window.h"
#include "ui/models/hub_dataset_calls.h"
#include "ui/models/runs_db.h"

class QAbstractButton;
class QAction;
class QComboBox;
class QLabel;
class QLineEdit;
class QListWidget;
class QStackedWidget;

namespace tessera::ui {

class CliProbe;
class DemoOffer;
class DatasetPage;
class DownloadTray;
class FineTuneWizard;
class HubPanel;
class HubToken;
class ModelPage;
class NodesPage;
class RunMonitor;
class RunsPage;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  enum Page { NewFineTune, Runs, Models, Datasets, Nodes, Settings };
  explicit MainWindow(RunsStore* store, QWidget* parent = nullptr);
  ~MainWindow() override;

  void show_page(Page page);
  Page current_page() const;
  FineTuneWizard* wizard() const { return wizard_; }
  RunsPage* runs_page() const { return runs_; }
  CliProbe* cli_probe() const { return probe_; }
  QListWidget* sidebar() const { return sidebar_; }
  ModelPage* local_models() const { return models_; }
  HubPanel* hub_panel() const { return hub_; }
  DatasetPage* datasets_page() const { return datasets_; }
  NodesPage* nodes_page() const { return nodes_; }
  DownloadTray* downloads() const { return downloads_; }
  HubToken* hub_token() const { return token_; }
  QWidget* page_widget(Page page) const;
  // Starts `tessera-cli run` on `spec` (written to its output folder). Returns "" or why not.
  QString launch(const job::JobSpec& spec);
  // Continues a stopped, failed or interrupted run from its last checkpoint, in its own
  // folder and database row (its recorded events are read first, off the GUI thread).
  // Returns "" or why not; the child starts when the recorded events are loaded.
  QString resume(const RunRecord& run);
  RunMonitor* live_run() const { return live_; }

  // Menu bar. File: New fine-tune (Ctrl+N), Open run…, Quit (Ctrl+Q); Run: Stop, Resume,
  // Export… (each enabled exactly when the shown run's dashboard button is, and clicking it);
  // Help: User guide (F1), About.
  QAction* new_fine_tune_action() const { return new_fine_tune_action_; }
  QAction* open_run_action() const { return open_run_action_; }
  QAction* quit_action() const { return quit_action_; }
  QAction* stop_action() const { return stop_action_; }
  QAction* resume_action() const { return resume_action_; }
  QAction* export_action() const { return export_action_; }
  QAction* user_guide_action() const { return user_guide_action_; }
  QAction* about_action() const { return about_action_; }
  UserGuideWindow* user_guide() const { return user_guide_; }  // once F1 opened it
  AboutDialog* about_dialog() const { return about_; }         // while About is open
  // Shows the run recorded in `folder` (one with job.json) on the Runs page. Returns "" or
  // what the folder is missing; `*has_spec` says whether it has a job.json to clone from.
  QString open_run_folder(const QString& folder, bool* has_spec = nullptr);
  // A job spec file (docs/job-spec.md; the desktop entry opens *.tessera-job.json with the
  // studio) in the New fine-tune wizard, shown. Returns "" or why not, naming the file.
  QString open_job_file(const QString& file);
  // "Try with the demo model": makes the demo in the app's data folder, then fills the wizard.
  DemoOffer* demo_offer() const { return demo_offer_; }
  void try_demo();
  QComboBox* theme_combo() const { return theme_; }

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;
  void closeEvent(QCloseEvent* event) override;

 private:
  QWidget* make_settings_page();
  QWidget* make_models_page();
  QWidget* make_token_box();
  void make_menus();
  // `action` mirrors `button`: enabled as it is, and a click on it when triggered.
  void mirror(QAction* action, QAbstractButton* button);
  void ask_open_run();
  // The New fine-tune page at the wizard's current step, the keyboard focus in its first field.
  void show_wizard();
  // Loads the run's recorded series (off the GUI thread), then resumes it in a new child, or
  // reattaches to its still-running detached child.
  void follow_recorded(const RunRecord& run, bool reattach);
  RunsStore* store_;
  CliProbe* probe_;
  QListWidget* sidebar_;
  QStackedWidget* stack_;
  FineTuneWizard* wizard_;
  RunsPage* runs_;
  ModelPage* models_;
  HubToken* token_;
  HubPanel* hub_;
  DownloadTray* downloads_;
  DatasetPage* datasets_;
  NodesPage* nodes_;
  QList<HubDatasetChoice> dataset_downloads_;  // what the dataset pages had the tray download
  QLineEdit* cli_path_;
  QLabel* cli_status_;
  QLineEdit* runs_root_;
  QComboBox* theme_;
  DemoOffer* demo_offer_;
  QAction* new_fine_tune_action_;
  QAction* open_run_action_;
  QAction* quit_action_;
  QAction* stop_action_;
  QAction* resume_action_;
  QAction* export_action_;
  QAction* user_guide_action_;
  QAction* about_action_;
  QMap<QObject*, QAction*> mirrored_;  // dashboard button -> its Run menu action
  QPointer<UserGuideWindow> user_guide_;
  QPointer<AboutDialog> about_;
  RunMonitor* live_ = nullptr;
  bool resume_pending_ = false;
  bool quitting_ = false;          // waiting for the live run's checkpoint before closing
  bool keep_run_on_quit_ = false;  // the live run goes on after the studio closes
};

}  // namespace tessera::ui
