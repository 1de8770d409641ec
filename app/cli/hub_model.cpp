#include "hub_model.h"

#include <optional>

#include "hf/hub/cache.h"
#include "hf/hub/client.h"

namespace tessera::cli {
namespace {

namespace hub = hf::hub;

// How a job fetches its Hub inputs: at the spec's revision, stopped by Ctrl-C, with progress
// events of phase "download".
hub::DownloadParams job_download(hub::RepoType type, const std::string& revision,
                                 job::EventSink& events, const std::atomic<bool>* stop) {
  hub::DownloadParams params;
  params.type = type;
  params.revision = revision;
  params.cancel = stop;
  params.on_progress = [&events](const hub::DownloadProgress& p) {
    events.progress("download", p.done_bytes, p.total_bytes);
  };
  return params;
}

}  // namespace

std::filesystem::path fetch_hub_model(const job::JobSpec& spec, job::EventSink& events,
                                      const std::atomic<bool>* stop) {
  hub::Client client(hub::Settings::from_environment());
  const hub::DownloadParams params =
      job_download(hub::RepoType::Model, spec.model.revision, events, stop);
  events.log("info", "model.hub_id " + spec.model.hub_id + " at " + spec.model.revision +
                         (client.settings().offline ? ": from the cache (HF_HUB_OFFLINE)"
                                                    : ": fetching what the cache lacks"));
  try {
    const hub::DownloadResult result = client.download(spec.model.hub_id, params);
    events.log("info", "model " + spec.model.hub_id + " is " + result.snapshot.string());
    return result.snapshot;
  } catch (const Error& e) {
    throw Error(e.kind(), "job spec: model.hub_id \"" + spec.model.hub_id + "\": " + e.what(),
                e.hint());
  }
}

job::DatasetSpec fetch_hub_dataset(const job::DatasetSpec& dataset, job::EventSink& events,
                                   const std::atomic<bool>* stop) {
  hub::Client client(hub::Settings::from_environment());
  hub::DownloadParams params = job_download(hub::RepoType::Dataset, dataset.revision, events, stop);
  try {
    // The repository's data files: its file list online, what the cache holds offline.
    std::vector<hub::RepoFile> files;
    if (client.settings().offline) {
      // The file list the cache kept for the commit the revision was at (files not downloaded
      // included, so choosing splits works as online; the download then names what is missing).
      const hub::CacheRepo cached(client.settings().cache_dir, dataset.hub_id, params.type);
      const std::optional<std::string> commit = cached.resolve(dataset.revision);
      if (commit) files = cached.read_tree(*commit).value_or(std::vector<hub::RepoFile>{});
      if (files.empty())
        throw_invalid("the cache has no file list for revision " + dataset.revision,
                      "run `tessera-cli hub download " + dataset.hub_id +
                          " --dataset` with network access (unset HF_HUB_OFFLINE)");
    } else {
      files = client.info(dataset.hub_id, params.type, dataset.revision).files;
    }
    std::vector<std::string> names;
    for (const auto& f : hub::select_files(dataset.hub_id, params.type, files, {}).files)
      names.push_back(f.path);
    job::DatasetSpec local = dataset;
    std::string listed;
    for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
    if (dataset.train_files.empty()) {
      const hub::DatasetSplits splits = hub::dataset_splits(names);
      local.train_files = splits.train;
      if (dataset.validation_files.empty()) local.validation_files = splits.validation;
      if (local.train_files.empty())
        throw_invalid("no file names a training split (" + listed + ")",
                      "name its files in dataset.train, e.g. [\"data/*.jsonl\"]");
    } else {
      local.train_files = hub::matching(names, dataset.train_files);
      if (local.train_files.empty())
        throw_invalid("dataset.train matches none of its data files (" + listed + ")",
                      "dataset.train holds patterns over the repository's files, such as "
                      "\"data/train-*.parquet\"");
    }
    if (!dataset.validation_files.empty()) {
      local.validation_files = hub::matching(names, dataset.validation_files);
      if (local.validation_files.empty())
        throw_invalid("dataset.validation matches none of its data files (" + listed + ")");
    }
    events.log("info", "dataset.hub_id " + dataset.hub_id + " at " + dataset.revision + ": " +
                           std::to_string(local.train_files.size()) + " training and " +
                           std::to_string(local.validation_files.size()) + " validation files");
    params.include = local.train_files;
    params.include.insert(params.include.end(), local.validation_files.begin(),
                          local.validation_files.end());
    const hub::DownloadResult result = client.download(dataset.hub_id, params);
    for (auto* files : {&local.train_files, &local.validation_files})
      for (std::string& f : *files) f = (result.snapshot / f).string();
    events.log("info", "dataset " + dataset.hub_id + " is " + result.snapshot.string());
    return local;
  } catch (const Error& e) {
    throw Error(e.kind(), "job spec: dataset.hub_id \"" + dataset.hub_id + "\": " + e.what(),
                e.hint());
  }
}

}  // namespace tessera::cli
