// tessera-cli agent: serves this machine to a studio on the LAN (engine/nodes, docs/nodes.md):
// listens on the one address chosen, announces itself by UDP, pairs once through a code shown
// on both sides, and answers authenticated requests (pre-flight checks, the c10d link test).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "command.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "nodes/agent.h"
#include "nodes/protocol.h"
#include "nodes/rank_processes.h"
#include "nodes/store.h"
#include "nodes/wire.h"

#ifdef TESSERA_WITH_TORCH
#include "nodes/link/link_test.h"
#endif

namespace tessera::cli {

// cmd_nodes.cpp: what this tessera-cli is built with, for the checks.
nodes::BuildInfo this_build();

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};  // the first SIGINT or SIGTERM: the exit code is 128 + it

void on_signal(int signal) {
  int none = 0;
  g_signal.compare_exchange_strong(none, signal);
  g_stop = true;
}

// One agent per state folder: two would each write their own pairings over the other's
// clients.json and announce the same node id. The lock lasts as long as this process.
void lock_state_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path lock = dir / "agent.lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    throw_io(lock.string() + ": cannot open: " + std::strerror(errno),
             "give a --state-dir this user can write");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    throw_invalid("--state-dir " + dir.string() +
                      ": another agent runs with this state folder (its node id and pairings are "
                      "there, and two agents would overwrite each other's)",
                  "stop the other agent, or give this one a --state-dir of its own");
  }
  // The descriptor stays open (and locked) until the process ends.
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int run_agent(const std::vector<std::string>& raw) {
  Args args(raw, {"--no-broadcast"},
            {"--bind", "--port", "--state-dir", "--name", "--accept-code", "--discovery-port",
             "--announce-to", "--work-dir", "--grace-period"});
  args.expect_no_positionals();
  nodes::AgentOptions options;
  std::optional<std::string> bind;
  if (const std::string* value = args.option("--bind")) bind = *value;
  options.bind_address = nodes::choose_bind_address(bind);
  options.port = args.option("--port") ? nodes::parse_port(*args.option("--port"), "--port")
                                       : nodes::kDefaultAgentPort;
  options.discovery_port =
      args.option("--discovery-port")
          ? nodes::parse_port(*args.option("--discovery-port"), "--discovery-port")
          : nodes::kDefaultDiscoveryPort;
  options.broadcast = !args.flag("--no-broadcast");
  if (const std::string* value = args.option("--announce-to"))
    options.announce_to = split_commas(*value);
  options.state_dir = args.option("--state-dir")
                          ? std::filesystem::path(*args.option("--state-dir"))
                          : nodes::AgentStore::default_dir();
  if (const std::string* value = args.option("--name")) options.name = *value;
  if (const std::string* value = args.option("--accept-code")) {
    options.accept_code = nodes::normalise_code(*value);
    if (!options.accept_code)
      throw UsageError{"--accept-code \"" + *value + "\" is not a 6-digit code"};
  }
  if (const std::string* value = args.option("--work-dir")) {
    std::error_code error;
    options.work_dir = std::filesystem::absolute(*value, error);
    if (error || !std::filesystem::is_directory(options.work_dir))
      throw UsageError{"--work-dir " + *value + " is not a folder"};
  }
  if (const std::string* value = args.option("--grace-period")) {
    double grace = -1;
    try {
      grace = std::stod(*value);
    } catch (const std::exception&) {
    }
    if (!(grace >= 0.0 && grace <= 3600.0))
      throw UsageError{"--grace-period " + *value + ": expected seconds from 0 to 3600"};
    options.stop_grace = std::chrono::duration<double>(grace);
  }
  options.build = this_build();
  options.print = [](const std::string& line) { std::cout << line << std::endl; };
#ifdef TESSERA_WITH_TORCH
  options.link_test_rank0 = [](const std::string& address, std::uint16_t port,
                               std::uint64_t bytes) {
    nodes::run_link_test(0, address, port, bytes, std::chrono::seconds(20));
  };
  options.rank_program = nodes::this_program_path();
#endif

  const std::string address = options.bind_address;
  const std::filesystem::path state_dir = options.state_dir;
  lock_state_folder(state_dir);
  std::string announced_to;
  for (const auto& target : options.announce_to) announced_to += " " + target;
  if (options.broadcast) {
    const std::string broadcast = nodes::broadcast_address_of(address);
    if (!broadcast.empty()) announced_to += " " + broadcast + " (broadcast)";
  }
  const std::uint16_t discovery_port = options.discovery_port;
  const bool confirm_by_flag = options.accept_code.has_value();
  const std::filesystem::path work_dir =
      options.work_dir.empty() ? std::filesystem::current_path() : options.work_dir;

  nodes::Agent agent(std::move(options));
  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  std::cout << "agent \"" << agent.name() << "\" (node id " << agent.node_id() << ") listening on "
            << address << ":" << agent.port() << "\n"
            << "state folder: " << state_dir.string() << "\n"
            << "jobs run in: " << work_dir.string() << "\n"
            << "announcing every 2 s on UDP port " << discovery_port << " to"
            << (announced_to.empty() ? std::string(" nobody (add this node by address)")
                                     : announced_to)
            << "\n"
            << "pairing: a client runs `tessera-cli nodes add " << address << ":" << agent.port()
            << "`; "
            << (confirm_by_flag ? "the code is checked against --accept-code"
                                : "confirm the code it shows here")
            << "\n"
            << "warning: " << nodes::kC10dWarning << std::endl;
  agent.serve(g_stop);
  std::cout << "agent stopped" << std::endl;
  // Stopped by a signal, as the shell reports one (docs/exit-codes.md): 130 or 143.
  return g_signal.load() != 0 ? core::exit_code_for_signal(g_signal.load()) : core::kExitDone;
}

const RegisterCommand kAgentCommand{{
    "agent",
    "agent [--bind ADDRESS|INTERFACE] [--port P] [--state-dir DIR] [--name NAME] "
    "[--accept-code CODE] [--discovery-port P] [--announce-to ADDR[,ADDR...]] [--no-broadcast] "
    "[--work-dir DIR] [--grace-period SECONDS]",
    "Serve this machine to a studio on the LAN: announce it, pair once by a code shown on both "
    "sides, run pre-flight checks and the ranks of jobs on request (docs/nodes.md)",
    run_agent,
}};

}  // namespace
}  // namespace tessera::cli
