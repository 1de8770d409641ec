#pragma once
// Shared by the libFuzzer targets: the input as a file where the product reads a file, and the
// one refusal a parser may answer with (tessera::Error). Anything else that escapes a target
// (another exception, a crash, a sanitizer report, a hang) is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace tessera::fuzz {

// A folder of this process's own (several fuzzers may run at once), removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::filesystem::path made = std::filesystem::path(base != nullptr ? base : "/tmp") /
                                 ("tessera-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(made);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_dir(), ignored);
    });
    return made;
  }();
  return dir;
}

// Writes the input to scratch_dir()/name (overwriting the last input) and returns its path.
inline std::filesystem::path write_input(const std::string& name, const std::uint8_t* data,
                                         std::size_t size) {
  std::filesystem::path path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `parse`; a tessera::Error is the expected refusal of bad input.
template <typename Parse>
void refusal_is_fine(Parse&& parse) {
  try {
    parse();
  } catch (const tessera::Error&) {
  }
}

// A property that must hold for every input the parser accepted.
inline void require(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "fuzz: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace tessera::fuzz
