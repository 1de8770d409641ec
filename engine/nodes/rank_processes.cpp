#include "nodes/rank_processes.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

extern char** environ;

namespace tessera::nodes {

using Clock = std::chrono::steady_clock;

std::vector<std::string> environment_without(const std::vector<std::string>& prefixes) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (std::none_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& p) { return entry.rfind(p, 0) == 0; }))
      out.push_back(entry);
  }
  return out;
}

std::string describe_exit_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string this_program_path() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw_io("cannot find this program's path (/proc/self/exe)");
  self[n] = '\0';
  return self;
}

RankProcesses::~RankProcesses() {
  kill_group();
  for (Child& c : children_) {
    if (!c.status) {
      int status = 0;
      if (::waitpid(c.pid, &status, 0) == c.pid) c.status = status;
    }
    if (c.output >= 0) ::close(c.output);
  }
}

void RankProcesses::start(const std::vector<RankCommand>& commands, const sigset_t* child_mask) {
  sigset_t empty;
  sigemptyset(&empty);
  const sigset_t& mask = child_mask ? *child_mask : empty;
  const pid_t parent = ::getpid();
  try {
    for (const RankCommand& command : commands) {
      // Built before fork: the child only calls async-signal-safe functions.
      std::vector<std::string> argv_strings = command.argv;
      std::vector<std::string> env_strings = command.env;
      const std::string work_dir = command.work_dir.string();
      std::vector<char*> argv, envp;
      for (auto& a : argv_strings) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : env_strings) envp.push_back(e.data());
      envp.push_back(nullptr);

      int pipe_fds[2] = {-1, -1};
      if (command.capture_output && ::pipe2(pipe_fds, O_CLOEXEC) != 0)
        throw_io(std::string("cannot make a pipe for rank ") + std::to_string(command.rank) + ": " +
                 std::strerror(errno));
      const pid_t group = group_;
      const pid_t pid = ::fork();
      if (pid < 0) {
        const int error = errno;
        if (pipe_fds[0] >= 0) {
          ::close(pipe_fds[0]);
          ::close(pipe_fds[1]);
        }
        throw_io(std::string("cannot start rank ") + std::to_string(command.rank) + ": " +
                 std::strerror(error));
      }
      if (pid == 0) {
        // Dies with its parent (thread), whatever kills it; then joins the ranks' group.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);
        ::setpgid(0, group);
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP}) ::sigaction(sig, &dfl, nullptr);
        ::sigprocmask(SIG_SETMASK, &mask, nullptr);
        if (command.capture_output) {
          ::dup2(pipe_fds[1], STDOUT_FILENO);
          ::dup2(pipe_fds[1], STDERR_FILENO);
        }
        if (!work_dir.empty() && ::chdir(work_dir.c_str()) != 0) {
          const char msg[] = "tessera-cli: cannot enter the rank's working folder (chdir)\n";
          [[maybe_unused]] auto w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
          ::_exit(127);
        }
        ::execve(argv[0], argv.data(), envp.data());
        const char msg[] = "tessera-cli: cannot run the rank's program (execve failed)\n";
        [[maybe_unused]] auto w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
        ::_exit(127);
      }
      if (group_ == 0) group_ = pid;
      ::setpgid(pid, group_);  // also here: whichever runs first, the group is set before use
      Child child;
      child.rank = command.rank;
      child.pid = pid;
      if (command.capture_output) {
        ::close(pipe_fds[1]);
        child.output = pipe_fds[0];
      }
      children_.push_back(std::move(child));
    }
  } catch (...) {
    signal_live(SIGKILL);
    throw;
  }
}

std::vector<int> RankProcesses::output_fds() const {
  std::vector<int> out;
  for (const Child& c : children_)
    if (c.output >= 0) out.push_back(c.output);
  return out;
}

void RankProcesses::flush(Child& child, const std::string& line) {
  if (callbacks_.line) callbacks_.line(child.rank, line);
}

void RankProcesses::close_output(Child& child) {
  if (!child.pending.empty()) flush(child, child.pending);
  child.pending.clear();
  ::close(child.output);
  child.output = -1;
}

void RankProcesses::read_output(int fd) {
  auto it = std::find_if(children_.begin(), children_.end(),
                         [&](const Child& c) { return c.output == fd; });
  if (it == children_.end()) return;
  Child& child = *it;
  char buffer[8192];
  const ssize_t n = ::read(child.output, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) return close_output(child);
  child.pending.append(buffer, static_cast<std::size_t>(n));
  std::size_t start = 0;
  for (std::size_t end; (end = child.pending.find('\n', start)) != std::string::npos;
       start = end + 1) {
    std::string line = child.pending.substr(start, end - start);
    // A progress bar's carriage returns: the last redraw of the line.
    if (const auto cr = line.rfind('\r'); cr != std::string::npos) line = line.substr(cr + 1);
    flush(child, line);
  }
  child.pending.erase(0, start);
}

void RankProcesses::reap() {
  for (Child& c : children_) {
    if (c.status) continue;
    int status = 0;
    const pid_t got = ::waitpid(c.pid, &status, WNOHANG);
    if (got != c.pid) continue;
    c.status = status;
    if (callbacks_.exited) callbacks_.exited(c.rank, c.pid, status);
  }
  if (!exited_at_ && all_exited()) exited_at_ = Clock::now();
}

void RankProcesses::signal_live(int sig) {
  for (const Child& c : children_)
    if (!c.status) ::kill(c.pid, sig);
}

void RankProcesses::stop(std::chrono::duration<double> grace, int first_signal) {
  signal_live(first_signal);
  if (!kill_at_) kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace);
}

std::vector<int> RankProcesses::tick() {
  std::vector<int> killed;
  if (kill_at_ && !killed_ && Clock::now() >= *kill_at_) {
    for (const Child& c : children_)
      if (!c.status) killed.push_back(c.rank);
    signal_live(SIGKILL);
    killed_ = true;
  }
  return killed;
}

std::optional<std::chrono::milliseconds> RankProcesses::time_to_next_tick() const {
  if (!kill_at_ || killed_) return std::nullopt;
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at_ - Clock::now()));
}

bool RankProcesses::all_exited() const {
  return std::all_of(children_.begin(), children_.end(),
                     [](const Child& c) { return c.status.has_value(); });
}

bool RankProcesses::all_done() {
  if (!all_exited()) return false;
  // Every rank is gone but a descendant still holds an output pipe: stop reading after 2 s.
  if (exited_at_ && Clock::now() - *exited_at_ > std::chrono::seconds(2))
    for (Child& c : children_)
      if (c.output >= 0) close_output(c);
  return std::all_of(children_.begin(), children_.end(),
                     [](const Child& c) { return c.output < 0; });
}

void RankProcesses::kill_group() {
  if (group_ > 0) ::killpg(group_, SIGKILL);
}

pid_t RankProcesses::pid_of(int rank) const {
  for (const Child& c : children_)
    if (c.rank == rank) return c.pid;
  return -1;
}

}  // namespace tessera::nodes
