// Test-only front end of core/checksum.h for bench/bench_checksum.py:
//   tessera-checksum-tool FILE [--legacy]
// prints {"algorithm", "hex", "bytes", "seconds"} for one checksum of FILE.
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "core/checksum.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "--legacy")) {
    std::fprintf(stderr, "usage: tessera-checksum-tool FILE [--legacy]\n");
    return 2;
  }
  const bool legacy = argc == 3;
  try {
    const std::filesystem::path file = argv[1];
    const auto start = std::chrono::steady_clock::now();
    const std::string hex =
        legacy ? tessera::core::legacy_fnv_file(file) : tessera::core::xxh3_128_file(file);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("{\"algorithm\": \"%s\", \"hex\": \"%s\", \"bytes\": %llu, \"seconds\": %.6f}\n",
                legacy ? "fnv1a64" : "xxh3_128", hex.c_str(),
                static_cast<unsigned long long>(std::filesystem::file_size(file)), seconds);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-checksum-tool: %s\n", e.what());
    return 1;
  }
}
