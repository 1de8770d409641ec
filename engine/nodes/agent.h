#pragma once
// `tessera-cli agent`: serves the node protocol (docs/nodes.md) on the one address it was told
// to bind, announces itself by UDP, pairs with clients through a code confirmed on both sides,
// and answers authenticated requests: ping, pre-flight checks, the c10d link test, and spawn
// (the pre-flight checks of a job, then its ranks on this machine, their output and exits
// streamed back; all stopped when one dies, the client asks, or the connection drops).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nodes/checks.h"

namespace tessera::nodes {

struct AgentOptions {
  std::string bind_address;  // resolved (choose_bind_address)
  std::uint16_t port = 0;    // kDefaultAgentPort by default; 0: any free port
  std::uint16_t discovery_port = 0;
  bool broadcast = true;                 // to the bound interface's broadcast address
  std::vector<std::string> announce_to;  // extra unicast targets (tests: 127.0.0.1)
  std::chrono::milliseconds announce_interval{2000};
  std::filesystem::path state_dir;
  std::string name;                        // empty: the stored one, or the host name
  std::optional<std::string> accept_code;  // answers the code question without a terminal
  BuildInfo build;
  // Runs rank 0 of the c10d link test at address:port, returning when it is over; empty where
  // this build has no LibTorch (the link test is then refused with that reason).
  std::function<void(const std::string& address, std::uint16_t port, std::uint64_t bytes)>
      link_test_rank0;
  std::function<void(const std::string& line)> print;  // the agent's terminal
  // Jobs (`spawn`): the program each rank runs as `PROGRAM run JOB.json` (this tessera-cli;
  // empty where it is built without LibTorch: spawn is then refused with that reason), the
  // folder the ranks run in (relative paths of a job spec resolve against it; empty: the
  // agent's own working folder), and how long ranks asked to stop get before SIGKILL.
  std::string rank_program;
  std::filesystem::path work_dir;
  std::chrono::duration<double> stop_grace{10.0};
};

class Agent {
 public:
  explicit Agent(AgentOptions options);  // binds the port and reads the state folder
  ~Agent();
  std::uint16_t port() const;
  const std::string& node_id() const;
  const std::string& name() const;
  // Serves until `stop` becomes true (checked at least every quarter second).
  void serve(const std::atomic<bool>& stop);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tessera::nodes
