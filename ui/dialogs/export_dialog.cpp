#include "ui/dialogs/export_dialog.h"

#include <QComboBox>
#include <QDesktopServices>
#include <QDialogButtonBox>
#include <QDir>
#include <QDirIterator>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QFontDatabase>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QPromise>
#include <QPushButton>
#include <QRegularExpression>
#include <QUrl>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include "core/files.h"
#include "hf/families.h"
#include "ui/models/base_model.h"
#include "ui/models/hub_calls.h"

namespace tessera::ui {

namespace {

constexpr quint64 kHeadroomBytes = 16ull << 20;  // tokenizer, configs, and some slack
constexpr int kCheckDelayMs = 300;               // typing pauses longer than this

QString human(quint64 bytes) {
  return QString::fromStdString(core::human_bytes(bytes));
}

quint64 folder_bytes(const QString& dir, const QStringList& filters = {}) {
  quint64 total = 0;
  QDirIterator it(dir, filters, QDir::Files, QDirIterator::Subdirectories);
  while (it.hasNext()) total += quint64(std::max<qint64>(0, it.nextFileInfo().size()));
  return total;
}

// Copies `from` into the folder `to` (through `to`.partial, renamed at the end, so a
// half-copied adapter never looks finished); an existing `to` (empty, or an earlier export the
// dialog said it replaces) is moved aside first and deleted once the copy is in its place. Its
// result is "" or what went wrong.
void copy_folder(QPromise<QString>& promise, const QString& from, const QString& to) {
  QStringList files;
  QDirIterator it(from, QDir::Files, QDirIterator::Subdirectories);
  while (it.hasNext()) files << it.next();
  promise.setProgressRange(0, int(files.size()));
  const QString partial = to + ".partial";
  QDir(partial).removeRecursively();
  QString error;
  for (int i = 0; i < files.size() && error.isEmpty(); ++i) {
    const QString rel = QDir(from).relativeFilePath(files[i]);
    const QString target = QDir(partial).filePath(rel);
    if (!QDir().mkpath(QFileInfo(target).absolutePath()))
      error = QObject::tr("cannot create %1").arg(QFileInfo(target).absolutePath());
    else if (!QFile::copy(files[i], target))
      error = QObject::tr("cannot copy %1 to %2").arg(files[i], target);
    promise.setProgressValue(i + 1);
  }
  if (error.isEmpty()) {
    const QString old = to + ".old";
    const bool replacing = QFileInfo::exists(to);
    QDir(old).removeRecursively();
    if (replacing && !QDir().rename(to, old)) {
      error = QObject::tr("cannot move %1 aside to replace it").arg(to);
    } else if (!QDir().rename(partial, to)) {
      error = QObject::tr("cannot rename %1 to %2").arg(partial, to);
      if (replacing) QDir().rename(old, to);  // the earlier export stays as it was
    } else if (replacing) {
      QDir(old).removeRecursively();
    }
  }
  if (!error.isEmpty()) QDir(partial).removeRecursively();
  promise.addResult(error);
}

// Whether the causal LM in `model_dir` is of a family llama.cpp reads as GGUF (its config.json's
// model_type has a GgufNaming in the registry); the CLI checks the rest before writing.
bool gguf_exportable(const QString& model_dir) {
  QFile config(QDir(model_dir).filePath("config.json"));
  if (!config.open(QIODevice::ReadOnly)) return false;
  const QJsonObject o = QJsonDocument::fromJson(config.read(1 << 20)).object();
  const hf::FamilyTraits* family = hf::find_family(o.value("model_type").toString().toStdString());
  if (family == nullptr || !family->gguf || !family->causal_lm) return false;
  const QJsonArray architectures = o.value("architectures").toArray();
  if (architectures.isEmpty()) return true;  // a decoder without architectures is a causal LM
  for (const QJsonValue& a : architectures)
    if (a.toString().endsWith("ForCausalLM") || a.toString().endsWith("LMHeadModel")) return true;
  return false;
}

}  // namespace

ExportDialog::ExportDialog(RunRecord run, QString cli, QWidget* parent)
    : QDialog(parent), run_(std::move(run)), cli_(std::move(cli)) {
  setWindowTitle(tr("Export %1").arg(run_.name.isEmpty() ? run_.id : run_.name));
  auto* layout = new QVBoxLayout(this);
  auto* form = new QFormLayout;
  form_ = form;
  kind_ = new QComboBox;
  const QDir dir(run_.output_dir);
  const bool lora = run_.method == "lora";
  const bool has_model = QFileInfo::exists(dir.filePath("model"));
  if (has_model) {
    if (lora)
      kind_->addItem(tr("Merged model (HuggingFace folder)"), MergedModel);
    else
      kind_->addItem(tr("Full model (HuggingFace folder)"), FullModel);
  }
  if (has_model && gguf_exportable(dir.filePath("model")))
    kind_->addItem(tr("GGUF (llama.cpp, Ollama, LM Studio)"), Gguf);
  if (lora && QFileInfo::exists(dir.filePath("adapter")))
    kind_->addItem(tr("LoRA adapter (PEFT folder)"), LoraAdapter);
  kind_->setToolTip(
      tr("A HuggingFace folder loads with AutoModelForCausalLM.from_pretrained; a GGUF file runs "
         "in llama.cpp, Ollama and LM Studio; a LoRA adapter loads with peft on top of the base "
         "model"));
  form->addRow(tr("&What:"), kind_);
  dtype_ = new QComboBox;
  dtype_->addItem("float32", "float32");
  dtype_->addItem("bfloat16", "bfloat16");
  label_dtypes();
  dtype_->setToolTip(tr("The precision of the exported weights"));
  form->addRow(tr("&Precision:"), dtype_);
  gguf_type_ = new QComboBox;
  gguf_type_->addItem(tr("f16 (half the size of float32)"), "f16");
  gguf_type_->addItem(tr("q8_0 (8-bit, about a quarter of float32)"), "q8_0");
  gguf_type_->addItem(tr("bf16 (half the size of float32)"), "bf16");
  gguf_type_->addItem(tr("f32 (as trained)"), "f32");
  gguf_type_->setToolTip(
      tr("The GGUF tensor type of the weights; norms and biases stay f32. q8_0 stores each block "
         "of 32 weights as 8-bit integers with one scale"));
  form->addRow(tr("&Type:"), gguf_type_);
  destination_ = new QLineEdit;
  auto* browse = new QPushButton(tr("Choose…"));
  auto* row = new QHBoxLayout;
  row->addWidget(destination_, 1);
  row->addWidget(browse);
  destination_label_ = new QLabel(tr("&Folder:"));
  destination_label_->setBuddy(destination_);
  form->addRow(destination_label_, row);
  estimate_ = new QLabel(tr("measuring…"));
  form->addRow(tr("Size:"), estimate_);
  auto* source = new QLabel(run_.output_dir);
  source->setTextInteractionFlags(Qt::TextSelectableByMouse);
  form->addRow(tr("From run folder:"), source);
  layout->addLayout(form);
  progress_ = new QProgressBar;
  progress_->setRange(0, 1);
  progress_->setValue(0);
  progress_->setFormat(tr("not started"));
  layout->addWidget(progress_);
  status_ = new QLabel;
  status_->setWordWrap(true);
  status_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(status_);
  log_ = new QPlainTextEdit;
  log_->setReadOnly(true);
  log_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  log_->setMaximumBlockCount(2000);
  log_->setPlaceholderText(tr("The export's progress appears here."));
  layout->addWidget(log_, 1);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close);
  export_ = buttons->addButton(tr("&Export"), QDialogButtonBox::AcceptRole);
  export_->setEnabled(false);
  // After a successful export: the folder it wrote (or the GGUF file's folder) in the file manager.
  open_folder_ = buttons->addButton(tr("&Open folder"), QDialogButtonBox::ActionRole);
  open_folder_->setVisible(false);
  layout->addWidget(buttons);
  resize(fontMetrics().averageCharWidth() * 100, fontMetrics().height() * 26);

  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  connect(export_, &QPushButton::clicked, this, [this] { start(); });
  connect(open_folder_, &QPushButton::clicked, this,
          [this] { QDesktopServices::openUrl(QUrl::fromLocalFile(exported_folder())); });
  connect(browse, &QPushButton::clicked, this, [this] {
    const QString d =
        kind() == Gguf
            ? QFileDialog::getSaveFileName(this, tr("Export to"), destination_->text(),
                                           tr("GGUF files (*.gguf)"))
            : QFileDialog::getExistingDirectory(this, tr("Export to"), destination_->text());
    if (!d.isEmpty()) destination_->setText(d);
  });
  connect(kind_, &QComboBox::currentIndexChanged, this, &ExportDialog::update_kind);
  connect(gguf_type_, &QComboBox::currentIndexChanged, this, &ExportDialog::update_kind);
  connect(dtype_, &QComboBox::currentIndexChanged, this, &ExportDialog::update_estimate);
  connect(dtype_, &QComboBox::activated, this, [this] { dtype_chosen_ = true; });
  // The destination is checked by writing there, on a worker thread; Export waits for it.
  checker_ = new WriteChecker(this);
  check_delay_.setSingleShot(true);
  check_delay_.setInterval(kCheckDelayMs);
  connect(&check_delay_, &QTimer::timeout, this, &ExportDialog::check_destination);
  connect(destination_, &QLineEdit::textChanged, this, [this] {
    check_delay_.start();
    update_estimate();
  });
  connect(checker_, &WriteChecker::checked, this, &ExportDialog::update_estimate);
  connect(checker_, &WriteChecker::slowed, this, &ExportDialog::update_estimate);
  update_kind();
  connect(&size_watcher_, &QFutureWatcher<Sizes>::finished, this, [this] {
    sizes_ = size_watcher_.result();
    measured_ = true;
    label_dtypes();
    // A bf16 base model trained with float32 master weights exports as bf16 unless the user
    // asks otherwise: float32 would double the size of the model they started from.
    if (!dtype_chosen_ && dtype_->findData(sizes_.base_dtype) >= 0)
      dtype_->setCurrentIndex(dtype_->findData(sizes_.base_dtype));
    update_estimate();
  });
  connect(&copy_watcher_, &QFutureWatcher<QString>::progressValueChanged, this, [this](int v) {
    progress_->setRange(copy_watcher_.progressMinimum(), copy_watcher_.progressMaximum());
    progress_->setValue(v);
  });
  connect(&copy_watcher_, &QFutureWatcher<QString>::finished, this, [this] {
    const QString error = copy_watcher_.result();
    finish(error.isEmpty(),
           error.isEmpty() ? tr("LoRA adapter copied to %1").arg(destination()) : error);
  });
  if (kind_->count() == 0) {
    estimate_->setText(tr("—"));
    status_->setText(tr("This run has nothing to export: %1 has no model/ or adapter/ folder.")
                         .arg(run_.output_dir));
    return;
  }
  // Sizes are read on a pool thread (a model folder can hold many shards).
  const QString model_dir = dir.filePath("model"), adapter_dir = dir.filePath("adapter");
  size_watcher_.setFuture(QtConcurrent::run([model_dir, adapter_dir, run = run_] {
    Sizes s;
    s.model_canonical = QFileInfo(model_dir).canonicalFilePath();
    s.adapter_canonical = QFileInfo(adapter_dir).canonicalFilePath();
    s.model_weights = folder_bytes(model_dir, {"*.safetensors"});
    s.model_other = folder_bytes(model_dir) - s.model_weights;
    s.adapter = folder_bytes(adapter_dir);
    const QString dtype = config_dtype(model_dir);
    if (dtype == "bfloat16" || dtype == "float16") s.model_dtype_bytes = 2;
    if (!dtype.isEmpty()) s.model_dtype = dtype;
    QString name, problem;
    const QString base = base_model_folder(run, &name, &problem);
    if (!base.isEmpty()) s.base_dtype = config_dtype(base);
    return s;
  }));
}

ExportDialog::~ExportDialog() {
  if (process_ && process_->state() != QProcess::NotRunning) {
    process_->disconnect(this);
    process_->kill();
    process_->waitForFinished(2000);
  }
  copy_watcher_.waitForFinished();
  size_watcher_.waitForFinished();
}

QList<ExportDialog::Kind> ExportDialog::kinds() const {
  QList<Kind> out;
  for (int i = 0; i < kind_->count(); ++i) out << Kind(kind_->itemData(i).toInt());
  return out;
}

void ExportDialog::set_kind(Kind kind) {
  kind_->setCurrentIndex(kind_->findData(int(kind)));
}

ExportDialog::Kind ExportDialog::kind() const {
  return Kind(kind_->currentData().toInt());
}

void ExportDialog::set_dtype(const QString& dtype) {
  dtype_chosen_ = true;
  dtype_->setCurrentIndex(dtype_->findData(dtype));
}

void ExportDialog::label_dtypes() {
  for (int i = 0; i < dtype_->count(); ++i) {
    const QString dtype = dtype_->itemData(i).toString();
    QStringList notes;
    if (dtype == sizes_.model_dtype) notes << tr("as trained");
    if (dtype == sizes_.base_dtype) notes << tr("as the base model");
    if (dtype == "bfloat16" && sizes_.model_dtype == "float32") notes << tr("half the size");
    dtype_->setItemText(i, notes.isEmpty() ? dtype : tr("%1 (%2)").arg(dtype, notes.join(", ")));
  }
}

void ExportDialog::set_gguf_type(const QString& type) {
  gguf_type_->setCurrentIndex(gguf_type_->findData(type));
}

void ExportDialog::set_destination(const QString& path) {
  destination_->setText(path);
}

QString ExportDialog::default_destination() const {
  const QDir dir(run_.output_dir);
  if (kind() == Gguf)
    return dir.filePath(QString("model-%1.gguf").arg(gguf_type_->currentData().toString()));
  return dir.filePath("export");
}

void ExportDialog::update_kind() {
  const bool gguf = kind() == Gguf;
  form_->setRowVisible(dtype_, !gguf);
  form_->setRowVisible(gguf_type_, gguf);
  destination_label_->setText(gguf ? tr("&File:") : tr("&Folder:"));
  destination_->setToolTip(gguf ? tr("A new .gguf file") : tr("A new or empty folder"));
  // A destination the user typed stays; the previous kind's default follows the kind.
  if (destination_->text().isEmpty() || destination_->text() == last_default_destination_) {
    last_default_destination_ = default_destination();
    destination_->setText(last_default_destination_);
  }
  check_destination();  // a GGUF file and a folder are checked differently
  update_estimate();
}

WriteTarget ExportDialog::destination_target() const {
  return kind() == Gguf ? WriteTarget::File : WriteTarget::Folder;
}

void ExportDialog::check_destination() {
  check_delay_.stop();
  if (kind_->count() == 0) return;
  checker_->check(destination(), destination_target());
  update_estimate();
}

bool ExportDialog::destination_checked() const {
  return !check_delay_.isActive() && checker_->answered(destination(), destination_target());
}

ExportDialog::Verdict ExportDialog::verdict() const {
  const WriteCheck& c = checker_->result();
  using Found = WriteCheck::Found;
  Verdict v;
  if (!c.problem.isEmpty()) {
    v.problem = c.problem;
    v.advice = c.advice;
    return v;
  }
  if (kind() == Gguf) {
    if (c.found == Found::Folder || c.found == Found::EmptyFolder) {
      v.problem = tr("%1 is a folder; a GGUF export is one file").arg(c.path);
      v.advice = tr("Give a file name, for example %1.").arg(QDir(c.path).filePath("model.gguf"));
    } else if (c.found == Found::File && c.holds.isEmpty()) {
      v.problem = tr("%1 exists and is not a GGUF file").arg(c.path);
      v.advice = tr("Choose a new file name.");
    } else if (c.found == Found::File) {
      v.replaces = tr("the GGUF file %1").arg(c.path);
    }
    return v;
  }
  if (!c.canonical.isEmpty() &&
      (c.canonical == sizes_.model_canonical || c.canonical == sizes_.adapter_canonical)) {
    v.problem = tr("%1 is this run's own %2 folder")
                    .arg(c.path, c.canonical == sizes_.model_canonical ? "model" : "adapter");
    v.advice = tr("Choose a folder outside it.");
  } else if (c.found == Found::Folder && c.holds.isEmpty()) {
    // The export takes the whole folder's place: anything else in it would be deleted.
    v.problem =
        tr("%1 holds %2 and no earlier export")
            .arg(c.path, count_text(c.entries, tr("1 file or folder"), tr("%1 files and folders")));
    v.advice = tr("An export replaces everything in its folder: choose a new or empty folder.");
  } else if (c.found == Found::Folder) {
    v.replaces = tr("%1 in %2").arg(c.holds, c.path);
  }
  return v;
}

QString ExportDialog::destination_problem() const {
  return destination_checked() ? verdict().problem : QString();
}

QString ExportDialog::replaces() const {
  return destination_checked() ? verdict().replaces : QString();
}

QString ExportDialog::destination() const {
  return QDir::cleanPath(destination_->text().trimmed());
}

QString ExportDialog::export_folder() const {
  return kind() == Gguf ? QFileInfo(destination()).absolutePath() : destination();
}

QString ExportDialog::exported_folder() const {
  return QFileInfo(export_folder()).absoluteFilePath();
}

bool ExportDialog::busy() const {
  return (process_ && process_->state() != QProcess::NotRunning) || copy_watcher_.isRunning();
}

quint64 ExportDialog::estimated_bytes() const {
  if (kind() == LoraAdapter) return sizes_.adapter;
  const quint64 elements = sizes_.model_weights / quint64(sizes_.model_dtype_bytes);
  if (kind() == Gguf) {
    // q8_0: 34 bytes per block of 32; the tokenizer travels in the file's metadata.
    const QString type = gguf_type_->currentData().toString();
    const quint64 weights = type == "f32"    ? elements * 4
                            : type == "q8_0" ? elements * 34 / 32
                                             : elements * 2;
    return weights + sizes_.model_other;
  }
  const int target = dtype_->currentData().toString() == "bfloat16" ? 2 : 4;
  return elements * quint64(target) + sizes_.model_other;
}

void ExportDialog::update_estimate() {
  dtype_->setEnabled(kind() != LoraAdapter && !busy());
  const bool checked = destination_checked();
  const Verdict v = checked ? verdict() : Verdict{};
  export_->setEnabled(measured_ && checked && v.problem.isEmpty() && !busy() && kind_->count() > 0);
  // Why the destination cannot take the export goes where a person looks for it, with what to do.
  if (checked && !v.problem.isEmpty() && !busy()) {
    status_->setText(tr("Cannot export to %1: %2. %3").arg(destination(), v.problem, v.advice));
    status_is_refusal_ = true;
  } else if (status_is_refusal_) {
    status_->clear();
    status_is_refusal_ = false;
  }
  if (!measured_) return;
  const QString size = tr("about %1").arg(human(estimated_bytes()));
  if (!checked) {
    estimate_->setText(
        checker_->slow()
            ? tr("%1; still checking %2: its disk is slow to answer…").arg(size, export_folder())
            : tr("%1; checking…").arg(size));
    return;
  }
  // A folder that cannot be written has no useful free space to show ("0 B free" on /proc).
  const WriteCheck& c = checker_->result();
  if (!c.problem.isEmpty()) {
    estimate_->setText(tr("%1; cannot write there: %2").arg(size, c.problem));
    return;
  }
  QString text = tr("%1; %2 free on %3")
                     .arg(size, human(quint64(std::max<qint64>(0, c.bytes_free))), c.volume);
  if (!v.replaces.isEmpty()) text += tr("; replaces %1").arg(v.replaces);
  estimate_->setText(text);
}

QString ExportDialog::start() {
  auto refuse = [this](const QString& why) {
    status_->setText(why);
    return why;
  };
  if (busy()) return refuse(tr("An export is already running."));
  if (kind_->count() == 0) return refuse(tr("This run has nothing to export."));
  if (!measured_) return refuse(tr("Still measuring the run's files; try again in a moment."));
  const QString dest = destination();
  if (dest.isEmpty())
    return refuse(kind() == Gguf ? tr("Choose the file to export to.")
                                 : tr("Choose the folder to export to."));
  // Everything about the destination comes from the write check (a worker thread's look at the
  // disk); the GUI thread touches no file system here.
  if (!destination_checked())
    return refuse(tr("Still checking whether %1 can be written; Export is offered once that is "
                     "known.")
                      .arg(dest));
  const Verdict v = verdict();
  if (!v.problem.isEmpty())
    return refuse(tr("Cannot export to %1: %2. %3").arg(dest, v.problem, v.advice));
  // Free space first: the export writes the whole folder before anything is swapped in.
  const quint64 needed = estimated_bytes() + kHeadroomBytes;
  const WriteCheck& check = checker_->result();
  if (check.bytes_free >= 0 && quint64(check.bytes_free) < needed)
    return refuse(tr("Not enough free space on %1: the export needs about %2, %3 is free. "
                     "Free some space or choose a folder on another disk.")
                      .arg(check.volume, human(needed), human(quint64(check.bytes_free))));
  const QString source =
      QDir(run_.output_dir).filePath(kind() == LoraAdapter ? "adapter" : "model");

  succeeded_ = false;
  open_folder_->setVisible(false);
  message_.clear();
  status_->clear();
  status_is_refusal_ = false;
  log_->clear();
  export_->setEnabled(false);
  kind_->setEnabled(false);
  dtype_->setEnabled(false);
  gguf_type_->setEnabled(false);
  destination_->setEnabled(false);
  if (!v.replaces.isEmpty()) log_->appendPlainText(tr("replacing %1").arg(v.replaces));
  if (kind() == LoraAdapter) {
    progress_->setFormat(tr("copying the adapter: %v / %m files"));
    log_->appendPlainText(tr("copying %1 to %2").arg(source, dest));
    copy_watcher_.setFuture(QtConcurrent::run(copy_folder, source, dest));
    return {};
  }
  progress_->setRange(0, 0);
  progress_->setFormat(tr("starting"));
  stderr_partial_.clear();
  stderr_tail_.clear();
  process_ = new QProcess(this);
  QStringList args =
      kind() == Gguf ? QStringList{"export", "--model",     source,
                                   "--out",  dest,          "--format",
                                   "gguf",   "--gguf-type", gguf_type_->currentData().toString()}
                     : QStringList{"export",
                                   "--model",
                                   source,
                                   "--out",
                                   dest,
                                   "--dtype",
                                   dtype_->currentData().toString()};
  // The dialog said what is replaced; the export writes and checks the new one before it goes.
  if (!v.replaces.isEmpty()) args << "--force";
  log_->appendPlainText("$ " + cli_ + " " + args.join(' '));
  connect(process_, &QProcess::readyReadStandardError, this, &ExportDialog::on_stderr);
  connect(process_, &QProcess::readyReadStandardOutput, this, [this] {
    for (const QByteArray& line : process_->readAllStandardOutput().split('\n'))
      if (!line.trimmed().isEmpty()) log_->appendPlainText(QString::fromUtf8(line));
  });
  connect(process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError e) {
    if (e == QProcess::FailedToStart)
      finish(false, tr("Could not start %1: %2").arg(cli_, process_->errorString()));
  });
  connect(process_, &QProcess::finished, this, [this](int code, QProcess::ExitStatus status) {
    on_stderr();
    const QByteArray out = process_->readAllStandardOutput();
    if (!out.trimmed().isEmpty()) log_->appendPlainText(QString::fromUtf8(out).trimmed());
    if (status == QProcess::NormalExit && code == 0) {
      finish(true, tr("Exported to %1").arg(destination()));
    } else {
      QString why = stderr_tail_.isEmpty() ? tr("exit code %1").arg(code) : stderr_tail_.last();
      if (status == QProcess::CrashExit) why = tr("the export process crashed");
      finish(false, tr("The export failed: %1").arg(why));
    }
  });
  process_->start(cli_, args);
  return {};
}

void ExportDialog::on_stderr() {
  if (!process_) return;
  stderr_partial_ += process_->readAllStandardError();
  qsizetype nl;
  while ((nl = stderr_partial_.indexOf('\n')) >= 0) {
    const QString line = QString::fromUtf8(stderr_partial_.left(nl)).trimmed();
    stderr_partial_.remove(0, nl + 1);
    if (line.isEmpty()) continue;
    log_->appendPlainText(line);
    stderr_tail_ << line;
    if (stderr_tail_.size() > 20) stderr_tail_.removeFirst();
    // "export: <stage>" lines name the stage in progress; GGUF's count its tensors.
    if (!line.startsWith("export: ")) continue;
    progress_->setFormat(line.mid(8));
    static const QRegularExpression tensor("^export: tensor (\\d+)/(\\d+) ");
    if (const QRegularExpressionMatch m = tensor.match(line); m.hasMatch()) {
      progress_->setRange(0, m.captured(2).toInt());
      progress_->setValue(m.captured(1).toInt());
    }
  }
}

void ExportDialog::finish(bool ok, const QString& message) {
  if (process_ && process_->state() == QProcess::NotRunning) {
    process_->deleteLater();
    process_ = nullptr;
  }
  succeeded_ = ok;
  open_folder_->setVisible(ok);
  message_ = message;
  progress_->setRange(0, 1);
  progress_->setValue(ok ? 1 : 0);
  progress_->setFormat(ok ? tr("done") : tr("failed"));
  status_->setText(message);
  log_->appendPlainText(message);
  kind_->setEnabled(true);
  dtype_->setEnabled(kind() != LoraAdapter);
  gguf_type_->setEnabled(true);
  destination_->setEnabled(true);
  check_destination();  // the destination now holds the export: a second one would replace it
  Q_EMIT exportFinished(ok, message);
}

}  // namespace tessera::ui
