#pragma once
// What the studio asks the Hub (engine/hf/hub's client), as plain functions that block: call
// them off the GUI thread. Each turns the client's errors into a HubFailure whose kind picks
// the page's empty/error state (offline, token rejected, gated, rate limited, …) and whose
// message and hint say what is wrong and what to do. The token never appears in them.
#include <QString>
#include <QStringList>
#include <cstdint>
#include <string>
#include <vector>

#include "hf/hub/client.h"
#include "job/job_spec.h"

namespace tessera::ui {

enum class HubProblem {
  None,
  Offline,        // HF_HUB_OFFLINE is set
  NeedsToken,     // 401 without a token: private, gated, or no such repository
  TokenRejected,  // 401 with a token
  Gated,          // 403: the account has not accepted the repository's license
  RateLimited,    // 429 after the client's retries
  NotFound,       // 404
  Unreachable,    // no connection to the endpoint
  Other,
};

struct HubFailure {
  HubProblem problem = HubProblem::None;
  QString message;  // the client's message (URL and status)
  QString hint;     // what to do
  bool failed() const { return problem != HubProblem::None; }
};

// The client's error (tessera::Error or another exception) as a HubFailure.
HubFailure hub_failure(const std::exception& error, bool have_token);

// The client settings: the environment's (HF_ENDPOINT, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN or
// the token file), with `token` instead of the environment's when it is not empty (the token the
// studio keeps in the keychain).
hf::hub::Settings hub_settings(const std::string& token);

struct HubSearchResult {
  std::vector<hf::hub::SearchHit> hits;
  std::string next_page_url;  // empty: no more results
  HubFailure failure;
};
HubSearchResult search_hub(const hf::hub::Settings& settings, const hf::hub::SearchQuery& query);

// One download for the tray: what Tessera fetches of a model, or chosen files of a dataset, at a
// revision.
struct HubDownloadRequest {
  hf::hub::RepoType type = hf::hub::RepoType::Model;
  QString repo_id;
  QString revision = "main";
  QStringList include;  // repository paths or patterns; empty: all that Tessera would fetch
  QString label;        // what the tray shows: "org/name", or "org/data · default: train"
  // The same files of the same repository at the same revision (the label aside).
  bool same_files(const HubDownloadRequest& other) const {
    return type == other.type && repo_id == other.repo_id && revision == other.revision &&
           include == other.include;
  }
};

// What the Models page shows of one Hub model, from its repository info and its config.json
// (fetched alone, into memory; no weights are downloaded to decide).
struct HubModelCheck {
  QString repo_id;
  HubFailure failure;  // the info or config.json request failed
  QString commit;
  QString license;
  QString gated;                         // "", "auto" or "manual"
  std::int64_t download_bytes = -1;      // what Tessera would fetch (weights, config, tokenizer)
  std::int64_t weights_bytes = 0;        // of those, the safetensors files
  std::vector<hf::hub::RepoFile> files;  // what Tessera would fetch (empty when it refuses)
  enum class Support { Unknown, Supported, Unsupported };
  Support support = Support::Unknown;
  QString model_type;
  // A base the Hub ships quantized (config.json's bitsandbytes quantization_config): its format,
  // "nf4" / "fp4" / "int8"; empty for a dense one. It trains only as QLoRA's frozen base.
  QString stored_quantization;
  QString support_reason;  // why not, or the architecture when supported (and stored quantization)
  QString support_hint;
  // The planner's answer for the method chosen in the wizard (its plan for this model's config
  // and checkpoint size on this machine's hardware profile).
  enum class Fit { Unknown, Fits, FitsWithOtherMethod, TooLarge };
  Fit fit = Fit::Unknown;
  QString
      fit_text;  // the badge: "✔ 1.2 GiB" (the planned peak), "✘ needs 30 GiB", "~ only as LoRA"
  QString fit_detail;  // "Fits: 1.2 GiB of 14 GiB usable (host)." and the plan's explanation
};

// `spec` carries the wizard's choices (method, precision, batch, sequence length, strategy);
// its model is ignored.
HubModelCheck check_hub_model(const hf::hub::Settings& settings, const std::string& repo_id,
                              const job::JobSpec& spec);

// A repository's card for a CardView: README.md (at main) as Markdown with its YAML header
// (metadata: license, tags, configs) dropped, or a note that there is none. `ok` is false when it
// could not be read (offline, rate limited, …): the markdown then says why, and it is not to be
// kept (the next look asks again).
struct HubCard {
  bool ok = false;
  QString markdown;
};
HubCard fetch_card(const hf::hub::Settings& settings, const std::string& repo_id,
                   hf::hub::RepoType type);

// "1 file" / "8 files": `one` when n is 1, else `many` with %1 = n (tr's %n plural says
// "file(s)" unless a translation is loaded).
QString count_text(std::int64_t n, const QString& one, const QString& many);

// The repository's page on the Hub (HF_ENDPOINT/org/name, HF_ENDPOINT/datasets/org/name).
QString hub_page_url(const QString& repo_id, hf::hub::RepoType type);

// `markdown` without a leading YAML front matter block (--- … ---).
QString strip_front_matter(QString markdown);

}  // namespace tessera::ui
