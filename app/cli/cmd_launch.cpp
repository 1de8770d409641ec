// tessera-cli launch: one job as several processes, on this machine or across paired LAN nodes.
//
// `launch --nproc N JOB.json`: N local ranks, each a `tessera-cli run` child with torchrun's
// variables (MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port). `launch JOB.json` with "nodes" in
// the spec (or `--nodes local:1,box2:2`): every node is checked first (its agent's pre-flight
// checks, this job's files there, the c10d link), one table of results is printed and any failure
// refuses the job; then the local ranks start and each node's agent gets a `spawn` request for
// its ranks (docs/nodes.md).
//
// Rank 0 runs here and its event stream is the job's (stdout or --events FILE, as `run` writes
// it); the other ranks' output reaches stderr prefixed `[rank N]` (here) or `[NODE rank N]`.
// SIGINT/SIGTERM go to every rank on every node (they agree on a step, checkpoint and stop).
// When one rank fails anywhere, every other gets SIGTERM, then SIGKILL after the grace period;
// launch exits with the first failure's code and says which node and rank died and how. The
// local children live in a process group of their own and die with launch
// (nodes/rank_processes.h); an agent stops its ranks when launch's connection drops.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/files.h"
#include "job/events.h"
#include "job/job_spec.h"
#include "nodes/checks.h"
#include "nodes/client.h"
#include "nodes/crypto.h"
#include "nodes/job_checks.h"
#include "nodes/protocol.h"
#include "nodes/rank_processes.h"
#include "nodes/store.h"
#include "nodes/wire.h"
#include "plan/profile.h"
#include "run_job.h"
#include "runner/runner.h"

namespace tessera::cli {

// cmd_nodes.cpp.
nodes::BuildInfo this_build();
nodes::CheckResult link_check(const nodes::ClientStore& store, const nodes::PairedNode& node,
                              std::uint64_t bytes);

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr nodes::Milliseconds kSpawnTimeout = 60s;  // the agent runs its checks first
// After a stop, how long a node may take beyond the grace period to say its ranks are gone
// before launch hangs up (the agent then kills them itself).
constexpr std::chrono::seconds kNodeStopSlack{15};

// A TCP port on `address` that nothing listens on now (the kernel's pick), for rank 0's store.
std::uint16_t free_port(const std::string& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_io(std::string("launch: cannot open a socket: ") + std::strerror(errno));
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_port = 0;
  if (::inet_pton(AF_INET, address.c_str(), &where.sin_addr) != 1) {
    ::close(fd);
    throw_invalid("launch: MASTER_ADDR " + address + " is not an IPv4 address",
                  "set nodes.master_addr in the job spec to an address of this machine");
  }
  socklen_t length = sizeof where;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&where), sizeof where) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&where), &length) != 0) {
    const int error = errno;
    ::close(fd);
    throw_io("launch: cannot find a free TCP port on " + address + ": " + std::strerror(error),
             "MASTER_ADDR must be an address of this machine (nodes.master_addr)");
  }
  ::close(fd);
  return ntohs(where.sin_port);
}

std::string host_name_or(const char* fallback) {
  char host[256] = {};
  return ::gethostname(host, sizeof host - 1) == 0 ? host : fallback;
}

// One paired node taking part: its ranks and the open `spawn` connection to its agent.
struct RemoteNode {
  nodes::PairedNode node;
  std::vector<int> ranks;
  nodes::Socket socket;
  std::string nonce;
  std::uint64_t sent = 0, received = 0;
  bool connected = false;
  bool finished = false;
  std::optional<Clock::time_point> hang_up_at;  // set when asked to stop
};

struct Failure {
  std::string where;  // "rank 1" / "node box2 rank 3"
  int rank = 0;
  std::string node;  // empty: this machine
  std::string how;   // "was killed by signal 9 (Killed)"
  int exit_code = 1;
  bool rank0_killed = false;
};

class Launcher {
 public:
  Launcher(int local_nproc, int world_size, std::string master_addr, std::uint16_t master_port,
           std::vector<std::string> run_args, double grace_seconds)
      : local_nproc_(local_nproc),
        world_size_(world_size),
        master_addr_(std::move(master_addr)),
        master_port_(master_port),
        run_args_(std::move(run_args)),
        grace_(grace_seconds),
        local_({[this](int rank, const std::string& line) { print_line("rank", rank, line); },
                [this](int rank, pid_t pid, int status) { on_local_exit(rank, pid, status); }}) {}

  // Remote nodes join before run(); `job` is the spec they run.
  void add_remote(const nodes::ClientStore& store, const nodes::PairedNode& node,
                  std::vector<int> ranks, const json& job);

  // Starts the ranks and waits for them all; returns launch's exit code.
  int run();
  const std::optional<Failure>& failure() const { return failure_; }

 private:
  void start_local(const sigset_t& old_mask);
  void spawn_remote(RemoteNode& remote);
  void on_signal(int sig);
  void on_local_exit(int rank, pid_t pid, int status);
  void on_remote_message(RemoteNode& remote);
  void lose(RemoteNode& remote, const std::string& why);
  void fail(Failure failure);
  void send_remote(RemoteNode& remote, const json& body);
  void print_line(const std::string& who, int rank, const std::string& line);
  bool remotes_done() const;

  int local_nproc_;
  int world_size_;
  std::string master_addr_;
  std::uint16_t master_port_;
  std::vector<std::string> run_args_;
  double grace_;
  nodes::RankProcesses local_;
  const nodes::ClientStore* store_ = nullptr;
  json job_;
  std::vector<RemoteNode> remotes_;
  bool stop_requested_ = false;
  std::optional<Failure> failure_;
  std::optional<int> rank0_status_;
};

void Launcher::print_line(const std::string& who, int rank, const std::string& line) {
  const std::string out = "[" + who + " " + std::to_string(rank) + "] " + line + "\n";
  [[maybe_unused]] auto w = ::write(STDERR_FILENO, out.data(), out.size());
}

void Launcher::add_remote(const nodes::ClientStore& store, const nodes::PairedNode& node,
                          std::vector<int> ranks, const json& job) {
  store_ = &store;
  job_ = job;
  RemoteNode remote;
  remote.node = node;
  remote.ranks = std::move(ranks);
  remotes_.push_back(std::move(remote));
}

void Launcher::start_local(const sigset_t& old_mask) {
  const std::string self = nodes::this_program_path();
  std::vector<std::string> env = nodes::environment_without(
      {"WORLD_SIZE=", "RANK=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="});
  // As torchrun does: this machine's ranks share its cores instead of each starting a thread per
  // core.
  if (std::none_of(env.begin(), env.end(),
                   [](const std::string& e) { return e.rfind("OMP_NUM_THREADS=", 0) == 0; })) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    env.push_back("OMP_NUM_THREADS=" +
                  std::to_string(std::max(1u, cores / static_cast<unsigned>(local_nproc_))));
  }
  std::vector<nodes::RankCommand> commands;
  for (int r = 0; r < local_nproc_; ++r) {
    nodes::RankCommand command;
    command.rank = r;
    command.argv = {self};
    command.argv.insert(command.argv.end(), run_args_.begin(), run_args_.end());
    command.env = env;
    command.env.push_back("WORLD_SIZE=" + std::to_string(world_size_));
    command.env.push_back("RANK=" + std::to_string(r));
    command.env.push_back("LOCAL_RANK=" + std::to_string(r));
    command.env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(local_nproc_));
    command.env.push_back("MASTER_ADDR=" + master_addr_);
    command.env.push_back("MASTER_PORT=" + std::to_string(master_port_));
    command.capture_output = r > 0;  // rank 0 writes the job's stream and progress bar
    commands.push_back(std::move(command));
  }
  local_.start(commands, &old_mask);
}

void Launcher::spawn_remote(RemoteNode& remote) {
  json environment = json::object();
  for (const char* name : nodes::kSpawnForwardedVariables)
    if (const char* value = std::getenv(name)) environment[name] = value;
  const json body = {
      {"what", "spawn"},
      {"job", job_},
      {"requirements", nodes::to_json(nodes::requirements_for(this_build(), 0, 0, 0))},
      {"ranks", remote.ranks},
      {"world_size", world_size_},
      {"master_addr", master_addr_},
      {"master_port", master_port_},
      {"grace_period_s", grace_},
      {"environment", environment},
  };
  const std::string agent =
      remote.node.name + " (" + remote.node.address + ":" + std::to_string(remote.node.port) + ")";
  const json envelope = nodes::sign_request(store_->client_id(), remote.node.secret, body);
  remote.nonce = envelope["nonce"].get<std::string>();
  remote.socket = nodes::tcp_connect(remote.node.address, remote.node.port, 10s);
  nodes::send_message(remote.socket, envelope, 10s);
  const json answer =
      nodes::open_response(remote.node.secret, remote.nonce,
                           nodes::receive_message(remote.socket, kSpawnTimeout), agent);
  if (!answer.value("started", false)) {
    std::string reasons;
    for (const json& check : answer.value("checks", json::array()))
      if (!check.value("ok", false))
        reasons +=
            "; " + check.value("name", std::string()) + ": " + check.value("reason", std::string());
    throw Error(ErrorKind::Io,
                "node " + remote.node.name + " refused to start its ranks" +
                    (reasons.empty() ? std::string() : ": pre-flight failed" + reasons),
                "run tessera-cli nodes check " + remote.node.name);
  }
  remote.connected = true;
}

void Launcher::send_remote(RemoteNode& remote, const json& body) {
  if (!remote.connected) return;
  try {
    nodes::send_message(
        remote.socket,
        nodes::sign_response(remote.node.secret,
                             nodes::stream_nonce(remote.nonce, "client", ++remote.sent), body),
        10s);
  } catch (const Error& e) {
    lose(remote, e.what());
  }
}

void Launcher::fail(Failure failure) {
  if (failure_) return;
  const bool others =
      !local_.all_exited() || std::any_of(remotes_.begin(), remotes_.end(),
                                          [](const RemoteNode& r) { return !r.finished; });
  std::fprintf(stderr, "tessera-cli launch: %s %s%s\n", failure.where.c_str(), failure.how.c_str(),
               others ? (remotes_.empty() ? "; stopping the other ranks"
                                          : "; stopping the other ranks on every node")
                      : "");
  std::fflush(stderr);
  failure_ = std::move(failure);
  if (!local_.all_exited() && !local_.stopping())
    local_.stop(std::chrono::duration<double>(grace_));
  for (RemoteNode& remote : remotes_)
    if (!remote.finished && !remote.hang_up_at) {
      send_remote(remote, {{"signal", "stop"}});
      remote.hang_up_at =
          Clock::now() +
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_)) +
          kNodeStopSlack;
    }
}

void Launcher::on_local_exit(int rank, pid_t pid, int status) {
  if (rank == 0) rank0_status_ = status;
  const int code = nodes::exit_code_of(status);
  const bool ok = code == 0 || (stop_requested_ && core::is_requested_stop(code));
  if (ok) return;
  Failure f;
  f.where = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) +
            (remotes_.empty() ? "" : ", on this machine") + ")";
  f.rank = rank;
  f.how = nodes::describe_exit_status(status);
  f.exit_code = code;
  f.rank0_killed = rank == 0 && WIFSIGNALED(status);
  fail(std::move(f));
}

void Launcher::lose(RemoteNode& remote, const std::string& why) {
  if (!remote.connected) return;
  remote.connected = false;
  remote.finished = true;
  remote.socket = nodes::Socket();
  Failure f;
  f.where = "node " + remote.node.name;
  f.node = remote.node.name;
  f.rank = remote.ranks.front();
  f.how = "stopped answering (" + why + "); its agent stops its ranks when the connection drops";
  fail(std::move(f));
}

void Launcher::on_remote_message(RemoteNode& remote) {
  json message;
  try {
    message = nodes::open_response(remote.node.secret,
                                   nodes::stream_nonce(remote.nonce, "agent", ++remote.received),
                                   nodes::receive_message(remote.socket, 10s), remote.node.name);
  } catch (const Error& e) {
    return lose(remote, e.what());
  }
  const std::string type = message.value("type", std::string());
  const int rank = message.value("rank", -1);
  if (type == "output") {
    print_line(remote.node.name + " rank", rank, message.value("line", std::string()));
  } else if (type == "exit") {
    const int code = message.value("code", 1);
    const bool ok = code == 0 || (stop_requested_ && core::is_requested_stop(code));
    if (!ok) {
      Failure f;
      f.where = "node " + remote.node.name + " rank " + std::to_string(rank) + " (pid " +
                std::to_string(message.value("pid", 0)) + ")";
      f.node = remote.node.name;
      f.rank = rank;
      f.how = message.value("status", std::string("failed"));
      f.exit_code = code;
      fail(std::move(f));
    }
  } else if (type == "killed") {
    std::fprintf(stderr, "tessera-cli launch: node %s rank %d did not stop within %.0f s: killed\n",
                 remote.node.name.c_str(), rank, grace_);
  } else if (type == "stopping") {
    std::fprintf(stderr, "tessera-cli launch: node %s is stopping its ranks: %s\n",
                 remote.node.name.c_str(), message.value("reason", std::string()).c_str());
  } else if (type == "finished") {
    remote.finished = true;
    remote.connected = false;
    remote.socket = nodes::Socket();
  }
}

bool Launcher::remotes_done() const {
  return std::all_of(remotes_.begin(), remotes_.end(),
                     [](const RemoteNode& r) { return r.finished; });
}

void Launcher::on_signal(int sig) {
  if (sig == SIGCHLD) return local_.reap();
  // Ctrl-C or a stop request: every rank on every node stops after the step they agree on,
  // with a checkpoint (a second one makes them quit at once, as `run` does).
  stop_requested_ = true;
  local_.signal_live(sig);
  for (RemoteNode& remote : remotes_)
    if (!remote.finished) send_remote(remote, {{"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"}});
}

int Launcher::run() {
  // Signals arrive through a descriptor, in this loop; the children get the old mask back.
  sigset_t mask, old_mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD}) sigaddset(&mask, sig);
  ::sigprocmask(SIG_BLOCK, &mask, &old_mask);
  const int signals = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signals < 0) throw_io(std::string("launch: signalfd: ") + std::strerror(errno));
  try {
    start_local(old_mask);
    for (RemoteNode& remote : remotes_) {
      try {
        spawn_remote(remote);
      } catch (const Error& e) {
        remote.finished = true;
        Failure f;
        f.where = "node " + remote.node.name;
        f.node = remote.node.name;
        f.rank = remote.ranks.front();
        f.how = std::string("could not start its ranks: ") + e.what();
        fail(std::move(f));
        break;
      }
    }
    if (failure_)
      for (RemoteNode& remote : remotes_)
        if (!remote.connected) remote.finished = true;
  } catch (...) {
    local_.signal_live(SIGKILL);
    ::close(signals);
    throw;
  }
  while (!local_.all_done() || !remotes_done()) {
    std::vector<pollfd> fds = {{signals, POLLIN, 0}};
    const std::vector<int> outputs = local_.output_fds();
    for (int fd : outputs) fds.push_back({fd, POLLIN, 0});
    std::vector<RemoteNode*> readers;
    for (RemoteNode& remote : remotes_)
      if (remote.connected) {
        fds.push_back({remote.socket.fd(), POLLIN, 0});
        readers.push_back(&remote);
      }
    int timeout_ms = 250;
    if (const auto left = local_.time_to_next_tick())
      timeout_ms = std::min<int>(timeout_ms, static_cast<int>(left->count()));
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw_io(std::string("launch: poll: ") + std::strerror(errno));
    if (ready > 0) {
      if (fds[0].revents & POLLIN) {
        signalfd_siginfo info{};
        while (::read(signals, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
          on_signal(static_cast<int>(info.ssi_signo));
      }
      for (std::size_t i = 0; i < outputs.size(); ++i)
        if (fds[1 + i].revents & (POLLIN | POLLHUP | POLLERR)) local_.read_output(outputs[i]);
      for (std::size_t i = 0; i < readers.size(); ++i)
        if (fds[1 + outputs.size() + i].revents & (POLLIN | POLLHUP | POLLERR))
          on_remote_message(*readers[i]);
    }
    local_.reap();
    for (int rank : local_.tick())
      std::fprintf(stderr,
                   "tessera-cli launch: rank %d (pid %d) did not stop within %.0f s: killed\n",
                   rank, static_cast<int>(local_.pid_of(rank)), grace_);
    for (RemoteNode& remote : remotes_)
      if (!remote.finished && remote.hang_up_at && Clock::now() >= *remote.hang_up_at) {
        std::fprintf(stderr,
                     "tessera-cli launch: node %s did not report its ranks stopped in time: "
                     "hanging up (its agent then kills them)\n",
                     remote.node.name.c_str());
        remote.finished = true;
        remote.connected = false;
        remote.socket = nodes::Socket();
      }
  }
  // No rank is left, but a descendant might be: the group goes too.
  local_.kill_group();
  ::close(signals);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (failure_) return failure_->exit_code == 0 ? 1 : failure_->exit_code;
  if (rank0_status_ && nodes::exit_code_of(*rank0_status_) != 0)
    return nodes::exit_code_of(*rank0_status_);
  return 0;
}

// A rank that hangs or is cut off does not exit: launch sees the survivors fail instead (rank 0
// exited with code 1), while their error, in rank 0's stream, names the rank at fault. Say which
// machine that rank ran on, by the node's paired name (the error has only its host and address).
void name_rank_at_fault(const fs::path& events, std::uintmax_t from,
                        const std::vector<std::string>& machine_of_rank,
                        const std::optional<Failure>& failure) {
  std::ifstream in(events, std::ios::binary);
  if (!in) return;
  in.seekg(static_cast<std::streamoff>(from));
  const std::optional<job::RankError> error = job::last_rank_error(in);
  if (!error || error->rank >= static_cast<int>(machine_of_rank.size())) return;
  if (failure && failure->rank == error->rank) return;  // launch has named it already
  std::fprintf(stderr, "tessera-cli launch: the ranks name rank %d, on %s, as the cause: %s\n",
               error->rank, machine_of_rank[static_cast<std::size_t>(error->rank)].c_str(),
               error->message.c_str());
  std::fflush(stderr);
}

// Whether the stream at `events`, from byte `from` (this launch's part), has its `done` event.
bool stream_has_done(const fs::path& events, std::uintmax_t from) {
  std::ifstream in(events, std::ios::binary);
  if (!in) return false;
  in.seekg(static_cast<std::streamoff>(from));
  std::string line;
  while (std::getline(in, line)) {
    const json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (event.is_object() && event.value("type", "") == "done") return true;
  }
  return false;
}

// --- which machines, how many ranks each ------------------------------------------------------

// "local:1,box2:2" → the list of a NodesSpec.
std::vector<job::NodeRanks> parse_nodes_option(const std::string& text) {
  std::vector<job::NodeRanks> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const std::size_t colon = item.rfind(':');
    job::NodeRanks entry;
    entry.name = item.substr(0, colon);
    int nproc = 0;
    try {
      std::size_t used = 0;
      const std::string count = colon == std::string::npos ? "" : item.substr(colon + 1);
      nproc = std::stoi(count, &used);
      if (used != count.size()) nproc = 0;
    } catch (const std::exception&) {
      nproc = 0;
    }
    if (colon == std::string::npos || entry.name.empty() || nproc < 1 || nproc > kMaxProcesses)
      throw UsageError{"--nodes " + text + ": \"" + item +
                       "\" is not NAME:NPROC (a paired node or local, and 1 to " +
                       std::to_string(kMaxProcesses) + " ranks)"};
    entry.nproc = nproc;
    out.push_back(std::move(entry));
    start = comma + 1;
  }
  return out;
}

// MASTER_ADDR: the spec's, or the address this machine's route to the remote nodes leaves from;
// refused when those differ (no one address is known to reach every node).
std::string choose_master_addr(const job::NodesSpec& spec,
                               const std::vector<const nodes::PairedNode*>& remotes) {
  if (!spec.master_addr.empty()) return spec.master_addr;
  if (remotes.empty()) return "127.0.0.1";
  std::vector<std::pair<std::string, std::string>> sources;  // node, address
  for (const nodes::PairedNode* node : remotes)
    sources.emplace_back(node->name, nodes::source_address_towards(node->address, node->port));
  const bool same = std::all_of(sources.begin(), sources.end(),
                                [&](const auto& s) { return s.second == sources.front().second; });
  if (same) return sources.front().second;
  std::string list;
  for (const auto& [node, address] : sources) {
    const std::string interface = nodes::interface_of(address);
    list += (list.empty() ? "" : ", ") + node + " from " + address +
            (interface.empty() ? "" : " (" + interface + ")");
  }
  throw_invalid(
      "nodes.master_addr is not set and this machine reaches the nodes from different "
      "addresses: " +
          list + "; which one every node reaches is not known",
      "set \"master_addr\" in the job spec's \"nodes\" to the address of this machine "
      "that all the nodes reach");
}

// Pre-flight: every node's checks for this job, printed as one table on stderr. Returns the
// failures as "NODE: CHECK: REASON".
std::vector<std::string> preflight(const nodes::ClientStore& store, const job::NodesSpec& spec,
                                   const json& job, bool link_test, std::uint64_t link_bytes) {
  struct Row {
    std::string node;
    nodes::CheckResult result;
  };
  std::vector<Row> rows;
  // A file in the output folder that each node must see: the folder is shared (checkpoints).
  const fs::path output_dir = job.at("output").at("dir").get<std::string>();
  const std::string marker = ".tessera-shared-" + nodes::to_hex(nodes::random_bytes(8));
  core::create_output_folder(output_dir, "output.dir in the job spec");
  core::write_file_atomic(output_dir / marker, "written by tessera-cli launch's pre-flight\n");
  struct RemoveMarker {
    fs::path path;
    ~RemoveMarker() {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
  } remove_marker{output_dir / marker};
  for (const job::NodeRanks& entry : spec.ranks_per_node) {
    if (entry.name == job::kLocalNode) {
      for (auto& r : nodes::job_file_checks(job, fs::current_path(), "this machine"))
        rows.push_back({entry.name, std::move(r)});
      continue;
    }
    const nodes::PairedNode* node = store.find(entry.name);
    if (node == nullptr) {
      nodes::CheckResult r;
      r.name = "paired";
      r.reason = "no paired node is called \"" + entry.name + "\" in " + store.path().string();
      r.hint = "pair it with tessera-cli nodes add ADDRESS (see tessera-cli nodes list)";
      rows.push_back({entry.name, r});
      continue;
    }
    try {
      const json answer = nodes::request_node(
          store, *node,
          {{"what", "check"},
           {"node_name", entry.name},
           {"requirements", nodes::to_json(nodes::requirements_for(this_build(), 0, 0, 0))},
           {"job", job},
           {"shared_output_marker", marker}},
          60s);
      for (const json& item : answer.value("checks", json::array()))
        rows.push_back({entry.name, nodes::check_result_from_json(item)});
      if (link_test) rows.push_back({entry.name, link_check(store, *node, link_bytes)});
    } catch (const Error& e) {
      nodes::CheckResult r;
      r.name = "agent";
      r.reason = e.what();
      r.hint = e.hint().empty() ? "start tessera-cli agent on " + entry.name + " (" +
                                      node->address + ":" + std::to_string(node->port) + ")"
                                : e.hint();
      rows.push_back({entry.name, r});
    }
  }
  std::vector<std::string> failures;
  std::fprintf(stderr, "pre-flight checks of %zu machines:\n", spec.ranks_per_node.size());
  std::fprintf(stderr, "  %-16s %-16s %-4s %s\n", "node", "check", "", "result");
  for (const Row& row : rows) {
    std::fprintf(stderr, "  %-16s %-16s %-4s %s\n", row.node.c_str(), row.result.name.c_str(),
                 row.result.ok ? "ok" : "FAIL",
                 row.result.ok ? row.result.detail.c_str() : row.result.reason.c_str());
    if (!row.result.ok) {
      std::fprintf(stderr, "  %-16s %-16s      what to do: %s\n", "", "", row.result.hint.c_str());
      failures.push_back(row.node + ": " + row.result.name + ": " + row.result.reason);
    }
  }
  std::fflush(stderr);
  return failures;
}

int run_launch(const std::vector<std::string>& raw) {
  Args args(raw, {"--no-link"},
            {"--nproc", "--nodes", "--events", "--resume", "--simulate-host-memory",
             "--grace-period", "--link-bytes"});
  if (args.positionals().size() != 1) throw UsageError{"expected exactly one JOB.json"};
  const std::string& path = args.positionals()[0];
  job::JobSpec spec = job::load_job_spec(path);
  if (const std::string* text = args.option("--nodes")) {
    if (args.option("--nproc")) throw UsageError{"give --nproc or --nodes, not both"};
    job::NodesSpec nodes = spec.nodes.value_or(job::NodesSpec{});
    nodes.ranks_per_node = parse_nodes_option(*text);
    // The same rules as the spec's field (this machine listed, names once).
    spec.nodes = job::parse_nodes_spec(job::to_json(nodes), "--nodes");
  }
  int nproc = 0;
  if (args.option("--nproc")) {
    if (spec.nodes)
      throw UsageError{
          "the job spec lists \"nodes\": give their ranks there (or --nodes), "
          "not --nproc"};
    nproc = static_cast<int>(args.integer("--nproc", 0, 1, kMaxProcesses));
  } else if (!spec.nodes) {
    throw UsageError{"give --nproc N, --nodes NAME:NPROC,... or \"nodes\" in the job spec"};
  }
  double grace = 10.0;
  if (const std::string* text = args.option("--grace-period")) {
    try {
      grace = std::stod(*text);
    } catch (const std::exception&) {
      grace = -1;
    }
    if (!(grace >= 0.0 && grace <= 3600.0))
      throw UsageError{"--grace-period " + *text + ": expected seconds from 0 to 3600"};
  }
  // `run`'s own arguments, for every local rank.
  std::vector<std::string> run_args = {path};
  for (const char* option : {"--events", "--resume", "--simulate-host-memory"})
    if (const std::string* value = args.option(option)) {
      run_args.push_back(option);
      run_args.push_back(*value);
    }
  if (nproc == 1) {  // the same as `run`
    const auto& commands = command_registry();
    const auto run = std::find_if(commands.begin(), commands.end(),
                                  [](const Command& c) { return c.name == "run"; });
    return run->run(run_args);
  }

  if (const std::string* resume = args.option("--resume")) spec.output.resume = *resume;
  // An earlier run's folder is refused before the nodes are checked or anything is written to
  // its stream (a refusal there had read as that run failing).
  refuse_new_run_over_earlier(
      spec, "tessera-cli launch " +
                (spec.nodes ? std::string() : "--nproc " + std::to_string(nproc) + " ") + path +
                " --resume " + spec.output.dir +
                (spec.nodes ? " on the same nodes (--nodes, or the spec's nodes)" : ""));
  const std::string* events_option = args.option("--events");
  const std::string events_target =
      events_option ? *events_option : (fs::path(spec.output.dir) / "events.jsonl").string();
  // Refused before any rank starts, into the stream too (the studio follows it).
  auto report = [&](const std::string& code, const std::string& message, const std::string& hint,
                    std::optional<int> rank, const std::string& node) {
    if (events_target != "-") fs::create_directories(fs::path(events_target).parent_path());
    job::EventSink events;
    events.open(events_target, /*append=*/true);
    json error = {{"code", code}, {"message", message}, {"hint", hint}};
    if (rank) {
      error["rank"] = *rank;
      error["host"] = node.empty() ? host_name_or("this machine") : node;
    }
    if (!node.empty()) error["node"] = node;
    events.emit("error", error);
    events.emit("done", {{"status", "failed"}});
  };

  // The machines: this one alone (--nproc), or this one and paired nodes.
  int local_nproc = nproc;
  int world_size = nproc;
  std::vector<std::pair<const nodes::PairedNode*, int>> remotes;  // node, its ranks
  std::optional<nodes::ClientStore> store;
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 0;
  try {
    if (spec.nodes) {
      store.emplace(nodes::ClientStore::default_path());
      world_size = 0;
      for (const job::NodeRanks& entry : spec.nodes->ranks_per_node) {
        world_size += entry.nproc;
        if (entry.name == job::kLocalNode) local_nproc = entry.nproc;
      }
      runner::check_processes(spec, world_size);
      const json job = job::to_json(spec);
      const auto failures =
          preflight(*store, *spec.nodes, job, !args.flag("--no-link"),
                    args.option("--link-bytes")
                        ? plan::parse_byte_size(*args.option("--link-bytes"), "--link-bytes")
                        : std::uint64_t{4} << 20);
      if (!failures.empty()) {
        std::string list;
        for (const auto& f : failures) list += "\n  " + f;
        throw Error(ErrorKind::Io,
                    "pre-flight checks failed (" + std::to_string(failures.size()) +
                        "); no rank was started:" + list,
                    "fix what the table above says for each node, or leave the node out "
                    "(nodes.ranks_per_node or --nodes); tessera-cli nodes check NAME re-runs "
                    "a node's checks");
      }
      for (const job::NodeRanks& entry : spec.nodes->ranks_per_node)
        if (entry.name != job::kLocalNode)
          remotes.emplace_back(store->find(entry.name), entry.nproc);
      std::vector<const nodes::PairedNode*> remote_nodes;
      for (const auto& [node, _] : remotes) remote_nodes.push_back(node);
      master_addr = choose_master_addr(*spec.nodes, remote_nodes);
      master_port = spec.nodes->master_port;
      if (!remotes.empty())
        std::fprintf(stderr, "launch: %d ranks on %zu machines; rendezvous (MASTER_ADDR) at %s\n",
                     world_size, remotes.size() + 1, master_addr.c_str());
    } else {
      runner::check_processes(spec, world_size);
    }
    if (master_port == 0) master_port = free_port(master_addr);
  } catch (const Error& e) {
    report(error_kind_name(e.kind()), e.what(), e.hint(), std::nullopt, "");
    throw;
  }

  run_args.insert(run_args.begin(), "run");
  Launcher launcher(local_nproc, world_size, master_addr, master_port, std::move(run_args), grace);
  std::vector<std::string> machine_of_rank(static_cast<std::size_t>(local_nproc), "this machine");
  if (!remotes.empty()) {
    const json job = job::to_json(spec);
    int next_rank = local_nproc;
    for (const auto& [node, count] : remotes) {
      std::vector<int> ranks;
      for (int i = 0; i < count; ++i) {
        machine_of_rank.push_back("node " + node->name + " (" + node->address + ")");
        ranks.push_back(next_rank++);
      }
      launcher.add_remote(*store, *node, std::move(ranks), job);
    }
  }
  // A resume appends to the stream: this run's events start at its present end. A new run's
  // rank 0 starts the stream over, so the whole of it is this run's.
  std::uintmax_t events_from = 0;
  if (events_target != "-" && spec.output.resume) {
    std::error_code ignored;
    events_from = fs::file_size(events_target, ignored);
    if (ignored) events_from = 0;
  }
  const int code = launcher.run();
  if (code != 0 && events_target != "-")
    name_rank_at_fault(events_target, events_from, machine_of_rank, launcher.failure());
  // Rank 0 writes its own error and `done` when it can. When it was killed (by a signal, or by
  // launch after the grace period, before it noticed another rank's failure) the stream would
  // end without either, so launch adds them.
  if (const auto& failure = launcher.failure();
      failure && (failure->rank0_killed ||
                  (events_target != "-" && !stream_has_done(events_target, events_from))))
    report("io", failure->where + " " + failure->how + "; the job stopped",
           "the rank's output above (prefixed [rank N]) says what it was doing; resume from the "
           "last checkpoint with --resume",
           failure->rank, failure->node);
  return code;
}

const RegisterCommand kLaunchCommand{{
    "launch",
    "launch (--nproc N | --nodes NAME:NPROC[,...]) JOB.json [--events FILE|-] [--resume DIR] "
    "[--simulate-host-memory SIZE] [--grace-period SECONDS] [--no-link] [--link-bytes SIZE]",
    "Run a job spec as several processes (a strategy that distributes, e.g. ddp): N on this "
    "machine, or on this machine and paired LAN nodes (\"nodes\" in the spec, docs/nodes.md) "
    "after their pre-flight checks; one event stream from rank 0, the other ranks' output on "
    "stderr as [rank N] or [NODE rank N]",
    run_launch,
}};

}  // namespace
}  // namespace tessera::cli
