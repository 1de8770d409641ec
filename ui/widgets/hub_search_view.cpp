#include "ui/widgets/hub_search_view.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QStackedWidget>
#include <QTableView>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include "ui/models/hub_hits_model.h"
#include "ui/utility/hub_token.h"
#include "ui/widgets/elided_label.h"

namespace tessera::ui {

namespace hub = hf::hub;

// The narrowest a filter and the sort get, in characters ("Any task", "Most liked").
constexpr int kFilterChars = 8;
constexpr int kSortChars = 12;

QString results_text(int rows) {
  return count_text(rows, QObject::tr("1 result"), QObject::tr("%1 results"));
}

HubSearchView::HubSearchView(hub::RepoType type, HubToken* token, HubHitsModel* results,
                             HubSearchTexts texts, QWidget* parent)
    : QWidget(parent), type_(type), token_(token), model_(results), texts_(std::move(texts)) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);

  // The text, the order and Search; the filters under them (two short rows, so the panel
  // stays narrow enough for a small screen).
  auto* row = new QHBoxLayout;
  text_ = new QLineEdit;
  text_->setPlaceholderText(texts_.placeholder);
  text_->setClearButtonEnabled(true);
  text_->setAccessibleName(tr("Hub search"));
  go_ = new QPushButton(tr("&Search"));
  sort_ = new QComboBox;
  sort_->addItem(tr("Most downloaded"), "downloads");
  sort_->addItem(tr("Most liked"), "likes");
  sort_->addItem(tr("Recently updated"), "recent");
  sort_->setToolTip(tr("Order of the results"));
  sort_->setAccessibleName(tr("Sort"));
  // Narrow panels shrink the combos to a few characters each; wide ones share the row evenly.
  sort_->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  sort_->setMinimumContentsLength(kSortChars);
  row->addWidget(text_, 1);
  row->addWidget(sort_);
  row->addWidget(go_);
  layout->addLayout(row);
  filter_row_ = new QHBoxLayout;
  layout->addLayout(filter_row_);

  stack_ = new QStackedWidget;
  auto* state = new QWidget;
  auto* state_layout = new QVBoxLayout(state);
  state_title_ = new QLabel;
  QFont f = state_title_->font();
  f.setPointSizeF(f.pointSizeF() * 1.2);
  f.setBold(true);
  state_title_->setFont(f);
  state_title_->setWordWrap(true);
  state_title_->setAlignment(Qt::AlignCenter);
  state_detail_ = new QLabel;
  state_detail_->setWordWrap(true);
  state_detail_->setAlignment(Qt::AlignCenter);
  state_detail_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  state_layout->addStretch(1);
  state_layout->addWidget(state_title_);
  state_layout->addWidget(state_detail_);
  state_layout->addStretch(2);
  stack_->addWidget(state);

  table_ = new QTableView;
  table_->setModel(model_);
  table_->setAccessibleName(texts_.table_name);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->hide();
  table_->setWordWrap(false);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);  // the name
  stack_->addWidget(table_);
  layout->addWidget(stack_, 1);

  footer_ = new QVBoxLayout;
  footer_->setContentsMargins(0, 0, 0, 0);
  layout->addLayout(footer_);

  buttons_ = new QHBoxLayout;
  status_ = new ElidedLabel(Qt::ElideRight);
  more_ = new QPushButton(tr("&More results"));
  more_->setEnabled(false);
  buttons_->addWidget(status_, 1);
  buttons_->addWidget(more_);
  layout->addLayout(buttons_);

  show_state(HubProblem::None, texts_.intro_title, texts_.intro_detail);

  connect(go_, &QPushButton::clicked, this, [this] { search(text_->text()); });
  connect(text_, &QLineEdit::returnPressed, this, [this] { search(text_->text()); });
  connect(sort_, &QComboBox::currentIndexChanged, this, &HubSearchView::search_again);
  connect(more_, &QPushButton::clicked, this, &HubSearchView::more);
  connect(table_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
          &HubSearchView::selectionChanged);
  connect(table_, &QAbstractItemView::activated, this, [this](const QModelIndex& index) {
    Q_EMIT activated(model_->data(index, HubHitsModel::RepoIdRole).toString());
  });
  connect(&watcher_, &QFutureWatcher<HubSearchResult>::finished, this, [this] {
    const HubSearchResult result = watcher_.result();
    searching_ = false;
    go_->setEnabled(true);
    if (result.failure.failed()) {
      if (appending_) {
        // A later page failed: keep what was found, say why there is no more.
        stack_->setCurrentIndex(1);
        state_problem_ = result.failure.problem;
        status_->set_full_text(result.failure.message);
      } else {
        show_failure(result.failure);
      }
      more_->setEnabled(false);
      Q_EMIT pageLoaded({});
      Q_EMIT searched();
      return;
    }
    next_page_url_ = result.next_page_url;
    model_->append(result.hits);
    more_->setEnabled(!next_page_url_.empty());
    if (model_->rowCount() == 0) {
      show_state(HubProblem::None, texts_.no_results.arg(last_text_), texts_.no_results_hint);
    } else {
      stack_->setCurrentIndex(1);
      state_problem_ = HubProblem::None;
      status_->set_full_text(results_text(model_->rowCount()));
      if (!appending_ && !table_->selectionModel()->hasSelection()) table_->selectRow(0);
    }
    Q_EMIT pageLoaded(result.hits);
    Q_EMIT searched();
  });
}

HubSearchView::~HubSearchView() {
  watcher_.waitForFinished();
}

QComboBox* HubSearchView::add_filter(const QString& name, const QString& any,
                                     const QList<HubFilterChoice>& choices) {
  auto* combo = new QComboBox;
  combo->addItem(any, QString());
  for (const HubFilterChoice& c : choices) combo->addItem(c.label, c.tag);
  combo->setAccessibleName(name);
  combo->setToolTip(tr("Only results with this %1 (a Hub tag)").arg(name.toLower()));
  combo->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  combo->setMinimumContentsLength(kFilterChars);
  filter_row_->insertWidget(int(filters_.size()), combo, 1);
  filters_.insert(name, combo);
  connect(combo, &QComboBox::currentIndexChanged, this, &HubSearchView::search_again);
  return combo;
}

void HubSearchView::add_button(QPushButton* button) {
  buttons_->addWidget(button);
}

void HubSearchView::add_footer(QWidget* widget) {
  footer_->addWidget(widget);
}

std::vector<std::string> HubSearchView::filters() const {
  std::vector<std::string> tags;
  // In the order they were added (QMap orders by name; the Hub does not care, a test might).
  for (int i = 0; i < filter_row_->count(); ++i) {
    auto* combo = qobject_cast<QComboBox*>(filter_row_->itemAt(i)->widget());
    if (combo == nullptr) continue;
    const QString tag = combo->currentData().toString();
    if (!tag.isEmpty()) tags.push_back(tag.toStdString());
  }
  return tags;
}

void HubSearchView::search_again() {
  // Before the first search a filter only prepares it; afterwards it searches the text shown.
  if (searched_once_) search(text_->text());
}

void HubSearchView::search(const QString& text) {
  last_text_ = text.trimmed();
  if (text_->text() != text) text_->setText(text);
  searched_once_ = true;
  hub::SearchQuery query;
  query.type = type_;
  query.text = last_text_.toStdString();
  query.sort = sort_->currentData().toString().toStdString();
  query.limit = page_size_;
  query.filters = filters();
  start_search(query, /*append=*/false);
}

void HubSearchView::more() {
  if (next_page_url_.empty()) return;
  hub::SearchQuery query;
  query.type = type_;
  query.limit = page_size_;
  query.page_url = next_page_url_;
  start_search(query, /*append=*/true);
}

void HubSearchView::start_search(const hub::SearchQuery& query, bool append) {
  appending_ = append;
  if (!append) {
    model_->clear();
    next_page_url_.clear();
  }
  searching_ = true;
  go_->setEnabled(false);
  more_->setEnabled(false);
  status_->set_full_text(append ? tr("Loading more…") : tr("Searching…"));
  Q_EMIT searchStarted(append);
  // A search still running is dropped: the watcher follows the new one only.
  watcher_.setFuture(
      QtConcurrent::run([settings = hub_settings(token_ ? token_->keychain_token() : std::string()),
                         query] { return search_hub(settings, query); }));
}

void HubSearchView::set_status(const QString& text) {
  status_->set_full_text(text);
}

bool HubSearchView::showing_results() const {
  return stack_->currentIndex() == 1;
}

void HubSearchView::show_state(HubProblem problem, const QString& title, const QString& detail) {
  state_problem_ = problem;
  state_title_->setText(title);
  state_detail_->setText(detail);
  stack_->setCurrentIndex(0);
  status_->set_full_text(QString());
}

void HubSearchView::show_failure(const HubFailure& f) {
  const QString technical = f.message + (f.hint.isEmpty() ? "" : "\n" + f.hint);
  switch (f.problem) {
    case HubProblem::Offline:
      show_state(f.problem, tr("Offline: HF_HUB_OFFLINE is set"),
                 tr("The Hub is not contacted. %1 Unset HF_HUB_OFFLINE and restart the studio "
                    "to search.")
                     .arg(texts_.local_note));
      return;
    case HubProblem::TokenRejected:
      show_state(f.problem, tr("The Hub rejected the token"),
                 tr("The token may have been revoked or mistyped. Replace it in Settings → "
                    "Hugging Face token (or HF_TOKEN).\n\n%1")
                     .arg(technical));
      return;
    case HubProblem::NeedsToken:
      show_state(f.problem, tr("The Hub asks for a token"),
                 tr("Add a token from your Hugging Face account in Settings → Hugging Face "
                    "token.\n\n%1")
                     .arg(technical));
      return;
    case HubProblem::Gated:
      show_state(f.problem, tr("Access is gated"),
                 tr("Accept the license on the repository's Hub page with the account of your "
                    "token, then search again.\n\n%1")
                     .arg(technical));
      return;
    case HubProblem::RateLimited:
      show_state(f.problem, tr("The Hub is rate-limiting these requests"),
                 tr("Wait a few minutes and search again; a token (Settings) raises the "
                    "limit.\n\n%1")
                     .arg(technical));
      return;
    case HubProblem::Unreachable:
      show_state(f.problem, tr("Cannot reach the Hub"),
                 tr("Check the network connection (and HF_ENDPOINT if you use a mirror). "
                    "%1\n\n%2")
                     .arg(texts_.local_note, technical));
      return;
    default:
      show_state(f.problem, tr("The search failed"), technical);
  }
}

QString HubSearchView::state_text() const {
  if (stack_->currentIndex() != 0) return {};
  return state_title_->text() + "\n" + state_detail_->text();
}

QString HubSearchView::selected_repo() const {
  const QModelIndexList rows = table_->selectionModel()->selectedRows();
  if (rows.isEmpty()) return {};
  return model_->data(rows.front(), HubHitsModel::RepoIdRole).toString();
}

void HubSearchView::select_repo(const QString& repo_id) {
  const int row = model_->row_of(repo_id);
  if (row >= 0) table_->selectRow(row);
}

}  // namespace tessera::ui
