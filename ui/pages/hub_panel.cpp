#include "ui/pages/hub_panel.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QRegularExpression>
#include <QSplitter>
#include <QStackedWidget>
#include <QTableView>
#include <QTextBrowser>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include "ui/models/hub_results_model.h"
#include "ui/models/model_info.h"
#include "ui/utility/hub_token.h"

namespace tessera::ui {

namespace hub = hf::hub;

HubPanel::HubPanel(HubToken* token, std::function<job::JobSpec()> spec, QWidget* parent)
    : QWidget(parent), token_(token), spec_(std::move(spec)) {
  checks_.setMaxThreadCount(4);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);

  auto* row = new QHBoxLayout;
  text_ = new QLineEdit;
  text_->setPlaceholderText(tr("Search the Hub: qwen, llama, smol…"));
  text_->setClearButtonEnabled(true);
  text_->setAccessibleName(tr("Hub search"));
  sort_ = new QComboBox;
  sort_->addItem(tr("Most downloaded"), "downloads");
  sort_->addItem(tr("Most liked"), "likes");
  sort_->addItem(tr("Recently updated"), "recent");
  sort_->setToolTip(tr("Order of the results"));
  go_ = new QPushButton(tr("&Search"));
  row->addWidget(text_, 1);
  row->addWidget(sort_);
  row->addWidget(go_);
  layout->addLayout(row);

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

  model_ = new HubResultsModel(this);
  table_ = new QTableView;
  table_->setModel(model_);
  table_->setAccessibleName(tr("Hub models"));
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->hide();
  table_->setWordWrap(false);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setSectionResizeMode(int(HubResultsModel::Column::Name),
                                                   QHeaderView::Stretch);
  stack_->addWidget(table_);

  auto* lower = new QWidget;
  auto* lower_layout = new QVBoxLayout(lower);
  lower_layout->setContentsMargins(0, 0, 0, 0);
  detail_ = new QLabel;
  detail_->setWordWrap(true);
  detail_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  lower_layout->addWidget(detail_);
  card_ = new QTextBrowser;
  card_->setAccessibleName(tr("Model card"));
  card_->setOpenExternalLinks(true);
  card_->setPlaceholderText(tr("The selected model's card (README.md) shows here."));
  lower_layout->addWidget(card_, 1);
  auto* split = new QSplitter(Qt::Vertical);
  split->addWidget(stack_);
  split->addWidget(lower);
  split->setChildrenCollapsible(false);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 2);
  layout->addWidget(split, 1);

  auto* bottom = new QHBoxLayout;
  status_ = new QLabel;
  more_ = new QPushButton(tr("&More results"));
  more_->setEnabled(false);
  download_ = new QPushButton(tr("&Download"));
  download_->setEnabled(false);
  download_->setToolTip(
      tr("Download the weights, config and tokenizer into the HuggingFace "
         "cache (the download tray shows progress; it can be paused)"));
  bottom->addWidget(status_, 1);
  bottom->addWidget(more_);
  bottom->addWidget(download_);
  layout->addLayout(bottom);

  show_state(HubProblem::None, tr("Search the Hugging Face Hub"),
             tr("Each result says whether Tessera can train it and whether it fits this "
                "machine for the method chosen in the wizard, from its config alone (no "
                "weights are downloaded to decide)."));

  connect(go_, &QPushButton::clicked, this, [this] { search(text_->text()); });
  connect(text_, &QLineEdit::returnPressed, this, [this] { search(text_->text()); });
  connect(sort_, &QComboBox::currentIndexChanged, this, [this] {
    if (!last_text_.isNull()) search(last_text_);
  });
  connect(more_, &QPushButton::clicked, this, &HubPanel::more);
  connect(table_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
          &HubPanel::update_selection);
  connect(model_, &QAbstractItemModel::dataChanged, this, &HubPanel::update_selection);
  connect(download_, &QPushButton::clicked, this, [this] {
    if (const QString repo = selected_repo(); !repo.isEmpty()) Q_EMIT downloadRequested(repo);
  });
  connect(&search_watcher_, &QFutureWatcher<HubSearchResult>::finished, this, [this] {
    const HubSearchResult result = search_watcher_.result();
    searching_ = false;
    go_->setEnabled(true);
    if (result.failure.failed()) {
      show_failure(result.failure);
      if (appending_) {
        // A later page failed: keep what was found, say why there is no more.
        stack_->setCurrentIndex(1);
        status_->setText(result.failure.message);
      }
      more_->setEnabled(false);
      Q_EMIT searched();
      return;
    }
    next_page_url_ = result.next_page_url;
    model_->append(result.hits);
    more_->setEnabled(!next_page_url_.empty());
    if (model_->rowCount() == 0) {
      show_state(HubProblem::None, tr("No models match \"%1\"").arg(last_text_),
                 tr("Try a shorter name or part of it (\"qwen\", \"llama\"); the Hub matches "
                    "the text anywhere in the id."));
    } else {
      stack_->setCurrentIndex(1);
      state_problem_ = HubProblem::None;
      if (!appending_ && !table_->selectionModel()->hasSelection()) table_->selectRow(0);
    }
    check_rows(result.hits);
    Q_EMIT searched();
  });
}

HubPanel::~HubPanel() {
  ++generation_;
  checks_.clear();
  checks_.waitForDone();
  search_watcher_.waitForFinished();
}

bool HubPanel::busy() const {
  return searching_ || running_checks_ > 0;
}

void HubPanel::search(const QString& text) {
  last_text_ = text.trimmed();
  hub::SearchQuery query;
  query.text = last_text_.toStdString();
  query.sort = sort_->currentData().toString().toStdString();
  query.limit = page_size_;
  query.filters = {};
  start_search(query, /*append=*/false);
}

void HubPanel::more() {
  if (next_page_url_.empty()) return;
  hub::SearchQuery query;
  query.limit = page_size_;
  query.page_url = next_page_url_;
  start_search(query, /*append=*/true);
}

void HubPanel::start_search(const hub::SearchQuery& query, bool append) {
  ++generation_;
  running_checks_ = 0;
  appending_ = append;
  if (!append) {
    model_->clear();
    next_page_url_.clear();
    detail_->clear();
  }
  checked_method_ = spec_ ? QString::fromStdString(spec_().method.type) : QString();
  model_->set_fit_heading(checked_method_);
  searching_ = true;
  go_->setEnabled(false);
  more_->setEnabled(false);
  status_->setText(append ? tr("Loading more…") : tr("Searching…"));
  search_watcher_.setFuture(
      QtConcurrent::run([settings = hub_settings(token_ ? token_->keychain_token() : std::string()),
                         query] { return search_hub(settings, query); }));
}

void HubPanel::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  // The wizard's method changed since the badges were planned: plan them again.
  const QString method = spec_ ? QString::fromStdString(spec_().method.type) : QString();
  if (method == checked_method_ || model_->rowCount() == 0 || searching_) return;
  ++generation_;
  running_checks_ = 0;
  checked_method_ = method;
  model_->set_fit_heading(method);
  model_->reset_checks();
  std::vector<hub::SearchHit> hits;
  for (const auto& r : model_->rows()) hits.push_back(r.hit);
  check_rows(hits);
}

void HubPanel::check_rows(const std::vector<hub::SearchHit>& hits) {
  const hub::Settings settings = hub_settings(token_ ? token_->keychain_token() : std::string());
  const job::JobSpec spec = spec_ ? spec_() : job::JobSpec{};
  const int generation = generation_;
  for (const auto& hit : hits) {
    ++running_checks_;
    QtConcurrent::run(&checks_, [settings, spec, id = hit.id] {
      return check_hub_model(settings, id, spec);
    }).then(this, [this, generation](const HubModelCheck& check) {
      if (generation != generation_) return;
      --running_checks_;
      model_->set_check(check);
      const int pending = model_->pending_checks();
      status_->setText(pending > 0
                           ? tr("%n result(s), checking %1…", "", model_->rowCount()).arg(pending)
                           : tr("%n result(s)", "", model_->rowCount()));
      Q_EMIT checked();
    });
  }
  status_->setText(tr("%n result(s), checking…", "", model_->rowCount()));
}

void HubPanel::show_state(HubProblem problem, const QString& title, const QString& detail) {
  state_problem_ = problem;
  state_title_->setText(title);
  state_detail_->setText(detail);
  stack_->setCurrentIndex(0);
  status_->clear();
  download_->setEnabled(false);
}

void HubPanel::show_failure(const HubFailure& f) {
  const QString technical = f.message + (f.hint.isEmpty() ? "" : "\n" + f.hint);
  switch (f.problem) {
    case HubProblem::Offline:
      show_state(f.problem, tr("Offline: HF_HUB_OFFLINE is set"),
                 tr("The Hub is not contacted. Models already downloaded are listed under "
                    "\"This machine\". Unset HF_HUB_OFFLINE and restart the studio to search."));
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
      show_state(f.problem, tr("Access to this model is gated"),
                 tr("Accept its license on the model's Hub page with the account of your "
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
                    "Downloaded models are still listed under \"This machine\".\n\n%1")
                     .arg(technical));
      return;
    default:
      show_state(f.problem, tr("The search failed"), technical);
  }
}

QString HubPanel::state_text() const {
  if (stack_->currentIndex() != 0) return {};
  return state_title_->text() + "\n" + state_detail_->text();
}

QString HubPanel::selected_repo() const {
  const QModelIndexList rows = table_->selectionModel()->selectedRows();
  if (rows.isEmpty()) return {};
  return model_->data(rows.front(), HubResultsModel::RepoIdRole).toString();
}

void HubPanel::select_repo(const QString& repo_id) {
  const int row = model_->row_of(repo_id);
  if (row >= 0) table_->selectRow(row);
}

void HubPanel::update_selection() {
  const int row = model_->row_of(selected_repo());
  if (row < 0) {
    download_->setEnabled(false);
    detail_->clear();
    card_->clear();
    return;
  }
  const HubResultsModel::Row& r = model_->rows()[row];
  show_card(QString::fromStdString(r.hit.id));
  QString text = "<b>" + QString::fromStdString(r.hit.id).toHtmlEscaped() + "</b>";
  if (!r.check) {
    download_->setEnabled(false);
    detail_->setText(text + " — " + tr("checking…"));
    return;
  }
  const HubModelCheck& c = *r.check;
  if (c.failure.failed()) {
    text += "<br>" + c.failure.message.toHtmlEscaped();
    if (!c.failure.hint.isEmpty()) text += "<br><i>" + c.failure.hint.toHtmlEscaped() + "</i>";
  } else if (c.support == HubModelCheck::Support::Unsupported) {
    text +=
        "<br>" + tr("Tessera cannot train this model: %1").arg(c.support_reason.toHtmlEscaped());
    if (!c.support_hint.isEmpty()) text += "<br><i>" + c.support_hint.toHtmlEscaped() + "</i>";
  } else {
    text += " · " + c.support_reason.toHtmlEscaped();
    if (c.download_bytes >= 0)
      text += " · " + tr("%1 to download").arg(human_bytes(std::uint64_t(c.download_bytes)));
    if (!c.fit_detail.isEmpty()) text += "<br>" + c.fit_detail.toHtmlEscaped();
  }
  detail_->setText(text);
  const bool ok = !c.failure.failed() && c.support == HubModelCheck::Support::Supported;
  download_->setEnabled(ok);
  download_->setToolTip(
      ok ? tr("Download %1 into the HuggingFace cache").arg(QString::fromStdString(r.hit.id))
         : tr("Tessera cannot train this model (see above)"));
}

void HubPanel::show_card(const QString& repo_id) {
  if (card_->property("repo").toString() == repo_id && cards_.contains(repo_id)) return;
  card_->setProperty("repo", repo_id);
  if (const auto it = cards_.constFind(repo_id); it != cards_.constEnd()) {
    card_->setMarkdown(*it);
    Q_EMIT cardShown();
    return;
  }
  card_->setPlainText(tr("Loading the card of %1…").arg(repo_id));
  QtConcurrent::run(
      &checks_,
      [settings = hub_settings(token_ ? token_->keychain_token() : std::string()),
       id = repo_id.toStdString()]() -> std::pair<bool, QString> {
        try {
          hub::Client client(settings);
          const std::optional<std::string> card = client.card(id, hub::RepoType::Model, "main");
          if (!card) return {true, QObject::tr("*This repository has no model card.*")};
          // The YAML header (license, tags) is metadata, not prose.
          QString text = QString::fromStdString(*card);
          static const QRegularExpression front(R"(\A---\r?\n.*?\r?\n---\r?\n)",
                                                QRegularExpression::DotMatchesEverythingOption);
          return {true, text.remove(front)};
        } catch (const std::exception& e) {
          // Not kept: the next selection asks again (offline, rate limited, …).
          return {false, QObject::tr("*The card could not be read:* %1")
                             .arg(QString::fromStdString(e.what()).toHtmlEscaped())};
        }
      })
      .then(this, [this, repo_id](const std::pair<bool, QString>& result) {
        const auto& [ok, markdown] = result;
        if (ok) cards_.insert(repo_id, markdown);
        if (card_->property("repo").toString() != repo_id) return;  // another row was chosen
        card_->setMarkdown(markdown);
        Q_EMIT cardShown();
      });
}

}  // namespace tessera::ui
