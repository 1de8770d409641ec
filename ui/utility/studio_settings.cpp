#include "ui/utility/studio_settings.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QSettings>
#include <QStandardPaths>

namespace tessera::ui::settings {

namespace {
QString data_dir() {
  QString dir = QStandardPaths::writableLocation(QStandardPaths::AppLocalDataLocation);
  if (dir.isEmpty()) dir = QDir::home().filePath(".local/share/tessera");
  return dir;
}
}  // namespace

QString runs_root() {
  return QSettings().value("paths/runsRoot", QDir(data_dir()).filePath("runs")).toString();
}
void set_runs_root(const QString& dir) {
  QSettings().setValue("paths/runsRoot", dir);
}

QString database_path() {
  return QSettings().value("paths/database", QDir(data_dir()).filePath("runs.sqlite")).toString();
}

QString cli_program() {
  QString configured = QSettings().value("paths/cli").toString();
  if (!configured.isEmpty()) return configured;
  const QString app_dir = QCoreApplication::applicationDirPath();
  // Installed side by side, or the build tree (app/studio/tessera, app/cli/tessera-cli).
  for (const QString& candidate : {app_dir + "/tessera-cli", app_dir + "/../cli/tessera-cli"}) {
    QFileInfo info(candidate);
    if (info.isExecutable()) return info.canonicalFilePath();
  }
  QString found = QStandardPaths::findExecutable("tessera-cli");
  return found.isEmpty() ? QString("tessera-cli") : found;
}
void set_cli_program(const QString& path) {
  QSettings().setValue("paths/cli", path);
}

QString demo_dir() {
  return QDir(data_dir()).filePath("demo");
}

QString theme() {
  const QString value = QSettings().value("appearance/theme", "system").toString();
  return value == "light" || value == "dark" ? value : QString("system");
}
void set_theme(const QString& theme) {
  QSettings().setValue("appearance/theme", theme);
}

QString last_folder(const QString& what) {
  return QSettings().value("last/" + what, QDir::homePath()).toString();
}
void set_last_folder(const QString& what, const QString& dir) {
  QSettings().setValue("last/" + what, dir);
}

}  // namespace tessera::ui::settings
