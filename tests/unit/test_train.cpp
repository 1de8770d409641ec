// Trainer: LR schedules and AdamW against hand-computed values, clipping, crash-safe
// checkpoints (torn saves ignored, old checkpoints deleted only after the new one is whole),
// exact resume, LoRA merge, and the errors a user meets.
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <QtTest>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "core/meminfo.h"
#include "hf/config.h"
#include "job/strategies.h"
#include "model/dropout.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/loss_scaler.h"
#include "optim/schedule.h"
#include "plugins/builtin_plugins.h"
#include "train/activation_checkpoint.h"
#include "train/checkpoint.h"
#include "train/cpu_block_cache.h"
#include "train/device_tier.h"
#include "train/example_batches.h"
#include "train/host_block_pool.h"
#include "train/lora.h"
#include "train/mixed_precision.h"
#include "train/plugin_registry.h"
#include "train/trainer.h"

using nlohmann::json;
using tessera::Error;
using tessera::ErrorKind;
namespace fs = std::filesystem;
namespace optim = tessera::optim;
namespace train = tessera::train;
namespace model = tessera::model;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::path(TESSERA_TEST_TMP_DIR) / ("train-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void expect_error(const std::function<void()>& f, ErrorKind kind, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    QCOMPARE(static_cast<int>(e.kind()), static_cast<int>(kind));
    const std::string text = std::string(e.what()) + " " + e.hint();
    if (text.find(needle) == std::string::npos)
      QFAIL(("message lacks \"" + needle + "\": " + text).c_str());
    return;
  }
  QFAIL(("no error; expected one mentioning " + needle).c_str());
}

std::shared_ptr<model::PretrainedModel> tiny_llama() {
  json config{{"model_type", "llama"},
              {"architectures", {"LlamaForCausalLM"}},
              {"vocab_size", 40},
              {"hidden_size", 16},
              {"intermediate_size", 24},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-5},
              {"max_position_embeddings", 64},
              {"tie_word_embeddings", false}};
  auto c = tessera::hf::parse_model_config(config, "config.json");
  auto m = model::create_model(c, model::head_from_config(c));
  model::init_weights(*m, 11);
  return m;
}

std::vector<train::Batch> tiny_batches(int n) {
  torch::manual_seed(3);
  std::vector<train::Batch> out;
  for (int i = 0; i < n; ++i) {
    train::Batch b;
    b.input_ids = torch::randint(0, 40, {2, 8}, torch::kInt64);
    b.attention_mask = torch::ones_like(b.input_ids);
    b.labels = b.input_ids.clone();
    out.push_back(b);
  }
  return out;
}

std::shared_ptr<model::PretrainedModel> make_model(const json& config, std::uint64_t seed = 11) {
  auto c = tessera::hf::parse_model_config(config, "config.json");
  auto m = model::create_model(c, model::head_from_config(c));
  model::init_weights(*m, seed);
  return m;
}

json llama_config(int layers, int hidden, int positions) {
  return json{{"model_type", "llama"},
              {"architectures", {"LlamaForCausalLM"}},
              {"vocab_size", 40},
              {"hidden_size", hidden},
              {"intermediate_size", hidden * 2},
              {"num_hidden_layers", layers},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-5},
              {"max_position_embeddings", positions},
              {"tie_word_embeddings", false}};
}

// GPT-2 without dropout, so runs with and without recomputation are comparable bit for bit.
json gpt2_config() {
  return json{{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}},
              {"vocab_size", 40},     {"n_embd", 16},
              {"n_layer", 2},         {"n_head", 4},
              {"n_positions", 64},    {"attn_pdrop", 0.0},
              {"resid_pdrop", 0.0},   {"embd_pdrop", 0.0}};
}

std::vector<train::Batch> random_batches(int n, std::int64_t batch, std::int64_t length) {
  torch::manual_seed(3);
  std::vector<train::Batch> out;
  for (int i = 0; i < n; ++i) {
    train::Batch b;
    b.input_ids = torch::randint(0, 40, {batch, length}, torch::kInt64);
    b.attention_mask = torch::ones_like(b.input_ids);
    b.labels = b.input_ids.clone();
    out.push_back(b);
  }
  return out;
}

double relative_difference(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

// Counts live and peak bytes of CPU tensor storage while installed (wraps torch's CPU
// allocator): the measure of what a training step keeps alive, activations included.
class CountingCpuAllocator : public c10::Allocator {
 public:
  static CountingCpuAllocator& instance() {
    static auto* a = new CountingCpuAllocator();  // never destroyed: storages may outlive a test
    return *a;
  }
  void install() {
    if (!base_) base_ = c10::GetCPUAllocator();
    c10::SetCPUAllocator(this, /*priority=*/100);
  }
  void uninstall() { c10::SetCPUAllocator(base_, /*priority=*/100); }
  void reset_peak() { peak_ = live_.load(); }
  std::int64_t live() const { return live_; }
  std::int64_t peak() const { return peak_; }

  c10::DataPtr allocate(std::size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    auto* context = new Context{std::move(inner), static_cast<std::int64_t>(n), this};
    const std::int64_t now = live_ += context->bytes;
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, context, &Context::release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  struct Context {
    c10::DataPtr inner;
    std::int64_t bytes;
    CountingCpuAllocator* owner;
    static void release(void* p) {
      auto* c = static_cast<Context*>(p);
      c->owner->live_ -= c->bytes;
      delete c;
    }
  };
  c10::Allocator* base_ = nullptr;
  std::atomic<std::int64_t> live_{0};
  std::atomic<std::int64_t> peak_{0};
};

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream(p) << s;
}

}  // namespace

class TestTrain : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() { tessera::plugins::register_builtin_plugins(); }

  void registry_lists_every_strategy_of_the_job_layer() {
    // One table, two sides: every strategy the job spec accepts has a factory, and back.
    const std::vector<std::string> registered = train::registered_plugins();
    QVERIFY(std::find(registered.begin(), registered.end(), "single") != registered.end());
    QCOMPARE(registered.size(), tessera::job::strategies().size());
    for (const auto& s : tessera::job::strategies()) {
      auto plugin = train::make_plugin(s.name);
      QCOMPARE(plugin->name(), s.name);
    }
    tessera::plugins::register_builtin_plugins();  // twice is harmless
    QCOMPARE(train::registered_plugins(), registered);
    expect_error([] { train::make_plugin("megatron"); }, ErrorKind::Unsupported,
                 "available plugins: ddp, gemini, hybrid, single, zero");
    expect_error([] { train::make_plugin("megatron"); }, ErrorKind::Unsupported, "strategy.name");
    expect_error([] { train::make_plugin("auto"); }, ErrorKind::Unsupported, "planner");
  }

  void plugin_device_option_reaches_the_plugin() {
    train::TrainerOptions o;
    o.training.steps = 1;
    o.device = "cpu";
    train::Trainer t(tiny_llama(), o);
    QCOMPARE(t.plugin().name(), std::string("single"));
    QVERIFY(t.plugin().device().is_cpu());
    o.device = "tpu";
    expect_error([&] { train::Trainer(tiny_llama(), o); }, ErrorKind::InvalidInput,
                 "strategy.options.device");
    o.device = "cpu";
    o.plugin = "megatron";
    expect_error([&] { train::Trainer(tiny_llama(), o); }, ErrorKind::Unsupported,
                 "available plugins: ddp, gemini, hybrid, single, zero");
  }

  void every_plugin_runs_in_one_process_until_it_distributes() {
    // The process context reaches each plugin; none of today's may be one rank of several.
    for (const std::string& name : train::registered_plugins()) {
      if (train::make_plugin(name)->runs_distributed()) continue;  // ddp: tests/integration
      auto model = tiny_llama();
      std::vector<train::NamedTensor> trainable;
      for (const auto& item : model->named_parameters())
        trainable.push_back({item.key(), item.value()});
      train::PluginOptions options;
      options.device = "cpu";
      options.run_dir = fresh_dir("process-" + name);
      options.process.rank = 1;
      options.process.world_size = 2;
      expect_error([&] { train::make_plugin(name)->prepare(*model, trainable, options); },
                   ErrorKind::Unsupported, "2 processes are not supported yet");
      options.process.rank = 3;
      expect_error([&] { train::make_plugin(name)->prepare(*model, trainable, options); },
                   ErrorKind::InvalidInput, "rank 3 of 2");
      options.process = {};
      auto plugin = train::make_plugin(name);
      plugin->prepare(*model, trainable, options);
      QCOMPARE(plugin->process().rank, 0);
      QCOMPARE(plugin->process().world_size, 1);
    }
  }

  // The simulated device stands in for a GPU in tests only: refused without the tests' variable,
  // it allocates within its budget, refuses past it naming the figures, copies on its own thread
  // (the destination unusable — NaN — until the copy's event), and counts what it moved.
  void simulated_device_tier_budgets_copies_and_orders() {
    qunsetenv(train::kSimulatedDeviceVariable);
    expect_error([] { train::make_device_tier("simulated", 1 << 20, "strategy.options.device"); },
                 ErrorKind::InvalidInput, "strategy.options.device: \"simulated\" is the test");
    // The job layer: the device value exists only for the tests.
    expect_error(
        [] {
          tessera::job::validate_strategy("gemini", {{"device", "simulated"}}, "j");
        },
        ErrorKind::InvalidInput, "expected one of: auto, cpu, cuda");
    qputenv(train::kSimulatedDeviceVariable, "1");
    tessera::job::validate_strategy(
        "gemini", {{"device", "simulated"}, {"host_param_frac", 0.5}, {"device_budget", "1GiB"}},
        "j");
    expect_error([] { train::make_device_tier("simulated", 0, "strategy.options.device"); },
                 ErrorKind::InvalidInput, "needs a budget");
    expect_error([] { train::make_device_tier("gpu", 0, "strategy.options.device"); },
                 ErrorKind::InvalidInput, "\"gpu\" is not a device");
    if (!torch::cuda::is_available())
      expect_error([] { train::make_device_tier("cuda", 0, "strategy.options.device"); },
                   ErrorKind::Unsupported, "has no CUDA GPU");

    const std::size_t n = 1 << 16;  // floats: 256 KiB
    auto device = train::make_device_tier("simulated", 3 * n * 4, "strategy.options.device");
    QCOMPARE(device->name(), std::string("simulated"));
    QVERIFY(device->simulated() && device->tensor_device().is_cpu());
    {
      c10::DataPtr a = device->allocate(n * 4, "chunk 0", train::FirstWriter::copies);
      c10::DataPtr b = device->allocate(n * 4, "chunk 1", train::FirstWriter::copies);
      QCOMPARE(device->used(), std::uint64_t{2 * n * 4});
      try {
        (void)device->allocate(2 * n * 4, "chunk 2", train::FirstWriter::copies);
        QFAIL("allocated past the budget");
      } catch (const train::DeviceOutOfMemory& e) {
        const std::string text = e.what();
        QVERIFY2(text.find("simulated: out of memory for chunk 2: asked 512.0 KiB") == 0,
                 text.c_str());
        QCOMPARE(e.asked(), std::uint64_t{2 * n * 4});
        QCOMPARE(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::OutOfMemory));
        QCOMPARE(std::string(error_kind_name(e.kind())), std::string("out_of_memory"));
      }
      // Fresh device memory holds nothing usable.
      QVERIFY(std::isnan(static_cast<float*>(a.get())[0]));

      c10::DataPtr host = device->allocate_host(n * 4);
      c10::DataPtr back = device->allocate_host(n * 4);
      auto* h = static_cast<float*>(host.get());
      for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>(i);
      device->copy_to_device(a.get(), host.get(), n * 4);
      device->compute_waits(*device->record_copies());
      auto* d = static_cast<float*>(a.get());
      QCOMPARE(d[n - 1], static_cast<float>(n - 1));
      for (std::size_t i = 0; i < n; ++i) d[i] *= 2.0f;  // "compute" on the device memory
      device->copies_wait(*device->record_compute());
      device->copy_to_host(back.get(), a.get(), n * 4);
      const auto copied = device->record_copies();
      device->host_waits(*copied);
      QVERIFY(device->done(*copied));
      QCOMPARE(static_cast<float*>(back.get())[7], 14.0f);
      // A device-to-device chain through a host buffer: the copy up reads what the copy down
      // writes, and the two directions run on separate streams with no order between them, so
      // queued before the first is waited for it is refused; after, it reads the new values.
      device->copy_to_host(back.get(), a.get(), n * 4);
      expect_error([&] { device->copy_to_device(b.get(), back.get(), n * 4); }, ErrorKind::Internal,
                   "a copy to the device (262144 bytes) touches memory that a copy to the host "
                   "queued before it, and not waited for, writes or reads");
      device->host_waits(*device->record_copies());
      device->copy_to_device(b.get(), back.get(), n * 4);
      device->compute_waits(*device->record_copies());
      QCOMPARE(static_cast<float*>(b.get())[n - 1], 2.0f * static_cast<float>(n - 1));

      // Memory that compute writes first (a gradient chunk): on a GPU its block may still be read
      // by kernels queued for the tensor it held before, so a copy into or out of it before the
      // copies waited for compute recorded since its allocation is refused; after, it runs.
      {
        const auto before = device->record_compute();
        c10::DataPtr gradients =
            device->allocate(4096, "gradient chunk 3", train::FirstWriter::compute);
        device->copies_wait(*before);
        expect_error([&] { device->copy_to_host(back.get(), gradients.get(), 4096); },
                     ErrorKind::Internal,
                     "a copy touches gradient chunk 3, memory allocated for compute");
        expect_error(
            [&] {
              device->copy_to_device(static_cast<char*>(gradients.get()) + 1024, host.get(), 64);
            },
            ErrorKind::Internal, "before the copies waited for compute");
        device->copies_wait(*device->record_compute());
        device->copy_to_host(back.get(), gradients.get(), 4096);
        device->host_waits(*device->record_copies());
      }

      const train::DeviceTraffic traffic = device->traffic();
      QCOMPARE(traffic.bytes_to_device, std::uint64_t{2 * n * 4});
      QCOMPARE(traffic.bytes_to_host, std::uint64_t{2 * n * 4 + 4096});
      QCOMPARE(traffic.copies, std::uint64_t{5});
      QCOMPARE(device->peak(), std::uint64_t{2 * n * 4 + 4096});
    }
    QCOMPARE(device->used(), std::uint64_t{0});
    device->reset_peak();
    QCOMPARE(device->peak(), std::uint64_t{0});

    // A copy's host side is memory the tier gave (page-locked on a GPU, where a copy from or to
    // pageable memory would hold the host until done): other memory is refused, and so is a copy
    // past the end of a block the tier gave. Memory for disk I/O is aligned for O_DIRECT. Host
    // memory released with a copy of it queued goes after the copy (a GPU's caching host
    // allocator reuses a block only after the copies recorded on it).
    {
      auto pinned = train::make_device_tier("simulated", 2 * n * 4, "strategy.options.device");
      c10::DataPtr up = pinned->allocate(n * 4, "chunk 6", train::FirstWriter::copies);
      std::vector<float> pageable(n, 1.0f);
      expect_error([&] { pinned->copy_to_device(up.get(), pageable.data(), n * 4); },
                   ErrorKind::Internal,
                   "simulated: a copy to the device reads host memory that no allocate_host* of "
                   "the tier gave (262144 bytes)");
      c10::DataPtr io = pinned->allocate_host_io(5000);
      QCOMPARE(reinterpret_cast<std::uintptr_t>(io.get()) % train::DeviceTier::kHostIoAlignment,
               std::uintptr_t{0});
      expect_error([&] { pinned->copy_to_host(static_cast<char*>(io.get()) + 8, up.get(), 5000); },
                   ErrorKind::Internal, "a copy to the host writes host memory that no");
      {
        c10::DataPtr source = pinned->allocate_host_resident(n * 4);
        std::fill_n(static_cast<float*>(source.get()), n, 5.0f);
        pinned->copy_to_device(up.get(), source.get(), n * 4);
      }
      pinned->compute_waits(*pinned->record_copies());
      QCOMPARE(static_cast<float*>(up.get())[n - 1], 5.0f);
      // The two directions ordered through the compute, as on a GPU: the compute waits for the
      // copy down, the copies up wait for compute recorded after that; the compute's wait alone
      // orders nothing of the copies (refused even though the copy down has run here).
      c10::DataPtr staging = pinned->allocate_host(n * 4);
      c10::DataPtr again = pinned->allocate(n * 4, "chunk 7", train::FirstWriter::copies);
      // (The copy down of what came up is ordered after it the same way.)
      expect_error([&] { pinned->copy_to_host(staging.get(), up.get(), n * 4); },
                   ErrorKind::Internal,
                   "a copy to the host (262144 bytes) touches memory that a "
                   "copy to the device queued before it");
      pinned->copies_down_wait(*pinned->record_compute());
      pinned->copy_to_host(staging.get(), up.get(), n * 4);
      pinned->compute_waits(*pinned->record_copies());
      expect_error([&] { pinned->copy_to_device(again.get(), staging.get(), n * 4); },
                   ErrorKind::Internal, "the two directions run on separate copy streams");
      pinned->copies_wait(*pinned->record_compute());
      pinned->copy_to_device(again.get(), staging.get(), n * 4);
      pinned->compute_waits(*pinned->record_copies());
      QCOMPARE(static_cast<float*>(again.get())[n - 1], 5.0f);
    }

    // A copy runs only once something waits for it (a GPU's may run that late): the host memory
    // it reads must not change until then. Changed, the wait that runs the copy says so.
    {
      auto lazy = train::make_device_tier("simulated", n * 4, "strategy.options.device");
      c10::DataPtr up = lazy->allocate(n * 4, "chunk 5", train::FirstWriter::copies);
      c10::DataPtr from = lazy->allocate_host(n * 4);
      std::fill_n(static_cast<float*>(from.get()), n, 1.0f);
      lazy->copy_to_device(up.get(), from.get(), n * 4);
      const auto queued = lazy->record_copies();
      QVERIFY(!lazy->done(*queued));              // nothing waited: not run yet
      static_cast<float*>(from.get())[3] = 2.0f;  // the host writes its source before any wait
      expect_error([&] { lazy->compute_waits(*queued); }, ErrorKind::Internal,
                   "the host memory a copy to the device reads (262144 bytes) changed after the "
                   "copy was queued");
    }

    // Memory can outlive its tier (a model's parameters over Gemini's chunks are freed after the
    // plugin that owns the tier): the copy into it is done when the tier goes, and releasing it
    // afterwards frees it without reaching the tier (a use after free, under tests/sanitize's
    // ASan, before TierLifetime; the GPU check's gemini runs crashed at such a release).
    c10::DataPtr survivor =
        device->allocate(n * 4, "chunk kept by the model", train::FirstWriter::copies);
    c10::DataPtr source = device->allocate_host(n * 4);
    std::fill_n(static_cast<float*>(source.get()), n, 3.0f);
    device->copy_to_device(survivor.get(), source.get(), n * 4);
    device.reset();  // its copy thread drains the queue first
    QCOMPARE(static_cast<float*>(survivor.get())[n - 1], 3.0f);
    survivor.clear();
  }

  void plugins_name_their_device_rule() {
    // ddp, zero and gemini take cuda (refused here only because there is no GPU; tests/gpu runs
    // them). A name that is no device is
    // invalid, auto and cpu train on the CPU (on a machine with a GPU, auto also logs a warning
    // that the GPU stays unused: tests/gpu).
    for (const std::string name : {"ddp", "zero", "gemini"}) {
      auto model = tiny_llama();
      std::vector<train::NamedTensor> trainable;
      for (const auto& item : model->named_parameters())
        trainable.push_back({item.key(), item.value()});
      train::PluginOptions options;
      options.run_dir = fresh_dir("device-" + name);
      std::vector<std::string> logged;
      options.log = [&](const std::string& level, const std::string& message) {
        logged.push_back(level + ": " + message);
      };
      options.device = "cuda";
      if (!torch::cuda::is_available())
        expect_error([&] { train::make_plugin(name)->prepare(*model, trainable, options); },
                     ErrorKind::Unsupported, "no CUDA device is present");
      options.device = "gpu";
      expect_error([&] { train::make_plugin(name)->prepare(*model, trainable, options); },
                   ErrorKind::InvalidInput, "\"gpu\" is not a device for " + name);
      for (const std::string device : {"auto", "cpu"}) {
        // A plugin that prepared a model holds its weights (gemini's chunks) until it goes: each
        // gets a model of its own.
        auto fresh = tiny_llama();
        std::vector<train::NamedTensor> its_trainable;
        for (const auto& item : fresh->named_parameters())
          its_trainable.push_back({item.key(), item.value()});
        options.device = device;
        auto plugin = train::make_plugin(name);
        plugin->prepare(*fresh, its_trainable, options);
        QVERIFY2(plugin->device().is_cpu(), (name + " " + device).c_str());
      }
      QVERIFY(logged.empty() || torch::cuda::is_available());
    }
  }

  void ddp_refuses_what_it_cannot_do() {
    auto model = tiny_llama();
    std::vector<train::NamedTensor> trainable;
    for (const auto& item : model->named_parameters())
      trainable.push_back({item.key(), item.value()});
    train::PluginOptions options;
    if (!torch::cuda::is_available()) {
      options.device = "cuda";
      expect_error([&] { train::make_plugin("ddp")->prepare(*model, trainable, options); },
                   ErrorKind::Unsupported, "no CUDA device is present");
    }
    options.device = "cpu";
    options.strategy_options = {{"bucket_size", "lots"}};
    expect_error([&] { train::make_plugin("ddp")->prepare(*model, trainable, options); },
                 ErrorKind::InvalidInput, "strategy.options.bucket_size");
    options.strategy_options = {{"bucket_size", "1MiB"}};
    options.process.rank = 1;
    options.process.world_size = 2;  // without the runtime's group
    expect_error([&] { train::make_plugin("ddp")->prepare(*model, trainable, options); },
                 ErrorKind::Internal, "no data-parallel group");
    options.process = {};
    QVERIFY(train::make_plugin("ddp")->runs_distributed());
    train::make_plugin("ddp")->prepare(*model, trainable, options);  // one process: no group
  }

  void mixed_precision_makes_masters_and_scales_the_loss() {
    train::MixedPrecision fp32(train::Precision::Fp32, torch::kCPU);
    const torch::Tensor w = torch::randn({3, 4});
    QVERIFY(!fp32.keeps_masters());
    QCOMPARE(fp32.make_masters({{"w", w}}, torch::kCPU)[0].tensor.unsafeGetTensorImpl(),
             w.unsafeGetTensorImpl());  // in fp32 the trained tensor is the master
    QCOMPARE(fp32.backward_multiplier(0.25), 0.25);

    train::MixedPrecision bf16(train::Precision::Bf16, torch::kCPU);
    QCOMPARE(bf16.compute_dtype(), torch::kBFloat16);
    const auto masters = bf16.make_masters({{"w", w}}, torch::kCPU);
    QCOMPARE(masters[0].tensor.scalar_type(), torch::kFloat32);
    QVERIFY(torch::equal(masters[0].tensor, w));
    const torch::Tensor before = w.clone();
    masters[0].tensor.add_(1.0);  // a copy: rounding the model to bf16 later cannot reach it
    QVERIFY(torch::equal(w, before));
    const torch::Tensor g = torch::randn({3, 4}).to(torch::kBFloat16);
    QVERIFY(torch::equal(bf16.master_gradient(g), g.to(torch::kFloat32)));
    QVERIFY(bf16.accept_step(std::nan("")));  // only fp16 skips steps

    expect_error([] { train::MixedPrecision(train::Precision::Fp16, torch::kCPU); },
                 ErrorKind::Unsupported, "fp16");
    // The loss-scaling arithmetic needs no GPU: tensors stay on the CPU, the device only allows it.
    train::MixedPrecision fp16(train::Precision::Fp16, torch::Device(torch::kCUDA, 0));
    QCOMPARE(fp16.backward_multiplier(0.5), 0.5 * 65536.0);
    const torch::Tensor scaled = torch::full({2}, 0.25 * 65536.0).to(torch::kFloat16);
    QVERIFY(torch::equal(fp16.master_gradient(scaled), torch::full({2}, 0.25)));
    QCOMPARE(scaled.to(torch::kFloat32)[0].item<double>(),
             0.25 * 65536.0);  // not unscaled in place
    QVERIFY(!fp16.accept_step(std::numeric_limits<double>::infinity()));
    QVERIFY(fp16.accept_step(1.0));
    nlohmann::json state;
    fp16.write_state(state);
    QCOMPARE(state.at("loss_scale").get<double>(), 32768.0);
    QCOMPARE(state.at("loss_scale_good_steps").get<int>(), 1);
    train::MixedPrecision resumed(train::Precision::Fp16, torch::Device(torch::kCUDA, 0));
    resumed.restore_state(state, "checkpoint-7");
    QCOMPARE(resumed.backward_multiplier(1.0), 32768.0);
    expect_error([&] { resumed.restore_state(nlohmann::json::object(), "checkpoint-7"); },
                 ErrorKind::InvalidInput, "checkpoint-7");
  }

  void schedules_match_transformers_values() {
    // base lr 1, warmup 2, 10 steps: transformers' lambdas evaluated by hand.
    optim::LrSchedule constant(optim::ScheduleKind::Constant, 1.0, 2, 10);
    QCOMPARE(constant.factor(0), 0.0);
    QCOMPARE(constant.factor(1), 0.5);
    QCOMPARE(constant.factor(7), 1.0);
    optim::LrSchedule linear(optim::ScheduleKind::Linear, 2.0, 2, 10);
    QCOMPARE(linear.lr(1), 1.0);
    QCOMPARE(linear.factor(2), 1.0);
    QCOMPARE(linear.factor(6), 0.5);  // (10 - 6) / (10 - 2)
    QCOMPARE(linear.factor(10), 0.0);
    QCOMPARE(linear.factor(12), 0.0);  // clamped, never negative
    optim::LrSchedule cosine(optim::ScheduleKind::Cosine, 1.0, 2, 10);
    QCOMPARE(cosine.factor(2), 1.0);
    QVERIFY(std::abs(cosine.factor(4) - 0.5 * (1 + std::cos(M_PI * 0.25))) < 1e-15);
    QVERIFY(std::abs(cosine.factor(6) - 0.5) < 1e-15);
    QVERIFY(std::abs(cosine.factor(10)) < 1e-15);
    optim::LrSchedule no_warmup(optim::ScheduleKind::Linear, 1.0, 0, 4);
    QCOMPARE(no_warmup.factor(0), 1.0);
    QCOMPARE(no_warmup.factor(1), 0.75);
    expect_error([] { optim::schedule_from_name("cosin"); }, ErrorKind::InvalidInput, "cosin");
  }

  void adamw_matches_closed_form() {
    // Two steps on float64 tensors, against the formulas of torch.optim.AdamW written out.
    const double lr = 0.1, b1 = 0.9, b2 = 0.99, eps = 1e-3, wd = 0.5;
    torch::Tensor p = torch::tensor({1.0, -2.0}, torch::kFloat64).set_requires_grad(true);
    optim::AdamW adam({{"p", p}}, {b1, b2, eps, wd});
    const double g1[2] = {0.5, -0.25}, g2[2] = {-1.0, 0.75};
    double expected[2] = {1.0, -2.0};
    double m[2] = {0, 0}, v[2] = {0, 0};
    for (int step = 1; step <= 2; ++step) {
      const double* g = step == 1 ? g1 : g2;
      p.mutable_grad() = torch::tensor({g[0], g[1]}, torch::kFloat64);
      adam.step(lr);
      for (int i = 0; i < 2; ++i) {
        expected[i] *= 1 - lr * wd;
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        const double mhat = m[i] / (1 - std::pow(b1, step));
        const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, step)) + eps;
        expected[i] -= lr * mhat / denom;
      }
      for (int i = 0; i < 2; ++i)
        QVERIFY2(std::abs(p[i].item<double>() - expected[i]) < 1e-12,
                 qPrintable(QString("step %1 elem %2: %3 vs %4")
                                .arg(step)
                                .arg(i)
                                .arg(p[i].item<double>())
                                .arg(expected[i])));
    }
    QCOMPARE(adam.steps_taken(), std::int64_t{2});
    QCOMPARE(adam.state_tensors().size(), std::size_t{2});
  }

  void fused_adamw_lists_match_the_per_op_update() {
    // The multi-tensor kernel AdamW::step uses for GPU tensors (and gemini's device Adam), run
    // here on CPU tensors, against the per-op formulas over three steps with weight decay.
    torch::manual_seed(7);
    const optim::AdamWOptions options{0.9, 0.99, 1e-6, 0.1};
    std::vector<torch::Tensor> fused = {torch::randn({5, 3}), torch::randn({17})};
    std::vector<torch::Tensor> ops = {fused[0].clone(), fused[1].clone()};
    const std::vector<torch::Tensor> start = {fused[0].clone(), fused[1].clone()};
    std::vector<torch::Tensor> m_fused, v_fused, m_ops, v_ops;
    for (const auto& t : fused) {
      m_fused.push_back(torch::zeros_like(t));
      v_fused.push_back(torch::zeros_like(t));
      m_ops.push_back(torch::zeros_like(t));
      v_ops.push_back(torch::zeros_like(t));
    }
    for (std::int64_t step = 1; step <= 3; ++step) {
      optim::FusedAdamWLists lists{fused, {}, m_fused, v_fused};
      for (std::size_t i = 0; i < fused.size(); ++i) {
        torch::Tensor g = torch::randn(fused[i].sizes());
        lists.grads.push_back(g);
        optim::adamw_step_ops(ops[i], g, m_ops[i], v_ops[i], 0.05, options, 0.1, step);
      }
      optim::adamw_fused_step(lists, 0.05, options, 0.1, step);
    }
    for (std::size_t i = 0; i < fused.size(); ++i) {
      QVERIFY2(torch::allclose(fused[i], ops[i], 1e-6, 1e-7),
               qPrintable(QString("tensor %1 differs by %2")
                              .arg(i)
                              .arg((fused[i] - ops[i]).abs().max().item<double>())));
      QVERIFY(torch::allclose(m_fused[i], m_ops[i], 1e-6, 1e-7));
      QVERIFY(torch::allclose(v_fused[i], v_ops[i], 1e-6, 1e-7));
      QVERIFY(!torch::allclose(fused[i], start[i], 1e-3, 1e-3));  // the steps moved it
    }
  }

  // The float64 norm a slice at a time: the whole tensor's figure (to float64 rounding), and no
  // float64 copy of the whole tensor at the peak (at::linalg_vector_norm's dtype makes one: the
  // resident set's peak, reset before each, grows by about twice the tensor's bytes there).
  void float64_norm_takes_a_slice_at_a_time() {
    torch::manual_seed(5);
    const torch::Tensor g = torch::randn({(std::int64_t{1} << 22) * 6 + 12345});  // 96 MiB
    const double whole = at::linalg_vector_norm(g, 2, {}, false, torch::kFloat64).item<double>();
    const torch::Tensor sliced = optim::norm_in_float64(g);
    QCOMPARE(sliced.scalar_type(), torch::kFloat64);
    QVERIFY(std::abs(sliced.item<double>() - whole) <= 1e-12 * whole);
    QCOMPARE(
        optim::norm_in_float64(g.narrow(0, 0, 1000)).item<double>(),
        at::linalg_vector_norm(g.narrow(0, 0, 1000), 2, {}, false, torch::kFloat64).item<double>());
    if (!tessera::core::reset_process_peak_rss())
      QSKIP("the kernel does not let the peak be reset");
    const auto peak_growth = [&](const std::function<void()>& work) -> double {
      tessera::core::reset_process_peak_rss();
      const double before = static_cast<double>(tessera::core::process_peak_rss());
      work();
      return (static_cast<double>(tessera::core::process_peak_rss()) - before) / (1 << 20);  // MiB
    };
    const double by_slices = peak_growth([&] { (void)optim::norm_in_float64(g); });
    const double by_copy =
        peak_growth([&] { (void)at::linalg_vector_norm(g, 2, {}, false, torch::kFloat64); });
    qInfo("peak growth: %.0f MiB by slices, %.0f MiB with a float64 copy", by_slices, by_copy);
    QVERIFY2(by_copy > 150.0, "the float64 copy this test compares against was not seen");
    QVERIFY(by_slices < 64.0);
  }

  // A GPU tier's page-locked buffers (host_block_pool.h): a block is its request rounded to a
  // page, not to a power of two; one given back is reused for the same size only once its copies
  // are done, and for a size up to an eighth smaller, not for a larger one; what is kept is
  // counted; where the system refuses a block, kept blocks whose copies are done make room, as
  // they do when a phase ends (release_kept); the pool's end waits for the copies of the others.
  void host_block_pool_reuses_blocks_at_their_size_after_their_copies() {
    std::map<void*, std::size_t> system;  // what the "driver" has locked
    std::vector<bool> released_done;      // each release: were its copies known done
    const std::uint64_t locked_limit = 128u << 20;
    const auto locked = [&] {
      std::uint64_t bytes = 0;
      for (const auto& [memory, size] : system) bytes += size;
      return bytes;
    };
    const auto make_pool = [&](std::size_t page) {
      return std::make_unique<train::HostBlockPool>(
          [&, page](std::size_t bytes) -> void* {
            if (bytes % page != 0) throw std::logic_error("not in pages");
            if (locked() + bytes > locked_limit) throw std::bad_alloc();
            void* memory = std::aligned_alloc(page, bytes);
            system[memory] = bytes;
            return memory;
          },
          [&](void* memory, std::size_t bytes, bool copies_done) {
            QCOMPARE(system.at(memory), bytes);
            system.erase(memory);
            std::free(memory);
            released_done.push_back(copies_done);
          },
          page);
    };
    {
      const auto owned = make_pool(train::HostBlockPool::kPage);
      train::HostBlockPool& pool = *owned;
      const std::size_t shard = 24'000'000;  // 22.9 MiB: a power of two would lock 32
      void* a = pool.take(shard);
      QCOMPARE(reinterpret_cast<std::uintptr_t>(a) % train::HostBlockPool::kPage, 0u);
      QCOMPARE(locked(), pool.rounded(shard));
      QVERIFY(locked() < shard + train::HostBlockPool::kPage);

      bool a_copies_done = false;
      pool.give_back(a, [&] { return a_copies_done; });
      QCOMPARE(pool.figures().kept, pool.rounded(shard));
      QCOMPARE(pool.figures().taken, 0u);
      // Its copies pending: a second block, not the first.
      void* b = pool.take(shard);
      QVERIFY(b != a);
      QCOMPARE(pool.figures().allocations, 2u);
      a_copies_done = true;
      // Done: reused for its size and for one an eighth smaller, never for a larger one.
      QCOMPARE(pool.take(shard - shard / 9), a);
      pool.give_back(a, [] { return true; });
      void* larger = pool.take(shard + train::HostBlockPool::kPage);
      QVERIFY(larger != a && larger != b);
      QCOMPARE(pool.take(shard), a);
      QCOMPARE(pool.figures().allocations, 3u);
      // Far smaller: a block of its own.
      void* small = pool.take(1000);
      QVERIFY(small != a && small != b && small != larger);
      QCOMPARE(system.at(small), train::HostBlockPool::kPage);

      // The limit reached: a block of a size kept, whose copies are done, makes room; one whose
      // copies are pending never goes.
      pool.give_back(larger, [] { return true; });
      pool.give_back(b, [] { return false; });
      const std::uint64_t before = locked();
      void* big = pool.take(locked_limit - before + pool.rounded(shard));
      QVERIFY(big != nullptr);
      QVERIFY(!system.count(larger));
      QVERIFY(system.count(b));
      QCOMPARE(pool.figures().kept, pool.rounded(shard));  // b
      // Nothing left to release: the refusal is the caller's.
      bool refused = false;
      try {
        (void)pool.take(locked_limit);
      } catch (const std::bad_alloc&) {
        refused = true;
      }
      QVERIFY(refused);
      // A phase over: the kept blocks whose copies are done go, without waiting for copies.
      pool.give_back(big, [] { return true; });
      pool.give_back(small, [] { return true; });
      released_done.clear();
      QCOMPARE(pool.release_kept(), pool.rounded(locked_limit - before + pool.rounded(shard)) +
                                        train::HostBlockPool::kPage);
      QVERIFY(!system.count(big) && !system.count(small) && system.count(b));
      QCOMPARE(released_done, std::vector<bool>({true, true}));
      pool.give_back(a, [] { return true; });
      QCOMPARE(pool.figures().taken, 0u);
      released_done.clear();
    }
    QVERIFY2(system.empty(), "the pool's end releases every block it kept");
    // b's copies never said done: its release waited for them.
    QCOMPARE(std::count(released_done.begin(), released_done.end(), false), 1);

    // 64 KiB pages (some ARM hosts): blocks in whole pages, aligned to them.
    {
      const auto pool = make_pool(std::size_t{1} << 16);
      void* block = pool->take(5000);
      QCOMPARE(system.at(block), std::size_t{1} << 16);
      QCOMPARE(reinterpret_cast<std::uintptr_t>(block) % (std::size_t{1} << 16), 0u);
      pool->give_back(block, [] { return true; });
    }
    QVERIFY(system.empty());
  }

  void clipping_scales_to_max_norm() {
    torch::Tensor a = torch::zeros({1}).set_requires_grad(true);
    torch::Tensor b = torch::zeros({1}).set_requires_grad(true);
    a.mutable_grad() = torch::tensor({3.0f});
    b.mutable_grad() = torch::tensor({4.0f});
    const double norm = optim::clip_grad_norm({a, b}, 1.0);
    QVERIFY(std::abs(norm - 5.0) < 1e-6);
    QVERIFY(std::abs(a.grad().item<double>() - 3.0 / (5.0 + 1e-6)) < 1e-6);
    QVERIFY(std::abs(b.grad().item<double>() - 4.0 / (5.0 + 1e-6)) < 1e-6);
    // Below the limit nothing changes.
    a.mutable_grad() = torch::tensor({0.3f});
    b.mutable_grad() = torch::tensor({0.4f});
    QVERIFY(std::abs(optim::clip_grad_norm({a, b}, 1.0) - 0.5) < 1e-6);
    QVERIFY(std::abs(a.grad().item<double>() - 0.3) < 1e-6);
  }

  void loss_scaler_backs_off_and_grows() {
    optim::DynamicLossScaler s(1024.0, 2.0, 0.5, 2);
    QVERIFY(!s.update(false));
    QCOMPARE(s.scale(), 512.0);
    QVERIFY(s.update(true));
    QVERIFY(s.update(true));
    QCOMPARE(s.scale(), 1024.0);
  }

  void resume_ignores_torn_checkpoints() {
    const fs::path run = fresh_dir("torn");
    auto write_one = [](const fs::path& dir) {
      tessera::core::write_file_atomic(dir / "a.bin", "hello");
    };
    train::write_checkpoint(run, 2, write_one);
    // A save killed before its manifest: the temporary folder, and a renamed folder without one.
    fs::create_directories(run / "checkpoint-4.tmp-deadbeef");
    write_file(run / "checkpoint-4.tmp-deadbeef" / "a.bin", "hel");
    fs::create_directories(run / "checkpoint-3");
    write_file(run / "checkpoint-3" / "a.bin", "hello");
    // A complete-looking checkpoint whose file was truncated afterwards.
    fs::path five = train::write_checkpoint(run, 5, write_one);
    write_file(five / "a.bin", "hell");
    // And one whose bytes changed but not its size.
    fs::path six = train::write_checkpoint(run, 6, write_one);
    write_file(six / "a.bin", "jello");
    std::vector<std::string> logs;
    auto found =
        train::find_resume_checkpoint(run, [&](const std::string& m) { logs.push_back(m); });
    QCOMPARE(found.step, std::int64_t{2});
    QCOMPARE(found.path, run / "checkpoint-2");
    QCOMPARE(logs.size(), std::size_t{4});  // tmp, 6 (checksum), 5 (size), 3 (no manifest)
    bool named_three = false;
    for (const auto& m : logs)
      named_three |=
          m.find("checkpoint-3") != std::string::npos && m.find("manifest") != std::string::npos;
    QVERIFY(named_three);
    // Pointing at a torn checkpoint directly is an error naming it.
    expect_error([&] { train::find_resume_checkpoint(five, {}); }, ErrorKind::InvalidInput,
                 five.string());
  }

  void resume_without_checkpoint_names_the_folder() {
    const fs::path run = fresh_dir("empty");
    fs::create_directories(run / "checkpoint-1.tmp-x");
    expect_error([&] { train::find_resume_checkpoint(run, {}); }, ErrorKind::InvalidInput,
                 run.string());
    expect_error([&] { train::find_resume_checkpoint(run / "missing", {}); },
                 ErrorKind::InvalidInput, (run / "missing").string());
  }

  void keep_last_deletes_only_after_the_new_one_is_complete() {
    const fs::path run = fresh_dir("keep");
    auto write_one = [](const fs::path& dir) {
      tessera::core::write_file_atomic(dir / "a.bin", "x");
    };
    for (int step = 1; step <= 2; ++step) {
      auto p = train::write_checkpoint(run, step, write_one);
      train::prune_checkpoints(run, 2, p);
    }
    // While checkpoint-3 is being written, both older ones are still there.
    bool old_present_during_write = false;
    auto p3 = train::write_checkpoint(run, 3, [&](const fs::path& dir) {
      old_present_during_write =
          fs::exists(run / "checkpoint-1" / "manifest.json") && fs::exists(run / "checkpoint-2");
      write_one(dir);
    });
    QVERIFY(old_present_during_write);
    train::prune_checkpoints(run, 2, p3);
    QVERIFY(!fs::exists(run / "checkpoint-1"));
    QVERIFY(fs::exists(run / "checkpoint-2"));
    QVERIFY(fs::exists(run / "checkpoint-3"));
    // A save that fails halfway leaves the complete ones alone and no temporary folder.
    try {
      train::write_checkpoint(run, 4, [](const fs::path& dir) {
        tessera::core::write_file_atomic(dir / "a.bin", "partial");
        throw Error(ErrorKind::Io, "disk full (simulated)");
      });
      QFAIL("expected the simulated failure");
    } catch (const Error&) {
    }
    std::size_t entries = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(run)) ++entries;
    QCOMPARE(entries, std::size_t{2});
    QCOMPARE(train::find_resume_checkpoint(run, {}).step, std::int64_t{3});
  }

  void resume_continues_exactly() {
    // fp32: 6 steps in one go equal 3 steps, a stop with a checkpoint, a resume and 3 more.
    auto options = [](const fs::path& out) {
      train::TrainerOptions o;
      o.training.steps = 6;
      o.training.learning_rate = 5e-3;
      o.training.warmup_steps = 2;
      o.training.schedule = "cosine";
      o.training.gradient_accumulation = 2;
      o.training.weight_decay = 0.01;
      o.output_dir = out;
      o.device = "cpu";
      return o;
    };
    const fs::path a = fresh_dir("exact-a"), b = fresh_dir("exact-b");
    auto batches = tiny_batches(5);  // odd count: the resume lands mid-epoch
    train::FixedBatchSource src_a(batches, true, 42);
    train::Trainer ta(tiny_llama(), options(a));
    auto full = ta.train(src_a);
    QCOMPARE(full.losses.size(), std::size_t{6});
    QVERIFY(full.losses.back() < full.losses.front());

    auto first = options(b);
    first.stop_after_steps = 3;
    train::FixedBatchSource src_b1(batches, true, 42);
    auto part1 = train::Trainer(tiny_llama(), first).train(src_b1);
    QCOMPARE(part1.status, std::string("stopped"));
    QVERIFY(fs::exists(b / "checkpoint-3" / "manifest.json"));
    auto second = options(b);
    second.resume = b;
    train::FixedBatchSource src_b2(batches, true, 42);
    auto part2 = train::Trainer(tiny_llama(), second).train(src_b2);
    QCOMPARE(part2.start_step, std::int64_t{3});
    QCOMPARE(part2.status, std::string("completed"));
    std::vector<double> joined = part1.losses;
    joined.insert(joined.end(), part2.losses.begin(), part2.losses.end());
    QCOMPARE(joined.size(), full.losses.size());
    for (std::size_t i = 0; i < joined.size(); ++i) QCOMPARE(joined[i], full.losses[i]);
  }

  void lora_trains_adapters_only_and_merges() {
    auto m = tiny_llama();
    const torch::Tensor q_before =
        m->named_parameters()["model.layers.0.self_attn.q_proj.weight"].clone();
    train::TrainerOptions o;
    o.training.steps = 3;
    o.training.learning_rate = 1e-2;
    o.method.type = "lora";
    o.method.lora_rank = 4;
    o.method.lora_alpha = 8;
    o.device = "cpu";
    train::Trainer t(m, o);
    QCOMPARE(t.lora()->adapters().size(), std::size_t{8});  // q and v, 2 layers, A and B
    QCOMPARE(t.lora()->adapters()[0].name,
             std::string("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
    auto batches = tiny_batches(2);
    train::FixedBatchSource src(batches, false, 1);
    t.train(src);
    torch::NoGradGuard no_grad;
    QVERIFY(
        torch::equal(m->named_parameters()["model.layers.0.self_attn.q_proj.weight"], q_before));
    m->eval();
    model::ForwardInput in;
    in.input_ids = batches[0].input_ids;
    in.attention_mask = batches[0].attention_mask;
    t.lora()->refresh();
    torch::Tensor with_adapter = m->forward(in).logits;
    t.lora()->detach();
    torch::Tensor without = m->forward(in).logits;
    QVERIFY((with_adapter - without).abs().max().item<double>() > 1e-5);  // adapter trained
    t.lora()->merge();
    torch::Tensor merged = m->forward(in).logits;
    QVERIFY((merged - with_adapter).abs().max().item<double>() < 1e-5);
    QVERIFY(
        !torch::equal(m->named_parameters()["model.layers.0.self_attn.q_proj.weight"], q_before));
  }

  void clear_errors_for_unsupported_choices() {
    train::TrainerOptions o;
    o.training.steps = 1;
    o.device = "cpu";
    o.precision = "fp16";
    expect_error([&] { train::Trainer(tiny_llama(), o); }, ErrorKind::Unsupported, "fp16");
    o.precision = "fp32";
    o.method.type = "lora";
    o.method.lora_dropout = 1.0;
    expect_error([&] { train::Trainer(tiny_llama(), o); }, ErrorKind::InvalidInput, "lora_dropout");
    o.method.lora_dropout = 0.0;
    o.method.lora_targets = {"q_projj"};
    expect_error([&] { train::Trainer(tiny_llama(), o); }, ErrorKind::InvalidInput, "q_projj");
    o.method.type = "full";
    o.training.schedule = "cosin";
    expect_error([&] { train::Trainer(tiny_llama(), o); }, ErrorKind::InvalidInput, "cosin");
  }

  void activation_checkpoint_gives_the_same_gradients() {
    // Two layers with dropout: checkpointed (recomputed in backward, dropout replayed) and plain
    // give identical gradients for the input and both layers' weights.
    torch::manual_seed(0);
    const torch::Tensor w1_init = torch::randn({6, 6}), w2_init = torch::randn({6, 6});
    const torch::Tensor x_init = torch::randn({3, 6});
    auto run = [&](bool checkpoint) {
      torch::Tensor w1 = w1_init.clone().set_requires_grad(true);
      torch::Tensor w2 = w2_init.clone().set_requires_grad(true);
      torch::Tensor x = x_init.clone().set_requires_grad(true);
      auto layer = [](torch::Tensor w) {
        return [w](const torch::Tensor& h) {
          return torch::dropout(torch::tanh(torch::mm(h, w)), 0.3, /*train=*/true);
        };
      };
      torch::manual_seed(5);
      torch::Tensor h = checkpoint ? train::checkpointed(layer(w1), x) : layer(w1)(x);
      h = checkpoint ? train::checkpointed(layer(w2), h) : layer(w2)(h);
      (h * h).sum().backward();
      return std::vector<torch::Tensor>{x.grad(), w1.grad(), w2.grad(), h.detach()};
    };
    auto plain = run(false), recomputed = run(true);
    for (std::size_t i = 0; i < plain.size(); ++i) {
      QVERIFY(plain[i].defined() && recomputed[i].defined());
      QVERIFY(torch::equal(plain[i], recomputed[i]));
    }
    // The same with the layout-free dropout (model/dropout.h): the recomputation replays the
    // stream's sites from where the layer started, after the forward's scope has ended.
    auto run_layout_free = [&](bool checkpoint) {
      torch::Tensor w1 = w1_init.clone().set_requires_grad(true);
      torch::Tensor w2 = w2_init.clone().set_requires_grad(true);
      torch::Tensor x = x_init.clone().set_requires_grad(true);
      auto layer = [](torch::Tensor w) {
        return [w](const torch::Tensor& h) {
          return model::dropout(torch::tanh(torch::mm(h, w)), 0.3, /*training=*/true);
        };
      };
      torch::Tensor h;
      {
        model::DropoutScope scope({9, 1, 0, 0});
        h = checkpoint ? train::checkpointed(layer(w1), x) : layer(w1)(x);
        h = checkpoint ? train::checkpointed(layer(w2), h) : layer(w2)(h);
      }
      (h * h).sum().backward();
      return std::vector<torch::Tensor>{x.grad(), w1.grad(), w2.grad(), h.detach()};
    };
    auto plain_free = run_layout_free(false), recomputed_free = run_layout_free(true);
    for (std::size_t i = 0; i < plain_free.size(); ++i)
      QVERIFY(torch::equal(plain_free[i], recomputed_free[i]));
    QVERIFY(plain_free[3].eq(0).any().item<bool>());  // something was dropped
    QVERIFY(plain[0].abs().sum().item<double>() > 0);
    // A frozen input with trainable weights (LoRA's case) still gets weight gradients.
    torch::Tensor w = w1_init.clone().set_requires_grad(true);
    torch::Tensor y =
        train::checkpointed([w](const torch::Tensor& h) { return torch::mm(h, w); }, x_init);
    y.sum().backward();
    QVERIFY(w.grad().defined());
    QVERIFY(torch::allclose(w.grad(), x_init.sum(0).unsqueeze(1).expand({6, 6})));
  }

  void lora_with_dropout_trains() {
    // lora_dropout > 0: training runs with finite losses and moves both adapter matrices;
    // dropout is active in training mode only, so eval-mode logits are deterministic.
    for (const json& config : {llama_config(2, 16, 64), gpt2_config()}) {
      auto m = make_model(config);
      train::TrainerOptions o;
      o.training.steps = 4;
      o.training.learning_rate = 1e-2;
      o.method.type = "lora";
      o.method.lora_rank = 4;
      o.method.lora_alpha = 8;
      o.method.lora_dropout = 0.3;
      o.device = "cpu";
      train::Trainer t(m, o);
      std::vector<torch::Tensor> before;
      for (const auto& a : t.lora()->adapters()) before.push_back(a.tensor.detach().clone());
      auto batches = random_batches(2, 2, 8);
      train::FixedBatchSource src(batches, false, 1);
      auto r = t.train(src);
      QCOMPARE(r.losses.size(), std::size_t{4});
      for (double loss : r.losses) QVERIFY(std::isfinite(loss));
      const auto after = t.lora()->adapters();
      for (std::size_t i = 0; i < after.size(); ++i)
        QVERIFY2(!torch::equal(after[i].tensor, before[i]), after[i].name.c_str());
      QCOMPARE(t.lora()->adapter_config("base")["lora_dropout"].get<double>(), 0.3);
      torch::NoGradGuard no_grad;
      model::ForwardInput in;
      in.input_ids = batches[0].input_ids;
      in.attention_mask = batches[0].attention_mask;
      m->train();
      torch::Tensor train1 = m->forward(in).logits, train2 = m->forward(in).logits;
      QVERIFY(!torch::equal(train1, train2));  // dropout draws differ between forwards
      m->eval();
      torch::Tensor eval1 = m->forward(in).logits, eval2 = m->forward(in).logits;
      QVERIFY(torch::equal(eval1, eval2));
      // The adapter in eval mode is exactly the merged delta.
      t.lora()->merge();
      QVERIFY((m->forward(in).logits - eval1).abs().max().item<double>() < 1e-5);
    }
  }

  void activation_checkpointing_gives_the_same_training() {
    // fp32, dropout 0: 5 steps with per-layer recomputation equal 5 steps without (losses,
    // gradient norms, final weights), for llama and gpt2, full fine-tuning and LoRA.
    struct Case {
      json config;
      std::string method;
    };
    for (const Case& c : {Case{llama_config(2, 16, 64), "full"}, Case{gpt2_config(), "full"},
                          Case{llama_config(2, 16, 64), "lora"}, Case{gpt2_config(), "lora"}}) {
      auto run = [&](bool checkpointing) {
        auto m = make_model(c.config);
        train::TrainerOptions o;
        o.training.steps = 5;
        o.training.learning_rate = 1e-2;
        o.training.gradient_accumulation = 2;
        o.training.activation_checkpointing = checkpointing;
        o.method.type = c.method;
        o.device = "cpu";
        train::Trainer t(m, o);
        auto batches = random_batches(3, 2, 12);
        train::FixedBatchSource src(batches, true, 5);
        auto r = t.train(src);
        std::vector<torch::Tensor> weights;
        for (const auto& w : t.plugin().trainable_weights())
          weights.push_back(w.tensor.detach().clone());
        return std::make_pair(r, weights);
      };
      auto [plain, plain_weights] = run(false);
      auto [recomputed, recomputed_weights] = run(true);
      QCOMPARE(recomputed.losses.size(), std::size_t{5});
      for (std::size_t i = 0; i < plain.losses.size(); ++i) {
        QVERIFY(relative_difference(recomputed.losses[i], plain.losses[i]) < 1e-6);
        QVERIFY(relative_difference(recomputed.grad_norms[i], plain.grad_norms[i]) < 1e-6);
      }
      QVERIFY(plain.losses.back() < plain.losses.front());
      for (std::size_t i = 0; i < plain_weights.size(); ++i)
        QVERIFY(torch::allclose(recomputed_weights[i], plain_weights[i], 1e-5, 1e-7));
    }
  }

  void dropout_does_not_depend_on_the_batch_layout() {
    // GPT-2 with its dropout (0.1 on embeddings, attention probabilities and residuals), full
    // and LoRA (lora_dropout 0.1): one micro-batch of 4 rows per step trains to the losses of 2
    // micro-batches of 2 rows with gradient accumulation, with and without recomputation (the
    // masks follow the rows, model/dropout.h). Dropout does act: the losses differ from
    // dropout 0's.
    json with_dropout = gpt2_config();
    with_dropout["attn_pdrop"] = with_dropout["resid_pdrop"] = with_dropout["embd_pdrop"] = 0.1;
    const std::vector<train::Batch> fours = random_batches(3, 4, 12);
    std::vector<train::Batch> twos;
    for (const train::Batch& b : fours)
      for (std::int64_t half = 0; half < 2; ++half)
        twos.push_back({b.input_ids.narrow(0, 2 * half, 2), b.attention_mask.narrow(0, 2 * half, 2),
                        b.labels.narrow(0, 2 * half, 2), torch::Tensor()});
    for (const std::string method : {"full", "lora"}) {
      auto run = [&](const json& config, const std::vector<train::Batch>& batches,
                     std::int64_t accumulation, bool checkpointing) {
        train::TrainerOptions o;
        o.training.steps = 3;
        o.training.learning_rate = 1e-2;
        o.training.gradient_accumulation = accumulation;
        o.training.activation_checkpointing = checkpointing;
        o.method.type = method;
        o.method.lora_dropout = 0.1;
        o.device = "cpu";
        train::Trainer t(make_model(config), o);
        train::FixedBatchSource src(batches, false, 1);
        return t.train(src).losses;
      };
      const std::vector<double> one = run(with_dropout, fours, 1, false);
      for (const auto& other : {run(with_dropout, twos, 2, false), run(with_dropout, twos, 2, true),
                                run(with_dropout, fours, 1, true)}) {
        QCOMPARE(other.size(), one.size());
        for (std::size_t i = 0; i < one.size(); ++i)
          QVERIFY2(relative_difference(other[i], one[i]) < 1e-5,
                   (method + " step " + std::to_string(i) + ": " + std::to_string(other[i]) +
                    " vs " + std::to_string(one[i]))
                       .c_str());
      }
      json no_dropout = with_dropout;
      no_dropout["attn_pdrop"] = no_dropout["resid_pdrop"] = no_dropout["embd_pdrop"] = 0.0;
      const std::vector<double> plain = run(no_dropout, fours, 1, false);
      QVERIFY2(relative_difference(plain.back(), one.back()) > 1e-4,
               (method + ": " + std::to_string(plain.back()) + " vs " + std::to_string(one.back()))
                   .c_str());
    }
  }

  void activation_checkpointing_keeps_generation_and_eval_correct() {
    // With the wrapper set, a forward with a KV cache (grad mode on or off) runs the layers
    // directly: the cache holds each position once and the logits equal a plain forward.
    auto m = make_model(llama_config(2, 16, 64));
    m->eval();
    auto batches = random_batches(1, 1, 6);
    model::ForwardInput in;
    in.input_ids = batches[0].input_ids;
    in.attention_mask = batches[0].attention_mask;
    torch::Tensor plain = m->forward(in).logits.detach();
    m->layer_wrapper = &train::checkpointed;
    model::KVCache cache;
    in.cache = &cache;
    torch::Tensor cached = m->forward(in).logits;
    QCOMPARE(cache.length(), std::int64_t{6});
    QVERIFY(torch::allclose(cached, plain, 1e-6, 1e-7));
    in.cache = nullptr;
    QVERIFY(torch::allclose(m->forward(in).logits, plain, 1e-6, 1e-7));
  }

  void activation_checkpointing_lowers_peak_memory() {
    // A deeper, longer config: peak live tensor bytes of one training step (forward + backward)
    // with per-layer recomputation against without. Weights, gradients and optimizer state are
    // the same in both; the saved activations of all but one layer are not kept.
    auto measure = [](bool checkpointing) {
      auto m = make_model(llama_config(8, 64, 512));
      train::TrainerOptions o;
      o.training.steps = 1;
      o.training.learning_rate = 1e-3;
      o.training.activation_checkpointing = checkpointing;
      o.device = "cpu";
      train::Trainer t(m, o);
      auto batches = random_batches(1, 4, 256);
      train::FixedBatchSource src(batches, false, 1);
      auto& counter = CountingCpuAllocator::instance();
      counter.install();
      counter.reset_peak();
      const std::int64_t start = counter.live();
      t.train(src);
      const std::int64_t peak = counter.peak() - start;
      counter.uninstall();
      return peak;
    };
    const std::int64_t plain = measure(false), recomputed = measure(true);
    qInfo(
        "peak live tensor bytes of a step (llama 8 layers, hidden 64, batch 4 x 256): "
        "%lld without activation checkpointing, %lld with (%.2fx)",
        static_cast<long long>(plain), static_cast<long long>(recomputed),
        static_cast<double>(plain) / static_cast<double>(recomputed));
    QVERIFY(plain > 0 && recomputed > 0);
    QVERIFY(recomputed * 2 < plain);
  }

  void collate_pads_right_with_ignored_labels() {
    tessera::data::TokenizedExample a{{5, 6, 7}, {-100, 6, 7}, std::nullopt, {}, {}, std::nullopt,
                                      0};
    tessera::data::TokenizedExample b{{8}, {8}, std::nullopt, {}, {}, std::nullopt, 0};
    train::Batch batch = train::collate({&a, &b}, 0);
    QVERIFY(torch::equal(batch.input_ids,
                         torch::tensor({5, 6, 7, 8, 0, 0}, torch::kInt64).view({2, 3})));
    QVERIFY(torch::equal(batch.attention_mask,
                         torch::tensor({1, 1, 1, 1, 0, 0}, torch::kInt64).view({2, 3})));
    QVERIFY(torch::equal(batch.labels,
                         torch::tensor({-100, 6, 7, 8, -100, -100}, torch::kInt64).view({2, 3})));
    tessera::data::TokenizedExample bad{{1, 2}, {1}, std::nullopt, {}, {}, std::nullopt, 0};
    expect_error([&] { train::collate({&bad}, 0); }, ErrorKind::InvalidInput,
                 "1 labels for 2 tokens");
  }

  // Preference pairs: every chosen row first, then the rejected rows in the same order, padded
  // together, so the objective splits the batch in halves (train/preference.h).
  void collate_puts_chosen_rows_before_rejected_ones() {
    tessera::data::TokenizedExample p{
        {1, 2, 3}, {-100, 2, 3}, std::nullopt, {1, 4}, {-100, 4}, std::nullopt, 0};
    tessera::data::TokenizedExample q{
        {5, 6}, {-100, 6}, std::nullopt, {5, 7, 8, 9}, {-100, 7, 8, 9}, std::nullopt, 0};
    train::Batch batch = train::collate({&p, &q}, 0);
    QVERIFY(
        torch::equal(batch.input_ids,
                     torch::tensor({1, 2, 3, 0, 5, 6, 0, 0, 1, 4, 0, 0, 5, 7, 8, 9}, torch::kInt64)
                         .view({4, 4})));
    QVERIFY(torch::equal(batch.labels, torch::tensor({-100, 2, 3, -100, -100, 6, -100, -100, -100,
                                                      4, -100, -100, -100, 7, 8, 9},
                                                     torch::kInt64)
                                           .view({4, 4})));
    tessera::data::TokenizedExample single{{8}, {8}, std::nullopt, {}, {}, std::nullopt, 0};
    expect_error(
        [&] {
          train::collate({&p, &single}, 0);
        },
        ErrorKind::InvalidInput, "mixes preference pairs");
  }

  // KTO: each example's own row, then its prompt with the previous example's completion (the
  // last's for the first), every row cut to max_length, and the examples' desirability.
  void collate_adds_kto_mismatched_rows() {
    tessera::data::TokenizedExample a{{1, 2, 3}, {-100, 2, 3}, std::nullopt, {}, {}, true, 1};
    tessera::data::TokenizedExample b{
        {4, 5, 6, 7}, {-100, -100, 6, 7}, std::nullopt, {}, {}, false, 2};
    train::Batch batch = train::collate({&a, &b}, 0, 4);
    // rows: a; b; a's prompt + b's completion; b's prompt + a's completion
    QVERIFY(
        torch::equal(batch.input_ids,
                     torch::tensor({1, 2, 3, 0, 4, 5, 6, 7, 1, 6, 7, 0, 4, 5, 2, 3}, torch::kInt64)
                         .view({4, 4})));
    QVERIFY(torch::equal(batch.labels, torch::tensor({-100, 2, 3, -100, -100, -100, 6, 7, -100, 6,
                                                      7, -100, -100, -100, 2, 3},
                                                     torch::kInt64)
                                           .view({4, 4})));
    QVERIFY(torch::equal(batch.desirable, torch::tensor({true, false})));
    // Cut to 3: the mismatched rows too.
    batch = train::collate({&a, &b}, 0, 3);
    QCOMPARE(batch.input_ids.size(1), 3);
    QVERIFY(torch::equal(batch.input_ids[3], torch::tensor({4, 5, 2}, torch::kInt64)));
  }

  void example_source_restores_its_order_from_a_position() {
    std::vector<tessera::data::TokenizedExample> examples;
    for (int i = 0; i < 7; ++i)
      examples.push_back({{i + 1}, {i + 1}, std::nullopt, {}, {}, std::nullopt, 0});
    train::ExampleBatchSource a(examples, 2, true, 9, 0);
    QCOMPARE(a.batches_per_epoch(), std::int64_t{4});  // the last batch holds one example
    std::vector<torch::Tensor> seen;
    for (int i = 0; i < 10; ++i) seen.push_back(a.next().input_ids);
    // Every example exactly once per epoch.
    std::vector<std::int64_t> epoch0;
    for (int i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < seen[i].size(0); ++j)
        epoch0.push_back(seen[i][j][0].item<std::int64_t>());
    std::sort(epoch0.begin(), epoch0.end());
    QCOMPARE(epoch0, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7}));
    train::ExampleBatchSource b(examples, 2, true, 9, 0);
    b.seek({1, 2});  // epoch 1, batch 2 = the 7th batch drawn
    for (int i = 6; i < 10; ++i) QVERIFY(torch::equal(b.next().input_ids, seen[i]));
    expect_error([&] { b.seek({0, 4}); }, ErrorKind::InvalidInput, "outside the data");
  }

  void evaluation_reports_mean_loss_and_perplexity() {
    train::TrainerOptions o;
    o.training.steps = 4;
    o.training.eval_every = 2;
    o.training.learning_rate = 1e-2;
    o.device = "cpu";
    auto m = tiny_llama();
    train::Trainer t(m, o);
    auto batches = tiny_batches(3);
    train::FixedBatchSource src(batches, false, 1);
    std::vector<train::Batch> held_out(batches.begin(), batches.begin() + 2);
    train::FixedBatchSource eval(held_out, false, 1);
    eval.next();  // evaluation always covers the whole set and restores the position
    auto r = t.train(src, &eval);
    QCOMPARE(r.evals.size(), std::size_t{2});
    QCOMPARE(r.evals[0].step, std::int64_t{2});
    QCOMPARE(r.evals[1].step, std::int64_t{4});
    QCOMPARE(eval.position().index, std::int64_t{1});
    torch::NoGradGuard no_grad;
    m->eval();
    double sum = 0;
    for (const auto& b : held_out) {
      model::ForwardInput in;
      in.input_ids = b.input_ids;
      in.attention_mask = b.attention_mask;
      in.labels = b.labels;
      sum += m->forward(in).loss.item<double>();
    }
    QVERIFY(std::abs(r.evals[1].loss - sum / 2) < 1e-6);
    QVERIFY(r.evals[1].perplexity && !r.evals[1].accuracy);
    QVERIFY(std::abs(*r.evals[1].perplexity - std::exp(r.evals[1].loss)) < 1e-9);
    QVERIFY(r.evals[1].loss < r.evals[0].loss);  // the held-out batches were trained on
  }

  void bf16_keeps_float32_masters() {
    train::TrainerOptions o;
    o.training.steps = 2;
    o.training.learning_rate = 1e-3;
    o.precision = "bf16";
    o.device = "cpu";
    auto m = tiny_llama();
    train::Trainer t(m, o);
    for (const auto& p : m->parameters()) QCOMPARE(p.scalar_type(), torch::kBFloat16);
    for (const auto& w : t.plugin().trainable_weights())
      QCOMPARE(w.tensor.scalar_type(), torch::kFloat32);
    auto batches = tiny_batches(2);
    train::FixedBatchSource src(batches, false, 1);
    auto r = t.train(src);
    QCOMPARE(r.losses.size(), std::size_t{2});
    QVERIFY(std::isfinite(r.losses[1]));
    const auto mem = t.plugin().memory();
    QVERIFY(mem.optimizer > 0);
    QVERIFY(mem.weights > 0);
  }

  // Last: the cache stays LibTorch's CPU allocator for the rest of the process, as in a run.
  void cpu_block_cache_reuses_large_blocks_and_bounds_what_it_keeps() {
    constexpr std::uint64_t kMiB = 1 << 20;
    train::install_cpu_block_cache(64 * kMiB);
    const train::CpuBlockCacheFigures before = train::cpu_block_cache_figures();
    QVERIFY(before.installed);
    {  // Below kLargeCpuBlockBytes a tensor is not the cache's.
      auto small = torch::ones({static_cast<std::int64_t>(train::kLargeCpuBlockBytes / 8)});
      QCOMPARE(train::cpu_block_cache_figures().in_use, before.in_use);
    }
    // A block freed is kept and is the next request of its size's: no new mapping.
    void* first = nullptr;
    {
      auto t = torch::ones({static_cast<std::int64_t>(8 * kMiB / 4)});
      first = t.data_ptr();
      QCOMPARE(train::cpu_block_cache_figures().in_use, before.in_use + 8 * kMiB);
    }
    const train::CpuBlockCacheFigures freed = train::cpu_block_cache_figures();
    QCOMPARE(freed.kept, before.kept + 8 * kMiB);
    {
      auto t = torch::ones({static_cast<std::int64_t>(8 * kMiB / 4)});
      QCOMPARE(t.data_ptr(), first);
      QCOMPARE(train::cpu_block_cache_figures().allocations, freed.allocations);
    }
    // raw_allocate's memory (oneDNN's scratchpads) comes back through raw_deallocate, large or
    // small (a bf16 matmul aborted the run when only DataPtrs could be freed).
    for (const std::size_t bytes : {std::size_t{64} << 10, std::size_t{8} << 20}) {
      void* raw = c10::GetCPUAllocator()->raw_allocate(bytes);
      std::memset(raw, 1, bytes);
      c10::GetCPUAllocator()->raw_deallocate(raw);
    }
    QCOMPARE(train::cpu_block_cache_figures().in_use, before.in_use);
    // Beyond the bound the largest freed blocks go back to the kernel: the process's resident set
    // (/proc, not the cache's own count) drops by them.
    {
      std::vector<torch::Tensor> blocks;
      for (int i = 0; i < 4; ++i)
        blocks.push_back(torch::ones({static_cast<std::int64_t>(48 * kMiB / 4)}));
      const std::uint64_t held = train::process_rss_bytes();
      blocks.clear();
      const train::CpuBlockCacheFigures after = train::cpu_block_cache_figures();
      QVERIFY2(after.kept <= 64 * kMiB, qPrintable(QString::number(after.kept)));
      const std::uint64_t now = train::process_rss_bytes();
      QVERIFY2(held > now && held - now >= 3 * 48 * kMiB * 95 / 100,
               qPrintable(QString("resident %1 MiB before the blocks were freed, %2 after")
                              .arg(held / kMiB)
                              .arg(now / kMiB)));
    }
    // Bound 0 (a host budget): nothing is kept.
    train::install_cpu_block_cache(0);
    QCOMPARE(train::cpu_block_cache_figures().kept, std::uint64_t{0});
    { auto t = torch::ones({static_cast<std::int64_t>(8 * kMiB / 4)}); }
    QCOMPARE(train::cpu_block_cache_figures().kept, std::uint64_t{0});
    QCOMPARE(train::cpu_block_cache_figures().in_use, before.in_use);
  }
};

QTEST_APPLESS_MAIN(TestTrain)
#include "test_train.moc"
