#pragma once
// Wizard page 4, Hardware & strategy: what `tessera-cli profile --json` found on this machine
// (asked once per process, then cached), and what `tessera-cli plan JOB.json --json` chooses
// for the wizard's current job: the strategy and why in one sentence, a stacked bar of the
// estimated memory per tier and category against capacity, the time per step and in total.
// Batch size, activation checkpointing and precision can be overridden; the page warns when
// the plan says the override does not fit. Both commands run in child processes.
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QTimer>
#include <QWidget>

#include "job/job_spec.h"

class QBarCategoryAxis;
class QBarSet;
class QCheckBox;
class QChartView;
class QComboBox;
class QHorizontalStackedBarSeries;
class QLabel;
class QSpinBox;
class QValueAxis;

namespace tessera::ui {

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

  bool busy() const;
  bool has_plan() const { return !plan_.isEmpty(); }
  bool fits() const { return fits_; }
  // Whether the plan shown was made for `spec` (not for earlier settings).
  bool plan_is_for(const job::JobSpec& spec) const {
    return have_spec_ && has_plan() && job::to_json(spec_) == job::to_json(spec);
  }
  const QJsonObject& plan_json() const { return plan_; }
  const QJsonObject& profile_json() const { return profile_; }
  QString explanation() const;

  QLabel* machine_label() const { return machine_; }
  QLabel* strategy_label() const { return strategy_; }
  QLabel* time_label() const { return time_; }
  QLabel* warning_label() const { return warning_; }
  QHorizontalStackedBarSeries* memory_series() const { return series_; }
  QSpinBox* batch_size() const { return batch_; }
  QCheckBox* checkpointing() const { return checkpointing_; }
  QComboBox* precision() const { return precision_; }

 Q_SIGNALS:
  // The user changed an override: the wizard writes it into the method's settings.
  void overridesChanged(int batch_size, bool activation_checkpointing, const QString& precision);
  void planned();   // a plan (or its failure) is shown
  void profiled();  // the machine is shown

 private:
  void start_profile();
  void start_plan();
  void show_profile();
  void show_plan(const QJsonObject& plan);
  void show_plan_error(const QString& message);

  QString cli_;
  QLabel* machine_;
  QLabel* strategy_;
  QLabel* reasons_;
  QLabel* time_;
  QLabel* warning_;
  QChartView* chart_view_;
  QHorizontalStackedBarSeries* series_;
  QList<QBarSet*> sets_;  // the categories, then free and headroom (kept: a stable legend)
  QBarCategoryAxis* tiers_axis_;
  QValueAxis* bytes_axis_;
  QSpinBox* batch_;
  QCheckBox* checkpointing_;
  QComboBox* precision_;
  QProcess* profile_process_ = nullptr;
  QProcess* plan_process_ = nullptr;
  QTimer debounce_;
  QTemporaryDir tmp_;
  job::JobSpec spec_;
  bool have_spec_ = false;
  bool replan_ = false;  // a newer spec arrived while planning
  bool loading_overrides_ = false;
  QJsonObject profile_, plan_;
  bool fits_ = false;
};

}  // namespace tessera::ui
