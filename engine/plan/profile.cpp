#include "plan/profile.h"

#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "core/meminfo.h"
#include "core/units.h"
#include "memory/disk_store.h"

namespace tessera::plan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string read_small_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CpuInfo probe_cpu() {
  CpuInfo cpu;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  std::string physical_id;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "processor") {
      ++cpu.logical_cores;
    } else if (key == "model name" && cpu.model.empty()) {
      cpu.model = value;
    } else if (key == "physical id") {
      physical_id = value;
    } else if (key == "core id") {
      cores.insert({physical_id, value});
    } else if (key == "cpu MHz" && cpu.mhz == 0.0) {
      cpu.mhz = std::atof(value.c_str());
    } else if (key == "flags" && flags.empty()) {
      std::istringstream words(value);
      for (std::string w; words >> w;) flags.insert(w);
    }
  }
  cpu.avx2 = flags.count("avx2") > 0;
  cpu.avx512f = flags.count("avx512f") > 0;
  cpu.avx512_bf16 = flags.count("avx512_bf16") > 0;
  cpu.amx_bf16 = flags.count("amx_bf16") > 0;
  cpu.fma = flags.count("fma") > 0;
  if (cpu.logical_cores == 0) cpu.logical_cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu.physical_cores = cores.empty() ? cpu.logical_cores : static_cast<int>(cores.size());
  // The CPUs this process may run on (a container may get fewer than the machine has).
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0 && online < cpu.logical_cores) cpu.logical_cores = static_cast<int>(online);
  if (cpu.physical_cores > cpu.logical_cores) cpu.physical_cores = cpu.logical_cores;
  return cpu;
}

}  // namespace

MemoryInfo probe_memory() {
  MemoryInfo m;
  const core::MemInfo meminfo = core::read_meminfo();
  m.total = meminfo.total;
  m.available = meminfo.available;
  // cgroup v2, then v1; "max" or a huge number means no limit.
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const std::string value = trim(read_small_file(path));
    if (value.empty() || value == "max") continue;
    const unsigned long long limit = std::strtoull(value.c_str(), nullptr, 10);
    if (limit > 0 && limit < (1ull << 60)) m.cgroup_limit = limit;
    break;
  }
  return m;
}

namespace {

std::uint64_t cgroup_usage() {
  for (const char* path :
       {"/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}) {
    const std::string value = trim(read_small_file(path));
    if (!value.empty()) return std::strtoull(value.c_str(), nullptr, 10);
  }
  return 0;
}

std::string probe_os() {
  std::string name;
  std::istringstream in(read_small_file("/etc/os-release"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      name = line.substr(12);
      if (name.size() >= 2 && name.front() == '"') name = name.substr(1, name.size() - 2);
    }
  }
  utsname u{};
  if (uname(&u) == 0) {
    const std::string kernel = std::string(u.sysname) + " " + u.release + " " + u.machine;
    name = name.empty() ? kernel : name + " (" + kernel + ")";
  }
  return name.empty() ? "unknown" : name;
}

// NVIDIA's driver lists each GPU under /proc/driver/nvidia/gpus; nvidia-smi adds the memory.
std::vector<GpuInfo> probe_gpus(std::string& source) {
  std::vector<GpuInfo> gpus;
  source = "/proc/driver/nvidia/gpus, nvidia-smi";
  FILE* pipe = popen(
      "nvidia-smi --query-gpu=name,memory.total,compute_cap,memory.free "
      "--format=csv,noheader,nounits "
      "2>/dev/null",
      "r");
  if (pipe) {
    std::array<char, 512> buf{};
    while (fgets(buf.data(), static_cast<int>(buf.size()), pipe)) {
      std::istringstream row(buf.data());
      std::string name, mem, cap, free;
      std::getline(row, name, ',');
      std::getline(row, mem, ',');
      std::getline(row, cap, ',');
      std::getline(row, free, ',');
      if (trim(name).empty()) continue;
      GpuInfo g;
      g.name = trim(name);
      g.memory = static_cast<std::uint64_t>(std::atof(trim(mem).c_str()) * 1024.0 * 1024.0);
      g.memory_free = static_cast<std::uint64_t>(std::atof(trim(free).c_str()) * 1024.0 * 1024.0);
      g.compute_capability = trim(cap);
      g.bf16 = std::atof(trim(cap).c_str()) >= 8.0;  // Ampere and later
      gpus.push_back(g);
    }
    pclose(pipe);
  }
  if (!gpus.empty()) return gpus;
  std::error_code ec;
  const fs::path root = "/proc/driver/nvidia/gpus";
  if (fs::is_directory(root, ec)) {
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      std::istringstream in(read_small_file(entry.path() / "information"));
      GpuInfo g;
      for (std::string line; std::getline(in, line);)
        if (line.rfind("Model:", 0) == 0) g.name = trim(line.substr(6));
      if (!g.name.empty()) gpus.push_back(g);
    }
  }
  return gpus;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

fs::path cache_file() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg) return fs::path(xdg) / "tessera" / "profile.json";
  if (home && *home) return fs::path(home) / ".cache" / "tessera" / "profile.json";
  return {};
}

// A measurement kept in the profile cache under doc[section][key], with the time it was taken:
// the entry while it is less than a day old, else nothing (measured again). A stale or foreign
// cache is simply measured again.
std::optional<json> cached_measurement(const std::string& section, const std::string& key) {
  const fs::path file = cache_file();
  std::error_code ec;
  if (file.empty() || !fs::exists(file, ec)) return std::nullopt;
  try {
    json entry = json::parse(read_small_file(file)).at(section).at(key);
    const auto age = std::time(nullptr) - entry.at("unix_time").get<std::int64_t>();
    if (age < 0 || age > 24 * 3600) return std::nullopt;
    return entry;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void store_measurement(const std::string& section, const std::string& key, json entry) {
  const fs::path file = cache_file();
  if (file.empty()) return;
  try {
    json doc = json::object();
    std::error_code ec;
    if (fs::exists(file, ec)) {
      doc = json::parse(read_small_file(file), nullptr, false);
      if (!doc.is_object()) doc = json::object();
    }
    entry["unix_time"] = static_cast<std::int64_t>(std::time(nullptr));
    doc[section][key] = std::move(entry);
    fs::create_directories(file.parent_path(), ec);
    core::write_file_atomic(file, doc.dump(2));
  } catch (const std::exception&) {
    // The cache is an optimisation; failing to write it must not fail the profile.
  }
}

std::optional<DiskInfo> cached_disk(const fs::path& dir) {
  const std::optional<json> d = cached_measurement("disk", fs::weakly_canonical(dir).string());
  if (!d) return std::nullopt;
  try {
    DiskInfo info;
    info.measured = true;
    info.from_cache = true;
    info.write_bytes_per_s = d->at("write_bytes_per_s").get<double>();
    info.read_bytes_per_s = d->at("read_bytes_per_s").get<double>();
    info.test_bytes = d->at("test_bytes").get<std::uint64_t>();
    info.method = d->at("method").get<std::string>();
    // Measured another way (before the disk store's pattern): measured again.
    if (info.method.rfind(kDiskMethod, 0) != 0) return std::nullopt;
    info.measured_at = d->at("measured_at").get<std::string>();
    return info;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void store_disk(const fs::path& dir, const DiskInfo& info) {
  std::error_code ec;
  const fs::path key = fs::weakly_canonical(dir, ec);
  if (ec) return;
  store_measurement("disk", key.string(),
                    {{"write_bytes_per_s", info.write_bytes_per_s},
                     {"read_bytes_per_s", info.read_bytes_per_s},
                     {"test_bytes", info.test_bytes},
                     {"method", info.method},
                     {"measured_at", info.measured_at}});
}

// The loopback link's measurement, kept a day like the disk's (the machine's own, not a folder's).
std::optional<LinkInfo> cached_link() {
  const std::optional<json> l = cached_measurement("link", "loopback");
  if (!l) return std::nullopt;
  try {
    LinkInfo info;
    info.measured = true;
    info.from_cache = true;
    info.bandwidth_bytes_per_s = l->at("bandwidth_bytes_per_s").get<double>();
    info.latency_s = l->at("latency_s").get<double>();
    info.test_bytes = l->at("test_bytes").get<std::uint64_t>();
    info.method = l->at("method").get<std::string>();
    info.measured_at = l->at("measured_at").get<std::string>();
    if (!(info.bandwidth_bytes_per_s > 0.0) || !(info.latency_s >= 0.0)) return std::nullopt;
    return info;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void store_link(const LinkInfo& info) {
  store_measurement("link", "loopback",
                    {{"bandwidth_bytes_per_s", info.bandwidth_bytes_per_s},
                     {"latency_s", info.latency_s},
                     {"test_bytes", info.test_bytes},
                     {"method", info.method},
                     {"measured_at", info.measured_at}});
}

// A GPU's rates, kept a day like the link's, under its index and name (another card in the same
// slot is measured again).
std::string gpu_cache_key(int index, const GpuInfo& gpu) {
  return std::to_string(index) + ": " + gpu.name;
}

std::optional<GpuRates> cached_gpu_rates(int index, const GpuInfo& gpu) {
  const std::optional<json> g = cached_measurement("gpu", gpu_cache_key(index, gpu));
  if (!g) return std::nullopt;
  try {
    GpuRates rates;
    rates.measured = true;
    rates.from_cache = true;
    rates.host_to_device_bytes_per_s = g->at("host_to_device_bytes_per_s").get<double>();
    rates.device_to_host_bytes_per_s = g->at("device_to_host_bytes_per_s").get<double>();
    rates.bf16_flops = g->at("bf16_flops").get<double>();
    rates.fp32_flops = g->at("fp32_flops").get<double>();
    rates.copy_bytes = g->at("copy_bytes").get<std::uint64_t>();
    rates.gemm_size = g->at("gemm_size").get<std::int64_t>();
    rates.method = g->at("method").get<std::string>();
    rates.measured_at = g->at("measured_at").get<std::string>();
    if (!(rates.fp32_flops > 0.0) || !(rates.host_to_device_bytes_per_s > 0.0)) return std::nullopt;
    return rates;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

json gpu_rates_json(const GpuRates& r) {
  return {{"measured", r.measured},
          {"host_to_device_bytes_per_s", r.host_to_device_bytes_per_s},
          {"device_to_host_bytes_per_s", r.device_to_host_bytes_per_s},
          {"bf16_flops", r.bf16_flops},
          {"fp32_flops", r.fp32_flops},
          {"copy_bytes", r.copy_bytes},
          {"gemm_size", r.gemm_size},
          {"method", r.method},
          {"measured_at", r.measured_at},
          {"from_cache", r.from_cache}};
}

}  // namespace

std::uint64_t MemoryInfo::usable() const {
  if (simulated) return *simulated;
  std::uint64_t usable = available;
  if (cgroup_limit) {
    const std::uint64_t used = cgroup_usage();
    const std::uint64_t headroom = *cgroup_limit > used ? *cgroup_limit - used : 0;
    usable = std::min(usable, headroom);
  }
  return usable;
}

DiskInfo measure_disk(const fs::path& dir, std::uint64_t bytes,
                      const std::function<void(const std::string&, double)>& progress) {
  DiskInfo info;
  info.path = dir.string();
  // As gemini's disk tier moves its chunks (memory/disk_store.h): whole regions of a few tens of
  // MiB, O_DIRECT where the filesystem allows it, two I/O threads. The profile measured a single
  // buffered stream with fsync before, which on this kind of virtual disk read 130 MB/s where the
  // store moved 450-500 MB/s: the plan put gemini's disk time at 3-4x the run's.
  constexpr std::uint64_t kRegion = 32ull << 20;
  constexpr int kThreads = 2;
  const std::uint64_t regions = std::max<std::uint64_t>(2, (bytes + kRegion - 1) / kRegion);
  const auto start = Clock::now();
  auto report = [&](const std::string& phase, std::uint64_t done) {
    if (progress && Clock::now() - start > std::chrono::seconds(1))
      progress(phase, static_cast<double>(done) / static_cast<double>(regions));
  };
  try {
    memory::DiskStore store(dir, kThreads);
    std::vector<std::size_t> ids;
    for (std::uint64_t r = 0; r < regions; ++r)
      ids.push_back(store.add_region("disk test " + std::to_string(r), kRegion));
    std::vector<memory::AlignedBuffer> buffers;
    for (std::uint64_t r = 0; r < regions; ++r) {
      buffers.emplace_back(kRegion);
      auto* bytes_of = static_cast<unsigned char*>(buffers.back().data());
      for (std::uint64_t i = 0; i < kRegion; i += 4096)
        bytes_of[i] = static_cast<unsigned char>(i / 4096 * 131u + r);
    }
    // Every pass submits all regions at once, as the store's callers queue a step's chunks.
    auto pass = [&](bool write, const std::string& phase) {
      // The clock starts before the first request: the I/O threads begin on it at once.
      const auto pass_start = Clock::now();
      std::vector<std::future<void>> pending;
      for (std::uint64_t r = 0; r < regions; ++r)
        pending.push_back(write ? store.write(ids[r], buffers[r].data())
                                : store.read(ids[r], buffers[r].data()));
      for (std::uint64_t r = 0; r < regions; ++r) {
        pending[r].get();
        report(phase, r + 1);
      }
      return std::chrono::duration<double>(Clock::now() - pass_start).count();
    };
    auto drop_cached_pages = [&] {  // buffered: the reads must come from the disk
      if (store.direct_io()) return;
      for (std::uint64_t r = 0; r < regions; ++r) {
        const int fd = ::open(store.region_path(ids[r]).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
          ::fdatasync(fd);
          ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          ::close(fd);
        }
      }
    };
    // The first write allocates the files' blocks; a step overwrites them, so the later ones are
    // timed. The faster of two passes each way: on a shared virtual disk one pass of 64 MiB read
    // once at 186 MB/s where the same disk's reads ran at 2 GB/s just after, and the cached
    // profile would have put every plan's disk time at 10x the run's.
    pass(true, "disk write 1/3");
    const double second_write_s = pass(true, "disk write 2/3");
    const double write_s = std::min(second_write_s, pass(true, "disk write 3/3"));
    drop_cached_pages();
    const double first_read_s = pass(false, "disk read 1/2");
    drop_cached_pages();
    const double read_s = std::min(first_read_s, pass(false, "disk read 2/2"));
    const double total = static_cast<double>(regions * kRegion);
    info.test_bytes = regions * kRegion;
    info.write_bytes_per_s = total / std::max(write_s, 1e-6);
    info.read_bytes_per_s = total / std::max(read_s, 1e-6);
    info.method = std::string(kDiskMethod) +
                  (store.direct_io() ? "" : "; this filesystem refuses O_DIRECT: buffered");
  } catch (const Error& e) {
    throw_io(dir.string() + ": measuring the disk speed failed: " + e.what(),
             "free some space in the output folder, or pass --no-disk");
  } catch (const std::bad_alloc&) {
    throw_io(dir.string() + ": no memory for the disk test's buffers",
             "pass --no-disk, or measure with less memory in use");
  }
  info.measured = true;
  info.measured_at = utc_now();
  return info;
}

HardwareProfile probe_hardware(const ProfileOptions& options) {
  HardwareProfile p;
  p.cpu = probe_cpu();
  p.memory = probe_memory();
  p.os = probe_os();
  p.gpus = probe_gpus(p.gpu_source);
  if (options.measure_gpu) {
    for (std::size_t i = 0; i < p.gpus.size(); ++i) {
      const int index = static_cast<int>(i);
      std::optional<GpuRates> cached =
          options.use_cache ? cached_gpu_rates(index, p.gpus[i]) : std::nullopt;
      if (cached) {
        p.gpus[i].rates = *cached;
        continue;
      }
      if (options.progress) options.progress("gpu " + std::to_string(i), 0.0);
      GpuRates rates = options.measure_gpu(index);
      if (rates.measured_at.empty()) rates.measured_at = utc_now();
      if (rates.measured && options.use_cache) {
        json entry = gpu_rates_json(rates);
        entry.erase("measured");
        entry.erase("from_cache");
        store_measurement("gpu", gpu_cache_key(index, p.gpus[i]), std::move(entry));
      }
      p.gpus[i].rates = rates;
      if (options.progress) options.progress("gpu " + std::to_string(i), 1.0);
    }
  }
  // FMA lanes × 2 FLOPs per cycle: 16 fp32 lanes with AVX-512, 8 with AVX2+FMA, else 4.
  const double flops_per_cycle = p.cpu.avx512f ? 64.0 : (p.cpu.avx2 && p.cpu.fma ? 32.0 : 8.0);
  const double mhz = p.cpu.mhz > 0 ? p.cpu.mhz : 2000.0;
  // What LibTorch's training step sustains, roughly: a 21M-parameter llama (hidden 512,
  // 4 layers, 1024 tokens per step) measured 0.13 of this peak on a shared 2-core Xeon.
  constexpr double kEfficiency = 0.15;
  p.cpu_flops = std::max(1, p.cpu.physical_cores) * mhz * 1e6 * flops_per_cycle * kEfficiency;
  p.flops_source = "rough estimate: physical cores x clock x FMA width x 0.15 efficiency";
  {
    // Kept a day under the CPU's name and cores, as the GPU's rates; read by every profile (a
    // rank of several, which must not time its shared cores, takes the measurement of a process
    // that had them all).
    const std::string key = p.cpu.model + " x " + std::to_string(p.cpu.physical_cores);
    std::optional<json> cached = options.use_cache ? cached_measurement("cpu", key) : std::nullopt;
    CpuRate rate;
    std::string when;
    if (cached && cached->contains("gemm_flops") && cached->contains("method")) {
      rate.gemm_flops = cached->at("gemm_flops").get<double>();
      rate.method = cached->at("method").get<std::string>();
      // (A measurement cached before the CPU Adam's rate was taken lacks it.)
      if (cached->contains("adam_elements_per_s") && cached->contains("adam_method")) {
        rate.adam_elements_per_s = cached->at("adam_elements_per_s").get<double>();
        rate.adam_method = cached->at("adam_method").get<std::string>();
      }
      when = "cached from " + cached->value("measured_at", std::string("earlier"));
    }
    if ((rate.gemm_flops <= 0.0 || rate.adam_elements_per_s <= 0.0) && options.measure_cpu) {
      if (options.progress) options.progress("cpu", 0.0);
      rate = options.measure_cpu(p.cpu.physical_cores);
      const std::string now = utc_now();
      when = "measured " + now;
      if (rate.gemm_flops > 0.0 && options.use_cache)
        store_measurement("cpu", key,
                          {{"gemm_flops", rate.gemm_flops},
                           {"method", rate.method},
                           {"adam_elements_per_s", rate.adam_elements_per_s},
                           {"adam_method", rate.adam_method},
                           {"measured_at", now}});
      if (options.progress) options.progress("cpu", 1.0);
    }
    if (rate.gemm_flops > 0.0) {
      char gflops[32], share[16];
      std::snprintf(gflops, sizeof gflops, "%.0f", rate.gemm_flops / 1e9);
      std::snprintf(share, sizeof share, "%.2f", kCpuSustainedShare);
      p.cpu_flops = rate.gemm_flops * kCpuSustainedShare;
      p.cpu_flops_measured = true;
      p.flops_source = "measured: " + rate.method + ", " + gflops + " GFLOP/s (" + when + "), x " +
                       share + " that a training step sustains";
    }
    if (rate.adam_elements_per_s > 0.0) {
      p.cpu_adam_elements_per_s = rate.adam_elements_per_s;
      p.cpu_adam_source = "measured: " + rate.adam_method + " (" + when + ")";
    }
  }
  if (options.disk_dir) {
    const fs::path dir = *options.disk_dir;
    std::error_code ec;
    const fs::space_info space = fs::space(dir, ec);
    if (ec)
      throw_io(dir.string() + ": cannot read the free space of this folder (" + ec.message() + ")",
               "create the output folder first, or pass another one");
    DiskInfo disk;
    if (options.measure_disk) {
      std::optional<DiskInfo> cached = options.use_cache ? cached_disk(dir) : std::nullopt;
      if (cached) {
        disk = *cached;
      } else {
        disk = measure_disk(dir, options.disk_test_bytes, options.progress);
        if (options.use_cache) store_disk(dir, disk);
      }
    }
    disk.path = fs::absolute(dir).string();
    disk.free = space.available;
    p.disk = disk;
  }
  if (options.measure_link) {
    std::optional<LinkInfo> cached = options.use_cache ? cached_link() : std::nullopt;
    if (cached) {
      p.link = *cached;
    } else {
      LinkInfo link = options.measure_link();
      if (link.measured_at.empty()) link.measured_at = utc_now();
      if (link.measured && options.use_cache) store_link(link);
      if (link.measured) p.link = link;
    }
  }
  return p;
}

json to_json(const HardwareProfile& p) {
  json out;
  out["cpu"] = {{"model", p.cpu.model},
                {"isa",
                 {{"avx2", p.cpu.avx2},
                  {"avx512f", p.cpu.avx512f},
                  {"avx512_bf16", p.cpu.avx512_bf16},
                  {"amx_bf16", p.cpu.amx_bf16},
                  {"fma", p.cpu.fma}}},
                {"native_bf16", p.cpu.native_bf16()},
                {"physical_cores", p.cpu.physical_cores},
                {"logical_cores", p.cpu.logical_cores},
                {"mhz", p.cpu.mhz},
                {"fp32_flops", p.cpu_flops},
                {"flops_measured", p.cpu_flops_measured},
                {"flops_source", p.flops_source},
                {"adam_elements_per_s", p.cpu_adam_elements_per_s},
                {"adam_source", p.cpu_adam_source}};
  out["memory"] = {
      {"total", p.memory.total},
      {"available", p.memory.available},
      {"cgroup_limit", p.memory.cgroup_limit ? json(*p.memory.cgroup_limit) : json(nullptr)},
      {"usable", p.memory.usable()},
      {"simulated", p.memory.simulated.has_value()}};
  if (p.disk) {
    const DiskInfo& d = *p.disk;
    json disk = {{"path", d.path}, {"free", d.free}, {"measured", d.measured}};
    if (d.measured) {
      disk["write_bytes_per_s"] = d.write_bytes_per_s;
      disk["read_bytes_per_s"] = d.read_bytes_per_s;
      disk["test_bytes"] = d.test_bytes;
      disk["method"] = d.method;
      disk["measured_at"] = d.measured_at;
      disk["from_cache"] = d.from_cache;
    }
    out["disk"] = disk;
  } else {
    out["disk"] = nullptr;
  }
  json gpus = json::array();
  for (const auto& g : p.gpus)
    gpus.push_back({{"name", g.name},
                    {"memory", g.memory},
                    {"memory_free", g.memory_free},
                    {"compute_capability", g.compute_capability},
                    {"bf16", g.bf16},
                    {"rates", g.rates.measured ? gpu_rates_json(g.rates) : json(nullptr)}});
  out["gpus"] = gpus;
  if (p.link) {
    const LinkInfo& l = *p.link;
    out["link"] = {{"measured", l.measured},    {"bandwidth_bytes_per_s", l.bandwidth_bytes_per_s},
                   {"latency_s", l.latency_s},  {"test_bytes", l.test_bytes},
                   {"method", l.method},        {"measured_at", l.measured_at},
                   {"from_cache", l.from_cache}};
  } else {
    out["link"] = nullptr;
  }
  out["gpu_source"] = p.gpu_source;
  out["os"] = p.os;
  return out;
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  return core::parse_byte_size(text, what);
}

}  // namespace tessera::plan
