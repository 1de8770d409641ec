#pragma once
// A job spec's model.hub_id made local: the Hub snapshot in the shared HF cache, downloaded
// where files are missing (progress events with phase "download"); with HF_HUB_OFFLINE the
// cache alone, or an error naming what is missing.
#include <atomic>
#include <filesystem>

#include "job/events.h"
#include "job/job_spec.h"

namespace tessera::cli {

std::filesystem::path fetch_hub_model(const job::JobSpec& spec, job::EventSink& events,
                                      const std::atomic<bool>* stop);

// A job spec's dataset.hub_id made local: its training (and validation) files chosen by
// dataset.train / dataset.validation as patterns over the repository's files, else by their
// split names (hf/hub/client.h dataset_splits), fetched into the shared HF cache like a model.
// Returns `dataset` with train_files / validation_files set to the snapshot's files.
job::DatasetSpec fetch_hub_dataset(const job::DatasetSpec& dataset, job::EventSink& events,
                                   const std::atomic<bool>* stop);

}  // namespace tessera::cli
