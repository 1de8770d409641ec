// tessera-cli: the whole product without a window. Exit codes (core/exit_codes.h): 0 success,
// 2 bad usage or bad input (the message names what and where), 1 any other failure, 128+N for a
// command stopped by signal N.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <limits>
#include <new>

#include "command.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/fatal_signals.h"

namespace tessera::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

Args::Args(const std::vector<std::string>& args, const std::vector<std::string>& flags,
           const std::vector<std::string>& options) {
  auto is = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  bool only_positionals = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_positionals || a.size() < 2 || a[0] != '-' || a == "-") {
      positionals_.push_back(a);
    } else if (a == "--") {
      only_positionals = true;
    } else if (is(flags, a)) {
      set_flags_.push_back(a);
    } else if (is(options, a)) {
      if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
      options_.emplace_back(a, args[++i]);
    } else {
      throw UsageError{"unknown option " + a};
    }
  }
}

bool Args::flag(const std::string& name) const {
  return std::find(set_flags_.begin(), set_flags_.end(), name) != set_flags_.end();
}

const std::string* Args::option(const std::string& name) const {
  for (auto it = options_.rbegin(); it != options_.rend(); ++it)
    if (it->first == name) return &it->second;
  return nullptr;
}

std::vector<std::string> Args::option_values(const std::string& name) const {
  std::vector<std::string> values;
  for (const auto& [option_name, value] : options_)
    if (option_name == name) values.push_back(value);
  return values;
}

const std::string& Args::required(const std::string& name, const char* placeholder) const {
  const std::string* value = option(name);
  if (value == nullptr) throw UsageError{name + " " + placeholder + " is required"};
  return *value;
}

std::int64_t Args::integer(const std::string& name, std::int64_t fallback, std::int64_t min_value,
                           std::int64_t max_value) const {
  const std::string* value = option(name);
  if (value == nullptr) return fallback;
  try {
    std::size_t used = 0;
    const long long v = std::stoll(*value, &used);
    if (used == value->size() && v >= min_value && v <= max_value) return v;
  } catch (const std::exception&) {  // not a number, or past 64 bits
  }
  const std::string range =
      max_value == std::numeric_limits<std::int64_t>::max()
          ? "≥ " + std::to_string(min_value)
          : "from " + std::to_string(min_value) + " to " + std::to_string(max_value);
  throw UsageError{name + " expects an integer " + range + ", got '" + *value + "'"};
}

void Args::expect_no_positionals() const {
  if (!positionals_.empty())
    throw UsageError{"unexpected argument \"" + positionals_.front() + "\""};
}

}  // namespace tessera::cli

namespace {

// Commands without a clean stop of their own (export, generate, eval, ...) end at once on
// SIGINT or SIGTERM with 128 + the signal: what they write goes to temporary files renamed into
// place, so nothing half-written appears under a final name (the next export or run of the folder
// removes the temporaries). `run`, `launch`, `agent` and `hub download` install their own.
extern "C" void end_at_once(int signal) {
  std::_Exit(tessera::core::exit_code_for_signal(signal));
}

void print_help() {
  auto& commands = tessera::cli::command_registry();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::cout << "usage: tessera-cli COMMAND [ARGS]\n\ncommands:\n";
  for (const auto& c : commands) std::printf("  %-12s %s\n", c.name.c_str(), c.summary.c_str());
  std::cout << "\nRun 'tessera-cli COMMAND --help' for a command's arguments.\n\n"
            << tessera::core::kExitCodesHelp << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  core::report_fatal_signals("tessera-cli");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_help();
    return args.empty() ? core::kExitBadInput : core::kExitDone;
  }
  const auto& commands = cli::command_registry();
  auto it = std::find_if(commands.begin(), commands.end(),
                         [&](const cli::Command& c) { return c.name == args[0]; });
  if (it == commands.end()) {
    std::cerr << "tessera-cli: unknown command '" << args[0] << "'\n";
    print_help();
    return core::kExitBadInput;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  struct sigaction action {};
  action.sa_handler = end_at_once;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  if (std::find(rest.begin(), rest.end(), "--help") != rest.end()) {
    std::cout << "usage: tessera-cli " << it->usage << "\n"
              << it->summary << "\n\n"
              << core::kExitCodesHelp << "\n";
    return core::kExitDone;
  }
  try {
    return it->run(rest);
  } catch (const cli::UsageError& e) {
    std::cerr << "tessera-cli " << it->name << ": " << e.message << "\nusage: tessera-cli "
              << it->usage << "\n";
    return core::kExitBadInput;
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    switch (e.kind()) {
      case ErrorKind::InvalidInput:
      case ErrorKind::Usage:
      case ErrorKind::Unsupported:
      case ErrorKind::OutOfMemory:
        return core::kExitBadInput;
      default:
        return core::kExitInternal;
    }
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory\n";
    return core::kExitInternal;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return core::kExitInternal;
  }
}
