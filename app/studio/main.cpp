// tessera: the Qt studio. Training never runs in this process: the studio writes a job spec
// and starts `tessera-cli run` as a child, reading its event stream.
#include <QApplication>
#include <QCommandLineParser>
#include <QDir>
#include <QFileInfo>
#include <QMessageBox>
#include <QTimer>
#include <cstdio>

#include "core/error.h"
#include "core/fatal_signals.h"
#include "ui/main_window.h"
#include "ui/models/runs_db.h"
#include "ui/utility/app_icon.h"
#include "ui/utility/studio_settings.h"

int main(int argc, char** argv) {
  tessera::core::report_fatal_signals("tessera");
  QApplication app(argc, argv);
  QApplication::setOrganizationName("Tessera");
  QApplication::setApplicationName("tessera");
  QApplication::setApplicationDisplayName("Tessera Studio");
  QApplication::setApplicationVersion(TESSERA_VERSION);

  QCommandLineParser parser;
  parser.setApplicationDescription("Tessera Studio: fine-tune HuggingFace models on this machine");
  parser.addHelpOption();
  parser.addVersionOption();
  // For packaging checks and documentation: the first page as a user sees it, without input.
  const QCommandLineOption screenshot(
      "screenshot", "Open the studio, save a PNG picture of its window to <file> and exit.",
      "file");
  parser.addOption(screenshot);
  // For packaging: the icon at the sizes the desktop's icon theme takes.
  const QCommandLineOption write_icons(
      "write-icons", "Write the icon as <folder>/<N>x<N>/apps/tessera.png and exit.", "folder");
  parser.addOption(write_icons);
  parser.addPositionalArgument("job", "A job spec (*.tessera-job.json) to open in New fine-tune.",
                               "[job]");
  parser.process(app);
  if (parser.isSet(write_icons)) {
    const QString problem = tessera::ui::write_app_icons(parser.value(write_icons));
    if (!problem.isEmpty()) std::fprintf(stderr, "tessera: %s\n", qPrintable(problem));
    return problem.isEmpty() ? 0 : 1;
  }
  QApplication::setWindowIcon(tessera::ui::app_icon());

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
  if (!parser.positionalArguments().isEmpty()) {
    const QString problem = window.open_job_file(parser.positionalArguments().first());
    if (!problem.isEmpty()) QMessageBox::warning(&window, "Tessera Studio", problem);
  }
  if (parser.isSet(screenshot)) {
    // Once the event loop has laid the window out and painted it.
    QTimer::singleShot(500, &window, [&window, path = parser.value(screenshot)] {
      const bool saved = window.grab().save(path, "PNG");
      if (!saved)
        std::fprintf(stderr, "tessera: cannot write the screenshot to %s\n", qPrintable(path));
      QApplication::exit(saved ? 0 : 1);
    });
  }
  return app.exec();
}
