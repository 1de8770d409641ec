#pragma once
// tessera-cli subcommands register themselves here (one file per command), so adding a
// command touches no central table.
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace tessera::cli {

// The most processes `launch` and `plan` take with --nproc (or a node with NAME:NPROC).
inline constexpr int kMaxProcesses = 256;

struct Command {
  std::string name;
  std::string usage;    // one line: "inspect PATH [--json]"
  std::string summary;  // one line: what it does
  std::function<int(const std::vector<std::string>& args)> run;  // args after the name
};

std::vector<Command>& command_registry();

struct RegisterCommand {
  explicit RegisterCommand(Command command) { command_registry().push_back(std::move(command)); }
};

// Raised for bad command-line usage; main prints the message and the command's usage,
// and exits 2.
struct UsageError {
  std::string message;
};

// Simple argument scanner shared by commands: flags (--name), options (--name VALUE)
// and positionals, in any order. Unknown flags are a UsageError.
class Args {
 public:
  Args(const std::vector<std::string>& args, const std::vector<std::string>& flags,
       const std::vector<std::string>& options);
  bool flag(const std::string& name) const;
  const std::string* option(const std::string& name) const;
  // Every value of an option that may be given more than once, in order.
  std::vector<std::string> option_values(const std::string& name) const;
  // The value of a mandatory option; a UsageError "NAME PLACEHOLDER is required" otherwise.
  const std::string& required(const std::string& name, const char* placeholder) const;
  // A UsageError naming the first positional argument, for commands that take none.
  void expect_no_positionals() const;
  // The whole of option `name`'s value as an integer from `min_value` to `max_value`, else
  // `fallback` when the option is absent; a UsageError naming the option, the range and the
  // value otherwise ("7x", "-1", "").
  std::int64_t integer(const std::string& name, std::int64_t fallback, std::int64_t min_value,
                       std::int64_t max_value = std::numeric_limits<std::int64_t>::max()) const;
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  std::vector<std::string> set_flags_;
  std::vector<std::pair<std::string, std::string>> options_;
  std::vector<std::string> positionals_;
};

}  // namespace tessera::cli
