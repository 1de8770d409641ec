#include "ui/main_window.h"

#include <QAction>
#include <QApplication>
#include <QCloseEvent>
#include <QComboBox>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QFutureWatcher>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMenuBar>
#include <QMessageBox>
#include <QProgressDialog>
#include <QPushButton>
#include <QScrollArea>
#include <QSettings>
#include <QSplitter>
#include <QStackedWidget>
#include <QStatusBar>
#include <QStyle>
#include <QVBoxLayout>
#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "hf/hub/settings.h"
#include "job/job_spec.h"
#include "ui/dialogs/about_dialog.h"
#include "ui/dialogs/user_guide_window.h"
#include "ui/models/model_info.h"
#include "ui/pages/hardware_page.h"
#include "ui/pages/hub_panel.h"
#include "ui/pages/nodes_page.h"
#include "ui/pages/run_dashboard.h"
#include "ui/pages/runs_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/hub_token.h"
#include "ui/utility/run_monitor.h"
#include "ui/utility/studio_settings.h"
#include "ui/utility/theme.h"
#include "ui/widgets/demo_offer.h"
#include "ui/widgets/download_tray.h"

namespace tessera::ui {

namespace {

QWidget* with_heading(const QString& heading, const QString& text, QWidget* body,
                      QPushButton* action = nullptr) {
  auto* page = new QWidget;
  auto* layout = new QVBoxLayout(page);
  auto* title = new QLabel(heading);
  QFont f = title->font();
  f.setPointSizeF(f.pointSizeF() * 1.4);
  f.setBold(true);
  title->setFont(f);
  layout->addWidget(title);
  if (!text.isEmpty()) {
    auto* intro = new QLabel(text);
    intro->setWordWrap(true);
    layout->addWidget(intro);
  }
  // A page taller or wider than the window scrolls, so no page holds the window at its own
  // minimum size (a 1366×768 laptop leaves about 1280×720 for it).
  auto* scroll = new QScrollArea;
  scroll->setWidget(body);
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  layout->addWidget(scroll, 1);
  if (action) layout->addWidget(action, 0, Qt::AlignRight);
  return page;
}

}  // namespace

MainWindow::MainWindow(RunsStore* store, QWidget* parent) : QMainWindow(parent), store_(store) {
  setWindowTitle(tr("Tessera Studio"));
  apply_theme(settings::theme());
  probe_ = new CliProbe(this);
  token_ = new HubToken(this);
  token_->load();

  auto* central = new QWidget;
  auto* layout = new QHBoxLayout(central);
  sidebar_ = new QListWidget;
  sidebar_->setAccessibleName(tr("Navigation"));
  sidebar_->setFrameShape(QFrame::NoFrame);
  sidebar_->setIconSize(QSize(fontMetrics().height() * 3 / 2, fontMetrics().height() * 3 / 2));
  const struct {
    QString label;
    QStyle::StandardPixmap icon;
  } items[] = {{tr("New fine-tune"), QStyle::SP_FileDialogNewFolder},
               {tr("Runs"), QStyle::SP_FileDialogDetailedView},
               {tr("Models"), QStyle::SP_DriveHDIcon},
               {tr("Datasets"), QStyle::SP_FileDialogContentsView},
               {tr("Nodes"), QStyle::SP_DriveNetIcon},
               {tr("Settings"), QStyle::SP_FileDialogInfoView}};
  int widest = 0;
  for (const auto& item : items) {
    sidebar_->addItem(new QListWidgetItem(style()->standardIcon(item.icon), item.label));
    widest = std::max(widest, fontMetrics().horizontalAdvance(item.label));
  }
  sidebar_->setFixedWidth(widest + sidebar_->iconSize().width() + fontMetrics().height() * 3);
  layout->addWidget(sidebar_);

  stack_ = new QStackedWidget;
  wizard_ = new FineTuneWizard(probe_);
  runs_ = new RunsPage(store_);
  datasets_ = new DatasetPage;
  downloads_ = new DownloadTray(token_);
  // Until the first run, the wizard opens with the offer of the offline demo.
  auto* new_fine_tune = new QWidget;
  auto* new_fine_tune_layout = new QVBoxLayout(new_fine_tune);
  new_fine_tune_layout->setContentsMargins(0, 0, 0, 0);
  demo_offer_ = new DemoOffer;
  demo_offer_->setVisible(false);
  new_fine_tune_layout->addWidget(demo_offer_);
  new_fine_tune_layout->addWidget(wizard_, 1);
  stack_->addWidget(with_heading(tr("New fine-tune"), {}, new_fine_tune));
  stack_->addWidget(with_heading(tr("Runs"), {}, runs_));
  stack_->addWidget(make_models_page());
  auto* use_dataset = new QPushButton(tr("Fi&ne-tune on this dataset"));
  stack_->addWidget(with_heading(tr("Datasets"),
                                 tr("A dataset file on this machine, or a dataset on the Hugging "
                                    "Face Hub: its rows, detected format and columns."),
                                 datasets_, use_dataset));
  use_dataset->setEnabled(false);
  connect(datasets_, &DatasetPage::datasetChanged, use_dataset,
          [this, use_dataset] { use_dataset->setEnabled(datasets_->ready()); });
  connect(use_dataset, &QPushButton::clicked, this, [this] {
    if (const auto& hub = datasets_->hub_dataset())
      wizard_->dataset_page()->use_hub_dataset(hub->choice, hub->snapshot);
    else
      wizard_->dataset_page()->choose_file(datasets_->analysis().file);
    wizard_->go_to(FineTuneWizard::DatasetStep);
    show_wizard();
  });
  // Hub datasets: both dataset pages (the wizard's step and the Datasets page) search the Hub and
  // have the tray download; the page that asked reads the files once they are verified.
  for (DatasetPage* page : {wizard_->dataset_page(), datasets_}) {
    page->enable_hub(token_);
    connect(page, &DatasetPage::hubDownloadRequested, this, [this](const HubDatasetChoice& c) {
      dataset_downloads_.removeIf([&](const HubDatasetChoice& old) {
        return old.download_request().same_files(c.download_request());
      });
      dataset_downloads_.push_back(c);
      downloads_->download(c.download_request());
    });
  }
  connect(downloads_, &DownloadTray::datasetReady, this,
          [this](const HubDownloadRequest& request, const QString& snapshot) {
            wizard_->dataset_page()->hub_download_ready(request, snapshot);
            datasets_->hub_download_ready(request, snapshot);
          });
  // "Use this dataset" in the tray: the wizard's dataset, whichever page asked for it.
  connect(downloads_, &DownloadTray::useDataset, this,
          [this](const HubDownloadRequest& request, const QString& snapshot) {
            for (const HubDatasetChoice& c : dataset_downloads_)
              if (c.download_request().same_files(request)) {
                wizard_->dataset_page()->use_hub_dataset(c, snapshot);
                wizard_->go_to(FineTuneWizard::DatasetStep);
                show_wizard();
                return;
              }
          });
  nodes_ = new NodesPage;
  stack_->addWidget(with_heading(
      tr("Nodes"),
      tr("This machine and the other machines on your network that can run the processes of a "
         "job: each runs tessera-cli agent and is paired here once."),
      nodes_));
  // The wizard offers the paired nodes: its list follows what the Nodes page pairs and removes.
  connect(nodes_, &NodesPage::nodesChanged, wizard_->hardware_page(), &HardwarePage::refresh_nodes);
  stack_->addWidget(make_settings_page());
  // The download tray sits under every page, so downloads go on while the user moves around.
  auto* right = new QVBoxLayout;
  right->addWidget(stack_, 1);
  right->addWidget(downloads_);
  layout->addLayout(right, 1);
  setCentralWidget(central);
  connect(downloads_, &DownloadTray::useModel, this, [this](const QString& snapshot) {
    wizard_->model_page()->choose_folder(snapshot);
    wizard_->go_to(FineTuneWizard::ModelStep);
    show_wizard();
  });
  connect(downloads_, &DownloadTray::modelReady, this, [this] {
    models_->rescan_cache();
    wizard_->model_page()->rescan_cache();
  });

  connect(sidebar_, &QListWidget::currentRowChanged, stack_, &QStackedWidget::setCurrentIndex);
  connect(wizard_, &FineTuneWizard::launchRequested, this, [this](const job::JobSpec& spec) {
    QString error = launch(spec);
    if (!error.isEmpty()) QMessageBox::warning(this, tr("Launch"), error);
  });
  connect(runs_, &RunsPage::cloneRequested, this, [this](const RunRecord& run) {
    try {
      wizard_->load_spec(job::parse_job_spec(nlohmann::json::parse(run.spec_json.toStdString()),
                                             "run " + run.id.toStdString()));
    } catch (const std::exception& e) {
      QMessageBox::warning(this, tr("Clone"),
                           tr("Cannot read the run's job spec: %1").arg(e.what()));
      return;
    }
    show_wizard();
  });
  connect(runs_, &RunsPage::refreshed, this, [this] {
    demo_offer_->setVisible(demo_offer_->busy() ||
                            (runs_->runs().isEmpty() && runs_->load_error().isEmpty()));
  });
  connect(runs_, &RunsPage::newFineTuneRequested, this, [this] {
    wizard_->go_to(FineTuneWizard::ModelStep);
    show_wizard();
  });
  connect(runs_, &RunsPage::demoRequested, this, &MainWindow::try_demo);
  connect(demo_offer_, &DemoOffer::tryRequested, this, &MainWindow::try_demo);
  // The demo's own job spec: demo/base, demo/train.jsonl and the settings it was tuned with
  // (a 32-token length fits its 256-token context; the wizard's defaults do not).
  connect(demo_offer_, &DemoOffer::demoReady, this, [this](const QString& dir) {
    try {
      wizard_->load_spec(job::load_job_spec(QDir(dir).filePath("job.json").toStdString()));
    } catch (const std::exception& e) {
      QMessageBox::warning(this, tr("Demo"),
                           tr("Cannot read the demo's job spec: %1").arg(e.what()));
      return;
    }
    wizard_->go_to(FineTuneWizard::ModelStep);
    show_wizard();
  });
  connect(runs_, &RunsPage::resumeRequested, this, [this](const RunRecord& run) {
    QString error = resume(run);
    if (!error.isEmpty()) QMessageBox::warning(this, tr("Resume"), error);
  });
  connect(probe_, &CliProbe::probed, this, [this] {
    cli_status_->setText(probe_->ok() ? tr("Commands: %1").arg(probe_->commands().join(", "))
                                      : probe_->problem());
  });
  connect(store_, &RunsStore::writeFailed, this, [this](const QString& message) {
    statusBar()->showMessage(tr("Could not record the run: %1").arg(message));
  });
  if (const int n = store_->interrupted_on_open(); n > 0)
    statusBar()->showMessage(
        (n == 1 ? tr("1 run was in progress when the studio last quit; it is marked interrupted.")
                : tr("%1 runs were in progress when the studio last quit; they are marked "
                     "interrupted.")
                      .arg(n)));

  make_menus();

  QSettings s;
  if (!restoreGeometry(s.value("window/geometry").toByteArray()))
    resize(fontMetrics().averageCharWidth() * 160, fontMetrics().height() * 48);
  show_page(Page(std::clamp(s.value("window/page", 0).toInt(), 0, int(Settings))));
  probe_->probe(settings::cli_program());

  // A run that kept training after the studio last quit: follow it again (the newest, as only
  // one run is live at a time).
  QList<RunRecord> alive = store_->alive_on_open();
  alive.removeIf([](const RunRecord& r) { return !run_process_alive(r.pid, r.output_dir); });
  if (!alive.isEmpty()) {
    const RunRecord newest = *std::max_element(
        alive.begin(), alive.end(),
        [](const RunRecord& a, const RunRecord& b) { return a.started_at < b.started_at; });
    follow_recorded(newest, /*reattach=*/true);
  }
}

MainWindow::~MainWindow() = default;

QWidget* MainWindow::make_models_page() {
  models_ = new ModelPage;
  auto* use_model = new QPushButton(tr("Fi&ne-tune this model"));
  use_model->setEnabled(false);
  connect(models_, &ModelPage::modelChanged, use_model,
          [this, use_model] { use_model->setEnabled(models_->ready()); });
  connect(use_model, &QPushButton::clicked, this, [this] {
    wizard_->model_page()->choose_folder(models_->summary().folder);
    wizard_->go_to(FineTuneWizard::ModelStep);
    show_wizard();
  });
  auto* local = new QGroupBox(tr("This machine"));
  auto* local_layout = new QVBoxLayout(local);
  local_layout->addWidget(models_, 1);
  local_layout->addWidget(use_model, 0, Qt::AlignRight);

  hub_ = new HubPanel(token_, [this] { return wizard_->build_spec(); });
  auto* remote = new QGroupBox(tr("Hugging Face Hub"));
  auto* remote_layout = new QVBoxLayout(remote);
  remote_layout->addWidget(hub_);
  connect(hub_, &HubPanel::downloadRequested, downloads_,
          qOverload<const QString&>(&DownloadTray::download));

  auto* split = new QSplitter(Qt::Horizontal);
  split->addWidget(local);
  split->addWidget(remote);
  split->setChildrenCollapsible(false);
  split->setStretchFactor(0, 2);
  split->setStretchFactor(1, 3);
  return with_heading(tr("Models"),
                      tr("On this machine: model folders and the HuggingFace cache, each checked "
                         "by the engine. On the Hub: search, see what Tessera can train and what "
                         "fits here, and download into the shared cache."),
                      split);
}

QWidget* MainWindow::make_token_box() {
  auto* box = new QWidget;
  auto* layout = new QVBoxLayout(box);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* row = new QHBoxLayout;
  auto* edit = new QLineEdit;
  edit->setObjectName("hubTokenEdit");
  edit->setEchoMode(QLineEdit::Password);
  edit->setPlaceholderText(tr("hf_… (from your Hugging Face account: Settings → Access Tokens)"));
  edit->setAccessibleName(tr("Hugging Face token"));
  auto* save = new QPushButton(tr("Sa&ve token"));
  save->setObjectName("hubTokenSave");
  auto* forget = new QPushButton(tr("F&orget token"));
  forget->setObjectName("hubTokenForget");
  row->addWidget(edit, 1);
  row->addWidget(save);
  row->addWidget(forget);
  layout->addLayout(row);
  auto* status = new QLabel(token_->describe());
  status->setObjectName("hubTokenStatus");
  status->setWordWrap(true);
  layout->addWidget(status);
  auto* result = new QLabel;
  result->setObjectName("hubTokenResult");
  result->setWordWrap(true);
  layout->addWidget(result);
  connect(token_, &HubToken::changed, status,
          [this, status] { status->setText(token_->describe()); });
  connect(save, &QPushButton::clicked, this, [this, edit, result, save] {
    save->setEnabled(false);
    result->setText(tr("Saving…"));
    token_->save(edit->text());
  });
  connect(edit, &QLineEdit::returnPressed, save, &QPushButton::click);
  connect(token_, &HubToken::saved, this, [edit, result, save](bool ok, const QString& message) {
    save->setEnabled(true);
    result->setText(message);
    if (ok) edit->clear();  // the token is not kept in the widget
  });
  connect(forget, &QPushButton::clicked, this, [this, result] {
    token_->forget();
    result->setText(std::getenv("HF_TOKEN") != nullptr
                        ? tr("Forgotten; HF_TOKEN is still set in the environment.")
                        : tr("Forgotten."));
  });
  return box;
}

QWidget* MainWindow::make_settings_page() {
  auto* body = new QWidget;
  auto* form = new QFormLayout(body);
  cli_path_ = new QLineEdit(settings::cli_program());
  cli_path_->setToolTip(tr("The tessera-cli program that runs training jobs"));
  auto* cli_row = new QHBoxLayout;
  auto* browse = new QPushButton(tr("Choose…"));
  cli_row->addWidget(cli_path_, 1);
  cli_row->addWidget(browse);
  auto* cli_label = new QLabel(tr("tessera-&cli:"));
  cli_label->setBuddy(cli_path_);
  form->addRow(cli_label, cli_row);
  cli_status_ = new QLabel(tr("Checking…"));
  cli_status_->setWordWrap(true);
  form->addRow(QString(), cli_status_);
  theme_ = new QComboBox;
  theme_->addItem(tr("System"), "system");
  theme_->addItem(tr("Light"), "light");
  theme_->addItem(tr("Dark"), "dark");
  theme_->setCurrentIndex(std::max(0, theme_->findData(settings::theme())));
  theme_->setToolTip(
      tr("System: the desktop's own look. Light and Dark: the Fusion style with "
         "that palette, charts included"));
  form->addRow(tr("Th&eme:"), theme_);
  connect(theme_, &QComboBox::currentIndexChanged, this, [this] {
    const QString theme = theme_->currentData().toString();
    settings::set_theme(theme);
    apply_theme(theme);
  });
  runs_root_ = new QLineEdit(settings::runs_root());
  runs_root_->setToolTip(tr("Every run gets its own new folder inside this one"));
  form->addRow(tr("&Runs folder:"), runs_root_);
  auto* db = new QLabel(settings::database_path());
  db->setTextInteractionFlags(Qt::TextSelectableByMouse);
  form->addRow(tr("Runs database:"), db);
  auto* hub = new QLabel(hf_hub_cache_dir());
  hub->setTextInteractionFlags(Qt::TextSelectableByMouse);
  form->addRow(tr("HuggingFace cache:"), hub);
  const hf::hub::Settings hub_env = hf::hub::Settings::from_environment();
  auto* endpoint =
      new QLabel(QString::fromStdString(hub_env.endpoint) +
                 (hub_env.offline ? tr("  (offline: HF_HUB_OFFLINE is set)") : QString()));
  endpoint->setTextInteractionFlags(Qt::TextSelectableByMouse);
  form->addRow(tr("Hub:"), endpoint);
  form->addRow(tr("Hugging Face &token:"), make_token_box());

  connect(browse, &QPushButton::clicked, this, [this] {
    QString file = QFileDialog::getOpenFileName(this, tr("tessera-cli"), cli_path_->text());
    if (!file.isEmpty()) {
      cli_path_->setText(file);
      Q_EMIT cli_path_->editingFinished();
    }
  });
  connect(cli_path_, &QLineEdit::editingFinished, this, [this] {
    settings::set_cli_program(cli_path_->text());
    nodes_->set_cli(cli_path_->text());
    cli_status_->setText(tr("Checking…"));
    probe_->probe(cli_path_->text());
  });
  connect(runs_root_, &QLineEdit::editingFinished, this,
          [this] { settings::set_runs_root(runs_root_->text()); });
  return with_heading(tr("Settings"), {}, body);
}

void MainWindow::make_menus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  new_fine_tune_action_ = file->addAction(tr("&New fine-tune"), this, [this] {
    wizard_->go_to(FineTuneWizard::ModelStep);
    show_wizard();
  });
  new_fine_tune_action_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_N));
  open_run_action_ = file->addAction(tr("&Open run…"), this, &MainWindow::ask_open_run);
  file->addSeparator();
  quit_action_ = file->addAction(tr("&Quit"), this, &QWidget::close);
  quit_action_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Q));
  quit_action_->setMenuRole(QAction::QuitRole);

  QMenu* run = menuBar()->addMenu(tr("R&un"));
  RunDashboard* dashboard = runs_->dashboard();
  stop_action_ = run->addAction(dashboard->stop_button()->text());
  resume_action_ = run->addAction(dashboard->resume_button()->text());
  export_action_ = run->addAction(dashboard->export_button()->text());
  mirror(stop_action_, dashboard->stop_button());
  mirror(resume_action_, dashboard->resume_button());
  mirror(export_action_, dashboard->export_button());

  QMenu* help = menuBar()->addMenu(tr("&Help"));
  user_guide_action_ = help->addAction(tr("&User guide"), this, [this] {
    if (!user_guide_) {
      user_guide_ = new UserGuideWindow(this);
      user_guide_->setAttribute(Qt::WA_DeleteOnClose);
    }
    user_guide_->show();
    user_guide_->raise();
    user_guide_->activateWindow();
  });
  user_guide_action_->setShortcut(QKeySequence(Qt::Key_F1));
  about_action_ = help->addAction(tr("&About Tessera Studio"), this, [this] {
    if (!about_) {
      about_ = new AboutDialog(settings::cli_program(), this);
      about_->setAttribute(Qt::WA_DeleteOnClose);
    }
    about_->show();
    about_->raise();
  });
  about_action_->setMenuRole(QAction::AboutRole);
}

void MainWindow::mirror(QAction* action, QAbstractButton* button) {
  mirrored_.insert(button, action);
  action->setEnabled(button->isEnabled());
  action->setToolTip(button->toolTip());
  button->installEventFilter(this);
  connect(action, &QAction::triggered, this, [this, button] {
    show_page(Runs);  // where the click's effect (the bar, a question, the dialog) shows
    button->click();
  });
}

bool MainWindow::eventFilter(QObject* watched, QEvent* event) {
  // QPushButton has no signal for its enabled state or text: follow its change events (the
  // dashboard sets a button's tooltip after its text).
  if (QAction* action = mirrored_.value(watched);
      action &&
      (event->type() == QEvent::EnabledChange || event->type() == QEvent::ToolTipChange)) {
    auto* button = static_cast<QAbstractButton*>(watched);
    action->setEnabled(button->isEnabled());
    action->setText(button->text());
    action->setToolTip(button->toolTip());
  }
  return QMainWindow::eventFilter(watched, event);
}

void MainWindow::ask_open_run() {
  const QString folder =
      QFileDialog::getExistingDirectory(this, tr("Open run"), settings::runs_root());
  if (folder.isEmpty()) return;
  bool has_spec = false;
  const QString problem = open_run_folder(folder, &has_spec);
  if (problem.isEmpty()) return;
  QMessageBox box(QMessageBox::Information, tr("Open run"), problem, QMessageBox::Close, this);
  QPushButton* clone =
      has_spec ? box.addButton(tr("&Use its job spec in New fine-tune"), QMessageBox::AcceptRole)
               : nullptr;
  box.exec();
  if (!clone || box.clickedButton() != clone) return;
  try {
    wizard_->load_spec(job::load_job_spec(QDir(folder).filePath("job.json").toStdString()));
    show_wizard();
  } catch (const std::exception& e) {
    QMessageBox::warning(this, tr("Open run"), tr("Cannot read its job.json: %1").arg(e.what()));
  }
}

QString MainWindow::open_run_folder(const QString& folder, bool* has_spec) {
  if (has_spec) *has_spec = false;
  const QFileInfo info(folder);
  if (!info.isDir()) return tr("%1 is not a folder.").arg(folder);
  if (!QFileInfo::exists(QDir(folder).filePath("job.json")))
    return tr("%1 is not a run folder: it has no job.json. Every run, started here or with "
              "tessera-cli run, keeps its job spec in job.json in its own folder; choose that "
              "folder.")
        .arg(folder);
  if (has_spec) *has_spec = true;
  const QString canonical = info.canonicalFilePath();
  for (const RunRecord& run : runs_->runs())
    if (QFileInfo(run.output_dir).canonicalFilePath() == canonical) {
      show_page(Runs);
      runs_->open_run(run.id);
      return {};
    }
  return tr("%1 has a job.json, but it is not in the studio's runs database (%2). The studio "
            "records the runs it starts; this one was started elsewhere (for example with "
            "tessera-cli run) or its record was deleted, so there are no charts or status to "
            "show. You can start a new run from its job spec.")
      .arg(folder, store_->path());
}

QString MainWindow::open_job_file(const QString& file) {
  try {
    // load_job_spec's errors name the file and the field at fault.
    wizard_->load_spec(job::load_job_spec(file.toStdString()));
  } catch (const std::exception& e) {
    return tr("Cannot open %1 as a job spec: %2").arg(QDir::toNativeSeparators(file), e.what());
  }
  wizard_->go_to(FineTuneWizard::ModelStep);
  show_wizard();
  return {};
}

void MainWindow::try_demo() {
  show_page(NewFineTune);
  demo_offer_->setVisible(true);
  demo_offer_->make_demo(settings::cli_program(), settings::demo_dir());
}

void MainWindow::show_page(Page page) {
  sidebar_->setCurrentRow(int(page));
  stack_->setCurrentIndex(int(page));
}

void MainWindow::show_wizard() {
  show_page(NewFineTune);
  // The focus was in the sidebar (Ctrl+N, the menu), where it stays, or on the page just hidden
  // (a button), and then QStackedLayout moves it to the new page's first widget in the tab
  // chain: the wizard's list of steps. Either way the next keys typed belong in the step.
  QWidget* step = nullptr;
  switch (wizard_->current_page()) {
    case FineTuneWizard::ModelStep:
      step = wizard_->model_page();
      break;
    case FineTuneWizard::DatasetStep:
      step = wizard_->dataset_page();
      break;
    case FineTuneWizard::MethodStep:
      step = wizard_->method_page();
      break;
    case FineTuneWizard::HardwareStep:
      step = wizard_->hardware_page();
      break;
    default:
      step = wizard_->review_page();
      break;
  }
  for (QWidget* w = step->nextInFocusChain(); w && w != step; w = w->nextInFocusChain())
    if (step->isAncestorOf(w) && (w->focusPolicy() & Qt::TabFocus) && w->isVisible() &&
        w->isEnabled() && !w->focusProxy()) {
      w->setFocus(Qt::OtherFocusReason);
      return;
    }
}

MainWindow::Page MainWindow::current_page() const {
  return Page(stack_->currentIndex());
}

QWidget* MainWindow::page_widget(Page page) const {
  return stack_->widget(int(page));
}

QString MainWindow::resume(const RunRecord& run) {
  if ((live_ && live_->running()) || resume_pending_)
    return tr("A run is in progress; wait for it to finish or stop it first.");
  if (QString why_not = resume_blocker(run); !why_not.isEmpty())
    return tr("Cannot resume %1: %2").arg(run.name.isEmpty() ? run.id : run.name, why_not);
  follow_recorded(run, /*reattach=*/false);
  return {};
}

void MainWindow::follow_recorded(const RunRecord& run, bool reattach) {
  resume_pending_ = true;
  auto* watcher = new QFutureWatcher<RunSeries>(this);
  connect(watcher, &QFutureWatcher<RunSeries>::finished, this, [this, watcher, run, reattach] {
    watcher->deleteLater();
    resume_pending_ = false;
    RunSeries recorded;
    try {
      recorded = watcher->result();
    } catch (const std::exception& e) {
      QMessageBox::warning(this, reattach ? tr("Reattach") : tr("Resume"),
                           tr("Cannot read the run's history: %1").arg(e.what()));
      return;
    }
    if (live_) live_->deleteLater();
    live_ = new RunMonitor(store_, this);
    if (reattach) {
      live_->reattach(run, recorded.next_event_seq);
      statusBar()->showMessage(
          tr("%1 kept training while the studio was closed; following it again.")
              .arg(run.name.isEmpty() ? run.id : run.name));
    } else {
      live_->resume_detached(run, settings::cli_program(), resume_arguments(run),
                             recorded.next_event_seq);
    }
    runs_->show_live(live_, &recorded);
    show_page(Runs);
  });
  watcher->setFuture(store_->load_series_async(run.id));
}

QString MainWindow::launch(const job::JobSpec& spec) {
  if ((live_ && live_->running()) || resume_pending_)
    return tr("A run is in progress; wait for it to finish or stop it first.");
  const QString dir = QString::fromStdString(spec.output.dir);
  if (spec.nodes && probe_->finished() && !probe_->supports("launch"))
    return tr("This tessera-cli (%1) has no `launch` command, which runs a job as several "
              "processes; choose 1 process in Hardware & strategy, or a newer tessera-cli in "
              "Settings.")
        .arg(probe_->program());
  if (QFileInfo::exists(dir)) return tr("%1 already exists; every run needs a new folder").arg(dir);
  if (!QDir().mkpath(dir)) return tr("Cannot create the run folder %1").arg(dir);
  const QString job_file = QDir(dir).filePath("job.json");
  try {
    job::save_job_spec(spec, job_file.toStdString());
  } catch (const Error& e) {
    return QString::fromStdString(e.what());
  }
  RunRecord run;
  run.id = QFileInfo(dir).fileName();
  run.name = QString::fromStdString(spec.name);
  run.model = model_display_name(QString::fromStdString(spec.model.path));
  run.dataset = dataset_display_name(spec.dataset);
  run.method = QString::fromStdString(spec.method.type);
  run.output_dir = dir;
  run.spec_json = QString::fromStdString(job::to_json(spec).dump());
  if (live_) live_->deleteLater();
  live_ = new RunMonitor(store_, this);
  // Several processes (the spec's "nodes"): `launch` starts them and merges their events.
  live_->start_detached(run, settings::cli_program(),
                        {spec.nodes ? QString("launch") : QString("run"), job_file});
  runs_->show_live(live_);
  show_page(Runs);
  return {};
}

void MainWindow::closeEvent(QCloseEvent* event) {
  if (live_ && live_->running() && !keep_run_on_quit_) {
    // The run can keep training on its own (a detached child) and be followed again at the
    // next start, or stop after the current step with a checkpoint ("interrupted", resumable).
    event->ignore();
    if (quitting_) return;  // already waiting for the checkpoint
    QMessageBox box(QMessageBox::Question, tr("Quit"), tr("A run is in progress."),
                    QMessageBox::NoButton, this);
    box.setInformativeText(
        tr("Keep training: the run goes on in the background, and tessera follows it again when "
           "you reopen it.\nStop and save: the run stops after the current step with a "
           "checkpoint; Resume on the Runs page continues it."));
    QPushButton* keep =
        live_->detached() ? box.addButton(tr("&Keep training"), QMessageBox::AcceptRole) : nullptr;
    QPushButton* stop = box.addButton(tr("&Stop and save"), QMessageBox::DestructiveRole);
    box.addButton(QMessageBox::Cancel);
    box.setDefaultButton(keep ? keep : stop);
    box.exec();
    if (keep && box.clickedButton() == keep) {
      keep_run_on_quit_ = true;  // and close now (below)
    } else if (box.clickedButton() != stop) {
      return;
    } else {
      quitting_ = true;
      auto* wait = new QProgressDialog(tr("Saving a checkpoint before quitting…"), tr("&Quit now"),
                                       0, 0, this);
      wait->setWindowTitle(tr("Quit"));
      wait->setWindowModality(Qt::WindowModal);
      wait->setMinimumDuration(0);
      wait->setAutoClose(false);
      RunMonitor* run = live_;
      connect(wait, &QProgressDialog::canceled, run, [run] { run->kill_now(); });
      connect(
          run, &RunMonitor::finished, this,
          [this, wait] {
            wait->reset();
            wait->deleteLater();
            close();
          },
          Qt::QueuedConnection);
      run->interrupt();
      wait->show();
      return;
    }
  }
  QSettings s;
  s.setValue("window/geometry", saveGeometry());
  s.setValue("window/page", int(current_page()));
  QMainWindow::closeEvent(event);
}

}  // namespace tessera::ui
