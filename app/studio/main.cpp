// tessera: the Qt studio. Training never runs in this process: the studio writes a job spec
// and starts `tessera-cli run` as a child, reading its event stream.
#include <QApplication>
#include <QDir>
#include <QFileInfo>
#include <QMessageBox>

#include "core/error.h"
#include "ui/main_window.h"
#include "ui/models/runs_db.h"
#include "ui/utility/studio_settings.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setOrganizationName("Tessera");
  QApplication::setApplicationName("tessera");
  QApplication::setApplicationDisplayName("Tessera Studio");

  const QString db_path = tessera::ui::settings::database_path();
  QDir().mkpath(QFileInfo(db_path).absolutePath());
  std::unique_ptr<tessera::ui::RunsStore> store;
  try {
    store = std::make_unique<tessera::ui::RunsStore>(db_path);
  } catch (const tessera::Error& e) {
    QMessageBox::critical(
        nullptr, "Tessera Studio",
        QString::fromStdString(e.what()) + "\n\n" + QString::fromStdString(e.hint()));
    return 1;
  }
  tessera::ui::MainWindow window(store.get());
  window.show();
  return app.exec();
}
