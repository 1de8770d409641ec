#include "dist/environment.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <optional>

#include "core/error.h"

namespace tessera::dist {
namespace {

constexpr const char* kLaunchHint =
    "torchrun and `tessera-cli launch` set MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK "
    "and LOCAL_WORLD_SIZE for every process; under another launcher set them yourself (srun: "
    "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID; mpirun: RANK=$OMPI_COMM_WORLD_RANK "
    "LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK), or unset WORLD_SIZE for one process";

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// `needed_for` says why, e.g. "WORLD_SIZE=4 needs it: ...".
std::string required(const char* name, const std::string& needed_for) {
  auto value = variable(name);
  if (!value || value->empty()) {
    throw_invalid(std::string(name) + " is not set; " + needed_for, kLaunchHint);
  }
  return *value;
}

long long parse_integer(const char* name, const std::string& text) {
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw_invalid(std::string(name) + "=" + text + " is not an integer", kLaunchHint);
  }
  return value;
}

// An integer in [low, high]; `range` says the range in the user's terms.
int integer_in(const char* name, const std::string& text, long long low, long long high,
               const std::string& range) {
  const long long value = parse_integer(name, text);
  if (value < low || value > high) {
    throw_invalid(std::string(name) + "=" + text + " is out of range: it must be " + range,
                  kLaunchHint);
  }
  return static_cast<int>(value);
}

std::chrono::milliseconds seconds_variable(const char* name, std::chrono::milliseconds fallback) {
  auto text = variable(name);
  if (!text || text->empty()) return fallback;
  double seconds = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), seconds);
  if (error != std::errc() || end != text->data() + text->size() || !(seconds > 0) ||
      seconds > 7 * 24 * 3600.0) {
    throw_invalid(std::string(name) + "=" + *text + " is not a timeout",
                  std::string("set ") + name + " to a number of seconds above 0 (e.g. 300)");
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

}  // namespace

DistEnvironment read_dist_environment() {
  DistEnvironment environment;
  const auto world_text = variable("WORLD_SIZE");
  if (!world_text || world_text->empty()) {
    if (auto rank = variable("RANK"); rank && !rank->empty() && *rank != "0") {
      throw_invalid("RANK=" + *rank + " is set but WORLD_SIZE is not", kLaunchHint);
    }
    return environment;
  }
  environment.world_size = integer_in("WORLD_SIZE", *world_text, 1, 1 << 20, "1 or more");
  if (environment.world_size == 1) {
    if (auto rank = variable("RANK"); rank && !rank->empty() && *rank != "0") {
      throw_invalid("RANK=" + *rank + " is not below WORLD_SIZE=1: it must be 0", kLaunchHint);
    }
    return environment;
  }

  const std::string world = std::to_string(environment.world_size);
  const std::string last_rank = std::to_string(environment.world_size - 1);
  const std::string why = "WORLD_SIZE=" + world + " needs it";
  environment.rank = integer_in("RANK", required("RANK", why), 0, environment.world_size - 1,
                                "0 .. " + last_rank + " (below WORLD_SIZE=" + world + ")");
  environment.local_world_size =
      integer_in("LOCAL_WORLD_SIZE", required("LOCAL_WORLD_SIZE", why), 1, environment.world_size,
                 "1 .. " + world + " (the processes on this machine, at most WORLD_SIZE)");
  environment.local_rank = integer_in(
      "LOCAL_RANK", required("LOCAL_RANK", why), 0, environment.local_world_size - 1,
      "0 .. " + std::to_string(environment.local_world_size - 1) +
          " (below LOCAL_WORLD_SIZE=" + std::to_string(environment.local_world_size) + ")");
  environment.master_addr = required("MASTER_ADDR", why + ": the address of rank 0's machine");
  environment.master_port = static_cast<std::uint16_t>(integer_in(
      "MASTER_PORT", required("MASTER_PORT", why + ": a free TCP port on rank 0's machine"), 1,
      65535, "a TCP port, 1 .. 65535"));
  return environment;
}

std::chrono::milliseconds DistTimeouts::heartbeat_interval() const {
  using std::chrono::milliseconds;
  return std::clamp(milliseconds(collective.count() / 10), milliseconds(100), milliseconds(5000));
}

DistTimeouts read_dist_timeouts() {
  DistTimeouts timeouts;
  timeouts.collective = seconds_variable("TESSERA_DIST_TIMEOUT_S", timeouts.collective);
  const bool collective_set = variable("TESSERA_DIST_TIMEOUT_S").has_value();
  timeouts.rendezvous =
      seconds_variable("TESSERA_DIST_RENDEZVOUS_TIMEOUT_S",
                       collective_set ? timeouts.collective : timeouts.rendezvous);
  return timeouts;
}

}  // namespace tessera::dist
