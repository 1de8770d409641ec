#include "hub_model.h"

#include "hf/hub/client.h"

namespace tessera::cli {

std::filesystem::path fetch_hub_model(const job::JobSpec& spec, job::EventSink& events,
                                      const std::atomic<bool>* stop) {
  namespace hub = hf::hub;
  hub::Client client(hub::Settings::from_environment());
  hub::DownloadParams params;
  params.revision = spec.model.revision;
  params.cancel = stop;
  params.on_progress = [&](const hub::DownloadProgress& p) {
    events.progress("download", p.done_bytes, p.total_bytes);
  };
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

}  // namespace tessera::cli
