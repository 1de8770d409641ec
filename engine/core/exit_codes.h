#pragma once
// The exit codes every tessera-cli command keeps (docs/exit-codes.md, `tessera-cli --help`).
#include <csignal>

namespace tessera::core {

inline constexpr int kExitDone = 0;
inline constexpr int kExitInternal = 1;  // a bug, or the OS refused a read or write
inline constexpr int kExitBadInput = 2;  // bad usage, bad input or a refused plan

// A command ended by signal N (after its clean stop, where it has one) exits with 128 + N, the
// status a shell reports for a process the signal killed: 130 for SIGINT, 143 for SIGTERM.
constexpr int exit_code_for_signal(int signal) {
  return 128 + signal;
}

// A rank that stopped because it was asked to: launch and the agents forward SIGINT or SIGTERM.
constexpr bool is_requested_stop(int code) {
  return code == exit_code_for_signal(SIGINT) || code == exit_code_for_signal(SIGTERM);
}

inline constexpr const char* kExitCodesHelp =
    "exit codes: 0 done; 1 internal error (or the OS refused a read or write); 2 bad usage, bad "
    "input or a refused plan (the message names the file, field or line); 128+N stopped by "
    "signal N: 130 Ctrl-C (SIGINT), 143 SIGTERM (docs/exit-codes.md)";

}  // namespace tessera::core
