#pragma once
// What the Datasets page asks the Hub of one dataset before downloading it: its configs and
// splits (Client::dataset_layout) with its license and access, and a preview of a split's first
// rows (Client::preview_rows); and what it downloads: the files of a training split and of a
// validation split. Plain functions that block (call them off the GUI thread); failures become
// HubFailure (hub_calls.h) or, for a preview the Hub does not offer, a message shown in place of
// the rows.
#include <QList>
#include <QString>
#include <QStringList>
#include <cstdint>
#include <optional>
#include <string>

#include "hf/hub/datasets.h"
#include "ui/models/hub_calls.h"

namespace tessera::ui {

struct HubDatasetInfo {
  QString repo_id;
  HubFailure failure;  // the info or layout request failed
  QString license;
  QString gated;                  // "", "auto" or "manual"
  hf::hub::DatasetLayout layout;  // asked at kHubDatasetRevision; its commit pins what is fetched
};

// The revision the Datasets page browses (the Hub's viewer previews the main branch only).
inline constexpr const char* kHubDatasetRevision = "main";

HubDatasetInfo load_hub_dataset(const hf::hub::Settings& settings, const std::string& repo_id);

struct HubRowsPreview {
  QString repo_id;
  QString config;
  QString split;
  QStringList columns;
  QList<QStringList> rows;
  QString source;  // "dataset viewer", or the file read ("data/train.jsonl, first 1 MiB")
  bool partial = true;
  // Non-empty: no preview (the message and what to do), shown in place of the rows.
  QString unavailable;
  HubProblem problem = HubProblem::None;  // why, when the Hub refused or could not be reached
};

HubRowsPreview preview_hub_rows(const hf::hub::Settings& settings, const std::string& repo_id,
                                const std::string& config, const std::string& split, int max_rows);

// A dataset's files as the Datasets page chooses them: one config's training split and,
// optionally, a validation split.
struct HubDatasetChoice {
  QString repo_id;
  QString commit;       // the commit the layout was read at (the job spec's dataset.revision)
  QString config;       // the config's name (dataset.config)
  QString files_at;     // the revision that holds the files: the commit, or refs/convert/parquet
  QString train_split;  // "train"
  QString validation_split;  // "" : held out of the training rows instead
  QStringList train_files;   // repository paths
  QStringList validation_files;
  std::int64_t bytes = -1;  // of those files; -1 when the Hub did not say
  bool from_parquet_conversion = false;

  // The tray's download of exactly these files (and the card).
  HubDownloadRequest download_request() const;
  // "org/data · default: train, validation"
  QString label() const;
};

// The choice of `config`'s `train_split` (and `validation_split` when not empty) of `info`.
HubDatasetChoice choose_hub_dataset(const HubDatasetInfo& info, const std::string& config,
                                    const std::string& train_split,
                                    const std::string& validation_split);

// The snapshot folder of the HF cache that holds every file of `choice` — at its commit, else
// in the Parquet conversion's last snapshot — or nullopt (a cloned run's dataset, read again).
// Looks at the file system only.
std::optional<QString> cached_hub_dataset(const HubDatasetChoice& choice);

// The split that validates by default: the config's "validation" (or "valid", "val", "dev"),
// else "" (hold out a share of the training rows). Test splits are never chosen.
QString default_validation_split(const hf::hub::DatasetConfig& config);

}  // namespace tessera::ui
