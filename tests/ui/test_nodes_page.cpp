// The Nodes page against a real `tessera-cli agent` bound to 127.0.0.1 (its state in a temporary
// folder, its announcements sent to 127.0.0.1 on a free UDP port) and the page's `tessera-cli
// nodes` children with their own XDG_CONFIG_HOME: the empty state and the security sentence,
// discovery, pairing through the code (the test answers the agent's prompt with the code it
// printed, as its user would), the pre-flight checks with a failure's reason and what to do,
// the measured link, and Remove.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <QDialog>
#include <QDir>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>
#include <QTreeWidget>
#include <memory>

#include "tests/ui/studio_fixture.h"
#include "ui/pages/nodes_page.h"
#include "ui/widgets/charts.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;

namespace {

// A port the system had free on 127.0.0.1 a moment ago (TCP or UDP).
int free_port(bool udp) {
  const int fd = socket(AF_INET, udp ? SOCK_DGRAM : SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), size) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0)
    port = ntohs(address.sin_port);
  close(fd);
  return port;
}

// MemTotal of /proc/meminfo in bytes.
double meminfo_total() {
  QFile f("/proc/meminfo");
  if (!f.open(QIODevice::ReadOnly)) return 0;
  const QRegularExpression re(R"(MemTotal:\s+(\d+) kB)");
  return re.match(QString::fromLatin1(f.readAll())).captured(1).toDouble() * 1024.0;
}

// statvfs's space free to an unprivileged user in the file system holding `folder`.
double free_bytes(const QString& folder) {
  struct statvfs vfs {};
  if (statvfs(folder.toUtf8().constData(), &vfs) != 0) return -1;
  return double(vfs.f_bavail) * double(vfs.f_frsize);
}

// A `tessera-cli agent` child whose output is read line by line and whose prompt the test
// answers through its stdin.
class Agent {
 public:
  Agent(const QString& state_dir, int port, int discovery_port, const QStringList& env_extra) {
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    for (const QString& kv : env_extra) env.insert(kv.section('=', 0, 0), kv.section('=', 1));
    process_.setProcessEnvironment(env);
    process_.setProcessChannelMode(QProcess::MergedChannels);
    process_.start(studio_cli(),
                   {"agent", "--bind", "127.0.0.1", "--port", QString::number(port), "--state-dir",
                    state_dir, "--name", "test-node", "--discovery-port",
                    QString::number(discovery_port), "--announce-to", "127.0.0.1"});
  }
  ~Agent() {
    if (process_.state() != QProcess::NotRunning) {
      process_.terminate();
      if (!process_.waitForFinished(10000)) process_.kill();
      process_.waitForFinished(5000);
    }
  }
  // The first match of `pattern` in what the agent printed, waiting up to `ms`.
  QRegularExpressionMatch wait_for(const QString& pattern, int ms = 20000) {
    const QRegularExpression re(pattern);
    QRegularExpressionMatch m;
    (void)QTest::qWaitFor(
        [&] {
          output_ += QString::fromUtf8(process_.readAll());
          m = re.match(output_);
          return m.hasMatch();
        },
        ms);
    return m;
  }
  void answer(const QString& line) { process_.write((line + "\n").toUtf8()); }
  QString output() {
    output_ += QString::fromUtf8(process_.readAll());
    return output_;
  }

 private:
  QProcess process_;
  QString output_;
};

}  // namespace

class TestNodesPage : public QObject {
  Q_OBJECT

  std::unique_ptr<QTemporaryDir> tmp_;
  int port_ = 0, discovery_port_ = 0;

  QString path(const QString& name) const { return QDir(tmp_->path()).filePath(name); }

  std::unique_ptr<Agent> start_agent(const QStringList& env = {}) {
    auto agent = std::make_unique<Agent>(path("agent-state"), port_, discovery_port_, env);
    const auto m = agent->wait_for(QString("listening on 127\\.0\\.0\\.1:%1").arg(port_));
    if (!m.hasMatch()) qWarning("agent did not start:\n%s", qPrintable(agent->output()));
    return agent;
  }

  std::unique_ptr<NodesPage> make_page() {
    auto page = std::make_unique<NodesPage>();
    page->set_cli(studio_cli());
    page->set_discovery(discovery_port_, 2.5);  // the agent announces every 2 s
    page->set_link_bytes(1 << 20);
    page->resize(1100, 700);
    return page;
  }

  QTreeWidgetItem* row_of(NodesPage& page, const QString& name) {
    for (int i = 0; i < page.table()->topLevelItemCount(); ++i)
      if (page.table()->topLevelItem(i)->data(0, Qt::UserRole).toString() == name)
        return page.table()->topLevelItem(i);
    return nullptr;
  }

  // Pairs `page` with the agent through the dialog (from `start`: the Pair button or Add by
  // address), the test typing the agent's code into the agent as its user would.
  void pair(NodesPage& page, Agent& agent, const std::function<void()>& start, bool match) {
    QSignalSpy finished(&page, &NodesPage::pairingFinished);
    start();
    QTRY_VERIFY_WITH_TIMEOUT(page.pairing_dialog()->isVisible(), 20000);
    const QString shown = page.pairing_code_label()->text();
    const auto m = agent.wait_for(R"(pairing code (\d{6}))");
    QVERIFY2(m.hasMatch(), qPrintable(agent.output()));
    QCOMPARE(shown, m.captured(1));  // the code shown here is the agent's
    if (match) agent.answer(m.captured(1));
    QTest::mouseClick(match ? page.codes_match_button() : page.codes_differ_button(),
                      Qt::LeftButton);
    QVERIFY(finished.wait(30000));
    QCOMPARE(finished.at(0).at(0).toBool(), match);
  }

 private Q_SLOTS:
  void init() {
    tmp_ = std::make_unique<QTemporaryDir>();
    QVERIFY(tmp_->isValid());
    qputenv("XDG_CONFIG_HOME", path("client-config").toUtf8());  // the page's nodes.json
    port_ = free_port(false);
    discovery_port_ = free_port(true);
  }

  void cleanup() { tmp_.reset(); }

  // Nothing paired, nothing announcing: this machine alone, what to run on the other machine,
  // the security sentence, and this machine's RAM as /proc/meminfo says it.
  void empty_state() {
    auto page = make_page();
    page->show();
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 20000);
    QCOMPARE(page->nodes().size(), 1);
    QVERIFY(page->nodes().front().this_machine);
    QVERIFY(page->empty_label()->isVisible());
    QVERIFY2(page->empty_label()->text().contains("tessera-cli agent --bind ADDRESS"),
             qPrintable(page->empty_label()->text()));
    const QString security = page->security_label()->text();
    QVERIFY2(security.contains("neither authenticated nor encrypted") &&
                 security.contains("trusted network"),
             qPrintable(security));
    QVERIFY(page->security_label()->isVisible());
    const QString profile = page->profile_label()->text();
    QVERIFY2(profile.contains(QString("of %1").arg(format_bytes(meminfo_total()))),
             qPrintable(profile));
    QVERIFY(!page->check_button()->isEnabled());
    QVERIFY(!page->remove_button()->isEnabled());
    QVERIFY(!page->add_button()->isEnabled());  // no address typed
    screenshot(page.get(), "nodes-empty");
  }

  // Discovered, paired with Pair (codes compared), checked (all pass, the link measured, the
  // profile as this machine reports it), removed.
  void discover_pair_check_remove() {
    auto agent = start_agent();
    auto page = make_page();
    QSignalSpy discovered(page.get(), &NodesPage::discovered);
    page->show();
    QTRY_VERIFY_WITH_TIMEOUT(page->discover_progress()->isVisible(), 5000);
    QVERIFY(discovered.wait(15000));
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 20000);
    const NodesPage::Node* node = page->find("test-node");
    QVERIFY2(node, qPrintable(page->status_label()->text()));
    QVERIFY(node->discovered && !node->paired);
    QCOMPARE(node->endpoint(), QString("127.0.0.1:%1").arg(port_));
    QVERIFY(!page->empty_label()->isVisible());
    page->table()->setCurrentItem(row_of(*page, "test-node"));
    QVERIFY(row_of(*page, "test-node")->text(2).contains("not paired"));
    QVERIFY(page->pair_button()->isEnabled());
    QVERIFY(!page->check_button()->isEnabled());

    pair(
        *page, *agent, [&] { QTest::mouseClick(page->pair_button(), Qt::LeftButton); }, true);
    QTRY_VERIFY_WITH_TIMEOUT(page->find("test-node") && page->find("test-node")->paired, 10000);
    QVERIFY(agent->wait_for("paired with").hasMatch());
    // What the CLI itself now lists.
    QProcess list;
    list.start(studio_cli(), {"nodes", "list", "--json"});
    QVERIFY(list.waitForFinished(20000));
    const QJsonArray listed = QJsonDocument::fromJson(list.readAllStandardOutput()).array();
    QCOMPARE(listed.size(), 1);
    QCOMPARE(listed[0].toObject().value("name").toString(), QString("test-node"));

    page->table()->setCurrentItem(row_of(*page, "test-node"));
    QVERIFY(page->check_button()->isEnabled());
    QSignalSpy checked(page.get(), &NodesPage::checkFinished);
    const double free_before = free_bytes(path("agent-state"));
    QTest::mouseClick(page->check_button(), Qt::LeftButton);
    QVERIFY(checked.wait(60000));
    const double free_after = free_bytes(path("agent-state"));
    node = page->find("test-node");
    QVERIFY2(node->check_error.isEmpty(), qPrintable(node->check_error));
    const QJsonArray checks = node->check.value("checks").toArray();
    QVERIFY(checks.size() >= 7);
    QCOMPARE(page->checks_view()->topLevelItemCount(), checks.size());
    for (int i = 0; i < checks.size(); ++i) {
      QTreeWidgetItem* item = page->checks_view()->topLevelItem(i);
      QCOMPARE(item->text(0), checks[i].toObject().value("name").toString());
      QCOMPARE(item->text(1), QString("passed"));
      QCOMPARE(item->text(2), checks[i].toObject().value("detail").toString());
    }
    QVERIFY2(page->check_summary_label()->text().startsWith(
                 QString("All %1 pre-flight checks passed").arg(checks.size())),
             qPrintable(page->check_summary_label()->text()));
    QVERIFY(row_of(*page, "test-node")->text(2).contains("all"));
    // The link as measured, to the shown precision.
    QJsonObject link;
    for (const QJsonValue& c : checks)
      if (c.toObject().value("name").toString() == "c10d link")
        link = c.toObject().value("measured").toObject();
    QVERIFY(link.value("latency_ms").toDouble() > 0);
    QVERIFY(link.value("bandwidth_mb_s").toDouble() > 0);
    const QString link_text = page->link_label()->text();
    QVERIFY2(link_text.contains(
                 QString("latency %1 ms").arg(link.value("latency_ms").toDouble(), 0, 'f', 3)) &&
                 link_text.contains(QString("bandwidth %1 MB/s")
                                        .arg(link.value("bandwidth_mb_s").toDouble(), 0, 'f', 0)),
             qPrintable(link_text));
    QCOMPARE(link.value("bytes").toDouble(), double(1 << 20));
    // The node's profile: the agent runs on this machine, so its RAM total is /proc/meminfo's
    // and its disk is the agent's state folder, with statvfs's free space: between the free
    // space read before and after the check, give or take 256 MiB that tests running beside
    // this one write and delete meanwhile (CI saw a 128 MiB file come and go).
    const QString profile = page->profile_label()->text();
    QVERIFY2(profile.contains(QString("of %1").arg(format_bytes(meminfo_total()))),
             qPrintable(profile));
    const QJsonObject facts = node->check.value("facts").toObject();
    QVERIFY2(profile.contains(facts.value("disk_path").toString()), qPrintable(profile));
    const double reported_free = facts.value("disk_free").toDouble();
    const double slack = 256.0 * (1 << 20);
    QVERIFY2(reported_free >= std::min(free_before, free_after) - slack &&
                 reported_free <= std::max(free_before, free_after) + slack,
             qPrintable(QString("reported %1, statvfs %2 before and %3 after")
                            .arg(reported_free)
                            .arg(free_before)
                            .arg(free_after)));
    QVERIFY(profile.contains("GPUs: "));
    screenshot(page.get(), "nodes-checked");

    QTest::mouseClick(page->remove_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(page->find("test-node") && !page->find("test-node")->paired, 20000);
    QVERIFY(page->status_label()->text().contains("Removed “test-node”"));
    list.start(studio_cli(), {"nodes", "list", "--json"});
    QVERIFY(list.waitForFinished(20000));
    QCOMPARE(QJsonDocument::fromJson(list.readAllStandardOutput()).array().size(), 0);
  }

  // A node whose Tessera version differs: its check fails with the reason and what to do.
  void failed_check_says_why() {
    auto agent = start_agent({"TESSERA_AGENT_TEST_TESSERA_VERSION=9.9.9"});
    auto page = make_page();
    page->set_discovery(discovery_port_, 0.3);
    page->show();
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 20000);
    page->address_edit()->setText(QString("127.0.0.1:%1").arg(port_));
    QVERIFY(page->add_button()->isEnabled());
    pair(
        *page, *agent, [&] { QTest::mouseClick(page->add_button(), Qt::LeftButton); }, true);
    QTRY_VERIFY_WITH_TIMEOUT(page->find("test-node") && page->find("test-node")->paired, 10000);
    QSignalSpy checked(page.get(), &NodesPage::checkFinished);
    page->check_node("test-node");
    QVERIFY(checked.wait(60000));
    page->table()->setCurrentItem(row_of(*page, "test-node"));
    const NodesPage::Node* node = page->find("test-node");
    QJsonObject failing;
    int failed = 0;
    for (const QJsonValue& c : node->check.value("checks").toArray())
      if (!c.toObject().value("ok").toBool()) {
        ++failed;
        failing = c.toObject();
      }
    QCOMPARE(failed, 1);
    QCOMPARE(failing.value("name").toString(), QString("tessera version"));
    QTreeWidgetItem* item = nullptr;
    for (int i = 0; i < page->checks_view()->topLevelItemCount(); ++i)
      if (page->checks_view()->topLevelItem(i)->text(1) == "failed")
        item = page->checks_view()->topLevelItem(i);
    QVERIFY(item);
    QCOMPARE(item->text(0), QString("tessera version"));
    QCOMPARE(item->childCount(), 2);
    QCOMPARE(item->child(0)->text(0), QString("reason"));
    QCOMPARE(item->child(0)->text(2), failing.value("reason").toString());
    QVERIFY(item->child(0)->text(2).contains("9.9.9"));
    QCOMPARE(item->child(1)->text(0), QString("what to do"));
    QCOMPARE(item->child(1)->text(2), failing.value("hint").toString());
    QVERIFY(!item->child(1)->text(2).isEmpty());
    const int total = node->check.value("checks").toArray().size();
    QVERIFY2(page->check_summary_label()->text().startsWith(
                 QString("1 of %1 pre-flight checks failed").arg(total)),
             qPrintable(page->check_summary_label()->text()));
    QVERIFY(
        row_of(*page, "test-node")->text(2).contains(QString("1 of %1 checks failed").arg(total)));
    QVERIFY(page->profile_label()->text().contains("TESSERA_AGENT_TEST_TESSERA_VERSION=9.9.9"));
  }

  // "They differ": the pairing is refused and nothing is stored.
  void codes_that_differ_refuse() {
    auto agent = start_agent();
    auto page = make_page();
    page->set_discovery(discovery_port_, 0.3);
    page->show();
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 20000);
    page->address_edit()->setText(QString("127.0.0.1:%1").arg(port_));
    pair(
        *page, *agent, [&] { QTest::mouseClick(page->add_button(), Qt::LeftButton); }, false);
    QVERIFY2(page->status_label()->text().contains("not confirmed"),
             qPrintable(page->status_label()->text()));
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 10000);
    // Not paired. The agent still announces itself, so discovery may list it, unpaired (CI once
    // heard it before this line).
    const NodesPage::Node* node = page->find("test-node");
    QVERIFY2(!node || (!node->paired && node->discovered),
             node && node->paired ? "paired" : "listed, not heard");
    QProcess list;
    list.start(studio_cli(), {"nodes", "list", "--json"});
    QVERIFY(list.waitForFinished(20000));
    QCOMPARE(QJsonDocument::fromJson(list.readAllStandardOutput()).array().size(), 0);
    QVERIFY(agent->wait_for("refused").hasMatch());
  }

  // An address where no agent listens: the CLI's reason, and the page ready again.
  void unreachable_address() {
    auto page = make_page();
    page->set_discovery(discovery_port_, 0.3);
    page->show();
    QTRY_VERIFY_WITH_TIMEOUT(!page->busy(), 20000);
    QSignalSpy finished(page.get(), &NodesPage::pairingFinished);
    QCOMPARE(page->pair_with(QString("127.0.0.1:%1").arg(port_)), QString());
    QVERIFY(finished.wait(30000));
    QCOMPARE(finished.at(0).at(0).toBool(), false);
    QVERIFY2(page->status_label()->text().contains("error: "),
             qPrintable(page->status_label()->text()));
    QVERIFY(!page->pairing_dialog()->isVisible());
    QVERIFY(!page->pairing());
  }
};

QTEST_MAIN(TestNodesPage)
#include "test_nodes_page.moc"
