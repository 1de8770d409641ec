#include "ui/pages/hub_dataset_panel.h"

#include <QComboBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>
#include <QSplitter>
#include <QStackedWidget>
#include <QStyle>
#include <QTabWidget>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include "ui/models/hub_dataset_results_model.h"
#include "ui/models/hub_results_model.h"
#include "ui/models/model_info.h"
#include "ui/utility/hub_token.h"
#include "ui/widgets/card_view.h"
#include "ui/widgets/hub_search_view.h"

namespace tessera::ui {

namespace hub = hf::hub;

namespace {

constexpr int kPreviewRows = 20;

QString preview_key(const QString& repo, const QString& config, const QString& split) {
  return repo + "\n" + config + "\n" + split;
}

QString split_text(const hub::DatasetSplit& split) {
  return QString::fromStdString(split.name) + " (" +
         count_text(std::int64_t(split.files.size()), QObject::tr("1 file"),
                    QObject::tr("%1 files")) +
         ")";
}

QString source_text(const std::string& source) {
  if (source == "card") return QObject::tr("configs declared by its card");
  if (source == "file names") return QObject::tr("splits named by its files");
  if (source == "parquet conversion") return QObject::tr("the Hub's Parquet conversion");
  return QString::fromStdString(source);
}

}  // namespace

HubDatasetPanel::HubDatasetPanel(HubToken* token, QWidget* parent)
    : QWidget(parent), token_(token) {
  pool_.setMaxThreadCount(2);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);

  auto* top = new QHBoxLayout;
  back_ = new QPushButton(style()->standardIcon(QStyle::SP_ArrowBack), tr("Bac&k to the dataset"));
  back_->setToolTip(tr("Back to the dataset chosen (its format, columns and token lengths)"));
  auto* intro = new QLabel(
      tr("Datasets on the Hugging Face Hub: look at a split's first rows before downloading, "
         "then download the splits to train on."));
  intro->setWordWrap(true);
  top->addWidget(back_);
  top->addWidget(intro, 1);
  layout->addLayout(top);

  model_ = new HubDatasetResultsModel(this);
  HubSearchTexts texts;
  texts.placeholder = tr("Search datasets: alpaca, dolly, chat…");
  texts.table_name = tr("Hub datasets");
  texts.intro_title = tr("Search the Hub's datasets");
  texts.intro_detail =
      tr("Choose one to see its configs and splits and a preview of its first rows; only the "
         "splits you train on are downloaded.");
  texts.no_results = tr("No datasets match \"%1\"");
  texts.no_results_hint =
      tr("Try a shorter name or part of it, or another task, format or license; the Hub matches "
         "the text anywhere in the id.");
  texts.local_note = tr("Files on this machine can still be chosen with \"Choose file…\".");
  search_ = new HubSearchView(hub::RepoType::Dataset, token, model_, texts);
  search_->add_filter(
      tr("Task"), tr("Any task"),
      {{tr("Text generation"), "task_categories:text-generation"},
       {tr("Question answering"), "task_categories:question-answering"},
       {tr("Summarization"), "task_categories:summarization"},
       {tr("Translation"), "task_categories:translation"},
       {tr("Text classification"), "task_categories:text-classification"},
       {tr("Table question answering"), "task_categories:table-question-answering"}});
  search_->add_filter(tr("Format"), tr("Any format"),
                      {{"JSON", "format:json"},
                       {"CSV", "format:csv"},
                       {"Parquet", "format:parquet"},
                       {tr("Text"), "format:text"}});
  search_->add_filter(tr("License"), tr("Any license"),
                      {{"Apache 2.0", "license:apache-2.0"},
                       {"MIT", "license:mit"},
                       {"CC BY 4.0", "license:cc-by-4.0"},
                       {"CC BY-SA 4.0", "license:cc-by-sa-4.0"},
                       {"CC BY-NC 4.0", "license:cc-by-nc-4.0"},
                       {"CC0 1.0", "license:cc0-1.0"},
                       {"ODC-By", "license:odc-by"},
                       {tr("Other"), "license:other"}});

  // The selected dataset.
  detail_ = new QWidget;
  auto* detail = new QVBoxLayout(detail_);
  detail->setContentsMargins(0, 0, 0, 0);
  title_ = new QLabel(tr("Choose a dataset among the results."));
  QFont f = title_->font();
  f.setPointSizeF(f.pointSizeF() * 1.2);
  f.setBold(true);
  title_->setFont(f);
  title_->setWordWrap(true);
  title_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  detail->addWidget(title_);
  facts_ = new QLabel;
  facts_->setWordWrap(true);
  facts_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  detail->addWidget(facts_);
  auto* busy_row = new QHBoxLayout;
  busy_ = new QProgressBar;
  busy_->setRange(0, 0);  // busy, no amount
  busy_->setMaximumWidth(fontMetrics().averageCharWidth() * 12);
  busy_->setMaximumHeight(fontMetrics().height());
  busy_->setTextVisible(false);
  busy_text_ = new QLabel;
  busy_row->addWidget(busy_);
  busy_row->addWidget(busy_text_, 1);
  detail->addLayout(busy_row);

  auto* pick = new QHBoxLayout;
  config_ = new QComboBox;
  config_->setAccessibleName(tr("Config"));
  config_->setToolTip(tr("The dataset's configs (subsets), the default first"));
  config_->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  config_->setMinimumContentsLength(10);
  split_ = new QComboBox;
  split_->setAccessibleName(tr("Split"));
  split_->setToolTip(tr("The split whose first rows are shown"));
  split_->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  split_->setMinimumContentsLength(10);
  auto* config_label = new QLabel(tr("&Config:"));
  config_label->setBuddy(config_);
  auto* split_label = new QLabel(tr("S&plit:"));
  split_label->setBuddy(split_);
  pick->addWidget(config_label);
  pick->addWidget(config_, 1);
  pick->addWidget(split_label);
  pick->addWidget(split_, 1);
  detail->addLayout(pick);

  tabs_ = new QTabWidget;
  auto* rows_page = new QWidget;
  auto* rows_layout = new QVBoxLayout(rows_page);
  rows_layout->setContentsMargins(0, 0, 0, 0);
  rows_caption_ = new QLabel;
  rows_caption_->setWordWrap(true);
  rows_layout->addWidget(rows_caption_);
  preview_stack_ = new QStackedWidget;
  rows_ = new QTableWidget;
  rows_->setAccessibleName(tr("First rows of the split"));
  rows_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  rows_->setWordWrap(false);
  rows_->horizontalHeader()->setStretchLastSection(true);
  preview_message_ = new QLabel;
  preview_message_->setWordWrap(true);
  preview_message_->setAlignment(Qt::AlignCenter);
  preview_message_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  preview_message_->setMargin(fontMetrics().height());
  preview_stack_->addWidget(rows_);
  preview_stack_->addWidget(preview_message_);
  rows_layout->addWidget(preview_stack_, 1);
  card_ = new CardView;
  card_->setAccessibleName(tr("Dataset card"));
  tabs_->addTab(rows_page, tr("&Rows"));
  tabs_->addTab(card_, tr("C&ard"));
  detail->addWidget(tabs_, 1);

  auto* use_row = new QHBoxLayout;
  train_ = new QComboBox;
  train_->setAccessibleName(tr("Train on"));
  train_->setToolTip(tr("The split whose rows are the training data"));
  train_->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  train_->setMinimumContentsLength(8);
  validation_ = new QComboBox;
  validation_->setAccessibleName(tr("Validate on"));
  validation_->setToolTip(
      tr("The split that measures the validation loss, or a share of the training rows held "
         "out (the Validation split setting)"));
  validation_->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  validation_->setMinimumContentsLength(8);
  auto* train_label = new QLabel(tr("&Train on:"));
  train_label->setBuddy(train_);
  auto* validation_label = new QLabel(tr("&Validate on:"));
  validation_label->setBuddy(validation_);
  use_row->addWidget(train_label);
  use_row->addWidget(train_, 1);
  use_row->addWidget(validation_label);
  use_row->addWidget(validation_, 1);
  detail->addLayout(use_row);
  auto* download_row = new QHBoxLayout;
  size_ = new QLabel;
  size_->setWordWrap(true);
  use_ = new QPushButton(tr("Do&wnload and use"));
  use_->setEnabled(false);
  use_->setToolTip(
      tr("Download the chosen splits into the HuggingFace cache (the download tray shows "
         "progress), then use them as the dataset"));
  download_row->addWidget(size_, 1);
  download_row->addWidget(use_);
  detail->addLayout(download_row);

  auto* split = new QSplitter(Qt::Horizontal);
  split->addWidget(search_);
  split->addWidget(detail_);
  split->setChildrenCollapsible(false);
  split->setStretchFactor(0, 2);
  split->setStretchFactor(1, 3);
  layout->addWidget(split, 1);
  detail_->setEnabled(false);
  update_busy();

  connect(back_, &QPushButton::clicked, this, &HubDatasetPanel::backRequested);
  connect(search_, &HubSearchView::selectionChanged, this,
          [this] { show_dataset(search_->selected_repo()); });
  connect(search_, &HubSearchView::searchStarted, this, [this](bool append) {
    if (!append) show_dataset(QString());
    update_busy();
  });
  connect(search_, &HubSearchView::searched, this, [this] {
    update_busy();
    if (search_->selected_repo() != shown_repo_) show_dataset(search_->selected_repo());
  });
  connect(config_, &QComboBox::currentIndexChanged, this, [this] {
    if (filling_) return;
    fill_splits();
    request_preview();
  });
  connect(split_, &QComboBox::currentIndexChanged, this, [this] {
    if (!filling_) request_preview();
  });
  connect(train_, &QComboBox::currentIndexChanged, this, [this] {
    if (filling_) return;
    // The validation choices are the other splits.
    const QString keep = validation_->currentData().toString();
    filling_ = true;
    validation_->clear();
    validation_->addItem(tr("a share of the training rows"), QString());
    if (const hub::DatasetConfig* config = current_config())
      for (const hub::DatasetSplit& s : config->splits)
        if (QString::fromStdString(s.name) != train_->currentData().toString())
          validation_->addItem(split_text(s), QString::fromStdString(s.name));
    validation_->setCurrentIndex(std::max(0, validation_->findData(keep)));
    filling_ = false;
    update_choice();
  });
  connect(validation_, &QComboBox::currentIndexChanged, this, [this] {
    if (!filling_) update_choice();
  });
  connect(tabs_, &QTabWidget::currentChanged, this, [this] {
    if (tabs_->currentWidget() == card_) request_card();
  });
  connect(use_, &QPushButton::clicked, this, [this] {
    const HubDatasetChoice c = choice();
    if (!c.train_files.isEmpty()) Q_EMIT downloadRequested(c);
  });
}

HubDatasetPanel::~HubDatasetPanel() {
  ++layout_generation_;
  ++preview_generation_;
  pool_.clear();
  pool_.waitForDone();
}

void HubDatasetPanel::search(const QString& text) {
  search_->search(text);
}

void HubDatasetPanel::select_repo(const QString& repo_id) {
  search_->select_repo(repo_id);
}

QString HubDatasetPanel::selected_repo() const {
  return search_->selected_repo();
}

bool HubDatasetPanel::busy() const {
  return search_->searching() || layout_running_ || preview_running_ ||
         pool_.activeThreadCount() > 0;
}

const HubDatasetInfo* HubDatasetPanel::info() const {
  const auto it = infos_.constFind(shown_repo_);
  return it == infos_.constEnd() ? nullptr : &*it;
}

const hub::DatasetConfig* HubDatasetPanel::current_config() const {
  const HubDatasetInfo* i = info();
  if (i == nullptr) return nullptr;
  const std::string name = config_->currentData().toString().toStdString();
  for (const hub::DatasetConfig& c : i->layout.configs)
    if (c.name == name) return &c;
  return nullptr;
}

HubDatasetChoice HubDatasetPanel::choice() const {
  const HubDatasetInfo* i = info();
  if (i == nullptr || current_config() == nullptr) return {};
  return choose_hub_dataset(*i, config_->currentData().toString().toStdString(),
                            train_->currentData().toString().toStdString(),
                            validation_->currentData().toString().toStdString());
}

QString HubDatasetPanel::preview_message() const {
  return preview_stack_->currentWidget() == preview_message_ ? preview_message_->text() : QString();
}

QString HubDatasetPanel::facts_text() const {
  return title_->text() + "\n" + facts_->text();
}

void HubDatasetPanel::update_busy() {
  const bool working = layout_running_ || preview_running_;
  busy_->setVisible(working);
  busy_text_->setVisible(working);
  busy_text_->setText(layout_running_    ? tr("Reading its configs and splits…")
                      : preview_running_ ? tr("Reading the first rows…")
                                         : QString());
}

void HubDatasetPanel::show_dataset(const QString& repo_id) {
  if (repo_id == shown_repo_ && !repo_id.isEmpty()) return;
  shown_repo_ = repo_id;
  ++layout_generation_;
  ++preview_generation_;
  layout_running_ = false;
  preview_running_ = false;
  filling_ = true;
  for (QComboBox* c : {config_, split_, train_, validation_}) c->clear();
  filling_ = false;
  rows_->clear();
  rows_->setRowCount(0);
  rows_->setColumnCount(0);
  rows_caption_->clear();
  preview_stack_->setCurrentWidget(rows_);
  card_->show_note(QString());
  card_->setProperty("repo", QString());
  size_->clear();
  use_->setEnabled(false);
  if (repo_id.isEmpty()) {
    title_->setText(tr("Choose a dataset among the results."));
    facts_->clear();
    detail_->setEnabled(false);
    update_busy();
    return;
  }
  detail_->setEnabled(true);
  title_->setText(repo_id);
  facts_->clear();
  if (const auto it = infos_.constFind(repo_id); it != infos_.constEnd()) {
    show_info(*it);
    return;
  }
  layout_running_ = true;
  update_busy();
  const int generation = layout_generation_;
  QtConcurrent::run(&pool_, [settings =
                                 hub_settings(token_ ? token_->keychain_token() : std::string()),
                             id = repo_id.toStdString()] {
    return load_hub_dataset(settings, id);
  }).then(this, [this, generation](const HubDatasetInfo& result) {
    if (!result.failure.failed()) infos_.insert(result.repo_id, result);
    if (generation != layout_generation_) return;  // another dataset was chosen since
    layout_running_ = false;
    show_info(result);
  });
}

void HubDatasetPanel::show_info(const HubDatasetInfo& i) {
  const int row = model_->row_of(i.repo_id);
  if (i.failure.failed()) {
    QString why;
    switch (i.failure.problem) {
      case HubProblem::NeedsToken:
        why = tr("The Hub asks for a token: add one in Settings → Hugging Face token.");
        break;
      case HubProblem::TokenRejected:
        why = tr("The Hub rejected the token: replace it in Settings → Hugging Face token.");
        break;
      case HubProblem::Gated:
        why =
            tr("Access is gated: accept its terms on its Hub page with the account of your "
               "token.");
        break;
      case HubProblem::RateLimited:
        why = tr("The Hub is rate-limiting these requests: wait a few minutes.");
        break;
      case HubProblem::Offline:
        why = tr("Offline: HF_HUB_OFFLINE is set.");
        break;
      default:
        why = tr("Its configs and splits could not be read.");
    }
    facts_->setText("✘ " + why + "\n" + i.failure.message +
                    (i.failure.hint.isEmpty() ? "" : "\n" + i.failure.hint));
    preview_message_->setText(why);
    preview_stack_->setCurrentWidget(preview_message_);
    update_busy();
    Q_EMIT layoutShown();
    return;
  }
  QStringList facts;
  facts << (i.license.isEmpty() ? tr("license not stated") : tr("license %1").arg(i.license));
  facts << (i.gated.isEmpty() ? tr("open") : tr("gated (your token has access)"));
  if (row >= 0) facts << tr("%1 downloads").arg(human_downloads(model_->hits()[row].downloads));
  facts << tr("%1 from %2")
               .arg(count_text(std::int64_t(i.layout.configs.size()), tr("1 config"),
                               tr("%1 configs")),
                    source_text(i.layout.source));
  facts << tr("commit %1").arg(QString::fromStdString(i.layout.commit).left(8));
  facts_->setText(facts.join(" · "));

  filling_ = true;
  config_->clear();
  for (const hub::DatasetConfig& c : i.layout.configs)
    config_->addItem(QString::fromStdString(c.name) +
                         (c.is_default && c.name != "default" ? tr(" (default)") : ""),
                     QString::fromStdString(c.name));
  config_->setCurrentIndex(0);
  filling_ = false;
  fill_splits();
  update_busy();
  Q_EMIT layoutShown();
  request_preview();
  if (tabs_->currentWidget() == card_) request_card();
}

void HubDatasetPanel::fill_splits() {
  filling_ = true;
  split_->clear();
  train_->clear();
  validation_->clear();
  const hub::DatasetConfig* config = current_config();
  if (config != nullptr) {
    for (const hub::DatasetSplit& s : config->splits) {
      split_->addItem(split_text(s), QString::fromStdString(s.name));
      train_->addItem(split_text(s), QString::fromStdString(s.name));
    }
    // Train on "train" when there is one; preview that split first.
    const int train = std::max(0, train_->findData("train"));
    train_->setCurrentIndex(train);
    split_->setCurrentIndex(train);
    const QString validation = default_validation_split(*config);
    validation_->addItem(tr("a share of the training rows"), QString());
    for (const hub::DatasetSplit& s : config->splits)
      if (QString::fromStdString(s.name) != train_->currentData().toString())
        validation_->addItem(split_text(s), QString::fromStdString(s.name));
    validation_->setCurrentIndex(std::max(0, validation_->findData(validation)));
  }
  filling_ = false;
  update_choice();
}

void HubDatasetPanel::update_choice() {
  const HubDatasetChoice c = choice();
  if (c.train_files.isEmpty()) {
    size_->setText(info() ? tr("This split has no file to download.") : QString());
    use_->setEnabled(false);
    return;
  }
  const int files = int(c.train_files.size() + c.validation_files.size());
  QString text = c.bytes >= 0
                     ? tr("Download: %1 in %2")
                           .arg(human_bytes(std::uint64_t(c.bytes)),
                                count_text(files, tr("1 file"), tr("%1 files")))
                     : tr("Download: %1").arg(count_text(files, tr("1 file"), tr("%1 files")));
  if (c.from_parquet_conversion) text += tr(" (the Hub's Parquet conversion)");
  if (c.validation_split.isEmpty())
    text += tr("; validation: a share of the training rows (Validation split)");
  size_->setText(text);
  size_->setToolTip((c.train_files + c.validation_files).join("\n"));
  use_->setEnabled(true);
}

void HubDatasetPanel::request_preview() {
  ++preview_generation_;
  const QString config = config_->currentData().toString();
  const QString split = split_->currentData().toString();
  if (info() == nullptr || split.isEmpty()) {
    preview_running_ = false;
    update_busy();
    return;
  }
  const QString key = preview_key(shown_repo_, config, split);
  if (const auto it = previews_.constFind(key); it != previews_.constEnd()) {
    preview_running_ = false;
    show_preview(*it);
    return;
  }
  preview_running_ = true;
  rows_caption_->setText(tr("Reading the first rows of %1…").arg(split));
  update_busy();
  const int generation = preview_generation_;
  QtConcurrent::run(&pool_, [settings =
                                 hub_settings(token_ ? token_->keychain_token() : std::string()),
                             repo = shown_repo_.toStdString(), c = config.toStdString(),
                             s = split.toStdString()] {
    return preview_hub_rows(settings, repo, c, s, kPreviewRows);
  }).then(this, [this, generation, key](const HubRowsPreview& result) {
    // Rows, or a refusal that asking again would not change (Parquet without the viewer);
    // a failed request (offline, a token, a limit) is asked again next time.
    if (result.problem == HubProblem::None) previews_.insert(key, result);
    if (generation != preview_generation_) return;  // another split was chosen since
    preview_running_ = false;
    show_preview(result);
  });
}

void HubDatasetPanel::show_preview(const HubRowsPreview& p) {
  update_busy();
  if (!p.unavailable.isEmpty()) {
    rows_caption_->setText(tr("No preview of %1 before downloading.").arg(p.split));
    preview_message_->setText(p.unavailable);
    preview_stack_->setCurrentWidget(preview_message_);
    Q_EMIT previewShown();
    return;
  }
  rows_caption_->setText(
      (p.partial ? tr("The first %1 of %2, from %3.") : tr("All %1 of %2, from %3."))
          .arg(count_text(p.rows.size(), tr("1 row"), tr("%1 rows")), p.split,
               p.source == "dataset viewer" ? tr("the Hub's dataset viewer") : p.source));
  rows_->clear();
  rows_->setColumnCount(int(p.columns.size()));
  rows_->setRowCount(int(p.rows.size()));
  rows_->setHorizontalHeaderLabels(p.columns);
  for (int r = 0; r < p.rows.size(); ++r)
    for (int c = 0; c < p.rows[r].size() && c < p.columns.size(); ++c) {
      auto* item = new QTableWidgetItem(QString(p.rows[r][c]).replace('\n', " ⏎ "));
      item->setToolTip(p.rows[r][c].left(2000));
      rows_->setItem(r, c, item);
    }
  rows_->resizeColumnsToContents();
  for (int c = 0; c < rows_->columnCount(); ++c)
    rows_->setColumnWidth(c,
                          std::min(rows_->columnWidth(c), fontMetrics().averageCharWidth() * 50));
  preview_stack_->setCurrentWidget(rows_);
  Q_EMIT previewShown();
}

void HubDatasetPanel::request_card() {
  const QString repo = shown_repo_;
  if (repo.isEmpty() || card_->property("repo").toString() == repo) return;
  card_->setProperty("repo", repo);
  const QUrl page(hub_page_url(repo, hub::RepoType::Dataset));
  if (const auto it = cards_.constFind(repo); it != cards_.constEnd()) {
    card_->show_card(page, *it);
    Q_EMIT cardShown();
    return;
  }
  card_->show_note(tr("Loading the card of %1…").arg(repo));
  QtConcurrent::run(&pool_, [settings =
                                 hub_settings(token_ ? token_->keychain_token() : std::string()),
                             id = repo.toStdString()] {
    return fetch_card(settings, id, hub::RepoType::Dataset);
  }).then(this, [this, repo, page](const HubCard& result) {
    if (result.ok) cards_.insert(repo, result.markdown);
    if (card_->property("repo").toString() != repo) return;  // another dataset was chosen
    card_->show_card(page, result.markdown);
    Q_EMIT cardShown();
  });
}

}  // namespace tessera::ui
