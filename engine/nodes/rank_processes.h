#pragma once
// The ranks of a job as child processes of this one: what `tessera-cli launch` starts on this
// machine and what an agent starts for a client (`spawn`). The children share a new process
// group, die with the thread that started them (PR_SET_PDEATHSIG: in a threaded agent that is
// the thread serving the job, which outlives them), get default signal handlers, and have their
// output read here line by line when asked. The owner runs the loop: it polls output_fds() (and
// its own descriptors), calls read_output() and reap(), and stop() / tick() to end them.
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tessera::nodes {

struct RankCommand {
  int rank = 0;                    // the job's global rank (for messages and callbacks)
  std::vector<std::string> argv;   // argv[0]: the program's path
  std::vector<std::string> env;    // the whole environment, "NAME=value"
  bool capture_output = true;      // false: the child keeps this process's stdout and stderr
  std::filesystem::path work_dir;  // empty: this process's working folder
};

// The environment of this process without the variables named (prefixes such as "RANK=").
std::vector<std::string> environment_without(const std::vector<std::string>& prefixes);

// "exited with code 1" / "was killed by signal 9 (Killed)".
std::string describe_exit_status(int status);
// A shell's convention: the exit code, or 128 + the signal.
int exit_code_of(int status);

// The path of the running program (/proc/self/exe): the ranks run `tessera-cli run`.
std::string this_program_path();

class RankProcesses {
 public:
  struct Callbacks {
    std::function<void(int rank, const std::string& line)> line;  // a captured output line
    std::function<void(int rank, pid_t pid, int status)> exited;  // waitpid's status
  };
  explicit RankProcesses(Callbacks callbacks) : callbacks_(std::move(callbacks)) {}
  ~RankProcesses();  // kills the group, if any child is left
  RankProcesses(const RankProcesses&) = delete;
  RankProcesses& operator=(const RankProcesses&) = delete;

  // Starts every command; `child_mask` is the signal mask the children get (null: empty). On a
  // failure the ones started are killed and tessera::Error (Io) is thrown.
  void start(const std::vector<RankCommand>& commands, const sigset_t* child_mask);

  // The descriptors of the output still open (poll them for POLLIN), and the one to read when
  // poll says so.
  std::vector<int> output_fds() const;
  void read_output(int fd);
  // Collects the children that ended (waitpid on each, so other children of this process are
  // left alone); calls `exited` for each.
  void reap();

  void signal_live(int sig);
  // SIGTERM now (unless `first_signal` says otherwise), SIGKILL at `grace` from now (tick()).
  void stop(std::chrono::duration<double> grace, int first_signal = SIGTERM);
  // SIGKILL the ranks still alive once the grace period is over; returns the ranks killed.
  std::vector<int> tick();
  // The time left until tick() has something to do, for poll's timeout (none: nothing to do).
  std::optional<std::chrono::milliseconds> time_to_next_tick() const;
  bool stopping() const { return kill_at_.has_value(); }

  bool all_exited() const;
  // Every child exited and its output was read to the end (or given up 2 s after it exited: a
  // descendant may hold the pipe).
  bool all_done();
  // Kills what is left of the group (a rank's descendants).
  void kill_group();
  pid_t pid_of(int rank) const;
  std::size_t size() const { return children_.size(); }

 private:
  struct Child {
    int rank = 0;
    pid_t pid = -1;
    int output = -1;      // read end of its stdout+stderr; -1 when closed or not captured
    std::string pending;  // a line not yet ended
    std::optional<int> status;
  };
  void flush(Child& child, const std::string& line);
  void close_output(Child& child);

  Callbacks callbacks_;
  std::vector<Child> children_;
  pid_t group_ = 0;
  std::optional<std::chrono::steady_clock::time_point> kill_at_;
  bool killed_ = false;
  std::optional<std::chrono::steady_clock::time_point> exited_at_;
};

}  // namespace tessera::nodes
