#include "ui/utility/cli_probe.h"

#include <QRegularExpression>
#include <QTimer>

namespace tessera::ui {

QStringList parse_cli_commands(const QString& help) {
  QStringList names;
  bool in_commands = false;
  for (const QString& line : help.split('\n')) {
    if (line.startsWith("commands:")) {
      in_commands = true;
      continue;
    }
    if (!in_commands) continue;
    static const QRegularExpression kCommand("^  ([a-z][a-z0-9-]*)(\\s|$)");
    auto m = kCommand.match(line);
    if (m.hasMatch())
      names << m.captured(1);
    else if (!line.trimmed().isEmpty())
      in_commands = false;
  }
  return names;
}

CliProbe::CliProbe(QObject* parent) : QObject(parent) {}

CliProbe::~CliProbe() {
  if (process_ && process_->state() != QProcess::NotRunning) {
    process_->disconnect(this);
    process_->kill();
    process_->waitForFinished(1000);
  }
}

void CliProbe::probe(const QString& program) {
  if (process_) {
    process_->disconnect(this);
    process_->kill();
    process_->deleteLater();
  }
  program_ = program;
  finished_ = false;
  commands_.clear();
  process_ = new QProcess(this);
  QProcess* p = process_;
  connect(p, &QProcess::errorOccurred, this, [this, p](QProcess::ProcessError error) {
    if (p != process_ || error != QProcess::FailedToStart) return;
    done(false, tr("cannot start %1: %2").arg(program_, p->errorString()));
  });
  connect(p, &QProcess::finished, this, [this, p](int code, QProcess::ExitStatus status) {
    if (p != process_) return;
    const QString out = QString::fromUtf8(p->readAllStandardOutput());
    commands_ = parse_cli_commands(out);
    if (status != QProcess::NormalExit || code != 0 || commands_.isEmpty())
      done(false, tr("%1 --help did not list its commands (exit code %2)").arg(program_).arg(code));
    else
      done(true, {});
  });
  // A hung program must not leave the probe pending forever.
  QTimer::singleShot(15000, p, [this, p] {
    if (p == process_ && !finished_) {
      p->kill();
      done(false, tr("%1 --help did not answer within 15 s").arg(program_));
    }
  });
  p->start(program, {"--help"});
}

void CliProbe::done(bool ok, const QString& problem) {
  if (finished_) return;
  finished_ = true;
  ok_ = ok;
  problem_ = problem;
  Q_EMIT probed();
}

}  // namespace tessera::ui
