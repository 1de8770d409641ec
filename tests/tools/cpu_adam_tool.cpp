// tessera-cpu-adam-tool: test-only front end to the fused CPU AdamW (engine/optim/cpu_adam.h),
// for tests/parity/test_cpu_adam.py (numerics against torch.optim.AdamW) and
// tests/bench/bench_cpu_adam.py (throughput against torch, DeepSpeed and a memory bound).
//
//   tessera-cpu-adam-tool run --in IN.safetensors --out OUT.safetensors --isa scalar|avx2|avx512
//       --steps N [--threads T] [--copy none|bf16|fp16] [--lr X] [--beta1 X] [--beta2 X]
//       [--eps X] [--weight-decay X] [--offset K]
//     IN holds `param` (F32, 1-D) and `grad.0` ... `grad.{G-1}` (F32, same shape); step t
//     (t = 1..N) uses grad.{(t-1) mod G}, so G = N gives every step its own gradient. The moments
//     start at zero. OUT gets `param`, `exp_avg`, `exp_avg_sq` (F32) and, with --copy, `copy`
//     (BF16 or F16, written at every step). --offset K starts every array K floats past a
//     64-byte boundary (to exercise unaligned heads).
//   tessera-cpu-adam-tool isa
//     {"detected": "avx512", "supported": ["scalar", "avx2", "avx512"]}
//   tessera-cpu-adam-tool bench --size N --threads T --steps S [--warmup W] [--isa LEVEL]
//       [--triad-floats M] [--triad-runs R]
//     JSON: the median wall time of S timed steps (after W warm-up steps) of cpu_adamw_step on N
//     fp32 parameters, without and with a bf16 copy, and a STREAM-style triad in the step's
//     own access pattern (p, m, v += s*g in place: 16 bytes read, 12 written per element)
//     measured in this process at T threads over arrays of M floats each (default: 4 arrays
//     totalling >= 4x the L3 cache, at least 64Mi floats each), best of R runs.
//     The bound in params/s is its bytes/s / 28 (fp32: p, g, m, v read, p, m, v written) or
//     / 30 (+ a 2-byte copy).
//
// Exit codes: 0 ok, 2 bad input or usage, 3 the requested ISA level does not run on this
// machine, 1 otherwise.
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "hf/safetensors.h"
#include "optim/cpu_adam.h"

namespace {

using nlohmann::json;
namespace hf = tessera::hf;
namespace optim = tessera::optim;
using tessera::Error;
using tessera::ErrorKind;

constexpr int kExitIsaUnsupported = 3;

[[noreturn]] void usage(const std::string& why) {
  throw Error(ErrorKind::Usage, why,
              "usage: tessera-cpu-adam-tool run|isa|bench [options; see "
              "tests/tools/cpu_adam_tool.cpp]");
}

// --name value pairs after the subcommand.
std::map<std::string, std::string> parse_options(int argc, char** argv, int first) {
  std::map<std::string, std::string> out;
  for (int i = first; i < argc; ++i) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || i + 1 >= argc) usage("bad argument: " + key);
    out[key.substr(2)] = argv[++i];
  }
  return out;
}

double number(const std::map<std::string, std::string>& opts, const std::string& key,
              std::optional<double> fallback) {
  auto it = opts.find(key);
  if (it == opts.end()) {
    if (!fallback) usage("--" + key + " is required");
    return *fallback;
  }
  char* end = nullptr;
  double value = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0') usage("--" + key + ": not a number");
  return value;
}

std::int64_t integer(const std::map<std::string, std::string>& opts, const std::string& key,
                     std::optional<std::int64_t> fallback) {
  double value = number(
      opts, key, fallback ? std::optional<double>(double(*fallback)) : std::optional<double>());
  if (value < 0 || value != std::floor(value)) usage("--" + key + ": not a count");
  return static_cast<std::int64_t>(value);
}

optim::SimdLevel parse_level(const std::string& name) {
  if (name == "scalar") return optim::SimdLevel::Scalar;
  if (name == "avx2") return optim::SimdLevel::Avx2;
  if (name == "avx512") return optim::SimdLevel::Avx512;
  usage("--isa must be scalar, avx2 or avx512, not " + name);
}

// Exits 3 when `level` does not run here (the parity test skips that level).
void require_level(optim::SimdLevel level) {
  if (!optim::simd_level_supported(level)) {
    std::cerr << "unsupported: ISA level " << optim::simd_level_name(level)
              << " does not run on this CPU/OS (detected "
              << optim::simd_level_name(optim::detected_simd_level()) << ")\n";
    std::exit(kExitIsaUnsupported);
  }
}

// A zero-initialised buffer of `count` T whose data starts `offset` elements past a 64-byte
// boundary.
template <typename T>
class Buffer {
 public:
  Buffer(std::int64_t count, std::int64_t offset = 0) {
    std::size_t bytes = static_cast<std::size_t>(count + offset) * sizeof(T);
    std::size_t rounded = (bytes + 63) / 64 * 64;
    raw_ = static_cast<T*>(std::aligned_alloc(64, std::max<std::size_t>(rounded, 64)));
    if (!raw_) throw Error(ErrorKind::Internal, "out of memory");
    data_ = raw_ + offset;
    count_ = count;
  }
  ~Buffer() { std::free(raw_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::int64_t size() const { return count_; }
  std::span<const std::uint8_t> bytes() const {
    return {reinterpret_cast<const std::uint8_t*>(data_),
            static_cast<std::size_t>(count_) * sizeof(T)};
  }

 private:
  T* raw_ = nullptr;
  T* data_ = nullptr;
  std::int64_t count_ = 0;
};

const hf::TensorInfo& f32_vector(const hf::SafetensorsFile& file, const std::string& name,
                                 std::optional<std::int64_t> count) {
  const hf::TensorInfo* info = file.find(name);
  if (!info) tessera::throw_invalid(file.path().string() + ": no tensor " + name);
  if (info->dtype != hf::DType::F32 || info->shape.size() != 1)
    tessera::throw_invalid(file.path().string() + ": " + name + " must be a 1-D F32 tensor");
  if (count && info->shape[0] != *count)
    tessera::throw_invalid(file.path().string() + ": " + name + " has " +
                           std::to_string(info->shape[0]) + " elements, param " +
                           std::to_string(*count));
  return *info;
}

int run(int argc, char** argv) {
  auto opts = parse_options(argc, argv, 2);
  for (const char* key : {"in", "out", "isa"})
    if (!opts.count(key)) usage(std::string("--") + key + " is required");
  const optim::SimdLevel level = parse_level(opts["isa"]);
  require_level(level);
  const std::int64_t threads = integer(opts, "threads", 1);
  const std::int64_t steps = integer(opts, "steps", std::nullopt);
  const std::int64_t offset = integer(opts, "offset", 0);
  if (threads < 1) usage("--threads must be >= 1");
  if (offset > 15) usage("--offset must be < 16");
  std::string copy_name = opts.count("copy") ? opts["copy"] : "none";
  optim::LowPrecisionCopy copy_kind = optim::LowPrecisionCopy::None;
  if (copy_name == "bf16")
    copy_kind = optim::LowPrecisionCopy::Bf16;
  else if (copy_name == "fp16")
    copy_kind = optim::LowPrecisionCopy::Fp16;
  else if (copy_name != "none")
    usage("--copy must be none, bf16 or fp16");

  optim::AdamHyper hyper;
  hyper.lr = number(opts, "lr", std::nullopt);
  hyper.beta1 = number(opts, "beta1", 0.9);
  hyper.beta2 = number(opts, "beta2", 0.999);
  hyper.eps = number(opts, "eps", 1e-8);
  hyper.weight_decay = number(opts, "weight-decay", 0.0);

  auto file = hf::SafetensorsFile::open(opts["in"]);
  const auto& param_info = f32_vector(*file, "param", std::nullopt);
  const std::int64_t count = param_info.shape[0];
  std::vector<const hf::TensorInfo*> grads;
  while (const hf::TensorInfo* info = file->find("grad." + std::to_string(grads.size()))) {
    grads.push_back(&f32_vector(*file, info->name, count));
  }
  if (grads.empty()) tessera::throw_invalid(opts["in"] + ": no tensor grad.0");

  at::set_num_threads(static_cast<int>(threads));
  Buffer<float> param(count, offset), grad(count, offset), exp_avg(count, offset),
      exp_avg_sq(count, offset);
  Buffer<std::uint16_t> copy(count, offset);
  std::memcpy(param.data(), file->view(param_info).bytes.data(), param.bytes().size());
  std::fill_n(exp_avg.data(), count, 0.0f);
  std::fill_n(exp_avg_sq.data(), count, 0.0f);
  std::fill_n(copy.data(), count, std::uint16_t{0});

  optim::AdamArrays arrays;
  arrays.param = param.data();
  arrays.grad = grad.data();
  arrays.exp_avg = exp_avg.data();
  arrays.exp_avg_sq = exp_avg_sq.data();
  arrays.count = count;
  arrays.copy = copy_kind != optim::LowPrecisionCopy::None ? copy.data() : nullptr;
  arrays.copy_kind = copy_kind;
  for (std::int64_t t = 1; t <= steps; ++t) {
    const auto& info = *grads[static_cast<std::size_t>(t - 1) % grads.size()];
    std::memcpy(grad.data(), file->view(info).bytes.data(), grad.bytes().size());
    hyper.step = t;
    optim::cpu_adamw_step(arrays, hyper, level);
  }

  std::vector<hf::TensorToWrite> out = {
      {"param", hf::DType::F32, {count}, param.bytes()},
      {"exp_avg", hf::DType::F32, {count}, exp_avg.bytes()},
      {"exp_avg_sq", hf::DType::F32, {count}, exp_avg_sq.bytes()},
  };
  if (copy_kind != optim::LowPrecisionCopy::None)
    out.push_back({"copy",
                   copy_kind == optim::LowPrecisionCopy::Bf16 ? hf::DType::BF16 : hf::DType::F16,
                   {count},
                   copy.bytes()});
  hf::write_safetensors(opts["out"], out,
                        {{"isa", optim::simd_level_name(level)},
                         {"threads", std::to_string(threads)},
                         {"steps", std::to_string(steps)}});
  return 0;
}

int isa() {
  json supported = json::array();
  for (auto level : {optim::SimdLevel::Scalar, optim::SimdLevel::Avx2, optim::SimdLevel::Avx512})
    if (optim::simd_level_supported(level)) supported.push_back(optim::simd_level_name(level));
  json out = {{"detected", optim::simd_level_name(optim::detected_simd_level())},
              {"supported", supported}};
  std::cout << out.dump() << "\n";
  return 0;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  std::size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

// Bytes of the last-level (L3) cache, 0 when unknown.
std::int64_t l3_bytes() {
#ifdef _SC_LEVEL3_CACHE_SIZE
  long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (v > 0) return v;
#endif
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (!(in >> text) || text.empty()) return 0;
  std::int64_t value = std::atoll(text.c_str());
  char unit = text.back();
  if (unit == 'K') value <<= 10;
  if (unit == 'M') value <<= 20;
  return value;
}

// Splits [0, n) over the intra-op threads in contiguous pieces, as cpu_adamw_step does.
template <typename F>
void parallel_chunks(std::int64_t n, const F& f) {
  const std::int64_t grain = std::max<std::int64_t>(std::int64_t{1} << 16, n / 256);
  tessera::core::parallel_for(n, grain, at::get_num_threads(), f);
}

// The bound's kernel: STREAM's triad (a = a + s*b) on the optimizer's own access pattern:
// p, m and v each updated in place from g, so it reads 16 bytes and writes 12 per element, as a
// fused fp32 Adam step does, with the least arithmetic. (The classic a = b + s*c writes an array
// it never reads, so the hardware reads it first (write-allocate), and with two read streams
// instead of four it measures less bandwidth than the step itself reaches.)
inline void stream_update_body(float* __restrict p, const float* __restrict g, float* __restrict m,
                               float* __restrict v, float s, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float step = s * g[i];
    p[i] = p[i] + step;
    m[i] = m[i] + step;
    v[i] = v[i] + step;
  }
}
void stream_update_plain(float* p, const float* g, float* m, float* v, float s, std::int64_t n) {
  stream_update_body(p, g, m, v, s, n);
}
__attribute__((target("avx2"))) void stream_update_avx2(float* __restrict p,
                                                        const float* __restrict g,
                                                        float* __restrict m, float* __restrict v,
                                                        float s, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float step = s * g[i];
    p[i] = p[i] + step;
    m[i] = m[i] + step;
    v[i] = v[i] + step;
  }
}
__attribute__((target("avx512f"))) void stream_update_avx512(float* __restrict p,
                                                             const float* __restrict g,
                                                             float* __restrict m,
                                                             float* __restrict v, float s,
                                                             std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float step = s * g[i];
    p[i] = p[i] + step;
    m[i] = m[i] + step;
    v[i] = v[i] + step;
  }
}

int bench(int argc, char** argv) {
  auto opts = parse_options(argc, argv, 2);
  const std::int64_t size = integer(opts, "size", std::nullopt);
  const std::int64_t threads = integer(opts, "threads", 1);
  const std::int64_t steps = integer(opts, "steps", 20);
  const std::int64_t warmup = integer(opts, "warmup", 3);
  const std::int64_t triad_runs = std::max<std::int64_t>(1, integer(opts, "triad-runs", 8));
  if (size < 1 || threads < 1 || steps < 1) usage("--size, --threads, --steps must be >= 1");
  const optim::SimdLevel level =
      opts.count("isa") ? parse_level(opts["isa"]) : optim::detected_simd_level();
  require_level(level);
  at::set_num_threads(static_cast<int>(threads));

  // Stream arrays: together >= 4x the L3 and at least 4 x 64Mi floats, so that nothing is
  // cache-resident.
  const std::int64_t l3 = l3_bytes();
  std::int64_t triad_n = std::int64_t{64} << 20;
  triad_n = std::max(triad_n, (4 * l3 / 16 + (1 << 20) - 1) / (1 << 20) * (1 << 20));
  if (opts.count("triad-floats")) triad_n = integer(opts, "triad-floats", std::nullopt);
  Buffer<float> tp(triad_n), tg(triad_n), tm(triad_n), tv(triad_n);
  parallel_chunks(triad_n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      tp.data()[i] = 0.0f;
      tg.data()[i] = 1.0f;
      tm.data()[i] = 0.0f;
      tv.data()[i] = 0.0f;
    }
  });
  auto* stream_kernel = __builtin_cpu_supports("avx512f") ? &stream_update_avx512
                        : __builtin_cpu_supports("avx2")  ? &stream_update_avx2
                                                          : &stream_update_plain;
  std::vector<double> triad_seconds;
  auto triad_once = [&] {
    const float s = 1e-3f;
    auto t0 = Clock::now();
    parallel_chunks(triad_n, [&](std::int64_t b, std::int64_t e) {
      stream_kernel(tp.data() + b, tg.data() + b, tm.data() + b, tv.data() + b, s, e - b);
    });
    triad_seconds.push_back(seconds_since(t0));
  };

  // The optimizer's arrays, first touched by the threads that will use them.
  Buffer<float> param(size), grad(size), exp_avg(size), exp_avg_sq(size);
  Buffer<std::uint16_t> copy(size);
  parallel_chunks(size, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u;
      float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
      param.data()[i] = u;
      grad.data()[i] = 1e-3f * (u + 0.25f);
      exp_avg.data()[i] = 0.0f;
      exp_avg_sq.data()[i] = 0.0f;
      copy.data()[i] = 0;
    }
  });

  optim::AdamArrays arrays;
  arrays.param = param.data();
  arrays.grad = grad.data();
  arrays.exp_avg = exp_avg.data();
  arrays.exp_avg_sq = exp_avg_sq.data();
  arrays.count = size;
  optim::AdamHyper hyper;
  hyper.lr = 1e-3;
  hyper.weight_decay = 0.01;
  std::int64_t t = 0;
  auto measure = [&](optim::LowPrecisionCopy kind) {
    arrays.copy = kind == optim::LowPrecisionCopy::None ? nullptr : copy.data();
    arrays.copy_kind = kind;
    std::vector<double> secs;
    for (std::int64_t i = 0; i < warmup + steps; ++i) {
      hyper.step = ++t;
      auto t0 = Clock::now();
      optim::cpu_adamw_step(arrays, hyper, level);
      double s = seconds_since(t0);
      if (i >= warmup) secs.push_back(s);
    }
    double med = median(secs);
    return json{{"median_s", med},
                {"min_s", *std::min_element(secs.begin(), secs.end())},
                {"params_per_s", static_cast<double>(size) / med}};
  };

  // Triad runs before and after the steps: the best of them is the bound.
  for (std::int64_t i = 0; i < (triad_runs + 1) / 2; ++i) triad_once();
  json fp32 = measure(optim::LowPrecisionCopy::None);
  json bf16 = measure(optim::LowPrecisionCopy::Bf16);
  for (std::int64_t i = 0; i < triad_runs / 2; ++i) triad_once();
  double best = *std::min_element(triad_seconds.begin(), triad_seconds.end());
  // Bytes the stream kernel moves per element: 16 read + 12 written.
  double stream_bps = 28.0 * static_cast<double>(triad_n) / best;

  json out = {
      {"size", size},
      {"threads", threads},
      {"torch_threads", at::get_num_threads()},
      {"steps", steps},
      {"warmup", warmup},
      {"isa", optim::simd_level_name(level)},
      {"fp32", fp32},
      {"bf16_copy", bf16},
      {"triad",
       {{"floats_per_array", triad_n},
        {"total_bytes", 16 * triad_n},
        {"l3_bytes", l3},
        {"runs", triad_seconds.size()},
        {"best_s", best},
        {"bytes_per_s", stream_bps},
        {"note",
         "p, m, v += s*g in place over 4 arrays: 28 bytes per element, the fp32 step's traffic"}}},
      {"bound_params_per_s", {{"fp32", stream_bps / 28.0}, {"bf16_copy", stream_bps / 30.0}}},
  };
  std::cout << out.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string command = argc > 1 ? argv[1] : "";
    if (command == "run") return run(argc, argv);
    if (command == "isa" && argc == 2) return isa();
    if (command == "bench") return bench(argc, argv);
    usage("unknown or missing subcommand");
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    return e.kind() == ErrorKind::Io || e.kind() == ErrorKind::Internal ? 1 : 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
