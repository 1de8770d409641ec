#include "hf/hub/requests.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

namespace tessera::hf::hub::detail {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

bool cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load();
}

bool wait_before_retry(int attempt, const HttpResponse* response, const DownloadParams& params,
                       const Settings& settings, const std::string& url,
                       const std::string& failure) {
  double delay_s = std::min(params.backoff_max_s,
                            params.backoff_first_s * std::pow(2.0, std::max(0, attempt - 1)));
  if (response != nullptr) {
    if (const std::string* after = response->header("retry-after")) {
      char* end = nullptr;
      const double seconds = std::strtod(after->c_str(), &end);
      if (end != after->c_str() && seconds >= 0) delay_s = std::min(seconds, 300.0);
    }
  }
  if (settings.on_retry) {
    std::string reason = failure;
    if (response != nullptr)
      reason = "HTTP " + std::to_string(response->status) +
               (response->status == 429 ? " (rate limited)" : "");
    settings.on_retry({url, reason, attempt, params.max_attempts, delay_s});
  }
  const auto until = Clock::now() + std::chrono::duration<double>(delay_s);
  while (Clock::now() < until) {
    if (cancelled(params.cancel)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool is_retryable_status(long status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

namespace {

const char* const kLoginHint = "run `tessera-cli hub login` (or set HF_TOKEN)";

// The endpoint's page for a repository (where its license is accepted).
std::string repo_page(const Settings& s, const std::string& repo, RepoType type) {
  return s.endpoint + (type == RepoType::Dataset ? "/datasets/" : "/") + repo;
}

}  // namespace

[[noreturn]] void throw_http(const HttpResponse& r, const std::string& url, const Context& c) {
  const std::string code = r.header("x-error-code") ? *r.header("x-error-code") : "";
  std::string detail = r.header("x-error-message") ? *r.header("x-error-message") : "";
  if (detail.empty() && !r.body.empty() && r.body.size() < 300 && r.body.front() == '{') {
    try {
      detail = nlohmann::json::parse(r.body).value("error", std::string());
    } catch (const nlohmann::json::exception&) {
    }
  }
  const std::string status = "HTTP " + std::to_string(r.status);
  const bool anonymous = c.settings->token.empty();
  const std::string what = c.type == RepoType::Dataset ? "dataset " : "model ";
  if (r.status == 401) {
    if (anonymous)
      throw_invalid(url + ": " + status + ": " + what + c.repo +
                        " does not exist, or it is private or gated and needs a token",
                    "check the id; for a private or gated repository " + std::string(kLoginHint) +
                        " with a token of an account that can read it");
    throw_invalid(url + ": " + status + ": the Hub rejected the token, or " + what + c.repo +
                      " does not exist",
                  "check the id; replace the token with `tessera-cli hub login` (or HF_TOKEN)");
  }
  if (r.status == 403) {
    if (code == "GatedRepo" || anonymous || detail.find("gated") != std::string::npos)
      throw_invalid(url + ": " + status + ": " + what + c.repo +
                        " is gated: this account has not been granted access",
                    "open " + repo_page(*c.settings, c.repo, c.type) +
                        ", accept its license with the account the token belongs to, then run "
                        "again" +
                        (anonymous ? std::string("; give that account's token: ") + kLoginHint
                                   : std::string()));
    throw_invalid(url + ": " + status + ": access to " + what + c.repo + " is forbidden" +
                      (detail.empty() ? "" : " (" + detail + ")"),
                  "check that the token has read access (a fine-grained token needs the "
                  "repository's read permission)");
  }
  if (r.status == 404) {
    if (code == "RevisionNotFound")
      throw_invalid(url + ": revision \"" + c.revision + "\" not found in " + what + c.repo,
                    "see its branches on " + repo_page(*c.settings, c.repo, c.type));
    if (code == "EntryNotFound" || !c.file.empty())
      throw_invalid(
          url + ": file \"" + c.file + "\" not found in " + what + c.repo + " at " + c.revision,
          "list its files with `tessera-cli hub info " + c.repo + "`");
    throw_invalid(url + ": " + what + c.repo + " not found",
                  "check the id with `tessera-cli hub search`" +
                      std::string(c.type == RepoType::Model ? "; a dataset needs --dataset" : ""));
  }
  if (r.status == 429)
    throw_io(url + ": " + status + ": the Hub is rate-limiting these requests",
             "wait a few minutes and run again (logged-in users get higher limits)");
  throw_io(url + ": " + status + (detail.empty() ? "" : ": " + detail),
           r.status >= 500 ? "the server failed; run again later (downloads resume)" : "");
}

std::vector<std::string> auth_headers(const Settings& s, const std::string& url) {
  std::vector<std::string> headers;
  // The token goes only to the endpoint's own host and the Hub's dataset viewer (it serves
  // gated datasets to a token that may read them), never to a CDN a file redirects to.
  const std::string origin = url_origin(url);
  if (!s.token.empty() &&
      (origin == url_origin(s.endpoint) || origin == url_origin(s.viewer_endpoint)))
    headers.push_back("Authorization: Bearer " + s.token);
  return headers;
}

std::optional<std::string> get_body(HttpSession& session, const std::string& url, const Context& c,
                                    const DownloadParams& retry, const std::string& accept,
                                    std::string* next_link, bool missing_ok) {
  for (int attempt = 1;; ++attempt) {
    HttpRequest request;
    request.url = url;
    request.headers = auth_headers(*c.settings, url);
    request.headers.push_back("Accept: " + accept);
    request.follow_redirects = true;
    HttpResponse response;
    try {
      response = session.perform(request);
    } catch (const TransportError& e) {
      if (e.retryable && attempt < retry.max_attempts &&
          wait_before_retry(attempt, nullptr, retry, *c.settings, url, e.message))
        continue;
      throw_io(url + ": " + e.message,
               "check the network (or HF_ENDPOINT); set HF_HUB_OFFLINE=1 to use the cache only");
    }
    if (is_retryable_status(response.status) && attempt < retry.max_attempts &&
        wait_before_retry(attempt, &response, retry, *c.settings, url))
      continue;
    if (missing_ok && response.status == 404) return std::nullopt;
    if (response.status < 200 || response.status >= 300) throw_http(response, url, c);
    if (next_link != nullptr) {
      next_link->clear();
      if (const std::string* link = response.header("link")) {
        // <URL>; rel="next", possibly among other links
        std::size_t pos = 0;
        while ((pos = link->find('<', pos)) != std::string::npos) {
          const auto close = link->find('>', pos);
          if (close == std::string::npos) break;
          const auto next_lt = link->find('<', close);
          const std::string params = link->substr(close, next_lt - close);
          if (params.find("rel=\"next\"") != std::string::npos) {
            *next_link = link->substr(pos + 1, close - pos - 1);
            break;
          }
          pos = close;
        }
      }
    }
    return std::move(response.body);
  }
}

nlohmann::json get_json(HttpSession& session, const std::string& url, const Context& c,
                        const DownloadParams& retry, std::string* next_link) {
  const std::string body = *get_body(session, url, c, retry, "application/json", next_link);
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(url + ": the response is not JSON (" + std::string(e.what()) + ")",
                  "is HF_ENDPOINT a Hub-compatible server?");
  }
}
void require_online(const Settings& s, const std::string& what) {
  if (s.offline)
    throw_invalid(what + " needs the Hub, and " + s.offline_variable + " is set",
                  "unset " + s.offline_variable + " to reach " + s.endpoint);
}

}  // namespace tessera::hf::hub::detail
