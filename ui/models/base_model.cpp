#include "ui/models/base_model.h"

#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>

#include "hf/hub/cache.h"
#include "hf/hub/settings.h"

namespace tessera::ui {

QString base_model_folder(const RunRecord& run, QString* name, QString* problem) {
  const QJsonObject model =
      QJsonDocument::fromJson(run.spec_json.toUtf8()).object().value("model").toObject();
  const QString path = model.value("path").toString();
  if (!path.isEmpty()) {
    *name = QFileInfo(path).fileName();
    return QFileInfo(path).absoluteFilePath();
  }
  const QString hub_id = model.value("hub_id").toString();
  if (hub_id.isEmpty()) {
    *problem = QCoreApplication::translate("BaseModel", "The run's job spec names no base model.");
    return {};
  }
  *name = hub_id;
  const QString revision = model.value("revision").toString("main");
  try {
    const hf::hub::CacheRepo repo(hf::hub::Settings::from_environment().cache_dir,
                                  hub_id.toStdString(), hf::hub::RepoType::Model);
    if (const auto commit = repo.resolve(revision.toStdString()))
      return QString::fromStdString(repo.snapshot_dir(*commit).string());
  } catch (const std::exception&) {  // a name the cache cannot hold: not downloaded either
  }
  *problem = QCoreApplication::translate("BaseModel",
                                         "The base model %1 (%2) is not in the Hugging Face "
                                         "cache: download it on the Models page to compare "
                                         "with it.")
                 .arg(hub_id, revision);
  return {};
}

QString config_dtype(const QString& model_dir) {
  QFile config(QDir(model_dir).filePath("config.json"));
  if (!config.open(QIODevice::ReadOnly)) return {};
  const QJsonObject o = QJsonDocument::fromJson(config.read(1 << 20)).object();
  return o.value("torch_dtype").toString(o.value("dtype").toString());
}

}  // namespace tessera::ui
