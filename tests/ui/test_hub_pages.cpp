// The studio's Hub pages driven with real widgets (offscreen) against the local Hub server
// (tests/ui/hub_fixture.py → tests/pylib/hub_server.py, a child process): search with support
// flags and fit badges, paging, the distinct empty and error states (no results, offline, needs a
// token, token rejected, gated, rate limited), a download paused and resumed (with Range) in the
// main window's tray until "ready", picked for the wizard; cancel removing the partial files; the
// token from Settings opening a gated model and never landing in QSettings or the runs database.
// The keychain: this test runs without a D-Bus session (no secret service), so saving a token
// takes the fallback, the token file huggingface_hub's login writes; the keychain path itself is
// not exercised here. Screenshots of each state land in BUILD/screenshots/.
#include <QAbstractButton>
#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QDirIterator>
#include <QDoubleSpinBox>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QSettings>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTextBrowser>
#include <memory>

#include "data/dataset.h"
#include "tests/ui/studio_fixture.h"
#include "ui/main_window.h"
#include "ui/models/hub_dataset_results_model.h"
#include "ui/models/hub_results_model.h"
#include "ui/models/runs_db.h"
#include "ui/pages/hub_dataset_panel.h"
#include "ui/pages/hub_panel.h"
#include "ui/pages/run_dashboard.h"
#include "ui/pages/runs_page.h"
#include "ui/pages/wizard.h"
#include "ui/utility/cli_probe.h"
#include "ui/utility/hub_token.h"
#include "ui/widgets/card_view.h"
#include "ui/widgets/charts.h"
#include "ui/widgets/download_tray.h"
#include "ui/widgets/hub_model_detail.h"
#include "ui/widgets/hub_search_view.h"

using namespace tessera::ui;
using namespace tessera::ui::testing;

namespace {

const char* kToken = "hf_studio_test_secret_token_9876543210";

QString cell(HubPanel* hub, const QString& repo, HubResultsModel::Column column) {
  const int row = hub->results()->row_of(repo);
  if (row < 0) return {};
  return hub->results()->data(hub->results()->index_of(row, column)).toString();
}

QString tip(HubPanel* hub, const QString& repo, HubResultsModel::Column column) {
  const int row = hub->results()->row_of(repo);
  if (row < 0) return {};
  return hub->results()->data(hub->results()->index_of(row, column), Qt::ToolTipRole).toString();
}

// Every file under `dir` whose contents hold `needle`.
QStringList files_containing(const QString& dir, const QByteArray& needle) {
  QStringList found;
  QDirIterator it(dir, QDir::Files | QDir::Hidden, QDirIterator::Subdirectories);
  while (it.hasNext()) {
    const QString f = it.next();
    QFile file(f);
    if (file.open(QIODevice::ReadOnly) && file.readAll().contains(needle)) found << f;
  }
  return found;
}

}  // namespace

class HubPagesTest : public QObject {
  Q_OBJECT

  QTemporaryDir tmp_;
  QProcess server_;
  QString endpoint_;
  std::unique_ptr<RunsStore> store_;

  QString path(const QString& name) const { return QDir(tmp_.path()).filePath(name); }

  QJsonObject command(const QJsonObject& cmd) {
    server_.write(QJsonDocument(cmd).toJson(QJsonDocument::Compact) + "\n");
    while (!server_.canReadLine())
      if (!server_.waitForReadyRead(120000)) return {};  // add_bnb imports bitsandbytes
    return QJsonDocument::fromJson(server_.readLine()).object();
  }

  void set_faults(const QJsonObject& faults) {
    QVERIFY(command({{"faults", faults}}).value("ok").toBool());
  }

  // The filter tags of each search the server received at `path`, oldest first.
  QList<QStringList> searches(const QString& path) {
    QList<QStringList> out;
    for (const QJsonValue& search : command({{"searches", path}}).value("filters").toArray()) {
      QStringList tags;
      for (const QJsonValue& tag : search.toArray()) tags << tag.toString();
      out << tags;
    }
    return out;
  }

  // The rows of a dataset file of the server, as its viewer reads them.
  QJsonArray file_rows(const QString& repo, const QString& file) {
    return command({{"rows", QJsonArray{repo, file}}}).value("rows").toArray();
  }

  // Every cell of the first rows of `table` equals `expected`'s (strings; by column name).
  void compare_rows(QTableWidget* table, const QJsonArray& expected, int rows) {
    QVERIFY2(table->rowCount() >= rows, qPrintable(QString::number(table->rowCount())));
    for (int c = 0; c < table->columnCount(); ++c) {
      const QString column = table->horizontalHeaderItem(c)->text().section(" → ", 0, 0);
      for (int r = 0; r < rows; ++r)
        QCOMPARE(table->item(r, c)->text(), expected[r].toObject().value(column).toString());
    }
  }

  // Searches the Hub's datasets for `text`, waiting for the first result's layout and preview.
  void search(HubDatasetPanel* hub, const QString& text) {
    hub->search(text);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
  }

  // Searches `text` and waits until every row is checked.
  void search(HubPanel* hub, const QString& text) {
    hub->search(text);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    QCoreApplication::setOrganizationName("TesseraTest");
    QCoreApplication::setApplicationName("tessera-hub-test");
    QSettings::setDefaultFormat(QSettings::IniFormat);
    QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, path("settings"));
    QSettings().setValue("paths/runsRoot", path("runs"));
    QSettings().setValue("paths/database", path("runs.sqlite"));
    // TRANSFORMERS_OFFLINE too: the hub client reads it when HF_HUB_OFFLINE is unset.
    for (const char* v : {"HF_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                          "HUGGINGFACE_HUB_CACHE", "DBUS_SESSION_BUS_ADDRESS"})
      qunsetenv(v);
    qputenv("HF_HUB_CACHE", path("cache").toUtf8());
    qputenv("HF_HOME", path("hf-home").toUtf8());

    server_.setProcessChannelMode(QProcess::SeparateChannels);
    server_.start(TESSERA_PYTHON, {TESSERA_HUB_FIXTURE, path("fixture")});
    QVERIFY2(server_.waitForStarted(30000), qPrintable(server_.errorString()));
    while (!server_.canReadLine())
      QVERIFY2(server_.waitForReadyRead(180000), server_.readAllStandardError().constData());
    endpoint_ = QJsonDocument::fromJson(server_.readLine()).object().value("endpoint").toString();
    QVERIFY(endpoint_.startsWith("http://127.0.0.1:"));
    qputenv("HF_ENDPOINT", endpoint_.toUtf8());
    store_ = std::make_unique<RunsStore>(path("runs.sqlite"));
  }

  // After each test: no fault, token, offline switch or viewer switch leaks into the next one.
  void cleanup() {
    for (const char* v : {"HF_TOKEN", "HF_HUB_OFFLINE"}) qunsetenv(v);
    set_faults({});
    QVERIFY(command({{"viewer", true}}).value("ok").toBool());
  }

  void cleanupTestCase() {
    store_.reset();
    server_.closeWriteChannel();
    if (!server_.waitForFinished(10000)) server_.kill();
  }

  void search_shows_support_and_fit() {
    MainWindow window(store_.get());
    window.resize(1400, 860);
    window.show();
    window.show_page(MainWindow::Models);
    HubPanel* hub = window.hub_panel();
    QVERIFY(hub->state_text().contains("Search the Hugging Face Hub"));
    screenshot(&window, "hub-0-before-search");
    search(hub, "");
    // Most downloaded first; every row checked from its info and config.json alone.
    QCOMPARE(hub->results()->rowCount(), 4);
    QCOMPARE(cell(hub, "org/tiny-llama", HubResultsModel::Column::Name), QString("org/tiny-llama"));
    QCOMPARE(hub->results()->row_of("org/tiny-llama"), 0);
    QCOMPARE(cell(hub, "org/tiny-llama", HubResultsModel::Column::Support), QString("✔ llama"));
    QCOMPARE(cell(hub, "org/tiny-llama", HubResultsModel::Column::License), QString("apache-2.0"));
    QCOMPARE(cell(hub, "org/tiny-llama", HubResultsModel::Column::Downloads), QString("1.5K"));
    QVERIFY(cell(hub, "org/tiny-llama", HubResultsModel::Column::Size).contains("KiB"));
    const QString fit = cell(hub, "org/tiny-llama", HubResultsModel::Column::Fit);
    QVERIFY2(fit.startsWith("✔ ") && fit.contains("iB"), qPrintable(fit));
    QVERIFY2(tip(hub, "org/tiny-llama", HubResultsModel::Column::Fit).startsWith("Fits: "),
             qPrintable(tip(hub, "org/tiny-llama", HubResultsModel::Column::Fit)));
    // Gated without a token; an architecture the engine lacks; pickle-only weights.
    QVERIFY(cell(hub, "org/llama-gated", HubResultsModel::Column::Name).contains("(gated)"));
    QVERIFY2(
        cell(hub, "org/llama-gated", HubResultsModel::Column::Support).contains("needs a token"),
        qPrintable(cell(hub, "org/llama-gated", HubResultsModel::Column::Support)));
    QCOMPARE(cell(hub, "org/t5-small-ish", HubResultsModel::Column::Support), QString("✘ t5"));
    QVERIFY(tip(hub, "org/t5-small-ish", HubResultsModel::Column::Support).contains("t5"));
    QVERIFY(cell(hub, "org/pickle-only", HubResultsModel::Column::Support).startsWith("✘"));
    QVERIFY2(tip(hub, "org/pickle-only", HubResultsModel::Column::Support).contains("pickle"),
             qPrintable(tip(hub, "org/pickle-only", HubResultsModel::Column::Support)));
    // Download only what Tessera can train.
    hub->select_repo("org/t5-small-ish");
    QVERIFY(!hub->download_button()->isEnabled());
    hub->select_repo("org/tiny-llama");
    QVERIFY(hub->download_button()->isEnabled());
    // Nothing was downloaded to decide: the cache holds no model.
    QVERIFY(!QDir(path("cache/models--org--tiny-llama/snapshots")).exists());
    screenshot(&window, "hub-1-results");

    // Another method in the wizard: the badges are planned again when the page shows.
    // (A model this small peaks at the runtime's floor either way: the plan's sentence differs.)
    const QString first_plan = tip(hub, "org/tiny-llama", HubResultsModel::Column::Fit);
    const QString other = window.wizard()->method_page()->method() == "lora" ? "full" : "lora";
    window.wizard()->method_page()->set_method(other);
    window.show_page(MainWindow::Runs);
    window.show_page(MainWindow::Models);
    QVERIFY(hub->busy());
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
    QVERIFY(hub->results()
                ->headerData(int(HubResultsModel::Column::Fit), Qt::Horizontal)
                .toString()
                .contains(other == "lora" ? "LoRA" : "full"));
    const QString other_fit = cell(hub, "org/tiny-llama", HubResultsModel::Column::Fit);
    const QString other_plan = tip(hub, "org/tiny-llama", HubResultsModel::Column::Fit);
    QVERIFY2(other_fit.startsWith("✔ ") && other_plan != first_plan,
             qPrintable(first_plan + " / " + other_plan));
  }

  void filters_search_with_hub_tags() {
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::Models);
    HubPanel* hub = window.hub_panel();
    QComboBox* task = hub->filter_combo("Task");
    QComboBox* library = hub->filter_combo("Library");
    QComboBox* license = hub->filter_combo("License");
    QVERIFY(task && library && license);
    QCOMPARE(task->currentText(), QString("Any task"));
    search(hub, "");
    QCOMPARE(hub->results()->rowCount(), 4);
    QCOMPARE(searches("/api/models").last(), QStringList());

    // A filter searches again at once, with its tag; only the tagged repository is left.
    task->setCurrentIndex(task->findData("text-generation"));
    QVERIFY(hub->busy());
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
    QCOMPARE(searches("/api/models").last(), QStringList{"text-generation"});
    QCOMPARE(hub->results()->rowCount(), 1);
    QCOMPARE(hub->results()->row_of("org/tiny-llama"), 0);
    screenshot(&window, "hub-12-filtered-by-task");

    task->setCurrentIndex(0);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
    license->setCurrentIndex(license->findData("license:mit"));
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
    QCOMPARE(searches("/api/models").last(), QStringList{"license:mit"});
    QCOMPARE(hub->results()->rowCount(), 1);
    QCOMPARE(hub->results()->row_of("org/t5-small-ish"), 0);
    QCOMPARE(cell(hub, "org/t5-small-ish", HubResultsModel::Column::License), QString("mit"));

    // Filters add up (the Hub wants every tag): mit and transformers match nothing here.
    library->setCurrentIndex(library->findData("transformers"));
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
    QCOMPARE(searches("/api/models").last(), (QStringList{"transformers", "license:mit"}));
    QCOMPARE(hub->results()->rowCount(), 0);
    QVERIFY2(hub->state_text().contains("No models match") && hub->state_text().contains("license"),
             qPrintable(hub->state_text()));

    // The text typed is searched with the filters.
    license->setCurrentIndex(0);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
    QCOMPARE(hub->results()->rowCount(), 1);
    hub->search_edit()->setText("t5");
    QTest::keyClick(hub->search_edit(), Qt::Key_Return);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 60000);
    QCOMPARE(hub->results()->rowCount(), 0);
    QCOMPARE(searches("/api/models").last(), QStringList{"transformers"});
  }

  void detail_view_shows_the_model_and_its_card() {
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::Models);
    HubPanel* hub = window.hub_panel();
    search(hub, "");
    hub->select_repo("org/tiny-llama");
    QVERIFY(!hub->details_shown());
    QVERIFY(hub->details_button()->isEnabled());
    QTest::mouseClick(hub->details_button(), Qt::LeftButton);
    QVERIFY(hub->details_shown());
    HubModelDetail* detail = hub->detail();
    QCOMPARE(detail->repo_id(), QString("org/tiny-llama"));
    // The card, rendered as Markdown without its YAML header: emphasis and tables are formatted,
    // not shown as their marks.
    QTRY_VERIFY_WITH_TIMEOUT(hub->card_view()->toPlainText().contains("a test model"), 20000);
    const QString card = hub->card_view()->toPlainText();
    QVERIFY2(!card.contains("license: apache-2.0") && !card.contains("---"), qPrintable(card));
    QVERIFY2(card.contains("A tiny Llama") && !card.contains("**"), qPrintable(card));
    QVERIFY2(!card.contains("|---|"), qPrintable(card));
    QVERIFY(hub->card_view()->document()->toHtml().contains("<table"));
    // Links leave the studio: a relative one goes to the repository's file on the Hub.
    QCOMPARE(hub->card_view()->link_target(QUrl("LICENSE")).toString(),
             endpoint_ + "/org/tiny-llama/blob/main/LICENSE");
    QCOMPARE(hub->card_view()->link_target(QUrl("https://huggingface.co/docs")).toString(),
             QString("https://huggingface.co/docs"));
    QVERIFY(!hub->card_view()->openLinks());

    // The facts: license, access, what Tessera would download, support, fit and why.
    const QString facts = detail->facts_text();
    QVERIFY2(facts.contains("License: apache-2.0") && facts.contains("Access: open"),
             qPrintable(facts));
    QVERIFY2(facts.contains("Tessera can train it: llama"), qPrintable(facts));
    QVERIFY2(QRegularExpression(R"(Download: [\d.]+ KiB in \d+ files)").match(facts).hasMatch(),
             qPrintable(facts));
    QVERIFY2(facts.contains("Fits here: ✔ ") && facts.contains("Fits: "), qPrintable(facts));
    // The files: weights, config and tokenizer, and nothing Tessera does not read (README.md).
    QTableWidget* files = detail->files_table();
    QStringList names;
    for (int r = 0; r < files->rowCount(); ++r) names << files->item(r, 0)->text();
    QVERIFY2(names.contains("config.json") && names.contains("model.safetensors.index.json") &&
                 names.contains("tokenizer.json") && !names.contains("README.md"),
             qPrintable(names.join(", ")));
    QCOMPARE(names.filter(".safetensors").size(), 4);  // three shards and the index
    QVERIFY(detail->download_button()->isEnabled());
    screenshot(&window, "hub-13-detail-card");
    qobject_cast<QTabWidget*>(files->parentWidget()->parentWidget())->setCurrentWidget(files);
    screenshot(&window, "hub-14-detail-files");

    // Back to the results, the selection kept; Esc comes back too.
    QTest::mouseClick(detail->back_button(), Qt::LeftButton);
    QVERIFY(!hub->details_shown());
    QCOMPARE(hub->selected_repo(), QString("org/tiny-llama"));
    // A model Tessera cannot train opens with the reason and no Download.
    QVERIFY(hub->show_details("org/pickle-only"));
    QVERIFY2(
        detail->facts_text().contains("cannot train") && detail->facts_text().contains("pickle"),
        qPrintable(detail->facts_text()));
    QVERIFY(!detail->download_button()->isEnabled());
    QTRY_VERIFY_WITH_TIMEOUT(!hub->card_view()->toPlainText().startsWith("Loading"), 20000);
    QVERIFY2(hub->card_view()->toPlainText().contains("no card"),
             qPrintable(hub->card_view()->toPlainText()));
    QTest::keyClick(detail->back_button(), Qt::Key_Escape);
    QVERIFY(!hub->details_shown());
    // Double-click (activation) opens a row.
    const QModelIndex t5 = hub->results()->index_of(hub->results()->row_of("org/t5-small-ish"),
                                                    HubResultsModel::Column::Name);
    Q_EMIT hub->table()->activated(t5);
    QVERIFY(hub->details_shown());
    QCOMPARE(detail->repo_id(), QString("org/t5-small-ish"));
    QVERIFY2(detail->facts_text().contains("License: mit"), qPrintable(detail->facts_text()));
    // A new search goes back to the results.
    QTest::mouseClick(detail->back_button(), Qt::LeftButton);
    search(hub, "tiny");
    QVERIFY(!hub->details_shown());
  }

  void datasets_search_preview_download_and_use() {
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::Datasets);
    DatasetPage* page = window.datasets_page();
    HubDatasetPanel* hub = page->hub_panel();
    QVERIFY(hub && page->hub_button()->isVisible());
    QTest::mouseClick(page->hub_button(), Qt::LeftButton);
    QVERIFY(page->hub_shown());
    QVERIFY(hub->search_view()->state_text().contains("Search the Hub's datasets"));
    search(hub, "");
    // Datasets only, most downloaded first, what their tags say.
    QCOMPARE(hub->results()->rowCount(), 3);
    const auto dataset_cell = [hub](const QString& repo, HubDatasetResultsModel::Column column) {
      return hub->results()
          ->data(hub->results()->index_of(hub->results()->row_of(repo), column))
          .toString();
    };
    QCOMPARE(hub->results()->row_of("data/alpaca-mini"), 0);
    QCOMPARE(dataset_cell("data/alpaca-mini", HubDatasetResultsModel::Column::Rows),
             QString("under 1K"));
    QCOMPARE(dataset_cell("data/alpaca-mini", HubDatasetResultsModel::Column::Formats),
             QString("json"));
    QCOMPARE(dataset_cell("data/alpaca-mini", HubDatasetResultsModel::Column::License),
             QString("mit"));
    QVERIFY(dataset_cell("data/gated-set", HubDatasetResultsModel::Column::Name).contains("gated"));

    // The first result is shown: its card's configs, their splits, the default's train rows.
    QCOMPARE(hub->selected_repo(), QString("data/alpaca-mini"));
    QVERIFY2(hub->facts_text().contains("license mit") &&
                 hub->facts_text().contains("2 configs from configs declared by its card"),
             qPrintable(hub->facts_text()));
    QCOMPARE(hub->config_combo()->count(), 2);
    QCOMPARE(hub->config_combo()->itemData(0).toString(), QString("instruct"));
    QVERIFY(hub->config_combo()->itemText(0).contains("default"));
    QCOMPARE(hub->config_combo()->itemData(1).toString(), QString("chat"));
    QCOMPARE(hub->split_combo()->count(), 2);
    QCOMPARE(hub->split_combo()->currentData().toString(), QString("train"));
    QCOMPARE(hub->split_combo()->currentText(), QString("train (2 files)"));
    QCOMPARE(hub->train_combo()->currentData().toString(), QString("train"));
    QCOMPARE(hub->validation_combo()->currentData().toString(), QString("validation"));
    // The rows before any download, from the viewer: the file's first rows.
    QCOMPARE(hub->preview_message(), QString());
    QCOMPARE(hub->preview_table()->rowCount(), 20);
    compare_rows(hub->preview_table(), file_rows("data/alpaca-mini", "instruct/train-00000.jsonl"),
                 20);
    QVERIFY(!QFileInfo::exists(path("cache/datasets--data--alpaca-mini/snapshots")) ||
            files_containing(path("cache/datasets--data--alpaca-mini/snapshots"), "Count to")
                .isEmpty());
    QVERIFY2(hub->download_label()->text().contains("in 3 files"),
             qPrintable(hub->download_label()->text()));
    screenshot(&window, "hub-datasets-1-preview");

    // Another config: its own splits (train only: validation holds out training rows) and rows.
    hub->config_combo()->setCurrentIndex(1);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 30000);
    QCOMPARE(hub->split_combo()->count(), 1);
    QCOMPARE(hub->validation_combo()->currentData().toString(), QString());
    QCOMPARE(hub->preview_table()->horizontalHeaderItem(0)->text(), QString("messages"));
    QCOMPARE(hub->preview_table()->rowCount(), 12);
    QVERIFY(hub->download_label()->text().contains("a share of the training rows"));
    // The card, rendered, its YAML header (the configs) left out.
    hub->tabs()->setCurrentWidget(hub->card_view());
    QTRY_VERIFY_WITH_TIMEOUT(hub->card_view()->toPlainText().contains("Alpaca mini"), 20000);
    QVERIFY(!hub->card_view()->toPlainText().contains("config_name"));
    QVERIFY(!hub->card_view()->toPlainText().contains("**"));
    screenshot(&window, "hub-datasets-2-card");
    hub->tabs()->setCurrentIndex(0);
    hub->config_combo()->setCurrentIndex(0);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 30000);
    const HubDatasetChoice choice = hub->choice();
    QCOMPARE(choice.train_files,
             (QStringList{"instruct/train-00000.jsonl", "instruct/train-00001.jsonl"}));
    QCOMPARE(choice.validation_files, QStringList{"instruct/valid.jsonl"});
    const QString commit = QString::fromStdString(hub->info()->layout.commit);
    QCOMPARE(commit.size(), 40);

    // Download and use: the tray fetches the two splits; once verified the page reads them.
    QTest::mouseClick(hub->use_button(), Qt::LeftButton);
    QVERIFY(!page->hub_shown());
    QVERIFY(page->pending_hub_download().has_value());
    QVERIFY2(page->hub_source_label()->text().contains("Downloading"),
             qPrintable(page->hub_source_label()->text()));
    DownloadRow* row = window.downloads()->row(choice.download_request());
    QVERIFY(row);
    QTRY_COMPARE_WITH_TIMEOUT(row->state(), DownloadRow::State::Ready, 60000);
    QVERIFY(row->use_button()->text().contains("dataset"));
    QTRY_VERIFY_WITH_TIMEOUT(page->hub_dataset().has_value() && !page->busy(), 30000);
    const DatasetAnalysis& a = page->analysis();
    QVERIFY2(a.error.isEmpty(), qPrintable(a.error));
    QCOMPARE(a.files.size(), 2);
    QCOMPARE(a.num_rows, std::uint64_t(50));  // both training files, not the validation one
    QCOMPARE(a.columns, (QStringList{"instruction", "output"}));
    QCOMPARE(a.file_type, QString("jsonl"));
    QCOMPARE(a.format, QString("instruction"));
    compare_rows(page->preview_table(), file_rows("data/alpaca-mini", "instruct/train-00000.jsonl"),
                 30);
    QVERIFY2(page->hub_source_label()->text().contains("data/alpaca-mini") &&
                 page->hub_source_label()->text().contains("the validation split"),
             qPrintable(page->hub_source_label()->text()));
    QVERIFY(!page->validation_split()->isEnabled());
    // Only the chosen splits (and the card) came: not the chat config's file.
    const QString snapshot = path("cache/datasets--data--alpaca-mini/snapshots/") + commit;
    QCOMPARE(page->hub_dataset()->snapshot, snapshot);
    QVERIFY(QFileInfo::exists(snapshot + "/instruct/train-00001.jsonl"));
    QVERIFY(QFileInfo::exists(snapshot + "/instruct/valid.jsonl"));
    QVERIFY(!QFileInfo::exists(snapshot + "/chat/conversations.jsonl"));
    // The job spec names the Hub dataset, pinned at the commit previewed.
    const tessera::job::DatasetSpec d = page->dataset_spec();
    QCOMPARE(QString::fromStdString(d.hub_id), QString("data/alpaca-mini"));
    QCOMPARE(QString::fromStdString(d.revision), commit);
    QCOMPARE(QString::fromStdString(d.config), QString("instruct"));
    QCOMPARE(d.train_files, (std::vector<std::string>{"instruct/train-00000.jsonl",
                                                      "instruct/train-00001.jsonl"}));
    QCOMPARE(d.validation_files, std::vector<std::string>{"instruct/valid.jsonl"});
    QCOMPARE(d.validation_split, 0.0);
    screenshot(&window, "hub-datasets-3-in-use");

    // On to the wizard: its dataset step reads the same files; its spec is valid as written.
    QPushButton* to_wizard = nullptr;
    for (QPushButton* b : window.findChildren<QPushButton*>())
      if (b->text().remove('&') == "Fine-tune on this dataset") to_wizard = b;
    QVERIFY(to_wizard && to_wizard->isEnabled());
    QTest::mouseClick(to_wizard, Qt::LeftButton);
    QCOMPARE(window.current_page(), MainWindow::NewFineTune);
    DatasetPage* step = window.wizard()->dataset_page();
    QTRY_VERIFY_WITH_TIMEOUT(step->hub_dataset().has_value() && !step->busy(), 30000);
    QVERIFY2(step->analysis().error.isEmpty(), qPrintable(step->analysis().error));
    QCOMPARE(step->analysis().num_rows, std::uint64_t(50));
    tessera::job::JobSpec built = window.wizard()->build_spec();
    built.model.path = path("some-model").toStdString();  // no model chosen in this test
    tessera::job::JobSpec spec;
    try {
      spec = tessera::job::parse_job_spec(tessera::job::to_json(built), "the wizard's spec");
    } catch (const std::exception& e) {
      QFAIL(e.what());
    }
    QCOMPARE(spec.dataset.hub_id, std::string("data/alpaca-mini"));
    QCOMPARE(spec.dataset.config, std::string("instruct"));
    QCOMPARE(spec.dataset.validation_files, std::vector<std::string>{"instruct/valid.jsonl"});
    // Lists (runs, review) name it by its id and config, not by a file name.
    QCOMPARE(dataset_display_name(spec.dataset), QString("data/alpaca-mini · instruct"));
    screenshot(&window, "hub-datasets-4-wizard-step");

    // The spec loaded again (a run cloned): the same files, found in the HF cache.
    MainWindow clone(store_.get());
    clone.wizard()->load_spec(spec);
    DatasetPage* again = clone.wizard()->dataset_page();
    QTRY_VERIFY_WITH_TIMEOUT(again->hub_dataset().has_value() && !again->busy(), 30000);
    QCOMPARE(again->hub_dataset()->snapshot, snapshot);
    QCOMPARE(again->analysis().num_rows, std::uint64_t(50));
    QCOMPARE(again->dataset_spec().train_files, d.train_files);
    QCOMPARE(again->dataset_spec().validation_files, d.validation_files);
    QCOMPARE(again->dataset_spec().revision, d.revision);
  }

  void datasets_preview_without_the_viewer() {
    QVERIFY(command({{"viewer", false}}).value("ok").toBool());
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::NewFineTune);
    window.wizard()->go_to(FineTuneWizard::DatasetStep);
    DatasetPage* page = window.wizard()->dataset_page();
    QTest::mouseClick(page->hub_button(), Qt::LeftButton);
    HubDatasetPanel* hub = page->hub_panel();
    search(hub, "");
    // JSONL without the viewer: the complete lines of the file's first bytes.
    QCOMPARE(hub->selected_repo(), QString("data/alpaca-mini"));
    QCOMPARE(hub->preview_message(), QString());
    compare_rows(hub->preview_table(), file_rows("data/alpaca-mini", "instruct/train-00000.jsonl"),
                 20);
    // Parquet without the viewer: no preview, and why, where the rows would be.
    hub->select_repo("data/parquet-only");
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 30000);
    QVERIFY2(hub->facts_text().contains("splits named by its files"),
             qPrintable(hub->facts_text()));
    QVERIFY2(
        hub->preview_message().contains("viewer") && hub->preview_message().contains("download"),
        qPrintable(hub->preview_message()));
    QVERIFY(!hub->preview_table()->isVisible());
    QVERIFY(hub->use_button()->isEnabled());
    screenshot(&window, "hub-datasets-5-no-preview");

    // Downloaded, the wizard's dataset is the Parquet file, read by the engine's reader.
    if (!tessera::data::parquet_supported()) QSKIP("this build reads no Parquet");
    QTest::mouseClick(hub->use_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(page->hub_dataset().has_value() && !page->busy(), 60000);
    const DatasetAnalysis& a = page->analysis();
    QVERIFY2(a.error.isEmpty(), qPrintable(a.error));
    QCOMPARE(a.file_type, QString("parquet"));
    QCOMPARE(a.num_rows, std::uint64_t(36));
    QVERIFY(a.columns.contains("text") && a.columns.contains("source"));
    compare_rows(page->preview_table(),
                 file_rows("data/parquet-only", "data/train-00000-of-00001.parquet"), 36);
    const tessera::job::DatasetSpec d = window.wizard()->build_spec().dataset;
    QCOMPARE(d.train_files, std::vector<std::string>{"data/train-00000-of-00001.parquet"});
    QVERIFY(d.validation_files.empty());
    QCOMPARE(d.validation_split, page->validation_split()->value() / 100.0);
    QVERIFY(page->validation_split()->isEnabled());
    QVERIFY(window.wizard()->missing().filter("dataset").isEmpty());
  }

  void datasets_error_states() {
    MainWindow window(store_.get());
    window.resize(1280, 720);
    window.show();
    window.show_page(MainWindow::Datasets);
    DatasetPage* page = window.datasets_page();
    page->show_hub(true);
    HubDatasetPanel* hub = page->hub_panel();

    // A gated dataset without a token: what to do, and nothing to download.
    search(hub, "gated");
    QCOMPARE(hub->selected_repo(), QString("data/gated-set"));
    QVERIFY2(hub->facts_text().contains("asks for a token"), qPrintable(hub->facts_text()));
    QVERIFY(!hub->use_button()->isEnabled());
    QVERIFY(hub->preview_message().contains("token"));
    screenshot(&window, "hub-datasets-6-gated");

    // 401 on the search with a token: rejected.
    qputenv("HF_TOKEN", "hf_revoked_token_123");
    set_faults({{"status", QJsonObject{{"search", QJsonArray{401, 1}}}}});
    search(hub, "alpaca");
    QCOMPARE(hub->search_view()->state_problem(), HubProblem::TokenRejected);
    QVERIFY2(hub->search_view()->state_text().contains("rejected the token"),
             qPrintable(hub->search_view()->state_text()));
    QVERIFY(!hub->use_button()->isEnabled());
    screenshot(&window, "hub-datasets-7-token-rejected");
    qunsetenv("HF_TOKEN");

    qputenv("HF_HUB_OFFLINE", "1");
    search(hub, "alpaca");
    QCOMPARE(hub->search_view()->state_problem(), HubProblem::Offline);
    QVERIFY2(hub->search_view()->state_text().contains("Choose file"),
             qPrintable(hub->search_view()->state_text()));
    screenshot(&window, "hub-datasets-8-offline");
    qunsetenv("HF_HUB_OFFLINE");

    // A new choice while the last one's card is still read (slowly): only the newest shows, and
    // a page change meanwhile is harmless. (Error bodies and API answers are not slowed, so
    // data/parquet-only, which has no card, is read at full speed.)
    // alpaca-mini's card (≈300 bytes) takes a second, read into a cache of its own: the earlier
    // cases left the card in the shared one, and read from there the layout was done before the
    // check below looked (the case failed in most runs of the whole suite, never alone).
    qputenv("HF_HUB_CACHE", path("cache-late-answer").toUtf8());
    set_faults({{"slow_bytes_per_s", 300}});
    search(hub, "parquet");
    QCOMPARE(hub->selected_repo(), QString("data/parquet-only"));
    hub->search("");  // its first result, alpaca-mini, is read when the results arrive
    QTRY_VERIFY_WITH_TIMEOUT(hub->selected_repo() == "data/alpaca-mini", 30000);
    QVERIFY(hub->busy());
    window.show_page(MainWindow::Runs);
    hub->select_repo("data/parquet-only");  // read already: shown at once
    QCOMPARE(hub->config_combo()->currentData().toString(), QString("default"));
    window.show_page(MainWindow::Datasets);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 30000);
    QTest::qWait(50);  // the late answer's continuation runs
    QCOMPARE(hub->selected_repo(), QString("data/parquet-only"));
    QVERIFY2(hub->facts_text().startsWith("data/parquet-only"), qPrintable(hub->facts_text()));
    QCOMPARE(hub->config_combo()->count(), 1);
    QCOMPARE(hub->split_combo()->currentData().toString(), QString("train"));
    // The late answer was kept for next time: alpaca-mini shows without asking again.
    hub->select_repo("data/alpaca-mini");
    QCOMPARE(hub->config_combo()->count(), 2);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy(), 30000);
    set_faults({});
    qputenv("HF_HUB_CACHE", path("cache").toUtf8());
    {
      // A window closed while a call runs waits for it instead of crashing.
      MainWindow closing(store_.get());
      closing.datasets_page()->hub_panel()->search("");
      QTRY_VERIFY_WITH_TIMEOUT(closing.datasets_page()->hub_panel()->results()->rowCount() > 0,
                               30000);
      set_faults({{"slow_bytes_per_s", 300}});
      closing.datasets_page()->hub_panel()->select_repo("data/parquet-only");
      closing.datasets_page()->hub_panel()->select_repo("data/alpaca-mini");
    }
  }

  void hub_views_fit_a_small_screen() {
    // Below 1280×720 too: the window's layouts let it shrink to 1024×600 with the Hub views shown.
    MainWindow window(store_.get());
    window.show();
    window.show_page(MainWindow::Models);
    search(window.hub_panel(), "");
    QVERIFY(window.hub_panel()->show_details("org/tiny-llama"));
    QTRY_VERIFY_WITH_TIMEOUT(
        window.hub_panel()->card_view()->toPlainText().contains("a test model"), 20000);
    window.resize(1024, 600);
    QCoreApplication::processEvents();
    QVERIFY2(window.width() <= 1024 && window.height() <= 600,
             qPrintable(QString("%1×%2").arg(window.width()).arg(window.height())));
    screenshot(&window, "hub-15-detail-1024x600");
    window.show_page(MainWindow::Datasets);
    window.datasets_page()->show_hub(true);
    search(window.datasets_page()->hub_panel(), "");
    QVERIFY2(window.width() <= 1024 && window.height() <= 600,
             qPrintable(QString("%1×%2").arg(window.width()).arg(window.height())));
    screenshot(&window, "hub-datasets-9-1024x600");
  }

  void pages_and_sorts() {
    MainWindow window(store_.get());
    HubPanel* hub = window.hub_panel();
    hub->set_page_size(2);
    search(hub, "");
    QCOMPARE(hub->results()->rowCount(), 2);
    QVERIFY(hub->more_button()->isEnabled());
    QTest::mouseClick(hub->more_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy() && hub->results()->rowCount() == 4, 60000);
    QVERIFY(!hub->more_button()->isEnabled());  // the server has no third page
    QCOMPARE(hub->results()->row_of("org/pickle-only"), 3);
    hub->set_page_size(20);
    hub->sort_combo()->setCurrentIndex(1);  // most liked: searches again
    QTRY_VERIFY_WITH_TIMEOUT(!hub->busy() && hub->results()->rowCount() == 4, 60000);
    QCOMPARE(hub->results()->row_of("org/tiny-llama"), 0);
  }

  void empty_and_error_states() {
    MainWindow window(store_.get());
    window.resize(1400, 860);
    window.show();
    window.show_page(MainWindow::Models);
    HubPanel* hub = window.hub_panel();

    search(hub, "no-such-model-anywhere");
    QCOMPARE(hub->results()->rowCount(), 0);
    QVERIFY2(hub->state_text().contains("No models match"), qPrintable(hub->state_text()));
    screenshot(&window, "hub-2-no-results");

    // 401 on the search with a token: the token was rejected.
    qputenv("HF_TOKEN", "hf_revoked_token_123");
    set_faults({{"status", QJsonObject{{"search", QJsonArray{401, 1}}}}});
    search(hub, "llama");
    QCOMPARE(hub->state_problem(), HubProblem::TokenRejected);
    QVERIFY2(
        hub->state_text().contains("rejected the token") && hub->state_text().contains("Settings"),
        qPrintable(hub->state_text()));
    screenshot(&window, "hub-3-token-rejected");

    // 403 on a gated repository with a token not granted: the row says what to do.
    search(hub, "gated");
    QVERIFY2(cell(hub, "org/llama-gated", HubResultsModel::Column::Support).contains("gated"),
             qPrintable(cell(hub, "org/llama-gated", HubResultsModel::Column::Support)));
    QVERIFY(tip(hub, "org/llama-gated", HubResultsModel::Column::Support).contains("license"));
    screenshot(&window, "hub-4-gated");
    qunsetenv("HF_TOKEN");

    // 429 after the client's retries (Retry-After: 0 keeps them quick).
    set_faults({{"status",
                 QJsonObject{{"search", QJsonArray{429, 20, QJsonObject{{"Retry-After", "0"}}}}}}});
    search(hub, "llama");
    QCOMPARE(hub->state_problem(), HubProblem::RateLimited);
    QVERIFY2(hub->state_text().contains("rate-limiting"), qPrintable(hub->state_text()));
    screenshot(&window, "hub-5-rate-limited");
    set_faults({});

    qputenv("HF_HUB_OFFLINE", "1");
    search(hub, "llama");
    QCOMPARE(hub->state_problem(), HubProblem::Offline);
    QVERIFY2(hub->state_text().contains("HF_HUB_OFFLINE"), qPrintable(hub->state_text()));
    screenshot(&window, "hub-6-offline");
    qunsetenv("HF_HUB_OFFLINE");

    // Back online: the results come back.
    search(hub, "llama");
    QCOMPARE(hub->state_problem(), HubProblem::None);
    QVERIFY(hub->results()->rowCount() >= 1);
  }

  void download_pause_resume_ready_and_pick_for_the_wizard() {
    MainWindow window(store_.get());
    window.resize(1400, 860);
    window.show();
    window.show_page(MainWindow::Models);
    HubPanel* hub = window.hub_panel();
    search(hub, "tiny");
    hub->select_repo("org/tiny-llama");
    QVERIFY(hub->download_button()->isEnabled());

    set_faults({{"slow_bytes_per_s", 40000}});  // ~10 s for the weights: time to pause
    QTest::mouseClick(hub->download_button(), Qt::LeftButton);
    DownloadRow* row = window.downloads()->row("org/tiny-llama");
    QVERIFY(row);
    QVERIFY(window.downloads()->isVisible());
    QTRY_VERIFY_WITH_TIMEOUT(row->done_bytes() > 100000, 30000);
    QCOMPARE(row->state(), DownloadRow::State::Downloading);
    QVERIFY2(row->status_text().contains(" of ") && row->status_text().contains("/s"),
             qPrintable(row->status_text()));
    // The tray survives a page change.
    window.show_page(MainWindow::Runs);
    QVERIFY(window.downloads()->isVisible());
    screenshot(&window, "hub-7-downloading-on-another-page");
    window.show_page(MainWindow::Models);

    QTest::mouseClick(row->pause_button(), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(row->state(), DownloadRow::State::Paused, 30000);
    const QStringList partial =
        QDir(path("cache/models--org--tiny-llama/blobs")).entryList({"*.incomplete"}, QDir::Files);
    QVERIFY2(!partial.isEmpty(), "a pause keeps the partial files");
    QVERIFY(row->status_text().startsWith("Paused at"));
    QVERIFY(!row->use_button()->isVisible());
    screenshot(&window, "hub-8-paused");

    // The resume meets a rate limit: the row says why it waits and for how long (it sat on
    // "Starting…" for as long as the Retry-After held it).
    set_faults(
        {{"status", QJsonObject{{"api", QJsonArray{429, 1, QJsonObject{{"Retry-After", "3"}}}}}}});
    QCOMPARE(row->pause_button()->text(), QString("Resume"));
    QTest::mouseClick(row->pause_button(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(row->status_text().contains("rate limited"), 10000);
    QVERIFY2(row->status_text().contains("HTTP 429 (rate limited); trying again in 3 s (attempt 2 "
                                         "of 4)"),
             qPrintable(row->status_text()));
    QTRY_COMPARE_WITH_TIMEOUT(row->state(), DownloadRow::State::Ready, 60000);
    set_faults({});
    QVERIFY2(row->status_text().contains("verified"), qPrintable(row->status_text()));
    const QJsonObject cdn = command({{"requests", "/blob/"}});
    QVERIFY2(cdn.value("ranged").toInt() >= 1, "the resume asked for the rest with Range");
    const QString snapshot = row->snapshot();
    QVERIFY(snapshot.startsWith(path("cache/models--org--tiny-llama/snapshots/")));
    QVERIFY(QFileInfo::exists(snapshot + "/config.json"));
    QVERIFY(QFileInfo::exists(snapshot + "/model.safetensors.index.json"));
    QVERIFY(QDir(path("cache/models--org--tiny-llama/blobs"))
                .entryList({"*.incomplete"}, QDir::Files)
                .isEmpty());
    // This machine's list has it now.
    QTRY_VERIFY_WITH_TIMEOUT(window.local_models()->cache_list()->count() == 1, 10000);
    QVERIFY(row->use_button()->isVisible());
    screenshot(&window, "hub-9-ready");

    QTest::mouseClick(row->use_button(), Qt::LeftButton);
    QCOMPARE(window.current_page(), MainWindow::NewFineTune);
    QCOMPARE(window.wizard()->current_page(), int(FineTuneWizard::ModelStep));
    ModelPage* model = window.wizard()->model_page();
    QTRY_VERIFY_WITH_TIMEOUT(!model->busy() && model->summary().folder == snapshot, 20000);
    QVERIFY2(model->ready(), qPrintable(model->summary().problem));
    QCOMPARE(window.wizard()->build_spec().model.path, snapshot.toStdString());
    screenshot(&window, "hub-10-in-the-wizard");

    // And fine-tune what was downloaded: three LoRA steps through the real tessera-cli.
    QSettings().setValue("paths/cli", TESSERA_CLI_PATH);
    window.cli_probe()->probe(TESSERA_CLI_PATH);
    QTRY_VERIFY_WITH_TIMEOUT(window.cli_probe()->finished(), 20000);
    QVERIFY2(window.cli_probe()->ok(), qPrintable(window.cli_probe()->problem()));
    QFile data(path("hello.jsonl"));
    QVERIFY(data.open(QIODevice::WriteOnly));
    for (int i = 0; i < 16; ++i)
      data.write(QString(R"({"instruction": "say %1", "output": "%1"})"
                         "\n")
                     .arg(QString("abcdefgh").at(i % 8))
                     .toUtf8());
    data.close();
    // The downloaded model is the wizard's already; the fixture's model has 64 positions.
    QVERIFY2(!launch_through_wizard(window, {}, path("hello.jsonl"), 64, "lora", 3).isEmpty(),
             qPrintable(window.wizard()->missing().join("; ")));
    RunDashboard* dashboard = window.runs_page()->dashboard();
    QTRY_VERIFY_WITH_TIMEOUT(
        dashboard->progress_bar()->format() == "completed" || dashboard->error_label()->isVisible(),
        240000);
    QVERIFY2(dashboard->progress_bar()->format() == "completed",
             qPrintable(dashboard->error_label()->text()));
    QCOMPARE(dashboard->loss_chart()->point_count("training loss"), 3);
    screenshot(&window, "hub-12-fine-tuned");
  }

  void cancel_removes_the_partial_files() {
    MainWindow window(store_.get());
    HubPanel* hub = window.hub_panel();
    // org/llama-gated is the same weights behind a token: grant one through the environment.
    qputenv("HF_TOKEN", kToken);
    QVERIFY(command({{"grant", kToken}}).value("ok").toBool());
    search(hub, "gated");
    QCOMPARE(cell(hub, "org/llama-gated", HubResultsModel::Column::Support), QString("✔ llama"));
    set_faults({{"slow_bytes_per_s", 40000}});
    window.downloads()->download("org/llama-gated");
    DownloadRow* row = window.downloads()->row("org/llama-gated");
    // Its LFS blobs are already in the cache (same contents as org/tiny-llama's, other repo
    // folder): the bytes come again, slowly.
    QTRY_VERIFY_WITH_TIMEOUT(row->done_bytes() > 50000, 30000);
    QTest::mouseClick(row->cancel_button(), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(row->state(), DownloadRow::State::Cancelled, 30000);
    QVERIFY(QDir(path("cache/models--org--llama-gated/blobs"))
                .entryList({"*.incomplete"}, QDir::Files)
                .isEmpty());
    set_faults({});
    qunsetenv("HF_TOKEN");
  }

  void token_from_settings_is_used_and_never_stored() {
    MainWindow window(store_.get());
    window.resize(1400, 860);
    window.show();
    window.show_page(MainWindow::Settings);
    auto* edit = window.findChild<QLineEdit*>("hubTokenEdit");
    auto* save = window.findChild<QPushButton*>("hubTokenSave");
    auto* result = window.findChild<QLabel*>("hubTokenResult");
    auto* status = window.findChild<QLabel*>("hubTokenStatus");
    QVERIFY(edit && save && result && status);
    QCOMPARE(edit->echoMode(), QLineEdit::Password);
    QTRY_VERIFY_WITH_TIMEOUT(!window.hub_token()->loading(), 30000);
    QVERIFY2(status->text().startsWith("No token"), qPrintable(status->text()));
    // Before anything is saved, the page says where a token would go without a keychain.
    if (status->text().contains("keychain is not available"))
      QVERIFY2(status->text().contains("A token saved here goes to " + path("hf-home/token")),
               qPrintable(status->text()));

    // A token a header cannot carry is refused with what to do.
    edit->setText("hf_two words");
    QTest::mouseClick(save, Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(result->text().contains("space"), 10000);

    edit->setText(QString(kToken) + "\n");
    QTest::mouseClick(save, Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!result->text().isEmpty() && result->text() != "Saving…", 30000);
    // No secret service here: the keychain fails and the token goes to the token file.
    QVERIFY2(result->text().contains("keychain is not available") &&
                 result->text().contains(path("hf-home/token")),
             qPrintable(result->text()));
    // Said in words: QtKeychain gives only "Unknown error" without a Secret Service.
    QVERIFY2(result->text().contains("GNOME Keyring or KWallet") &&
                 !result->text().contains("Unknown error"),
             qPrintable(result->text()));
    QVERIFY(edit->text().isEmpty());
    QFile file(path("hf-home/token"));
    QVERIFY(file.open(QIODevice::ReadOnly));
    QCOMPARE(file.readAll().trimmed(), QByteArray(kToken));
    QCOMPARE(file.permissions() & (QFile::ReadGroup | QFile::ReadOther), QFile::Permissions());
    QTRY_VERIFY_WITH_TIMEOUT(status->text().contains(path("hf-home/token")), 5000);
    screenshot(&window, "hub-11-settings-token");

    // The gated model opens with it.
    window.show_page(MainWindow::Models);
    search(window.hub_panel(), "gated");
    QCOMPARE(cell(window.hub_panel(), "org/llama-gated", HubResultsModel::Column::Support),
             QString("✔ llama"));
    // The wizard's spec, the settings file and the runs database never hold it.
    QVERIFY(!QByteArray::fromStdString(tessera::job::to_json(window.wizard()->build_spec()).dump())
                 .contains(kToken));
    QSettings().sync();
    store_->flush();
    QVERIFY2(files_containing(path("settings"), kToken).isEmpty(),
             qPrintable(files_containing(path("settings"), kToken).join(", ")));
    for (const QString& db : QDir(tmp_.path()).entryList({"runs.sqlite*"}, QDir::Files))
      QVERIFY2(files_containing(tmp_.path(), kToken).filter(db).isEmpty(), qPrintable(db));
    QVERIFY(QFileInfo::exists(path("runs.sqlite")));

    // HF_TOKEN in the environment is named as the source once the file is gone.
    window.show_page(MainWindow::Settings);
    QTest::mouseClick(window.findChild<QPushButton*>("hubTokenForget"), Qt::LeftButton);
    QVERIFY(!QFileInfo::exists(path("hf-home/token")));
    QVERIFY(status->text().startsWith("No token"));
    qputenv("HF_TOKEN", kToken);
    QVERIFY(window.hub_token()->describe().contains("HF_TOKEN"));
    qunsetenv("HF_TOKEN");
  }

  // A base the Hub ships quantized (a `-bnb-4bit` repository: bitsandbytes' NF4 codes and
  // config.json's quantization_config) is marked so in the results: its format beside the
  // architecture, that it trains as QLoRA in the tooltip, and with full fine-tuning chosen in
  // the wizard the fit badge says QLoRA is the way it fits. (Last: the repository stays served.)
  void a_quantized_base_is_marked() {
    QVERIFY(command({{"add_bnb", true}}).value("ok").toBool());
    MainWindow window(store_.get());
    window.resize(1400, 860);
    window.show();
    window.wizard()->method_page()->set_method("full");
    window.show_page(MainWindow::Models);
    HubPanel* hub = window.hub_panel();
    search(hub, "bnb");
    const QString repo = "org/tiny-llama-bnb-4bit";
    QCOMPARE(cell(hub, repo, HubResultsModel::Column::Support), QString("✔ llama · nf4 quantized"));
    const QString why = tip(hub, repo, HubResultsModel::Column::Support);
    QVERIFY2(why.contains("already quantized: nf4 (bitsandbytes, double-quantized absmax)") &&
                 why.contains("QLoRA"),
             qPrintable(why));
    const QString fit = cell(hub, repo, HubResultsModel::Column::Fit);
    QVERIFY2(fit == "~ only as QLoRA",
             qPrintable(fit + " / " + tip(hub, repo, HubResultsModel::Column::Fit)));
    // The dense model beside it is not marked.
    search(hub, "tiny-llama");
    QCOMPARE(cell(hub, "org/tiny-llama", HubResultsModel::Column::Support), QString("✔ llama"));
    screenshot(&window, "hub-12-quantized-base");

    // The same folder on this machine: the Model page says it trains as QLoRA, and counts the
    // dense model's parameters (not its packed codes and absmax tensors).
    ModelPage quantized, dense;
    quantized.choose_folder(path("fixture/llama-bnb"));
    dense.choose_folder(path("fixture/llama-src"));
    QTRY_VERIFY_WITH_TIMEOUT(!quantized.busy() && !dense.busy() &&
                                 quantized.summary().folder == path("fixture/llama-bnb") &&
                                 dense.summary().folder == path("fixture/llama-src"),
                             30000);
    QVERIFY2(quantized.summary().trainable, qPrintable(quantized.summary().problem));
    QCOMPARE(quantized.summary().quantization,
             QString("nf4 (bitsandbytes, double-quantized absmax)"));
    QVERIFY(dense.summary().quantization.isEmpty());
    QCOMPARE(quantized.summary().parameters, dense.summary().parameters);
    QVERIFY2(quantized.verdict_label()->text().contains("as QLoRA"),
             qPrintable(quantized.verdict_label()->text()));
    QVERIFY(quantized.summary_text().contains("linear weights nf4"));
    quantized.resize(1000, 600);
    screenshot(&quantized, "model-page-quantized");
  }
};

QTEST_MAIN(HubPagesTest)
#include "test_hub_pages.moc"
