#include "ui/pages/hub_panel.h"

#include <QComboBox>
#include <QLabel>
#include <QPushButton>
#include <QStackedWidget>
#include <QTableView>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include "ui/models/hub_results_model.h"
#include "ui/models/model_info.h"
#include "ui/utility/hub_token.h"
#include "ui/widgets/card_view.h"
#include "ui/widgets/hub_model_detail.h"
#include "ui/widgets/hub_search_view.h"

namespace tessera::ui {

namespace hub = hf::hub;

HubPanel::HubPanel(HubToken* token, std::function<job::JobSpec()> spec, QWidget* parent)
    : QWidget(parent), token_(token), spec_(std::move(spec)) {
  checks_.setMaxThreadCount(4);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);

  model_ = new HubResultsModel(this);
  HubSearchTexts texts;
  texts.placeholder = tr("Search the Hub: qwen, llama, smol…");
  texts.table_name = tr("Hub models");
  texts.intro_title = tr("Search the Hugging Face Hub");
  texts.intro_detail =
      tr("Each result says whether Tessera can train it and whether it fits this machine for the "
         "method chosen in the wizard, from its config alone (no weights are downloaded to "
         "decide).");
  texts.no_results = tr("No models match \"%1\"");
  texts.no_results_hint =
      tr("Try a shorter name or part of it (\"qwen\", \"llama\"), or another task, library or "
         "license; the Hub matches the text anywhere in the id.");
  texts.local_note = tr("Models already downloaded are listed under \"This machine\".");
  search_ = new HubSearchView(hub::RepoType::Model, token, model_, texts);
  // Pipeline tags: what a model does. Tessera fine-tunes causal language models (text
  // generation); the others find the checkpoints they start from or are for comparison.
  search_->add_filter(tr("Task"), tr("Any task"),
                      {{tr("Text generation"), "text-generation"},
                       {tr("Text-to-text generation"), "text2text-generation"},
                       {tr("Text classification"), "text-classification"},
                       {tr("Token classification"), "token-classification"},
                       {tr("Question answering"), "question-answering"},
                       {tr("Summarization"), "summarization"},
                       {tr("Translation"), "translation"},
                       {tr("Fill-mask"), "fill-mask"},
                       {tr("Feature extraction"), "feature-extraction"},
                       {tr("Sentence similarity"), "sentence-similarity"}});
  search_->add_filter(tr("Library"), tr("Any library"),
                      {{tr("Transformers"), "transformers"},
                       {tr("Safetensors weights"), "safetensors"},
                       {tr("PEFT adapters"), "peft"},
                       {tr("Sentence Transformers"), "sentence-transformers"}});
  search_->add_filter(tr("License"), tr("Any license"),
                      {{"Apache 2.0", "license:apache-2.0"},
                       {"MIT", "license:mit"},
                       {"BSD 3-clause", "license:bsd-3-clause"},
                       {"CC BY 4.0", "license:cc-by-4.0"},
                       {"CC BY-SA 4.0", "license:cc-by-sa-4.0"},
                       {"CC BY-NC 4.0", "license:cc-by-nc-4.0"},
                       {"OpenRAIL", "license:openrail"},
                       {"Llama 3.1", "license:llama3.1"},
                       {"Llama 3.2", "license:llama3.2"},
                       {"Gemma", "license:gemma"},
                       {tr("Other"), "license:other"}});
  summary_ = new QLabel;
  summary_->setWordWrap(true);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  search_->add_footer(summary_);
  details_ = new QPushButton(tr("De&tails"));
  details_->setEnabled(false);
  details_->setToolTip(tr("The selected model's card, files and fit (or double-click it)"));
  download_ = new QPushButton(tr("&Download"));
  download_->setEnabled(false);
  download_->setToolTip(
      tr("Download the weights, config and tokenizer into the HuggingFace "
         "cache (the download tray shows progress; it can be paused)"));
  search_->add_button(details_);
  search_->add_button(download_);

  detail_ = new HubModelDetail;
  pages_ = new QStackedWidget;
  pages_->addWidget(search_);
  pages_->addWidget(detail_);
  layout->addWidget(pages_, 1);

  connect(search_, &HubSearchView::searchStarted, this, [this](bool append) {
    if (append) return;  // the rows shown keep their checks
    // A new search: checks of the old rows not started yet are dropped, the others ignored.
    ++generation_;
    running_checks_ = 0;
    checks_.clear();
    checked_method_ = spec_ ? QString::fromStdString(spec_().method.type) : QString();
    model_->set_fit_heading(checked_method_);
    show_results();
    update_selection();
  });
  connect(search_, &HubSearchView::pageLoaded, this, [this](const auto& hits) {
    if (!hits.empty()) check_rows(hits);
  });
  connect(search_, &HubSearchView::searched, this, [this] {
    update_selection();
    Q_EMIT searched();
  });
  connect(search_, &HubSearchView::selectionChanged, this, &HubPanel::update_selection);
  connect(search_, &HubSearchView::activated, this, &HubPanel::show_details);
  connect(model_, &QAbstractItemModel::dataChanged, this, [this] {
    update_selection();
    update_detail();
  });
  connect(details_, &QPushButton::clicked, this, [this] { show_details(selected_repo()); });
  connect(download_, &QPushButton::clicked, this, [this] {
    if (const QString repo = selected_repo(); !repo.isEmpty()) Q_EMIT downloadRequested(repo);
  });
  connect(detail_, &HubModelDetail::backRequested, this, &HubPanel::show_results);
  connect(detail_, &HubModelDetail::downloadRequested, this, &HubPanel::downloadRequested);
}

HubPanel::~HubPanel() {
  ++generation_;
  checks_.clear();
  checks_.waitForDone();
}

bool HubPanel::busy() const {
  return search_->searching() || running_checks_ > 0;
}

void HubPanel::search(const QString& text) {
  search_->search(text);
}

void HubPanel::more() {
  search_->more();
}

void HubPanel::set_page_size(int n) {
  search_->set_page_size(n);
}

QTableView* HubPanel::table() const {
  return search_->table();
}

QLineEdit* HubPanel::search_edit() const {
  return search_->search_edit();
}

QComboBox* HubPanel::sort_combo() const {
  return search_->sort_combo();
}

QComboBox* HubPanel::filter_combo(const QString& name) const {
  return search_->filter_combo(name);
}

QPushButton* HubPanel::more_button() const {
  return search_->more_button();
}

CardView* HubPanel::card_view() const {
  return detail_->card_view();
}

QString HubPanel::state_text() const {
  return search_->state_text();
}

HubProblem HubPanel::state_problem() const {
  return search_->state_problem();
}

QString HubPanel::selected_repo() const {
  return search_->selected_repo();
}

void HubPanel::select_repo(const QString& repo_id) {
  search_->select_repo(repo_id);
}

bool HubPanel::show_details(const QString& repo_id) {
  if (model_->row_of(repo_id) < 0) return false;
  if (selected_repo() != repo_id) select_repo(repo_id);
  detail_->setProperty("repo", repo_id);
  update_detail();
  pages_->setCurrentWidget(detail_);
  detail_->back_button()->setFocus();
  show_card(repo_id);
  return true;
}

void HubPanel::show_results() {
  if (pages_->currentWidget() == search_) return;
  pages_->setCurrentWidget(search_);
  search_->table()->setFocus();
}

bool HubPanel::details_shown() const {
  return pages_->currentWidget() == detail_;
}

void HubPanel::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  // The wizard's method changed since the badges were planned: plan them again.
  const QString method = spec_ ? QString::fromStdString(spec_().method.type) : QString();
  if (method == checked_method_ || model_->rowCount() == 0 || search_->searching()) return;
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
      search_->set_status(
          pending > 0 ? tr("%1, checking %2…").arg(results_text(model_->rowCount())).arg(pending)
                      : results_text(model_->rowCount()));
      Q_EMIT checked();
    });
  }
  search_->set_status(tr("%1, checking…").arg(results_text(model_->rowCount())));
}

void HubPanel::update_selection() {
  const int row = model_->row_of(selected_repo());
  details_->setEnabled(row >= 0);
  if (row < 0) {
    download_->setEnabled(false);
    summary_->clear();
    return;
  }
  const HubResultsModel::Row& r = model_->rows()[row];
  QString text = "<b>" + QString::fromStdString(r.hit.id).toHtmlEscaped() + "</b>";
  if (!r.check) {
    download_->setEnabled(false);
    summary_->setText(text + " — " + tr("checking…"));
    return;
  }
  const HubModelCheck& c = *r.check;
  if (c.failure.failed()) {
    text += " — " + c.failure.message.toHtmlEscaped();
  } else if (c.support == HubModelCheck::Support::Unsupported) {
    text += " — " + tr("Tessera cannot train it: %1").arg(c.support_reason.toHtmlEscaped());
  } else {
    text += " · " + c.support_reason.toHtmlEscaped();
    if (c.download_bytes >= 0)
      text += " · " + tr("%1 to download").arg(human_bytes(std::uint64_t(c.download_bytes)));
    if (!c.fit_text.isEmpty()) text += " · " + c.fit_text.toHtmlEscaped();
  }
  summary_->setText(text);
  const bool ok = !c.failure.failed() && c.support == HubModelCheck::Support::Supported;
  download_->setEnabled(ok);
  download_->setToolTip(
      ok ? tr("Download %1 into the HuggingFace cache").arg(QString::fromStdString(r.hit.id))
         : tr("Tessera cannot train this model (Details says why)"));
}

void HubPanel::update_detail() {
  const QString repo = detail_->property("repo").toString();
  if (repo.isEmpty()) return;
  const int row = model_->row_of(repo);
  if (row < 0) {  // a new search replaced it
    detail_->setProperty("repo", QString());
    show_results();
    return;
  }
  const HubResultsModel::Row& r = model_->rows()[row];
  detail_->show_model(r.hit, r.check);
}

void HubPanel::show_card(const QString& repo_id) {
  CardView* card = detail_->card_view();
  const QUrl page(hub_page_url(repo_id, hub::RepoType::Model));
  if (const auto it = cards_.constFind(repo_id); it != cards_.constEnd()) {
    card->setProperty("repo", repo_id);
    card->show_card(page, *it);
    Q_EMIT cardShown();
    return;
  }
  card->setProperty("repo", repo_id);
  card->show_note(tr("Loading the card of %1…").arg(repo_id));
  QtConcurrent::run(&checks_, [settings =
                                   hub_settings(token_ ? token_->keychain_token() : std::string()),
                               id = repo_id.toStdString()] {
    return fetch_card(settings, id, hub::RepoType::Model);
  }).then(this, [this, repo_id, page](const HubCard& result) {
    if (result.ok) cards_.insert(repo_id, result.markdown);
    CardView* view = detail_->card_view();
    if (view->property("repo").toString() != repo_id) return;  // another model was opened
    view->show_card(page, result.markdown);
    Q_EMIT cardShown();
  });
}

}  // namespace tessera::ui
