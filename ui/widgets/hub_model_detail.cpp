#include "ui/widgets/hub_model_detail.h"

#include <QDesktopServices>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLocale>
#include <QPushButton>
#include <QShortcut>
#include <QStyle>
#include <QTabWidget>
#include <QTableWidget>
#include <QTextDocumentFragment>
#include <QUrl>
#include <QVBoxLayout>

#include "ui/models/hub_results_model.h"
#include "ui/models/model_info.h"
#include "ui/widgets/card_view.h"

namespace tessera::ui {

namespace {

QLabel* fact_label() {
  auto* label = new QLabel("—");
  label->setWordWrap(true);
  label->setTextInteractionFlags(Qt::TextSelectableByMouse);
  return label;
}

QString colored(const QString& text, const char* color) {
  return QString("<span style=\"color:%1\">%2</span>").arg(color, text.toHtmlEscaped());
}

constexpr const char* kGood = "#1e8c45";
constexpr const char* kWarn = "#b9770e";
constexpr const char* kBad = "#c0392b";

}  // namespace

HubModelDetail::HubModelDetail(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);

  auto* top = new QHBoxLayout;
  back_ = new QPushButton(style()->standardIcon(QStyle::SP_ArrowBack), tr("&Back to results"));
  back_->setToolTip(tr("Back to the search results (Esc)"));
  open_ = new QPushButton(tr("Open on the Hub"));
  open_->setToolTip(tr("The model's page on the Hub, in the browser"));
  download_ = new QPushButton(tr("&Download"));
  download_->setEnabled(false);
  top->addWidget(back_);
  top->addStretch(1);
  top->addWidget(open_);
  top->addWidget(download_);
  layout->addLayout(top);

  title_ = new QLabel;
  QFont f = title_->font();
  f.setPointSizeF(f.pointSizeF() * 1.3);
  f.setBold(true);
  title_->setFont(f);
  title_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  title_->setWordWrap(true);
  layout->addWidget(title_);
  support_ = fact_label();
  support_->setTextFormat(Qt::RichText);
  layout->addWidget(support_);

  auto* form = new QFormLayout;
  form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  form->setRowWrapPolicy(QFormLayout::DontWrapRows);
  license_ = fact_label();
  access_ = fact_label();
  size_ = fact_label();
  fit_ = fact_label();
  fit_->setTextFormat(Qt::RichText);
  popularity_ = fact_label();
  form->addRow(tr("License:"), license_);
  form->addRow(tr("Access:"), access_);
  form->addRow(tr("Download:"), size_);
  form->addRow(tr("Fits here:"), fit_);
  form->addRow(tr("On the Hub:"), popularity_);
  layout->addLayout(form);

  tabs_ = new QTabWidget;
  card_ = new CardView;
  card_->setAccessibleName(tr("Model card"));
  files_ = new QTableWidget(0, 2);
  files_->setAccessibleName(tr("Files Tessera would download"));
  files_->setHorizontalHeaderLabels({tr("File"), tr("Size")});
  files_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  files_->setSelectionBehavior(QAbstractItemView::SelectRows);
  files_->verticalHeader()->hide();
  files_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  files_->horizontalHeader()->setSectionResizeMode(1, QHeaderView::ResizeToContents);
  tabs_->addTab(card_, tr("Card"));
  tabs_->addTab(files_, tr("Files"));
  layout->addWidget(tabs_, 1);

  auto* escape = new QShortcut(QKeySequence(Qt::Key_Escape), this);
  escape->setContext(Qt::WidgetWithChildrenShortcut);
  auto* alt_left = new QShortcut(QKeySequence::Back, this);
  alt_left->setContext(Qt::WidgetWithChildrenShortcut);
  connect(escape, &QShortcut::activated, this, &HubModelDetail::backRequested);
  connect(alt_left, &QShortcut::activated, this, &HubModelDetail::backRequested);
  connect(back_, &QPushButton::clicked, this, &HubModelDetail::backRequested);
  connect(open_, &QPushButton::clicked, this, [this] {
    QDesktopServices::openUrl(QUrl(hub_page_url(repo_id_, hf::hub::RepoType::Model)));
  });
  connect(download_, &QPushButton::clicked, this, [this] { Q_EMIT downloadRequested(repo_id_); });
}

void HubModelDetail::show_model(const hf::hub::SearchHit& hit,
                                const std::optional<HubModelCheck>& check) {
  repo_id_ = QString::fromStdString(hit.id);
  title_->setText(repo_id_);
  const QString checking = tr("checking…");
  QString popularity =
      tr("%1 downloads · %2")
          .arg(human_downloads(hit.downloads), count_text(hit.likes, tr("1 like"), tr("%1 likes")));
  if (hit.last_modified.size() >= 10)
    popularity +=
        " · " + tr("updated %1").arg(QString::fromStdString(hit.last_modified.substr(0, 10)));
  if (!hit.pipeline_tag.empty()) popularity += " · " + QString::fromStdString(hit.pipeline_tag);
  popularity_->setText(popularity);

  QString license;
  for (const auto& t : hit.tags)
    if (t.starts_with("license:")) license = QString::fromStdString(t.substr(8));
  const QString gated = check ? check->gated : QString::fromStdString(hit.gated);
  if (check && !check->license.isEmpty()) license = check->license;
  license_->setText(license.isEmpty() ? (check ? tr("not stated") : checking) : license);
  access_->setText(gated.isEmpty() || gated == "false"
                       ? tr("open")
                       : tr("gated (%1 approval): accept its license on its Hub page with the "
                            "account of your token (Settings → Hugging Face token)")
                             .arg(gated == "auto" ? tr("automatic") : tr("manual")));

  files_->setRowCount(0);
  tabs_->setTabText(1, tr("Files"));
  download_->setEnabled(false);
  if (!check) {
    support_->setText(checking);
    size_->setText(checking);
    fit_->setText(checking);
    download_->setToolTip(tr("Waiting for the check of this model"));
    return;
  }
  const HubModelCheck& c = *check;
  if (c.failure.failed()) {
    support_->setText(colored(tr("Cannot check this model: %1").arg(c.failure.message), kBad) +
                      (c.failure.hint.isEmpty()
                           ? QString()
                           : "<br><i>" + c.failure.hint.toHtmlEscaped() + "</i>"));
    size_->setText("—");
    fit_->setText("—");
    download_->setToolTip(tr("The model could not be checked (see above)"));
    return;
  }
  if (c.support == HubModelCheck::Support::Unsupported) {
    support_->setText(
        colored(tr("✘ Tessera cannot train this model: %1").arg(c.support_reason), kBad) +
        (c.support_hint.isEmpty() ? QString()
                                  : "<br><i>" + c.support_hint.toHtmlEscaped() + "</i>"));
    download_->setToolTip(tr("Tessera cannot train this model (see above)"));
  } else {
    support_->setText(colored(tr("✔ Tessera can train it: %1").arg(c.support_reason), kGood));
    download_->setEnabled(true);
    download_->setToolTip(
        tr("Download %1 into the HuggingFace cache (the download tray shows progress)")
            .arg(repo_id_));
  }
  if (c.download_bytes >= 0) {
    int weights = 0;
    for (const auto& file : c.files) weights += file.path.ends_with(".safetensors") ? 1 : 0;
    size_->setText(
        tr("%1 in %2")
            .arg(human_bytes(std::uint64_t(c.download_bytes)),
                 count_text(std::int64_t(c.files.size()), tr("1 file"), tr("%1 files"))) +
        (weights > 0
             ? tr("; the weights: %1 in %2")
                   .arg(human_bytes(std::uint64_t(c.weights_bytes)),
                        count_text(weights, tr("1 safetensors file"), tr("%1 safetensors files")))
             : QString()) +
        tr(". Only what Tessera trains from: weights, config, tokenizer, chat template."));
  } else {
    size_->setText(tr("nothing: Tessera would not download it"));
  }
  const char* fit_color = c.fit == HubModelCheck::Fit::Fits                  ? kGood
                          : c.fit == HubModelCheck::Fit::FitsWithOtherMethod ? kWarn
                          : c.fit == HubModelCheck::Fit::TooLarge            ? kBad
                                                                             : nullptr;
  if (c.fit_text.isEmpty())
    fit_->setText(c.support == HubModelCheck::Support::Unsupported ? tr("— (not planned)") : "—");
  else
    fit_->setText((fit_color ? QString("<b>%1</b>").arg(colored(c.fit_text, fit_color))
                             : c.fit_text.toHtmlEscaped()) +
                  "<br>" + c.fit_detail.toHtmlEscaped());

  files_->setRowCount(int(c.files.size()));
  for (int r = 0; r < int(c.files.size()); ++r) {
    const auto& file = c.files[std::size_t(r)];
    files_->setItem(r, 0, new QTableWidgetItem(QString::fromStdString(file.path)));
    auto* size =
        new QTableWidgetItem(file.size >= 0 ? human_bytes(std::uint64_t(file.size)) : QString("?"));
    size->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    size->setToolTip(tr("%1 bytes").arg(QLocale().toString(qlonglong(file.size))));
    files_->setItem(r, 1, size);
  }
  tabs_->setTabText(1, tr("Files (%1)").arg(c.files.size()));
}

QString HubModelDetail::facts_text() const {
  const auto plain = [](const QLabel* l) {
    return QTextDocumentFragment::fromHtml(l->text()).toPlainText();
  };
  return title_->text() + "\n" + plain(support_) + "\nLicense: " + license_->text() +
         "\nAccess: " + access_->text() + "\nDownload: " + size_->text() +
         "\nFits here: " + plain(fit_) + "\nOn the Hub: " + popularity_->text();
}

}  // namespace tessera::ui
