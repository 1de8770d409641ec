// event_replay FILE [--delay-ms N] [--exit CODE] [--crash] [--ignore-sigint] [--hold-ms N]:
// writes FILE's lines to stdout one by one with a pause between them (a stand-in for
// `tessera-cli run … --events -` in the studio's tests: a real child process and a real
// stream), waits --hold-ms (a step that takes long; with --ignore-sigint a stop request does
// not end it), then exits with CODE, or aborts.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: event_replay FILE [--delay-ms N] [--exit CODE] [--crash] "
                 "[--ignore-sigint] [--hold-ms N]\n");
    return 2;
  }
  long delay_ms = 0;
  int exit_code = 0;
  bool crash = false;
  long hold_ms = 0;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--delay-ms") && i + 1 < argc)
      delay_ms = std::strtol(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--exit") && i + 1 < argc)
      exit_code = int(std::strtol(argv[++i], nullptr, 10));
    else if (!std::strcmp(argv[i], "--crash"))
      crash = true;
    else if (!std::strcmp(argv[i], "--ignore-sigint"))
      std::signal(SIGINT, SIG_IGN);
    else if (!std::strcmp(argv[i], "--hold-ms") && i + 1 < argc)
      hold_ms = std::strtol(argv[++i], nullptr, 10);
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "event_replay: cannot read %s\n", argv[1]);
    return 2;
  }
  std::string line;
  while (std::getline(in, line)) {
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  }
  if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  std::fprintf(stderr, "event_replay: end of %s\n", argv[1]);
  if (crash) std::abort();
  return exit_code;
}
