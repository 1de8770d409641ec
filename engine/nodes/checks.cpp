#include "nodes/checks.h"

#include <dlfcn.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "core/files.h"
#include "plan/profile.h"

namespace tessera::nodes {

using core::human_bytes;
using nlohmann::json;

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : " ") + item;
  return out.empty() ? std::string("none") : out;
}

bool has_all(const std::vector<std::string>& have, const std::vector<std::string>& want,
             std::vector<std::string>* missing) {
  for (const auto& feature : want)
    if (std::find(have.begin(), have.end(), feature) == have.end()) missing->push_back(feature);
  return missing->empty();
}

// The best CPU Adam kernel a CPU with `features` runs (cpu_adam.cpp's order).
std::string best_kernel(const std::vector<std::string>& features) {
  for (const char* kernel : {"avx512", "avx2"}) {
    std::vector<std::string> missing;
    if (has_all(features, cpu_adam_kernel_features(kernel), &missing)) return kernel;
  }
  return "scalar";
}

// Free memory per GPU from nvidia-smi (in MiB); empty when it cannot be run.
std::vector<std::uint64_t> gpu_free_memory() {
  std::vector<std::uint64_t> out;
  FILE* pipe =
      ::popen("nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null", "r");
  if (pipe == nullptr) return out;
  char line[128];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    char* end = nullptr;
    const unsigned long long mib = std::strtoull(line, &end, 10);
    if (end != line) out.push_back(static_cast<std::uint64_t>(mib) << 20);
  }
  ::pclose(pipe);
  return out;
}

std::string optional_text(const std::optional<std::string>& value, const char* none) {
  return value ? *value : std::string(none);
}

json optional_json(const std::optional<std::string>& value) {
  return value ? json(*value) : json(nullptr);
}

std::optional<std::string> optional_string(const json& object, const char* name) {
  if (!object.contains(name) || object[name].is_null()) return std::nullopt;
  return object[name].get<std::string>();
}

}  // namespace

std::optional<std::string> loaded_nccl_version() {
  // RTLD_NOLOAD: only a library LibTorch already loaded; never load one for the question.
  void* library = ::dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) return std::nullopt;
  using GetVersion = int (*)(int*);
  auto get_version = reinterpret_cast<GetVersion>(::dlsym(library, "ncclGetVersion"));
  int code = 0;
  const bool ok = get_version != nullptr && get_version(&code) == 0 && code > 0;
  ::dlclose(library);
  if (!ok) return std::nullopt;
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older ones major*1000 + minor*100 + patch.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  const int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::vector<std::string> cpu_adam_kernel_features(const std::string& kernel) {
  if (kernel == "avx512") return {"avx512f", "avx512bw"};
  if (kernel == "avx2") return {"avx2", "fma", "f16c"};
  return {};
}

std::vector<std::string> detect_cpu_features() {
  std::vector<std::string> out;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XGETBV).
  if (__builtin_cpu_supports("sse4.2")) out.push_back("sse4_2");
  if (__builtin_cpu_supports("avx")) out.push_back("avx");
  if (__builtin_cpu_supports("avx2")) out.push_back("avx2");
  if (__builtin_cpu_supports("fma")) out.push_back("fma");
  // F16C by CPUID: clang before 15 has no "f16c" for __builtin_cpu_supports. It needs the AVX
  // state the OS saves, which the "avx" check covers.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
      (ecx & bit_F16C) != 0)
    out.push_back("f16c");
  if (__builtin_cpu_supports("avx512f")) out.push_back("avx512f");
  if (__builtin_cpu_supports("avx512bw")) out.push_back("avx512bw");
#endif
  return out;
}

NodeFacts collect_node_facts(const std::string& name, const BuildInfo& build,
                             const std::filesystem::path& disk_dir) {
  NodeFacts facts;
  facts.name = name;
  facts.build = build;
  plan::ProfileOptions options;
  options.disk_dir = disk_dir;
  options.measure_disk = false;  // free space only; a speed test would slow every check
  const plan::HardwareProfile profile = plan::probe_hardware(options);
  facts.cpu_model = profile.cpu.model;
  facts.cpu_features = detect_cpu_features();
  facts.ram_total = profile.memory.total;
  facts.ram_available = profile.memory.usable();
  if (profile.disk) {
    facts.disk_path = profile.disk->path;
    facts.disk_free = profile.disk->free;
  }
  facts.gpu_source = profile.gpu_source;
  const std::vector<std::uint64_t> free =
      profile.gpus.empty() ? std::vector<std::uint64_t>{} : gpu_free_memory();
  for (std::size_t i = 0; i < profile.gpus.size(); ++i) {
    GpuFact gpu{profile.gpus[i].name, profile.gpus[i].memory, std::nullopt};
    if (i < free.size()) gpu.memory_free = free[i];
    facts.gpus.push_back(gpu);
  }
  // Test-only: make this node look different, for the tests of the refusals.
  if (const char* isa = std::getenv("TESSERA_AGENT_TEST_CPU_ISA")) {
    facts.cpu_features = split_list(isa);
    facts.test_overrides.push_back(std::string("TESSERA_AGENT_TEST_CPU_ISA=") + isa);
  }
  if (const char* version = std::getenv("TESSERA_AGENT_TEST_TESSERA_VERSION")) {
    facts.build.tessera = version;
    facts.test_overrides.push_back(std::string("TESSERA_AGENT_TEST_TESSERA_VERSION=") + version);
  }
  if (const char* version = std::getenv("TESSERA_AGENT_TEST_LIBTORCH_VERSION")) {
    facts.build.libtorch = version;
    facts.test_overrides.push_back(std::string("TESSERA_AGENT_TEST_LIBTORCH_VERSION=") + version);
  }
  facts.build.cpu_adam_kernel = build.libtorch ? best_kernel(facts.cpu_features) : "";
  return facts;
}

Requirements requirements_for(const BuildInfo& client, std::uint64_t ram_bytes,
                              std::uint64_t disk_bytes, std::uint64_t gpu_bytes) {
  Requirements needs;
  needs.client = client;
  needs.cpu_features = cpu_adam_kernel_features(client.cpu_adam_kernel);
  needs.ram_bytes = ram_bytes;
  needs.disk_bytes = disk_bytes;
  needs.gpu_bytes = gpu_bytes;
  return needs;
}

std::vector<CheckResult> evaluate_checks(const NodeFacts& facts, const Requirements& needs) {
  std::vector<CheckResult> out;
  const std::string& node = facts.name;
  // Said in the detail and in a failure's reason (what the launch table shows): a refusal
  // caused by a faked fact must not read as a real one.
  const std::string overridden =
      facts.test_overrides.empty() ? "" : " [test override: " + joined(facts.test_overrides) + "]";

  {
    CheckResult r;
    r.name = "tessera version";
    r.ok = facts.build.tessera == needs.client.tessera;
    r.detail = "node " + facts.build.tessera + ", client " + needs.client.tessera + overridden;
    if (!r.ok) {
      r.reason = node + " runs Tessera " + facts.build.tessera + " and this client " +
                 needs.client.tessera + ": ranks of different versions may not agree on a job" +
                 overridden;
      r.hint = "install Tessera " + needs.client.tessera + " on " + node +
               " (the same version on every node)";
    }
    out.push_back(r);
  }
  {
    CheckResult r;
    r.name = "libtorch version";
    const auto& mine = facts.build.libtorch;
    const auto& theirs = needs.client.libtorch;
    r.ok = mine && theirs && *mine == *theirs;
    r.detail = "node " + optional_text(mine, "none") + ", client " + optional_text(theirs, "none") +
               overridden;
    if (!r.ok) {
      if (!mine)
        r.reason = node + "'s tessera-cli is built without LibTorch, so it cannot run ranks";
      else if (!theirs)
        r.reason = "this client's tessera-cli is built without LibTorch, so it cannot run a job";
      else
        r.reason = node + " has LibTorch " + *mine + " and this client " + *theirs +
                   ": c10d and the checkpoints need the same LibTorch on every node" + overridden;
      r.hint = "install the same Tessera build (with LibTorch " + optional_text(theirs, "") +
               ") on every node";
    }
    out.push_back(r);
  }
  {
    CheckResult r;
    r.name = "cpu isa";
    std::vector<std::string> missing;
    r.ok = has_all(facts.cpu_features, needs.cpu_features, &missing);
    const std::string client_kernel =
        needs.client.cpu_adam_kernel.empty() ? std::string("none") : needs.client.cpu_adam_kernel;
    r.detail = "node has " + joined(facts.cpu_features) + "; the client's CPU Adam kernel (" +
               client_kernel + ") needs " + joined(needs.cpu_features) + overridden;
    r.measured = {{"features", facts.cpu_features}, {"required", needs.cpu_features}};
    if (!r.ok) {
      const std::string fallback = best_kernel(facts.cpu_features);
      r.reason = node + "'s CPU lacks " + joined(missing) +
                 ", which the client's CPU Adam kernel (" + client_kernel +
                 ") needs; its ranks could run only the " + fallback + " kernel" + overridden;
      r.hint = "set TESSERA_CPU_ADAM_ISA=" + fallback +
               " on the client so every node runs that kernel, or leave " + node + " out";
    }
    out.push_back(r);
  }
  {
    CheckResult r;
    r.name = "cuda / nccl";
    if (facts.gpus.empty()) {
      r.ok = true;
      r.detail = "no GPU on this node (looked in " + facts.gpu_source + "): CUDA and NCCL unused";
    } else {
      const auto& cuda = facts.build.cuda;
      const auto& nccl = facts.build.nccl;
      r.detail = std::to_string(facts.gpus.size()) + " GPU(s); CUDA runtime " +
                 optional_text(cuda, "none") + " (client " +
                 optional_text(needs.client.cuda, "none") + "), NCCL " +
                 optional_text(nccl, "not loaded") + " (client " +
                 optional_text(needs.client.nccl, "not loaded") + ")";
      r.ok = true;
      if (!cuda) {
        r.ok = false;
        r.reason = node + " has GPUs but its LibTorch has no CUDA runtime, so they cannot be used";
        r.hint = "install the CUDA build of Tessera on " + node;
      } else if (needs.client.cuda && *needs.client.cuda != *cuda) {
        r.ok = false;
        r.reason = node + "'s LibTorch uses CUDA " + *cuda + ", the client's " + *needs.client.cuda;
        r.hint = "install the same Tessera build (same CUDA) on every node";
      } else if (nccl && needs.client.nccl && *nccl != *needs.client.nccl) {
        r.ok = false;
        r.reason = node + " loads NCCL " + *nccl + ", the client " + *needs.client.nccl +
                   ": NCCL collectives between different versions may hang or fail";
        r.hint = "install the same Tessera build (same NCCL) on every node";
      }
    }
    out.push_back(r);
  }
  {
    CheckResult r;
    r.name = "free ram";
    r.ok = facts.ram_available >= needs.ram_bytes;
    r.detail = human_bytes(facts.ram_available) + " available of " + human_bytes(facts.ram_total) +
               "; the job needs " + human_bytes(needs.ram_bytes);
    r.measured = {{"available", facts.ram_available}, {"needed", needs.ram_bytes}};
    if (!r.ok) {
      r.reason = node + " has " + human_bytes(facts.ram_available) +
                 " of RAM available, the job "
                 "needs " +
                 human_bytes(needs.ram_bytes);
      r.hint =
          "free memory there (other programs), plan with less memory per rank (ZeRO, "
          "offload), or leave " +
          node + " out";
    }
    out.push_back(r);
  }
  {
    CheckResult r;
    r.name = "free disk";
    r.ok = facts.disk_free >= needs.disk_bytes;
    r.detail = human_bytes(facts.disk_free) + " free in " + facts.disk_path + "; the job needs " +
               human_bytes(needs.disk_bytes);
    r.measured = {{"free", facts.disk_free}, {"needed", needs.disk_bytes}};
    if (!r.ok) {
      r.reason = node + " has " + human_bytes(facts.disk_free) + " free in " + facts.disk_path +
                 ", the job needs " + human_bytes(needs.disk_bytes);
      r.hint = "free space there, or start the agent with a --state-dir on a larger disk";
    }
    out.push_back(r);
  }
  {
    CheckResult r;
    r.name = "free gpu memory";
    r.ok = true;
    if (needs.gpu_bytes == 0) {
      r.detail = facts.gpus.empty() ? "no GPU, none needed" : "the job needs no GPU memory";
    } else if (facts.gpus.empty()) {
      r.ok = false;
      r.reason =
          "the job needs " + human_bytes(needs.gpu_bytes) + " on a GPU and " + node + " has none";
      r.hint = "plan the job for the CPU on this node, or leave it out";
    } else {
      for (std::size_t i = 0; i < facts.gpus.size(); ++i) {
        const auto& gpu = facts.gpus[i];
        r.detail += (r.detail.empty() ? "" : "; ") + std::string("gpu ") + std::to_string(i) +
                    ": " +
                    (gpu.memory_free ? human_bytes(*gpu.memory_free) + " free"
                                     : std::string("free memory unknown (nvidia-smi failed)"));
        if (!gpu.memory_free || *gpu.memory_free < needs.gpu_bytes) r.ok = false;
      }
      if (!r.ok) {
        r.reason = "a GPU of " + node + " has less than the " + human_bytes(needs.gpu_bytes) +
                   " free the job needs (or its free memory could not be read)";
        r.hint =
            "end other programs on the GPU (nvidia-smi lists them), plan with less memory "
            "per GPU, or leave " +
            node + " out";
      }
    }
    out.push_back(r);
  }
  return out;
}

json to_json(const BuildInfo& b) {
  return {{"tessera", b.tessera},
          {"libtorch", optional_json(b.libtorch)},
          {"cuda", optional_json(b.cuda)},
          {"nccl", optional_json(b.nccl)},
          {"cpu_adam_kernel", b.cpu_adam_kernel}};
}

BuildInfo build_info_from_json(const json& j) {
  BuildInfo b;
  b.tessera = j.at("tessera").get<std::string>();
  b.libtorch = optional_string(j, "libtorch");
  b.cuda = optional_string(j, "cuda");
  b.nccl = optional_string(j, "nccl");
  b.cpu_adam_kernel = j.value("cpu_adam_kernel", std::string());
  return b;
}

json to_json(const NodeFacts& f) {
  json gpus = json::array();
  for (const auto& g : f.gpus)
    gpus.push_back({{"name", g.name},
                    {"memory_total", g.memory_total},
                    {"memory_free", g.memory_free ? json(*g.memory_free) : json(nullptr)}});
  return {{"name", f.name},
          {"build", to_json(f.build)},
          {"cpu_model", f.cpu_model},
          {"cpu_features", f.cpu_features},
          {"ram_total", f.ram_total},
          {"ram_available", f.ram_available},
          {"disk_path", f.disk_path},
          {"disk_free", f.disk_free},
          {"gpus", gpus},
          {"test_overrides", f.test_overrides}};
}

json to_json(const Requirements& n) {
  return {{"client", to_json(n.client)},
          {"cpu_features", n.cpu_features},
          {"ram_bytes", n.ram_bytes},
          {"disk_bytes", n.disk_bytes},
          {"gpu_bytes", n.gpu_bytes}};
}

Requirements requirements_from_json(const json& j) {
  Requirements n;
  try {
    n.client = build_info_from_json(j.at("client"));
    n.cpu_features = j.at("cpu_features").get<std::vector<std::string>>();
    n.ram_bytes = j.value("ram_bytes", std::uint64_t{0});
    n.disk_bytes = j.value("disk_bytes", std::uint64_t{0});
    n.gpu_bytes = j.value("gpu_bytes", std::uint64_t{0});
  } catch (const json::exception& e) {
    throw_invalid(std::string("the check request's requirements are malformed: ") + e.what());
  }
  return n;
}

json to_json(const CheckResult& r) {
  json out = {{"name", r.name}, {"ok", r.ok}, {"detail", r.detail}, {"measured", r.measured}};
  if (!r.ok) {
    out["reason"] = r.reason;
    out["hint"] = r.hint;
  }
  return out;
}

CheckResult check_result_from_json(const json& j) {
  CheckResult r;
  r.name = j.value("name", std::string());
  r.ok = j.value("ok", false);
  r.detail = j.value("detail", std::string());
  r.reason = j.value("reason", std::string());
  r.hint = j.value("hint", std::string());
  r.measured = j.value("measured", json::object());
  return r;
}

}  // namespace tessera::nodes
