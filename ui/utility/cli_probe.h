#pragma once
// Asks tessera-cli what it can do (`tessera-cli --help`, asynchronously) so the studio
// offers only what this build supports: Launch needs the `run` command.
#include <QObject>
#include <QProcess>
#include <QStringList>

namespace tessera::ui {

class CliProbe : public QObject {
  Q_OBJECT
 public:
  explicit CliProbe(QObject* parent = nullptr);
  ~CliProbe() override;
  void probe(const QString& program);
  bool finished() const { return finished_; }
  bool ok() const { return ok_; }
  const QStringList& commands() const { return commands_; }
  bool supports(const QString& command) const { return commands_.contains(command); }
  const QString& program() const { return program_; }
  const QString& problem() const { return problem_; }

 Q_SIGNALS:
  void probed();

 private:
  void done(bool ok, const QString& problem);
  QProcess* process_ = nullptr;
  QString program_;
  bool finished_ = false;
  bool ok_ = false;
  QStringList commands_;
  QString problem_;
};

// The command names listed in `tessera-cli --help` output ("  name   summary" lines).
QStringList parse_cli_commands(const QString& help);

}  // namespace tessera::ui
