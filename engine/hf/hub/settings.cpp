#include "hf/hub/settings.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/files.h"
#include "core/text.h"

namespace tessera::hf::hub {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

bool env_true(const char* name) {
  const std::string value = core::ascii_lower(env(name));
  return value == "1" || value == "true" || value == "yes" || value == "on";
}

std::filesystem::path expand_home(const std::string& path) {
  if (path.starts_with("~/") || path == "~")
    return std::filesystem::path(env("HOME")) / path.substr(path.size() > 1 ? 2 : 1);
  return path;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

}  // namespace

std::string describe(const RetryNotice& notice) {
  return notice.reason + "; trying again in " +
         std::to_string(static_cast<long>(std::ceil(notice.wait_s))) + " s (attempt " +
         std::to_string(notice.attempt + 1) + " of " + std::to_string(notice.max_attempts) + ")";
}

Settings Settings::from_environment() {
  Settings s;
  std::filesystem::path home;
  if (!env("HF_HOME").empty()) {
    home = expand_home(env("HF_HOME"));
  } else {
    std::filesystem::path xdg = env("XDG_CACHE_HOME").empty() ? expand_home("~/.cache")
                                                              : expand_home(env("XDG_CACHE_HOME"));
    home = xdg / "huggingface";
  }
  if (!env("HF_HUB_CACHE").empty())
    s.cache_dir = expand_home(env("HF_HUB_CACHE"));
  else if (!env("HUGGINGFACE_HUB_CACHE").empty())
    s.cache_dir = expand_home(env("HUGGINGFACE_HUB_CACHE"));
  else
    s.cache_dir = home / "hub";
  s.token_path = env("HF_TOKEN_PATH").empty() ? home / "token" : expand_home(env("HF_TOKEN_PATH"));
  s.endpoint = env("HF_ENDPOINT").empty() ? "https://huggingface.co" : env("HF_ENDPOINT");
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  if (!env("TESSERA_HUB_VIEWER_ENDPOINT").empty())
    s.viewer_endpoint = env("TESSERA_HUB_VIEWER_ENDPOINT");
  else if (s.endpoint == "https://huggingface.co")
    s.viewer_endpoint = "https://datasets-server.huggingface.co";
  else
    s.viewer_endpoint = s.endpoint;
  while (!s.viewer_endpoint.empty() && s.viewer_endpoint.back() == '/')
    s.viewer_endpoint.pop_back();
  // huggingface_hub reads it as whole seconds; a value that is not one keeps the default, since
  // the studio reads the environment at start and must not fail on it.
  const std::string timeout = trim(env("HF_HUB_DOWNLOAD_TIMEOUT"));
  if (!timeout.empty()) {
    char* end = nullptr;
    const long seconds = std::strtol(timeout.c_str(), &end, 10);
    if (end != timeout.c_str() && *end == '\0' && seconds > 0) s.download_timeout_s = seconds;
  }
  // As huggingface_hub: HF_HUB_OFFLINE when set, else TRANSFORMERS_OFFLINE.
  s.offline_variable = env("HF_HUB_OFFLINE").empty() ? "TRANSFORMERS_OFFLINE" : "HF_HUB_OFFLINE";
  s.offline = env_true(s.offline_variable.c_str());
  s.token = trim(env("HF_TOKEN"));
  if (s.token.empty()) {
    std::ifstream in(s.token_path);
    if (in) {
      std::stringstream buffer;
      buffer << in.rdbuf();
      s.token = trim(buffer.str());
    }
  }
  return s;
}

std::string clean_token(const std::string& token) {
  std::string t = trim(token);
  if (t.empty())
    throw_invalid("the token is empty", "paste an access token from your Hub account settings");
  for (char c : t)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      throw_invalid("the token contains a space or a control character",
                    "paste the access token alone, on one line");
  return t;
}

void save_token(const std::filesystem::path& path, const std::string& token) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) throw_io(path.parent_path().string() + ": cannot create the folder: " + ec.message());
  std::random_device rd;
  const std::filesystem::path tmp =
      path.string() + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw_io(tmp.string() + ": cannot create: " + std::strerror(errno));
  const std::string text = token;  // huggingface_hub writes the token alone, no newline
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw_io(path.string() + ": cannot write the token file: " + why);
  }
  core::fsync_directory(path.parent_path());
}

bool remove_token(const std::filesystem::path& path) {
  std::error_code ec;
  const bool removed = std::filesystem::remove(path, ec);
  if (ec) throw_io(path.string() + ": cannot remove the token file: " + ec.message());
  return removed;
}

}  // namespace tessera::hf::hub
