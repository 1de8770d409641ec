#pragma once
// The New fine-tune wizard: Model → Dataset → Method → Review. (Hardware & strategy comes
// with `tessera-cli profile` / `plan`.) Each page validates in worker threads and the
// wizard turns the choices into a job spec (engine/job/job_spec.h).
#include <QFutureWatcher>
#include <QJsonObject>
#include <QMap>
#include <QWidget>
#include <optional>

#include "hf/config.h"
#include "job/job_spec.h"
#include "ui/models/dataset_analysis.h"
#include "ui/models/hub_dataset_calls.h"
#include "ui/models/model_info.h"

class QBarSeries;
class QBarCategoryAxis;
class QValueAxis;
class QChartView;
class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QFormLayout;
class QGroupBox;
class QLabel;
class QTimer;
class QLineEdit;
class QListWidget;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;
class QRadioButton;
class QSpinBox;
class QStackedWidget;
class QTabWidget;
class QTableWidget;
class QToolButton;

namespace tessera::ui {

class CliProbe;
class HardwarePage;
class WriteChecker;
class HubDatasetPanel;
class PairView;
class HubToken;

// ---- 1. Model ---------------------------------------------------------------------------
class ModelPage : public QWidget {
  Q_OBJECT
 public:
  explicit ModelPage(QWidget* parent = nullptr);
  void choose_folder(const QString& folder);  // validates in a worker thread
  void rescan_cache();                        // the HF cache list, in a worker thread
  bool busy() const;
  const ModelSummary& summary() const { return summary_; }
  bool ready() const { return summary_.trainable && !busy(); }
  QListWidget* cache_list() const { return cache_list_; }
  QLabel* verdict_label() const { return verdict_; }
  QString summary_text() const;  // every row of the summary, for tests and copying

 Q_SIGNALS:
  void modelChanged();

 private:
  void show_summary();
  QLineEdit* path_;
  QListWidget* cache_list_;
  QLabel* cache_status_;
  QLabel* verdict_;
  QMap<QString, QLabel*> fields_;
  QFutureWatcher<ModelSummary> watcher_;
  QFutureWatcher<QList<CachedModel>> cache_watcher_;
  ModelSummary summary_;
  QString requested_;
};

// ---- 2. Dataset -------------------------------------------------------------------------
// A dataset file on this machine, or (with enable_hub) splits of a Hub dataset: searched and
// previewed in the page's Hub view (hub_dataset_panel.h), downloaded by the main window's
// download tray, then read and mapped like a file.
class DatasetPage : public QWidget {
  Q_OBJECT
 public:
  // A Hub dataset the page uses: the choice and the snapshot folder its files were verified in.
  struct HubDataset {
    HubDatasetChoice choice;
    QString snapshot;
    QStringList local_train_files() const;
  };

  explicit DatasetPage(QWidget* parent = nullptr);
  // Offers the Hub (a "Hugging Face Hub…" button and view); without it the page reads files only.
  void enable_hub(HubToken* token);
  HubDatasetPanel* hub_panel() const { return hub_; }
  QPushButton* hub_button() const { return hub_button_; }
  QLabel* hub_source_label() const { return hub_source_; }
  void show_hub(bool shown);  // the Hub view, or the dataset view
  bool hub_shown() const;
  void set_model_folder(const QString& folder);  // the tokenizer for the token statistics
  void choose_file(const QString& file);
  // `choice`'s files, verified in `snapshot`, become the dataset (read and analysed at once).
  void use_hub_dataset(const HubDatasetChoice& choice, const QString& snapshot);
  const std::optional<HubDataset>& hub_dataset() const { return hub_dataset_; }
  // The download tray finished `request`: used when it is the one this page asked for.
  void hub_download_ready(const HubDownloadRequest& request, const QString& snapshot);
  // The Hub dataset whose download this page waits for, if any.
  const std::optional<HubDatasetChoice>& pending_hub_download() const { return pending_; }
  // Everything `spec` says of the dataset: file or Hub dataset (its files from the HF cache),
  // format, columns, split, length, packing.
  void load_spec(const job::DatasetSpec& spec);
  void set_format(const QString& format);  // "auto", "text", …
  void set_column(const QString& role, const QString& column);
  bool busy() const;
  // What stops a run on this dataset, in words that say what to do ("Wait for the dataset
  // check", "Fix the dataset: 3 rows cannot be trained on…"); "" when it can be trained on.
  // The rules are the run's (dataset_analysis.h): its reader, its example builder with this
  // page's sequence length and packing, the model's context.
  QString problem() const;
  bool ready() const { return problem().isEmpty(); }
  const DatasetAnalysis& analysis() const { return analysis_; }
  // Rows the run will skip (dataset.skip_bad_rows): the bad rows when "Skip bad rows" is on.
  std::uint64_t rows_to_skip() const;
  // Where they are, as the run's log counts them: "1 unreadable, 3 of the 29 training rows and
  // 1 of the 10 validation rows" ("" when none).
  QString skipped_rows_text() const;
  // training.seed: the run's validation split (and so each share's counts) depends on it.
  void set_split_seed(std::uint64_t seed);
  // The spec's dataset part (files, format, mapping, split, max length, packing).
  job::DatasetSpec dataset_spec() const;

  QTableWidget* preview_table() const { return table_; }
  // Shown for preference pairs: the picked row's prompt, chosen and rejected side by side.
  PairView* pair_view() const { return pair_view_; }
  QBarSeries* histogram() const { return histogram_; }
  QLabel* truncation_label() const { return truncation_; }
  QComboBox* format_combo() const { return format_; }
  QComboBox* role_combo(const QString& role) const { return role_combos_.value(role); }
  QDoubleSpinBox* validation_split() const { return split_; }
  QSpinBox* max_length() const { return max_length_; }
  QCheckBox* packing() const { return packing_; }
  QCheckBox* skip_bad_rows_box() const { return skip_bad_; }
  QLabel* bad_rows_label() const { return bad_rows_; }
  QLabel* status_label() const { return status_; }
  QLabel* format_note_label() const { return format_note_; }
  QPushButton* use_format_button() const { return use_format_; }
  QLabel* context_label() const { return context_; }
  QPushButton* fit_context_button() const { return fit_context_; }
  QProgressBar* progress_bar() const { return progress_; }

 Q_SIGNALS:
  void datasetChanged();
  // "Download and use" on the Hub view: the main window has the download tray fetch it.
  void hubDownloadRequested(const tessera::ui::HubDatasetChoice& choice);

 private:
  void analyze();
  void recount();      // the shares for the current split, from the rows already checked
  bool stale() const;  // the analysis shown is for other settings than the page's
  double validation_fraction() const;  // the run's dataset.validation_split (0: files)
  void show_analysis();
  void rebuild_role_combos();
  void show_source();      // the Hub line over the analysis, the validation split's state
  void show_checks();      // bad rows, the sequence length against the model's context
  QStackedWidget* views_;  // the dataset (source, mapping, analysis), or the Hub view
  QWidget* dataset_view_;
  QPushButton* hub_button_;
  HubDatasetPanel* hub_ = nullptr;
  QLabel* hub_source_;
  std::optional<HubDataset> hub_dataset_;
  std::optional<HubDatasetChoice> pending_;  // asked of the download tray, not ready yet
  QLineEdit* path_;
  QComboBox* format_;
  QFormLayout* roles_form_;
  QMap<QString, QComboBox*> role_combos_;
  QSpinBox* max_length_;
  QCheckBox* packing_;
  // The user's packing choice: the box shows it for text data, and unticked (disabled) for
  // formats that train a row to a sequence, where it would read as packing that never happens.
  bool packing_choice_ = true;
  QDoubleSpinBox* split_;
  QLabel* status_;
  QLabel* format_note_;
  QPushButton* use_format_;
  QLabel* context_;
  QPushButton* fit_context_;
  QLabel* bad_rows_;
  QCheckBox* skip_bad_;
  QLabel* description_;
  QTableWidget* table_;
  PairView* pair_view_;
  void show_pair(int row);  // the preview's row `row` in pair_view_ (preference format)
  QChartView* histogram_view_;
  QBarSeries* histogram_;
  QBarCategoryAxis* histogram_x_;
  QValueAxis* histogram_y_;
  QLabel* truncation_;
  QFutureWatcher<DatasetAnalysis> watcher_;
  DatasetAnalysis analysis_;
  QProgressBar* progress_;
  std::shared_ptr<AnalysisProgress> progress_state_;  // of the analysis running
  std::uint64_t seed_ = job::TrainingSpec{}.seed;
  QString model_folder_;
  bool analyzing_ = false;  // until the analysis is shown
  bool rerun_ = false;
  // A length or packing change analyzes again 300 ms after the last one; an analysis started
  // meanwhile (a file chosen) covers it, so it stops the timer.
  QTimer* debounce_ = nullptr;
  bool updating_ = false;
  // The sequence length was set by the user (or a loaded spec): until then it is lowered to the
  // model's context, so the default never stops a run on a short-context model.
  bool max_length_chosen_ = false;
  bool fitting_length_ = false;  // the page itself changes it
  QMap<QString, QString> user_columns_;
};

// ---- 3. Method --------------------------------------------------------------------------
class MethodPage : public QWidget {
  Q_OBJECT
 public:
  explicit MethodPage(QWidget* parent = nullptr);
  void set_method(const QString& type);      // "full" | "lora" | "qlora"
  void set_steps(int steps);                 // train for a number of steps (not epochs)
  void apply_preset(const QString& preset);  // "quick" | "balanced" | "thorough"
  QString method() const;                    // the job spec's method.type: "full" | "lora"
  QString method_choice() const;             // the card chosen: "full" | "lora" | "qlora"
  QString quantize() const;                  // QLoRA's base format ("nf4", ...) or "none"
  bool double_quant() const;                 // QLoRA on 4 bits: the block scales quantized too
  // The training objective: "sft" (supervised) or a preference loss ("dpo", "ipo", "simpo",
  // "orpo", "kto"), with the data it needs ("preference" pairs or "unpaired" examples).
  QString objective() const;
  void set_objective(const QString& objective);
  static QString data_format_for(const QString& objective);
  QString preset() const { return preset_; }
  job::MethodSpec method_spec() const;
  job::TrainingSpec training_spec() const;
  QString precision() const;
  // The Hardware & strategy page's overrides, written into the advanced settings.
  void set_overrides(int batch_size, bool activation_checkpointing, const QString& precision);
  // Every setting of `method` and `training`, and the precision (a cloned run's).
  void load_spec(const job::MethodSpec& method, const job::TrainingSpec& training,
                 const QString& precision);
  int changed_from_defaults() const;  // settings that differ from the preset's values
  // Each card's memory for the model in `model_folder` and the rest of `spec` (the batch, the
  // sequence length, the precision) by the planner's estimate, method by method; nothing shown
  // without a model. The folder's config and checkpoint size are read once per folder.
  void show_memory(const QString& model_folder, const job::JobSpec& spec);
  // The figure shown on a card ("full", "lora", "qlora"); empty when none is.
  QString memory_text(const QString& method) const;
  bool learning_rate_user_set() const { return lr_user_set_; }
  QLineEdit* learning_rate_edit() const { return lr_; }
  QLabel* changed_label() const { return changed_; }
  void set_advanced_visible(bool visible);

 Q_SIGNALS:
  void methodChanged();

 private:
  // Whether a QLoRA base of `format` would double-quantize: 4 bits and the box ticked.
  bool double_quant_for(const QString& format) const;
  struct Preset {
    job::TrainingSpec training;
    job::MethodSpec method;
  };
  Preset preset_values(const QString& preset, const QString& method) const;
  void load(const Preset& p, bool keep_user_lr);
  void update_changed();
  QRadioButton* full_;
  QRadioButton* lora_;
  QRadioButton* qlora_;
  QMap<QString, QLabel*> memory_;  // per card: what the method would need, by the planner
  QString memory_folder_;          // the model the cached config below is of
  std::optional<hf::ModelConfig> memory_config_;
  std::uint64_t memory_checkpoint_bytes_ = 0;
  QMap<QString, QPushButton*> preset_buttons_;
  QString preset_ = "balanced";
  QLabel* changed_;
  QToolButton* advanced_toggle_;
  QWidget* advanced_;
  // training
  QComboBox* length_mode_;
  QSpinBox* steps_;
  QDoubleSpinBox* epochs_;
  QSpinBox* batch_;
  QSpinBox* accumulation_;
  QLineEdit* lr_;
  QLineEdit* weight_decay_;
  QLineEdit* beta1_;
  QLineEdit* beta2_;
  QLineEdit* eps_;
  QComboBox* schedule_;
  QSpinBox* warmup_;
  QLineEdit* grad_norm_;
  QSpinBox* seed_;
  QSpinBox* eval_every_;
  QSpinBox* save_every_;
  QSpinBox* keep_last_;
  QSpinBox* log_every_;
  QCheckBox* checkpointing_;
  QComboBox* precision_;
  // LoRA
  QGroupBox* lora_box_;
  QSpinBox* rank_;
  QLineEdit* alpha_;
  QLineEdit* dropout_;
  QLineEdit* targets_;
  QComboBox* quantize_;  // QLoRA's base format
  QCheckBox* double_quant_;
  // objective
  QComboBox* objective_;
  QLabel* objective_text_;
  QFormLayout* objective_form_;
  QLineEdit* beta_;
  QLineEdit* label_smoothing_;
  QLineEdit* simpo_gamma_;
  QLineEdit* desirable_weight_;
  QLineEdit* undesirable_weight_;
  void show_objective();
  bool lr_user_set_ = false;
  bool loading_ = false;
};

// ---- 4. Review --------------------------------------------------------------------------
// What the other steps know of the job beyond its spec, for Review's summary.
struct ReviewFacts {
  QString model_name;              // "test-org/tiny-llama"
  std::uint64_t parameters = 0;    // 0: not known
  std::uint64_t dataset_rows = 0;  // rows read from the training files (0: not known)
  std::uint64_t skipped_rows = 0;  // bad rows the run skips (dataset.skip_bad_rows)
  QString skipped_where;           // where they are: DatasetPage::skipped_rows_text()
  bool planner_available = false;  // tessera-cli has `plan`
  QJsonObject plan;                // the plan for this spec; empty while there is none
  bool planning = false;           // a plan for this spec is being made
  QString plan_error;              // why planning this spec failed
};

// The job in words (model, data, method, length, batch, learning rate, precision, strategy,
// time and memory from the plan, the run folder), the run's name, the folder it goes in
// (checked by creating and writing it), and the job spec one click away.
class ReviewPage : public QWidget {
  Q_OBJECT
 public:
  ReviewPage(CliProbe* probe, QWidget* parent = nullptr);
  // Shows `spec` (or what is missing when `missing` is not empty).
  void show_spec(const job::JobSpec& spec, const QStringList& missing,
                 const ReviewFacts& facts = {});
  QString spec_text() const;
  // The summary's lines, "Label: value" each; one value by its label ("Model", "Time", …).
  QString summary_text() const;
  QString summary_value(const QString& label) const;
  QLineEdit* name_edit() const { return name_; }
  // The name the user typed, or "" when the run keeps its default name.
  QString custom_name() const { return custom_name_; }
  void reset_name();  // a new run: its default name again
  // Where the run's folder is made: the runs folder from Settings unless another was chosen.
  QString runs_folder() const;
  void choose_runs_folder(const QString& folder);
  QPushButton* folder_button() const { return choose_folder_; }
  QLabel* folder_problem_label() const { return folder_problem_; }
  QString readiness_text() const;
  // Whether the run folder was checked (creating and writing it, on a worker thread) and the
  // reason it cannot be used ("" when it can).
  bool folder_checked() const;
  QString folder_problem() const { return folder_problem_text_; }
  void check_folder();  // again, now (the disk may have changed since)
  QPushButton* launch_button() const { return launch_; }
  QLabel* output_label() const { return output_; }
  QTabWidget* tabs() const { return tabs_; }
  // Writes the spec atomically; returns "" or the error message.
  QString save_spec(const QString& path) const;
  void update_launch();

 Q_SIGNALS:
  void launchRequested(const tessera::job::JobSpec& spec);
  void nameChanged();    // the user edited the run's name
  void folderChanged();  // the user chose another folder for runs

 protected:
  void showEvent(QShowEvent* event) override;

 private:
  void show_summary(const ReviewFacts& facts);
  CliProbe* probe_;
  job::JobSpec spec_;
  QStringList missing_;
  QLabel* readiness_;
  QLineEdit* name_;
  QString custom_name_;
  QString chosen_folder_;
  QTabWidget* tabs_;
  QFormLayout* summary_;
  QList<QPair<QString, QLabel*>> summary_rows_;
  QLabel* output_;
  QPushButton* choose_folder_;
  QLabel* folder_problem_;
  WriteChecker* folder_checker_;  // writes in the run folder, off the GUI thread
  QString folder_problem_text_;
  QString ready_text_;  // "✔ Ready: …" for the spec shown, once nothing else stops the launch
  bool planning_ = false;  // the plan for this spec is not in yet: Launch waits for it
  QPlainTextEdit* json_;
  QPushButton* save_;
  QPushButton* launch_;
};

// ---- the wizard ---------------------------------------------------------------------------
class FineTuneWizard : public QWidget {
  Q_OBJECT
 public:
  enum Step { ModelStep, DatasetStep, MethodStep, HardwareStep, ReviewStep };
  FineTuneWizard(CliProbe* probe, QWidget* parent = nullptr);
  HardwarePage* hardware_page() const { return hardware_; }
  // The Hardware & strategy step is offered when tessera-cli has `profile` and `plan`.
  bool hardware_step_available() const;
  ModelPage* model_page() const { return model_; }
  DatasetPage* dataset_page() const { return dataset_; }
  MethodPage* method_page() const { return method_; }
  ReviewPage* review_page() const { return review_; }
  int current_page() const;
  void go_to(int page);
  // The job spec for the current choices; `run_id` names the run and its output folder.
  job::JobSpec build_spec() const;
  // The run's name until the user types one on Review: "tiny-llama · LoRA · 25 Nov 14:03"
  // (the model, the method, the time the run id was made); the run id before a model is chosen.
  QString default_run_name() const;
  QStringList missing() const;  // what stops a launch: every step's problem, in step order
  QStringList missing_before(int step) const;  // the problems of the steps before `step`
  // What keeps `step` from being complete ("Choose a model to go on", …; "" when it is): Next
  // is off with this reason beside it, and no later step can be chosen in the steps list.
  QString step_problem(int step) const;
  bool step_reachable(int step) const;  // every step before it is complete
  QPushButton* next_button() const { return next_; }
  QLabel* reason_label() const { return reason_; }
  QListWidget* steps_list() const { return steps_; }
  const QString& run_id() const { return run_id_; }
  void new_run_id();
  // Fills every page from `spec` (a past run's) for a new run: new id and output folder.
  void load_spec(const job::JobSpec& spec);

 Q_SIGNALS:
  void launchRequested(const tessera::job::JobSpec& spec);

 private:
  void update_buttons();
  void update_navigation();  // Next, its reason and the steps that can be chosen
  int neighbour(int page, int direction) const;  // the next step shown, skipping hidden ones
  CliProbe* probe_;
  QListWidget* steps_;
  QStackedWidget* stack_;
  ModelPage* model_;
  DatasetPage* dataset_;
  MethodPage* method_;
  HardwarePage* hardware_;
  ReviewPage* review_;
  QPushButton* back_;
  QPushButton* next_;
  QLabel* reason_;
  QString run_id_;
};

QString make_run_id();  // "20261122-143001-3f9a": sortable and unique

}  // namespace tessera::ui
