#include "ui/models/hub_dataset_calls.h"

#include <QObject>
#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "ui/utility/error_text.h"

namespace tessera::ui {

namespace hub = hf::hub;

HubDatasetInfo load_hub_dataset(const hub::Settings& settings, const std::string& repo_id) {
  HubDatasetInfo out;
  out.repo_id = QString::fromStdString(repo_id);
  try {
    hub::Client client(settings);
    const hub::RepoInfo info = client.info(repo_id, hub::RepoType::Dataset, kHubDatasetRevision);
    out.license = QString::fromStdString(info.license);
    out.gated = QString::fromStdString(info.gated);
    out.layout = client.dataset_layout(repo_id, kHubDatasetRevision);
  } catch (const std::exception& e) {
    out.failure = hub_failure(e, !settings.token.empty());
  }
  return out;
}

HubRowsPreview preview_hub_rows(const hub::Settings& settings, const std::string& repo_id,
                                const std::string& config, const std::string& split, int max_rows) {
  HubRowsPreview out;
  out.repo_id = QString::fromStdString(repo_id);
  out.config = QString::fromStdString(config);
  out.split = QString::fromStdString(split);
  try {
    hub::Client client(settings);
    const hub::RowPreview preview =
        client.preview_rows(repo_id, kHubDatasetRevision, config, split, max_rows);
    for (const std::string& c : preview.columns) out.columns << QString::fromStdString(c);
    for (const auto& row : preview.rows) {
      QStringList cells;
      for (const std::string& cell : row) cells << QString::fromStdString(cell);
      out.rows << cells;
    }
    out.source = QString::fromStdString(preview.source);
    out.partial = preview.partial;
  } catch (const Error& e) {
    // No preview offered (Parquet without the viewer, a file type it cannot show) or the Hub
    // refused: said where the rows would be.
    out.unavailable = error_text(e);
    const HubFailure failure = hub_failure(e, !settings.token.empty());
    if (failure.problem != HubProblem::Other && failure.problem != HubProblem::NotFound)
      out.problem = failure.problem;
  } catch (const std::exception& e) {
    out.unavailable = QString::fromStdString(e.what());
  }
  return out;
}

QString default_validation_split(const hub::DatasetConfig& config) {
  for (const char* name : {"validation", "valid", "val", "dev"})
    for (const hub::DatasetSplit& s : config.splits)
      if (s.name == name && !s.files.empty()) return QString::fromStdString(s.name);
  return {};
}

HubDatasetChoice choose_hub_dataset(const HubDatasetInfo& info, const std::string& config_name,
                                    const std::string& train_split,
                                    const std::string& validation_split) {
  HubDatasetChoice choice;
  choice.repo_id = info.repo_id;
  choice.commit = QString::fromStdString(info.layout.commit);
  const auto config =
      std::find_if(info.layout.configs.begin(), info.layout.configs.end(),
                   [&](const hub::DatasetConfig& c) { return c.name == config_name; });
  if (config == info.layout.configs.end()) return choice;
  choice.config = QString::fromStdString(config->name);
  // Files at the revision browsed are fetched at the commit it was at (what was previewed is
  // what trains); the conversion branch's are fetched from that branch.
  choice.from_parquet_conversion = config->revision != kHubDatasetRevision;
  choice.files_at =
      choice.from_parquet_conversion ? QString::fromStdString(config->revision) : choice.commit;
  std::int64_t bytes = 0;
  bool sizes_known = true;
  for (const hub::DatasetSplit& split : config->splits) {
    QStringList* files = split.name == train_split ? &choice.train_files
                         : !validation_split.empty() && split.name == validation_split
                             ? &choice.validation_files
                             : nullptr;
    if (files == nullptr) continue;
    (split.name == train_split ? choice.train_split : choice.validation_split) =
        QString::fromStdString(split.name);
    for (std::size_t i = 0; i < split.files.size(); ++i) {
      *files << QString::fromStdString(split.files[i]);
      const std::int64_t size = i < split.sizes.size() ? split.sizes[i] : -1;
      if (size < 0) sizes_known = false;
      bytes += std::max<std::int64_t>(0, size);
    }
  }
  choice.bytes = sizes_known ? bytes : -1;
  return choice;
}

std::optional<QString> cached_hub_dataset(const HubDatasetChoice& choice) {
  try {
    const hub::Settings settings = hub::Settings::from_environment();
    const hub::CacheRepo repo(settings.cache_dir, choice.repo_id.toStdString(),
                              hub::RepoType::Dataset);
    for (const std::string& revision :
         {choice.commit.toStdString(), std::string(hub::kParquetConversionRevision)}) {
      const std::optional<std::string> commit = repo.resolve(revision);
      if (!commit) continue;
      bool all = true;
      std::error_code ec;
      for (const QString& f : choice.train_files + choice.validation_files)
        all = all && std::filesystem::exists(repo.pointer_path(*commit, f.toStdString()), ec);
      if (all && !choice.train_files.isEmpty())
        return QString::fromStdString(repo.snapshot_dir(*commit).string());
    }
  } catch (const Error&) {
    // A name the cache cannot hold (the spec was edited by hand): not cached.
  }
  return std::nullopt;
}

HubDownloadRequest HubDatasetChoice::download_request() const {
  HubDownloadRequest request;
  request.type = hub::RepoType::Dataset;
  request.repo_id = repo_id;
  request.revision = files_at;
  request.include = train_files + validation_files;
  // The card too, as `tessera-cli run` fetches it: the configs it declares read offline.
  if (!from_parquet_conversion) request.include << "README.md";
  request.label = label();
  return request;
}

QString HubDatasetChoice::label() const {
  return QObject::tr("%1 · %2: %3")
      .arg(repo_id, config,
           validation_split.isEmpty() ? train_split : train_split + ", " + validation_split);
}

}  // namespace tessera::ui
