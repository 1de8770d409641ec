#pragma once
// What the studio's Qt test suites share: a tiny trainable Llama made with transformers, the
// demo model and dataset from `tessera-cli demo`, settings isolated in a temporary folder,
// screenshots, and the wizard driven to a launch. Linked into each UI test as
// `studio_test_support` (tests/ui/ui.cmake), which defines TESSERA_PYTHON, TESSERA_CLI_PATH and
// TESSERA_SCREENSHOT_DIR for it.
#include <QString>
#include <QStringList>

class QWidget;

namespace tessera::ui {
class FineTuneWizard;
class MainWindow;
class RunDashboard;
}  // namespace tessera::ui

namespace tessera::ui::testing {

// The venv's all-MiniLM-L6-v2 folder (its WordPiece tokenizer), or "" when not installed.
QString locate_minilm();

// A random-weight Llama (hidden 32, 2 layers, 128 positions, MiniLM's tokenizer) written to
// `out`, with the config fields in `config_changes` (a JSON object) changed; its parameter count,
// or 0 with `*error` saying why.
qint64 make_tiny_llama(const QString& out, QString* error, const QString& config_changes = "{}");

// `tessera-cli demo --no-train --out DIR`: DIR/base (the demo model), DIR/train.jsonl and
// DIR/eval.jsonl. "" on success, else the command's error.
QString make_demo(const QString& cli, const QString& dir);

// QSettings (INI) and the studio's runs folder and database all under `dir`, so a test never
// reads or writes the user's. Also XDG_CACHE_HOME (the step-time calibration file).
void isolate_settings(const QString& dir);

// TESSERA_STUDIO_CLI's tessera-cli when set, else this build's.
QString studio_cli();
// studio_cli() when it can train (`run` in its --help), else "".
QString training_cli();

// Writes `data` to `path` (a QVERIFY failure when it cannot).
void write_file(const QString& path, const QByteArray& data);
// TESSERA_SCREENSHOT_DIR/NAME.png of `w`, after pending layouts.
void screenshot(QWidget* w, const QString& name);
// Every text Qt Charts drew elided ("..." or "…") in the visible charts under `root`.
QStringList elided_chart_text(QWidget* root);

// Launches a run of `steps` steps with `method` through `window`'s wizard: `model` (unless
// empty: the wizard's model as it is), `dataset` at `max_length` tokens, then Launch on Review
// once the wizard has nothing missing. The run's id, or "" when the wizard never got there.
QString launch_through_wizard(MainWindow& window, const QString& model, const QString& dataset,
                              int max_length, const QString& method, int steps);

// Waits (QTRY, up to `timeout_ms`) until `dashboard` shows the run ended: completed, stopped,
// failed or an error. Returns the bar's text ("completed", …).
QString wait_for_run_end(RunDashboard* dashboard, int timeout_ms = 240000);

}  // namespace tessera::ui::testing
