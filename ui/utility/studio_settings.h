#pragma once
// Where the studio keeps things (QSettings keys and their defaults), and finding tessera-cli.
#include <QString>

namespace tessera::ui::settings {

QString runs_root();  // folder that receives one sub-folder per run
void set_runs_root(const QString& dir);
QString database_path();  // the runs database
QString cli_program();    // tessera-cli: the setting, else next to the app, else on PATH
void set_cli_program(const QString& path);
// Where "Try with the demo model" writes the demo (tessera-cli demo --no-train --out): the
// app's data folder.
QString demo_dir();
QString theme();  // "system" | "light" | "dark"
void set_theme(const QString& theme);
QString last_folder(const QString& what);  // "model", "dataset", "spec"
void set_last_folder(const QString& what, const QString& dir);

}  // namespace tessera::ui::settings
