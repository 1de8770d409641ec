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

}  // namespace tessera::cli
