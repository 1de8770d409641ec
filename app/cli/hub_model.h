#pragma once
// A job spec's model.hub_id made local: the Hub snapshot in the shared HF cache, downloaded
// where files are missing (progress events with phase "download"); with HF_HUB_OFFLINE the
// cache alone, or an error naming what is missing.
#include <atomic>
#include <filesystem>

#include "hf/hub/settings.h"
#include "job/events.h"
#include "job/job_spec.h"

namespace tessera::cli {

// The Hub's settings from the environment, telling of every retry (a rate limit's Retry-After
// may hold a request for minutes): a line on stderr, and a warning on `events` where given.
hf::hub::Settings hub_settings(job::EventSink* events = nullptr);

std::filesystem::path fetch_hub_model(const job::JobSpec& spec, job::EventSink& events,
                                      const std::atomic<bool>* stop);

// A job spec's dataset.hub_id made local: the config dataset.config names (else the dataset's
// default config, hf/hub/datasets.h), its "train" split for training and its "validation"
// ("valid", "val", "dev") split for validation, unless dataset.train / dataset.validation give
// patterns over the repository's files at the config's revision (training patterns without a
// config need no layout: the files at dataset.revision); only those files and the card are
// fetched into the shared HF cache, like a model. Returns `dataset` with train_files /
// validation_files set to the snapshot's files.
job::DatasetSpec fetch_hub_dataset(const job::DatasetSpec& dataset, job::EventSink& events,
                                   const std::atomic<bool>* stop);

}  // namespace tessera::cli
