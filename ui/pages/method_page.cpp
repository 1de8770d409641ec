#include <QButtonGroup>
#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QDoubleValidator>
#include <QFormLayout>
#include <QFrame>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QRadioButton>
#include <QScrollArea>
#include <QSpinBox>
#include <QStyle>
#include <QToolButton>
#include <QVBoxLayout>
#include <limits>

#include "core/files.h"
#include "hf/model_folder.h"
#include "plan/planner.h"
#include "ui/pages/wizard.h"

namespace tessera::ui {

namespace {

QLineEdit* number_edit(QWidget* parent) {
  auto* edit = new QLineEdit(parent);
  auto* validator = new QDoubleValidator(edit);
  validator->setNotation(QDoubleValidator::ScientificNotation);
  validator->setLocale(QLocale::c());
  edit->setValidator(validator);
  return edit;
}

double value_of(const QLineEdit* edit, double fallback) {
  bool ok = false;
  double v = QLocale::c().toDouble(edit->text().trimmed(), &ok);
  return ok ? v : fallback;
}

QString text_of(double v) {
  return QLocale::c().toString(v, 'g', 6);
}

QSpinBox* int_spin(int lo, int hi) {
  auto* spin = new QSpinBox;
  spin->setRange(lo, hi);
  return spin;
}

// A card: a radio button with a title and a description below it.
QFrame* method_card(QRadioButton* button, const QString& description) {
  auto* card = new QFrame;
  card->setFrameShape(QFrame::StyledPanel);
  auto* layout = new QVBoxLayout(card);
  QFont f = button->font();
  f.setBold(true);
  button->setFont(f);
  layout->addWidget(button);
  auto* text = new QLabel(description);
  text->setWordWrap(true);
  text->setIndent(button->style()->pixelMetric(QStyle::PM_ExclusiveIndicatorWidth) + 6);
  layout->addWidget(text);
  return card;
}

}  // namespace

MethodPage::MethodPage(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(0, 0, 0, 0);
  auto* scroll = new QScrollArea;
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  auto* content = new QWidget;
  auto* layout = new QVBoxLayout(content);
  scroll->setWidget(content);
  outer->addWidget(scroll);

  auto* cards = new QHBoxLayout;
  full_ = new QRadioButton(tr("Fu&ll fine-tuning"));
  lora_ = new QRadioButton(tr("Lo&RA"));
  qlora_ = new QRadioButton(tr("&QLoRA"));
  auto* group = new QButtonGroup(this);
  group->addButton(full_);
  group->addButton(lora_);
  group->addButton(qlora_);
  cards->addWidget(method_card(full_, tr("Trains every weight of the model. The best quality "
                                         "for a given dataset; needs memory for gradients "
                                         "and optimizer state of all parameters.")));
  cards->addWidget(method_card(lora_, tr("Trains small low-rank adapters next to frozen "
                                         "weights. Much less memory and a small adapter "
                                         "file; usually close to full fine-tuning.")));
  cards->addWidget(method_card(
      qlora_, tr("LoRA on a base held in 4 bits (NF4: 4.5 bits a weight with its block scales, "
                 "4.1 with them quantized too, against 16 or 32: about an eighth of float32) "
                 "or in 8 bits (a quarter). Trains with strategy single, gemini, ddp or zero, on "
                 "the CPU or a GPU.")));
  layout->addLayout(cards);
  for (auto [name, button] : {std::pair{"full", full_}, {"lora", lora_}, {"qlora", qlora_}}) {
    auto* label = new QLabel;
    label->setWordWrap(true);
    label->setObjectName(QString("memory-%1").arg(name));
    label->setIndent(button->style()->pixelMetric(QStyle::PM_ExclusiveIndicatorWidth) + 6);
    label->setVisible(false);
    button->parentWidget()->layout()->addWidget(label);
    memory_.insert(name, label);
  }

  // What the run optimizes: the dataset's responses (supervised), or a preference between
  // completions. Each choice says what it does and the data it needs.
  auto* objective_box = new QGroupBox(tr("Objective"));
  objective_form_ = new QFormLayout(objective_box);
  objective_ = new QComboBox;
  objective_->addItem(tr("Supervised fine-tuning"), "sft");
  objective_->addItem(tr("DPO — direct preference optimization"), "dpo");
  objective_->addItem(tr("IPO — identity preference optimization"), "ipo");
  objective_->addItem(tr("SimPO — simple preference optimization"), "simpo");
  objective_->addItem(tr("ORPO — odds-ratio preference optimization"), "orpo");
  objective_->addItem(tr("KTO — from desirable and undesirable examples"), "kto");
  objective_form_->addRow(tr("Ob&jective:"), objective_);
  objective_text_ = new QLabel;
  objective_text_->setWordWrap(true);
  objective_form_->addRow(objective_text_);
  const auto preference_field = [&](const QString& label, const QString& tip) {
    QLineEdit* edit = number_edit(this);
    edit->setToolTip(tip);
    objective_form_->addRow(label, edit);
    connect(edit, &QLineEdit::textChanged, this, &MethodPage::update_changed);
    return edit;
  };
  beta_ = preference_field(tr("Beta (β):"),
                           tr("How far the model may move from its reference: larger keeps it "
                              "closer (0.1 is usual; SimPO uses about 2)"));
  label_smoothing_ = preference_field(
      tr("Label smoothing:"), tr("The share of pairs assumed to be labelled the wrong way round "
                                 "(0: trust every pair; below 0.5)"));
  simpo_gamma_ = preference_field(
      tr("Target margin (γ):"),
      tr("SimPO's margin between the chosen and the rejected completion's mean log-probability"));
  desirable_weight_ = preference_field(
      tr("Desirable weight:"), tr("KTO's weight of a desirable example's loss: raise it when "
                                  "desirable examples are fewer than undesirable ones"));
  undesirable_weight_ = preference_field(tr("Undesirable weight:"),
                                         tr("KTO's weight of an undesirable example's loss"));
  connect(objective_, &QComboBox::currentIndexChanged, this, [this] {
    show_objective();
    update_changed();
  });
  layout->addWidget(objective_box);

  auto* presets = new QHBoxLayout;
  presets->addWidget(new QLabel(tr("Preset:")));
  const QMap<QString, QString> preset_tips = {
      {"quick", tr("100 steps: a first look at whether the data and settings work")},
      {"balanced", tr("One epoch with a cosine schedule and warmup")},
      {"thorough", tr("Three epochs, periodic evaluation and checkpoints")}};
  for (const char* name : {"quick", "balanced", "thorough"}) {
    auto* button = new QPushButton(QString(name).replace(0, 1, QString(name).left(1).toUpper()));
    button->setCheckable(true);
    button->setAutoExclusive(true);
    button->setToolTip(preset_tips.value(name));
    presets->addWidget(button);
    preset_buttons_.insert(name, button);
    connect(button, &QPushButton::clicked, this, [this, name] { apply_preset(name); });
  }
  presets->addStretch(1);
  changed_ = new QLabel;
  presets->addWidget(changed_);
  layout->addLayout(presets);

  advanced_toggle_ = new QToolButton;
  advanced_toggle_->setText(tr("&Advanced settings"));
  advanced_toggle_->setCheckable(true);
  advanced_toggle_->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
  advanced_toggle_->setArrowType(Qt::RightArrow);
  layout->addWidget(advanced_toggle_);

  advanced_ = new QWidget;
  auto* columns = new QHBoxLayout(advanced_);
  columns->setContentsMargins(0, 0, 0, 0);
  auto* schedule_box = new QGroupBox(tr("Length and batch"));
  auto* f1 = new QFormLayout(schedule_box);
  auto* optim_box = new QGroupBox(tr("Optimizer"));
  auto* f2 = new QFormLayout(optim_box);
  auto* run_box = new QGroupBox(tr("Evaluation, checkpoints, precision"));
  auto* f3 = new QFormLayout(run_box);
  lora_box_ = new QGroupBox(tr("LoRA"));
  auto* f4 = new QFormLayout(lora_box_);
  auto* left = new QVBoxLayout;
  left->addWidget(schedule_box);
  left->addWidget(lora_box_);
  left->addStretch(1);
  auto* right = new QVBoxLayout;
  right->addWidget(optim_box);
  right->addWidget(run_box);
  right->addStretch(1);
  columns->addLayout(left);
  columns->addLayout(right);
  layout->addWidget(advanced_);
  layout->addStretch(1);

  auto add = [](QFormLayout* form, const QString& label, QWidget* w, const QString& tip) {
    w->setToolTip(tip);
    form->addRow(label, w);
    if (auto* l = form->labelForField(w)) l->setToolTip(tip);
  };
  length_mode_ = new QComboBox;
  length_mode_->addItem(tr("Epochs"), "epochs");
  length_mode_->addItem(tr("Steps"), "steps");
  add(f1, tr("Train for:"), length_mode_,
      tr("Whether the run length is counted in passes over the dataset or optimizer steps"));
  epochs_ = new QDoubleSpinBox;
  epochs_->setRange(0.01, 1000);
  epochs_->setDecimals(2);
  add(f1, tr("Epochs:"), epochs_, tr("Passes over the training set (fractions allowed)"));
  steps_ = int_spin(1, std::numeric_limits<int>::max());
  add(f1, tr("Steps:"), steps_, tr("Optimizer steps to train for"));
  batch_ = int_spin(1, 65536);
  add(f1, tr("Batch size:"), batch_,
      tr("Sequences per micro-batch (one forward and backward); a step trains batch size × "
         "gradient accumulation. More uses more activation memory; when a micro-batch does not "
         "fit, the plan splits it into smaller ones with more accumulation, keeping the "
         "sequences per step, and says so"));
  accumulation_ = int_spin(1, 65536);
  add(f1, tr("Gradient accumulation:"), accumulation_,
      tr("Micro-batches summed per optimizer step: effective batch = batch size × this"));
  checkpointing_ = new QCheckBox;
  add(f1, tr("Activation checkpointing:"), checkpointing_,
      tr("Recompute activations during the backward pass: less memory, about a third more "
         "compute"));

  lr_ = number_edit(this);
  add(f2, tr("Learning rate:"), lr_,
      tr("Peak step size of AdamW. Follows the method (LoRA 2e-4, full 2e-5) unless you "
         "change it"));
  schedule_ = new QComboBox;
  for (const char* s : {"constant", "linear", "cosine"}) schedule_->addItem(s, s);
  add(f2, tr("Schedule:"), schedule_,
      tr("How the learning rate moves after warmup: constant, linear decay to 0, or cosine "
         "decay to 0"));
  warmup_ = int_spin(0, std::numeric_limits<int>::max());
  add(f2, tr("Warmup steps:"), warmup_,
      tr("Steps over which the learning rate rises linearly from 0 to its peak"));
  weight_decay_ = number_edit(this);
  add(f2, tr("Weight decay:"), weight_decay_,
      tr("AdamW's decoupled weight decay: pulls weights towards 0 each step"));
  beta1_ = number_edit(this);
  add(f2, tr("Adam β1:"), beta1_, tr("Decay rate of AdamW's running mean of gradients"));
  beta2_ = number_edit(this);
  add(f2, tr("Adam β2:"), beta2_, tr("Decay rate of AdamW's running mean of squared gradients"));
  eps_ = number_edit(this);
  add(f2, tr("Adam ε:"), eps_, tr("Added to AdamW's denominator for numerical stability"));
  grad_norm_ = number_edit(this);
  add(f2, tr("Max gradient norm:"), grad_norm_,
      tr("Gradients are scaled down when their global norm exceeds this (0: no clipping)"));

  eval_every_ = int_spin(0, std::numeric_limits<int>::max());
  add(f3, tr("Evaluate every:"), eval_every_,
      tr("Steps between evaluations on the validation set (0: only at the end)"));
  save_every_ = int_spin(0, std::numeric_limits<int>::max());
  add(f3, tr("Checkpoint every:"), save_every_,
      tr("Steps between checkpoints (0: only at the end)"));
  keep_last_ = int_spin(1, 1000);
  add(f3, tr("Keep checkpoints:"), keep_last_,
      tr("How many of the most recent checkpoints are kept on disk"));
  log_every_ = int_spin(1, 1000000);
  add(f3, tr("Log every:"), log_every_, tr("Steps between metric reports (chart points)"));
  seed_ = int_spin(0, std::numeric_limits<int>::max());
  add(f3, tr("Seed:"), seed_,
      tr("Seeds shuffling, initialisation of new weights and dropout: same seed, same run"));
  precision_ = new QComboBox;
  precision_->addItem("fp32", "fp32");
  precision_->addItem("bf16", "bf16");
  add(f3, tr("Precision:"), precision_,
      tr("Number format of the computation: fp32 is exact; bf16 halves activation memory on "
         "hardware that supports it"));

  rank_ = int_spin(1, 4096);
  add(f4, tr("Rank:"), rank_, tr("Inner dimension of each adapter: larger trains more"));
  alpha_ = number_edit(this);
  add(f4, tr("Alpha:"), alpha_, tr("Adapter scale: the update is multiplied by alpha / rank"));
  dropout_ = number_edit(this);
  add(f4, tr("Dropout:"), dropout_, tr("Dropout on the adapter's input during training"));
  targets_ = new QLineEdit;
  targets_->setPlaceholderText(tr("the model family's default"));
  add(f4, tr("Target modules:"), targets_,
      tr("Comma-separated module names that get adapters, e.g. q_proj, v_proj (empty: the "
         "family's attention projections)"));
  quantize_ = new QComboBox;
  quantize_->addItem(tr("NF4 (4 bits, normal-float codes)"), "nf4");
  quantize_->addItem(tr("FP4 (4 bits, float codes)"), "fp4");
  quantize_->addItem(tr("int8 (8 bits a weight)"), "int8");
  add(f4, tr("QLoRA base:"), quantize_,
      tr("How QLoRA holds the frozen linear weights: 4 bits in blocks of 64 with a scale each "
         "(NF4 suits weights' bell-shaped values best), or 8 bits a row with a scale each; the "
         "output head stays as it is"));
  double_quant_ = new QCheckBox(tr("Quantize the block scales too"));
  double_quant_->setChecked(true);
  add(f4, tr("Double quantization:"), double_quant_,
      tr("The 4-bit base's scales held in 8 bits (in blocks of 256 with a scale each), as the "
         "QLoRA paper trains: about 0.37 bits a weight less, the same values to within the "
         "scales' rounding"));

  connect(advanced_toggle_, &QToolButton::toggled, this, &MethodPage::set_advanced_visible);
  connect(length_mode_, &QComboBox::currentIndexChanged, this, [this] {
    const bool epochs = length_mode_->currentData() == "epochs";
    epochs_->setEnabled(epochs);
    steps_->setEnabled(!epochs);
    update_changed();
  });
  // A button of an exclusive group that is unchecked reports it once the new one is checked.
  for (QRadioButton* b : {full_, qlora_})
    connect(b, &QRadioButton::toggled, this, [this] { set_method(method_choice()); });
  connect(lr_, &QLineEdit::textEdited, this, [this] { lr_user_set_ = true; });
  for (QSpinBox* s : {steps_, batch_, accumulation_, warmup_, eval_every_, save_every_, keep_last_,
                      log_every_, seed_, rank_})
    connect(s, &QSpinBox::valueChanged, this, &MethodPage::update_changed);
  connect(epochs_, &QDoubleSpinBox::valueChanged, this, &MethodPage::update_changed);
  for (QLineEdit* e :
       {lr_, weight_decay_, beta1_, beta2_, eps_, grad_norm_, alpha_, dropout_, targets_})
    connect(e, &QLineEdit::textChanged, this, &MethodPage::update_changed);
  for (QComboBox* c : {schedule_, precision_, quantize_})
    connect(c, &QComboBox::currentIndexChanged, this, &MethodPage::update_changed);
  connect(checkpointing_, &QCheckBox::toggled, this, &MethodPage::update_changed);
  connect(double_quant_, &QCheckBox::toggled, this, &MethodPage::update_changed);
  // Double quantization is of 4-bit blocks' scales: int8 rows have none to quantize.
  connect(quantize_, &QComboBox::currentIndexChanged, this,
          [this] { double_quant_->setEnabled(qlora_->isChecked() && quantize() != "int8"); });

  lora_->setChecked(true);
  apply_preset("balanced");
  set_objective("sft");
  set_advanced_visible(false);
}

QString MethodPage::objective() const {
  return objective_->currentData().toString();
}

QString MethodPage::data_format_for(const QString& objective) {
  if (objective == "sft") return {};
  return objective == "kto" ? "unpaired" : "preference";
}

void MethodPage::set_objective(const QString& objective) {
  const int i = objective_->findData(objective);
  if (i < 0) return;
  const job::PreferenceSpec defaults;
  beta_->setText(text_of(objective == "simpo" ? 2.0 : defaults.beta));
  label_smoothing_->setText(text_of(defaults.label_smoothing));
  simpo_gamma_->setText(text_of(defaults.simpo_gamma));
  desirable_weight_->setText(text_of(defaults.desirable_weight));
  undesirable_weight_->setText(text_of(defaults.undesirable_weight));
  objective_->setCurrentIndex(i);
  show_objective();
}

// The description of the chosen objective, and only its own parameters.
void MethodPage::show_objective() {
  const QString o = objective();
  static const QMap<QString, const char*> texts = {
      {"sft", QT_TR_NOOP("Learns to produce the dataset's responses: text, instructions, chats or "
                         "labelled texts.")},
      {"dpo",
       QT_TR_NOOP("Raises the chosen completion's likelihood over the rejected one's, measured "
                  "against the model as it starts (LoRA: its base; full fine-tuning: a frozen "
                  "copy). Needs preference pairs: prompt, chosen, rejected.")},
      {"ipo",
       QT_TR_NOOP("DPO with a squared loss that stops at a target margin instead of pushing it "
                  "without bound: steadier on small or noisy sets. Needs preference pairs.")},
      {"simpo",
       QT_TR_NOOP("Compares the completions' mean token log-probabilities with a target margin, "
                  "without a reference model: less memory and time than DPO. Needs preference "
                  "pairs.")},
      {"orpo",
       QT_TR_NOOP("The chosen completion's supervised loss plus an odds-ratio penalty on the "
                  "rejected one: aligns in one stage from a base model, without a reference. "
                  "Needs preference pairs.")},
      {"kto",
       QT_TR_NOOP("Learns from single completions marked desirable or not (thumbs up or down), "
                  "no pairs needed. Needs prompt, completion and label (true / false) columns; "
                  "batches of at least 2.")}};
  objective_text_->setText(tr(texts.value(o, "")));
  const auto show = [&](QLineEdit* edit, bool visible) {
    objective_form_->setRowVisible(edit, visible);
  };
  show(beta_, o != "sft");
  show(label_smoothing_, o == "dpo" || o == "simpo");
  show(simpo_gamma_, o == "simpo");
  show(desirable_weight_, o == "kto");
  show(undesirable_weight_, o == "kto");
}

void MethodPage::set_advanced_visible(bool visible) {
  advanced_->setVisible(visible);
  advanced_toggle_->setChecked(visible);
  advanced_toggle_->setArrowType(visible ? Qt::DownArrow : Qt::RightArrow);
}

void MethodPage::set_steps(int steps) {
  length_mode_->setCurrentIndex(length_mode_->findData("steps"));
  steps_->setValue(steps);
}

QString MethodPage::method() const {
  return lora_->isChecked() || qlora_->isChecked() ? "lora" : "full";
}

QString MethodPage::method_choice() const {
  return qlora_->isChecked() ? "qlora" : method();
}

QString MethodPage::quantize() const {
  return qlora_->isChecked() ? quantize_->currentData().toString() : QString("none");
}

bool MethodPage::double_quant() const {
  return double_quant_for(quantize());
}

bool MethodPage::double_quant_for(const QString& format) const {
  return format != "none" && format != "int8" && double_quant_->isChecked();
}

void MethodPage::set_method(const QString& type) {
  loading_ = true;
  (type == "qlora" ? qlora_ : type == "lora" ? lora_ : full_)->setChecked(true);
  loading_ = false;
  lora_box_->setEnabled(type == "lora" || type == "qlora");
  quantize_->setEnabled(type == "qlora");
  double_quant_->setEnabled(type == "qlora" && quantize() != "int8");
  if (!lr_user_set_) {
    loading_ = true;
    lr_->setText(text_of(preset_values(preset_, type).training.learning_rate));
    loading_ = false;
  }
  update_changed();
}

MethodPage::Preset MethodPage::preset_values(const QString& preset, const QString& method) const {
  Preset p;
  job::TrainingSpec& t = p.training;
  t.learning_rate = method == "lora" ? 2e-4 : 2e-5;
  t.batch_size = 8;
  if (preset == "quick") {
    t.steps = 100;
    t.warmup_steps = 10;
    t.schedule = "linear";
    p.method.lora_rank = 8;
    p.method.lora_alpha = 16;
  } else if (preset == "thorough") {
    t.epochs = 3;
    t.gradient_accumulation = 2;
    t.warmup_steps = 100;
    t.schedule = "cosine";
    t.weight_decay = 0.01;
    t.eval_every = 200;
    t.save_every = 500;
    p.method.lora_rank = 32;
    p.method.lora_alpha = 64;
    p.method.lora_dropout = 0.05;
  } else {  // balanced
    t.epochs = 1;
    t.warmup_steps = 50;
    t.schedule = "cosine";
    t.weight_decay = 0.01;
    p.method.lora_rank = 16;
    p.method.lora_alpha = 32;
  }
  p.method.type = method.toStdString();
  return p;
}

void MethodPage::apply_preset(const QString& preset) {
  preset_ = preset;
  if (auto* b = preset_buttons_.value(preset)) b->setChecked(true);
  load(preset_values(preset, method()), lr_user_set_);
}

void MethodPage::load(const Preset& p, bool keep_user_lr) {
  loading_ = true;
  const job::TrainingSpec& t = p.training;
  length_mode_->setCurrentIndex(t.steps ? 1 : 0);
  steps_->setValue(int(t.steps.value_or(1000)));
  epochs_->setValue(t.epochs.value_or(1.0));
  batch_->setValue(int(t.batch_size));
  accumulation_->setValue(int(t.gradient_accumulation));
  if (!keep_user_lr) lr_->setText(text_of(t.learning_rate));
  weight_decay_->setText(text_of(t.weight_decay));
  beta1_->setText(text_of(t.adam_beta1));
  beta2_->setText(text_of(t.adam_beta2));
  eps_->setText(text_of(t.adam_eps));
  schedule_->setCurrentIndex(schedule_->findData(QString::fromStdString(t.schedule)));
  warmup_->setValue(int(t.warmup_steps));
  grad_norm_->setText(text_of(t.max_grad_norm));
  seed_->setValue(int(t.seed));
  eval_every_->setValue(int(t.eval_every));
  save_every_->setValue(int(t.save_every));
  keep_last_->setValue(int(t.keep_last));
  log_every_->setValue(int(t.log_every));
  checkpointing_->setChecked(t.activation_checkpointing);
  precision_->setCurrentIndex(0);
  rank_->setValue(int(p.method.lora_rank));
  alpha_->setText(text_of(p.method.lora_alpha));
  dropout_->setText(text_of(p.method.lora_dropout));
  targets_->clear();
  epochs_->setEnabled(!t.steps);
  steps_->setEnabled(bool(t.steps));
  loading_ = false;
  update_changed();
}

job::TrainingSpec MethodPage::training_spec() const {
  job::TrainingSpec t;
  if (length_mode_->currentData() == "steps")
    t.steps = steps_->value();
  else
    t.epochs = epochs_->value();
  t.batch_size = batch_->value();
  t.gradient_accumulation = accumulation_->value();
  t.learning_rate = value_of(lr_, t.learning_rate);
  t.weight_decay = value_of(weight_decay_, t.weight_decay);
  t.adam_beta1 = value_of(beta1_, t.adam_beta1);
  t.adam_beta2 = value_of(beta2_, t.adam_beta2);
  t.adam_eps = value_of(eps_, t.adam_eps);
  t.schedule = schedule_->currentData().toString().toStdString();
  t.warmup_steps = warmup_->value();
  t.max_grad_norm = value_of(grad_norm_, t.max_grad_norm);
  t.seed = std::uint64_t(seed_->value());
  t.eval_every = eval_every_->value();
  t.save_every = save_every_->value();
  t.keep_last = keep_last_->value();
  t.log_every = log_every_->value();
  t.activation_checkpointing = checkpointing_->isChecked();
  return t;
}

job::MethodSpec MethodPage::method_spec() const {
  job::MethodSpec m;
  m.type = method().toStdString();
  if (m.type == "lora") {
    m.lora_rank = rank_->value();
    m.lora_alpha = value_of(alpha_, m.lora_alpha);
    m.lora_dropout = value_of(dropout_, m.lora_dropout);
    for (const QString& target : targets_->text().split(',', Qt::SkipEmptyParts))
      if (!target.trimmed().isEmpty()) m.lora_targets.push_back(target.trimmed().toStdString());
    m.quantize = quantize().toStdString();
    m.double_quant = double_quant();
  }
  const QString o = objective();
  if (o != "sft") {
    job::PreferenceSpec p;
    p.loss = o.toStdString();
    p.beta = value_of(beta_, p.beta);
    if (o == "dpo" || o == "simpo") p.label_smoothing = value_of(label_smoothing_, 0.0);
    if (o == "simpo") p.simpo_gamma = value_of(simpo_gamma_, p.simpo_gamma);
    if (o == "kto") {
      p.desirable_weight = value_of(desirable_weight_, p.desirable_weight);
      p.undesirable_weight = value_of(undesirable_weight_, p.undesirable_weight);
    }
    m.preference = p;
  }
  return m;
}

void MethodPage::show_memory(const QString& model_folder, const job::JobSpec& spec) {
  if (model_folder != memory_folder_) {
    memory_folder_ = model_folder;
    memory_config_.reset();
    memory_checkpoint_bytes_ = 0;
    if (!model_folder.isEmpty()) try {
        const hf::ModelFolder folder = hf::ModelFolder::open(model_folder.toStdString());
        memory_config_ = folder.config();
        memory_checkpoint_bytes_ = folder.checkpoint_bytes();
      } catch (const std::exception&) {  // the Model page says what is wrong with the folder
      }
  }
  for (auto it = memory_.begin(); it != memory_.end(); ++it) {
    QLabel* label = it.value();
    label->setVisible(memory_config_.has_value());
    if (!memory_config_) {
      label->clear();
      continue;
    }
    job::JobSpec as = spec;
    as.method.type = it.key() == "full" ? "full" : "lora";
    // The QLoRA card plans the base format shown in its combo, chosen or not.
    const QString format = quantize_->currentData().toString();
    as.method.quantize = it.key() == "qlora" ? format.toStdString() : std::string("none");
    as.method.double_quant = it.key() == "qlora" && double_quant_for(format);
    try {
      const plan::MemoryEstimate estimate = plan::estimate_memory(
          *memory_config_, plan::settings_as_written(as), memory_checkpoint_bytes_);
      label->setText(tr("About <b>%1</b> of memory: batch %2 × up to %3 tokens, %4")
                         .arg(QString::fromStdString(core::human_bytes(estimate.peak())))
                         .arg(as.training.batch_size)
                         .arg(as.dataset.max_length)
                         .arg(QString::fromStdString(as.precision)));
      label->setToolTip(
          tr("The planner's estimate of the peak of one process training this model so: "
             "weights, gradients, optimizer state, activations and the runtime. The Hardware & "
             "strategy step plans the job for this machine, per memory tier."));
    } catch (const std::exception& e) {  // a method this model cannot take (QLoRA on BERT)
      label->setText(tr("Not for this model: %1").arg(QString::fromUtf8(e.what())));
      label->setToolTip({});
    }
  }
}

QString MethodPage::memory_text(const QString& method) const {
  const QLabel* label = memory_.value(method);
  return label && label->isVisible() ? label->text() : QString();
}

void MethodPage::set_overrides(int batch_size, bool activation_checkpointing,
                               const QString& precision) {
  batch_->setValue(batch_size);
  checkpointing_->setChecked(activation_checkpointing);
  if (const int i = precision_->findData(precision); i >= 0) precision_->setCurrentIndex(i);
}

void MethodPage::load_spec(const job::MethodSpec& method, const job::TrainingSpec& training,
                           const QString& precision) {
  const bool quantized = method.type == "lora" && method.quantize != "none";
  if (quantized)
    if (const int i = quantize_->findData(QString::fromStdString(method.quantize)); i >= 0)
      quantize_->setCurrentIndex(i);
  if (quantized) double_quant_->setChecked(method.double_quant);
  set_method(quantized ? QString("qlora") : QString::fromStdString(method.type));
  load(Preset{training, method}, /*keep_user_lr=*/false);
  lr_user_set_ = true;  // the run's learning rate, kept if the method is switched
  QStringList targets;
  for (const auto& t : method.lora_targets) targets << QString::fromStdString(t);
  targets_->setText(targets.join(", "));
  if (const int i = precision_->findData(precision); i >= 0) precision_->setCurrentIndex(i);
  set_objective(method.preference ? QString::fromStdString(method.preference->loss) : "sft");
  if (const auto& p = method.preference) {
    beta_->setText(text_of(p->beta));
    label_smoothing_->setText(text_of(p->label_smoothing));
    simpo_gamma_->setText(text_of(p->simpo_gamma));
    desirable_weight_->setText(text_of(p->desirable_weight));
    undesirable_weight_->setText(text_of(p->undesirable_weight));
  }
  update_changed();
}

QString MethodPage::precision() const {
  return precision_->currentData().toString();
}

int MethodPage::changed_from_defaults() const {
  const Preset d = preset_values(preset_, method());
  const job::TrainingSpec t = training_spec();
  const job::TrainingSpec& e = d.training;
  int n = 0;
  n += t.steps != e.steps || t.epochs != e.epochs;
  n += t.batch_size != e.batch_size;
  n += t.gradient_accumulation != e.gradient_accumulation;
  n += t.learning_rate != e.learning_rate;
  n += t.weight_decay != e.weight_decay;
  n += t.adam_beta1 != e.adam_beta1;
  n += t.adam_beta2 != e.adam_beta2;
  n += t.adam_eps != e.adam_eps;
  n += t.schedule != e.schedule;
  n += t.warmup_steps != e.warmup_steps;
  n += t.max_grad_norm != e.max_grad_norm;
  n += t.seed != e.seed;
  n += t.eval_every != e.eval_every;
  n += t.save_every != e.save_every;
  n += t.keep_last != e.keep_last;
  n += t.log_every != e.log_every;
  n += t.activation_checkpointing != e.activation_checkpointing;
  n += precision() != "fp32";
  if (method() == "lora") {
    const job::MethodSpec m = method_spec();
    n += m.lora_rank != d.method.lora_rank;
    n += m.lora_alpha != d.method.lora_alpha;
    n += m.lora_dropout != d.method.lora_dropout;
    n += !m.lora_targets.empty();
    n += m.quantize != "none" && m.quantize != "nf4";
    n += m.quantize != "none" && m.quantize != "int8" && !m.double_quant;
  }
  return n;
}

void MethodPage::update_changed() {
  if (loading_) return;
  const int n = changed_from_defaults();
  changed_->setText(n == 0   ? tr("All settings as in the preset")
                    : n == 1 ? tr("1 setting changed from defaults")
                             : tr("%1 settings changed from defaults").arg(n));
  Q_EMIT methodChanged();
}

}  // namespace tessera::ui
