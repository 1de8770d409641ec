#pragma once
// Where the Hub is and who we are, read from the environment the way huggingface_hub reads it,
// so both tools share one cache and one token:
//   cache folder  HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub
//   HF_HOME       else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface
//   token         HF_TOKEN, else the file HF_TOKEN_PATH, else $HF_HOME/token
//   endpoint      HF_ENDPOINT, else the public Hub
//   offline       HF_HUB_OFFLINE (1/true/yes/on), else TRANSFORMERS_OFFLINE when it is unset
//   stall limit   HF_HUB_DOWNLOAD_TIMEOUT (seconds); 30 when unset or not a positive number
//                 (huggingface_hub's default is 10: ours is at least as tolerant)
// and Tessera's own:
//   viewer        TESSERA_HUB_VIEWER_ENDPOINT, else https://datasets-server.huggingface.co for
//                 the public Hub, else the endpoint itself (mirrors and the test server serve
//                 the dataset viewer's API at their root)
#include <filesystem>
#include <functional>
#include <string>

namespace tessera::hf::hub {

// A request that failed in a way that may pass, and how long the client waits before it tries
// again.
struct RetryNotice {
  std::string url;
  std::string reason;  // "HTTP 429 (rate limited)", "HTTP 503", or the connection's error
  int attempt = 0;     // the attempt that failed (1: the first)
  int max_attempts = 0;
  double wait_s = 0.0;  // the server's Retry-After where it sent one, else the backoff
};

// "HTTP 429 (rate limited); trying again in 30 s (attempt 2 of 4)": the notice as the CLI's
// stderr, a job's events and the studio's download row say it (without the URL).
std::string describe(const RetryNotice& notice);

struct Settings {
  std::string endpoint;              // scheme://host[:port][/prefix], no trailing '/'
  std::filesystem::path cache_dir;   // the hub cache (models--*, datasets--*, .locks)
  std::filesystem::path token_path;  // the token file huggingface_hub's login writes
  std::string token;                 // empty: anonymous. Never logged or printed.
  bool offline = false;
  // The variable that made it so, for messages: HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE.
  std::string offline_variable = "HF_HUB_OFFLINE";
  std::string viewer_endpoint;  // the dataset viewer's API (/first-rows), no trailing '/'
  // A transfer that receives nothing for this long counts as dropped (and is resumed).
  long download_timeout_s = 30;
  // Told of every retry before its wait (a rate limit may hold a request for minutes); unset:
  // silent. Called from the download's worker threads, possibly at once.
  std::function<void(const RetryNotice&)> on_retry;

  static Settings from_environment();
};

// Writes `token` to `path` (mode 0600, temporary file + fsync + rename), creating the folder.
void save_token(const std::filesystem::path& path, const std::string& token);

// Removes the token file; false when there was none.
bool remove_token(const std::filesystem::path& path);

// The token with surrounding whitespace removed; throws InvalidInput when it is empty or holds
// characters an HTTP header cannot carry (the token itself is never part of the message).
std::string clean_token(const std::string& token);

}  // namespace tessera::hf::hub
