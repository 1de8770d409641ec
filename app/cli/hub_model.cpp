#include "hub_model.h"

#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <optional>

#include "hf/hub/cache.h"
#include "hf/hub/client.h"
#include "hf/hub/datasets.h"

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

hub::Settings hub_settings(job::EventSink* events) {
  hub::Settings settings = hub::Settings::from_environment();
  settings.on_retry = [events](const hub::RetryNotice& n) {
    static std::mutex one_at_a_time;
    const std::lock_guard lock(one_at_a_time);
    const std::string line = "hub: " + n.url + ": " + hub::describe(n);
    if (events != nullptr)
      events->log("warning", line);
    else
      std::fprintf(stderr, "%s\n", line.c_str());
  };
  return settings;
}

std::filesystem::path fetch_hub_model(const job::JobSpec& spec, job::EventSink& events,
                                      const std::atomic<bool>* stop) {
  hub::Client client(hub_settings(&events));
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

namespace {

// The config a job names, else the layout's default one.
const hub::DatasetConfig& chosen_config(const hub::DatasetLayout& layout, const std::string& name) {
  std::string names;
  for (const hub::DatasetConfig& c : layout.configs) names += (names.empty() ? "" : ", ") + c.name;
  if (name.empty()) {
    if (!layout.configs.front().is_default)
      throw_invalid("it has several configs (" + names + ") and none is the default",
                    "name one in dataset.config");
    return layout.configs.front();
  }
  for (const hub::DatasetConfig& c : layout.configs)
    if (c.name == name) return c;
  throw_invalid("dataset.config \"" + name + "\" is not one of its configs (" + names + ")");
}

const hub::DatasetSplit* find_split(const hub::DatasetConfig& config,
                                    std::initializer_list<const char*> names) {
  for (const char* name : names)
    for (const hub::DatasetSplit& s : config.splits)
      if (s.name == name) return &s;
  return nullptr;
}

// The data files of the repository at `revision` (patterns in dataset.train / .validation choose
// among them): its file list online, the one the cache kept offline.
std::vector<std::string> data_files_at(hub::Client& client, const std::string& repo_id,
                                       const std::string& revision) {
  std::vector<hub::RepoFile> files;
  if (client.settings().offline) {
    const hub::CacheRepo cached(client.settings().cache_dir, repo_id, hub::RepoType::Dataset);
    const std::optional<std::string> commit = cached.resolve(revision);
    if (commit) files = cached.read_tree(*commit).value_or(std::vector<hub::RepoFile>{});
    if (files.empty())
      throw_invalid("the cache has no file list for revision " + revision,
                    "run `tessera-cli hub download " + repo_id +
                        " --dataset` with network access (unset HF_HUB_OFFLINE)");
  } else {
    files = client.info(repo_id, hub::RepoType::Dataset, revision).files;
  }
  std::vector<std::string> names;
  for (const hub::RepoFile& f : files)
    if (hub::is_data_file(f.path)) names.push_back(f.path);
  return names;
}

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

job::DatasetSpec fetch_hub_dataset(const job::DatasetSpec& dataset, job::EventSink& events,
                                   const std::atomic<bool>* stop) {
  hub::Client client(hub_settings(&events));
  try {
    job::DatasetSpec local = dataset;
    // Training patterns and no config: the files at dataset.revision, no layout needed (so a
    // cache without the card still serves them offline). Otherwise the config's splits.
    std::optional<hub::DatasetLayout> layout;
    const hub::DatasetConfig* config = nullptr;
    if (dataset.train_files.empty() || !dataset.config.empty()) {
      layout = client.dataset_layout(dataset.hub_id, dataset.revision);
      config = &chosen_config(*layout, dataset.config);
    }
    const std::string revision = config != nullptr ? config->revision : dataset.revision;
    std::vector<std::string> names;
    if (!dataset.train_files.empty() || !dataset.validation_files.empty())
      names = data_files_at(client, dataset.hub_id, revision);
    if (dataset.train_files.empty()) {
      const hub::DatasetSplit* train = find_split(*config, {"train"});
      if (train == nullptr) {
        std::string splits;
        for (const hub::DatasetSplit& s : config->splits)
          splits += (splits.empty() ? "" : ", ") + s.name;
        throw_invalid(
            "config \"" + config->name + "\" has no train split (its splits: " + splits + ")",
            "name the training files in dataset.train, e.g. [\"data/*.jsonl\"]");
      }
      local.train_files = train->files;
    } else {
      local.train_files = hub::matching(names, dataset.train_files);
      if (local.train_files.empty())
        throw_invalid("dataset.train matches none of its data files (" + listed(names) + ")",
                      "dataset.train holds patterns over the repository's files, such as "
                      "\"data/train-*.parquet\"");
    }
    if (!dataset.validation_files.empty()) {
      local.validation_files = hub::matching(names, dataset.validation_files);
      if (local.validation_files.empty())
        throw_invalid("dataset.validation matches none of its data files (" + listed(names) + ")");
    } else if (dataset.train_files.empty()) {
      if (const auto* v = find_split(*config, {"validation", "valid", "val", "dev"}))
        local.validation_files = v->files;
    }
    const std::string chosen_by =
        config != nullptr ? "config " + config->name + " (from its " + layout->source + ")"
                          : std::string("files by pattern");
    for (const auto* files : {&local.train_files, &local.validation_files})
      for (const std::string& f : *files)
        if (!hub::is_data_file(f))
          throw_unsupported(
              chosen_by + " names " + f + ", a file type Tessera's readers do not take",
              "Tessera reads JSON, JSONL, CSV, TSV, text and Parquet; choose other "
              "files with dataset.train / dataset.validation");
    events.log("info", "dataset.hub_id " + dataset.hub_id + " at " + dataset.revision + ", " +
                           chosen_by + ": " + std::to_string(local.train_files.size()) +
                           " training and " + std::to_string(local.validation_files.size()) +
                           " validation files" +
                           (revision != dataset.revision ? " at " + revision : ""));
    // Only the chosen files, and the card (online: offline a run needs it only for the layout,
    // which had it), at the revision that holds them.
    hub::DownloadParams params = job_download(hub::RepoType::Dataset, revision, events, stop);
    params.include = local.train_files;
    params.include.insert(params.include.end(), local.validation_files.begin(),
                          local.validation_files.end());
    if (!client.settings().offline) params.include.push_back("README.md");
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
