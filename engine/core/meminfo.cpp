#include "core/meminfo.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace tessera::core {
namespace {

std::uint64_t meminfo_field(const std::string& text, const std::string& key) {
  const auto at = text.find(key + ":");
  if (at == std::string::npos) return 0;
  const unsigned long long kib = std::strtoull(text.c_str() + at + key.size() + 1, nullptr, 10);
  return static_cast<std::uint64_t>(kib) * 1024u;
}

}  // namespace

MemInfo read_meminfo() {
  std::ifstream in("/proc/meminfo");
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  MemInfo m;
  m.total = meminfo_field(text, "MemTotal");
  m.available = meminfo_field(text, "MemAvailable");
  return m;
}

std::uint64_t process_rss() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  const long page = ::sysconf(_SC_PAGESIZE);
  return resident * static_cast<std::uint64_t>(page > 0 ? page : 4096);
}

std::uint64_t process_peak_rss() {
  std::ifstream in("/proc/self/status");
  if (!in) return 0;
  std::stringstream ss;
  ss << in.rdbuf();
  return meminfo_field(ss.str(), "VmHWM");
}

bool reset_process_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace tessera::core
