#pragma once
// The studio's main window: a sidebar (New fine-tune, Runs, Models, Datasets, Settings) over
// a stack of pages. Remembers its size, position and the last folders (QSettings).
#include <QMainWindow>

#include "job/job_spec.h"
#include "ui/models/hub_dataset_calls.h"
#include "ui/models/runs_db.h"

class QLabel;
class QLineEdit;
class QListWidget;
class QStackedWidget;

namespace tessera::ui {

class CliProbe;
class DatasetPage;
class DownloadTray;
class FineTuneWizard;
class HubPanel;
class HubToken;
class ModelPage;
class RunMonitor;
class RunsPage;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  enum Page { NewFineTune, Runs, Models, Datasets, Settings };
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

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  QWidget* make_settings_page();
  QWidget* make_models_page();
  QWidget* make_token_box();
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
  QList<HubDatasetChoice> dataset_downloads_;  // what the dataset pages had the tray download
  QLineEdit* cli_path_;
  QLabel* cli_status_;
  QLineEdit* runs_root_;
  RunMonitor* live_ = nullptr;
  bool resume_pending_ = false;
  bool quitting_ = false;          // waiting for the live run's checkpoint before closing
  bool keep_run_on_quit_ = false;  // the live run goes on after the studio closes
};

}  // namespace tessera::ui
