// What a config.json asks for against what the machine has (plan/model_size.h): absurd sizes
// are refused naming the file, the field that makes them so, the figure and the memory; sizes
// beyond 64 bits likewise; the disk a strategy may spill to and several processes count.
#include <QtTest/QtTest>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hf/config.h"
#include "job/job_spec.h"
#include "plan/model_size.h"
#include "plan/planner.h"

using nlohmann::json;
using namespace tessera;

namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

// The tiny llama of the parity tests: 2 layers of hidden 64, about 75k parameters.
json tiny_llama() {
  return {{"model_type", "llama"},    {"vocab_size", 300},      {"hidden_size", 64},
          {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"head_dim", 16}};
}

hf::ModelConfig with(json doc, const char* key, json value) {
  doc[key] = std::move(value);
  return hf::parse_model_config(doc, "/m/config.json");
}

plan::ModelCapacity memory_of(std::uint64_t total, std::uint64_t spill = 0) {
  plan::ModelCapacity c;
  c.memory.total = total;
  c.memory.available = total / 2;
  if (spill > 0) {
    c.spill_dir = "/runs/r/offload";
    c.spill_free = spill;
  }
  return c;
}

job::JobSpec spec_with(const std::string& strategy, const std::string& method = "full") {
  job::JobSpec spec;
  spec.model.path = "/m";
  spec.method.type = method;
  spec.precision = "fp32";
  spec.strategy.name = strategy;
  spec.output.dir = "/runs/r";
  return spec;
}

template <typename F>
void expect_refusal(F&& check, std::initializer_list<const char*> needles) {
  try {
    check();
    QFAIL("expected a refusal");
  } catch (const Error& e) {
    QCOMPARE(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::InvalidInput));
    const std::string text = std::string(e.what()) + "\nhint: " + e.hint();
    for (const char* n : needles)
      QVERIFY2(text.find(n) != std::string::npos, (text + "\nlacks: " + n).c_str());
  }
}

}  // namespace

class TestModelSize : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void aModelThatFitsPasses() {
    const auto tiny = hf::parse_model_config(tiny_llama(), "/m/config.json");
    plan::check_model_fits(tiny, "/m/config.json", 4, "float32", memory_of(kGiB));
    plan::check_training_fits(tiny, "/m/config.json", spec_with("single"), 1, memory_of(kGiB));
  }

  void absurdSizesNameTheirField() {
    // 1e9 layers of ~37k parameters: 3.7e13 parameters, 134.6 TiB in float32.
    expect_refusal(
        [] {
          plan::check_model_fits(with(tiny_llama(), "num_hidden_layers", 1e9), "/m/config.json", 4,
                                 "float32", memory_of(16 * kGiB));
        },
        {"/m/config.json: num_hidden_layers 1000000000 makes a model of 3.7e13 parameters",
         "TiB of weights in float32", "the 16.0 GiB of memory this machine has",
         "8.0 GiB available", "hint: correct num_hidden_layers"});
    // The embeddings, not the layers: vocab_size is named.
    expect_refusal(
        [] {
          plan::check_model_fits(with(tiny_llama(), "vocab_size", 1e12), "/m/config.json", 2,
                                 "bfloat16", memory_of(16 * kGiB));
        },
        {"vocab_size 1000000000000 makes a model of 1.28e14 parameters", "in bfloat16"});
    // gpt2 under its own names.
    json gpt2{{"model_type", "gpt2"},
              {"vocab_size", 50},
              {"n_embd", 32},
              {"n_layer", 2000000000},
              {"n_head", 4}};
    expect_refusal(
        [&] {
          plan::check_model_fits(hf::parse_model_config(gpt2, "/g/config.json"), "/g/config.json",
                                 4, "float32", memory_of(16 * kGiB));
        },
        {"/g/config.json: n_layer 2000000000"});
  }

  void countsBeyond64BitsAreRefused() {
    const auto huge = with(tiny_llama(), "intermediate_size", json(std::int64_t{1} << 62));
    QVERIFY(!(plan::parameter_count(huge) < plan::kMaxParameterCount));
    expect_refusal(
        [&] { plan::check_model_fits(huge, "/m/config.json", 4, "float32", memory_of(16 * kGiB)); },
        {"intermediate_size 4611686018427387904", "beyond the 9e18 that 64-bit sizes count",
         "16.0 GiB of memory"});
    expect_refusal(
        [&] {
          plan::check_training_fits(huge, "/m/config.json", spec_with("single"), 1,
                                    memory_of(16 * kGiB));
        },
        {"intermediate_size 4611686018427387904", "64-bit"});
    // The planner's own count names it too (plan, and every estimate).
    expect_refusal([&] { plan::count_parameters(huge); },
                   {"intermediate_size 4611686018427387904", "64-bit"});
  }

  void trainingCountsEveryCategoryAndTheSpillDisk() {
    // 1e5 layers: 3.7e9 parameters; full fp32 training: 16 bytes each (weights, gradients, two
    // Adam moments), 55 GiB in all.
    const auto big = with(tiny_llama(), "num_hidden_layers", 100000);
    expect_refusal(
        [&] {
          plan::check_training_fits(big, "/m/config.json", spec_with("single"), 1,
                                    memory_of(16 * kGiB));
        },
        {"num_hidden_layers 100000", "full fine-tuning in fp32 under strategy single",
         "weights 13.8 GiB + gradients 13.8 GiB + optimizer state 27.6 GiB = 55.1 GiB",
         "16.0 GiB of memory"});
    // Inference of the same needs its weights only.
    plan::check_model_fits(big, "/m/config.json", 4, "float32", memory_of(16 * kGiB));
    // gemini may spill to disk: memory and the disk together hold it.
    plan::check_training_fits(big, "/m/config.json", spec_with("gemini"), 1,
                              memory_of(16 * kGiB, 100 * kGiB));
    expect_refusal(
        [&] {
          plan::check_training_fits(big, "/m/config.json", spec_with("gemini"), 1,
                                    memory_of(16 * kGiB, 20 * kGiB));
        },
        {"and the 20.0 GiB free on disk under /runs/r/offload"});
    // Several processes: one rank's share at best (zero moves each gradient into float32 buckets
    // as it arrives, without accumulation: 55.1 GiB in all).
    plan::check_training_fits(big, "/m/config.json", spec_with("zero"), 4, memory_of(24 * kGiB));
    expect_refusal(
        [&] {
          plan::check_training_fits(big, "/m/config.json", spec_with("zero"), 2,
                                    memory_of(24 * kGiB));
        },
        {"gradients 13.8 GiB", "= 55.1 GiB, 27.6 GiB for each of 2 processes at best"});
    // auto: the least the plan may choose (LoRA in bf16, spilling to disk, one process writing
    // its gradient shards in bf16): 9.6 GiB.
    plan::check_training_fits(big, "/m/config.json", spec_with("auto"), 1,
                              memory_of(8 * kGiB, 8 * kGiB));
    expect_refusal(
        [&] {
          plan::check_training_fits(big, "/m/config.json", spec_with("auto"), 1,
                                    memory_of(4 * kGiB, 4 * kGiB));
        },
        {"the least strategy auto may choose", "= 9.6 GiB"});
  }

  void simulatedMemoryIsTheBudget() {
    auto capacity = memory_of(16 * kGiB);
    capacity.memory.simulated = 1ull << 20;
    expect_refusal(
        [&] {
          plan::check_training_fits(hf::parse_model_config(tiny_llama(), "/m/config.json"),
                                    "/m/config.json", spec_with("single"), 1, capacity);
        },
        {"the 1.0 MiB of memory simulated for this run"});
  }

  void spillFolderOfEachStrategy() {
    QCOMPARE(plan::spill_dir_of(spec_with("single")).has_value(), false);
    QCOMPARE(plan::spill_dir_of(spec_with("gemini"))->string(), std::string("/runs/r/offload"));
    auto gemini = spec_with("gemini");
    gemini.strategy.options = {{"offload_dir", "/scratch/off"}};
    QCOMPARE(plan::spill_dir_of(gemini)->string(), std::string("/scratch/off"));
    QCOMPARE(plan::spill_dir_of(spec_with("auto"))->string(), std::string("/runs/r"));
  }
};

QTEST_APPLESS_MAIN(TestModelSize)
#include "test_model_size.moc"
