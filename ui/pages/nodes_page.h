#pragma once
// The Nodes page: this machine and the LAN machines that run `tessera-cli agent` (docs/nodes.md),
// found by `nodes discover --json` (refreshed with a progress bar) or paired earlier
// (`nodes list --json`). "Add by address" and "Pair" drive `nodes add` through its stdin and
// stdout: the 6-digit code it prints is shown, and the user confirms that the other machine shows
// the same one. "Check" runs `nodes check NAME --json`: every pre-flight check with its result,
// the reason and what to do for each failure, the node's profile (RAM, disk, CPU ISA, GPUs) and
// the measured c10d link latency and bandwidth. "Remove" forgets a paired node here. Every
// figure shown is the CLI's output; all of it runs in child processes.
#include <QJsonObject>
#include <QList>
#include <QPointer>
#include <QProcess>
#include <QTimer>
#include <QWidget>

class QDialog;
class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;
class QTreeWidget;

namespace tessera::ui {

class NodesPage : public QWidget {
  Q_OBJECT
 public:
  explicit NodesPage(QWidget* parent = nullptr);
  ~NodesPage() override;

  // One row of the list: this machine, a discovered agent, a paired node, or both.
  struct Node {
    QString name;
    QString node_id;  // 32 hex digits; empty for this machine
    QString address;
    int port = 0;
    QString version;  // from its announcement
    bool this_machine = false;
    bool paired = false;      // in `nodes list`
    bool discovered = false;  // heard in the latest discovery
    QString paired_at;
    QJsonObject check;    // the latest `nodes check --json` answer
    QString check_error;  // why the latest check gave no answer
    bool checking = false;
    QString endpoint() const { return QString("%1:%2").arg(address).arg(port); }
  };

  void set_cli(const QString& cli);
  // Where agents announce themselves (UDP port, `--discovery-port`) and how long a discovery
  // listens (`--seconds`); agents announce every 2 s.
  void set_discovery(int port, double seconds);
  // The bytes of the c10d link test's timed all_reduce (`nodes check --link-bytes`).
  void set_link_bytes(qint64 bytes) { link_bytes_ = bytes; }

  // `nodes list`, this machine's profile (once) and a discovery.
  void refresh();
  void discover();
  void list_paired();
  // Pairs with the agent at `address` ("host[:port]"): `nodes add`, its code shown in the
  // pairing dialog for the user to confirm. "" or why it cannot start.
  QString pair_with(const QString& address);
  void check_node(const QString& name);
  void remove_node(const QString& name);

  const QList<Node>& nodes() const { return nodes_; }
  const Node* find(const QString& name) const;
  bool discovering() const { return discover_process_ != nullptr; }
  bool listing() const { return list_process_ != nullptr; }
  bool pairing() const { return pair_process_ != nullptr; }
  bool busy() const;

  QTreeWidget* table() const { return table_; }
  QTreeWidget* checks_view() const { return checks_; }
  QLabel* security_label() const { return security_; }
  QLabel* empty_label() const { return empty_; }
  QLabel* status_label() const { return status_; }
  QLabel* profile_label() const { return profile_; }
  QLabel* link_label() const { return link_; }
  QLabel* check_summary_label() const { return check_summary_; }
  QProgressBar* discover_progress() const { return progress_; }
  QPushButton* discover_button() const { return discover_; }
  QLineEdit* address_edit() const { return address_; }
  QPushButton* add_button() const { return add_; }
  QPushButton* pair_button() const { return pair_; }
  QPushButton* check_button() const { return check_; }
  QPushButton* remove_button() const { return remove_; }
  // While `nodes add` waits for the user: the code, and the buttons that answer it.
  QDialog* pairing_dialog() const { return pairing_dialog_; }
  QLabel* pairing_code_label() const { return pairing_code_; }
  QPushButton* codes_match_button() const { return codes_match_; }
  QPushButton* codes_differ_button() const { return codes_differ_; }

 Q_SIGNALS:
  void nodesChanged();  // a list, a discovery or a check changed what is shown
  void discovered();
  void pairingFinished(bool ok, const QString& message);
  void checkFinished(const QString& name);

 protected:
  void showEvent(QShowEvent* event) override;

 private:
  QProcess* start_cli(const QStringList& args);
  void profile_this_machine();
  void on_listed(const QByteArray& json);
  void on_discovered(const QByteArray& json);
  void on_pair_output();
  void on_pair_finished(int exit_code);
  void answer_pairing(bool match);
  void rebuild_table();
  void show_selected();
  Node* node_named(const QString& name);
  QString selected_name() const;
  void set_status(const QString& text);

  QString cli_;
  int discovery_port_ = 0;  // 0: the CLI's default
  double discover_seconds_ = 5.0;
  qint64 link_bytes_ = 0;  // 0: the CLI's default
  QList<Node> nodes_;
  QJsonObject this_profile_;
  QString this_profile_error_;
  bool shown_once_ = false;

  QLabel* security_;
  QLabel* status_;
  QPushButton* discover_;
  QProgressBar* progress_;
  QTimer progress_timer_;
  qint64 discover_started_ms_ = 0;
  QLineEdit* address_;
  QPushButton* add_;
  QLabel* empty_;
  QTreeWidget* table_;
  QLabel* details_title_;
  QLabel* node_status_;
  QLabel* profile_;
  QLabel* check_summary_;
  QLabel* link_;
  QTreeWidget* checks_;
  QPushButton* pair_;
  QPushButton* check_;
  QPushButton* remove_;

  QPointer<QProcess> list_process_;
  QPointer<QProcess> discover_process_;
  QPointer<QProcess> profile_process_;
  QPointer<QProcess> pair_process_;
  QPointer<QProcess> remove_process_;
  QList<QProcess*> check_processes_;
  QByteArray pair_stdout_;
  QString pair_target_;
  QString pair_code_;
  bool pair_answered_ = false;
  QDialog* pairing_dialog_;
  QLabel* pairing_text_;
  QLabel* pairing_code_;
  QPushButton* codes_match_;
  QPushButton* codes_differ_;
};

}  // namespace tessera::ui
