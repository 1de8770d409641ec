#include "core/fatal_signals.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>

// A sanitizer's own report of a fault says more (tests/sanitize): under one, nothing is installed.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TESSERA_REPORT_FATAL_SIGNALS 0
#else
#define TESSERA_REPORT_FATAL_SIGNALS 1
#endif

namespace tessera::core {
#if TESSERA_REPORT_FATAL_SIGNALS
namespace {

const char* reporting_program = "tessera";

// The handler's own stack, so that a stack overflow (SIGSEGV on the guard page) is reported too.
alignas(16) char alternate_stack[64 * 1024];

// Only async-signal-safe calls from here on: write(2), backtrace_symbols_fd, raise.
void write_text(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

const char* describe(int number) {
  switch (number) {
    case SIGSEGV:
      return "SIGSEGV (invalid memory access)";
    case SIGBUS:
      return "SIGBUS (bus error: a mapped file shrank, or misaligned access)";
    case SIGILL:
      return "SIGILL (illegal instruction: code for a newer CPU than this one?)";
    case SIGFPE:
      return "SIGFPE (arithmetic fault)";
    case SIGABRT:
      return "SIGABRT (aborted)";
    default:
      return "a fatal signal";
  }
}

void on_fatal_signal(int number) {
  write_text("\n");
  write_text(reporting_program);
  write_text(": fatal signal ");
  write_text(describe(number));
  write_text("; stack, innermost first:\n");
  void* frames[64];
  const int count = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, count, STDERR_FILENO);
  write_text(reporting_program);
  write_text(
      ": this is a bug in Tessera; please report it with the lines above, the job spec and "
      "`tessera-cli version`\n");
  // SA_RESETHAND put back the default action: the process dies of the signal it got.
  ::raise(number);
}

}  // namespace
#endif

void report_fatal_signals(const char* program) {
#if !TESSERA_REPORT_FATAL_SIGNALS
  (void)program;
#else
  reporting_program = program;
  // backtrace() loads the unwinder (libgcc_s) on its first call, which must not happen in the
  // handler (it allocates): once here.
  void* warm_up[1];
  ::backtrace(warm_up, 1);
  stack_t stack{};
  stack.ss_sp = alternate_stack;
  stack.ss_size = sizeof alternate_stack;
  ::sigaltstack(&stack, nullptr);
  struct sigaction action {};
  action.sa_handler = on_fatal_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND | SA_ONSTACK;
  for (int fatal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(fatal, &action, nullptr);
#endif
}

}  // namespace tessera::core
