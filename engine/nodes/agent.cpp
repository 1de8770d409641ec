#include "nodes/agent.h"

#include <poll.h>
#include <unistd.h>

#include <list>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/exit_codes.h"
#include "core/files.h"
#include "nodes/job_checks.h"
#include "nodes/protocol.h"
#include "nodes/rank_processes.h"
#include "nodes/store.h"
#include "nodes/wire.h"

namespace tessera::nodes {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr Milliseconds kConfirmTimeout = 120s;  // a person reads two screens and answers
constexpr int kMaxRanksPerSpawn = 256;

bool is_hex(const json& value, std::size_t bytes) {
  if (!value.is_string()) return false;
  const std::string& text = value.get_ref<const std::string&>();
  if (text.size() != 2 * bytes) return false;
  return text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// Lines typed on the agent's terminal (or piped into its stdin), read without blocking the
// socket it also watches.
class StdinLines {
 public:
  // A complete line when one is there; sets `closed` at end of input.
  std::optional<std::string> take() {
    const std::size_t end = buffer_.find('\n');
    if (end == std::string::npos) return std::nullopt;
    std::string line = buffer_.substr(0, end);
    buffer_.erase(0, end + 1);
    return line;
  }
  void read_available() {
    char chunk[256];
    const ssize_t got = ::read(STDIN_FILENO, chunk, sizeof chunk);
    if (got <= 0) {
      if (got == 0 || (errno != EINTR && errno != EAGAIN)) closed_ = true;
      return;
    }
    buffer_.append(chunk, static_cast<std::size_t>(got));
  }
  bool closed() const { return closed_; }
  void discard() { buffer_.clear(); }

 private:
  std::string buffer_;
  bool closed_ = false;
};

}  // namespace

struct Agent::State {
  AgentOptions options;
  AgentStore store;
  Socket listener;
  ReplayGuard replay;
  std::mutex pairing;                       // one pairing at a time: one terminal to ask on
  std::atomic<bool> link_test_busy{false};  // one link test at a time
  std::mutex print_mutex;
  std::mutex link_threads_mutex;
  std::vector<std::thread> link_threads;  // joined when serve() ends
  StdinLines stdin_lines;
  const std::atomic<bool>* stop = nullptr;

  State(AgentOptions o) : options(std::move(o)), store(options.state_dir, options.name) {}

  void print(const std::string& line) {
    std::lock_guard lock(print_mutex);
    if (options.print) options.print(line);
  }

  json announcement() const {
    return {{"tessera_node", kProtocolVersion},
            {"name", store.name()},
            {"node_id", store.node_id()},
            {"address", options.bind_address},
            {"port", listener.local_port()},
            {"version", options.build.tessera},
            {"pairing", "open"},
            {"paired_clients", store.client_count()}};
  }

  void handle(Socket socket);
  void handle_pairing(Socket& socket, const json& start, const std::string& peer);
  void handle_request(Socket& socket, const json& envelope, const std::string& peer);
  json answer(const PairedClient& client, const json& body, const std::string& peer);
  std::vector<CheckResult> job_checks(const json& body);
  void handle_spawn(Socket& socket, const PairedClient& client, const json& body,
                    const std::string& nonce);
};

Agent::Agent(AgentOptions options) : state_(std::make_shared<State>(std::move(options))) {
  state_->listener = tcp_listen(state_->options.bind_address, state_->options.port);
}

Agent::~Agent() = default;

std::uint16_t Agent::port() const {
  return state_->listener.local_port();
}
const std::string& Agent::node_id() const {
  return state_->store.node_id();
}
const std::string& Agent::name() const {
  return state_->store.name();
}

void Agent::serve(const std::atomic<bool>& stop) {
  State& s = *state_;
  s.stop = &stop;
  const AgentOptions& o = s.options;

  // Announcements: the bound interface's broadcast address, and any --announce-to.
  std::vector<std::string> targets = o.announce_to;
  if (o.broadcast) {
    if (const std::string broadcast = broadcast_address_of(o.bind_address); !broadcast.empty())
      targets.push_back(broadcast);
    else
      s.print("note: " + o.bind_address +
              " has no broadcast address (loopback?): not "
              "announcing on the network; clients add this node by address");
  }
  std::thread announcer([&s, &stop, targets] {
    Socket sender = udp_sender(s.options.bind_address);
    auto next = std::chrono::steady_clock::now();
    while (!stop.load()) {
      if (std::chrono::steady_clock::now() >= next) {
        const std::string payload = s.announcement().dump();
        for (const auto& target : targets) {
          try {
            udp_send(sender, target, s.options.discovery_port, payload);
          } catch (const Error& e) {
            s.print(std::string("announcement failed: ") + e.what());
          }
        }
        next += s.options.announce_interval;
      }
      std::this_thread::sleep_for(100ms);
    }
  });

  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Worker> workers;
  while (!stop.load()) {
    std::optional<Socket> connection = tcp_accept(s.listener, 250ms);
    for (auto it = workers.begin(); it != workers.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
    if (!connection) continue;
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers.push_back({std::thread([&s, done, socket = std::move(*connection)]() mutable {
                         s.handle(std::move(socket));
                         done->store(true);
                       }),
                       done});
  }
  for (auto& worker : workers) worker.thread.join();
  announcer.join();
  std::lock_guard lock(s.link_threads_mutex);
  for (auto& thread : s.link_threads) thread.join();
}

void Agent::State::handle(Socket socket) {
  const std::string peer = socket.peer_address();
  try {
    const json message = receive_message(socket, kMessageTimeout);
    const std::string type = message.value("type", std::string());
    if (type == "pair_start") {
      handle_pairing(socket, message, peer);
    } else if (type == "request") {
      handle_request(socket, message, peer);
    } else {
      send_message(socket,
                   error_message("malformed", "unknown message type \"" + type + "\"",
                                 "use tessera-cli of the same version as the agent"),
                   kMessageTimeout);
    }
  } catch (const std::exception& e) {
    print("connection from " + peer + ": " + e.what());
  }
}

void Agent::State::handle_pairing(Socket& socket, const json& start, const std::string& peer) {
  std::unique_lock lock(pairing, std::try_to_lock);
  if (!lock.owns_lock()) {
    send_message(socket,
                 error_message("busy", "another pairing is in progress on this agent",
                               "finish that one (or wait two minutes) and try again"),
                 kMessageTimeout);
    return;
  }
  if (!is_hex(start.value("client_id", json()), 16) ||
      !is_hex(start.value("client_public_key", json()), 32) || !start.contains("client_name") ||
      !start["client_name"].is_string()) {
    send_message(socket,
                 error_message("malformed",
                               "pair_start needs client_id (32 hex digits), "
                               "client_name and client_public_key (64 hex digits)",
                               "use tessera-cli of the same version as the agent"),
                 kMessageTimeout);
    return;
  }
  const std::string client_id = start["client_id"];
  const std::string client_name = start["client_name"];
  PairingTranscript transcript;
  transcript.client_id = client_id;
  transcript.node_id = store.node_id();
  transcript.client_public = from_hex(start["client_public_key"].get<std::string>(), "key");
  X25519Key key;
  transcript.agent_public = key.public_key();
  transcript.agent_nonce = random_bytes(16);
  send_message(
      socket,
      {{"node_id", store.node_id()},
       {"name", store.name()},
       {"version", options.build.tessera},
       {"agent_public_key", to_hex(transcript.agent_public)},
       {"commitment", to_hex(pairing_commitment(transcript.agent_public, transcript.client_public,
                                                transcript.agent_nonce))}},
      kMessageTimeout);
  const json nonce_message = receive_message(socket, kMessageTimeout);
  if (nonce_message.value("type", std::string()) != "pair_nonce" ||
      !is_hex(nonce_message.value("client_nonce", json()), 16)) {
    send_message(socket, error_message("malformed", "expected pair_nonce with client_nonce", ""),
                 kMessageTimeout);
    return;
  }
  transcript.client_nonce = from_hex(nonce_message["client_nonce"].get<std::string>(), "nonce");
  send_message(socket, {{"agent_nonce", to_hex(transcript.agent_nonce)}}, kMessageTimeout);

  const Bytes hash = transcript_hash(transcript);
  const std::string code = pairing_code(hash);
  const Bytes secret = pairing_secret(key.shared_secret(transcript.client_public), hash);

  print("pairing request from \"" + client_name + "\" at " + peer + ": pairing code " + code);
  std::optional<bool> local_ok;
  std::string local_reason;
  if (options.accept_code) {
    local_ok = *options.accept_code == code;
    if (!*local_ok)
      local_reason = "the code given by --accept-code (" + *options.accept_code +
                     ") is not this pairing's code (" + code + ")";
    print(*local_ok ? "code " + code + " matches --accept-code" : local_reason);
  } else {
    stdin_lines.discard();
    if (stdin_lines.closed()) {
      local_ok = false;
      local_reason = "no one can confirm the code on the agent: its standard input is closed";
    } else {
      print("Does the client show the code " + code +
            "? Type the code (or yes) to accept, anything else to refuse:");
    }
  }

  // Wait for this side's answer and the client's, whichever comes first: a client that already
  // refused ends the question here.
  std::optional<json> client_answer;
  const auto deadline = std::chrono::steady_clock::now() + kConfirmTimeout;
  while (!client_answer || !local_ok) {
    if (stop->load()) return;
    if (std::chrono::steady_clock::now() > deadline) {
      print("pairing with \"" + client_name + "\" timed out: no answer within two minutes");
      return;
    }
    pollfd fds[2] = {{socket.fd(), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
    const nfds_t count = (!local_ok && !stdin_lines.closed()) ? 2 : 1;
    if (::poll(fds, count, 250) <= 0) continue;
    if (!client_answer && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      client_answer = receive_message(socket, kMessageTimeout);
      if (!client_answer->value("confirmed", false)) {
        print("pairing with \"" + client_name +
              "\" refused by the client (the codes differ "
              "there, or its user said no); nothing was stored");
        send_message(socket, {{"ok", false}}, kMessageTimeout);
        return;
      }
    }
    if (count == 2 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      stdin_lines.read_available();
      if (auto line = stdin_lines.take()) {
        const auto typed = normalise_code(*line);
        const bool yes = *line == "y" || *line == "yes" || *line == "Y" || *line == "YES";
        local_ok = yes || (typed && *typed == code);
        if (!*local_ok)
          local_reason = typed ? "the code typed on the agent (" + *typed +
                                     ") is not this pairing's code (" + code + ")"
                               : "the agent's user refused the code";
      } else if (stdin_lines.closed()) {
        local_ok = false;
        local_reason = "no one can confirm the code on the agent: its standard input closed";
      }
    }
  }
  if (!*local_ok) {
    print("pairing with \"" + client_name + "\" refused: " + local_reason);
    send_message(socket,
                 error_message("code_refused", "the agent refused the pairing: " + local_reason,
                               "compare the codes shown on both machines and pair again; codes "
                               "that differ mean someone is between you and the node"),
                 kMessageTimeout);
    return;
  }
  Bytes proof;
  try {
    proof = from_hex(client_answer->value("proof", std::string()), "the client's proof");
  } catch (const Error&) {
  }
  if (!equal_constant_time(proof, confirmation_proof(secret, hash, "client"))) {
    print("pairing with \"" + client_name + "\" refused: its key confirmation does not verify");
    send_message(socket,
                 error_message("bad_proof",
                               "the client's key confirmation does not verify: the "
                               "two sides derived different secrets",
                               "pair again"),
                 kMessageTimeout);
    return;
  }
  store.put_client({client_id, client_name, peer, secret, utc_now_iso()});
  send_message(socket, {{"ok", true}, {"proof", to_hex(confirmation_proof(secret, hash, "agent"))}},
               kMessageTimeout);
  print("paired with \"" + client_name + "\" (" + peer + "); secret kept in " +
        (store.dir() / "clients.json").string());
}

void Agent::State::handle_request(Socket& socket, const json& envelope, const std::string& peer) {
  auto refuse = [&](const std::string& code, const std::string& message, const std::string& hint) {
    print("refused a request from " + peer + ": " + message);
    send_message(socket, error_message(code, message, hint), kMessageTimeout);
  };
  const std::string client_id = envelope.value("client_id", std::string());
  const auto client = store.client(client_id);
  if (!client) {
    refuse("unpaired", "this client is not paired with this agent",
           "pair first: tessera-cli nodes add " + options.bind_address + ":" +
               std::to_string(listener.local_port()));
    return;
  }
  if (!envelope.contains("nonce") || !envelope["nonce"].is_string() ||
      !envelope.contains("timestamp") || !envelope["timestamp"].is_number_integer() ||
      !envelope.contains("body") || !envelope["body"].is_string() || !envelope.contains("hmac") ||
      !envelope["hmac"].is_string()) {
    refuse("malformed", "the request lacks nonce, timestamp, body or hmac",
           "use tessera-cli of the same version as the agent");
    return;
  }
  const std::string nonce = envelope["nonce"];
  const std::int64_t timestamp = envelope["timestamp"];
  const std::string body_text = envelope["body"];
  Bytes mac;
  try {
    mac = from_hex(envelope["hmac"].get<std::string>(), "hmac");
  } catch (const Error&) {
  }
  const Bytes expected = hmac_sha256(
      client->secret, as_bytes(request_mac_input(client_id, nonce, timestamp, body_text)));
  if (!equal_constant_time(mac, expected)) {
    refuse("bad_hmac",
           "the request's HMAC does not verify: it was altered on the way, or signed "
           "with another secret than the one paired",
           "pair again with `tessera-cli nodes add` if this client was paired before the agent's "
           "state folder was reset");
    return;
  }
  const std::int64_t now = unix_seconds();
  // Compared, not subtracted: a timestamp near the int64 limits would overflow the difference.
  const std::int64_t limit = kMaxClockSkew.count();
  const bool too_old = timestamp < now - limit;
  if (too_old || timestamp > now + limit) {
    // The distance in unsigned arithmetic, exact for any two int64 values.
    const std::uint64_t distance =
        too_old ? static_cast<std::uint64_t>(now) - static_cast<std::uint64_t>(timestamp)
                : static_cast<std::uint64_t>(timestamp) - static_cast<std::uint64_t>(now);
    refuse("stale_timestamp",
           "the request's timestamp is " + std::to_string(distance) + " s " +
               (too_old ? "old" : "in the future") + ", more than the " +
               std::to_string(kMaxClockSkew.count()) + " s allowed (a replay, or clocks apart)",
           "synchronise the clocks of both machines (NTP) and retry");
    return;
  }
  if (nonce.size() < 16 || !replay.first_use(client_id, nonce, now)) {
    refuse("replayed_nonce",
           nonce.size() < 16 ? "the request's nonce is too short (16 characters at least)"
                             : "the request's nonce was already used: a replayed request",
           "every request needs a fresh random nonce; tessera-cli makes one each time");
    return;
  }
  json body = json::parse(body_text, nullptr, false);
  if (body.is_object() && body.value("what", std::string()) == "spawn") {
    try {
      handle_spawn(socket, *client, body, nonce);
    } catch (const Error& e) {
      send_message(
          socket, sign_response(client->secret, nonce, error_message("failed", e.what(), e.hint())),
          kMessageTimeout);
    }
    return;
  }
  json reply;
  if (body.is_discarded() || !body.is_object()) {
    reply = error_message("malformed", "the request's body is not a JSON object", "");
  } else {
    try {
      reply = answer(*client, body, peer);
    } catch (const Error& e) {
      reply = error_message("failed", e.what(), e.hint());
    } catch (const std::exception& e) {
      reply = error_message("failed", e.what(), "");
    }
  }
  send_message(socket, sign_response(client->secret, nonce, reply), kMessageTimeout);
}

// The node's checks against the client's requirements, and the job's (its files here) when the
// request carries a job spec.
std::vector<CheckResult> Agent::State::job_checks(const json& body) {
  const Requirements needs = requirements_from_json(body.value("requirements", json::object()));
  // The advice names the node as the asking client paired it (two agents may share a name;
  // the client then keeps the second as NAME-2).
  const json asked_as = body.value("node_name", json());
  const std::string name = asked_as.is_string() && !asked_as.get<std::string>().empty()
                               ? asked_as.get<std::string>()
                               : store.name();
  const NodeFacts facts = collect_node_facts(name, options.build, store.dir());
  std::vector<CheckResult> results = evaluate_checks(facts, needs);
  if (const auto job = body.find("job"); job != body.end()) {
    const std::filesystem::path work_dir =
        options.work_dir.empty() ? std::filesystem::current_path() : options.work_dir;
    for (auto& r :
         job_file_checks(*job, work_dir, name, body.value("shared_output_marker", std::string())))
      results.push_back(std::move(r));
  }
  return results;
}

void Agent::State::handle_spawn(Socket& socket, const PairedClient& client, const json& body,
                                const std::string& nonce) {
  std::uint64_t sent = 0, received = 0;
  auto send = [&](const json& message) {
    send_message(socket,
                 sign_response(client.secret, stream_nonce(nonce, "agent", ++sent), message),
                 kMessageTimeout);
  };
  auto reply = [&](const json& message) {
    send_message(socket, sign_response(client.secret, nonce, message), kMessageTimeout);
  };
  // The request: the job, this node's ranks and the torchrun variables the client computed.
  const auto malformed = [&](const std::string& what) {
    reply(error_message("malformed", "spawn: " + what,
                        "use tessera-cli of the same version as the agent"));
  };
  if (!body.contains("job") || !body["job"].is_object()) return malformed("no job spec (\"job\")");
  const json& ranks_json = body.value("ranks", json());
  const int world_size = body.value("world_size", 0);
  const std::string master_addr = body.value("master_addr", std::string());
  const int master_port = body.value("master_port", 0);
  const double grace_s = body.value("grace_period_s", options.stop_grace.count());
  if (!ranks_json.is_array() || ranks_json.empty() ||
      ranks_json.size() > static_cast<std::size_t>(kMaxRanksPerSpawn))
    return malformed("\"ranks\" must list 1 to " + std::to_string(kMaxRanksPerSpawn) +
                     " global ranks");
  if (world_size < static_cast<int>(ranks_json.size()) || master_addr.empty() || master_port < 1 ||
      master_port > 65535 || !(grace_s >= 0 && grace_s <= 3600))
    return malformed(
        "world_size, master_addr, master_port (1..65535) or grace_period_s (0..3600 s) invalid");
  std::vector<int> ranks;
  for (const json& r : ranks_json) {
    if (!r.is_number_integer() || r.get<int>() < 1 || r.get<int>() >= world_size)
      return malformed("a rank is not an integer in 1..world_size-1 (rank 0 runs on the client)");
    ranks.push_back(r.get<int>());
  }
  std::vector<std::string> forwarded;
  const json environment = body.value("environment", json::object());
  if (environment.is_object())
    for (const char* name : kSpawnForwardedVariables)
      if (const auto v = environment.find(name); v != environment.end() && v->is_string())
        forwarded.push_back(std::string(name) + "=" + v->get<std::string>());

  // Pre-flight, for this job: refused with every failure's reason.
  json checks = json::array();
  bool all_ok = true;
  for (const auto& result : job_checks(body)) {
    all_ok = all_ok && result.ok;
    checks.push_back(to_json(result));
  }
  if (!all_ok) {
    print("spawn from \"" + client.name + "\" refused: the pre-flight checks failed");
    reply({{"started", false}, {"checks", checks}});
    return;
  }
  if (options.rank_program.empty()) {
    reply(error_message(
        "unavailable", "this agent's tessera-cli is built without LibTorch, so it cannot run ranks",
        "install the LibTorch build of Tessera"));
    return;
  }
  // The spec, in a folder of the agent's; the ranks run `tessera-cli run` on it.
  const std::filesystem::path job_dir = store.dir() / "jobs" / nonce.substr(0, 16);
  std::filesystem::create_directories(job_dir);
  const std::filesystem::path job_path = job_dir / "job.json";
  core::write_file_atomic(job_path, body["job"].dump(2) + "\n");
  std::vector<std::string> base_env = environment_without(
      {"WORLD_SIZE=", "RANK=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
       "TESSERA_DIST_TIMEOUT_S=", "TESSERA_DIST_RENDEZVOUS_TIMEOUT_S="});
  const bool threads_set = std::any_of(base_env.begin(), base_env.end(), [](const std::string& e) {
    return e.rfind("OMP_NUM_THREADS=", 0) == 0;
  });
  if (!threads_set) {  // as torchrun does: this node's ranks share its cores
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    base_env.push_back("OMP_NUM_THREADS=" +
                       std::to_string(std::max(1u, cores / static_cast<unsigned>(ranks.size()))));
  }
  base_env.insert(base_env.end(), forwarded.begin(), forwarded.end());
  std::vector<RankCommand> commands;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    RankCommand command;
    command.rank = ranks[i];
    command.argv = {options.rank_program, "run", job_path.string()};
    command.env = base_env;
    command.env.push_back("WORLD_SIZE=" + std::to_string(world_size));
    command.env.push_back("RANK=" + std::to_string(ranks[i]));
    command.env.push_back("LOCAL_RANK=" + std::to_string(i));
    command.env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(ranks.size()));
    command.env.push_back("MASTER_ADDR=" + master_addr);
    command.env.push_back("MASTER_PORT=" + std::to_string(master_port));
    command.work_dir = options.work_dir;
    commands.push_back(std::move(command));
  }

  bool connected = true;
  const auto send_or_lose = [&](const json& message) {
    if (!connected) return;
    try {
      send(message);
    } catch (const std::exception&) {
      connected = false;
    }
  };
  bool stop_asked = false;  // by the client: 130 or 143 is then a rank that stopped as asked
  const std::chrono::duration<double> grace(grace_s);
  RankProcesses* processes_ptr = nullptr;
  RankProcesses processes({
      [&](int rank, const std::string& line) {
        send_or_lose({{"type", "output"}, {"rank", rank}, {"line", line}});
      },
      [&](int rank, pid_t pid, int status) {
        const int code = exit_code_of(status);
        const bool ok = code == 0 || (stop_asked && core::is_requested_stop(code));
        print("job of \"" + client.name + "\": rank " + std::to_string(rank) + " (pid " +
              std::to_string(pid) + ") " + describe_exit_status(status));
        send_or_lose({{"type", "exit"},
                      {"rank", rank},
                      {"pid", pid},
                      {"code", code},
                      {"ok", ok},
                      {"status", describe_exit_status(status)}});
        if (!ok && !processes_ptr->stopping() && !processes_ptr->all_exited()) {
          send_or_lose(
              {{"type", "stopping"},
               {"reason", "rank " + std::to_string(rank) + " " + describe_exit_status(status)}});
          processes_ptr->stop(grace);
        }
      },
  });
  processes_ptr = &processes;
  processes.start(commands, nullptr);
  json pids = json::array();
  for (int r : ranks) pids.push_back(processes.pid_of(r));
  print("job of \"" + client.name + "\": started ranks " + json(ranks).dump() + " of " +
        std::to_string(world_size) + " (pids " + pids.dump() + "), rendezvous at " + master_addr +
        ":" + std::to_string(master_port));
  try {
    reply({{"started", true}, {"pids", pids}, {"job_path", job_path.string()}});
  } catch (const std::exception&) {
    connected = false;
  }

  while (!processes.all_done()) {
    if (!connected && !processes.stopping()) {
      print("job of \"" + client.name + "\": the client's connection dropped; stopping its ranks");
      processes.stop(grace);
    }
    if (stop->load() && !processes.stopping()) {
      print("the agent is stopping: stopping the ranks of \"" + client.name + "\"");
      send_or_lose(
          {{"type", "stopping"}, {"reason", "the agent on " + store.name() + " is stopping"}});
      processes.stop(grace);
    }
    std::vector<pollfd> fds;
    if (connected) fds.push_back({socket.fd(), POLLIN, 0});
    const std::vector<int> outputs = processes.output_fds();
    for (int fd : outputs) fds.push_back({fd, POLLIN, 0});
    int timeout_ms = 100;  // the ranks' exits are found by polling waitpid
    if (const auto left = processes.time_to_next_tick())
      timeout_ms = std::min<int>(timeout_ms, static_cast<int>(left->count()));
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready > 0) {
      std::size_t i = 0;
      if (connected) {
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
          try {
            const json message = receive_message(socket, kMessageTimeout);
            const json order =
                open_response(client.secret, stream_nonce(nonce, "client", ++received), message,
                              "the client \"" + client.name + "\"");
            const std::string what = order.value("signal", std::string());
            if (what == "SIGINT" || what == "SIGTERM") {
              stop_asked = true;
              processes.signal_live(what == "SIGINT" ? SIGINT : SIGTERM);
            } else if (what == "stop") {
              stop_asked = true;
              if (!processes.stopping()) processes.stop(grace);
            }
          } catch (const std::exception&) {
            connected = false;  // closed, or a message that does not verify: end the job
          }
        }
        i = 1;
      }
      for (; i < fds.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) processes.read_output(fds[i].fd);
    }
    processes.reap();
    for (int rank : processes.tick()) {
      print("job of \"" + client.name + "\": rank " + std::to_string(rank) +
            " did not stop within " + std::to_string(static_cast<int>(grace_s)) + " s: killed");
      send_or_lose({{"type", "killed"}, {"rank", rank}, {"grace_period_s", grace_s}});
    }
  }
  processes.kill_group();
  send_or_lose({{"type", "finished"}});
  std::error_code ignored;
  std::filesystem::remove_all(job_dir, ignored);
}

json Agent::State::answer(const PairedClient& client, const json& body, const std::string& peer) {
  const std::string what = body.value("what", std::string());
  if (what == "ping")
    return {
        {"name", store.name()}, {"node_id", store.node_id()}, {"version", options.build.tessera}};
  if (what == "check") {
    const NodeFacts facts = collect_node_facts(store.name(), options.build, store.dir());
    json checks = json::array();
    bool all_ok = true;
    for (const auto& result : job_checks(body)) {
      all_ok = all_ok && result.ok;
      checks.push_back(to_json(result));
    }
    print("pre-flight checks for \"" + client.name + "\": " + (all_ok ? "all passed" : "FAILED"));
    return {{"facts", to_json(facts)}, {"checks", checks}};
  }
  if (what == "link_test") {
    if (!options.link_test_rank0)
      return error_message("unavailable",
                           "this agent's tessera-cli is built without LibTorch, "
                           "so it cannot run c10d",
                           "install the LibTorch build of Tessera");
    const std::uint64_t bytes = body.value("bytes", std::uint64_t{64} << 20);
    if (bytes < 4 || bytes > (std::uint64_t{1} << 30))
      return error_message("malformed", "link_test bytes must be 4 B .. 1 GiB", "");
    bool idle = false;
    if (!link_test_busy.compare_exchange_strong(idle, true))
      return error_message("busy", "another link test runs on this agent", "retry in a minute");
    // A free port on the bound address for the test's rendezvous store.
    std::uint16_t port = 0;
    try {
      Socket probe = tcp_listen(options.bind_address, 0);
      port = probe.local_port();
    } catch (...) {
      link_test_busy = false;
      throw;
    }
    std::lock_guard threads_lock(link_threads_mutex);
    link_threads.emplace_back([this, port, bytes, peer] {
      try {
        options.link_test_rank0(options.bind_address, port, bytes);
        print("c10d link test with " + peer + " done");
      } catch (const std::exception& e) {
        print(std::string("c10d link test with ") + peer + " failed: " + e.what());
      }
      link_test_busy = false;
    });
    return {{"master_addr", options.bind_address}, {"master_port", port}, {"bytes", bytes}};
  }
  return error_message("malformed", "unknown request \"" + what + "\"",
                       "use tessera-cli of the same version as the agent");
}

}  // namespace tessera::nodes
