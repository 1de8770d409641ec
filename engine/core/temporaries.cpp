#include "core/temporaries.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <fstream>
#include <string_view>
#include <system_error>

namespace tessera::core {
namespace fs = std::filesystem;

namespace {

// Digits at `text`'s start up to `end_mark` (or the end when it is 0), as a pid.
std::optional<pid_t> leading_pid(std::string_view text, char end_mark) {
  const std::size_t end = end_mark == 0 ? text.size() : text.find(end_mark);
  if (end == 0 || end == std::string_view::npos) return std::nullopt;
  long long value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + end, value);
  if (ec != std::errc() || ptr != text.data() + end || value <= 0 || value > (1LL << 30))
    return std::nullopt;
  // What follows the pid must be digits too (the random part).
  const std::string_view rest = text.substr(end == text.size() ? end : end + 1);
  if (end_mark != 0 && (rest.empty() || rest.find_first_not_of("0123456789") != rest.npos))
    return std::nullopt;
  return static_cast<pid_t>(value);
}

std::optional<pid_t> owner_after(const std::string& name, std::string_view marker, char separator) {
  const std::size_t at = name.rfind(marker);
  if (at == std::string::npos || at == 0) return std::nullopt;
  return leading_pid(std::string_view(name).substr(at + marker.size()), separator);
}

bool is_old_export(const std::string& name) {
  return name.size() > 1 && name[0] == '.' && name.rfind(".old-") != std::string::npos;
}

}  // namespace

std::optional<pid_t> temporary_owner(const std::string& name) {
  if (name.size() > 1 && name[0] == '.') {
    if (auto pid = owner_after(name, ".tmp-", '-')) return pid;
    if (auto pid = owner_after(name, ".old-", '-')) return pid;
  }
  return owner_after(name, ".tmp.", '.');
}

bool process_alive(pid_t pid) {
  if (pid == ::getpid()) return true;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie has exited: its temporaries are as dead as it is.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const std::size_t paren = line.rfind(')');
  return !(paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z');
}

int remove_dead_temporaries(const fs::path& folder,
                            const std::function<void(const std::string&)>& log) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return 0;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    const std::optional<pid_t> owner = temporary_owner(name);
    if (!owner || process_alive(*owner)) continue;
    if (is_old_export(name)) {
      // ".<name>.old-<pid>-<n>": the previous export, moved aside; while <name> is missing the
      // swap did not finish and this is the only copy of it.
      const std::string target = name.substr(1, name.rfind(".old-") - 1);
      if (!fs::exists(folder / target, ec)) {
        if (log)
          log("kept " + entry.path().string() + ": " + (folder / target).string() +
              " is missing, so it is the only copy of that export");
        continue;
      }
    }
    fs::remove_all(entry.path(), ec);
    if (ec) {
      if (log) log("cannot remove " + entry.path().string() + ": " + ec.message());
      ec.clear();
      continue;
    }
    ++removed;
    if (log)
      log("removed " + entry.path().string() + ", left by process " + std::to_string(*owner) +
          " which is no longer running");
  }
  return removed;
}

}  // namespace tessera::core
