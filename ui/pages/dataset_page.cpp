#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QSpinBox>
#include <QSplitter>
#include <QStackedWidget>
#include <QTableWidget>
#include <QTimer>
#include <QVBoxLayout>
#include <QValueAxis>
#include <QtConcurrent/QtConcurrentRun>

#include "ui/models/hub_calls.h"
#include "ui/pages/hub_dataset_panel.h"
#include "ui/pages/wizard.h"
#include "ui/utility/studio_settings.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/hub_search_view.h"
#include "ui/widgets/pair_view.h"

namespace tessera::ui {

namespace {

// What a sequence length above the model's context does to the run.
enum class ContextCheck {
  Fits,       // not above it
  Unused,     // learned positions, but no sequence the run builds is longer than the table
  Fails,      // learned positions and a longer sequence: the model refuses it, the run fails
  Untrained,  // rotary: it runs, on positions the model was never trained on
};

// Good rows (either share) longer than `context` tokens before truncation.
std::uint64_t rows_longer_than(const DatasetAnalysis& a, std::int64_t context) {
  std::uint64_t n = 0;
  for (const auto* tokens : {&a.row_tokens, &a.validation_file_tokens})
    for (std::uint32_t t : *tokens)
      if (t != DatasetAnalysis::kBadRow && std::int64_t(t) > context) ++n;
  return n;
}

QString packing_tip() {
  return DatasetPage::tr(
      "Text format only: concatenate documents and cut them into blocks of exactly the sequence "
      "length, so no compute is spent on padding");
}

// Batches pad to their longest example, so with learned positions only a sequence the run
// builds longer than the table fails: a packed block (max_length tokens), or a row longer than
// the context (truncated to max_length, still longer).
ContextCheck context_check(const DatasetAnalysis& a, std::int64_t max_length, bool packed) {
  if (a.model_context <= 0 || max_length <= a.model_context) return ContextCheck::Fits;
  if (!a.learned_positions) return ContextCheck::Untrained;
  if (packed || !a.rows_checked) return ContextCheck::Fails;
  return std::int64_t(a.longest_row) > a.model_context ? ContextCheck::Fails : ContextCheck::Unused;
}

}  // namespace

QStringList DatasetPage::HubDataset::local_train_files() const {
  QStringList files;
  for (const QString& f : choice.train_files) files << QDir(snapshot).filePath(f);
  return files;
}

DatasetPage::DatasetPage(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(0, 0, 0, 0);
  views_ = new QStackedWidget;
  outer->addWidget(views_);
  dataset_view_ = new QWidget;
  views_->addWidget(dataset_view_);
  auto* layout = new QVBoxLayout(dataset_view_);
  auto* row = new QHBoxLayout;
  path_ = new QLineEdit;
  path_->setPlaceholderText(tr("A dataset file: .jsonl, .json, .csv, .tsv, .txt or .parquet"));
  path_->setClearButtonEnabled(true);
  auto* file_label = new QLabel(tr("Fil&e:"));
  file_label->setBuddy(path_);
  auto* browse = new QPushButton(tr("Choose f&ile…"));
  hub_button_ = new QPushButton(tr("Hu&gging Face Hub…"));
  hub_button_->setToolTip(
      tr("Search the Hub's datasets, preview their rows, download the splits to train on"));
  hub_button_->setVisible(false);  // until enable_hub
  row->addWidget(file_label);
  row->addWidget(path_, 1);
  row->addWidget(browse);
  row->addWidget(hub_button_);
  layout->addLayout(row);
  hub_source_ = new QLabel;
  hub_source_->setWordWrap(true);
  hub_source_->setTextFormat(Qt::RichText);
  hub_source_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  hub_source_->setVisible(false);
  layout->addWidget(hub_source_);

  auto* top = new QHBoxLayout;
  auto* mapping_box = new QGroupBox(tr("Format and columns"));
  auto* mapping_layout = new QVBoxLayout(mapping_box);
  auto* form = new QFormLayout;
  format_ = new QComboBox;
  format_->addItem(tr("Detect automatically"), "auto");
  for (const char* f : {"text", "instruction", "chat", "classification", "preference", "unpaired"})
    format_->addItem(f, f);
  format_->setToolTip(
      tr("How rows become training examples: plain text (loss on every token), "
         "instruction/response pairs and chats (loss on the answers), text classification, "
         "preference pairs (a prompt with a chosen and a rejected completion, for DPO, IPO, "
         "SimPO or ORPO) or unpaired examples (a prompt, a completion and whether it is "
         "desirable, for KTO)"));
  form->addRow(tr("F&ormat:"), format_);
  max_length_ = new QSpinBox;
  max_length_->setRange(8, 1 << 20);
  max_length_->setValue(512);
  max_length_->setToolTip(
      tr("Tokens per training sequence, at most the model's context (its default until you "
         "change it); longer examples are truncated"));
  form->addRow(tr("Sequence &length:"), max_length_);
  packing_ = new QCheckBox(tr("Pack text documents into full sequences"));
  packing_->setChecked(true);
  packing_->setToolTip(packing_tip());
  form->addRow(QString(), packing_);
  split_ = new QDoubleSpinBox;
  split_->setRange(0, 90);
  split_->setDecimals(1);
  split_->setSingleStep(1);
  split_->setSuffix(" %");
  split_->setValue(5);
  split_->setToolTip(tr("Share of the rows held out for evaluation (validation loss)"));
  form->addRow(tr("&Validation split:"), split_);
  mapping_layout->addLayout(form);
  auto* roles_label = new QLabel(tr("Column for each role (✔ = detected from the column names):"));
  roles_label->setWordWrap(true);
  mapping_layout->addWidget(roles_label);
  roles_form_ = new QFormLayout;
  mapping_layout->addLayout(roles_form_);
  mapping_layout->addStretch(1);
  top->addWidget(mapping_box, 2);

  auto* stats_box = new QGroupBox(tr("Token lengths"));
  auto* stats_layout = new QVBoxLayout(stats_box);
  auto* chart = new QChart;
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->setVisible(false);
  chart->setMargins(QMargins(2, 2, 2, 2));
  histogram_ = new QBarSeries;
  histogram_->setBarWidth(0.9);
  chart->addSeries(histogram_);
  histogram_x_ = new QBarCategoryAxis;
  histogram_x_->setTitleText(tr("tokens per example (bin start)"));
  histogram_x_->setLabelsAngle(-90);
  histogram_y_ = new QValueAxis;
  histogram_y_->setTitleText(tr("examples"));
  histogram_y_->setLabelFormat("%d");
  chart->addAxis(histogram_x_, Qt::AlignBottom);
  chart->addAxis(histogram_y_, Qt::AlignLeft);
  histogram_->attachAxis(histogram_x_);
  histogram_->attachAxis(histogram_y_);
  apply_palette(chart, palette());
  histogram_view_ = new QChartView(chart);
  histogram_view_->setRenderHint(QPainter::Antialiasing);
  histogram_view_->setMinimumHeight(fontMetrics().height() * 12);
  stats_layout->addWidget(histogram_view_, 1);
  truncation_ = new QLabel(tr("Choose a model and a dataset to see token lengths."));
  truncation_->setWordWrap(true);
  stats_layout->addWidget(truncation_);
  top->addWidget(stats_box, 3);

  status_ = new QLabel;
  status_->setWordWrap(true);
  status_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  // How far the row check is: a large file takes a while to tokenize (on a worker thread).
  progress_ = new QProgressBar;
  progress_->setTextVisible(true);
  progress_->setVisible(false);
  progress_->setAccessibleName(tr("Dataset check progress"));
  // The checks that stop a run, each beside its fix.
  const auto check_row = [](QLabel*& label, QWidget* fix) {
    label = new QLabel;
    label->setWordWrap(true);
    label->setTextInteractionFlags(Qt::TextSelectableByMouse);
    auto* row = new QHBoxLayout;
    row->setContentsMargins(0, 0, 0, 0);
    row->addWidget(label, 1);
    row->addWidget(fix, 0, Qt::AlignTop);
    auto* holder = new QWidget;
    holder->setLayout(row);
    holder->setVisible(false);
    return holder;
  };
  use_format_ = new QPushButton;
  fit_context_ = new QPushButton;
  skip_bad_ = new QCheckBox(tr("S&kip bad rows"));
  skip_bad_->setToolTip(
      tr("Train on the other rows: the run skips the rows listed here and counts them "
         "(dataset.skip_bad_rows in the job spec)"));
  QWidget* format_row = check_row(format_note_, use_format_);
  QWidget* context_row = check_row(context_, fit_context_);
  QWidget* bad_rows_row = check_row(bad_rows_, skip_bad_);
  connect(use_format_, &QPushButton::clicked, this, [this] {
    if (!analysis_.suggested_format.isEmpty()) set_format(analysis_.suggested_format);
  });
  connect(fit_context_, &QPushButton::clicked, this, [this] {
    if (analysis_.model_context > 0) max_length_->setValue(int(analysis_.model_context));
  });
  connect(skip_bad_, &QCheckBox::toggled, this, [this] {
    show_checks();
    Q_EMIT datasetChanged();
  });
  const QList<QWidget*> check_rows = {format_row, context_row, bad_rows_row};
  description_ = new QLabel;
  description_->setWordWrap(true);
  table_ = new QTableWidget;
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setWordWrap(false);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->setAccessibleName(tr("Dataset preview"));
  pair_view_ = new PairView;
  pair_view_->hide();
  connect(table_, &QTableWidget::currentCellChanged, this,
          [this](int row, int, int, int) { show_pair(row); });

  auto* upper = new QWidget;
  upper->setLayout(top);
  top->setContentsMargins(0, 0, 0, 0);
  auto* lower = new QWidget;
  auto* lower_layout = new QVBoxLayout(lower);
  lower_layout->setContentsMargins(0, 0, 0, 0);
  lower_layout->addWidget(status_);
  lower_layout->addWidget(progress_);
  for (QWidget* row : check_rows) lower_layout->addWidget(row);
  lower_layout->addWidget(description_);
  // The rows beside the picked pair (preference data), the line between them movable.
  auto* preview_split = new QSplitter(Qt::Horizontal);
  preview_split->addWidget(table_);
  preview_split->addWidget(pair_view_);
  preview_split->setStretchFactor(0, 1);
  preview_split->setStretchFactor(1, 1);
  preview_split->setChildrenCollapsible(false);
  lower_layout->addWidget(preview_split, 1);
  auto* split = new QSplitter(Qt::Vertical);
  split->addWidget(upper);
  split->addWidget(lower);
  layout->addWidget(split, 1);

  auto* debounce = debounce_ = new QTimer(this);
  debounce->setSingleShot(true);
  debounce->setInterval(300);
  connect(debounce, &QTimer::timeout, this, &DatasetPage::analyze);
  connect(browse, &QPushButton::clicked, this, [this] {
    QString file = QFileDialog::getOpenFileName(
        this, tr("Dataset file"), settings::last_folder("dataset"),
        tr("Datasets (*.jsonl *.ndjson *.json *.csv *.tsv *.txt *.parquet);;All files (*)"));
    if (file.isEmpty()) return;
    settings::set_last_folder("dataset", QFileInfo(file).absolutePath());
    choose_file(file);
  });
  connect(path_, &QLineEdit::returnPressed, this, [this] { choose_file(path_->text()); });
  connect(format_, &QComboBox::currentIndexChanged, this, [this] {
    if (updating_) return;
    user_columns_.clear();
    analyze();
  });
  connect(max_length_, &QSpinBox::valueChanged, debounce, qOverload<>(&QTimer::start));
  // The context check needs no new analysis: say it (and block) at once.
  connect(max_length_, &QSpinBox::valueChanged, this, [this] {
    if (!fitting_length_) max_length_chosen_ = true;
    show_checks();
    Q_EMIT datasetChanged();
  });
  connect(packing_, &QCheckBox::toggled, this, [this, debounce](bool on) {
    packing_choice_ = on;
    debounce->start();
  });
  // The shares follow the split at once, from the rows already checked (nothing tokenized).
  connect(split_, &QDoubleSpinBox::valueChanged, this, [this] {
    recount();
    Q_EMIT datasetChanged();
  });
  auto* progress_timer = new QTimer(this);
  progress_timer->setInterval(150);
  connect(progress_timer, &QTimer::timeout, this, [this] {
    const auto state = progress_state_;
    const std::uint64_t total = state ? state->rows_total.load() : 0;
    if (!analyzing_ || total == 0) return;
    const std::uint64_t done = std::min(state->rows_done.load(), total);
    // Shown once it lasts: a small file is checked before the bar would mean anything.
    progress_->setRange(0, 1000);
    progress_->setValue(int(done * 1000 / total));
    progress_->setFormat(tr("%1 of %2 rows").arg(done).arg(total));
    progress_->setVisible(true);
    status_->setText(tr("Checking every row with the model's tokenizer, as the run will build "
                        "them: %1 of %2…")
                         .arg(done)
                         .arg(total));
  });
  progress_timer->start();
  connect(&watcher_, &QFutureWatcher<DatasetAnalysis>::finished, this, [this] {
    analyzing_ = false;
    progress_->setVisible(false);
    if (rerun_) {  // the choices changed while this one ran
      rerun_ = false;
      analyze();
      return;
    }
    analysis_ = watcher_.result();
    show_analysis();
    recount();  // the split changed while the rows were checked
    Q_EMIT datasetChanged();
  });
}

bool DatasetPage::busy() const {
  // Until the result is shown: the future finishes before its watcher says so. A result for
  // other settings than the page's (a length typed, the split changed) waits for its update.
  return analyzing_ || rerun_ || stale();
}

double DatasetPage::validation_fraction() const {
  const bool validation_files = hub_dataset_ && !hub_dataset_->choice.validation_files.isEmpty();
  return validation_files ? 0.0 : split_->value() / 100.0;
}

bool DatasetPage::stale() const {
  const DatasetAnalysis& a = analysis_;
  if (a.file.isEmpty() || path_->text().isEmpty()) return false;
  if (a.max_length != max_length_->value() || a.packing != packing_choice_) return true;
  return a.rows_checked && (a.counted_fraction != validation_fraction() || a.counted_seed != seed_);
}

void DatasetPage::recount() {
  if (analyzing_ || rerun_ || !analysis_.rows_checked) return;
  if (analysis_.counted_fraction == validation_fraction() && analysis_.counted_seed == seed_)
    return;
  analyzing_ = true;
  progress_state_.reset();
  watcher_.setFuture(
      QtConcurrent::run([a = analysis_, fraction = validation_fraction(), seed = seed_]() mutable {
        count_shares(a, fraction, seed);
        return a;
      }));
}

void DatasetPage::set_split_seed(std::uint64_t seed) {
  if (seed == seed_) return;
  seed_ = seed;
  recount();
  Q_EMIT datasetChanged();
}

QString DatasetPage::skipped_rows_text() const {
  const DatasetAnalysis& a = analysis_;
  QStringList parts;
  const std::uint64_t unreadable = a.unreadable_rows + a.unreadable_validation_rows;
  if (unreadable > 0) parts << tr("%1 unreadable").arg(unreadable);
  if (a.training_bad_rows > 0)
    parts << tr("%1 of the %2 training rows").arg(a.training_bad_rows).arg(a.training_rows);
  if (a.validation_bad_rows > 0)
    parts << tr("%1 of the %2 validation rows").arg(a.validation_bad_rows).arg(a.validation_rows);
  if (parts.size() < 2) return parts.join(QString());
  const QString last = parts.takeLast();
  return tr("%1 and %2").arg(parts.join(", "), last);
}

std::uint64_t DatasetPage::rows_to_skip() const {
  return skip_bad_->isChecked() ? analysis_.bad_rows : 0;
}

QString DatasetPage::problem() const {
  const DatasetAnalysis& a = analysis_;
  if (busy()) return tr("Wait for the dataset check");
  if (pending_) return tr("Wait for the dataset's download (see the download tray)");
  if (a.file.isEmpty()) return tr("Choose a dataset file");
  if (!a.missing_roles.isEmpty())
    return tr("Choose the column for '%1' under \"Format and columns\"")
        .arg(a.missing_roles.join("', '"));
  if (!a.error.isEmpty()) return tr("Fix the dataset: %1").arg(a.error.section('\n', 0, 0));
  // The model comes first in the wizard: without one the rows are checked once it is chosen.
  if (model_folder_.isEmpty()) return {};
  if (!a.token_error.isEmpty())
    return tr("Fix the dataset or choose another model: the model's tokenizer cannot build "
              "examples from the rows (%1)")
        .arg(a.token_error.section('\n', 0, 0));
  const auto context = context_check(a, max_length_->value(), a.packs);
  if (context == ContextCheck::Fails || context == ContextCheck::Untrained)
    return tr("Lower the sequence length to %1 or less (the model's context)").arg(a.model_context);
  if (!a.split_error.isEmpty())
    return tr("Lower the validation split: %1").arg(a.split_error.section('\n', 0, 0));
  if (a.rows_checked && a.good_rows == 0)
    return tr("Fix the dataset: no training row can be trained on (see the rows listed)");
  if (a.bad_rows > 0 && !skip_bad_->isChecked())
    return tr("Fix the dataset: %1 cannot be trained on, or tick \"Skip bad rows\"")
        .arg(count_text(qint64(a.bad_rows), tr("1 row"), tr("%1 rows")));
  // The run tokenizes the validation share apart and fails when it gives no example.
  if (a.rows_checked && a.validation_rows > 0 && a.validation_good_rows == 0)
    return tr("Fix the dataset: none of the %1 validation rows can be used (see the rows listed)")
        .arg(a.validation_rows);
  const auto length = std::uint64_t(max_length_->value());
  if (a.rows_checked && a.packs && a.good_tokens < length)
    return tr("Lower the sequence length to %1 or less, or turn packing off: the training rows' "
              "%1 tokens do not fill one sequence of %2")
        .arg(a.good_tokens)
        .arg(length);
  if (a.rows_checked && a.packs && a.validation_rows > 0 && a.validation_good_tokens < length)
    return (a.validation_file_tokens.empty()
                ? tr("Raise the validation split, lower the sequence length to %1 or less, or "
                     "turn packing off: the validation rows' %1 tokens do not fill one sequence "
                     "of %2")
                : tr("Lower the sequence length to %1 or less, or turn packing off: the "
                     "validation files' %1 tokens do not fill one sequence of %2"))
        .arg(a.validation_good_tokens)
        .arg(length);
  return {};
}

void DatasetPage::set_model_folder(const QString& folder) {
  if (folder == model_folder_) return;
  model_folder_ = folder;
  if (!path_->text().isEmpty()) analyze();
}

void DatasetPage::enable_hub(HubToken* token) {
  if (hub_ != nullptr) return;
  hub_ = new HubDatasetPanel(token);
  views_->addWidget(hub_);
  hub_button_->setVisible(true);
  connect(hub_button_, &QPushButton::clicked, this, [this] { show_hub(true); });
  connect(hub_, &HubDatasetPanel::backRequested, this, [this] { show_hub(false); });
  connect(hub_, &HubDatasetPanel::downloadRequested, this, [this](const HubDatasetChoice& c) {
    pending_ = c;
    show_source();
    show_hub(false);
    Q_EMIT hubDownloadRequested(c);
  });
}

void DatasetPage::show_hub(bool shown) {
  if (hub_ == nullptr) return;
  views_->setCurrentWidget(shown ? static_cast<QWidget*>(hub_) : dataset_view_);
  if (shown) hub_->search_view()->search_edit()->setFocus();
}

bool DatasetPage::hub_shown() const {
  return hub_ != nullptr && views_->currentWidget() == hub_;
}

void DatasetPage::choose_file(const QString& file) {
  hub_dataset_.reset();
  pending_.reset();  // a file chosen meanwhile wins over a download still running
  show_source();
  path_->setText(file);
  user_columns_.clear();
  analyze();
}

void DatasetPage::use_hub_dataset(const HubDatasetChoice& choice, const QString& snapshot) {
  hub_dataset_ = HubDataset{choice, snapshot};
  pending_.reset();
  const QStringList files = hub_dataset_->local_train_files();
  path_->setText(files.isEmpty() ? QString() : files.front());
  user_columns_.clear();
  show_source();
  show_hub(false);
  analyze();
}

void DatasetPage::hub_download_ready(const HubDownloadRequest& request, const QString& snapshot) {
  if (pending_ && pending_->download_request().same_files(request))
    use_hub_dataset(*pending_, snapshot);
}

void DatasetPage::show_source() {
  const bool validation_files = hub_dataset_ && !hub_dataset_->choice.validation_files.isEmpty();
  split_->setEnabled(!validation_files);
  split_->setToolTip(validation_files
                         ? tr("The Hub dataset's validation files are the validation data")
                         : tr("Share of the rows held out for evaluation (validation loss)"));
  if (pending_) {
    hub_source_->setText(tr("⏳ Downloading %1 from the Hub: the download tray below shows its "
                            "progress; its rows are read here once every file is verified.")
                             .arg(pending_->label().toHtmlEscaped()));
    hub_source_->setVisible(true);
    return;
  }
  if (!hub_dataset_) {
    hub_source_->clear();
    hub_source_->setVisible(false);
    return;
  }
  const HubDatasetChoice& c = hub_dataset_->choice;
  const auto files = [](const QStringList& list) {
    return count_text(list.size(), tr("1 file"), tr("%1 files"));
  };
  // Split names are known when the dataset was chosen here, not when a run's spec was loaded.
  const auto split = [&files](const QString& name, const QStringList& list) {
    return name.isEmpty() ? files(list)
                          : tr("the %1 split (%2)").arg(name.toHtmlEscaped(), files(list));
  };
  QString text = tr("From the Hub: <b>%1</b> at %2 · config <b>%3</b> · train: %4")
                     .arg(c.repo_id.toHtmlEscaped(), c.commit.left(8),
                          c.config.isEmpty() ? tr("default") : c.config.toHtmlEscaped(),
                          split(c.train_split, c.train_files));
  text += c.validation_files.isEmpty()
              ? tr(" · validation: a share of the training rows")
              : tr(" · validation: %1").arg(split(c.validation_split, c.validation_files));
  hub_source_->setText(text);
  hub_source_->setToolTip(hub_dataset_->snapshot);
  hub_source_->setVisible(true);
}

void DatasetPage::set_format(const QString& format) {
  format_->setCurrentIndex(std::max(0, format_->findData(format)));
}

void DatasetPage::set_column(const QString& role, const QString& column) {
  user_columns_[role] = column;
  analyze();
}

void DatasetPage::analyze() {
  if (path_->text().isEmpty()) return;
  // This analysis is of the page's settings now: a debounced one still pending would only
  // repeat it (and turn Next off again after the wizard had let it on).
  if (debounce_) debounce_->stop();
  if (analyzing_) {
    rerun_ = true;
    if (progress_state_) progress_state_->cancel = true;  // its answer is not wanted any more
    Q_EMIT datasetChanged();
    return;
  }
  DatasetRequest request;
  request.file = path_->text();
  if (hub_dataset_) {
    request.files = hub_dataset_->local_train_files();
    for (const QString& f : hub_dataset_->choice.validation_files)
      request.validation_files << QDir(hub_dataset_->snapshot).filePath(f);
  }
  request.model_folder = model_folder_;
  request.format = format_->currentData().toString();
  request.columns = user_columns_;
  request.max_length = max_length_->value();
  request.packing = packing_choice_;
  request.validation_fraction = validation_fraction();
  request.seed = seed_;
  progress_state_ = std::make_shared<AnalysisProgress>();
  request.progress = progress_state_;
  status_->setText(tr("Reading %1…").arg(request.file));
  analyzing_ = true;
  watcher_.setFuture(QtConcurrent::run([request] { return analyze_dataset(request); }));
  Q_EMIT datasetChanged();  // busy now: the wizard says to wait for the check
}

void DatasetPage::rebuild_role_combos() {
  while (roles_form_->rowCount() > 0) roles_form_->removeRow(0);
  role_combos_.clear();
  if (analysis_.format.isEmpty()) return;
  for (const QString& role : roles_of(analysis_.format, analysis_.mapping)) {
    auto* combo = new QComboBox;
    // Pairs without a prompt column take it from the common start of chosen and rejected.
    const bool optional = role == "input" || (analysis_.format == "preference" && role == "prompt");
    if (optional) combo->addItem(tr("(none)"), QString());
    // A required role no column plays yet: the user chooses one.
    if (analysis_.missing_roles.contains(role)) combo->addItem(tr("(choose a column)"), QString());
    for (const QString& column : analysis_.columns) {
      const bool detected = analysis_.detected.value(role) == column;
      combo->addItem(detected ? column + "  ✔" : column, column);
    }
    combo->setCurrentIndex(std::max(0, combo->findData(analysis_.mapping.value(role))));
    combo->setToolTip(tr("The column that holds the %1").arg(role));
    connect(combo, &QComboBox::currentIndexChanged, this, [this, role, combo] {
      if (updating_) return;
      set_column(role, combo->currentData().toString());
    });
    roles_form_->addRow(role + ":", combo);
    role_combos_.insert(role, combo);
  }
}

void DatasetPage::show_analysis() {
  updating_ = true;
  const DatasetAnalysis& a = analysis_;
  if (!a.error.isEmpty()) {
    status_->setText(tr("✘ %1").arg(a.error));
  } else {
    QString text = tr("✔ %1 rows, %2").arg(a.num_rows).arg(a.file_type);
    if (!a.detected_format.isEmpty()) text += tr("; detected format: %1").arg(a.detected_format);
    status_->setText(text);
  }
  description_->setText(a.description);
  {
    const bool packable = a.format.isEmpty() || a.format == "text";
    const QSignalBlocker quiet(packing_);  // shown, not chosen: the choice stays for text data
    packing_->setEnabled(packable);
    packing_->setChecked(packable && packing_choice_);
    packing_->setToolTip(packable ? packing_tip()
                                  : tr("Off for %1 data: each row trains as a sequence of its "
                                       "own (its prompt masked from the loss), so rows are not "
                                       "packed together. Text data packs.")
                                        .arg(a.format));
  }
  rebuild_role_combos();
  if (!max_length_chosen_ && !model_folder_.isEmpty() && a.model_context > 0 &&
      max_length_->value() > a.model_context) {
    // The default is above this model's context: its context is the default here (analysed
    // again for it, after the debounce).
    fitting_length_ = true;
    max_length_->setValue(int(std::min<std::int64_t>(a.model_context, max_length_->maximum())));
    fitting_length_ = false;
  }
  show_checks();

  table_->clear();
  table_->setColumnCount(int(a.columns.size()));
  table_->setRowCount(int(a.rows.size()));
  QStringList headers;
  for (const QString& column : a.columns) {
    QString role;
    for (auto it = a.mapping.begin(); it != a.mapping.end(); ++it)
      if (it.value() == column) role = it.key();
    headers << (role.isEmpty() ? column : column + " → " + role);
  }
  table_->setHorizontalHeaderLabels(headers);
  for (int r = 0; r < a.rows.size(); ++r)
    for (int c = 0; c < a.rows[r].size() && c < a.columns.size(); ++c) {
      auto* item = new QTableWidgetItem(QString(a.rows[r][c]).replace('\n', " ⏎ "));
      item->setToolTip(a.rows[r][c].left(2000));
      table_->setItem(r, c, item);
    }
  table_->resizeColumnsToContents();
  for (int c = 0; c < table_->columnCount(); ++c)
    table_->setColumnWidth(c,
                           std::min(table_->columnWidth(c), fontMetrics().averageCharWidth() * 60));
  show_pair(0);

  histogram_->clear();
  histogram_x_->clear();
  if (!a.bin_counts.empty()) {
    auto* set = new QBarSet(tr("examples"));
    set->setColor(series_color(0));
    QStringList categories;
    std::uint64_t most = 0;
    for (std::size_t i = 0; i < a.bin_counts.size(); ++i) {
      *set << double(a.bin_counts[i]);
      most = std::max(most, a.bin_counts[i]);
      categories << QString::number(a.bin_edges[i]);
    }
    histogram_->append(set);
    histogram_x_->append(categories);
    histogram_y_->setRange(0, double(most));
    histogram_y_->applyNiceNumbers();
    const double share = a.truncated_share() * 100.0;
    const bool packed = a.packs;
    // What the statistics leave out: they are of the rows the run trains on.
    const QString kept_out = a.validation_rows > 0 && a.bad_rows > 0
                                 ? tr("(every row but the validation share and the rows skipped)")
                             : a.validation_rows > 0 ? tr("(every row but the validation share)")
                             : a.bad_rows > 0        ? tr("(every row but the rows skipped)")
                                                     : tr("(all rows)");
    if (packed)
      truncation_->setText(
          tr("%1 training documents %2: median %3, 95th percentile %4, longest %5 tokens.\n"
             "Packed into blocks of %6 tokens: nothing is truncated; %7 % of the documents "
             "span more than one block.")
              .arg(a.measured)
              .arg(kept_out)
              .arg(a.p50)
              .arg(a.p95)
              .arg(a.max_len)
              .arg(max_length_->value())
              .arg(share, 0, 'f', 1));
    else
      truncation_->setText(tr("%1 training examples %2: median %3, 95th percentile %4, longest "
                              "%5 tokens.\n"
                              "%6 % (%7) are longer than %8 tokens and will be truncated.")
                               .arg(a.measured)
                               .arg(kept_out)
                               .arg(a.p50)
                               .arg(a.p95)
                               .arg(a.max_len)
                               .arg(share, 0, 'f', 1)
                               .arg(a.truncated)
                               .arg(max_length_->value()));
  } else if (!a.token_error.isEmpty()) {
    truncation_->setText(tr("Token lengths unavailable: %1").arg(a.token_error));
  } else if (model_folder_.isEmpty()) {
    truncation_->setText(tr("Choose a model first to measure token lengths."));
  } else {
    truncation_->setText(QString());
  }
  updating_ = false;
}

void DatasetPage::show_pair(int row) {
  const DatasetAnalysis& a = analysis_;
  const auto column_of = [&](const char* role) {
    return a.mapping.contains(role) ? a.columns.indexOf(a.mapping.value(role)) : -1;
  };
  const int prompt = column_of("prompt"), chosen = column_of("chosen"),
            rejected = column_of("rejected");
  const bool pairs =
      a.format == "preference" && chosen >= 0 && rejected >= 0 && row >= 0 && row < a.rows.size();
  pair_view_->setVisible(pairs);
  if (!pairs) return;
  const QStringList& cells = a.rows[row];
  const auto cell = [&](int column) {
    return column >= 0 && column < cells.size() ? cells[column] : QString();
  };
  pair_view_->show_pair(row,
                        prompt >= 0 ? cell(prompt)
                                    : tr("(no prompt column: the run takes the common start of "
                                         "chosen and rejected)"),
                        cell(chosen), cell(rejected));
}

void DatasetPage::show_checks() {
  const DatasetAnalysis& a = analysis_;
  const auto show = [](QLabel* label, const QString& text) {
    label->setText(text);
    label->parentWidget()->setVisible(!text.isEmpty());
  };
  // A note only while the rows are read as text: choosing the format makes it a mapping.
  show(format_note_, a.format_note.isEmpty() ? QString() : "⚠ " + a.format_note);
  use_format_->setText(tr("Use the %1 format").arg(a.suggested_format));

  // The length typed counts at once; packing as the page has it now.
  const int length = max_length_->value();
  const bool packed = packing_->isEnabled() && packing_->isChecked();
  const auto check =
      model_folder_.isEmpty() ? ContextCheck::Fits : context_check(a, length, packed);
  const QString model = a.model_type.isEmpty() ? tr("the model") : a.model_type;
  QString context;
  if (check == ContextCheck::Fails && packed) {
    context = tr("✘ Sequence length %1 is above the model's context: %2 has %3 positions, and "
                 "packing makes every sequence %1 tokens long, so the run fails on the first. "
                 "Lower it to %3 or less, or turn packing off.")
                  .arg(length)
                  .arg(model)
                  .arg(a.model_context);
  } else if (check == ContextCheck::Fails) {
    const std::uint64_t longer = rows_longer_than(a, a.model_context);
    context = tr("✘ Sequence length %1 is above the model's context: %2 has %3 positions, and "
                 "%4 longer (the longest has %5 tokens), so the run fails on the first batch "
                 "that holds one. Lower it to %3 or less (longer rows are then truncated).")
                  .arg(length)
                  .arg(model)
                  .arg(a.model_context)
                  .arg(count_text(qint64(longer), tr("1 row is"), tr("%1 rows are")))
                  .arg(a.longest_row);
  } else if (check == ContextCheck::Unused) {
    context = tr("ℹ Sequence length %1 is above the model's context (%2 has %3 positions), but "
                 "no row is longer than %4 tokens and packing is off, so no sequence goes "
                 "beyond %3 and the run works. Packing, or a row longer than %3 tokens, would "
                 "make it fail.")
                  .arg(length)
                  .arg(model)
                  .arg(a.model_context)
                  .arg(a.longest_row);
  } else if (check == ContextCheck::Untrained) {
    context = tr("✘ Sequence length %1 is above the model's context: %2 was trained on %3 "
                 "positions, and training beyond them teaches positions it has never seen. "
                 "Lower it to %3 or less.")
                  .arg(length)
                  .arg(model)
                  .arg(a.model_context);
  }
  show(context_, context);
  fit_context_->setText(tr("Use %1 tokens").arg(a.model_context));

  QString rows;
  if (a.bad_rows > 0) {
    // The reasons name each file by its path: its name is enough beside the file chosen.
    QStringList reasons;
    for (QString reason : a.bad_reasons) {
      for (const QString& file : a.files) reason.replace(file, QFileInfo(file).fileName());
      reasons << "• " + reason;
    }
    if (a.bad_rows > std::uint64_t(reasons.size()))
      reasons << tr("… and %1 more").arg(a.bad_rows - std::uint64_t(reasons.size()));
    const QString count = count_text(qint64(a.bad_rows), tr("1 row"), tr("%1 rows"));
    // Where they are, as the run's log counts them (unreadable, training, validation rows).
    const QString where = skipped_rows_text();
    rows =
        skip_bad_->isChecked()
            ? tr("⚠ %1 will be skipped (%2): the run trains on the other rows.").arg(count, where)
            : tr("✘ %1 cannot be trained on (%2), and the run would stop at the first of "
                 "them: fix the file, or tick \"Skip bad rows\".")
                  .arg(count, where);
    rows += "\n" + reasons.join("\n");
  }
  show(bad_rows_, rows);
}

void DatasetPage::load_spec(const job::DatasetSpec& spec) {
  max_length_->setValue(int(std::clamp<std::int64_t>(spec.max_length, 8, 1 << 20)));
  max_length_chosen_ = true;  // the spec's, kept even above the model's context (then flagged)
  packing_choice_ = spec.packing;
  packing_->setChecked(spec.packing);
  skip_bad_->setChecked(spec.skip_bad_rows);
  split_->setValue(spec.validation_split * 100.0);
  set_format(QString::fromStdString(spec.format));
  user_columns_.clear();
  for (const auto& [role, column] : spec.columns)
    user_columns_[QString::fromStdString(role)] = QString::fromStdString(column);
  if (!spec.hub_id.empty()) {
    HubDatasetChoice choice;
    choice.repo_id = QString::fromStdString(spec.hub_id);
    choice.commit = QString::fromStdString(spec.revision);
    choice.config = QString::fromStdString(spec.config);
    for (const std::string& f : spec.train_files) choice.train_files << QString::fromStdString(f);
    for (const std::string& f : spec.validation_files)
      choice.validation_files << QString::fromStdString(f);
    // The run fetched them into the HF cache: the snapshot of the revision, or of the Parquet
    // conversion, that holds every file.
    const std::optional<QString> snapshot = cached_hub_dataset(choice);
    if (snapshot) {
      use_hub_dataset(choice, *snapshot);
    } else {
      hub_dataset_.reset();
      path_->clear();
      analysis_ = {};
      show_source();
      status_->setText(tr("✘ The files of %1 (%2) are not in the HuggingFace cache: choose the "
                          "dataset again with \"Hugging Face Hub…\".")
                           .arg(choice.repo_id, choice.train_files.join(", ")));
      Q_EMIT datasetChanged();
    }
    return;
  }
  if (!spec.train_files.empty()) choose_file(QString::fromStdString(spec.train_files.front()));
}

job::DatasetSpec DatasetPage::dataset_spec() const {
  job::DatasetSpec d;
  if (hub_dataset_) {
    // The run fetches (from the cache, where the studio put them) exactly the files analysed.
    const HubDatasetChoice& c = hub_dataset_->choice;
    d.hub_id = c.repo_id.toStdString();
    d.revision = c.commit.toStdString();
    d.config = c.config.toStdString();
    for (const QString& f : c.train_files) d.train_files.push_back(f.toStdString());
    for (const QString& f : c.validation_files) d.validation_files.push_back(f.toStdString());
  } else if (!path_->text().isEmpty()) {
    d.train_files.push_back(path_->text().toStdString());
  }
  d.format = analysis_.format.isEmpty() ? format_->currentData().toString().toStdString()
                                        : analysis_.format.toStdString();
  for (auto it = analysis_.mapping.begin(); it != analysis_.mapping.end(); ++it)
    d.columns[it.key().toStdString()] = it.value().toStdString();
  d.validation_split = d.validation_files.empty() ? split_->value() / 100.0 : 0.0;
  d.max_length = max_length_->value();
  d.packing = packing_choice_;
  d.skip_bad_rows = skip_bad_->isChecked();
  return d;
}

}  // namespace tessera::ui
