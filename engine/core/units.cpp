#include "core/units.h"

#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "core/text.h"

namespace tessera::core {

namespace {

std::string trim(const std::string& s) {
  std::size_t b = 0;
  std::size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

double unit_scale(const std::string& unit) {
  constexpr double kKi = 1024.0;
  if (unit.empty() || unit == "b") return 1.0;
  if (unit == "kib" || unit == "k") return kKi;
  if (unit == "mib" || unit == "m") return kKi * kKi;
  if (unit == "gib" || unit == "g") return kKi * kKi * kKi;
  if (unit == "tib" || unit == "t") return kKi * kKi * kKi * kKi;
  if (unit == "kb") return 1e3;
  if (unit == "mb") return 1e6;
  if (unit == "gb") return 1e9;
  if (unit == "tb") return 1e12;
  return 0.0;
}

}  // namespace

std::uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  char* end = nullptr;
  const double value = std::strtod(t.c_str(), &end);
  const std::string unit = ascii_lower(trim(std::string(end ? end : "")));
  const double scale = unit_scale(unit);
  const double bytes = value * scale;
  if (end == t.c_str() || scale == 0.0 || !(bytes > 0.0) || !(bytes < 1.8e19))
    throw_invalid(what + ": \"" + text + "\" is not a size", "write it like 2GiB, 512MiB or 1.5GB");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace tessera::core
