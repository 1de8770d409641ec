#pragma once
// Wizard page 4, Hardware & strategy: what `tessera-cli profile --json` found on this machine
// (asked once per process, then cached), and what `tessera-cli plan JOB.json --json` chooses
// for the wizard's current job: the strategy and why in one sentence, a stacked bar of the
// estimated memory per tier and category against capacity, the time per step and in total.
// Batch size, activation checkpointing and precision can be overridden; the page warns when
// the plan says the override does not fit. For full fine-tuning on the CPU two sliders put a share
// of the optimizer state (strategy gemini, options.offload_optim_frac) and of the parameters
// (options.offload_param_frac) on disk: the job is planned again with them. Each tier (device,
// host, disk) gets one bar, scaled to that tier's capacity (the disk's: its free space). Both
// commands run in child processes, one plan at a time. "Processes" makes the job one of several
// processes, on this machine and on paired LAN nodes.
#include <QJsonArray>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QTimer>
#include <QWidget>
#include <optional>

#include "job/job_spec.h"

class QBarCategoryAxis;
class QBarSet;
class QCheckBox;
class QChartView;
class QComboBox;
class QHorizontalStackedBarSeries;
class QLabel;
class QListWidget;
class QPushButton;
class QSlider;
class QSpinBox;
class QValueAxis;

namespace tessera::ui {

class LayoutsTable;

// The plan's time (its "time" object) as the Hardware page and Review say it: "120 ms per
// step, 4 min 0 s in total for 2000 steps", and the disk's share when the job uses the disk.
QString plan_time_text(const QJsonObject& time);
// What `plan` had to change of what `asked` chose to fit: "micro-batch 4 with 2 accumulation
// steps", "activation checkpointing", "bf16 instead of fp32", … (empty: nothing).
QStringList plan_changes(const QJsonObject& plan, const job::JobSpec& asked);

class HardwarePage : public QWidget {
  Q_OBJECT
 public:
  explicit HardwarePage(QWidget* parent = nullptr);
  ~HardwarePage() override;

  void set_cli(const QString& cli);
  // Plans `spec` (debounced: the last spec of a burst of changes is planned).
  void plan(const job::JobSpec& spec);
  void set_unavailable(const QString& why);  // this tessera-cli has no profile/plan
  void set_waiting(const QString& why);      // the job is not complete yet: nothing to plan

  bool busy() const;  // profiling or planning
  // A plan is asked for and not in yet (the machine's profile, which the page also shows, plays
  // no part: a plan that is in must not wait for it).
  bool planning() const;
  bool has_plan() const { return !plan_.isEmpty(); }
  bool fits() const { return fits_; }
  // Whether the plan shown was made for `spec` (not for earlier settings); the run's name
  // plays no part in a plan.
  bool plan_is_for(const job::JobSpec& spec) const {
    if (!have_spec_ || !has_plan()) return false;
    job::JobSpec unnamed = spec;
    unnamed.name = planned_spec_.name;
    return job::to_json(planned_spec_) == job::to_json(unnamed);
  }
  // Whether `spec` (its name aside) is the latest spec asked for: planned, being planned, or
  // failed to plan (plan_error() says why).
  bool asked_for(const job::JobSpec& spec) const {
    if (!have_spec_) return false;
    job::JobSpec unnamed = spec;
    unnamed.name = spec_.name;
    return job::to_json(spec_) == job::to_json(unnamed);
  }
  const QString& plan_error() const { return plan_error_; }  // why the latest plan failed
  const QJsonObject& plan_json() const { return plan_; }
  const QJsonObject& profile_json() const { return profile_; }
  QString explanation() const;

  // The strategy the wizard writes into the job spec for `method` ("full" | "lora"): gemini
  // with the sliders' shares of the optimizer state and of the parameters on disk when the user
  // moved either (full fine-tuning only), else the loaded spec's strategy (auto unless a cloned
  // job named one).
  job::StrategySpec strategy_spec(const std::string& method) const;
  // A cloned job's strategy: gemini's offload_optim_frac and offload_param_frac set the sliders
  // as an override.
  void load_strategy(const job::StrategySpec& strategy);
  // The sliders' overrides in percent (0, 25, 50, 75, 100), or -1: the planner chooses. Moving
  // either slider fixes both (the other where it stands); the reset button frees both.
  int offload_override() const { return offload_override_; }
  int param_offload_override() const { return param_override_; }
  void clear_offload_override();  // back to the planner's choice

  // Processes: this machine's ("Processes on this machine", 1 to its logical cores) and one on
  // each paired node checked in the list (`tessera-cli nodes list --json`). Above one in all,
  // the spec gets "nodes" (docs/job-spec.md; launched with `tessera-cli launch`), the strategy
  // list offers the strategies that distribute as `plan` lists them (ddp, zero when registered)
  // and the disk sliders are hidden.
  int local_processes() const;
  QStringList chosen_nodes() const;
  int total_processes() const { return local_processes() + int(chosen_nodes().size()); }
  std::optional<job::NodesSpec> nodes_spec() const;
  void load_nodes(const std::optional<job::NodesSpec>& nodes);  // a cloned job's
  void refresh_nodes();                                         // `nodes list --json` again
  QSpinBox* processes() const { return processes_; }
  QListWidget* nodes_list() const { return nodes_list_; }
  QComboBox* distributed_strategy() const { return distributed_; }
  // Several processes: every layout the plan weighed, sortable; picking one chooses it above.
  LayoutsTable* layouts_table() const { return layouts_; }
  QLabel* processes_note() const { return processes_note_; }

  // What the bars show, per tier in the bars' order (bottom to top: the plan's last tier
  // first, so its first is drawn on top): the tier ("device", "host",
  // "disk"), its capacity in bytes and the bytes of each bar set (the categories, free,
  // headroom). The bars themselves are percentages of the capacity.
  QStringList shown_tiers() const { return shown_tiers_; }
  double shown_capacity(int tier) const { return shown_capacity_.value(tier); }
  double shown_bytes(int tier, int set) const { return shown_bytes_.value(tier).value(set); }

  QLabel* machine_label() const { return machine_; }
  QLabel* strategy_label() const { return strategy_; }
  QLabel* time_label() const { return time_; }
  QLabel* warning_label() const { return warning_; }
  QLabel* alternatives_label() const { return alternatives_; }
  QLabel* disk_label() const { return disk_; }
  QSlider* offload_slider() const { return offload_; }
  QSlider* param_offload_slider() const { return param_offload_; }
  QLabel* offload_note() const { return offload_note_; }
  QPushButton* offload_reset() const { return offload_reset_; }
  QHorizontalStackedBarSeries* memory_series() const { return series_; }
  QChartView* memory_chart_view() const { return chart_view_; }
  QLabel* memory_legend() const { return memory_legend_; }
  QSpinBox* batch_size() const { return batch_; }
  QCheckBox* checkpointing() const { return checkpointing_; }
  QComboBox* precision() const { return precision_; }

 Q_SIGNALS:
  // The user changed an override: the wizard writes it into the method's settings.
  void overridesChanged(int batch_size, bool activation_checkpointing, const QString& precision);
  // The user moved the optimizer-state or the parameters slider, or reset them: the wizard plans
  // its spec again.
  void strategyChanged();
  void planned();   // a plan (or its failure) is shown
  void profiled();  // the machine is shown

 private:
  void start_profile();
  void start_plan();
  void show_profile();
  void show_plan(const QJsonObject& plan);
  void show_plan_error(const QString& message);
  void show_memory(const QJsonArray& memory);
  void update_offload();  // the sliders' visibility, positions and note
  // A slider moved by the user: both overrides fixed, the moved one at `notch`.
  void offload_moved(bool parameters, int notch);
  // Several processes' strategy as chosen in the list: "auto", "ddp", "zero", "gemini", "hybrid".
  QString distributed_choice() const;
  // Whether gemini computes on a device here (a GPU, or the tests' simulated one): the sliders
  // then keep shares in host RAM (host_*_frac), else on disk (offload_*_frac).
  bool gemini_on_device() const;
  struct SliderOptions {
    std::string optimizer;   // the optimizer-state slider's option
    std::string parameters;  // the parameters slider's
  };
  static SliderOptions slider_options(bool on_device);
  void set_offload_options(job::StrategySpec& s) const;
  void update_processes();  // the range, the strategy list and the note
  // Chooses `key` in the Strategy list (added with `label` if missing), without re-planning.
  void select_distributed(const QString& key, const QString& label);
  void learn_strategies(const QJsonObject& plan);

  QString cli_;
  QLabel* machine_;
  QLabel* strategy_;
  QLabel* reasons_;
  QLabel* time_;
  QLabel* warning_;
  QLabel* alternatives_;
  QLabel* disk_;
  QChartView* chart_view_;
  QLabel* memory_legend_;  // each tier's parts with their bytes, in the bars' colours
  QHorizontalStackedBarSeries* series_;
  QList<QBarSet*> sets_;  // the categories, then free and headroom (kept: a stable legend)
  QBarCategoryAxis* tiers_axis_;
  QValueAxis* bytes_axis_;
  QSpinBox* batch_;
  QCheckBox* checkpointing_;
  QComboBox* precision_;
  QWidget* offload_row_;
  QLabel* offload_label_;
  QLabel* param_label_;
  QSlider* offload_;
  QLabel* offload_value_;
  QWidget* param_row_;
  QSlider* param_offload_;
  QLabel* param_offload_value_;
  QLabel* offload_note_;
  QPushButton* offload_reset_;
  int offload_override_ = -1;          // percent, or -1: the planner's choice
  int param_override_ = -1;            // percent, or -1 (set and cleared with offload_override_)
  job::StrategySpec loaded_strategy_;  // a cloned job's (non-gemini) strategy
  QStringList shown_tiers_;
  QList<double> shown_capacity_;
  QList<QList<double>> shown_bytes_;
  QSpinBox* processes_;
  QListWidget* nodes_list_;
  QLabel* processes_note_;
  QComboBox* distributed_;
  LayoutsTable* layouts_;
  QStringList loaded_nodes_;  // a cloned job's nodes, checked once the list has them
  std::optional<job::NodesSpec> loaded_nodes_spec_;  // its master address, port, ranks per node
  QProcess* nodes_process_ = nullptr;
  QProcess* profile_process_ = nullptr;
  QProcess* plan_process_ = nullptr;
  QTimer debounce_;
  QTemporaryDir tmp_;
  job::JobSpec spec_;           // the latest spec asked for
  job::JobSpec planning_spec_;  // the spec of the running plan child
  job::JobSpec planned_spec_;   // the spec of the plan shown
  bool have_spec_ = false;
  bool replan_ = false;  // a newer spec arrived while planning
  bool loading_overrides_ = false;
  QJsonObject profile_, plan_;
  QString plan_error_;
  bool fits_ = false;
};

}  // namespace tessera::ui
