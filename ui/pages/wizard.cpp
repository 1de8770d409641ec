#include "ui/pages/wizard.h"

#include <QDateTime>
#include <QDir>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QListWidget>
#include <QLocale>
#include <QPushButton>
#include <QRandomGenerator>
#include <QScrollArea>
#include <QSignalBlocker>
#include <QStackedWidget>
#include <QVBoxLayout>

#include "ui/pages/hardware_page.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/studio_settings.h"

namespace tessera::ui {

QString make_run_id() {
  return QDateTime::currentDateTime().toString("yyyyMMdd-hhmmss") + "-" +
         QString::number(QRandomGenerator::global()->bounded(0x10000), 16).rightJustified(4, '0');
}

FineTuneWizard::FineTuneWizard(CliProbe* probe, QWidget* parent) : QWidget(parent), probe_(probe) {
  auto* layout = new QHBoxLayout(this);
  steps_ = new QListWidget;
  steps_->setAccessibleName(tr("Wizard steps"));
  for (const QString& s : {tr("1. Model"), tr("2. Dataset"), tr("3. Method"),
                           tr("4. Hardware & strategy"), tr("5. Review")})
    steps_->addItem(s);
  steps_->setMaximumWidth(steps_->sizeHintForColumn(0) + 4 * fontMetrics().averageCharWidth());
  steps_->setFrameShape(QFrame::NoFrame);
  steps_->setSizeAdjustPolicy(QAbstractScrollArea::AdjustToContents);
  layout->addWidget(steps_);

  auto* right = new QVBoxLayout;
  stack_ = new QStackedWidget;
  model_ = new ModelPage;
  dataset_ = new DatasetPage;
  method_ = new MethodPage;
  hardware_ = new HardwarePage;
  review_ = new ReviewPage(probe);
  // Each step scrolls on its own, so a step taller than the window (Hardware & strategy with
  // its processes and nodes) never pushes Back and Next out of sight below the window.
  for (QWidget* page : {static_cast<QWidget*>(model_), static_cast<QWidget*>(dataset_),
                        static_cast<QWidget*>(method_), static_cast<QWidget*>(hardware_),
                        static_cast<QWidget*>(review_)}) {
    auto* scroll = new QScrollArea;
    scroll->setWidget(page);
    scroll->setWidgetResizable(true);
    scroll->setFrameShape(QFrame::NoFrame);
    stack_->addWidget(scroll);
  }
  right->addWidget(stack_, 1);
  auto* buttons = new QHBoxLayout;
  back_ = new QPushButton(tr("< &Back"));
  next_ = new QPushButton(tr("&Next >"));
  reason_ = new QLabel;  // why Next is off, by the button
  reason_->setWordWrap(true);
  reason_->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
  reason_->setAccessibleName(tr("What this step still needs"));
  buttons->addWidget(reason_, 1);
  buttons->addWidget(back_);
  buttons->addWidget(next_);
  right->addLayout(buttons);
  layout->addLayout(right, 1);

  connect(steps_, &QListWidget::currentRowChanged, this, [this](int row) {
    if (row < 0) return;
    // A step after an incomplete one stays out of reach (its item is disabled; keys too).
    if (!step_reachable(row) && row > current_page()) {
      QSignalBlocker block(steps_);
      steps_->setCurrentRow(current_page());
      return;
    }
    go_to(row);
  });
  connect(back_, &QPushButton::clicked, this, [this] { go_to(neighbour(current_page(), -1)); });
  connect(next_, &QPushButton::clicked, this, [this] { go_to(neighbour(current_page(), +1)); });
  connect(hardware_, &HardwarePage::overridesChanged, this,
          [this](int batch, bool checkpointing, const QString& precision) {
            method_->set_overrides(batch, checkpointing, precision);
          });
  // The optimizer-state slider changes the spec's strategy: plan it again.
  connect(hardware_, &HardwarePage::strategyChanged, this, &FineTuneWizard::update_buttons);
  // Hidden until tessera-cli says it has `profile` and `plan`.
  steps_->item(HardwareStep)->setHidden(true);
  if (probe_) {
    connect(probe_, &CliProbe::probed, this, [this] {
      const bool available = hardware_step_available();
      steps_->item(HardwareStep)->setHidden(!available);
      if (available)
        hardware_->set_cli(probe_->program());
      else
        hardware_->set_unavailable(tr("This tessera-cli (%1) has no `profile` and `plan` commands.")
                                       .arg(probe_->program()));
      update_buttons();
    });
  }
  connect(model_, &ModelPage::modelChanged, this, [this] {
    dataset_->set_model_folder(model_->ready() ? model_->summary().folder : QString());
    update_buttons();
  });
  connect(dataset_, &DatasetPage::datasetChanged, this, &FineTuneWizard::update_buttons);
  // The run's validation split is drawn with training.seed: the Dataset page counts its shares.
  connect(method_, &MethodPage::methodChanged, this,
          [this] { dataset_->set_split_seed(method_->training_spec().seed); });
  dataset_->set_split_seed(method_->training_spec().seed);
  connect(method_, &MethodPage::methodChanged, this, &FineTuneWizard::update_buttons);
  // Review shows the plan once it is in; a new name or folder changes the spec.
  connect(hardware_, &HardwarePage::planned, this, [this] {
    if (current_page() == ReviewStep) update_buttons();
    update_navigation();  // whether the job fits decides Next on step 4
  });
  connect(review_, &ReviewPage::nameChanged, this, &FineTuneWizard::update_buttons);
  connect(review_, &ReviewPage::folderChanged, this, &FineTuneWizard::update_buttons);
  connect(review_, &ReviewPage::launchRequested, this, [this](const job::JobSpec& spec) {
    Q_EMIT launchRequested(spec);
    new_run_id();  // a relaunch is a new run with its own folder, never a reuse
  });
  new_run_id();
  go_to(0);
}

void FineTuneWizard::new_run_id() {
  run_id_ = make_run_id();
  review_->reset_name();  // a new run is named after its own choices
  update_buttons();
}

bool FineTuneWizard::hardware_step_available() const {
  return probe_ && probe_->ok() && probe_->supports("profile") && probe_->supports("plan");
}

int FineTuneWizard::neighbour(int page, int direction) const {
  int next = page + direction;
  while (next > 0 && next < stack_->count() - 1 && steps_->item(next)->isHidden())
    next += direction;
  return std::clamp(next, 0, stack_->count() - 1);
}

int FineTuneWizard::current_page() const {
  return stack_->currentIndex();
}

void FineTuneWizard::go_to(int page) {
  page = std::clamp(page, 0, stack_->count() - 1);
  stack_->setCurrentIndex(page);
  if (steps_->currentRow() != page) steps_->setCurrentRow(page);
  update_buttons();
}

QString FineTuneWizard::step_problem(int step) const {
  switch (step) {
    case ModelStep:
      if (model_->busy()) return tr("Wait for the model check");
      if (model_->summary().folder.isEmpty()) return tr("Choose a model to go on");
      if (!model_->ready())
        return tr("Choose a model the engine can train (see its problem above)");
      return {};
    case DatasetStep:
      return dataset_->problem();
    case MethodStep: {
      // The objective and the data must go together: pairs for DPO and its kin, unpaired
      // examples for KTO, anything else for supervised fine-tuning (the run refuses a mismatch).
      const QString format = dataset_->analysis().format;
      if (format.isEmpty()) return {};
      const QString wanted = MethodPage::data_format_for(method_->objective());
      const bool preference_data = format == "preference" || format == "unpaired";
      if (wanted.isEmpty() && preference_data)
        return format == "preference"
                   ? tr("The dataset holds preference pairs: choose DPO, IPO, SimPO or ORPO as "
                        "the objective")
                   : tr("The dataset holds desirable and undesirable examples: choose KTO as "
                        "the objective");
      if (!wanted.isEmpty() && format != wanted)
        return wanted == "preference"
                   ? tr("%1 trains on preference pairs (prompt, chosen, rejected); the dataset's "
                        "format is %2")
                         .arg(method_->objective().toUpper(), format)
                   : tr("KTO trains on examples marked desirable or not (prompt, completion, "
                        "label); the dataset's format is %1")
                         .arg(format);
      return {};
    }
    case HardwareStep:
      // A job the planner says cannot fit would fail at its start (the page says by how much
      // and what would fit); judged once the steps before it are complete.
      if (hardware_step_available() && step_problem(ModelStep).isEmpty() &&
          step_problem(DatasetStep).isEmpty() && !hardware_->planning() && !hardware_->fits() &&
          hardware_->plan_is_for(build_spec()))
        return tr("Make the job fit in memory (see step 4, Hardware and strategy)");
      return {};
    default:
      return {};
  }
}

bool FineTuneWizard::step_reachable(int step) const {
  for (int before = 0; before < step; ++before)
    if (!steps_->item(before)->isHidden() && !step_problem(before).isEmpty()) return false;
  return true;
}

QStringList FineTuneWizard::missing() const {
  return missing_before(ReviewStep);
}

QStringList FineTuneWizard::missing_before(int end_step) const {
  QStringList m;
  for (int step = ModelStep; step < end_step; ++step)
    if (const QString problem = step_problem(step); !problem.isEmpty()) m << problem;
  return m;
}

QString FineTuneWizard::default_run_name() const {
  if (model_->summary().folder.isEmpty()) return run_id_;
  // The run id starts with the time it was made: the name keeps that time, not the clock's.
  const QDateTime made = QDateTime::fromString(run_id_.left(15), "yyyyMMdd-hhmmss");
  return QString("%1 · %2 · %3")
      .arg(model_display_name(model_->summary().folder).section('/', -1),
           method_->method() == "lora" ? QString("LoRA") : tr("full"),
           QLocale().toString(made, "d MMM hh:mm"));
}

job::JobSpec FineTuneWizard::build_spec() const {
  job::JobSpec spec;
  // A label only: the run's folder (and id) is run_id_, whatever the name says.
  spec.name = (review_->custom_name().isEmpty() ? default_run_name() : review_->custom_name())
                  .toStdString();
  if (!model_->summary().folder.isEmpty()) spec.model.path = model_->summary().folder.toStdString();
  spec.dataset = dataset_->dataset_spec();
  spec.method = method_->method_spec();
  spec.training = method_->training_spec();
  spec.precision = method_->precision().toStdString();
  spec.strategy = hardware_->strategy_spec(spec.method.type);
  spec.nodes = hardware_->nodes_spec();  // several processes: launched with `tessera-cli launch`
  spec.output.dir = QDir(review_->runs_folder()).filePath(run_id_).toStdString();
  return spec;
}

void FineTuneWizard::load_spec(const job::JobSpec& spec) {
  new_run_id();
  if (!spec.model.path.empty()) model_->choose_folder(QString::fromStdString(spec.model.path));
  dataset_->load_spec(spec.dataset);
  method_->load_spec(spec.method, spec.training, QString::fromStdString(spec.precision));
  hardware_->load_nodes(spec.nodes);
  hardware_->load_strategy(spec.strategy);
  go_to(ReviewStep);
}

void FineTuneWizard::update_navigation() {
  const int page = current_page();
  const QString problem = page < ReviewStep ? step_problem(page) : QString();
  next_->setEnabled(page < stack_->count() - 1 && problem.isEmpty());
  reason_->setText(problem);
  for (int step = 0; step < steps_->count(); ++step) {
    QListWidgetItem* item = steps_->item(step);
    const bool reachable = step <= page || step_reachable(step);
    item->setFlags(reachable ? item->flags() | Qt::ItemIsEnabled | Qt::ItemIsSelectable
                             : item->flags() & ~(Qt::ItemIsEnabled | Qt::ItemIsSelectable));
    item->setToolTip(reachable ? QString() : tr("Complete the steps before this one first"));
  }
}

void FineTuneWizard::update_buttons() {
  const int page = current_page();
  back_->setEnabled(page > 0);
  update_navigation();
  if (page == ReviewStep) {
    const job::JobSpec spec = build_spec();
    const QStringList m = missing();
    ReviewFacts facts;
    facts.model_name = model_display_name(model_->summary().folder);
    facts.parameters = model_->ready() ? model_->summary().parameters : 0;
    facts.dataset_rows = dataset_->ready() ? dataset_->analysis().num_rows : 0;
    facts.skipped_rows = dataset_->ready() ? dataset_->rows_to_skip() : 0;
    if (facts.skipped_rows > 0) facts.skipped_where = dataset_->skipped_rows_text();
    facts.planner_available = hardware_step_available();
    if (facts.planner_available && m.isEmpty()) {
      // Review states the plan's strategy, time and memory: plan this spec when the plan is
      // for other settings (another run folder, or the Hardware step not visited).
      // Only the plan counts, not the page's profile of the machine: a plan that came in while
      // the profile still ran left Review at "planning…" (the profile's end updates nothing).
      if (!hardware_->asked_for(spec)) hardware_->plan(spec);
      if (hardware_->plan_is_for(spec) && !hardware_->planning())
        facts.plan = hardware_->plan_json();
      else if (hardware_->planning())
        facts.planning = true;
      else
        facts.plan_error = hardware_->plan_error();
    }
    review_->show_spec(spec, m, facts);
  }
  if (page == MethodStep)
    method_->show_memory(model_->ready() ? model_->summary().folder : QString(), build_spec());
  if (page == HardwareStep && hardware_step_available()) {
    // What the steps before this one lack: its own problem (a plan that does not fit) is what
    // it shows, not a reason to stop planning ("Make the job fit in memory (see step 4)").
    const QStringList m = missing_before(HardwareStep);
    if (m.isEmpty())
      hardware_->plan(build_spec());  // debounced: a burst of edits plans once
    else
      hardware_->set_waiting(tr("To plan the job: %1.").arg(m.join(", ")));
  }
}

}  // namespace tessera::ui
