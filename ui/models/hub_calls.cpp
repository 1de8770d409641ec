#include "ui/models/hub_calls.h"

#include <QObject>
#include <QRegularExpression>
#include <QStringList>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/files.h"
#include "hf/config.h"
#include "hf/families.h"
#include "hf/hub/http.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "ui/models/model_info.h"

namespace tessera::ui {

namespace hub = hf::hub;

namespace {

// The client reports HTTP statuses in its messages ("URL: HTTP 401: …"); it has no status field.
bool has_status(const std::string& message, int status) {
  return message.find(": HTTP " + std::to_string(status)) != std::string::npos;
}

// This machine's profile (CPU, memory, GPUs; no disk measurement), read once per process.
const plan::HardwareProfile& hardware_profile() {
  static std::once_flag once;
  static plan::HardwareProfile profile;
  std::call_once(once, [] {
    plan::ProfileOptions options;
    options.measure_disk = false;
    profile = plan::probe_hardware(options);
  });
  return profile;
}

// GET of a small file of the repository at `commit` into memory (config.json): no cache entry,
// so a repository that was only looked at does not show up as a local model.
std::string fetch_small_file(const hub::Settings& settings, const std::string& repo_id,
                             const std::string& commit, const std::string& file) {
  hub::HttpSession session;
  hub::HttpRequest request;
  request.url = settings.endpoint + "/" + repo_id + "/resolve/" + commit + "/" +
                hub::url_encode(file, /*keep_slash=*/true);
  request.follow_redirects = true;  // curl does not send Authorization to another host
  if (!settings.token.empty()) request.headers.push_back("Authorization: Bearer " + settings.token);
  hub::HttpResponse response;
  try {
    response = session.perform(request);
  } catch (const hub::TransportError& e) {
    throw_io(request.url + ": " + e.message, "check the connection and HF_ENDPOINT");
  }
  if (response.status != 200)
    throw_io(request.url + ": HTTP " + std::to_string(response.status),
             response.status == 429 ? "wait a few minutes and search again" : "");
  return response.body;
}

QString gib(std::uint64_t bytes) {
  return QString::fromStdString(core::human_bytes(bytes));
}

void plan_fit(HubModelCheck& check, const hf::ModelConfig& config, const job::JobSpec& spec) {
  plan::PlanInputs inputs;
  inputs.spec = spec;
  // A base stored quantized trains only as LoRA on it (QLoRA): planned so, and said so.
  if (config.quantization.stored()) {
    inputs.spec.method.type = "lora";
    inputs.spec.method.quantize = "none";
  }
  inputs.model = config;
  inputs.checkpoint_bytes =
      static_cast<std::uint64_t>(std::max<std::int64_t>(0, check.weights_bytes));
  inputs.profile = hardware_profile();
  const plan::Plan plan = plan::make_plan(inputs);
  if (plan.tiers.empty()) return;
  const plan::PlanTier& tier = plan.tiers.front();
  const QString where = QString::fromStdString(tier.tier) + (tier.simulated ? " (simulated)" : "");
  const QString amounts =
      QObject::tr("%1 of %2 usable (%3)").arg(gib(tier.estimate.peak()), gib(tier.budget), where);
  check.fit_detail = QString::fromStdString(plan.explanation);
  if (!plan.fits) {
    check.fit = HubModelCheck::Fit::TooLarge;
    check.fit_text = QObject::tr("✘ needs %1").arg(gib(tier.estimate.peak()));
    check.fit_detail = QObject::tr("Does not fit: %1.").arg(amounts) +
                       (plan.explanation.empty() ? "" : " " + check.fit_detail);
    if (!plan.what_would_fit.empty())
      check.fit_detail += " " + QString::fromStdString(plan.what_would_fit);
  } else if (plan.settings.method != spec.method.type) {
    check.fit = HubModelCheck::Fit::FitsWithOtherMethod;
    const bool qlora = plan.settings.method == "lora" && plan.settings.quantize != "none";
    check.fit_text =
        QObject::tr("~ only as %1")
            .arg(qlora                            ? QObject::tr("QLoRA")
                 : plan.settings.method == "lora" ? QObject::tr("LoRA")
                                                  : QString::fromStdString(plan.settings.method));
    check.fit_detail =
        QObject::tr("Fits only with another method: %1.").arg(amounts) + " " + check.fit_detail;
  } else {
    check.fit = HubModelCheck::Fit::Fits;
    check.fit_text = QObject::tr("✔ %1").arg(gib(tier.estimate.peak()));
    check.fit_detail = QObject::tr("Fits: %1.").arg(amounts) + " " + check.fit_detail;
  }
}

}  // namespace

HubFailure hub_failure(const std::exception& error, bool have_token) {
  HubFailure f;
  const std::string message = error.what();
  f.message = QString::fromStdString(message);
  if (const auto* e = dynamic_cast<const Error*>(&error))
    f.hint = QString::fromStdString(e->hint());
  if (message.find("HF_HUB_OFFLINE is set") != std::string::npos) {
    f.problem = HubProblem::Offline;
  } else if (has_status(message, 401)) {
    f.problem = have_token ? HubProblem::TokenRejected : HubProblem::NeedsToken;
  } else if (has_status(message, 403)) {
    f.problem = HubProblem::Gated;
  } else if (has_status(message, 429)) {
    f.problem = HubProblem::RateLimited;
  } else if (has_status(message, 404) || message.find(" not found") != std::string::npos) {
    f.problem = HubProblem::NotFound;
  } else if (dynamic_cast<const Error*>(&error) != nullptr &&
             static_cast<const Error&>(error).kind() == ErrorKind::Io &&
             message.find(": HTTP ") == std::string::npos) {
    f.problem = HubProblem::Unreachable;
  } else {
    f.problem = HubProblem::Other;
  }
  return f;
}

hub::Settings hub_settings(const std::string& token) {
  hub::Settings settings = hub::Settings::from_environment();
  if (!token.empty()) settings.token = token;
  return settings;
}

HubSearchResult search_hub(const hub::Settings& settings, const hub::SearchQuery& query) {
  HubSearchResult result;
  try {
    hub::Client client(settings);
    hub::SearchPage page = client.search(query);
    result.hits = std::move(page.hits);
    result.next_page_url = std::move(page.next_page_url);
  } catch (const std::exception& e) {
    result.failure = hub_failure(e, !settings.token.empty());
  }
  return result;
}

HubModelCheck check_hub_model(const hub::Settings& settings, const std::string& repo_id,
                              const job::JobSpec& spec) {
  HubModelCheck check;
  check.repo_id = QString::fromStdString(repo_id);
  hub::RepoInfo info;
  try {
    hub::Client client(settings);
    info = client.info(repo_id, hub::RepoType::Model, "main");
  } catch (const std::exception& e) {
    check.failure = hub_failure(e, !settings.token.empty());
    return check;
  }
  check.commit = QString::fromStdString(info.sha);
  check.license = QString::fromStdString(info.license);
  check.gated = QString::fromStdString(info.gated);
  const hub::Selection selection = hub::select_files(repo_id, hub::RepoType::Model, info.files, {});
  if (!selection.refusal.empty()) {
    check.support = HubModelCheck::Support::Unsupported;
    check.support_reason = QString::fromStdString(selection.refusal);
    check.support_hint = QString::fromStdString(selection.hint);
    return check;
  }
  check.files = selection.files;
  check.download_bytes = 0;
  bool has_config = false;
  for (const hub::RepoFile& f : selection.files) {
    check.download_bytes += std::max<std::int64_t>(0, f.size);
    if (f.path.ends_with(".safetensors")) check.weights_bytes += std::max<std::int64_t>(0, f.size);
    has_config = has_config || f.path == "config.json";
  }
  if (!has_config) {
    check.support = HubModelCheck::Support::Unsupported;
    check.support_reason = QObject::tr("no config.json in the repository");
    return check;
  }
  hf::ModelConfig config;
  try {
    const nlohmann::json doc =
        nlohmann::json::parse(fetch_small_file(settings, repo_id, info.sha, "config.json"));
    if (doc.is_object() && doc.contains("model_type") && doc["model_type"].is_string())
      check.model_type = QString::fromStdString(doc["model_type"].get<std::string>());
    config = hf::parse_model_config(doc, repo_id + "/config.json");
  } catch (const nlohmann::json::exception& e) {
    check.support = HubModelCheck::Support::Unsupported;
    check.support_reason = QObject::tr("%1/config.json is not JSON: %2")
                               .arg(QString::fromStdString(repo_id), e.what());
    return check;
  } catch (const Error& e) {
    // parse_model_config's errors name the unsupported model_type or the bad field; a failed
    // request is the failure of the whole check.
    if (e.kind() == ErrorKind::Io) {
      check.failure = hub_failure(e, !settings.token.empty());
      return check;
    }
    check.support = HubModelCheck::Support::Unsupported;
    check.support_reason = QString::fromStdString(e.what());
    check.support_hint = QString::fromStdString(e.hint());
    return check;
  }
  check.model_type = QString::fromStdString(config.model_type);
  if (!is_causal_lm(config)) {
    check.support = HubModelCheck::Support::Unsupported;
    check.support_reason = QObject::tr(
                               "%1 is not a causal language model; fine-tuning other heads is not "
                               "supported yet")
                               .arg(check.model_type);
    return check;
  }
  check.support = HubModelCheck::Support::Supported;
  check.support_reason = check.model_type;
  if (!config.architectures.empty())
    check.support_reason += " (" + QString::fromStdString(config.architectures.front()) + ")";
  if (config.quantization.stored()) {
    check.stored_quantization = QString::fromStdString(config.quantization.format);
    check.support_reason +=
        QObject::tr(
            ", already quantized: %1. It trains as QLoRA (LoRA on this frozen base); full "
            "fine-tuning needs the model's unquantized checkpoint.")
            .arg(QString::fromStdString(config.quantization.describe()));
  }
  try {
    plan_fit(check, config, spec);
  } catch (const std::exception& e) {
    check.fit = HubModelCheck::Fit::Unknown;
    check.fit_text = QObject::tr("no estimate");
    check.fit_detail = QObject::tr("The planner could not plan this model: %1").arg(e.what());
  }
  return check;
}

QString count_text(std::int64_t n, const QString& one, const QString& many) {
  return n == 1 ? one : many.arg(n);
}

QString hub_page_url(const QString& repo_id, hub::RepoType type) {
  return QString::fromStdString(hub::Settings::from_environment().endpoint) +
         (type == hub::RepoType::Dataset ? "/datasets/" : "/") + repo_id;
}

QString strip_front_matter(QString markdown) {
  static const QRegularExpression front(
      R"(\A\x{feff}?---[ \t]*\r?\n(.*?\r?\n)?---[ \t]*(\r?\n|\z))",
      QRegularExpression::DotMatchesEverythingOption);
  return markdown.remove(front);
}

HubCard fetch_card(const hub::Settings& settings, const std::string& repo_id, hub::RepoType type) {
  HubCard card;
  try {
    hub::Client client(settings);
    const std::optional<std::string> text = client.card(repo_id, type, "main");
    card.ok = true;
    card.markdown = text ? strip_front_matter(QString::fromStdString(*text))
                         : QObject::tr("*This repository has no card (README.md).*");
  } catch (const std::exception& e) {
    card.markdown = QObject::tr("*The card could not be read:* %1")
                        .arg(QString::fromStdString(e.what()).toHtmlEscaped());
  }
  return card;
}

}  // namespace tessera::ui
