#pragma once
// Requests to the Hub shared by the client's files (client.cpp, datasets.cpp): retries with
// backoff, the token's headers, and HTTP failures turned into errors that say what to do.
// Internal to tessera_hub.
#include <atomic>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hf/hub/client.h"
#include "hf/hub/http.h"

namespace tessera::hf::hub::detail {

// What a request is about, for its error messages.
struct Context {
  const Settings* settings = nullptr;
  std::string repo;
  RepoType type = RepoType::Model;
  std::string revision;
  std::string file;  // "" for repository-level requests
};

bool cancelled(const std::atomic<bool>* cancel);

// Waits before attempt `attempt` + 1 of the request to `url`, which failed with `response` (or,
// where it is null, the connection's `failure`): Retry-After when the server sent one, else
// exponential backoff; Settings::on_retry is told first. Returns early (false) when cancelled.
bool wait_before_retry(int attempt, const HttpResponse* response, const DownloadParams& params,
                       const Settings& settings, const std::string& url,
                       const std::string& failure = {});

bool is_retryable_status(long status);  // 429 and 5xx that may pass

// Throws the error a non-2xx response means (401, 403 gated, 404 repository / revision / file,
// 429, others), naming `url` and the repository; the token is never part of it.
[[noreturn]] void throw_http(const HttpResponse& r, const std::string& url, const Context& c);

// "Authorization: Bearer …" when `url` is on the endpoint's host or the dataset viewer's.
std::vector<std::string> auth_headers(const Settings& s, const std::string& url);

// A GET retried on 5xx / 429 / a dropped connection; another non-2xx → throw_http, except a
// 404 when `missing_ok` (then nullopt). `next_link` receives the Link header's rel="next".
std::optional<std::string> get_body(HttpSession& session, const std::string& url, const Context& c,
                                    const DownloadParams& retry, const std::string& accept,
                                    std::string* next_link = nullptr, bool missing_ok = false);

// An API document (get_body with JSON parsed).
nlohmann::json get_json(HttpSession& session, const std::string& url, const Context& c,
                        const DownloadParams& retry, std::string* next_link = nullptr);

// Throws when Settings::offline: `what` needs the network.
void require_online(const Settings& s, const std::string& what);

}  // namespace tessera::hf::hub::detail
