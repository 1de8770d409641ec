#pragma once
// Pre-flight checks (`tessera-cli nodes check`): what a node is (NodeFacts, gathered by its
// agent), what the client's job needs (Requirements, sent by the client), and the verdict per
// check, each failure with its reason and what to do. The c10d link test is separate
// (link/link_test.h): it needs both sides running.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tessera::nodes {

// What this tessera-cli is built with; the CLI fills it (torch-free code cannot ask LibTorch).
struct BuildInfo {
  std::string tessera;
  std::optional<std::string> libtorch;  // none: built without LibTorch
  std::optional<std::string> cuda;      // the CUDA runtime LibTorch was built with
  std::optional<std::string> nccl;      // the NCCL loaded with LibTorch, when there is one
  // The CPU Adam kernel this build dispatches to on this CPU ("avx512", "avx2", "scalar");
  // empty without LibTorch (no CPU Adam).
  std::string cpu_adam_kernel;
};

// The version of the NCCL library this process has loaded (with LibTorch's CUDA build), as
// "2.21.5"; none when no NCCL is loaded.
std::optional<std::string> loaded_nccl_version();

// The CPU features a CPU Adam kernel needs (engine/optim/cpu_adam.cpp's dispatch).
std::vector<std::string> cpu_adam_kernel_features(const std::string& kernel);
// The CPU's features among those the kernels use (sse4_2 avx avx2 fma f16c avx512f avx512bw),
// as CPUID and the OS (XGETBV) report them.
std::vector<std::string> detect_cpu_features();

struct GpuFact {
  std::string name;
  std::uint64_t memory_total = 0;
  std::optional<std::uint64_t> memory_free;  // nvidia-smi's; none when it could not be read
};

struct NodeFacts {
  std::string name;
  BuildInfo build;
  std::string cpu_model;
  std::vector<std::string> cpu_features;
  std::uint64_t ram_total = 0, ram_available = 0;
  std::string disk_path;
  std::uint64_t disk_free = 0;
  std::vector<GpuFact> gpus;
  std::string gpu_source;
  // Test-only overrides in effect (TESSERA_AGENT_TEST_*), named in every report.
  std::vector<std::string> test_overrides;
};

// The facts of this machine. `disk_dir` is where the agent's jobs will write. Honours the
// test-only variables TESSERA_AGENT_TEST_CPU_ISA (comma-separated features replacing the
// detected ones), TESSERA_AGENT_TEST_TESSERA_VERSION and TESSERA_AGENT_TEST_LIBTORCH_VERSION.
NodeFacts collect_node_facts(const std::string& name, const BuildInfo& build,
                             const std::filesystem::path& disk_dir);

struct Requirements {
  BuildInfo client;                       // must match: Tessera, LibTorch; CUDA/NCCL where GPUs are
  std::vector<std::string> cpu_features;  // the client's CPU Adam kernel's features
  std::uint64_t ram_bytes = 0;            // free RAM the job needs on this node
  std::uint64_t disk_bytes = 0;           // free disk
  std::uint64_t gpu_bytes = 0;            // free memory per GPU (0: no GPU needed)
};
// From the client's BuildInfo and needs (cpu_features from its CPU Adam kernel).
Requirements requirements_for(const BuildInfo& client, std::uint64_t ram_bytes,
                              std::uint64_t disk_bytes, std::uint64_t gpu_bytes);

struct CheckResult {
  std::string name;  // "tessera version", "cpu isa", …
  bool ok = false;
  std::string detail;  // what was found (and measured)
  std::string reason;  // failed: why
  std::string hint;    // failed: what to do
  nlohmann::json measured = nlohmann::json::object();
};

std::vector<CheckResult> evaluate_checks(const NodeFacts& facts, const Requirements& needs);

nlohmann::json to_json(const BuildInfo& build);
BuildInfo build_info_from_json(const nlohmann::json& json);
nlohmann::json to_json(const NodeFacts& facts);
nlohmann::json to_json(const Requirements& needs);
Requirements requirements_from_json(const nlohmann::json& json);
nlohmann::json to_json(const CheckResult& result);
CheckResult check_result_from_json(const nlohmann::json& json);

}  // namespace tessera::nodes
