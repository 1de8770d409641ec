#include "ui/pages/nodes_page.h"

#include <QDateTime>
#include <QDialog>
#include <QDialogButtonBox>
#include <QFontDatabase>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QLabel>
#include <QLineEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QSplitter>
#include <QSysInfo>
#include <QTreeWidget>
#include <QVBoxLayout>

#include "ui/utility/studio_settings.h"
#include "ui/widgets/charts.h"

namespace tessera::ui {

namespace {

enum Column { NameColumn, AddressColumn, StatusColumn, VersionColumn };

// The CLI's own error lines ("error: …", "hint: …") as one message; else the output's tail.
QString cli_error(QProcess* process, const QString& what) {
  const QString err = QString::fromUtf8(process->readAllStandardError()).trimmed();
  QStringList lines;
  for (const QString& line : err.split('\n'))
    if (line.startsWith("error: ") || line.startsWith("hint: ")) lines << line;
  if (process->error() == QProcess::FailedToStart)
    return QObject::tr("%1: cannot start %2 (%3); set tessera-cli in Settings")
        .arg(what, process->program(), process->errorString());
  if (!lines.isEmpty()) return what + ": " + lines.join(' ');
  return QObject::tr("%1 failed (exit code %2)%3")
      .arg(what)
      .arg(process->exitCode())
      .arg(err.isEmpty() ? QString() : ": " + err.right(400));
}

QString gpus_text(const QJsonArray& gpus, const char* memory_key) {
  if (gpus.isEmpty()) return QObject::tr("none (trains on the CPU)");
  QStringList names;
  for (const QJsonValue& g : gpus)
    names << QObject::tr("%1, %2").arg(g.toObject().value("name").toString(),
                                       format_bytes(g.toObject().value(memory_key).toDouble()));
  return names.join("; ");
}

}  // namespace

NodesPage::NodesPage(QWidget* parent) : QWidget(parent), cli_(settings::cli_program()) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  security_ = new QLabel(
      tr("Pairing protects the requests this studio sends to a node's agent. The training "
         "traffic between the processes of a job (c10d: the rendezvous store and the Gloo or "
         "NCCL collectives) is neither authenticated nor encrypted, so use other machines only "
         "on a trusted network."));
  security_->setObjectName("nodesSecurity");
  security_->setWordWrap(true);
  security_->setFrameShape(QFrame::StyledPanel);
  security_->setMargin(6);
  layout->addWidget(security_);

  auto* actions = new QHBoxLayout;
  discover_ = new QPushButton(tr("&Discover"));
  discover_->setToolTip(tr("Listen for agents announcing themselves on the local network"));
  progress_ = new QProgressBar;
  progress_->setRange(0, 1000);
  progress_->setVisible(false);
  progress_->setTextVisible(true);
  address_ = new QLineEdit;
  address_->setPlaceholderText(tr("address[:port] of a machine running tessera-cli agent"));
  address_->setAccessibleName(tr("Node address"));
  address_->setClearButtonEnabled(true);
  add_ = new QPushButton(tr("Add by &address…"));
  add_->setToolTip(
      tr("Pair with the agent at this address (a node on another subnet, or behind a firewall "
         "that drops the announcements)"));
  add_->setEnabled(false);
  actions->addWidget(discover_);
  actions->addWidget(progress_, 1);
  actions->addSpacing(fontMetrics().averageCharWidth() * 2);
  actions->addWidget(address_, 1);
  actions->addWidget(add_);
  layout->addLayout(actions);

  status_ = new QLabel;
  status_->setObjectName("nodesStatus");
  status_->setWordWrap(true);
  status_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  status_->setVisible(false);
  layout->addWidget(status_);

  table_ = new QTreeWidget;
  table_->setRootIsDecorated(false);
  table_->setHeaderLabels({tr("Machine"), tr("Address"), tr("Status"), tr("Tessera")});
  table_->setAccessibleName(tr("Machines"));
  table_->header()->setSectionResizeMode(StatusColumn, QHeaderView::Stretch);
  table_->header()->setStretchLastSection(false);
  empty_ = new QLabel;
  empty_->setObjectName("nodesEmpty");
  empty_->setWordWrap(true);
  empty_->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  empty_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  empty_->setText(
      tr("No other machine yet. On the other machine, start the agent on the address this "
         "machine reaches it at:\n\n    tessera-cli agent --bind ADDRESS\n\n(ADDRESS: its IPv4 "
         "address on this network, or an interface name such as eth0). It announces itself "
         "every 2 s: Discover finds it here, then Pair. A machine on another subnet, or behind a "
         "firewall that drops UDP broadcasts, is added by its address (port 47611 unless the "
         "agent was given --port)."));
  auto* list_panel = new QWidget;
  auto* list_layout = new QVBoxLayout(list_panel);
  list_layout->setContentsMargins(0, 0, 0, 0);
  list_layout->addWidget(table_, 2);
  list_layout->addWidget(empty_, 1);

  auto* details = new QGroupBox(tr("Selected machine"));
  auto* details_layout = new QVBoxLayout(details);
  details_title_ = new QLabel;
  QFont bold = details_title_->font();
  bold.setBold(true);
  details_title_->setFont(bold);
  node_status_ = new QLabel;
  node_status_->setWordWrap(true);
  profile_ = new QLabel;
  profile_->setObjectName("nodeProfile");
  profile_->setWordWrap(true);
  profile_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  check_summary_ = new QLabel;
  check_summary_->setObjectName("nodeCheckSummary");
  check_summary_->setWordWrap(true);
  check_summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  link_ = new QLabel;
  link_->setObjectName("nodeLink");
  link_->setWordWrap(true);
  link_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  checks_ = new QTreeWidget;
  checks_->setHeaderLabels({tr("Check"), tr("Result"), tr("Found")});
  checks_->setAccessibleName(tr("Pre-flight checks"));
  checks_->setWordWrap(true);
  checks_->header()->setStretchLastSection(true);
  auto* buttons = new QHBoxLayout;
  pair_ = new QPushButton(tr("&Pair"));
  pair_->setToolTip(
      tr("Pair with this machine's agent: both sides show a 6-digit code to compare"));
  check_ = new QPushButton(tr("Chec&k"));
  check_->setToolTip(
      tr("Run the pre-flight checks on this node (versions, CPU ISA, CUDA/NCCL, free RAM, disk "
         "and GPU memory) and measure the c10d link to it"));
  remove_ = new QPushButton(tr("Re&move"));
  remove_->setToolTip(tr("Forget this node and its secret here (pair again to use it)"));
  buttons->addWidget(pair_);
  buttons->addWidget(check_);
  buttons->addStretch(1);
  buttons->addWidget(remove_);
  details_layout->addWidget(details_title_);
  details_layout->addWidget(node_status_);
  details_layout->addWidget(profile_);
  details_layout->addLayout(buttons);
  details_layout->addWidget(check_summary_);
  details_layout->addWidget(link_);
  details_layout->addWidget(checks_, 1);

  auto* split = new QSplitter(Qt::Horizontal);
  split->addWidget(list_panel);
  split->addWidget(details);
  split->setChildrenCollapsible(false);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 1);
  layout->addWidget(split, 1);

  // The pairing dialog: the code, and whether the other machine shows the same one.
  pairing_dialog_ = new QDialog(this);
  pairing_dialog_->setWindowTitle(tr("Pair with a node"));
  pairing_dialog_->setWindowModality(Qt::WindowModal);
  auto* dialog_layout = new QVBoxLayout(pairing_dialog_);
  pairing_text_ = new QLabel;
  pairing_text_->setWordWrap(true);
  pairing_code_ = new QLabel;
  pairing_code_->setObjectName("pairingCode");
  QFont code_font = QFontDatabase::systemFont(QFontDatabase::FixedFont);
  code_font.setPointSizeF(code_font.pointSizeF() * 2.5);
  code_font.setBold(true);
  pairing_code_->setFont(code_font);
  pairing_code_->setAlignment(Qt::AlignCenter);
  pairing_code_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* explain = new QLabel(
      tr("The other machine's agent shows a code too. If it is the same, confirm there (type "
         "the code or yes in the agent's terminal) and here. Codes that differ mean that "
         "something between the machines answered instead of the node: do not pair."));
  explain->setWordWrap(true);
  auto* answer = new QDialogButtonBox;
  codes_match_ = answer->addButton(tr("The codes &match"), QDialogButtonBox::AcceptRole);
  codes_differ_ = answer->addButton(tr("They di&ffer"), QDialogButtonBox::RejectRole);
  dialog_layout->addWidget(pairing_text_);
  dialog_layout->addWidget(pairing_code_);
  dialog_layout->addWidget(explain);
  dialog_layout->addWidget(answer);
  connect(codes_match_, &QPushButton::clicked, this, [this] { answer_pairing(true); });
  connect(codes_differ_, &QPushButton::clicked, this, [this] { answer_pairing(false); });
  connect(pairing_dialog_, &QDialog::rejected, this, [this] { answer_pairing(false); });

  progress_timer_.setInterval(100);
  connect(&progress_timer_, &QTimer::timeout, this, [this] {
    const double elapsed =
        double(QDateTime::currentMSecsSinceEpoch() - discover_started_ms_) / 1000.0;
    progress_->setValue(int(std::min(1.0, elapsed / discover_seconds_) * 1000));
    progress_->setFormat(tr("listening for agents: %1 of %2 s")
                             .arg(QString::number(std::min(elapsed, discover_seconds_), 'f', 1))
                             .arg(discover_seconds_));
  });
  connect(discover_, &QPushButton::clicked, this, &NodesPage::discover);
  connect(address_, &QLineEdit::textChanged, this,
          [this] { add_->setEnabled(!address_->text().trimmed().isEmpty() && !pairing()); });
  connect(address_, &QLineEdit::returnPressed, add_, &QPushButton::click);
  connect(add_, &QPushButton::clicked, this, [this] {
    const QString why_not = pair_with(address_->text().trimmed());
    if (!why_not.isEmpty()) set_status(why_not);
  });
  connect(table_, &QTreeWidget::currentItemChanged, this, &NodesPage::show_selected);
  connect(pair_, &QPushButton::clicked, this, [this] {
    if (const Node* node = find(selected_name())) {
      const QString why_not = pair_with(node->endpoint());
      if (!why_not.isEmpty()) set_status(why_not);
    }
  });
  connect(check_, &QPushButton::clicked, this, [this] { check_node(selected_name()); });
  connect(remove_, &QPushButton::clicked, this, [this] { remove_node(selected_name()); });

  Node self;
  self.this_machine = true;
  self.name = QSysInfo::machineHostName();
  self.address = tr("this machine");
  nodes_.push_back(self);
  rebuild_table();
}

NodesPage::~NodesPage() {
  // Children still running are ended with the page (their results have nowhere to go).
  for (QProcess* p : findChildren<QProcess*>()) {
    p->disconnect(this);
    if (p->state() != QProcess::NotRunning) {
      p->kill();
      p->waitForFinished(2000);
    }
  }
}

void NodesPage::set_cli(const QString& cli) {
  cli_ = cli;
}

void NodesPage::set_discovery(int port, double seconds) {
  discovery_port_ = port;
  discover_seconds_ = seconds;
}

bool NodesPage::busy() const {
  if (discovering() || listing() || pairing() || remove_process_ || profile_process_) return true;
  return !check_processes_.isEmpty();
}

void NodesPage::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  if (shown_once_) return;
  shown_once_ = true;
  refresh();
}

QProcess* NodesPage::start_cli(const QStringList& args) {
  auto* process = new QProcess(this);
  process->setProgram(cli_);
  process->setArguments(args);
  return process;
}

void NodesPage::refresh() {
  list_paired();
  profile_this_machine();
  discover();
}

void NodesPage::profile_this_machine() {
  if (profile_process_ || !this_profile_.isEmpty()) return;
  QProcess* p = profile_process_ = start_cli({"profile", "--json", "--no-disk"});
  connect(p, &QProcess::finished, this, [this, p](int code, QProcess::ExitStatus) {
    p->deleteLater();
    const QJsonDocument doc = QJsonDocument::fromJson(p->readAllStandardOutput());
    if (code == 0 && doc.isObject())
      this_profile_ = doc.object();
    else
      this_profile_error_ = cli_error(p, tr("tessera-cli profile"));
    show_selected();
  });
  connect(p, &QProcess::errorOccurred, this, [this, p](QProcess::ProcessError e) {
    if (e != QProcess::FailedToStart) return;
    p->deleteLater();
    this_profile_error_ = cli_error(p, tr("tessera-cli profile"));
    show_selected();
  });
  p->start();
}

void NodesPage::list_paired() {
  if (list_process_) return;
  QProcess* p = list_process_ = start_cli({"nodes", "list", "--json"});
  connect(p, &QProcess::finished, this, [this, p](int code, QProcess::ExitStatus) {
    p->deleteLater();
    if (code == 0)
      on_listed(p->readAllStandardOutput());
    else
      set_status(cli_error(p, tr("tessera-cli nodes list")));
  });
  connect(p, &QProcess::errorOccurred, this, [this, p](QProcess::ProcessError e) {
    if (e != QProcess::FailedToStart) return;
    p->deleteLater();
    set_status(cli_error(p, tr("tessera-cli nodes list")));
  });
  p->start();
}

void NodesPage::discover() {
  if (discover_process_) return;
  QStringList args = {"nodes", "discover", "--json", "--seconds",
                      QString::number(discover_seconds_)};
  if (discovery_port_ > 0) args << "--discovery-port" << QString::number(discovery_port_);
  QProcess* p = discover_process_ = start_cli(args);
  discover_->setEnabled(false);
  discover_started_ms_ = QDateTime::currentMSecsSinceEpoch();
  progress_->setValue(0);
  progress_->setVisible(true);
  progress_timer_.start();
  auto end = [this] {
    progress_timer_.stop();
    progress_->setVisible(false);
    discover_->setEnabled(true);
  };
  connect(p, &QProcess::finished, this, [this, p, end](int code, QProcess::ExitStatus) {
    p->deleteLater();
    end();
    if (code == 0)
      on_discovered(p->readAllStandardOutput());
    else
      set_status(cli_error(p, tr("tessera-cli nodes discover")));
    Q_EMIT discovered();
  });
  connect(p, &QProcess::errorOccurred, this, [this, p, end](QProcess::ProcessError e) {
    if (e != QProcess::FailedToStart) return;
    p->deleteLater();
    end();
    set_status(cli_error(p, tr("tessera-cli nodes discover")));
    Q_EMIT discovered();
  });
  p->start();
}

void NodesPage::on_listed(const QByteArray& json) {
  const QJsonArray list = QJsonDocument::fromJson(json).array();
  QStringList ids;
  for (const QJsonValue& v : list) {
    const QJsonObject o = v.toObject();
    const QString id = o.value("node_id").toString();
    ids << id;
    auto it = std::find_if(nodes_.begin(), nodes_.end(),
                           [&](const Node& n) { return !n.this_machine && n.node_id == id; });
    if (it == nodes_.end()) it = nodes_.insert(nodes_.end(), Node{});
    it->node_id = id;
    it->name = o.value("name").toString();
    it->address = o.value("address").toString();
    it->port = o.value("port").toInt();
    it->paired_at = o.value("paired_at").toString();
    it->paired = true;
  }
  // Removed elsewhere (or here): no longer paired; kept while its announcements are heard.
  for (Node& n : nodes_)
    if (!n.this_machine && !ids.contains(n.node_id)) n.paired = false;
  nodes_.removeIf([](const Node& n) { return !n.this_machine && !n.paired && !n.discovered; });
  rebuild_table();
}

void NodesPage::on_discovered(const QByteArray& json) {
  const QJsonArray heard = QJsonDocument::fromJson(json).array();
  for (Node& n : nodes_) n.discovered = false;
  for (const QJsonValue& v : heard) {
    const QJsonObject o = v.toObject();
    const QString id = o.value("node_id").toString();
    auto it = std::find_if(nodes_.begin(), nodes_.end(),
                           [&](const Node& n) { return !n.this_machine && n.node_id == id; });
    if (it == nodes_.end()) {
      it = nodes_.insert(nodes_.end(), Node{});
      it->node_id = id;
      it->name = o.value("name").toString();
    }
    it->discovered = true;
    it->version = o.value("version").toString();
    if (!it->paired) {  // a paired node keeps the name and address it was paired under
      it->address = o.value("address").toString();
      it->port = o.value("port").toInt();
    }
  }
  nodes_.removeIf([](const Node& n) { return !n.this_machine && !n.paired && !n.discovered; });
  rebuild_table();
}

QString NodesPage::pair_with(const QString& address) {
  if (pairing()) return tr("A pairing is in progress; finish it first.");
  if (address.isEmpty()) return tr("Type the node's address (host or host:port) first.");
  pair_target_ = address;
  pair_stdout_.clear();
  pair_code_.clear();
  pair_answered_ = false;
  QProcess* p = pair_process_ = start_cli({"nodes", "add", address});
  connect(p, &QProcess::readyReadStandardOutput, this, &NodesPage::on_pair_output);
  connect(p, &QProcess::finished, this,
          [this](int code, QProcess::ExitStatus) { on_pair_finished(code); });
  connect(p, &QProcess::errorOccurred, this, [this](QProcess::ProcessError e) {
    if (e == QProcess::FailedToStart) on_pair_finished(-1);
  });
  add_->setEnabled(false);
  pair_->setEnabled(false);
  set_status(tr("Pairing with %1: waiting for its agent…").arg(address));
  p->start();
  return {};
}

void NodesPage::on_pair_output() {
  if (!pair_process_) return;
  pair_stdout_ += pair_process_->readAllStandardOutput();
  // "pairing with "NAME" at ADDRESS: pairing code 123456"
  static const QRegularExpression code_line(
      R"re(pairing with "([^"]*)" at (\S+): pairing code (\d{6}))re");
  const QRegularExpressionMatch m = code_line.match(QString::fromUtf8(pair_stdout_));
  if (!m.hasMatch() || !pair_code_.isEmpty()) return;
  pair_code_ = m.captured(3);
  pairing_text_->setText(
      tr("This machine shows this code for “%1” (%2):").arg(m.captured(1), m.captured(2)));
  pairing_code_->setText(pair_code_);
  set_status(tr("Pairing with “%1”: compare the codes.").arg(m.captured(1)));
  pairing_dialog_->open();
}

void NodesPage::answer_pairing(bool match) {
  if (pair_answered_ || !pair_process_) return;
  pair_answered_ = true;
  // `nodes add` reads one line: "yes" confirms, anything else refuses.
  pair_process_->write(match ? "yes\n" : "no\n");
  pair_process_->closeWriteChannel();
  if (pairing_dialog_->isVisible()) pairing_dialog_->hide();
  set_status(match ? tr("Confirmed here; waiting for the node's answer…")
                   : tr("Refused here: the codes differ."));
}

void NodesPage::on_pair_finished(int exit_code) {
  QProcess* p = pair_process_;
  if (!p) return;
  pair_process_ = nullptr;
  p->deleteLater();
  if (pairing_dialog_->isVisible()) pairing_dialog_->hide();
  pair_stdout_ += p->readAllStandardOutput();
  QString message;
  const bool ok = exit_code == 0 && p->exitStatus() == QProcess::NormalExit;
  if (ok) {
    static const QRegularExpression paired_line(R"re(paired with "([^"]*)")re");
    const QString name = paired_line.match(QString::fromUtf8(pair_stdout_)).captured(1);
    message = tr("Paired with “%1” (%2). Check it before a job uses it.").arg(name, pair_target_);
    address_->clear();
  } else {
    message = cli_error(p, tr("Pairing with %1").arg(pair_target_));
  }
  set_status(message);
  add_->setEnabled(!address_->text().trimmed().isEmpty());
  list_paired();
  show_selected();
  Q_EMIT pairingFinished(ok, message);
}

void NodesPage::check_node(const QString& name) {
  Node* node = node_named(name);
  if (!node || node->this_machine || !node->paired || node->checking) return;
  QStringList args = {"nodes", "check", name, "--json"};
  if (link_bytes_ > 0) args << "--link-bytes" << QString::number(link_bytes_);
  QProcess* p = start_cli(args);
  check_processes_.push_back(p);
  node->checking = true;
  node->check_error.clear();
  rebuild_table();
  auto done = [this, p, name](const QString& error) {
    check_processes_.removeAll(p);
    p->deleteLater();
    if (Node* n = node_named(name)) {
      n->checking = false;
      const QJsonDocument doc = QJsonDocument::fromJson(p->readAllStandardOutput());
      // Exit 1 with the checks on stdout: some failed, each with its reason.
      if (error.isEmpty() && doc.isObject() && doc.object().contains("checks")) {
        n->check = doc.object();
        n->check_error.clear();
      } else {
        n->check = {};
        n->check_error = error.isEmpty() ? cli_error(p, tr("tessera-cli nodes check")) : error;
      }
    }
    rebuild_table();
    Q_EMIT checkFinished(name);
  };
  connect(p, &QProcess::finished, this, [done](int, QProcess::ExitStatus) { done({}); });
  connect(p, &QProcess::errorOccurred, this, [this, p, done](QProcess::ProcessError e) {
    if (e == QProcess::FailedToStart) done(cli_error(p, tr("tessera-cli nodes check")));
  });
  p->start();
}

void NodesPage::remove_node(const QString& name) {
  const Node* node = find(name);
  if (!node || node->this_machine || !node->paired || remove_process_) return;
  QProcess* p = remove_process_ = start_cli({"nodes", "remove", name});
  remove_->setEnabled(false);
  connect(p, &QProcess::finished, this, [this, p, name](int code, QProcess::ExitStatus) {
    p->deleteLater();
    set_status(code == 0 ? tr("Removed “%1” and its secret here. Its agent keeps its side until "
                              "its state folder is cleared; pair again to use it.")
                               .arg(name)
                         : cli_error(p, tr("tessera-cli nodes remove")));
    if (Node* n = node_named(name); n && code == 0) n->check = {};
    list_paired();
  });
  p->start();
}

const NodesPage::Node* NodesPage::find(const QString& name) const {
  for (const Node& n : nodes_)
    if (n.name == name) return &n;
  return nullptr;
}

NodesPage::Node* NodesPage::node_named(const QString& name) {
  return const_cast<Node*>(std::as_const(*this).find(name));
}

QString NodesPage::selected_name() const {
  const QTreeWidgetItem* item = table_->currentItem();
  return item ? item->data(NameColumn, Qt::UserRole).toString() : QString();
}

void NodesPage::set_status(const QString& text) {
  status_->setText(text);
  status_->setVisible(!text.isEmpty());
}

namespace {

QString node_status_text(const NodesPage::Node& n) {
  if (n.this_machine) return QObject::tr("runs this studio");
  QStringList parts;
  if (n.checking) return QObject::tr("checking…");
  if (!n.check_error.isEmpty()) parts << QObject::tr("check failed to run");
  if (!n.check.isEmpty()) {
    const QJsonArray checks = n.check.value("checks").toArray();
    int failed = 0;
    for (const QJsonValue& c : checks) failed += c.toObject().value("ok").toBool() ? 0 : 1;
    parts << (failed == 0 ? QObject::tr("all %1 checks passed").arg(checks.size())
                          : QObject::tr("%1 of %2 checks failed").arg(failed).arg(checks.size()));
  }
  if (n.paired)
    parts.prepend(n.discovered ? QObject::tr("paired, announcing")
                               : QObject::tr("paired, not heard in the last discovery"));
  else
    parts.prepend(QObject::tr("not paired: Pair to use it"));
  return parts.join(" · ");
}

}  // namespace

void NodesPage::rebuild_table() {
  const QString selected = selected_name();
  const QSignalBlocker block(table_);
  table_->clear();
  QTreeWidgetItem* current = nullptr;
  for (const Node& n : nodes_) {
    auto* item = new QTreeWidgetItem(table_);
    item->setText(NameColumn, n.this_machine ? tr("%1 (this machine)").arg(n.name) : n.name);
    item->setData(NameColumn, Qt::UserRole, n.name);
    item->setText(AddressColumn, n.this_machine ? QString() : n.endpoint());
    item->setText(StatusColumn, node_status_text(n));
    item->setToolTip(StatusColumn, item->text(StatusColumn));
    item->setText(VersionColumn, n.version);
    if (n.name == selected) current = item;
  }
  for (int c = 0; c < table_->columnCount(); ++c)
    if (c != StatusColumn) table_->resizeColumnToContents(c);
  table_->setCurrentItem(current ? current : table_->topLevelItem(0));
  const bool alone = nodes_.size() == 1;
  empty_->setVisible(alone);
  show_selected();
  Q_EMIT nodesChanged();
}

void NodesPage::show_selected() {
  const Node* n = find(selected_name());
  checks_->clear();
  check_summary_->clear();
  link_->clear();
  pair_->setEnabled(n && !n->this_machine && !n->paired && n->discovered && !pairing());
  check_->setEnabled(n && !n->this_machine && n->paired && !n->checking);
  remove_->setEnabled(n && !n->this_machine && n->paired && !remove_process_);
  if (!n) {
    details_title_->clear();
    node_status_->clear();
    profile_->clear();
    return;
  }
  details_title_->setText(n->this_machine ? tr("%1 (this machine)").arg(n->name)
                                          : tr("%1 — %2").arg(n->name, n->endpoint()));
  QString status = node_status_text(*n);
  if (!n->paired_at.isEmpty()) status += " · " + tr("paired %1").arg(n->paired_at);
  node_status_->setText(tr("Status: %1").arg(status));

  QStringList profile;
  if (n->this_machine) {
    if (this_profile_.isEmpty()) {
      profile << (this_profile_error_.isEmpty() ? tr("Reading this machine's profile…")
                                                : this_profile_error_);
    } else {
      const QJsonObject cpu = this_profile_.value("cpu").toObject();
      const QJsonObject mem = this_profile_.value("memory").toObject();
      QStringList isa;
      const QJsonObject flags = cpu.value("isa").toObject();
      for (auto it = flags.begin(); it != flags.end(); ++it)
        if (it.value().toBool()) isa << it.key();
      profile << tr("CPU: %1, %2 cores (%3 threads); ISA: %4")
                     .arg(cpu.value("model").toString())
                     .arg(cpu.value("physical_cores").toInt())
                     .arg(cpu.value("logical_cores").toInt())
                     .arg(isa.isEmpty() ? tr("no AVX2") : isa.join(", "));
      profile << tr("RAM: %1 available of %2")
                     .arg(format_bytes(mem.value("available").toDouble()),
                          format_bytes(mem.value("total").toDouble()));
      if (this_profile_.value("disk").isObject()) {
        const QJsonObject disk = this_profile_.value("disk").toObject();
        profile << tr("Disk: %1 free at %2")
                       .arg(format_bytes(disk.value("free").toDouble()),
                            disk.value("path").toString());
      }
      profile << tr("GPUs: %1").arg(gpus_text(this_profile_.value("gpus").toArray(), "memory"));
      if (this_profile_.value("link").isObject()) {
        const QJsonObject link = this_profile_.value("link").toObject();
        profile << tr("Link between two local processes: latency %1 ms, bandwidth %2 MB/s")
                       .arg(link.value("latency_s").toDouble() * 1000.0, 0, 'f', 3)
                       .arg(link.value("bandwidth_bytes_per_s").toDouble() / 1e6, 0, 'f', 0);
      }
    }
    profile_->setText(profile.join('\n'));
    return;
  }
  if (n->check.isEmpty()) {
    profile_->setText(n->paired ? tr("Check reads its profile (RAM, disk, CPU, GPUs) from its "
                                     "agent and runs the pre-flight checks.")
                                : tr("Pair with it to read its profile and check it."));
    if (!n->check_error.isEmpty()) check_summary_->setText(n->check_error);
    return;
  }
  const QJsonObject facts = n->check.value("facts").toObject();
  const QJsonObject build = facts.value("build").toObject();
  QStringList features;
  for (const QJsonValue& f : facts.value("cpu_features").toArray()) features << f.toString();
  profile << tr("CPU: %1; ISA: %2; CPU Adam kernel: %3")
                 .arg(facts.value("cpu_model").toString(),
                      features.isEmpty() ? tr("none reported") : features.join(", "),
                      build.value("cpu_adam_kernel").toString().isEmpty()
                          ? tr("none (no LibTorch)")
                          : build.value("cpu_adam_kernel").toString());
  profile << tr("RAM: %1 available of %2")
                 .arg(format_bytes(facts.value("ram_available").toDouble()),
                      format_bytes(facts.value("ram_total").toDouble()));
  profile << tr("Disk: %1 free at %2")
                 .arg(format_bytes(facts.value("disk_free").toDouble()),
                      facts.value("disk_path").toString());
  profile << tr("GPUs: %1").arg(gpus_text(facts.value("gpus").toArray(), "memory_total"));
  profile << tr("Tessera %1, LibTorch %2")
                 .arg(build.value("tessera").toString(), build.value("libtorch").isString()
                                                             ? build.value("libtorch").toString()
                                                             : tr("none"));
  QStringList overrides;
  for (const QJsonValue& o : facts.value("test_overrides").toArray()) overrides << o.toString();
  if (!overrides.isEmpty())
    profile << tr("Test overrides on the node: %1").arg(overrides.join(", "));
  profile_->setText(profile.join('\n'));

  const QJsonArray checks = n->check.value("checks").toArray();
  int failed = 0;
  for (const QJsonValue& v : checks) {
    const QJsonObject c = v.toObject();
    const bool ok = c.value("ok").toBool();
    auto* item = new QTreeWidgetItem(checks_);
    item->setText(0, c.value("name").toString());
    item->setText(1, ok ? tr("passed") : tr("failed"));
    item->setText(2, c.value("detail").toString());
    item->setToolTip(2, c.value("detail").toString());
    if (!ok) {
      ++failed;
      item->setForeground(1, QColor(0xd0, 0x30, 0x30));
      auto* reason = new QTreeWidgetItem(item);
      reason->setText(0, tr("reason"));
      reason->setText(2, c.value("reason").toString());
      reason->setToolTip(2, reason->text(2));
      auto* hint = new QTreeWidgetItem(item);
      hint->setText(0, tr("what to do"));
      hint->setText(2, c.value("hint").toString());
      hint->setToolTip(2, hint->text(2));
      item->setExpanded(true);
    }
    if (c.value("name").toString() == "c10d link" && ok) {
      const QJsonObject m = c.value("measured").toObject();
      link_->setText(tr("c10d link to %1: latency %2 ms, bandwidth %3 MB/s (%4 all_reduce)")
                         .arg(n->name)
                         .arg(m.value("latency_ms").toDouble(), 0, 'f', 3)
                         .arg(m.value("bandwidth_mb_s").toDouble(), 0, 'f', 0)
                         .arg(format_bytes(m.value("bytes").toDouble())));
    }
  }
  checks_->resizeColumnToContents(0);
  checks_->resizeColumnToContents(1);
  check_summary_->setText(
      failed == 0
          ? tr("All %1 pre-flight checks passed: %2 can take part in a job.")
                .arg(checks.size())
                .arg(n->name)
          : tr("%1 of %2 pre-flight checks failed: %3 cannot take part in a job as it is. Each "
               "failure says why and what to do.")
                .arg(failed)
                .arg(checks.size())
                .arg(n->name));
}

}  // namespace tessera::ui
