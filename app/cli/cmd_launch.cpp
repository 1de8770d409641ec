// tessera-cli launch --nproc N JOB.json [run's options] [--grace-period SECONDS]: one job as N
// local processes. Each rank is a `tessera-cli run` child with torchrun's variables (WORLD_SIZE,
// RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port); rank 0's
// event stream is the job's (stdout or --events FILE, as `run` writes it), the other ranks'
// output reaches stderr with a `[rank N]` prefix. SIGINT/SIGTERM go to every rank (they agree on
// a step, checkpoint and stop). When one rank fails the others get SIGTERM, then SIGKILL after
// the grace period; launch exits with the first failure's code and says which rank died and how.
// The children live in a process group of their own and die with launch (PR_SET_PDEATHSIG).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "core/error.h"
#include "job/events.h"
#include "job/job_spec.h"
#include "runner/runner.h"

extern char** environ;

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kMaxProcesses = 256;

// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick), for rank 0's store.
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_io(std::string("launch: cannot open a socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    ::close(fd);
    throw_io(std::string("launch: cannot find a free TCP port on 127.0.0.1: ") +
             std::strerror(error));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

// "exited with code 1" / "was killed by signal 9 (Killed)".
std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

// A shell's convention: the exit code, or 128 + the signal.
int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int output = -1;      // ranks above 0: their stdout and stderr, read here; -1 when closed
  std::string pending;  // a line not yet ended
  std::optional<int> status;
};

class Launcher {
 public:
  Launcher(int nproc, std::vector<std::string> run_args, double grace_seconds)
      : nproc_(nproc), run_args_(std::move(run_args)), grace_(grace_seconds) {}

  // Starts the ranks and waits for them all; returns launch's exit code.
  int run();

  // The first rank that failed, once known: its rank and how it ended.
  struct Failure {
    int rank = 0;
    pid_t pid = 0;
    int status = 0;
  };
  const std::optional<Failure>& failure() const { return failure_; }
  // Whether rank 0 ended by a signal (then it wrote no `done` event).
  bool rank0_killed() const { return ranks_.front().status && WIFSIGNALED(*ranks_.front().status); }

 private:
  void start(std::uint16_t port, const sigset_t& old_mask);
  void on_signal(int sig);
  void reap();
  void read_output(Rank& rank);
  void flush_line(Rank& rank, const std::string& line);
  void signal_live(int sig);
  bool all_done() const;

  int nproc_;
  std::vector<std::string> run_args_;
  double grace_;
  std::vector<Rank> ranks_;
  pid_t group_ = 0;
  bool stop_requested_ = false;
  std::optional<Failure> failure_;
  std::optional<Clock::time_point> kill_at_;
  bool killed_ = false;
};

void Launcher::start(std::uint16_t port, const sigset_t& old_mask) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw_io("launch: cannot find this program's path (/proc/self/exe)");
  self[n] = '\0';
  // The children's arguments and environment, built before fork (the child only calls
  // async-signal-safe functions).
  std::vector<std::string> argv_strings = {self};
  argv_strings.insert(argv_strings.end(), run_args_.begin(), run_args_.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::vector<std::string> overridden = {
      "WORLD_SIZE=", "RANK=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="};
  std::vector<std::string> base_env;
  bool threads_set = false;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind("OMP_NUM_THREADS=", 0) == 0) threads_set = true;
    if (std::none_of(overridden.begin(), overridden.end(),
                     [&](const std::string& p) { return entry.rfind(p, 0) == 0; }))
      base_env.push_back(entry);
  }
  // As torchrun does: N ranks share the cores instead of each starting a thread per core.
  if (!threads_set) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    base_env.push_back("OMP_NUM_THREADS=" +
                       std::to_string(std::max(1u, cores / static_cast<unsigned>(nproc_))));
  }
  const pid_t launcher = ::getpid();
  for (int r = 0; r < nproc_; ++r) {
    std::vector<std::string> env_strings = base_env;
    env_strings.push_back("WORLD_SIZE=" + std::to_string(nproc_));
    env_strings.push_back("RANK=" + std::to_string(r));
    env_strings.push_back("LOCAL_RANK=" + std::to_string(r));
    env_strings.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc_));
    env_strings.push_back("MASTER_ADDR=127.0.0.1");
    env_strings.push_back("MASTER_PORT=" + std::to_string(port));
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    int pipe_fds[2] = {-1, -1};
    if (r > 0 && ::pipe2(pipe_fds, O_CLOEXEC) != 0)
      throw_io(std::string("launch: cannot make a pipe: ") + std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) throw_io(std::string("launch: cannot start a process: ") + std::strerror(errno));
    if (pid == 0) {
      // Dies with launch, whatever kills it; then joins the ranks' process group.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(127);
      ::setpgid(0, group_);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGINT, SIGTERM, SIGCHLD}) ::sigaction(sig, &dfl, nullptr);
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      if (r > 0) {
        ::dup2(pipe_fds[1], STDOUT_FILENO);
        ::dup2(pipe_fds[1], STDERR_FILENO);
      }
      ::execve(argv[0], argv.data(), envp.data());
      const char msg[] = "tessera-cli launch: cannot run this program again (execve failed)\n";
      [[maybe_unused]] auto w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
      ::_exit(127);
    }
    if (group_ == 0) group_ = pid;
    ::setpgid(pid, group_);  // also here: whichever runs first, the group is set before use
    Rank rank;
    rank.rank = r;
    rank.pid = pid;
    if (r > 0) {
      ::close(pipe_fds[1]);
      rank.output = pipe_fds[0];
    }
    ranks_.push_back(std::move(rank));
  }
}

void Launcher::signal_live(int sig) {
  for (const Rank& r : ranks_)
    if (!r.status) ::kill(r.pid, sig);
}

void Launcher::on_signal(int sig) {
  if (sig == SIGCHLD) return reap();
  // Ctrl-C or a stop request: every rank stops after the step they agree on, with a checkpoint
  // (a second one makes them quit at once, as `run` does).
  stop_requested_ = true;
  signal_live(sig);
}

void Launcher::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    auto it =
        std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.pid == pid; });
    if (it == ranks_.end()) continue;
    it->status = status;
    const bool stopped_as_asked =
        stop_requested_ && WIFEXITED(status) && WEXITSTATUS(status) == 130;
    const bool ok = (WIFEXITED(status) && WEXITSTATUS(status) == 0) || stopped_as_asked;
    if (ok || failure_) continue;
    failure_ = Failure{it->rank, pid, status};
    const bool others = std::any_of(ranks_.begin(), ranks_.end(),
                                    [](const Rank& r) { return !r.status.has_value(); });
    std::fprintf(stderr, "tessera-cli launch: rank %d (pid %d) %s%s\n", it->rank,
                 static_cast<int>(pid), describe_status(status).c_str(),
                 others ? "; stopping the other ranks" : "");
    std::fflush(stderr);
    if (others) {
      signal_live(SIGTERM);
      kill_at_ = Clock::now() +
                 std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_));
    }
  }
}

void Launcher::flush_line(Rank& rank, const std::string& line) {
  const std::string out = "[rank " + std::to_string(rank.rank) + "] " + line + "\n";
  [[maybe_unused]] auto w = ::write(STDERR_FILENO, out.data(), out.size());
}

void Launcher::read_output(Rank& rank) {
  char buffer[8192];
  const ssize_t n = ::read(rank.output, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    if (!rank.pending.empty()) flush_line(rank, rank.pending);
    rank.pending.clear();
    ::close(rank.output);
    rank.output = -1;
    return;
  }
  rank.pending.append(buffer, static_cast<std::size_t>(n));
  std::size_t start = 0;
  for (std::size_t end; (end = rank.pending.find('\n', start)) != std::string::npos;
       start = end + 1) {
    std::string line = rank.pending.substr(start, end - start);
    // A progress bar's carriage returns: the last redraw of the line.
    if (const auto cr = line.rfind('\r'); cr != std::string::npos) line = line.substr(cr + 1);
    flush_line(rank, line);
  }
  rank.pending.erase(0, start);
}

bool Launcher::all_done() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const Rank& r) { return r.status.has_value() && r.output < 0; });
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
    start(free_port(), old_mask);
  } catch (...) {
    signal_live(SIGKILL);
    ::close(signals);
    throw;
  }
  std::optional<Clock::time_point> exited_at;
  while (!all_done()) {
    std::vector<pollfd> fds = {{signals, POLLIN, 0}};
    std::vector<Rank*> readers;
    for (Rank& r : ranks_)
      if (r.output >= 0) {
        fds.push_back({r.output, POLLIN, 0});
        readers.push_back(&r);
      }
    int timeout_ms = 1000;
    if (kill_at_ && !killed_)
      timeout_ms = static_cast<int>(std::clamp<std::int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at_ - Clock::now()).count(),
          0, 1000));
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw_io(std::string("launch: poll: ") + std::strerror(errno));
    if (ready > 0 && (fds[0].revents & POLLIN)) {
      signalfd_siginfo info{};
      while (::read(signals, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
        on_signal(static_cast<int>(info.ssi_signo));
    }
    for (std::size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_output(*readers[i - 1]);
    if (kill_at_ && !killed_ && Clock::now() >= *kill_at_) {
      for (const Rank& r : ranks_)
        if (!r.status)
          std::fprintf(stderr,
                       "tessera-cli launch: rank %d (pid %d) did not stop within %.0f s: killed\n",
                       r.rank, static_cast<int>(r.pid), grace_);
      signal_live(SIGKILL);
      killed_ = true;
    }
    // Every rank is gone but a descendant still holds an output pipe: stop reading after 2 s.
    const bool all_exited = std::all_of(ranks_.begin(), ranks_.end(),
                                        [](const Rank& r) { return r.status.has_value(); });
    if (all_exited && !exited_at) exited_at = Clock::now();
    if (exited_at && Clock::now() - *exited_at > std::chrono::seconds(2))
      for (Rank& r : ranks_)
        if (r.output >= 0) {
          ::close(r.output);
          r.output = -1;
        }
  }
  // No rank is left, but a descendant might be: the group goes too.
  if (group_ > 0) ::killpg(group_, SIGKILL);
  ::close(signals);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (failure_) return exit_code_of(failure_->status);
  for (const Rank& r : ranks_)
    if (exit_code_of(*r.status) != 0) return exit_code_of(*r.status);
  return 0;
}

int run_launch(const std::vector<std::string>& raw) {
  Args args(raw, {},
            {"--nproc", "--events", "--resume", "--simulate-host-memory", "--grace-period"});
  if (args.positionals().size() != 1) throw UsageError{"expected exactly one JOB.json"};
  const std::string& nproc_text = args.required("--nproc", "N");
  int nproc = 0;
  try {
    std::size_t used = 0;
    nproc = std::stoi(nproc_text, &used);
    if (used != nproc_text.size()) nproc = 0;
  } catch (const std::exception&) {
    nproc = 0;
  }
  if (nproc < 1 || nproc > kMaxProcesses)
    throw UsageError{"--nproc " + nproc_text + ": expected a number of processes from 1 to " +
                     std::to_string(kMaxProcesses)};
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
  const std::string& path = args.positionals()[0];
  // `run`'s own arguments, for every rank.
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

  job::JobSpec spec = job::load_job_spec(path);
  if (const std::string* resume = args.option("--resume")) spec.output.resume = *resume;
  const std::string* events_option = args.option("--events");
  const std::string events_target =
      events_option ? *events_option : (fs::path(spec.output.dir) / "events.jsonl").string();
  // Refused before any rank starts, into the stream too (the studio follows it).
  auto report = [&](const std::string& code, const std::string& message, const std::string& hint,
                    std::optional<int> rank) {
    if (events_target != "-") fs::create_directories(fs::path(events_target).parent_path());
    job::EventSink events;
    events.open(events_target, /*append=*/true);
    nlohmann::json error = {{"code", code}, {"message", message}, {"hint", hint}};
    if (rank) {
      char host[256] = {};
      error["rank"] = *rank;
      error["host"] = ::gethostname(host, sizeof host - 1) == 0 ? host : "this machine";
    }
    events.emit("error", error);
    events.emit("done", {{"status", "failed"}});
  };
  try {
    runner::check_processes(spec, nproc);
  } catch (const Error& e) {
    report(error_kind_name(e.kind()), e.what(), e.hint(), std::nullopt);
    throw;
  }

  run_args.insert(run_args.begin(), "run");
  Launcher launcher(nproc, std::move(run_args), grace);
  const int code = launcher.run();
  // Rank 0 writes its own error and `done` when it can; when it was killed the stream would
  // end without either, so launch adds them.
  if (const auto& failure = launcher.failure(); failure && launcher.rank0_killed())
    report("io",
           "rank " + std::to_string(failure->rank) + " (pid " + std::to_string(failure->pid) +
               ") " + describe_status(failure->status) + "; the job stopped",
           "the rank's output above (prefixed [rank N]) says what it was doing; resume from the "
           "last checkpoint with --resume",
           failure->rank);
  return code;
}

const RegisterCommand kRegister{{
    "launch",
    "launch --nproc N JOB.json [--events FILE|-] [--resume DIR] [--simulate-host-memory SIZE] "
    "[--grace-period SECONDS]",
    "Run a job spec as N local processes (a strategy that distributes, e.g. ddp); one event "
    "stream from rank 0, the other ranks' output on stderr as [rank N]",
    run_launch,
}};

}  // namespace
}  // namespace tessera::cli
