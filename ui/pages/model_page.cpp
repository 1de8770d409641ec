#include <QFileDialog>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QPushButton>
#include <QStyle>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include "ui/pages/wizard.h"
#include "ui/utility/studio_settings.h"

namespace tessera::ui {

ModelPage::ModelPage(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  auto* intro =
      new QLabel(tr("Choose the model to fine-tune: a folder on this machine, or a "
                    "model already in the HuggingFace cache."));
  intro->setWordWrap(true);
  layout->addWidget(intro);

  auto* row = new QHBoxLayout;
  path_ = new QLineEdit;
  path_->setPlaceholderText(tr("A model folder (config.json, *.safetensors, tokenizer.json)"));
  path_->setClearButtonEnabled(true);
  auto* browse = new QPushButton(tr("&Choose folder…"));
  row->addWidget(new QLabel(tr("Fo&lder:")));
  static_cast<QLabel*>(row->itemAt(0)->widget())->setBuddy(path_);
  row->addWidget(path_, 1);
  row->addWidget(browse);
  layout->addLayout(row);

  auto* columns = new QHBoxLayout;
  auto* cache_box = new QGroupBox(tr("In the HuggingFace cache"));
  auto* cache_layout = new QVBoxLayout(cache_box);
  cache_list_ = new QListWidget;
  cache_list_->setAccessibleName(tr("Cached models"));
  cache_status_ = new QLabel;
  cache_status_->setWordWrap(true);
  auto* rescan = new QPushButton(tr("&Rescan"));
  cache_layout->addWidget(cache_list_, 1);
  cache_layout->addWidget(cache_status_);
  cache_layout->addWidget(rescan, 0, Qt::AlignRight);
  columns->addWidget(cache_box, 1);

  auto* summary_box = new QGroupBox(tr("Summary"));
  auto* summary_layout = new QVBoxLayout(summary_box);
  verdict_ = new QLabel(tr("No model chosen yet."));
  verdict_->setWordWrap(true);
  verdict_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  summary_layout->addWidget(verdict_);
  auto* form = new QFormLayout;
  for (const char* key : {"Architecture", "Parameters", "Dtype", "Size on disk", "Context length",
                          "Chat template", "Tokenizer", "Folder"}) {
    auto* value = new QLabel("—");
    value->setTextInteractionFlags(Qt::TextSelectableByMouse);
    value->setWordWrap(true);
    form->addRow(tr(key) + ":", value);
    fields_.insert(key, value);
  }
  summary_layout->addLayout(form);
  summary_layout->addStretch(1);
  columns->addWidget(summary_box, 1);
  layout->addLayout(columns, 1);

  connect(browse, &QPushButton::clicked, this, [this] {
    QString dir =
        QFileDialog::getExistingDirectory(this, tr("Model folder"), settings::last_folder("model"));
    if (dir.isEmpty()) return;
    settings::set_last_folder("model", dir);
    choose_folder(dir);
  });
  connect(path_, &QLineEdit::returnPressed, this, [this] { choose_folder(path_->text()); });
  connect(cache_list_, &QListWidget::currentItemChanged, this, [this](QListWidgetItem* item) {
    if (item) choose_folder(item->data(Qt::UserRole).toString());
  });
  connect(rescan, &QPushButton::clicked, this, &ModelPage::rescan_cache);
  connect(&watcher_, &QFutureWatcher<ModelSummary>::finished, this, [this] {
    ModelSummary result = watcher_.result();
    if (result.folder != requested_) return;  // a newer choice is being checked
    summary_ = result;
    show_summary();
    Q_EMIT modelChanged();
  });
  connect(&cache_watcher_, &QFutureWatcher<QList<CachedModel>>::finished, this, [this] {
    const auto models = cache_watcher_.result();
    cache_list_->clear();
    for (const CachedModel& m : models) {
      auto* item = new QListWidgetItem(m.repo_id + "  @" + m.revision.left(8) +
                                       (m.is_main ? tr("  (main)") : QString()));
      item->setData(Qt::UserRole, m.folder);
      item->setToolTip(m.folder);
      cache_list_->addItem(item);
    }
    cache_status_->setText(models.isEmpty() ? tr("No model in %1.").arg(hf_hub_cache_dir())
                           : models.size() == 1
                               ? tr("1 model in %1.").arg(hf_hub_cache_dir())
                               : tr("%1 models in %2.").arg(models.size()).arg(hf_hub_cache_dir()));
  });
  rescan_cache();
}

bool ModelPage::busy() const {
  // Until the requested folder's summary is shown (the future ends before its watcher says so).
  return summary_.folder != requested_;
}

void ModelPage::rescan_cache() {
  cache_status_->setText(tr("Scanning %1…").arg(hf_hub_cache_dir()));
  cache_watcher_.setFuture(
      QtConcurrent::run([dir = hf_hub_cache_dir()] { return scan_hf_cache(dir); }));
}

void ModelPage::choose_folder(const QString& folder) {
  requested_ = folder;
  path_->setText(folder);
  summary_ = {};
  verdict_->setText(tr("Checking %1…").arg(folder));
  for (QLabel* l : fields_) l->setText("—");
  watcher_.setFuture(QtConcurrent::run([folder] { return inspect_model(folder); }));
  Q_EMIT modelChanged();  // busy now: the wizard says to wait for the check
}

void ModelPage::show_summary() {
  const ModelSummary& s = summary_;
  if (s.trainable && !s.quantization.isEmpty()) {
    verdict_->setText(tr("✔ The engine can fine-tune this model as QLoRA: its linear weights are "
                         "stored quantized, %1, and LoRA trains on them (full fine-tuning needs "
                         "the unquantized model).")
                          .arg(s.quantization));
  } else if (s.trainable) {
    verdict_->setText(tr("✔ The engine can fine-tune this model."));
  } else {
    QString text = tr("✘ The engine cannot train this model: %1").arg(s.problem);
    if (!s.hint.isEmpty()) text += "\n" + s.hint;
    verdict_->setText(text);
  }
  auto set = [this](const char* key, const QString& value) {
    fields_.value(key)->setText(value.isEmpty() ? "—" : value);
  };
  set("Architecture", s.architecture);
  set("Parameters", s.parameters ? human_count(s.parameters) + " (" +
                                       QLocale().toString(qulonglong(s.parameters)) + ")"
                                 : QString());
  set("Dtype", s.quantization.isEmpty()
                   ? s.dtype
                   : tr("linear weights %1; %2 for the rest").arg(s.quantization, s.dtype));
  set("Size on disk", s.disk_bytes ? human_bytes(s.disk_bytes) : QString());
  set("Context length", s.context_length ? QString::number(s.context_length) : QString());
  set("Chat template", s.chat_template);
  set("Tokenizer", s.tokenizer);
  set("Folder", s.folder);
}

QString ModelPage::summary_text() const {
  QString text = verdict_->text() + "\n";
  for (auto it = fields_.begin(); it != fields_.end(); ++it)
    text += it.key() + ": " + it.value()->text() + "\n";
  return text;
}

}  // namespace tessera::ui
