// The planner's cost model and search: parameter counts by formula against published
// checkpoints, LoRA counts, and the choices under a simulated (deliberately small) host budget.
#include <QTemporaryDir>
#include <QtTest/QtTest>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "hf/config.h"
#include "job/strategies.h"
#include "memory/chunk_cache_policy.h"
#include "memory/chunk_layout.h"
#include "model/head_loss.h"
#include "plan/activations.h"
#include "plan/cost_terms.h"
#include "plan/hybrid_cost.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "plan/step_times.h"
#include "plan/strategy_costs.h"

using nlohmann::json;
using namespace tessera;

namespace {

// A link between ranks as `tessera-cli profile` measures it: 1 GB/s, 0.1 ms a call.
plan::LinkInfo measured_link() {
  plan::LinkInfo link;
  link.measured = true;
  link.bandwidth_bytes_per_s = 1e9;
  link.latency_s = 1e-4;
  link.method = "test";
  return link;
}

hf::ModelConfig config(const json& doc) {
  return hf::parse_model_config(doc, "config.json");
}

// A small llama whose peak is above the runtime floor, with activations and weights visible.
json small_llama() {
  return {{"model_type", "llama"},
          {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", 8000},
          {"hidden_size", 512},
          {"intermediate_size", 1376},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 8},
          {"max_position_embeddings", 512},
          {"tie_word_embeddings", false}};
}

// Wide enough that parameter and optimizer chunks (64 MiB at most) are a small part of it.
json wide_llama() {
  json doc = small_llama();
  doc["hidden_size"] = 1024;
  doc["intermediate_size"] = 2816;
  doc["num_hidden_layers"] = 16;
  doc["num_attention_heads"] = 16;
  doc["num_key_value_heads"] = 16;
  return doc;
}

// Byte counts from separately truncated products: equal within a few bytes.
bool near(double a, double b) {
  return std::abs(a - b) <= 4.0;
}
bool near(std::uint64_t a, double b) {
  return near(static_cast<double>(a), b);
}
bool near(std::uint64_t a, std::uint64_t b) {
  return near(static_cast<double>(a), static_cast<double>(b));
}

plan::DiskInfo measured_disk() {
  plan::DiskInfo disk;
  disk.path = "/runs";
  disk.free = 100ull << 30;
  disk.measured = true;
  disk.read_bytes_per_s = 1e9;
  disk.write_bytes_per_s = 5e8;
  return disk;
}

// A GPU in a profile, as the probe would find one.
plan::GpuInfo test_gpu(std::uint64_t memory = 80ull << 30, bool bf16 = false) {
  plan::GpuInfo gpu;
  gpu.name = "Test GPU";
  gpu.memory = memory;
  gpu.bf16 = bf16;
  return gpu;
}

plan::PlanInputs inputs(std::uint64_t simulated_budget, const std::string& method = "full") {
  plan::PlanInputs in;
  in.model = config(small_llama());
  in.spec.method.type = method;
  in.spec.training.batch_size = 8;
  in.spec.training.steps = 10;
  in.spec.dataset.max_length = 128;
  in.profile.cpu.physical_cores = 2;
  in.profile.cpu_flops = 1e11;
  in.profile.memory.total = 64ull << 30;
  in.profile.memory.available = 64ull << 30;
  in.profile.memory.simulated = simulated_budget;
  return in;
}

plan::Settings settings(std::int64_t micro_batch, bool checkpointing, const std::string& method) {
  plan::Settings s;
  s.method = method;
  s.micro_batch = micro_batch;
  s.sequence_length = 128;
  s.activation_checkpointing = checkpointing;
  return s;
}

// Gemini in one micro-batch with checkpointing, full fine-tuning, every optimizer shard on disk.
plan::Settings gemini_optimizer_on_disk() {
  plan::Settings s = settings(1, true, "full");
  s.strategy = "gemini";
  s.offload_optim_frac = 1.0;
  return s;
}

// The message make_plan refuses `in` with, or "" where it plans it.
std::string refusal_of(const plan::PlanInputs& in) {
  try {
    (void)plan::make_plan(in);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}

// The simulated budget at which `s` just fits (the planner keeps kHeadroom free).
std::uint64_t budget_for(const plan::Settings& s) {
  const auto peak = plan::estimate_memory(config(small_llama()), s, 0).peak();
  return static_cast<std::uint64_t>(static_cast<double>(peak) / (1.0 - plan::kHeadroom)) + 4096;
}

// auto over `processes` ranks of wide_llama with `length`-token sequences; the settings its rank
// needs at least (micro-batch 1, checkpointing, 8 accumulation steps), and the least peak per rank
// that a strategy keeping whole layers on a rank needs at them with everything in RAM.
struct LongSequences {
  plan::PlanInputs in;
  plan::Settings least;
  std::uint64_t least_in_ram = ~std::uint64_t(0);
};
LongSequences long_sequences(int processes, std::int64_t length = 8192) {
  LongSequences out;
  out.in = inputs(64ull << 30);
  out.in.processes = processes;
  out.in.model = config(wide_llama());
  out.in.spec.dataset.max_length = length;
  out.in.spec.strategy.name = "auto";
  out.in.profile.disk = measured_disk();
  out.least = settings(1, true, "full");
  out.least.sequence_length = length;
  out.least.gradient_accumulation = 8;
  for (const auto& [strategy, stage] : std::vector<std::pair<std::string, int>>{
           {"ddp", 0}, {"zero", 1}, {"zero", 2}, {"gemini", 0}}) {
    plan::Settings s = out.least;
    s.strategy = strategy;
    s.zero_stage = stage;
    out.least_in_ram =
        std::min(out.least_in_ram, plan::estimate_memory(out.in.model, s, 0, processes).peak());
  }
  return out;
}

// A simulated machine of `processes` ranks whose share per rank, less the headroom, is halfway
// between two peaks: the smaller fits, the larger does not.
std::uint64_t machine_between(std::uint64_t fits, std::uint64_t does_not, int processes) {
  return static_cast<std::uint64_t>(processes) *
         static_cast<std::uint64_t>(static_cast<double>(fits + does_not) / 2 /
                                    (1.0 - plan::kHeadroom));
}

}  // namespace

class TestPlan : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  // Published parameter counts of real checkpoints (transformers' num_parameters()).
  void parameterCountsMatchPublishedModels_data() {
    QTest::addColumn<QString>("doc");
    QTest::addColumn<qint64>("expected");
    QTest::newRow("Llama-2-7b") << QString::fromStdString(json{
                                       {"model_type", "llama"},
                                       {"vocab_size", 32000},
                                       {"hidden_size", 4096},
                                       {"intermediate_size", 11008},
                                       {"num_hidden_layers", 32},
                                       {"num_attention_heads", 32},
                                       {"num_key_value_heads", 32},
                                       {"max_position_embeddings",
                                        4096}}.dump())
                                << qint64(6738415616);
    QTest::newRow("Mistral-7B-v0.1") << QString::fromStdString(json{
                                            {"model_type", "mistral"},
                                            {"vocab_size", 32000},
                                            {"hidden_size", 4096},
                                            {"intermediate_size", 14336},
                                            {"num_hidden_layers", 32},
                                            {"num_attention_heads", 32},
                                            {"num_key_value_heads", 8},
                                            {"max_position_embeddings", 32768},
                                            {"sliding_window",
                                             4096}}.dump())
                                     << qint64(7241732096);
    QTest::newRow("Qwen2-0.5B") << QString::fromStdString(json{
                                       {"model_type", "qwen2"},
                                       {"vocab_size", 151936},
                                       {"hidden_size", 896},
                                       {"intermediate_size", 4864},
                                       {"num_hidden_layers", 24},
                                       {"num_attention_heads", 14},
                                       {"num_key_value_heads", 2},
                                       {"max_position_embeddings", 32768},
                                       {"tie_word_embeddings",
                                        true}}.dump())
                                << qint64(494032768);
    QTest::newRow("gpt2") << QString::fromStdString(json{
                                 {"model_type", "gpt2"},
                                 {"vocab_size", 50257},
                                 {"n_embd", 768},
                                 {"n_layer", 12},
                                 {"n_head", 12},
                                 {"n_positions", 1024}}.dump())
                          << qint64(124439808);
    QTest::newRow("bert-base-uncased") << QString::fromStdString(json{
                                              {"model_type", "bert"},
                                              {"vocab_size", 30522},
                                              {"hidden_size", 768},
                                              {"intermediate_size", 3072},
                                              {"num_hidden_layers", 12},
                                              {"num_attention_heads", 12},
                                              {"max_position_embeddings", 512},
                                              {"type_vocab_size", 2}}.dump())
                                       << qint64(109482240);
  }
  void parameterCountsMatchPublishedModels() {
    QFETCH(QString, doc);
    QFETCH(qint64, expected);
    QCOMPARE(qint64(plan::count_parameters(config(json::parse(doc.toStdString())))), expected);
  }

  void loraCountsRankTimesInPlusOut() {
    const auto llama = config(small_llama());
    // q_proj (512→512) and v_proj (512→512), 4 layers, rank 8.
    QCOMPARE(plan::count_lora_parameters(llama, 8, {}), std::int64_t(8 * (1024 + 1024) * 4));
    QCOMPARE(plan::count_lora_parameters(llama, 4, {"down_proj"}),
             std::int64_t(4 * (1376 + 512) * 4));
    const auto gpt2 = config({{"model_type", "gpt2"},
                              {"vocab_size", 100},
                              {"n_embd", 64},
                              {"n_layer", 2},
                              {"n_head", 4},
                              {"n_positions", 32}});
    QCOMPARE(plan::count_lora_parameters(gpt2, 8, {}), std::int64_t(8 * (64 + 192) * 2));
    QVERIFY_THROWS_EXCEPTION(tessera::Error, plan::count_lora_parameters(llama, 8, {"c_attn"}));
  }

  void estimateHasEachCategory() {
    const auto c = config(small_llama());
    const std::int64_t n = plan::count_parameters(c);
    const auto full = plan::estimate_memory(c, settings(8, false, "full"), 0);
    QCOMPARE(full.weights, std::uint64_t(4 * n));
    QCOMPARE(full.gradients, std::uint64_t(4 * n));
    QCOMPARE(full.optimizer, std::uint64_t(8 * n));
    // Training's loss holds one block of logits (model/head_loss.h), not [B·S, V] in float32:
    // the rest scales with the batch, so two half batches hold that block once more.
    const double block = static_cast<double>(tessera::model::head_loss_block_rows(8000)) * 8000 *
                         4 * plan::kActivationOverhead;
    const auto half = plan::estimate_memory(c, settings(4, false, "full"), 0);
    QVERIFY(std::abs(2.0 * static_cast<double>(half.activations) -
                     static_cast<double>(full.activations) - block) <= 4096);
    // Preference tuning's log-probabilities go through the head the same way: two rows an
    // example hold what a batch twice as large holds, one block of logits, not [2·B·S, V].
    plan::Settings pairs = settings(8, false, "full");
    pairs.rows_per_example = 2;
    QCOMPARE(plan::estimate_memory(c, pairs, 0).activations,
             plan::estimate_memory(c, settings(16, false, "full"), 0).activations);
    const auto ckpt = plan::estimate_memory(c, settings(8, true, "full"), 0);
    QVERIFY(ckpt.activations < full.activations);
    const auto lora = plan::estimate_memory(c, settings(8, false, "lora"), 0);
    QVERIFY(lora.optimizer == std::uint64_t(8 * plan::count_lora_parameters(c, 8, {})));
    QVERIFY(lora.peak() < full.peak());
  }

  // On a GPU the loss takes the head a larger block of rows at a time (model/head_loss.h: the
  // block's products run at the GEMM rate), and the plan holds that block, not the CPU's; the
  // simulated device computes on the CPU and is planned with the CPU's.
  void estimateOnAGpuHoldsTheGpusHeadBlock() {
    const auto c = config(small_llama());
    auto on = [](std::int64_t batch, bool gpu, bool simulated) {
      plan::Settings s = settings(batch, false, "full");
      s.on_gpu = gpu;
      s.simulated_device = simulated;
      return s;
    };
    // 2 × half − whole batch: what does not scale with the batch, the head's one block.
    auto block = [&](bool gpu, bool simulated) {
      return 2.0 * static_cast<double>(
                       plan::estimate_memory(c, on(80, gpu, simulated), 0).activations) -
             static_cast<double>(plan::estimate_memory(c, on(160, gpu, simulated), 0).activations);
    };
    const double rows = static_cast<double>(tessera::model::head_loss_block_rows(8000, true));
    QCOMPARE(rows, 8320.0);     // 256 MiB of float32 logits, in tiles of 128 rows
    QVERIFY(80 * 128 >= rows);  // both batches hold a whole block
    const double gpu_block = rows * 8000 * 4 * plan::kActivationOverhead;
    QVERIFY(std::abs(block(true, false) - gpu_block) <= 4096);
    const double cpu_block = static_cast<double>(tessera::model::head_loss_block_rows(8000)) *
                             8000 * 4 * plan::kActivationOverhead;
    QVERIFY(std::abs(block(true, true) - cpu_block) <= 4096);
    QVERIFY(std::abs(block(false, false) - cpu_block) <= 4096);
    // A vocabulary of Llama 3's size: 512 rows; the largest ones: one tile.
    QCOMPARE(tessera::model::head_loss_block_rows(128256, true), std::int64_t(512));
    QCOMPARE(tessera::model::head_loss_block_rows(std::int64_t(1) << 22, true), std::int64_t(128));
  }

  void planKeepsTheSpecWhenItFits() {
    const auto p = plan::make_plan(inputs(64ull << 30));
    QVERIFY(p.fits);
    QCOMPARE(p.settings.micro_batch, std::int64_t(8));
    QCOMPARE(p.settings.gradient_accumulation, std::int64_t(1));
    QVERIFY(!p.settings.activation_checkpointing);
    QCOMPARE(p.settings.method, std::string("full"));
    QVERIFY(p.explanation.find("(simulated)") != std::string::npos);
    QVERIFY(p.seconds_per_step > 0);
    QVERIFY(p.total_steps && *p.total_steps == 10);
  }

  // A strategy named on cuda where the profile lists no GPU, or fewer than its ranks on this
  // machine: the plan refuses it as the run would (it planned the CPU's figures before, with a
  // warning, and said the job fits); on cpu it plans as ever.
  void planRefusesCudaWhereTheRunWould() {
    for (const std::string name : {"single", "gemini", "ddp", "zero"}) {
      plan::PlanInputs in = inputs(64ull << 30);
      in.spec.strategy.name = name;
      in.spec.strategy.options = {{"device", "cuda"}};
      const std::string refused = refusal_of(in);
      QVERIFY2(refused.find("strategy.options.device \"cuda\" but no CUDA device is present") !=
                   std::string::npos,
               (name + ": " + refused).c_str());
      in.spec.strategy.options = {{"device", "cpu"}};
      const auto cpu = plan::make_plan(in);
      QVERIFY(std::none_of(cpu.reasons.begin(), cpu.reasons.end(), [](const std::string& r) {
        return r.find("planned as if it computed on the CPU") != std::string::npos;
      }));
    }
    // Four ranks of ddp on a machine with two GPUs.
    plan::PlanInputs in = inputs(64ull << 30);
    in.spec.strategy = {"ddp", {{"device", "cuda"}}};
    in.processes = in.processes_per_node = 4;
    in.profile.gpus = {test_gpu(), test_gpu()};
    const std::string refused = refusal_of(in);
    QVERIFY2(refused.find("4 ranks on a machine with 2 GPU(s)") != std::string::npos,
             refused.c_str());
    in.processes = in.processes_per_node = 2;
    QVERIFY(refusal_of(in).empty());
    // auto on cuda over two processes, without a GPU: refused too (it trained ddp on the CPU).
    plan::PlanInputs automatic = inputs(64ull << 30);
    automatic.spec.strategy = {"auto", {{"device", "cuda"}}};
    automatic.processes = automatic.processes_per_node = 2;
    QVERIFY(refusal_of(automatic).find("no CUDA device is present") != std::string::npos);
  }

  // fp16 (with the loss scaler) is a GPU's: planned in two bytes a value on any GPU (one without
  // bf16 too, where it trained fp32 before) and kept as the spec says; on the CPU a named strategy
  // is refused as the run refuses it, and auto trains bf16 or fp32 there, saying why.
  void planKeepsFp16OnAGpuAndRefusesItOnTheCpu() {
    plan::PlanInputs in = inputs(64ull << 30);
    in.spec.precision = "fp16";
    in.profile.gpus.push_back(test_gpu(80ull << 30, /*bf16=*/false));
    const plan::Plan on_gpu = plan::make_plan(in);
    QCOMPARE(on_gpu.settings.precision, std::string("fp16"));
    QCOMPARE(plan::apply_settings(in.spec, on_gpu.settings).precision, std::string("fp16"));
    for (const std::string& change : plan::applied_changes(in.spec, on_gpu.settings))
      QVERIFY2(change.find("precision") == std::string::npos, change.c_str());
    // Two bytes a value: the memory of bf16 on a GPU that has it.
    plan::PlanInputs bf16 = in;
    bf16.spec.precision = "bf16";
    bf16.profile.gpus = {test_gpu(80ull << 30, /*bf16=*/true)};
    const plan::Plan in_bf16 = plan::make_plan(bf16);
    QCOMPARE(on_gpu.tiers.at(0).estimate.weights, in_bf16.tiers.at(0).estimate.weights);

    in.profile.gpus.clear();
    const plan::Plan on_cpu = plan::make_plan(in);
    QVERIFY(on_cpu.settings.precision == "bf16" || on_cpu.settings.precision == "fp32");
    QVERIFY(std::any_of(on_cpu.reasons.begin(), on_cpu.reasons.end(), [](const std::string& r) {
      return r.find("instead of fp16") != std::string::npos &&
             r.find("fp16 computes on a GPU only") != std::string::npos;
    }));
    in.spec.strategy.name = "single";
    QVERIFY_THROWS_EXCEPTION(tessera::Error, plan::make_plan(in));
  }

  // The plan refuses the layouts the launch refuses (it approved them before): hybrid's
  // sequence_parallel without tensor parallelism, pp_chunks without pipeline stages, a tp_size
  // the model does not split into; gemini's chunk_size below the model's largest tensor.
  void planRefusesLayoutsTheLaunchWould() {
    plan::PlanInputs in = inputs(64ull << 30);
    in.processes = in.processes_per_node = 2;
    in.spec.strategy = {"hybrid", {{"tp_size", 1}, {"sequence_parallel", true}}};
    QVERIFY(refusal_of(in).find("sequence_parallel") != std::string::npos);
    in.spec.strategy = {"hybrid", {{"tp_size", 1}, {"pp_chunks", 2}}};
    in.spec.training.gradient_accumulation = 2;
    QVERIFY(refusal_of(in).find("but pp_size is 1") != std::string::npos);
    in.spec.strategy = {"hybrid", {{"tp_size", 2}}};
    QVERIFY(refusal_of(in).empty());
    json odd = small_llama();
    odd["vocab_size"] = 8001;
    in.model = config(odd);
    QVERIFY(refusal_of(in).find("(8001) does not split into 2 equal parts") != std::string::npos);

    plan::PlanInputs one = inputs(64ull << 30);
    one.spec.strategy = {"gemini", {{"chunk_size", "64KiB"}}};  // the embedding: 4M elements
    const std::string small = refusal_of(one);
    QVERIFY2(small.find("strategy.options.chunk_size: the input embedding has 4096000 elements, "
                        "more than a chunk of 16384") != std::string::npos,
             small.c_str());
    one.spec.strategy = {"gemini", {{"chunk_size", "16MiB"}}};
    QVERIFY(refusal_of(one).empty());
  }

  // The total of an epochs job counts every data-parallel replica's sequences per step: the
  // plan said 7 steps where ddp at 2 ranks ran 3 (200 rows, batch 32).
  void epochsCountTheDataParallelReplicas() {
    const auto steps = [](const std::string& strategy, const json& options, int processes) {
      plan::PlanInputs in = inputs(64ull << 30);
      in.spec.training.steps.reset();
      in.spec.training.epochs = 1.0;
      in.spec.training.batch_size = 32;
      in.spec.dataset.validation_split = 0.0;
      in.dataset_rows = 200;
      in.processes = in.processes_per_node = processes;
      in.spec.strategy = {strategy, options};
      const plan::Plan p = plan::make_plan(in);
      return p.total_steps.value_or(-1);
    };
    QCOMPARE(steps("single", json::object(), 1), std::int64_t{7});
    QCOMPARE(steps("ddp", json::object(), 2), std::int64_t{4});
    QCOMPARE(steps("zero", json::object(), 2), std::int64_t{4});
    QCOMPARE(steps("gemini", json::object(), 2), std::int64_t{4});
    QCOMPARE(steps("hybrid", json{{"tp_size", 2}}, 2), std::int64_t{7});  // one replica
    QCOMPARE(steps("hybrid", json{{"tp_size", 2}}, 4), std::int64_t{4});  // two
  }

  // kto pairs each prompt with another example's completion of its micro-batch: auto never
  // splits its batch below 2 (it trained micro-batches of 1, which a spec may not write).
  void ktoIsNeverSplitBelowTwo() {
    for (const std::uint64_t budget :
         std::vector<std::uint64_t>{64ull << 30, budget_for(settings(1, true, "full")),
                                    budget_for(settings(1, false, "full"))}) {
      plan::PlanInputs in = inputs(budget);
      in.spec.method.preference = job::PreferenceSpec{};
      in.spec.method.preference->loss = "kto";
      in.spec.training.batch_size = 2;
      const plan::Plan p = plan::make_plan(in);
      QVERIFY2(p.settings.micro_batch >= 2, std::to_string(budget).c_str());
    }
  }

  // zero's offload_optimizer on the CPU changes nothing: the plan says so, as the run warns (it
  // said nothing).
  void planSaysZeroOffloadChangesNothingOnTheCpu() {
    plan::PlanInputs in = inputs(64ull << 30);
    in.processes = in.processes_per_node = 2;
    in.spec.strategy = {"zero", {{"device", "cpu"}, {"offload_optimizer", true}}};
    const plan::Plan p = plan::make_plan(in);
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.find("warning: strategy.options.offload_optimizer") == 0;
    }));
    QVERIFY(!p.settings.zero_offload);
  }

  // A named strategy's run trains the spec as written: where the plan's settings differ, the
  // plan says first that they are the planner's choice, not the job's (it showed them as the
  // job's); as written, nothing is said.
  void aNamedStrategysPlanSaysItsChangesAreNotApplied() {
    plan::PlanInputs in = inputs(budget_for(settings(1, true, "full")));
    in.spec.strategy = {"single", json::object()};
    const plan::Plan p = plan::make_plan(in);
    QVERIFY(p.fits);
    QVERIFY2(p.explanation.rfind("strategy single trains the spec as written; the planner would "
                                 "choose ",
                                 0) == 0,
             p.explanation.c_str());
    QVERIFY(p.reasons.at(0).rfind("warning: these settings differ from the spec's (", 0) == 0);
    in.profile.memory.simulated = 64ull << 30;
    const plan::Plan roomy = plan::make_plan(in);
    QVERIFY(roomy.explanation.find("trains the spec as written") == std::string::npos);
  }

  // auto's options are single's: where it chooses another strategy, the plan says the option is
  // left (auto at two processes dropped frozen_tables without a word).
  void autoSaysWhenItLeavesSinglesOptions() {
    plan::PlanInputs in = inputs(64ull << 30, "lora");
    in.spec.strategy = {"auto", {{"frozen_tables", "memory"}}};
    const auto warned = [](const plan::Plan& p) {
      return std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
        return r.find("frozen_tables is single's option") != std::string::npos;
      });
    };
    QVERIFY(!warned(plan::make_plan(in)));
    in.processes = in.processes_per_node = 2;
    const plan::Plan two = plan::make_plan(in);
    QVERIFY(two.settings.strategy != "single");
    QVERIFY(warned(two));
  }

  void planSpillsToHostMemoryOnTheGpu() {
    // Full fine-tuning that does not fit the GPU even at micro-batch 1 with checkpointing, but
    // fits gemini's device tier with the optimizer state in host memory: auto keeps the method
    // and spills to the host, planning both tiers.
    const auto model = config(small_llama());
    const std::int64_t n = plan::count_parameters(model);
    const plan::Settings single_least = settings(1, true, "full");
    plan::Settings spilled = settings(1, true, "full");
    spilled.strategy = "gemini";
    spilled.device_tier = true;
    spilled.host_optim_frac = 1.0;
    const auto gpu_share = plan::estimate_memory(model, spilled, 0);
    QVERIFY(gpu_share.peak() < plan::estimate_memory(model, single_least, 0).peak());
    auto in = inputs(64ull << 30);
    in.profile.gpus.push_back(test_gpu(budget_for(spilled)));
    const plan::Plan p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.strategy, std::string("gemini"));
    QCOMPARE(p.settings.method, std::string("full"));
    QVERIFY(p.settings.device_tier);
    QVERIFY(p.settings.host_optim_frac > 0.0);
    QCOMPARE(p.settings.offload_optim_frac, 0.0);
    QCOMPARE(p.tiers.size(), std::size_t{2});
    const plan::PlanTier& device = p.tiers[0];
    const plan::PlanTier& host = p.tiers[1];
    QCOMPARE(device.tier, std::string("device"));
    QCOMPARE(host.tier, std::string("host"));
    QVERIFY(device.estimate.peak() <= device.budget);
    QVERIFY(host.estimate.peak() <= host.budget);
    // The Adam moments are all somewhere: the GPU's share and the host's add up to 8 bytes per
    // parameter, split as the settings say.
    QCOMPARE(device.estimate.optimizer + host.estimate.optimizer, std::uint64_t(8 * n));
    QVERIFY(std::abs(static_cast<double>(host.estimate.optimizer) -
                     p.settings.host_optim_frac * 8.0 * static_cast<double>(n)) <= 1.0);
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.find("does not fit in") != std::string::npos &&
             r.find("of the GPU with everything there: gemini's device tier keeps") !=
                 std::string::npos;
    }));
    // The run gets gemini on cuda with those shares; the change is named.
    const auto applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.strategy.name, std::string("gemini"));
    QCOMPARE(applied.strategy.options.at("device"), nlohmann::json("cuda"));
    QCOMPARE(applied.strategy.options.at("host_optim_frac").get<double>(),
             p.settings.host_optim_frac);
    const auto changes = plan::applied_changes(in.spec, p.settings);
    QVERIFY(std::any_of(changes.begin(), changes.end(), [](const std::string& c) {
      return c.find("strategy gemini on the GPU with") == 0;
    }));
    // The settings survive the plan file.
    const auto again = plan::settings_from_json(plan::to_json(p).at("settings"), "plan.json");
    QVERIFY(again.device_tier);
    QCOMPARE(again.host_optim_frac, p.settings.host_optim_frac);
    // A GPU big enough for single: single on the GPU, nothing spilled.
    in.profile.gpus[0].memory = 64ull << 30;
    const plan::Plan roomy = plan::make_plan(in);
    QCOMPARE(roomy.settings.strategy, std::string("single"));
    QCOMPARE(roomy.tiers.size(), std::size_t{1});
  }

  // gemini named on a GPU with shares whose minimum (micro-batch 1, checkpointing) does not fit
  // the device tier's budget: the plan moves more to host memory (never less than the spec's off
  // the device) before it changes the method, says so, and the spec it applies carries the
  // shares, which then plan as they are.
  static plan::PlanInputs named_gemini_on_a_gpu(double host_param_frac) {
    auto in = inputs(64ull << 30);
    in.profile.gpus.push_back(test_gpu());
    in.spec.training.batch_size = 1;
    in.spec.training.activation_checkpointing = true;
    in.spec.strategy = {"gemini", {{"device", "cuda"}, {"host_param_frac", host_param_frac}}};
    return in;
  }

  void planMovesANamedGeminisSharesOffADeviceTooSmall() {
    auto in = named_gemini_on_a_gpu(0.5);
    const plan::Plan roomy = plan::make_plan(in);
    QVERIFY(roomy.fits);
    QVERIFY(plan::applied_changes(in.spec, roomy.settings).empty());
    const std::uint64_t need = roomy.tiers[0].estimate.peak();
    in.spec.strategy.options["device_budget"] = need;  // less the headroom: short
    const plan::Plan p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.settings.method, std::string("full"));
    QCOMPARE(p.settings.strategy, std::string("gemini"));
    QVERIFY(p.settings.host_param_frac >= 0.5);
    QVERIFY(p.settings.host_optim_frac + p.settings.offload_optim_frac > 0.0);
    QVERIFY(static_cast<double>(p.tiers[0].estimate.peak()) <= 0.9 * static_cast<double>(need));
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.find("with the spec's shares off it") != std::string::npos;
    }));
    const auto changes = plan::applied_changes(in.spec, p.settings);
    QVERIFY(std::any_of(changes.begin(), changes.end(), [](const std::string& c) {
      return c.rfind("gemini's shares ", 0) == 0 &&
             c.find("host_optim_frac 0 → ") != std::string::npos;
    }));
    const job::JobSpec applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.strategy.options.value("host_optim_frac", 0.0), p.settings.host_optim_frac);
    in.spec = applied;
    const plan::Plan again = plan::make_plan(in);
    QVERIFY(again.fits);
    QVERIFY(plan::applied_changes(applied, again.settings).empty());
  }

  // A step ran out of device memory needing 1.5× what the plan estimated for the job as it ran:
  // the hint is the change the plan makes for a device 1.5× smaller, whose estimate × 1.5 fits
  // the real one; a job on the CPU gets none.
  void aDeviceShortfallGetsThePlansChangeThatFits() {
    auto in = named_gemini_on_a_gpu(0.0);
    const std::uint64_t planned = plan::make_plan(in).tiers[0].estimate.peak();
    const auto budget = static_cast<std::uint64_t>(1.2 * static_cast<double>(planned));
    in.spec.strategy.options["device_budget"] = budget;
    const plan::Plan fits = plan::make_plan(in);
    QVERIFY(fits.fits && plan::applied_changes(in.spec, fits.settings).empty());
    const std::string hint = plan::change_after_device_shortfall(
        in, static_cast<std::uint64_t>(1.5 * static_cast<double>(planned)));
    QVERIFY2(hint.find("needed at least 1.5× the plan's estimate") != std::string::npos,
             hint.c_str());
    QVERIFY2(hint.find("the plan's smallest change that fits") != std::string::npos, hint.c_str());
    QVERIFY2(hint.find("gemini's shares host_optim_frac 0 → ") != std::string::npos, hint.c_str());
    auto smaller = in;
    smaller.spec.strategy.options["device_budget"] =
        static_cast<std::uint64_t>(static_cast<double>(budget) / 1.5);
    const plan::Plan changed = plan::make_plan(smaller);
    QVERIFY(1.5 * static_cast<double>(changed.tiers[0].estimate.peak()) <=
            0.9 * static_cast<double>(budget) + 1.0);
    // Not needed more than the budget: the factor is at least budget ÷ estimate.
    QVERIFY(plan::change_after_device_shortfall(in, 0).find("needed at least 1.2× ") !=
            std::string::npos);
    auto cpu = inputs(64ull << 30);
    QVERIFY(plan::change_after_device_shortfall(cpu, 1ull << 30).empty());
  }

  void aRanksDeviceShortfallIsPlannedForEveryRank() {
    // zero stage 2 over 2 ranks, a GPU each: the hint weighs one rank's device in the 2-rank plan
    // (its shard of the gradients and the optimizer state), not a one-process job's.
    auto in = inputs(64ull << 30);
    in.profile.gpus = {test_gpu(80ull << 30, true), test_gpu(80ull << 30, true)};
    in.spec.precision = "bf16";
    in.spec.training.batch_size = 1;
    in.spec.strategy = {"zero", {{"stage", 2}, {"device", "cuda"}}};
    in.processes = 2;
    in.processes_per_node = 2;
    const plan::Plan two = plan::make_plan(in);
    QVERIFY(two.fits && two.tiers[0].tier == "device");
    QVERIFY(plan::applied_changes(in.spec, two.settings).empty());
    const std::uint64_t per_rank = two.tiers[0].estimate.peak();
    auto one = in;
    one.processes = 1;
    one.processes_per_node = 0;
    one.spec.strategy = {"single", {{"device", "cuda"}}};
    QVERIFY(plan::make_plan(one).tiers[0].estimate.peak() > per_rank);
    for (plan::GpuInfo& g : in.profile.gpus)
      g.memory = static_cast<std::uint64_t>(1.2 * static_cast<double>(per_rank));
    const std::string hint = plan::change_after_device_shortfall(
        in, static_cast<std::uint64_t>(1.5 * static_cast<double>(per_rank)));
    const std::string planned = "the plan's estimate for this job (" + core::human_bytes(per_rank) +
                                " of " + core::human_bytes(in.profile.gpus[0].memory) + ")";
    QVERIFY2(hint.find("needed at least 1.5× " + planned) != std::string::npos, hint.c_str());
    QVERIFY2(hint.find("the plan's smallest change that fits") != std::string::npos ||
                 hint.find("nothing fits") != std::string::npos,
             hint.c_str());
    // A device the plan already found too small (the job ran as written): the estimate of the
    // job as it ran is still one rank's of the 2.
    for (plan::GpuInfo& g : in.profile.gpus)
      g.memory = static_cast<std::uint64_t>(0.8 * static_cast<double>(per_rank));
    const std::string short_hint = plan::change_after_device_shortfall(in, 0);
    QVERIFY2(short_hint.find("the plan's estimate for this job (" + core::human_bytes(per_rank) +
                             ") is more than the device's") != std::string::npos,
             short_hint.c_str());
  }

  void theCpuAdamOfADeviceTiersHostSharesAddsToTheStep() {
    // gemini on a GPU with the optimizer state in host memory and on disk: the CPU Adam updates
    // that share of the trainable elements after the backward, at the profile's measured rate.
    auto in = named_gemini_on_a_gpu(0.0);
    in.profile.disk = measured_disk();
    const plan::Plan on_device = plan::make_plan(in);
    QCOMPARE(on_device.host_update_seconds_per_step, 0.0);
    in.spec.strategy.options["host_optim_frac"] = 0.5;
    in.spec.strategy.options["offload_optim_frac"] = 0.25;
    const plan::Plan unmeasured = plan::make_plan(in);
    QCOMPARE(unmeasured.host_update_seconds_per_step, 0.0);
    QCOMPARE(unmeasured.seconds_per_step - unmeasured.disk_seconds_per_step,
             on_device.seconds_per_step);
    QVERIFY(std::any_of(unmeasured.reasons.begin(), unmeasured.reasons.end(), [](const auto& r) {
      return r.find("the CPU Adam's rate was not measured") != std::string::npos;
    }));
    in.profile.cpu_adam_elements_per_s = 200e6;
    in.profile.cpu_adam_source = "measured: a test's Adam";
    const plan::Plan p = plan::make_plan(in);
    const double expected = 0.75 * static_cast<double>(p.trainable_parameters) / 200e6;
    QVERIFY(std::abs(p.host_update_seconds_per_step - expected) <= 1e-12 * expected);
    // The update of the shards in host memory (0.5 of the 0.75; those on disk are updated at
    // once) runs behind the next forward, whose share of the compute (2 of 6 FLOPs) hides it.
    const double forward =
        on_device.seconds_per_step * 2.0 / (p.settings.activation_checkpointing ? 8.0 : 6.0);
    const double hidden = std::min(expected * 0.5 / 0.75, forward);
    QVERIFY(hidden > 0.0);
    QVERIFY(std::abs(p.seconds_per_step - (unmeasured.seconds_per_step + expected - hidden)) <=
            1e-9 * p.seconds_per_step);
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.find("the CPU Adam updates") != std::string::npos &&
             r.find("at 200 M elements/s (measured: a test's Adam), added to the step less ") !=
                 std::string::npos &&
             r.find("that the next forward hides") != std::string::npos;
    }));
    // LoRA's adapters are updated at once (gathered after every update): nothing hidden.
    in.spec.method.type = "lora";
    const plan::Plan lora = plan::make_plan(in);
    QVERIFY(std::none_of(lora.reasons.begin(), lora.reasons.end(), [](const std::string& r) {
      return r.find("that the next forward hides") != std::string::npos;
    }));
    QCOMPARE(plan::to_json(p)["time"]["host_update_seconds_per_step"].get<double>(),
             p.host_update_seconds_per_step);
  }

  // gemini on a GPU with parameter shards and optimizer state in host memory: the plan counts
  // the bytes its copies move per step (parameter shards up for each forward and backward,
  // float32 gradient shards down, new values up where the values stay on the GPU) and their
  // seconds at the GPU's measured copy rates; what the compute (and, for the new values, the CPU
  // Adam) does not hide is added to the step. Unmeasured rates leave the time as it was and say
  // so.
  void theDeviceTiersCopiesAddWhatTheComputeDoesNotHide() {
    auto in = named_gemini_on_a_gpu(0.5);
    in.spec.strategy.options["host_optim_frac"] = 1.0;
    const plan::Plan unmeasured = plan::make_plan(in);
    QCOMPARE(unmeasured.copy_seconds_per_step, 0.0);
    QVERIFY(std::any_of(unmeasured.reasons.begin(), unmeasured.reasons.end(), [](const auto& r) {
      return r.find("the GPU's copy rates were not measured") != std::string::npos;
    }));
    plan::GpuRates& rates = in.profile.gpus[0].rates;
    rates.measured = true;
    rates.fp32_flops = rates.bf16_flops = 50e12;
    rates.measured_at = "2026-12-06T05:00:00Z";
    const auto with_rates = [&](double up, double down) {
      rates.host_to_device_bytes_per_s = up;
      rates.device_to_host_bytes_per_s = down;
      return plan::make_plan(in);
    };
    // Fast copies: those beside the compute hidden behind it.
    const plan::Plan fast = with_rates(1e15, 1e15);
    const double n = static_cast<double>(fast.total_parameters);
    const double trainable = static_cast<double>(fast.trainable_parameters);
    const double micro_batches = static_cast<double>(fast.settings.gradient_accumulation);
    QCOMPARE(fast.settings.precision, std::string("fp32"));
    const double up = 2.0 * micro_batches * 0.5 * n * 4.0, down = micro_batches * trainable * 4.0,
                 values = 0.5 * trainable * 4.0;
    const auto near_rel = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::abs(b); };
    // Up and down on a stream each: the forward's shards up alone, the backward's beside the
    // gradients going down.
    QVERIFY(
        near_rel(fast.copy_seconds_per_step, (up / 2 + std::max(up / 2, down) + values) / 1e15));
    // (The new values follow the CPU Adam, unmeasured here: nothing hides them.)
    QVERIFY(near_rel(fast.exposed_copy_seconds_per_step, values / 1e15));
    // Slow copies (1 MB/s up, 3 MB/s down): the compute (and the CPU Adam, unmeasured here)
    // hide only the compute's seconds; the rest is in the step.
    const plan::Plan slow = with_rates(1e6, 3e6);
    const double during = up / 2 / 1e6 + std::max(up / 2 / 1e6, down / 3e6);
    QVERIFY(near_rel(slow.copy_seconds_per_step, during + values / 1e6));
    const double compute = fast.modelled_seconds_per_step;
    QVERIFY(near_rel(slow.exposed_copy_seconds_per_step, during - compute + values / 1e6));
    QVERIFY(near_rel(slow.seconds_per_step,
                     fast.seconds_per_step + slow.exposed_copy_seconds_per_step));
    QVERIFY(std::any_of(slow.reasons.begin(), slow.reasons.end(), [](const std::string& r) {
      return r.find("copies between host memory and the GPU: ") != std::string::npos &&
             r.find("of parameter shards up for the forward and backward") != std::string::npos;
    }));
    QVERIFY(std::any_of(slow.reasons.begin(), slow.reasons.end(), [](const std::string& r) {
      return r.find("of them beyond it added to the step") != std::string::npos;
    }));
    const auto time = plan::to_json(slow)["time"];
    QCOMPARE(time["copy_seconds_per_step"].get<double>(), slow.copy_seconds_per_step);
    QCOMPARE(time["exposed_copy_seconds_per_step"].get<double>(),
             slow.exposed_copy_seconds_per_step);
  }

  // ZeRO-Offload on one GPU: the CPU Adam of every trainable element, the gradients' copy down
  // after the backward and the new values' copy up after the update, at the measured rates,
  // are added to the step (nothing overlaps them); the host holds the masters (and in bf16 the
  // rounded values for the copy up), the gradients and the moments.
  void zeroOffloadOnAGpuAddsTheCpuAdamAndItsCopiesToTheStep() {
    for (const std::string precision : {"fp32", "bf16"}) {
      auto in = inputs(64ull << 30);
      in.spec.training.batch_size = 1;
      in.spec.precision = precision;
      in.profile.gpus.push_back(test_gpu(80ull << 30, /*bf16=*/true));
      plan::GpuRates& rates = in.profile.gpus[0].rates;
      rates.measured = true;
      rates.fp32_flops = rates.bf16_flops = 50e12;
      rates.measured_at = "2026-12-06T09:00:00Z";
      rates.host_to_device_bytes_per_s = 2e9;
      rates.device_to_host_bytes_per_s = 1e9;
      in.profile.cpu_adam_elements_per_s = 200e6;
      in.spec.strategy = {"zero", {{"stage", 2}, {"device", "cuda"}}};
      const plan::Plan on_gpu = plan::make_plan(in);
      in.spec.strategy.options["offload_optimizer"] = true;
      const plan::Plan offloaded = plan::make_plan(in);
      QVERIFY(offloaded.settings.zero_offload);
      QCOMPARE(offloaded.settings.micro_batch, on_gpu.settings.micro_batch);
      QCOMPARE(offloaded.settings.precision, precision);
      const double n = static_cast<double>(offloaded.trainable_parameters);
      const double value = precision == "bf16" ? 2.0 : 4.0;
      const auto near_rel = [](double a, double b) {
        return std::abs(a - b) <= 1e-9 * std::abs(b);
      };
      QVERIFY(near_rel(offloaded.host_update_seconds_per_step, n / 200e6));
      const double copies = n * 4.0 / 1e9 + n * value / 2e9;
      QVERIFY(near_rel(offloaded.copy_seconds_per_step, copies));
      QVERIFY(near_rel(offloaded.exposed_copy_seconds_per_step, copies));
      QVERIFY(near_rel(offloaded.seconds_per_step, on_gpu.seconds_per_step + n / 200e6 + copies));
      QCOMPARE(on_gpu.copy_seconds_per_step, 0.0);
      QVERIFY(std::any_of(offloaded.reasons.begin(), offloaded.reasons.end(), [](const auto& r) {
        return r.find("ZeRO-Offload's copies between host memory and the GPU") != std::string::npos;
      }));
      const plan::MemoryEstimate& host = offloaded.tiers.at(1).estimate;
      QCOMPARE(offloaded.tiers[1].tier, std::string("host"));
      QVERIFY(std::abs(static_cast<double>(host.weights) -
                       n * (4.0 + (value == 2.0 ? 2.0 : 0.0))) <= 1.0);
      QVERIFY(std::abs(static_cast<double>(host.gradients) - n * 4.0) <= 1.0);
      QVERIFY(std::abs(static_cast<double>(host.optimizer) - n * 8.0) <= 1.0);
      // Stage 2 offloaded keeps stage 2's gradients on the GPU: its share and two buckets.
      QCOMPARE(offloaded.tiers[0].estimate.gradients, on_gpu.tiers[0].estimate.gradients);
    }
  }

  void planGeminiOnTheGpuByItsShares() {
    // gemini named on cuda with the optimizer split GPU 30% / host 40% / disk 30%: three tiers
    // holding those shares of the moments, and no warning that the GPU is not modelled.
    const auto model = config(small_llama());
    const double n = static_cast<double>(plan::count_parameters(model));
    auto in = inputs(64ull << 30);
    in.profile.gpus.push_back(test_gpu());
    in.profile.disk = plan::DiskInfo{};
    in.profile.disk->path = "/tmp";
    in.profile.disk->free = 100ull << 30;
    in.spec.strategy = {"gemini",
                        {{"device", "cuda"},
                         {"host_optim_frac", 0.4},
                         {"offload_optim_frac", 0.3},
                         {"host_param_frac", 0.5},
                         {"device_budget", "2GiB"}}};
    const plan::Plan p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.tiers.size(), std::size_t{3});
    QCOMPARE(p.tiers[0].tier, std::string("device"));
    QCOMPARE(p.tiers[0].budget, std::uint64_t(2) << 30);  // device_budget, below the GPU's 80
    QCOMPARE(p.tiers[1].tier, std::string("host"));
    QCOMPARE(p.tiers[2].tier, std::string("disk"));
    // Whole chunks' shards are placed (16 MiB chunks here: 32 MiB of moments each), so each
    // tier holds its share within one chunk; the disk's files are padded for the sliced update.
    const auto near = [&](std::uint64_t bytes, double share) {
      return std::abs(static_cast<double>(bytes) - share * 8.0 * n) <= 8.0 * (4 << 20);
    };
    QVERIFY(near(p.tiers[0].estimate.optimizer, 0.3));
    QVERIFY(near(p.tiers[1].estimate.optimizer, 0.4));
    QVERIFY(near(p.tiers[2].estimate.optimizer, 0.3));
    const std::uint64_t moments = p.tiers[0].estimate.optimizer + p.tiers[1].estimate.optimizer +
                                  p.tiers[2].estimate.optimizer;
    QVERIFY(moments >= 8.0 * n && moments <= 8.0 * n + (1 << 20));
    // Half the parameter bytes are homed on the host: the GPU holds the rest and a cache of at
    // most four chunks of them (here, 16 MiB chunks: all of them).
    QVERIFY(p.tiers[1].estimate.weights >= static_cast<std::uint64_t>(0.5 * 4.0 * n));
    QVERIFY(p.tiers[0].estimate.weights <= static_cast<std::uint64_t>(4.0 * n));
    QVERIFY(std::none_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.find("planned as if it computed on the CPU") != std::string::npos;
    }));
    // A quarter of the parameters on disk and a quarter in host memory: the disk tier holds
    // that quarter's bytes besides the optimizer's share, the GPU half of them plus its cache,
    // and the host the copies of chunks from disk on their way (at most six of 16 MiB).
    in.spec.strategy = {"gemini",
                        {{"device", "cuda"},
                         {"host_optim_frac", 0.4},
                         {"offload_optim_frac", 0.3},
                         {"offload_param_frac", 0.25},
                         {"host_param_frac", 0.25},
                         {"device_budget", "2GiB"}}};
    const plan::Plan q = plan::make_plan(in);
    QVERIFY(q.fits);
    QCOMPARE(q.tiers.size(), std::size_t{3});
    const double parameter_bytes = 4.0 * n;
    QVERIFY(std::abs(static_cast<double>(q.tiers[0].estimate.disk_parameters) -
                     0.25 * parameter_bytes) <= double(16 << 20));  // within a chunk
    QCOMPARE(q.tiers[2].estimate.weights, q.tiers[0].estimate.disk_weights);
    QVERIFY(q.tiers[2].estimate.weights > p.tiers[2].estimate.weights);
    QVERIFY(q.tiers[1].estimate.offload_buffers > p.tiers[1].estimate.offload_buffers);
    QVERIFY(q.tiers[1].estimate.offload_buffers - p.tiers[1].estimate.offload_buffers <=
            6ull * (16ull << 20));
    QVERIFY(q.tiers[1].estimate.weights < p.tiers[1].estimate.weights);
    QVERIFY(std::any_of(q.reasons.begin(), q.reasons.end(), [](const std::string& r) {
      return r.find("25% of the parameters on disk") != std::string::npos;
    }));
  }

  // Shards on the GPU whose optimizer state is in host memory: the host holds their float32
  // masters (in fp32 too: the values stay on the GPU) and the staging of the CPU Adam's new
  // values on their way up, kStagedUpdates buffers of the largest such shard (the plugin's
  // prepare_values_staging), not a copy of every shard's values.
  void theDeviceTiersShardsUpdatedOffItAreStagedInHostMemory() {
    for (const json& doc : {small_llama(), wide_llama()}) {
      const auto model = config(doc);
      const double n = static_cast<double>(plan::count_parameters(model));
      for (const std::string precision : {"fp32", "bf16"}) {
        plan::Settings s = settings(1, false, "full");
        s.strategy = "gemini";
        s.precision = precision;
        s.on_gpu = s.device_tier = true;
        const auto host_weights = [&](double host_optim) {
          plan::Settings t = s;
          t.host_optim_frac = host_optim;
          return static_cast<double>(plan::estimate_host_memory(model, t, 0).weights);
        };
        const double element = precision == "bf16" ? 2.0 : 4.0;
        const double staging = host_weights(1.0) - host_weights(0.0) - 4.0 * n;
        const auto chunk_limit = static_cast<double>(memory::kMaxChunkBytes);
        qInfo("%s, %.0fM parameters: staging %.1f MiB, the values %.1f MiB", precision.c_str(),
              n / 1e6, staging / (1 << 20), element * n / (1 << 20));
        QVERIFY(staging > 0.0);
        QVERIFY(staging <= static_cast<double>(memory::kStagedUpdates) * chunk_limit);
        // Two buffers of one shard, far from every shard's values.
        QVERIFY(staging <= 0.5 * element * n);
      }
    }
  }

  void planPicksSmallerMicroBatch() {
    const auto p = plan::make_plan(inputs(budget_for(settings(4, false, "full"))));
    QVERIFY(p.fits);
    QCOMPARE(p.settings.micro_batch, std::int64_t(4));
    QCOMPARE(p.settings.gradient_accumulation, std::int64_t(2));
    QVERIFY(!p.settings.activation_checkpointing);
    QVERIFY(p.tiers.at(0).estimate.peak() <= p.tiers.at(0).budget);
  }

  void planTurnsOnCheckpointingOnlyWhenNeeded() {
    const auto p = plan::make_plan(inputs(budget_for(settings(8, true, "full"))));
    QVERIFY(p.fits);
    // Batch 8 with checkpointing fits but micro-batch 1 without might too: the planner
    // prefers no checkpointing when any micro-batch fits without it.
    const bool mb1_fits =
        plan::estimate_memory(config(small_llama()), settings(1, false, "full"), 0).peak() <=
        budget_for(settings(8, true, "full")) * 0.9;
    QCOMPARE(p.settings.activation_checkpointing, !mb1_fits);
    const auto tight = plan::make_plan(inputs(budget_for(settings(1, true, "full"))));
    QVERIFY(tight.fits);
    QVERIFY(tight.settings.activation_checkpointing);
  }

  void planSwitchesToLoraWhenFullCannotFit() {
    const auto p = plan::make_plan(inputs(budget_for(settings(1, true, "lora"))));
    QVERIFY(p.fits);
    QCOMPARE(p.settings.method, std::string("lora"));
    QVERIFY(!p.reasons.empty());
  }

  // When LoRA does not fit even at micro-batch 1 with checkpointing, auto trains QLoRA (NF4
  // with double-quantized absmax) and says so; the runner lists it among the changes. A spec
  // that names a strategy without QLoRA gets none. (In bf16: in fp32 the merged export's dense
  // copy outweighs what quantizing saves, a LoRA run merging in place.)
  void planQuantizesTheBaseWhenLoraCannotFit() {
    auto in = inputs(0, "lora");
    in.model = config(wide_llama());
    in.spec.strategy.name = "auto";
    in.spec.precision = "bf16";
    in.profile.cpu.avx512_bf16 = true;
    plan::Settings lora = settings(1, true, "lora");
    lora.precision = "bf16";
    plan::Settings qlora = lora;
    qlora.quantize = "nf4";
    qlora.double_quant = true;
    const auto peak_of = [&](const plan::Settings& s) {
      return plan::estimate_memory(in.model, s, 0).peak();
    };
    const std::uint64_t lora_peak = peak_of(lora);
    QVERIFY(peak_of(qlora) < lora_peak);
    in.profile.memory.simulated =
        static_cast<std::uint64_t>(static_cast<double>(lora_peak) / (1.0 - plan::kHeadroom)) - 4096;
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.settings.method, std::string("lora"));
    QCOMPARE(p.settings.quantize, std::string("nf4"));
    QVERIFY(p.settings.double_quant);
    QCOMPARE(p.strategy, std::string("single"));
    bool said = false;
    for (const auto& r : p.reasons) said = said || r.find("QLoRA (rank 8") != std::string::npos;
    QVERIFY(said);
    QVERIFY(p.explanation.find("QLoRA (rank 8, nf4 base)") != std::string::npos);
    bool listed = false;
    for (const auto& change : plan::applied_changes(in.spec, p.settings))
      listed = listed || change.find("(QLoRA) instead of a dense one") != std::string::npos;
    QVERIFY(listed);
    const auto applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.method.quantize, std::string("nf4"));
    QVERIFY(applied.method.double_quant);
    // Named gemini: QLoRA is auto's and single's answer; gemini keeps the dense base it was
    // given (its chunks go to disk instead).
    in.spec.strategy.name = "gemini";
    QCOMPARE(plan::make_plan(in).settings.quantize, std::string("none"));
  }

  // On a GPU as on the CPU: where LoRA does not fit the GPU even at micro-batch 1 with
  // checkpointing, auto first spills its frozen base to host memory (gemini's device tier, the
  // method kept), and where the host has no room either trains QLoRA on the GPU (single: the
  // quantized base moves to the GPU with the model), its workspace a tile dequantized by the CUDA
  // kernel straight into the compute dtype, as on the CPU. gemini's device tier holds the base on
  // the GPU, and zero over ranks plans each rank's GPU.
  void qloraOnAGpuPlansTheQuantizedBaseThere() {
    auto in = inputs(64ull << 30, "lora");
    in.model = config(wide_llama());
    in.spec.strategy.name = "auto";
    in.spec.precision = "bf16";
    plan::Settings lora = settings(1, true, "lora");
    lora.precision = "bf16";
    lora.on_gpu = true;
    plan::Settings qlora = lora;
    qlora.quantize = "nf4";
    qlora.double_quant = true;
    // What the GPU adds to the activations of QLoRA beyond what it adds to LoRA's (its fused
    // norm, its head's blocks): nothing, the tile is bf16 there as here (the torch-ops path,
    // for a device without the kernel, would take 8 bytes a value).
    const auto gpu_adds = [&](plan::Settings s) {
      const double there = static_cast<double>(plan::estimate_memory(in.model, s, 0).activations);
      s.on_gpu = false;
      return there - static_cast<double>(plan::estimate_memory(in.model, s, 0).activations);
    };
    QVERIFY(near(gpu_adds(qlora), gpu_adds(lora)));
    QVERIFY(gpu_adds(lora) != 0.0);  // the GPU's own terms are there
    const auto on_gpu = plan::estimate_memory(in.model, qlora, 0);
    const std::uint64_t lora_peak = plan::estimate_memory(in.model, lora, 0).peak();
    QVERIFY(on_gpu.peak() < lora_peak);
    in.profile.gpus.push_back(test_gpu(
        static_cast<std::uint64_t>(static_cast<double>(lora_peak) / (1.0 - plan::kHeadroom)) - 4096,
        /*bf16=*/true));
    // With room in host memory LoRA keeps its method: gemini's device tier with the frozen
    // base's chunks partly in host memory; QLoRA, whole on the GPU, is the alternative shown.
    const auto spilled = plan::make_plan(in);
    QVERIFY(spilled.fits);
    QCOMPARE(spilled.strategy, std::string("gemini"));
    QVERIFY(spilled.settings.device_tier && spilled.settings.host_param_frac > 0.0);
    QCOMPARE(spilled.settings.method, std::string("lora"));
    QCOMPARE(spilled.settings.quantize, std::string("none"));
    QVERIFY(std::any_of(spilled.reasons.begin(), spilled.reasons.end(), [](const std::string& r) {
      return r.rfind("LoRA does not fit in ", 0) == 0 &&
             r.find("of the GPU with everything there: gemini's device tier keeps") !=
                 std::string::npos;
    }));
    QCOMPARE(spilled.alternatives.size(), std::size_t{1});
    QCOMPARE(spilled.alternatives[0].settings.quantize, std::string("nf4"));
    QVERIFY2(spilled.alternatives[0].summary.rfind(
                 "QLoRA (rank 8, nf4 base) with everything on the GPU would fit too", 0) == 0 &&
                 spilled.alternatives[0].summary.find("the method changes") != std::string::npos,
             spilled.alternatives[0].summary.c_str());
    // Without room in host memory either: QLoRA on the GPU.
    in.profile.memory.simulated = 64ull << 20;
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.tiers.at(0).tier, std::string("device"));
    QCOMPARE(p.strategy, std::string("single"));
    QCOMPARE(p.settings.quantize, std::string("nf4"));
    QVERIFY(p.settings.double_quant && p.settings.on_gpu);
    QCOMPARE(p.tiers.at(0).estimate.peak(), plan::estimate_memory(in.model, p.settings, 0).peak());
    bool said = false;
    for (const auto& r : p.reasons) said = said || r.find("QLoRA (rank 8") != std::string::npos;
    QVERIFY(said);
    // gemini named: its device tier, the quantized base among the GPU's weights (the simulated
    // device computes in host memory, where the base stays).
    in.profile.memory.simulated = 64ull << 30;
    in.spec.method.quantize = "nf4";
    in.spec.strategy = {"gemini", {{"device", "cuda"}, {"host_optim_frac", 0.5}}};
    const auto gemini = plan::make_plan(in);
    QCOMPARE(gemini.tiers.at(0).tier, std::string("device"));
    QVERIFY(gemini.settings.device_tier && gemini.settings.quantize == "nf4");
    plan::Settings simulated = gemini.settings;
    simulated.simulated_device = true;
    const double quantized_bytes = plan::cost::quantized_base(in.model, gemini.settings).bytes;
    QVERIFY(quantized_bytes > 0);
    QVERIFY(near(static_cast<double>(plan::estimate_memory(in.model, gemini.settings, 0).weights) -
                     static_cast<double>(plan::estimate_memory(in.model, simulated, 0).weights),
                 quantized_bytes));
    QVERIFY(near(
        static_cast<double>(plan::estimate_host_memory(in.model, simulated, 0).weights) -
            static_cast<double>(plan::estimate_host_memory(in.model, gemini.settings, 0).weights),
        quantized_bytes));
    // Two ranks, a GPU each: zero named plans them on the GPUs.
    in.spec.strategy = {"zero", nlohmann::json::object()};
    in.processes = in.processes_per_node = 2;
    in.profile.gpus.push_back(in.profile.gpus[0]);
    in.profile.gpus[0].memory = in.profile.gpus[1].memory = 80ull << 30;
    const auto ranks = plan::make_plan(in);
    QCOMPARE(ranks.tiers.at(0).tier, std::string("device"));
    QCOMPARE(ranks.settings.quantize, std::string("nf4"));
  }

  // Full fine-tuning on a GPU that not even gemini's device tier fits (the host too small for
  // its optimizer state) falls back to LoRA, and LoRA too spills its frozen base to host memory
  // before the base is quantized.
  void fullFineTuningOnAGpuFallsBackToLoraSpilledToTheHost() {
    auto in = inputs(64ull << 30, "full");
    in.model = config(wide_llama());
    in.spec.precision = "bf16";
    plan::Settings lora = settings(1, true, "lora");
    lora.precision = "bf16";
    lora.on_gpu = true;
    const std::uint64_t lora_peak = plan::estimate_memory(in.model, lora, 0).peak();
    in.profile.gpus.push_back(test_gpu(
        static_cast<std::uint64_t>(static_cast<double>(lora_peak) / (1.0 - plan::kHeadroom)) - 4096,
        /*bf16=*/true));
    // The host holds LoRA's base with room to spare, not full fine-tuning's optimizer state.
    plan::Settings base_on_host = lora;
    base_on_host.strategy = "gemini";
    base_on_host.device_tier = true;
    base_on_host.host_param_frac = base_on_host.host_optim_frac = 1.0;
    const std::uint64_t host_needs = plan::estimate_host_memory(in.model, base_on_host, 0).peak();
    plan::Settings full_on_host = base_on_host;
    full_on_host.method = "full";
    QVERIFY(plan::estimate_host_memory(in.model, full_on_host, 0).peak() > 2 * host_needs);
    in.profile.memory.simulated =
        static_cast<std::uint64_t>(static_cast<double>(host_needs) / (1.0 - plan::kHeadroom)) * 3 /
        2;
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.settings.method, std::string("lora"));
    QCOMPARE(p.settings.quantize, std::string("none"));
    QVERIFY(p.settings.device_tier && p.settings.host_param_frac > 0.0);
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.find("LoRA (rank 8) on gemini's device tier, ") != std::string::npos &&
             r.find("in host memory, instead — the method changes") != std::string::npos;
    }));
  }

  // QLoRA over several processes: auto weighs only the strategies that take a quantized base
  // (ddp, zero, gemini), zero's and gemini's weights count the quantized bytes in place of the
  // dense ones, and hybrid named with a quantized base is refused by name.
  void qloraOverSeveralProcessesPlansStrategiesThatTakeIt() {
    auto in = inputs(64ull << 30, "lora");
    in.processes = 2;
    in.spec.method.quantize = "nf4";
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.settings.quantize, std::string("nf4"));
    QVERIFY(!p.candidates.empty());
    for (const auto& candidate : p.candidates)
      QVERIFY2(candidate.settings.strategy == "ddp" || candidate.settings.strategy == "zero" ||
                   candidate.settings.strategy == "gemini",
               candidate.settings.strategy.c_str());
    plan::Settings zero = p.settings;
    zero.strategy = "zero";
    zero.zero_stage = 2;
    plan::Settings dense = zero;
    dense.quantize = "none";
    const hf::ModelConfig c = in.model;
    const double quantized_bytes = plan::cost::quantized_base(c, zero).bytes;
    QVERIFY(quantized_bytes > 0);
    const double saved = static_cast<double>(plan::estimate_memory(c, dense, 0, 2).weights) -
                         static_cast<double>(plan::estimate_memory(c, zero, 0, 2).weights);
    // The quantized linears' dense float32 bytes, less what their quantized form holds.
    QVERIFY(near(saved, plan::cost::quantized_base(c, zero).elements * 4.0 - quantized_bytes));
    // gemini in one process: the quantized linears leave its chunks and sit beside them.
    plan::Settings gemini = zero;
    gemini.strategy = "gemini";
    plan::Settings gemini_dense = gemini;
    gemini_dense.quantize = "none";
    const double gemini_saved =
        static_cast<double>(plan::estimate_memory(c, gemini_dense, 0, 1).weights) -
        static_cast<double>(plan::estimate_memory(c, gemini, 0, 1).weights);
    QVERIFY(
        near(gemini_saved, plan::cost::quantized_base(c, gemini).elements * 4.0 - quantized_bytes));
    for (const std::string name : {"hybrid"}) {
      in.spec.strategy.name = name;
      bool refused = false;
      try {
        plan::make_plan(in);
      } catch (const tessera::Error& e) {
        refused = std::string(e.what()).find("method.quantize under strategy " + name +
                                             " is not supported yet") != std::string::npos;
      }
      QVERIFY2(refused, name.c_str());
    }
  }

  // Preference tuning: a full fine-tune's frozen reference copy is weights (every parameter in
  // the compute dtype) under single, and under gemini beside its chunks; over several processes
  // auto weighs the strategies that take preference tuning (gemini among them) and hybrid named
  // is refused by name.
  void preferenceCountsTheReferenceCopy() {
    const hf::ModelConfig c = config(small_llama());
    const double n = static_cast<double>(plan::count_parameters(c));
    for (const std::string strategy : {"single", "gemini"}) {
      for (const std::string precision : {"fp32", "bf16"}) {
        plan::Settings s = settings(1, true, "full");
        s.strategy = strategy;
        s.precision = precision;
        plan::Settings with = s;
        with.reference_copy = true;
        const double added = static_cast<double>(plan::estimate_memory(c, with, 0).weights) -
                             static_cast<double>(plan::estimate_memory(c, s, 0).weights);
        QVERIFY2(near(added, n * (precision == "bf16" ? 2.0 : 4.0)),
                 (strategy + " " + precision).c_str());
      }
    }
    auto in = inputs(64ull << 30);
    in.processes = 2;
    in.spec.method.preference = job::PreferenceSpec{};
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QVERIFY(p.settings.reference_copy);
    bool gemini = false;
    for (const auto& candidate : p.candidates) {
      QVERIFY(candidate.settings.strategy != "hybrid");
      gemini = gemini || candidate.settings.strategy == "gemini";
    }
    QVERIFY(gemini);
    in.spec.strategy.name = "hybrid";
    bool refused = false;
    try {
      plan::make_plan(in);
    } catch (const tessera::Error& e) {
      refused =
          std::string(e.what()).find(
              "method.preference under strategy hybrid is not supported yet") != std::string::npos;
    }
    QVERIFY(refused);
  }

  void autoOffloadsToDiskBeforeChangingTheMethod() {
    // Full fp32 at micro-batch 1 with checkpointing does not fit with everything in RAM, but
    // does with the optimizer state on disk: gemini, the method kept, LoRA named as the
    // alternative.
    plan::Settings offloaded = settings(1, true, "full");
    offloaded.strategy = "gemini";
    offloaded.offload_optim_frac = 1.0;
    const std::uint64_t budget = budget_for(offloaded);
    QVERIFY(budget < budget_for(settings(1, true, "full")));
    auto in = inputs(budget);
    in.spec.strategy.name = "auto";
    in.profile.disk = plan::DiskInfo{};
    in.profile.disk->path = "/runs";
    in.profile.disk->free = 100ull << 30;
    in.profile.disk->measured = true;
    in.profile.disk->read_bytes_per_s = 1e9;
    in.profile.disk->write_bytes_per_s = 5e8;
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.strategy, std::string("gemini"));
    QCOMPARE(p.settings.method, std::string("full"));
    QVERIFY(p.settings.offload_optim_frac > 0.0);
    const double trainable = static_cast<double>(plan::count_parameters(in.model));
    QCOMPARE(p.tiers.size(), std::size_t{2});
    QCOMPARE(p.tiers[1].tier, std::string("disk"));
    // All of it, each file padded to whole slices of the update and whole I/O blocks (a few KiB
    // per chunk), with the float32 gradient shards beside it.
    QCOMPARE(p.settings.offload_optim_frac, 1.0);
    const auto padded = [](std::uint64_t bytes, double unpadded) {
      return static_cast<double>(bytes) >= unpadded &&
             static_cast<double>(bytes) <= unpadded + (256 << 10);
    };
    QVERIFY(padded(p.tiers[1].estimate.optimizer, trainable * 8.0));
    QVERIFY(padded(p.tiers[1].estimate.gradients, trainable * 4.0));
    // Disk time: at the measured speeds, the on-disk optimizer chunks read and written once per
    // step, the gradient chunks once per micro-batch (but the gradient file of the chunk read
    // ahead, which the update takes from memory, is not read back).
    const double micro_batches =
        static_cast<double>(in.spec.training.gradient_accumulation *
                            (in.spec.training.batch_size / p.settings.micro_batch));
    const double disk =
        static_cast<double>(p.tiers[1].estimate.optimizer + p.tiers[1].estimate.weights) +
        micro_batches * static_cast<double>(p.tiers[1].estimate.gradients);
    QVERIFY(p.disk_gradient_read_ahead_bytes > 0);
    const double read = disk - static_cast<double>(p.disk_gradient_read_ahead_bytes);
    QVERIFY(std::abs(p.disk_seconds_per_step - (read / 1e9 + disk / 5e8)) < 1e-9);
    QVERIFY(p.seconds_per_step > p.disk_seconds_per_step);
    QVERIFY(!p.alternatives.empty());
    QCOMPARE(p.alternatives[0].settings.method, std::string("lora"));
    const json j = plan::to_json(p);
    QCOMPARE(j["settings"]["strategy"].get<std::string>(), std::string("gemini"));
    // The runner applies it as the gemini strategy with that fraction; the method is kept.
    const auto applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.strategy.name, std::string("gemini"));
    QCOMPARE(applied.strategy.options["offload_optim_frac"].get<double>(),
             p.settings.offload_optim_frac);
    QCOMPARE(applied.method.type, std::string("full"));
    // Without a disk to offload to, the same budget means LoRA, and the reason says the method
    // changes.
    in.profile.disk.reset();
    const auto lora = plan::make_plan(in);
    QCOMPARE(lora.settings.method, std::string("lora"));
    bool said = false;
    for (const auto& r : lora.reasons)
      said = said || r.find("the method changes") != std::string::npos;
    QVERIFY(said);
  }

  void geminiCountsTheOptimizerShardReadAheadDuringBackward() {
    // One process with every optimizer shard on disk and the parameters in memory updates them
    // behind the next forward and reads the first chunk's shard during backward: the plan
    // holds one such shard (its file, at most the largest chunk's moments) beside the other
    // buffers, and that chunk's gradient file is not read back (the step reads that much less);
    // each of several ranks reads its own shard ahead; LoRA (whose adapters are updated in the
    // step) and parameter chunks on disk (no update behind the forward) read nothing ahead.
    const auto c = config(wide_llama());
    plan::Settings s = gemini_optimizer_on_disk();
    const auto one = plan::estimate_memory(c, s, 0);
    const double largest_chunk_moments =
        8.0 * static_cast<double>(std::max(c.vocab_size * c.hidden_size, std::int64_t{64} << 20));
    QVERIFY(one.optimizer_read_ahead > 0);
    QVERIFY(static_cast<double>(one.optimizer_read_ahead) <= largest_chunk_moments + 4096.0);
    QVERIFY(one.optimizer_read_ahead <= one.disk_optimizer);
    QVERIFY(one.offload_buffers >= one.optimizer_read_ahead);
    // The gradient file beside it: a third of its optimizer file (fp32: two moments), rounded up.
    QVERIFY(one.gradient_read_ahead > 0);
    QVERIFY(one.gradient_read_ahead <= one.optimizer_read_ahead / 2 + 4096);
    QVERIFY(one.gradient_read_ahead >= one.optimizer_read_ahead / 2 - 4096);
    const auto two = plan::estimate_memory(c, s, 0, 2);
    QVERIFY(two.optimizer_read_ahead > 0 && two.optimizer_read_ahead < one.optimizer_read_ahead);
    QVERIFY(two.gradient_read_ahead > 0 && two.gradient_read_ahead < one.gradient_read_ahead);
    s.offload_param_frac = 1.0;
    QCOMPARE(plan::estimate_memory(c, s, 0).optimizer_read_ahead, std::uint64_t(0));
    s.offload_param_frac = 0.0;
    s.method = "lora";
    QCOMPARE(plan::estimate_memory(c, s, 0).optimizer_read_ahead, std::uint64_t(0));
  }

  void geminiOneProcessWritesItsBf16GradientShardsFromHalfSizeCopies() {
    // One process in bf16 writes each gradient shard bound for disk as a bf16 copy and frees the
    // float32 shard as the copy is made: of the three shards on their way (the one being filled,
    // two written behind it) two are half-size copies. A bf16 chunk holds twice the elements of
    // an fp32 one (its bytes are fixed), so for equal chunks that is (4 + 2 + 2) x 2 bytes an
    // fp32 chunk's element against fp32's 4 + 4 + 4: 4/3 of fp32's, where three float32 shards
    // would be 2x. Beside them both hold autograd's largest gradient (bf16: and its float32
    // master gradient).
    const auto c = config(wide_llama());
    plan::Settings s = gemini_optimizer_on_disk();
    const auto fp32 = plan::estimate_memory(c, s, 0);
    s.precision = "bf16";
    const auto bf16 = plan::estimate_memory(c, s, 0);
    const double largest = static_cast<double>(
        std::max(c.vocab_size * c.hidden_size, c.intermediate_size * c.hidden_size));
    const double fp32_shards = static_cast<double>(fp32.gradients) - 4.0 * largest;
    const double bf16_shards = static_cast<double>(bf16.gradients) - 6.0 * largest;
    const double ratio = bf16_shards / fp32_shards;
    QVERIFY2(fp32_shards > 0 && ratio > 1.0 && ratio <= 4.0 / 3.0 + 0.01,
             std::to_string(ratio).c_str());
  }

  void parameterChunksOnDiskMoveParameterBytes() {
    // offload_param_frac moves that share of the parameter chunks' bytes (every parameter, in
    // the compute dtype) from the host's weights to the disk's, less a cache of at most four
    // chunks; LoRA's adapters stay on the host; the optimizer state is as before. Full
    // fine-tuning then exports streamed (host chunks + cache + a tensor at a time: far below
    // the in-memory export); LoRA brings the chunks home for the merge (the export as before).
    const auto c = config(wide_llama());
    const double n = static_cast<double>(plan::count_parameters(c));
    for (const std::string method : {"full", "lora"})
      for (const std::string precision : {"fp32", "bf16"}) {
        plan::Settings s = settings(1, true, method);
        s.precision = precision;
        s.strategy = "gemini";
        s.offload_optim_frac = 0.5;
        const auto in_ram = plan::estimate_memory(c, s, 0);
        QCOMPARE(in_ram.disk_parameters, std::uint64_t(0));
        const double element = precision == "bf16" ? 2.0 : 4.0;
        const double adapters =
            method == "lora" ? static_cast<double>(plan::count_lora_parameters(c, 8, {})) : 0.0;
        std::uint64_t previous_weights = in_ram.weights;
        for (double fp : {0.25, 0.5, 0.75, 1.0}) {
          s.offload_param_frac = fp;
          const auto e = plan::estimate_memory(c, s, 0);
          const std::string row = method + " " + precision + " " + std::to_string(fp);
          // Whole chunks' shards (at most 64 MiB each) go to disk.
          QVERIFY2(std::abs(static_cast<double>(e.disk_parameters) -
                            std::min(fp * (n + adapters), n) * element) <= double(64 << 20),
                   row.c_str());
          // What leaves memory is on disk, each file rounded up to whole 4 KiB I/O blocks.
          const auto files_of = [](std::uint64_t on_disk, double in_memory) {
            const double rounding = static_cast<double>(on_disk) - in_memory;
            return rounding >= 0 && rounding <= 64.0 * 4096;
          };
          QVERIFY2(files_of(e.weights + e.disk_parameters, static_cast<double>(in_ram.weights)),
                   row.c_str());
          QVERIFY2(e.weights < previous_weights, row.c_str());
          previous_weights = e.weights;
          QVERIFY2(near(e.disk_weights, in_ram.disk_weights + e.disk_parameters), row.c_str());
          QCOMPARE(e.disk(), in_ram.disk() + e.disk_parameters);
          QCOMPARE(e.disk_trainable_parameters, method == "full" ? e.disk_parameters : 0);
          QCOMPARE(e.optimizer, in_ram.optimizer);
          QCOMPARE(e.disk_optimizer, in_ram.disk_optimizer);
          QCOMPARE(e.gradients, in_ram.gradients);
          QCOMPARE(e.disk_gradients, in_ram.disk_gradients);
          QCOMPARE(e.activations, in_ram.activations);
          if (method == "lora") {
            QCOMPARE(e.export_peak, in_ram.export_peak);
          } else {
            const double largest = static_cast<double>(
                std::max(c.vocab_size * c.hidden_size, c.hidden_size * c.intermediate_size));
            // The parameters in memory (those not on disk, whose files round up to 4 KiB
            // blocks) and the chunks read from disk, at most four of at most 64 MiB, never more
            // than is there.
            const double in_memory = n * element - static_cast<double>(e.disk_parameters);
            const double floor =
                in_memory + 8.0 * largest + static_cast<double>(plan::kRuntimeBaselineBytes);
            const double read = static_cast<double>(e.export_peak) - floor;
            QVERIFY2(read > 0 && read <= static_cast<double>(e.disk_parameters) + 64.0 * 4096 &&
                         read <= 4.0 * (64 << 20),
                     row.c_str());
            QVERIFY2(e.export_peak < in_ram.export_peak, row.c_str());
          }
          // The cache: the chunks from disk resident at once, four of at most 64 MiB, never
          // more than is on disk. With every parameter in memory the update of full fine-tuning
          // runs behind the next forward and the first chunk's optimizer shard is read ahead
          // during backward (its buffer, which no run with parameter chunks on disk holds).
          QCOMPARE(in_ram.optimizer_read_ahead > 0, method == "full");
          QCOMPARE(e.optimizer_read_ahead, std::uint64_t(0));
          const std::uint64_t cache =
              e.offload_buffers - (in_ram.offload_buffers - in_ram.optimizer_read_ahead);
          QVERIFY2(cache > 0 && cache <= e.disk_parameters && cache <= 4 * (64ull << 20),
                   row.c_str());
          QVERIFY2(files_of(e.training_peak() + e.disk_parameters,
                            static_cast<double>(in_ram.training_peak() -
                                                in_ram.optimizer_read_ahead + cache)),
                   row.c_str());
          // Loading writes the shards on disk through one chunk's buffer (at most 64 MiB).
          const double loading = static_cast<double>(e.load_peak + e.disk_parameters) -
                                 static_cast<double>(in_ram.load_peak);
          QVERIFY2(loading > 0 && loading <= double(64 << 20), row.c_str());
        }
        // At 1, all of the base is on disk; only the adapters (LoRA) and the fp32 masters of
        // the optimizer chunks on the host (bf16) stay.
        QVERIFY2(std::abs(static_cast<double>(plan::estimate_memory(c, s, 0).weights) -
                          (static_cast<double>(in_ram.weights) - n * element)) <= 4.0,
                 (method + " " + precision).c_str());
      }
    // Without gemini the option means nothing.
    plan::Settings single = settings(1, true, "full");
    single.offload_param_frac = 1.0;
    QCOMPARE(plan::estimate_memory(c, single, 0).disk(), std::uint64_t(0));
  }

  void parameterChunksOnDiskAddDiskTraffic() {
    // Per step: a micro-batch's forward and backward read the parameter chunks on disk that the
    // chunk cache does not still hold; full fine-tuning's update reads them once more and writes
    // them back; LoRA's frozen base is never written. The disk time at the measured speeds adds
    // to the step time.
    for (const std::string method : {"full", "lora"}) {
      auto in = inputs(64ull << 30, method);
      in.spec.strategy.name = "gemini";
      in.spec.training.gradient_accumulation = 2;
      in.profile.disk = measured_disk();
      in.spec.strategy.options = {{"offload_optim_frac", 0.5}};
      const auto base = plan::make_plan(in);
      in.spec.strategy.options["offload_param_frac"] = 0.5;
      const auto p = plan::make_plan(in);
      QVERIFY(base.fits && p.fits);
      QCOMPARE(p.strategy, std::string("gemini"));
      QCOMPARE(p.settings.offload_param_frac, 0.5);
      QCOMPARE(base.settings.offload_param_frac, 0.0);
      QCOMPARE(p.settings.micro_batch, base.settings.micro_batch);
      const double micro_batches =
          static_cast<double>(in.spec.training.gradient_accumulation *
                              (in.spec.training.batch_size / p.settings.micro_batch));
      QCOMPARE(micro_batches, 2.0);
      const std::uint64_t on_disk = p.tiers.at(0).estimate.disk_parameters;
      QVERIFY(on_disk > 0);
      QCOMPARE(p.tiers.at(1).tier, std::string("disk"));
      QCOMPARE(p.tiers.at(1).estimate.weights, base.tiers.at(1).estimate.weights + on_disk);
      // The gathers' reads as the plugin's chunk cache replays them: each chunk on disk at least
      // once a step (the update released them all), at most in every forward and backward; the
      // run's measured traffic is held to it in tests/parity/test_gemini.py.
      const std::uint64_t gathers = p.tiers.at(0).estimate.disk_gather_reads;
      QVERIFY2(gathers >= on_disk && gathers <= 2 * 2 * on_disk,
               qPrintable(QString("%1 read of %2 on disk").arg(gathers).arg(on_disk)));
      const double reads = static_cast<double>(gathers) +
                           (method == "full" ? 1.0 : 0.0) * static_cast<double>(on_disk);
      const double writes = method == "full" ? static_cast<double>(on_disk) : 0.0;
      // (With parameter chunks on disk the update does not run behind the forward, so nothing
      // is read ahead: the gradient file base kept in memory is read back.)
      QCOMPARE(p.disk_gradient_read_ahead_bytes, std::uint64_t(0));
      QCOMPARE(base.disk_gradient_read_ahead_bytes > 0, method == "full");
      const double kept = static_cast<double>(base.disk_gradient_read_ahead_bytes);
      QVERIFY(near(p.disk_read_bytes_per_step, base.disk_read_bytes_per_step + kept + reads));
      QVERIFY(near(p.disk_write_bytes_per_step, base.disk_write_bytes_per_step + writes));
      QCOMPARE(p.disk_bytes_per_step, p.disk_read_bytes_per_step + p.disk_write_bytes_per_step);
      QVERIFY(std::abs(p.disk_seconds_per_step - base.disk_seconds_per_step -
                       ((kept + reads) / 1e9 + writes / 5e8)) < 1e-6);
      // With parameters on disk nothing of the disk's time is hidden; with them in memory, full
      // fine-tuning's update runs behind the next forward (2 of the 6 FLOPs per parameter and
      // token), which hides up to its time.
      const double compute = p.seconds_per_step - p.disk_seconds_per_step;
      const double hidden =
          method == "full" ? std::min(base.disk_seconds_per_step, compute / 3.0) : 0.0;
      QVERIFY(std::abs(base.seconds_per_step - (compute + base.disk_seconds_per_step - hidden)) <
              1e-9);
      QCOMPARE(std::any_of(base.reasons.begin(), base.reasons.end(),
                           [](const std::string& r) {
                             return r.find("the update runs behind the next forward") !=
                                    std::string::npos;
                           }),
               method == "full");
      QVERIFY2(p.explanation.find("50% of the optimizer state and 50% of the parameters on disk") !=
                   std::string::npos,
               p.explanation.c_str());
      const json j = plan::to_json(p);
      QCOMPARE(j["settings"]["offload_param_frac"].get<double>(), 0.5);
      QCOMPARE(j["time"]["disk_read_bytes_per_step"].get<std::uint64_t>(),
               p.disk_read_bytes_per_step);
      QCOMPARE(j["time"]["disk_write_bytes_per_step"].get<std::uint64_t>(),
               p.disk_write_bytes_per_step);
      // Recorded in plan.json and read back.
      const auto read_back = plan::settings_from_json(j["settings"], "plan.json");
      QCOMPARE(read_back.offload_param_frac, 0.5);
      json bad = j["settings"];
      bad["offload_param_frac"] = 1.5;
      QVERIFY_THROWS_EXCEPTION(tessera::Error, plan::settings_from_json(bad, "plan.json"));
    }
  }

  void autoPutsParametersOnDiskWhenOptimizerStateIsNotEnough() {
    // A long sequence at micro-batch 1 with checkpointing: all of the optimizer state on disk is
    // not enough, half of the parameter chunks too is.
    auto in = inputs(0, "full");
    in.model = config(wide_llama());
    in.spec.training.batch_size = 1;
    in.spec.dataset.max_length = 4096;
    in.spec.strategy.name = "auto";
    in.profile.disk = measured_disk();
    plan::Settings s = gemini_optimizer_on_disk();
    s.sequence_length = 4096;
    const auto optimizer_only = plan::estimate_memory(in.model, s, 0).peak();
    s.offload_param_frac = 0.5;
    const auto with_parameters = plan::estimate_memory(in.model, s, 0).peak();
    QVERIFY(with_parameters < optimizer_only);
    in.profile.memory.simulated =
        static_cast<std::uint64_t>(static_cast<double>(with_parameters) / (1.0 - plan::kHeadroom)) +
        4096;
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.strategy, std::string("gemini"));
    QCOMPARE(p.settings.method, std::string("full"));
    QCOMPARE(p.settings.offload_optim_frac, 1.0);
    QCOMPARE(p.settings.offload_param_frac, 0.5);
    QVERIFY2(p.explanation.find("100% of the optimizer state and 50% of the parameters on disk") !=
                 std::string::npos,
             p.explanation.c_str());
    bool said = false;
    for (const auto& r : p.reasons)
      said = said || r.find(
                         "or with only the optimizer state on disk: gemini keeps 100% of the "
                         "optimizer state and 50% of the parameters") != std::string::npos;
    QVERIFY(said);
    const auto applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.strategy.name, std::string("gemini"));
    QCOMPARE(applied.strategy.options["offload_optim_frac"].get<double>(), 1.0);
    QCOMPARE(applied.strategy.options["offload_param_frac"].get<double>(), 0.5);
    const auto changes = plan::applied_changes(in.spec, p.settings);
    QVERIFY(std::find(changes.begin(), changes.end(),
                      "strategy gemini with 100% of the optimizer state and 50% of the "
                      "parameters on disk") != changes.end());
    // Where the optimizer state alone is enough, the parameters stay on the host.
    in.profile.memory.simulated =
        static_cast<std::uint64_t>(static_cast<double>(optimizer_only) / (1.0 - plan::kHeadroom)) +
        4096;
    const auto q = plan::make_plan(in);
    QCOMPARE(q.strategy, std::string("gemini"));
    QCOMPARE(q.settings.offload_param_frac, 0.0);
    QVERIFY(
        !plan::apply_settings(in.spec, q.settings).strategy.options.contains("offload_param_frac"));
  }

  void hostBudgetHintNamesParameterOffload() {
    // gemini with a host_budget the job as written exceeds: the hint is the nearest setting that
    // fits, parameter chunks on disk once all of the optimizer state is.
    auto in = inputs(64ull << 30, "full");
    in.model = config(wide_llama());
    in.spec.training.batch_size = 1;
    in.spec.training.activation_checkpointing = true;
    in.spec.dataset.max_length = 4096;
    in.spec.strategy.name = "gemini";
    plan::Settings s = gemini_optimizer_on_disk();
    s.sequence_length = 4096;
    s.offload_param_frac = 0.5;
    const auto need = plan::estimate_memory(in.model, s, 0).peak();
    const std::uint64_t budget =
        static_cast<std::uint64_t>(static_cast<double>(need) / (1.0 - plan::kHeadroom)) + 4096;
    in.spec.strategy.options = {{"host_budget", budget}};
    auto refusal = plan::check_host_budget(in);
    QVERIFY(refusal.has_value());
    QVERIFY2(
        refusal->hint.rfind("offload_optim_frac 1.00, offload_param_frac 0.50 would need", 0) == 0,
        refusal->hint.c_str());
    // Written so, it fits.
    in.spec.strategy.options["offload_optim_frac"] = 1.0;
    in.spec.strategy.options["offload_param_frac"] = 0.5;
    QVERIFY(!plan::check_host_budget(in).has_value());
    // A budget nothing fits in names both options at their most, and no longer says parameter
    // offload is missing.
    in.spec.strategy.options = {{"host_budget", 64ull << 20}};
    refusal = plan::check_host_budget(in);
    QVERIFY(refusal.has_value());
    QVERIFY2(refusal->hint.find("offload_param_frac 1") != std::string::npos,
             refusal->hint.c_str());
    QVERIFY(refusal->hint.find("not supported") == std::string::npos);
  }

  void planReportsOutOfMemory() {
    const auto p = plan::make_plan(inputs(16ull << 20));
    QVERIFY(!p.fits);
    QVERIFY(p.explanation.find("out of memory") != std::string::npos);
    QVERIFY(p.explanation.find("(simulated)") != std::string::npos);
    QVERIFY(!p.what_would_fit.empty());
    QVERIFY(plan::to_json(p)["memory"][0]["simulated"].get<bool>());
  }

  void bf16OnlyWithNativeSupport() {
    auto in = inputs(64ull << 30);
    in.spec.precision = "bf16";
    auto p = plan::make_plan(in);
    QCOMPARE(p.settings.precision, std::string("fp32"));  // profile has no bf16 ISA
    in.profile.cpu.amx_bf16 = true;
    p = plan::make_plan(in);
    QCOMPARE(p.settings.precision, std::string("bf16"));
  }

  // One rank of several: ddp holds single's categories plus float32 buckets for every trainable
  // parameter, autograd's gradients whole only with accumulation (without, each moves into its
  // bucket as it arrives: the largest tensor's, the embedding, at a time); zero divides the
  // optimizer state and masters by the ranks (stage 2: the gradients too, with one bucket in
  // flight).
  void rankMemoryOfDdpAndZero() {
    const auto c = config(small_llama());
    const double n = double(plan::count_parameters(c));
    const double embedding = 8000.0 * 512.0;
    plan::Settings s = settings(8, false, "full");
    s.gradient_accumulation = 2;
    const auto single = plan::estimate_memory(c, s, 0);
    s.strategy = "ddp";
    const auto ddp = plan::estimate_memory(c, s, 0, 2);
    QVERIFY(near(ddp.weights, 4 * n));
    QVERIFY(near(ddp.gradient_buckets, 4 * n));
    QVERIFY(near(ddp.gradients, 8 * n));
    QVERIFY(near(ddp.optimizer, 8 * n));
    QCOMPARE(ddp.activations, single.activations);
    QCOMPARE(ddp.training_peak(), single.training_peak() + ddp.gradient_buckets);
    QCOMPARE(plan::estimate_memory(c, s, 0, 4).training_peak(), ddp.training_peak());
    s.gradient_accumulation = 1;
    QVERIFY(near(plan::estimate_memory(c, s, 0, 2).gradients, 4 * n + 4 * embedding));
    s.strategy = "zero";
    s.zero_stage = 1;
    QVERIFY(near(plan::estimate_memory(c, s, 0, 4).gradients, 4 * n + 4 * embedding));
    s.gradient_accumulation = 2;
    const auto zero1 = plan::estimate_memory(c, s, 0, 4);
    QVERIFY(near(zero1.weights, 4 * n));  // fp32: no masters to shard
    QVERIFY(near(zero1.optimizer, 8 * n / 4));
    QVERIFY(near(zero1.gradients, 8 * n));
    s.zero_stage = 2;
    const auto zero2 = plan::estimate_memory(c, s, 0, 4);
    QVERIFY(near(zero2.gradient_buckets, std::min(4 * n, 2.0 * double(plan::kDefaultBucketBytes))));
    QVERIFY(near(zero2.gradients, 4 * n / 4 + double(zero2.gradient_buckets)));
    QVERIFY(near(zero2.optimizer, 8 * n / 4));
    s.precision = "bf16";
    const auto bf16 = plan::estimate_memory(c, s, 0, 4);
    QVERIFY(near(bf16.weights, 2 * n + 4 * n / 4));  // bf16 weights, a quarter of the masters
    QVERIFY(near(bf16.gradients, 4 * n / 4 + double(bf16.gradient_buckets)));
    s.zero_stage = 1;
    QVERIFY(near(plan::estimate_memory(c, s, 0, 4).gradients, 2 * n + 4 * n));
  }

  // hybrid: each rank holds its blocks of its stage's tensors. tp 2 halves every split linear
  // (the norms stay whole) and the vocabulary-split embedding and head; pp 2 cuts the 4 equal
  // layers where the head's vocab × hidden balances them (3 | 1 + head), as the plugin does; the
  // stages' parameters add up to the model's; 1F1B keeps pp − stage micro-batches alive.
  void hybridRanksHoldTheirStage() {
    const auto c = config(small_llama());
    const double n = double(plan::count_parameters(c));
    const double h = 512, m = 1376, v = 8000;
    const double layer = 4 * h * h + 3 * h * m + 2 * h;
    plan::Settings s = settings(2, false, "full");
    s.strategy = "hybrid";
    s.gradient_accumulation = 4;
    s.tp_size = 2;
    const auto tp2 = plan::hybrid_layout(c, s, 2, plan::kDefaultBucketBytes);
    QCOMPARE(int(tp2.stages.size()), 1);
    QCOMPARE(tp2.dp, 1);
    const double rank = 4 * ((layer - 2 * h) / 2 + 2 * h) + v * h / 2 + v * h / 2 + h;
    QVERIFY(near(tp2.stages[0].parameters, rank));
    QVERIFY(near(tp2.stages[0].whole_parameters, n));
    QCOMPARE(tp2.bubble, 0.0);
    const auto tp2_memory = plan::estimate_memory(c, s, 0, 2);
    QVERIFY(near(tp2_memory.weights, 4 * rank));
    QVERIFY(near(tp2_memory.gradient_buckets, 4 * rank));
    QVERIFY(near(tp2_memory.gradients, 8 * rank));
    QVERIFY(near(tp2_memory.optimizer, 8 * rank));
    // Megatron's traffic per step (tests/integration/test_hybrid.py counts the same): 4 n·h
    // all-reduces a layer, the embedding's and the head's, 2 n floats and an all-gather of
    // n·tp for the loss, over 4 micro-batches of n = 2 · 128 tokens; and the norm's scalar.
    const double tokens = 2 * 128;
    const double reduced = (4 * 4 + 2) * tokens * h * 4 + 2 * tokens * 4;
    QVERIFY(near(tp2.stages[0].tensor_bytes, 4 * (reduced + 0.5 * 2 * tokens * 4) + 4));
    QCOMPARE(tp2.stages[0].pipeline_bytes, 0.0);
    // Sequence parallelism: the layer's input, residual and norms on half the positions (the
    // split parts unchanged), the head's whole; the traffic gains the backward re-gathers of q/k/v
    // and gate/up per layer and the two ends, (tp − 1)/tp of n·h each, per micro-batch.
    plan::Settings sp = s;
    sp.sequence_parallel = true;
    const auto plain_terms = plan::activation_terms(c, s, 2);
    const auto sp_terms = plan::activation_terms(c, sp, 2);
    QVERIFY(sp_terms.layer < plain_terms.layer);
    QVERIFY(near(plain_terms.layer - sp_terms.layer,
                 tokens * (4 * 2 * h + 2 * (4 + 4) * h) / 2));  // fp32, full: 2h whole, 2 norms
    QVERIFY(near(sp_terms.boundary, plain_terms.boundary / 2));
    QCOMPARE(sp_terms.head, plain_terms.head);
    const auto sp_layout = plan::hybrid_layout(c, sp, 2, plan::kDefaultBucketBytes);
    QVERIFY(sp_layout.sequence_parallel);
    QVERIFY(near(sp_layout.stages[0].tensor_bytes - tp2.stages[0].tensor_bytes,
                 4 * 0.5 * (2 * 4 + 2) * tokens * h * 4));

    s.tp_size = 1;
    s.pp_size = 2;
    const auto pp2 = plan::hybrid_layout(c, s, 4, plan::kDefaultBucketBytes);
    QCOMPARE(pp2.dp, 2);
    QCOMPARE(int(pp2.stages.size()), 2);
    QCOMPARE(pp2.stages[0].layers, std::string("layers 0-2"));
    QCOMPARE(pp2.stages[1].layers, std::string("layers 3"));
    QVERIFY(near(pp2.stages[0].parameters, 3 * layer + v * h));
    QVERIFY(near(pp2.stages[1].parameters, layer + h + v * h));
    QVERIFY(near(pp2.stages[0].parameters + pp2.stages[1].parameters, n));
    QCOMPARE(pp2.stages[0].micro_batches_held, 2);
    QCOMPARE(pp2.stages[1].micro_batches_held, 1);
    QVERIFY(std::abs(pp2.bubble - 1.0 / 5.0) < 1e-12);
    // Stage 0 sends each micro-batch's activations forward, stage 1 their gradients back.
    QVERIFY(near(pp2.stages[0].pipeline_bytes, 4 * tokens * h * 4));
    QCOMPARE(pp2.stages[0].pipeline_sends, std::int64_t(4));
    // With tensor groups and sequence parallelism the boundary carries each rank's block of the
    // positions: half the bytes at tp 2 (128 positions split evenly).
    plan::Settings tp_pp = s;
    tp_pp.tp_size = 2;
    const auto tp2pp2 = plan::hybrid_layout(c, tp_pp, 4, plan::kDefaultBucketBytes);
    tp_pp.sequence_parallel = true;
    const auto sp_tp2pp2 = plan::hybrid_layout(c, tp_pp, 4, plan::kDefaultBucketBytes);
    QVERIFY(sp_tp2pp2.sequence_parallel);
    QVERIFY(near(sp_tp2pp2.stages[0].pipeline_bytes, tp2pp2.stages[0].pipeline_bytes / 2));
    QVERIFY(near(pp2.stages[1].pipeline_bytes, 4 * tokens * h * 4));
    // dp 2: ddp's all-reduce of each stage's float32 gradients.
    QVERIFY(near(pp2.stages[1].data_bytes, 4 * pp2.stages[1].parameters));
    // The plan names it, per stage, and its peak is the heavier stage's.
    auto in = inputs(64ull << 30);
    in.processes = 4;
    in.spec.training.batch_size = 2;
    in.spec.training.gradient_accumulation = 4;
    in.spec.strategy = {"hybrid", {{"tp_size", 1}, {"pp_size", 2}}};
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.strategy, std::string("hybrid"));
    QVERIFY(p.hybrid.has_value());
    const json j = plan::to_json(p);
    QCOMPARE(j["ranks"]["hybrid"]["stages"].size(), std::size_t(2));
    QCOMPARE(j["ranks"]["hybrid"]["dp_size"].get<int>(), 2);
    const double heavier = std::max(plan::hybrid_stage_memory(pp2.stages[0], p.settings).total(),
                                    plan::hybrid_stage_memory(pp2.stages[1], p.settings).total());
    QVERIFY(
        near(double(p.tiers[0].estimate.training_peak() - p.tiers[0].estimate.runtime), heavier));
    const std::string reasons = j["reasons"].dump();
    QVERIFY2(reasons.find("2 pipeline stages balanced by cost (stage 0 layers 0-2 with the "
                          "embedding, stage 1 layers 3 with the head)") != std::string::npos,
             reasons.c_str());
    QVERIFY2(reasons.find("idles each stage 20% of the step") != std::string::npos,
             reasons.c_str());
    // A layout `auto` chose is written into the job as hybrid's options, and said.
    job::JobSpec as_auto = in.spec;
    as_auto.strategy = {job::kAutoStrategy, json::object()};
    const job::JobSpec applied = plan::apply_settings(as_auto, p.settings);
    QCOMPARE(applied.strategy.name, std::string("hybrid"));
    QCOMPARE(applied.strategy.options["pp_size"].get<int>(), 2);
    QCOMPARE(applied.strategy.options["tp_size"].get<int>(), 1);
    QCOMPARE(applied.strategy.options["device"].get<std::string>(), std::string("cpu"));
    const auto changes = plan::applied_changes(as_auto, p.settings);
    QVERIFY(std::any_of(changes.begin(), changes.end(), [](const std::string& c) {
      return c.rfind("strategy hybrid tp 1 × pp 2: each micro-batch of 2 is shared by 2 ranks",
                     0) == 0;
    }));
    // zero_stage 1 over the 2 replicas: each stage's optimizer state halved, the updated shares
    // all-gathered (float32 here: (dp − 1) / dp of the stage's bytes) on top of the all-reduce;
    // the plan says so and the options carry it.
    plan::Settings zero1 = p.settings;
    zero1.zero_stage = 1;
    const auto sharded = plan::hybrid_layout(c, zero1, 4, plan::kDefaultBucketBytes);
    QCOMPARE(sharded.zero_stage, 1);
    for (std::size_t i = 0; i < 2; ++i) {
      QVERIFY(near(plan::hybrid_stage_memory(sharded.stages[i], zero1).optimizer,
                   plan::hybrid_stage_memory(pp2.stages[i], p.settings).optimizer / 2));
      QVERIFY(near(sharded.stages[i].data_gather_bytes, 0.5 * 4 * sharded.stages[i].trainable));
      QVERIFY(near(sharded.stages[i].data_bytes,
                   pp2.stages[i].data_bytes + sharded.stages[i].data_gather_bytes));
    }
    // zero_stage 2: the gradients too (the replica's float32 share, two buckets in flight), and
    // reduce-scattered in each micro-batch's backward: (dp − 1) / dp of them a micro-batch.
    plan::Settings zero2 = p.settings;
    zero2.zero_stage = 2;
    const auto scattered = plan::hybrid_layout(c, zero2, 4, plan::kDefaultBucketBytes);
    QCOMPARE(scattered.zero_stage, 2);
    for (std::size_t i = 0; i < 2; ++i) {
      const plan::HybridStage& st = scattered.stages[i];
      const auto held = plan::hybrid_stage_memory(st, zero2);
      QVERIFY(near(held.optimizer, plan::hybrid_stage_memory(sharded.stages[i], zero1).optimizer));
      const double buckets = std::min(4 * st.trainable, 2.0 * double(plan::kDefaultBucketBytes));
      QVERIFY(near(held.gradient_buckets, buckets));
      QVERIFY(near(held.gradients, 4 * st.trainable / 2 + buckets));
      QVERIFY(near(st.data_bytes - st.data_gather_bytes,
                   double(scattered.micro_batches) * 0.5 * 4 * st.trainable));
      QVERIFY(near(st.data_gather_bytes, sharded.stages[i].data_gather_bytes));
    }
    in.spec.strategy.options["zero_stage"] = 1;
    const auto p1 = plan::make_plan(in);
    QCOMPARE(p1.settings.zero_stage, 1);
    QVERIFY(p1.tiers[0].estimate.optimizer < p.tiers[0].estimate.optimizer);
    QVERIFY(p1.communication.all_gather_bytes > 0);
    const json j1 = plan::to_json(p1);
    QCOMPARE(j1["ranks"]["hybrid"]["zero_stage"].get<int>(), 1);
    QVERIFY2(j1["reasons"].dump().find("each keeping and updating 1/2 of the optimizer state "
                                       "(ZeRO-1)") != std::string::npos,
             j1["reasons"].dump().c_str());
    QCOMPARE(plan::apply_settings(as_auto, p1.settings).strategy.options["zero_stage"].get<int>(),
             1);
    // auto weighs each layout with replicas both ways.
    in.spec.strategy = {job::kAutoStrategy, json::object()};
    const auto weighed = plan::make_plan(in);
    const auto has = [&](int tp, int pp, int zero) {
      return std::any_of(weighed.candidates.begin(), weighed.candidates.end(), [&](const auto& x) {
        return x.settings.strategy == "hybrid" && x.settings.tp_size == tp &&
               x.settings.pp_size == pp && x.settings.zero_stage == zero;
      });
    };
    QVERIFY(has(1, 2, 0) && has(1, 2, 1) && has(1, 2, 2) && has(2, 1, 1) && has(2, 1, 2) &&
            !has(2, 2, 1));
    // ... and with tensor parallelism also on blocks of the positions.
    const auto sequence_parallel = [&](int tp, int pp) {
      return std::any_of(weighed.candidates.begin(), weighed.candidates.end(), [&](const auto& x) {
        return x.settings.strategy == "hybrid" && x.settings.tp_size == tp &&
               x.settings.pp_size == pp && x.settings.sequence_parallel;
      });
    };
    QVERIFY(sequence_parallel(2, 1) && !sequence_parallel(1, 2) && sequence_parallel(2, 2));
    in.spec.strategy = {"hybrid", {{"tp_size", 1}, {"pp_size", 2}}};
    // The bubble stretches the slowest stage's compute: fewer micro-batches, a longer step.
    in.spec.training.gradient_accumulation = 2;
    in.spec.training.batch_size = 4;
    QVERIFY(plan::make_plan(in).compute_seconds_per_step > p.compute_seconds_per_step);
  }

  // Bytes through each rank per step: 2(W-1)/W of the float32 gradients (ddp); zero adds the
  // all_gather of the updated parameters; the time is bytes over the measured bandwidth plus a
  // latency per call, and nothing without a measured link.
  void communicationPerStep() {
    const auto c = config(small_llama());
    const double n = double(plan::count_parameters(c));
    const plan::LinkInfo link = measured_link();
    plan::Settings s = settings(8, false, "full");
    s.strategy = "ddp";
    const double calls = std::ceil(4 * n / double(plan::kDefaultBucketBytes));
    const auto two = plan::estimate_communication(c, s, 2, link);
    QVERIFY(near(two.bytes, 4 * n));
    QCOMPARE(double(two.calls), calls);
    QVERIFY(std::abs(two.seconds - (double(two.bytes) / 1e9 + calls * 1e-4)) < 1e-9);
    const auto four = plan::estimate_communication(c, s, 4, link);
    QVERIFY(near(four.bytes, 2.0 * 3 / 4 * 4 * n));
    QCOMPARE(plan::estimate_communication(c, s, 2, link, 1 << 20).calls,
             std::int64_t(std::ceil(4 * n / double(1 << 20))));
    QCOMPARE(plan::estimate_communication(c, s, 1, link).bytes, std::uint64_t(0));
    QCOMPARE(plan::estimate_communication(c, s, 2, std::nullopt).seconds, 0.0);
    QVERIFY(plan::estimate_communication(c, s, 2, std::nullopt).bytes > 0);
    // zero 1: ddp's all_reduce, then the parameters all-gathered bucket by bucket.
    s.strategy = "zero";
    s.zero_stage = 1;
    const auto zero1 = plan::estimate_communication(c, s, 4, link);
    QVERIFY(near(zero1.gradient_bytes, four.bytes));
    QVERIFY(near(zero1.all_gather_bytes, 3.0 / 4 * 4 * n));
    QCOMPARE(zero1.calls, 2 * four.calls);
    // zero 2: a reduce-scatter of (W-1)/W in every micro-batch.
    s.zero_stage = 2;
    s.gradient_accumulation = 3;
    const auto zero2 = plan::estimate_communication(c, s, 4, link);
    QVERIFY(near(zero2.gradient_bytes, 3 * 3.0 / 4 * 4 * n));
    QCOMPARE(zero2.calls, 3 * four.calls + four.calls);
    s.gradient_accumulation = 1;
    s.strategy = "ddp";
    s.method = "lora";
    const double lora = double(plan::count_lora_parameters(c, s.lora_rank, {}));
    QVERIFY(near(plan::estimate_communication(c, s, 2, link).gradient_bytes, 4 * lora));
    s.strategy = "single";
    QCOMPARE(plan::estimate_communication(c, s, 2, link).bytes, std::uint64_t(0));
  }

  // auto with 2 processes: each rank has half the machine; ddp (the only planned strategy that
  // distributes in this build) is chosen, explained, and applied; a tight budget shrinks the
  // micro-batch as for one process; the step adds the communication to a rank's compute.
  // A spec naming a layout is compared with every other layout at its own global batch: a named
  // hybrid's batch is each replica's (its tp · pp ranks share a micro-batch), so ddp, zero and
  // gemini at 2 processes train as many sequences a step with fewer accumulation steps, and
  // their step times compare with the named one's.
  void namedLayoutIsComparedAtItsGlobalBatch() {
    auto in = inputs(64ull << 30);
    in.processes = 2;
    in.spec.training.gradient_accumulation = 2;
    in.spec.strategy.name = "hybrid";
    in.spec.strategy.options = {{"tp_size", 1}, {"pp_size", 2}, {"device", "cpu"}};
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.strategy, std::string("hybrid"));
    QVERIFY(p.candidates.front().chosen);
    QCOMPARE(p.candidates.front().settings.pp_size, 2);
    QVERIFY(p.candidates.size() >= 5);  // ddp, zero 1 and 2, gemini, tp 2 beside it
    // One replica of pp 2: 2 micro-batches of 8, 16 sequences a step; every other layout as
    // many.
    for (const auto& c : p.candidates) {
      const std::int64_t replicas = 2 / (c.settings.tp_size * c.settings.pp_size);
      QCOMPARE(replicas * c.settings.micro_batch * c.settings.gradient_accumulation,
               std::int64_t(16));
    }
    const auto ddp = std::find_if(p.candidates.begin(), p.candidates.end(),
                                  [](const auto& c) { return c.settings.strategy == "ddp"; });
    QVERIFY(ddp != p.candidates.end() && ddp->fits);
    QCOMPARE(ddp->settings.gradient_accumulation, std::int64_t(1));
    // Whole replicas on 2 ranks halve each rank's work; the pipeline idles in its bubble.
    QVERIFY(ddp->seconds_per_step < p.candidates.front().seconds_per_step);
  }

  void autoPlansEveryRankOfSeveral() {
    auto in = inputs(64ull << 30);
    in.processes = 2;
    in.profile.link = measured_link();
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.strategy, std::string("ddp"));
    QCOMPARE(p.processes, 2);
    QCOMPARE(p.tiers.at(0).budget, (64ull << 30) / 2);
    QVERIFY2(p.reasons.front().rfind("strategy ddp: each rank holds the whole model", 0) == 0,
             p.reasons.front().c_str());
    QVERIFY(p.reasons.front().find("÷ 2 ranks") != std::string::npos);
    // zero at both stages was weighed: it saves memory a rank does not need, and costs an
    // all_gather of the parameters every step.
    // So was gemini (sharded: it holds less still, and communicates the most).
    // And hybrid's layouts of 2 ranks (tp 2, with sequence parallelism too, and pp 2), which
    // split the layers: they hold less per rank too, and `auto` takes them only where nothing
    // that keeps whole layers fits.
    QCOMPARE(p.candidates.size(), std::size_t{7});
    QCOMPARE(p.candidates[0].settings.strategy, std::string("ddp"));
    for (std::size_t i = 1; i < 7; ++i) {
      const std::string& name = p.candidates[i].settings.strategy;
      QVERIFY(name == "zero" || name == "gemini" || name == "hybrid");
      QVERIFY(p.candidates[i].fits);
      QVERIFY(!p.candidates[i].chosen);
      // Each at the settings it fits with: here the user's micro-batch, as ddp's.
      QCOMPARE(p.candidates[i].settings.micro_batch, p.settings.micro_batch);
      // hybrid's pp 2 runs its replica's step as 2 micro-batches (auto keeps the sequences a
      // step trains), the first stage holding both's activations: not necessarily less.
      if (name != "hybrid") {
        QVERIFY(p.candidates[i].peak < p.candidates[0].peak);
        QVERIFY(p.candidates[i].seconds_per_step > p.candidates[0].seconds_per_step);
      }
    }
    QCOMPARE(std::count_if(p.candidates.begin(), p.candidates.end(),
                           [](const auto& c) {
                             return c.settings.strategy == "hybrid" &&
                                    c.settings.tp_size * c.settings.pp_size == 2;
                           }),
             std::ptrdiff_t{3});
    QVERIFY(std::any_of(p.candidates.begin(), p.candidates.end(),
                        [](const auto& c) { return c.settings.strategy == "gemini"; }));
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.rfind("runner-up: zero stage 2 would save", 0) == 0 &&
             r.find("an all_gather of the parameters every step") != std::string::npos;
    }));
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.rfind("gemini would save", 0) == 0 &&
             r.find("all_gathers of the parameters as every forward and backward uses them") !=
                 std::string::npos;
    }));
    // Each other family once, by its best layout, with why it lost in figures: tensor
    // parallelism's collectives cost more than the memory it saves is worth here.
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.rfind("tensor parallel (the best of its 2 layouts): hybrid tp 2 × pp 1 would save",
                     0) == 0 &&
             r.find("all-reduces of activations in every layer") != std::string::npos &&
             r.find("pipeline") == std::string::npos;
    }));
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.rfind("hybrid tp 1 × pp 2 fits too", 0) == 0 &&
             r.find("of it idle in the pipeline's bubble") != std::string::npos;
    }));
    QCOMPARE(std::count_if(p.reasons.begin(), p.reasons.end(),
                           [](const std::string& r) { return r.rfind("runner-up: ", 0) == 0; }),
             std::ptrdiff_t{1});
    const auto comm = plan::estimate_communication(in.model, p.settings, 2, in.profile.link);
    QCOMPARE(p.communication.bytes, comm.bytes);
    QVERIFY(std::abs(p.seconds_per_step - (p.compute_seconds_per_step + comm.seconds)) < 1e-12);
    // A rank computes with half the cores: slower than one process with all of them.
    in.processes = 1;
    QVERIFY(p.compute_seconds_per_step > plan::make_plan(in).seconds_per_step);
    in.processes = 2;
    const json j = plan::to_json(p);
    QCOMPARE(j["ranks"]["processes"].get<int>(), 2);
    QCOMPARE(j["strategies"][0]["strategy"].get<std::string>(), std::string("ddp"));
    QCOMPARE(j["memory"][0]["by_category"]["gradient_buckets"].get<std::uint64_t>(),
             p.tiers[0].estimate.gradient_buckets);
    const job::JobSpec applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.strategy.name, std::string("ddp"));
    QCOMPARE(plan::settings_from_json(j["settings"], "plan.json").strategy, std::string("ddp"));

    // Half the budget fits zero stage 2 at batch 8, not ddp (which fits a smaller micro-batch).
    plan::Settings eight = settings(8, false, "full");
    eight.strategy = "zero";
    eight.zero_stage = 2;
    const auto need = plan::estimate_memory(in.model, eight, 0, 2).peak();
    in.profile.memory.simulated =
        2 *
        (static_cast<std::uint64_t>(static_cast<double>(need) / (1.0 - plan::kHeadroom)) + 4096);
    const auto tight = plan::make_plan(in);
    // zero fits batch 8 at that budget, ddp only a smaller micro-batch: keeping the user's batch
    // wins.
    QCOMPARE(tight.strategy, std::string("zero"));
    QCOMPARE(tight.settings.zero_stage, 2);
    QCOMPARE(tight.settings.micro_batch, std::int64_t(8));
    QVERIFY2(tight.reasons.front().rfind("strategy zero stage 2: each rank holds the whole model "
                                         "but 1/2 of the optimizer state and of the gradients",
                                         0) == 0,
             tight.reasons.front().c_str());
    QVERIFY(std::any_of(tight.reasons.begin(), tight.reasons.end(), [](const std::string& r) {
      return r.rfind("ddp fits only at micro-batch", 0) == 0;
    }));
    // Named ddp at that budget: a smaller micro-batch (the same sequences per optimizer step).
    in.spec.strategy.name = "ddp";
    const auto named = plan::make_plan(in);
    QCOMPARE(named.strategy, std::string("ddp"));
    QVERIFY(named.settings.micro_batch < 8);
    QCOMPARE(named.settings.micro_batch * named.settings.gradient_accumulation, std::int64_t(8));

    // A strategy that runs in one process cannot be named for several.
    in.spec.strategy.name = "single";
    try {
      plan::make_plan(in);
      QFAIL("expected an error");
    } catch (const Error& e) {
      QCOMPARE(int(e.kind()), int(ErrorKind::Unsupported));
      QVERIFY2(std::string(e.what()).find("runs in one process") != std::string::npos, e.what());
      QVERIFY2(e.hint().find("ddp") != std::string::npos, e.hint().c_str());
    }
    // Without a measured link the time leaves communication out and says so.
    in.spec.strategy.name = "ddp";
    in.profile.link.reset();
    in.profile.memory.simulated = 64ull << 30;
    const auto unmeasured = plan::make_plan(in);
    QCOMPARE(unmeasured.communication.seconds, 0.0);
    QVERIFY(std::any_of(
        unmeasured.reasons.begin(), unmeasured.reasons.end(),
        [](const std::string& r) { return r.find("was not measured") != std::string::npos; }));
  }

  // gemini on W ranks (plugins/gemini/gemini_plugin.cpp): 1/W of every chunk (padded to W)
  // in each category, plus the whole chunks it gathers (at most four) and the whole float32
  // gradient chunks in flight; one process is planned as before.
  void geminiShardsEveryCategoryPerRank() {
    const auto c = config(small_llama());
    const double n = double(plan::count_parameters(c));
    const double embedding = 8000.0 * 512;  // the largest tensor: the chunks' capacity
    plan::Settings s = settings(8, false, "full");
    s.strategy = "gemini";
    const auto one = plan::estimate_memory(c, s, 0);
    QVERIFY(near(one.weights, 4 * n));
    QVERIFY(near(one.optimizer, 8 * n));
    QCOMPARE(one.gathered_chunks, std::uint64_t(0));
    QCOMPARE(plan::estimate_memory(c, s, 0, 1).peak(), one.peak());
    for (const int w : {2, 4}) {
      const auto e = plan::estimate_memory(c, s, 0, w);
      // Moments of the shards: 1/W of every chunk, each padded by fewer than W elements.
      QVERIFY2(double(e.optimizer) >= 8 * n / w - 4 && double(e.optimizer) <= 8 * (n + 8 * w) / w,
               std::to_string(e.optimizer).c_str());
      // fp32: the parameter shards are the moments' half; the rest of the weights is the whole
      // chunks: more than one (the embedding's), at most four of the capacity, fewer than all.
      QVERIFY(near(e.weights, double(e.optimizer) / 2 + double(e.gathered_chunks)));
      QVERIFY(double(e.gathered_chunks) > 4 * embedding);
      QVERIFY(double(e.gathered_chunks) <= 4 * 4 * (embedding + w));
      QVERIFY(double(e.gathered_chunks) < 4 * n);
      // Gradients: the float32 shard, the chunk being filled and two being reduce-scattered
      // with their output shards, and one tensor's gradient from autograd.
      QVERIFY(double(e.gradient_buckets) >= 4 * embedding * (3 + 2.0 / w));
      QVERIFY(double(e.gradient_buckets) <= 4 * (embedding + w) * (3 + 2.0 / w));
      QVERIFY(
          near(e.gradients, double(e.optimizer) / 2 + double(e.gradient_buckets) + 4 * embedding));
      QCOMPARE(e.activations, one.activations);
      QCOMPARE(e.disk(), std::uint64_t(0));
    }
    // This model's six chunks are each about a fifth of it (its embedding and head are the largest
    // tensors): four whole ones outweigh what sharding saves against zero stage 2 in the training
    // state a rank holds. A deeper model has more, smaller chunks: gemini holds the least per rank
    // there.
    plan::Settings zero = s;
    zero.strategy = "zero";
    zero.zero_stage = 2;
    const auto state = [](const plan::MemoryEstimate& m) {
      return m.weights + m.gradients + m.optimizer;
    };
    QVERIFY(state(plan::estimate_memory(c, s, 0, 4)) > state(plan::estimate_memory(c, zero, 0, 4)));
    const auto wide = config(wide_llama());
    for (const int w : {2, 4}) {
      QVERIFY(state(plan::estimate_memory(wide, s, 0, w)) <
              state(plan::estimate_memory(wide, zero, 0, w)));
      QVERIFY(plan::estimate_memory(wide, s, 0, w).training_peak() <
              plan::estimate_memory(wide, zero, 0, w).training_peak());
    }
    // At the peak, when backward starts, only the first chunk's gradients are being made beside
    // autograd's tensor: the shards and the reductions in flight come as the activations go. With
    // accumulation the shards are there from the micro-batch before; under checkpointing a
    // recomputed layer is there all along, so everything counts.
    const auto ranks = plan::estimate_memory(c, s, 0, 4);
    QVERIFY(ranks.backward_gradients > 0 && ranks.backward_gradients < ranks.gradients);
    QCOMPARE(ranks.training_peak() + ranks.backward_gradients,
             state(ranks) + ranks.runtime + ranks.activations);
    plan::Settings accumulating = s;
    accumulating.gradient_accumulation = 2;
    const auto later = plan::estimate_memory(c, accumulating, 0, 4);
    QVERIFY(later.backward_gradients > 0 && later.backward_gradients < ranks.backward_gradients);
    plan::Settings recomputing = s;
    recomputing.activation_checkpointing = true;
    QCOMPARE(plan::estimate_memory(c, recomputing, 0, 4).backward_gradients, std::uint64_t(0));
    // The whole chunks do not shrink with W; the shards do.
    const auto two = plan::estimate_memory(c, s, 0, 2), four = plan::estimate_memory(c, s, 0, 4);
    QVERIFY(std::abs(double(two.gathered_chunks) - double(four.gathered_chunks)) <= 64);
    QVERIFY(four.optimizer < two.optimizer);
    // bf16: chunks of the compute dtype (half the bytes), float32 masters of the shard.
    s.precision = "bf16";
    const auto bf16 = plan::estimate_memory(c, s, 0, 2);
    QVERIFY(near(bf16.gathered_chunks, double(two.gathered_chunks) / 2));
    QVERIFY(near(bf16.weights, double(bf16.optimizer) * 6 / 8 + double(bf16.gathered_chunks)));
    // LoRA: the base sharded and gathered as it computes; the adapters' chunks whole on every
    // rank; the moments of the adapters' shards.
    s.precision = "fp32";
    s.method = "lora";
    const double lora = double(plan::count_lora_parameters(c, s.lora_rank, {}));
    const auto adapters = plan::estimate_memory(c, s, 0, 2);
    QVERIFY2(double(adapters.optimizer) >= 8 * lora / 2 - 4 &&
                 double(adapters.optimizer) <= 8 * (lora + 16) / 2,
             std::to_string(adapters.optimizer).c_str());
    QVERIFY(double(adapters.weights) >= 4 * n / 2 + 4 * lora + double(adapters.gathered_chunks));
    QVERIFY(double(adapters.weights) <=
            4 * (n + lora + 64) / 2 + 4 * (lora + 16) + double(adapters.gathered_chunks));
  }

  // gemini's bytes per step: the padded float32 gradients reduce-scattered in every micro-batch,
  // (W-1)/W of them; the chunks all-gathered as the blocks use them: once a step when all fit in
  // the four it keeps whole, again in backward and in each micro-batch when they do not.
  void geminiCommunicationPerStep() {
    const plan::LinkInfo link = measured_link();
    const auto c = config(small_llama());
    const double n = double(plan::count_parameters(c));
    plan::Settings s = settings(8, false, "full");
    s.strategy = "gemini";
    QCOMPARE(plan::estimate_communication(c, s, 1, link).bytes, std::uint64_t(0));
    const auto two = plan::estimate_communication(c, s, 2, link);
    QVERIFY(double(two.gradient_bytes) >= 0.5 * 4 * n - 4);
    QVERIFY(double(two.gradient_bytes) <= 0.5 * 4 * (n + 64));
    // Six chunks, four kept whole: every chunk gathered in forward, some again in backward.
    QVERIFY(double(two.all_gather_bytes) > 0.5 * 4 * n * 1.05);
    QVERIFY(double(two.all_gather_bytes) < 0.5 * 4 * n * 2);
    QCOMPARE(two.bytes, two.gradient_bytes + two.all_gather_bytes);
    QVERIFY(std::abs(two.seconds - (double(two.bytes) / 1e9 + double(two.calls) * 1e-4)) < 1e-9);
    s.gradient_accumulation = 3;
    const auto three = plan::estimate_communication(c, s, 2, link);
    QVERIFY(near(three.gradient_bytes, 3.0 * double(two.gradient_bytes)));
    QVERIFY(three.all_gather_bytes > two.all_gather_bytes);  // gathered again per micro-batch
    QVERIFY(three.calls > two.calls);
    // A model of three chunks (embedding, the layer, the head): each gathered once a step,
    // whatever the micro-batches.
    json doc = small_llama();
    doc["hidden_size"] = 64;
    doc["intermediate_size"] = 172;
    doc["num_hidden_layers"] = 1;
    doc["num_attention_heads"] = 4;
    doc["num_key_value_heads"] = 4;
    const auto tiny = config(doc);
    const double t = double(plan::count_parameters(tiny));
    for (const std::int64_t a : {1, 3}) {
      s.gradient_accumulation = a;
      const auto e = plan::estimate_communication(tiny, s, 4, link);
      QVERIFY2(double(e.all_gather_bytes) >= 0.75 * 4 * t - 4 &&
                   double(e.all_gather_bytes) <= 0.75 * 4 * (t + 16),
               std::to_string(e.all_gather_bytes).c_str());
      QCOMPARE(e.calls, 3 * a + 3 + 1);  // reduce-scatters, all-gathers, the clipping norm
    }
  }

  // A per-rank budget only gemini fits at the user's batch: auto takes it (fewest changes) and
  // says what a rank holds and why ddp and zero lost; naming gemini with the disk tier on
  // several processes is refused as the plugin refuses it.
  void autoChoosesGeminiWhenOnlyItFits() {
    auto in = inputs(64ull << 30);
    in.model = config(wide_llama());
    in.processes = 4;
    in.profile.link = measured_link();
    plan::Settings eight = settings(8, false, "full");
    eight.strategy = "gemini";
    const auto need = plan::estimate_memory(in.model, eight, 0, 4).peak();
    eight.strategy = "zero";
    eight.zero_stage = 2;
    QVERIFY(need < plan::estimate_memory(in.model, eight, 0, 4).peak());
    in.profile.memory.simulated =
        4 *
        (static_cast<std::uint64_t>(static_cast<double>(need) / (1.0 - plan::kHeadroom)) + 4096);
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.strategy, std::string("gemini"));
    QCOMPARE(p.settings.micro_batch, std::int64_t(8));
    QCOMPARE(p.tiers.at(0).estimate.peak(), need);
    QVERIFY2(p.reasons.front().rfind("strategy gemini: each rank holds 1/4 of the parameters, "
                                     "gradients and optimizer state, gathering",
                                     0) == 0,
             p.reasons.front().c_str());
    // zero stage 2 fits a smaller micro-batch (the runner-up: it changes the user's); ddp not at
    // all, even at micro-batch 1 with checkpointing, in figures.
    for (const char* loser :
         {"runner-up: zero stage 2 fits only at micro-batch 4", "ddp would need"})
      QVERIFY2(std::any_of(p.reasons.begin(), p.reasons.end(),
                           [&](const std::string& r) { return r.rfind(loser, 0) == 0; }),
               loser);
    QCOMPARE(p.candidates.front().settings.strategy, std::string("gemini"));
    QVERIFY(p.candidates.front().fits && p.candidates.front().chosen);
    // Of the others, those that keep whole layers fit only a smaller micro-batch, or not at all.
    for (std::size_t i = 1; i < p.candidates.size(); ++i) {
      const auto& c = p.candidates[i];
      QVERIFY(!c.fits || c.settings.strategy == "hybrid" || c.settings.micro_batch < 8 ||
              c.settings.activation_checkpointing);
      if (!c.fits) {
        QCOMPARE(c.settings.micro_batch, std::int64_t(1));
        QVERIFY(c.settings.activation_checkpointing);
        QVERIFY(c.peak > p.tiers.at(0).budget * (1.0 - plan::kHeadroom));
      }
    }
    QVERIFY(p.communication.all_gather_bytes > 0);
    QCOMPARE(p.communication.bytes,
             plan::estimate_communication(in.model, p.settings, 4, in.profile.link).bytes);
    const json j = plan::to_json(p);
    QCOMPARE(j["memory"][0]["by_category"]["gathered_chunks"].get<std::uint64_t>(),
             p.tiers[0].estimate.gathered_chunks);
    const job::JobSpec applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.strategy.name, std::string("gemini"));
    QCOMPARE(plan::settings_from_json(j["settings"], "plan.json").strategy, std::string("gemini"));
    // Named: planned per rank the same way.
    in.spec.strategy.name = "gemini";
    QCOMPARE(plan::make_plan(in).tiers.at(0).estimate.peak(), need);
    // Placement auto is planned per rank as every parameter shard on disk (what it needs at
    // least; its cache grows into what the budget leaves).
    in.spec.strategy.options = json{{"placement", "auto"}};
    QCOMPARE(plan::make_plan(in).settings.offload_param_frac, 1.0);
    // offload_param_frac is planned per rank: the disk tier holds the parameter shards the
    // plugin's rule picks, the host's weights drop by as much.
    in.spec.strategy.options = json{{"offload_optim_frac", 1.0}, {"offload_param_frac", 1.0}};
    const auto offloaded = plan::make_plan(in);
    QCOMPARE(offloaded.strategy, std::string("gemini"));
    QCOMPARE(offloaded.settings.offload_param_frac, 1.0);
    QCOMPARE(offloaded.tiers.size(), std::size_t{2});
    const auto& e = offloaded.tiers[0].estimate;
    QVERIFY(e.disk_parameters > 0);
    QCOMPARE(offloaded.tiers[1].estimate.weights, e.disk_parameters);  // fp32: no masters
    plan::Settings all_in_ram = offloaded.settings;
    all_in_ram.offload_param_frac = 0.0;
    const std::uint64_t dropped = plan::estimate_memory(in.model, all_in_ram, 0, 4).weights -
                                  offloaded.tiers[0].estimate.weights;
    // The files are the shards rounded up to 4 KiB each.
    QVERIFY(dropped > 0 && dropped <= e.disk_parameters);
    QVERIFY(e.disk_parameters - dropped < 4096ull * 64);
    QCOMPARE(e.disk_parameters % 4096, std::uint64_t{0});
  }

  // gemini on W ranks with offload_optim_frac f: each rank's disk tier holds the optimizer
  // shards of whole trainable chunks (moments as optimizer, float32 masters in bf16 as weights)
  // and beside each the reduced gradient shard (float32: half the moments' bytes), each file
  // rounded up to 4 KiB; the host keeps the rest, and of those gradients only the few on their
  // way to disk.
  void geminiRanksPlanTheirDiskTier() {
    const auto c = config(small_llama());
    for (const char* method : {"full", "lora"})
      for (const char* precision : {"fp32", "bf16"}) {
        const std::string label = std::string(method) + " " + precision;
        plan::Settings s = settings(8, false, method);
        s.strategy = "gemini";
        s.precision = precision;
        const bool bf16 = s.precision == "bf16";
        const auto in_ram = plan::estimate_memory(c, s, 0, 2);
        QCOMPARE(in_ram.disk(), std::uint64_t(0));
        QCOMPARE(in_ram.offload_buffers, std::uint64_t(0));
        // The masters (bf16) are half the moments' bytes, moved with them.
        const double masters_per_moment_byte = bf16 ? 0.5 : 0.0;
        std::uint64_t previous = 0;
        for (const double f : {0.25, 0.5, 0.75, 1.0}) {
          s.offload_optim_frac = f;
          const auto e = plan::estimate_memory(c, s, 0, 2);
          const std::uint64_t moved = in_ram.optimizer - e.optimizer;  // moments on disk
          QVERIFY2(e.optimizer <= in_ram.optimizer, label.c_str());
          // Files: the moved moments and masters and the gradients beside them, each chunk's
          // files padded by under 4 KiB each.
          const auto gradients_moved = std::uint64_t(double(moved) / 2);
          QCOMPARE(e.disk() % 4096, std::uint64_t(0));
          QVERIFY2(e.disk() >= moved + std::uint64_t(double(moved) * masters_per_moment_byte) +
                                   gradients_moved,
                   label.c_str());
          QVERIFY2(e.disk() < moved + std::uint64_t(double(moved) * masters_per_moment_byte) +
                                  gradients_moved + 2 * 64 * 4096,
                   label.c_str());
          QCOMPARE(e.disk_weights, bf16 ? std::uint64_t(double(moved) / 2) : std::uint64_t(0));
          QCOMPARE(in_ram.weights - e.weights, e.disk_weights);
          QVERIFY2(
              e.disk_gradients >= gradients_moved && e.disk_gradients < gradients_moved + 64 * 4096,
              label.c_str());
          // In memory: the gradient shards not on disk, and at most three on their way there.
          QVERIFY2(e.gradients <= in_ram.gradients, label.c_str());
          QVERIFY2(in_ram.gradients - e.gradients <= gradients_moved, label.c_str());
          QCOMPARE(e.disk_parameters, std::uint64_t(0));
          // Streamed through the update: at most three shards' buffers resident at once, and
          // (full fine-tuning) the optimizer shard read ahead during backward.
          QCOMPARE(e.optimizer_read_ahead > 0, std::string(method) == "full");
          QVERIFY2(e.offload_buffers > e.optimizer_read_ahead &&
                       e.offload_buffers <= e.disk() + e.optimizer_read_ahead,
                   label.c_str());
          // (The gradients made as backward frees the activations are under them at the peak,
          // here as in memory: only those there when backward starts add to it.)
          QVERIFY2(e.activations >= e.backward_gradients &&
                       in_ram.activations >= in_ram.backward_gradients,
                   label.c_str());
          QCOMPARE(e.training_peak(), in_ram.training_peak() - moved - e.disk_weights -
                                          ((in_ram.gradients - in_ram.backward_gradients) -
                                           (e.gradients - e.backward_gradients)) +
                                          e.offload_buffers);
          // Whole chunks as close to f as they allow: more the larger f, all of it at 1.
          QVERIFY2(e.disk() >= previous, label.c_str());
          previous = e.disk();
          if (f == 1.0) QCOMPARE(e.optimizer, std::uint64_t(0));
          if (f == 0.5) {
            QVERIFY2(moved > 0 && moved < in_ram.optimizer, label.c_str());
            QVERIFY2(std::abs(double(moved) / double(in_ram.optimizer) - 0.5) < 0.3,
                     (label + ": " + std::to_string(moved)).c_str());
          }
          // Per rank: four ranks hold half of what two do (shards padded to W).
          const auto four = plan::estimate_memory(c, s, 0, 4);
          if (f == 1.0)
            QVERIFY2(std::abs(double(four.disk()) - double(e.disk()) / 2) < 64 * 4096,
                     label.c_str());
        }
      }
  }

  // Named gemini with offload_optim_frac on several ranks is planned (no longer refused): a disk
  // tier per rank, the free disk shared by this machine's ranks, the disk I/O in the step time.
  void namedGeminiOffloadsOnSeveralRanks() {
    auto in = inputs(64ull << 30);
    in.processes = 2;
    in.spec.strategy.name = "gemini";
    in.spec.strategy.options = {{"offload_optim_frac", 1.0}};
    in.profile.disk = measured_disk();
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.settings.offload_optim_frac, 1.0);
    const auto e = plan::estimate_memory(in.model, p.settings, 0, 2);
    QCOMPARE(p.tiers.at(0).estimate.optimizer, std::uint64_t(0));
    QCOMPARE(p.tiers.size(), std::size_t{2});
    QCOMPARE(p.tiers[1].tier, std::string("disk"));
    QCOMPARE(p.tiers[1].estimate.optimizer, e.disk_optimizer);
    QCOMPARE(p.tiers[1].estimate.weights, e.disk_weights);
    QCOMPARE(p.tiers[1].budget, in.profile.disk->free / 2);
    const json j = plan::to_json(p);
    QCOMPARE(j["memory"][1]["by_category"]["optimizer"].get<std::uint64_t>(), e.disk_optimizer);
    // Each rank reads and writes its files once a step (but the gradient file of the chunk read
    // ahead, which the update takes from memory); the two ranks share the disk.
    QVERIFY(e.gradient_read_ahead > 0);
    QCOMPARE(p.disk_gradient_read_ahead_bytes, e.gradient_read_ahead);
    QCOMPARE(p.disk_read_bytes_per_step, e.disk() - e.gradient_read_ahead);
    QCOMPARE(p.disk_write_bytes_per_step, e.disk());
    const double disk = double(e.disk());
    const double read = disk - double(e.gradient_read_ahead);
    QVERIFY(std::abs(p.disk_seconds_per_step - 2 * (read / 1e9 + disk / 5e8)) < 1e-9);
    auto unmeasured = in;
    unmeasured.profile.disk->measured = false;
    const auto q = plan::make_plan(unmeasured);
    QCOMPARE(q.disk_seconds_per_step, 0.0);
    QVERIFY(std::abs(p.seconds_per_step - q.seconds_per_step - p.disk_seconds_per_step) < 1e-9);
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.rfind("disk I/O per step of each rank", 0) == 0 &&
             r.find("× 2 ranks") != std::string::npos &&
             r.find("overlaps the optimizer update") != std::string::npos;
    }));
    QVERIFY2(p.reasons.front().find("100% of the optimizer state of its shards on disk") !=
                 std::string::npos,
             p.reasons.front().c_str());
    // Two ranks' files do not fit a disk with room for one and a half (less the headroom): full
    // fine-tuning does not fit as written (LoRA, whose shards are far smaller, does).
    in.profile.disk->free = static_cast<std::uint64_t>(1.5 * disk / (1.0 - plan::kHeadroom));
    QCOMPARE(plan::make_plan(in).settings.method, std::string("lora"));
    in.profile.disk->free = static_cast<std::uint64_t>(2.0 * disk / (1.0 - plan::kHeadroom)) + 8;
    QCOMPARE(plan::make_plan(in).settings.method, std::string("full"));
  }

  // auto at W ranks where full fine-tuning fits no strategy in RAM at any micro-batch: gemini
  // with its optimizer shards on disk (the least share that fits), before LoRA, as one process
  // offloads. Every rank gathers the whole model for the export, so that only helps where the
  // training peak is above the export's: long sequences (activations) of a wide model. 3 ranks:
  // no hybrid layout (tp × pp in powers of two) divides them.
  void autoOffloadsGeminiShardsOnSeveralRanks() {
    auto [in, s, least_in_ram] = long_sequences(3, 16384);
    s.strategy = "gemini";
    s.offload_optim_frac = 1.0;
    const auto offloaded = plan::estimate_memory(in.model, s, 0, 3);
    QVERIFY2(offloaded.peak() < least_in_ram, std::to_string(least_in_ram).c_str());
    QVERIFY(offloaded.training_peak() > offloaded.export_peak);
    in.profile.memory.simulated = machine_between(offloaded.peak(), least_in_ram, 3);
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.settings.strategy, std::string("gemini"));
    QCOMPARE(p.settings.method, std::string("full"));
    QVERIFY(p.settings.offload_optim_frac > 0.0);
    QCOMPARE(p.tiers.size(), std::size_t{2});
    QVERIFY(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
      return r.rfind("full fine-tuning does not fit in", 0) == 0 &&
             r.find("of each rank's shards on disk") != std::string::npos;
    }));
    const auto applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.strategy.name, std::string("gemini"));
    QCOMPARE(applied.strategy.options["offload_optim_frac"].get<double>(),
             p.settings.offload_optim_frac);
    // Without a disk to offload to it falls back to LoRA.
    in.profile.disk.reset();
    QCOMPARE(plan::make_plan(in).settings.method, std::string("lora"));
  }

  // Longer sequences (32768 tokens) on 2 ranks: hybrid with sequence parallelism splits each
  // layer's activations and the layers' inputs over tp 2, so it fits in RAM where the strategies
  // that keep whole layers on a rank do not: `auto` takes it before any disk, with twice the
  // accumulation steps (the tp ranks share each micro-batch) to keep the step's sequences. (At
  // 8192 tokens zero stage 2 needs less than hybrid's checkpoint save: the loss no longer holds
  // whole logits, which tp split.)
  void autoSplitsLayersWhenOnlyThatFitsInRam() {
    auto [in, s, least_in_ram] = long_sequences(2, 32768);
    s.strategy = "hybrid";
    s.tp_size = 2;
    s.sequence_parallel = true;
    s.gradient_accumulation = 16;
    const auto split = plan::estimate_memory(in.model, s, 0, 2);
    QVERIFY2(split.peak() < least_in_ram,
             (std::to_string(split.peak()) + " a " + std::to_string(split.activations) + " w " +
              std::to_string(split.weights) + " g " + std::to_string(split.gradients) + " o " +
              std::to_string(split.optimizer) + " e " + std::to_string(split.export_peak) + " l " +
              std::to_string(split.load_peak) + " s " + std::to_string(split.save_peak) + " vs " +
              std::to_string(least_in_ram))
                 .c_str());
    in.profile.memory.simulated = machine_between(split.peak(), least_in_ram, 2);
    const auto p = plan::make_plan(in);
    QVERIFY(p.fits);
    QCOMPARE(p.settings.strategy, std::string("hybrid"));
    QCOMPARE(p.settings.tp_size * p.settings.pp_size, 2);
    QCOMPARE(p.settings.method, std::string("full"));
    QCOMPARE(p.settings.offload_optim_frac, 0.0);
    QCOMPARE(p.settings.micro_batch * p.settings.gradient_accumulation, std::int64_t(16));
    QCOMPARE(p.tiers.size(), std::size_t{1});
    QVERIFY2(p.reasons.front().rfind("strategy hybrid tp ", 0) == 0, p.reasons.front().c_str());
    const auto applied = plan::apply_settings(in.spec, p.settings);
    QCOMPARE(applied.strategy.name, std::string("hybrid"));
    QCOMPARE(applied.training.gradient_accumulation * applied.training.batch_size,
             std::int64_t(16));
  }

  void zeroSettingsRoundTrip() {
    plan::Settings s = settings(2, true, "full");
    s.strategy = "zero";
    s.zero_stage = 2;
    job::JobSpec spec;
    spec.strategy.name = job::kAutoStrategy;
    const job::JobSpec applied = plan::apply_settings(spec, s);
    QCOMPARE(applied.strategy.name, std::string("zero"));
    QCOMPARE(applied.strategy.options["stage"].get<int>(), 2);
    const json j = {{"method", "full"},
                    {"precision", "fp32"},
                    {"micro_batch", 2},
                    {"gradient_accumulation", 1},
                    {"activation_checkpointing", true},
                    {"sequence_length", 128},
                    {"strategy", "zero"},
                    {"zero_stage", 2}};
    QCOMPARE(plan::settings_from_json(j, "plan.json").zero_stage, 2);
    json bad = j;
    bad["zero_stage"] = 3;
    QVERIFY_THROWS_EXCEPTION(tessera::Error, plan::settings_from_json(bad, "plan.json"));
    // hybrid with ZeRO-2 over its replicas, as `auto` records it in a run's plan.json, reads
    // back (a resume re-reads it); stage 3 is no layout of it.
    plan::Settings h = s;
    h.strategy = "hybrid";
    h.tp_size = 2;
    h.pp_size = 2;
    const job::JobSpec hybrid = plan::apply_settings(spec, h);
    QCOMPARE(hybrid.strategy.name, std::string("hybrid"));
    QCOMPARE(hybrid.strategy.options["zero_stage"].get<int>(), 2);
    QCOMPARE(hybrid.strategy.options["tp_size"].get<int>(), 2);
    QCOMPARE(hybrid.strategy.options["device"].get<std::string>(), std::string("cpu"));
    json recorded = j;
    recorded["strategy"] = "hybrid";
    recorded["tp_size"] = 2;
    recorded["pp_size"] = 2;
    const plan::Settings read = plan::settings_from_json(recorded, "plan.json");
    QCOMPARE(read.zero_stage, 2);
    QVERIFY(plan::same_layout(read, h));
    recorded["zero_stage"] = 3;
    QVERIFY_THROWS_EXCEPTION(tessera::Error, plan::settings_from_json(recorded, "plan.json"));
    recorded["strategy"] = "megatron";
    recorded["zero_stage"] = 0;
    try {
      plan::settings_from_json(recorded, "plan.json");
      QFAIL("expected an error");
    } catch (const tessera::Error& e) {
      QVERIFY2(std::string(e.what()).find("single, gemini, ddp, zero, hybrid") != std::string::npos,
               e.what());
    }
  }

  void planUsesTheStrategyTable() {
    // auto resolves to the table's planned strategy; a named one is kept; others are refused.
    auto in = inputs(64ull << 30);
    auto p = plan::make_plan(in);
    QCOMPARE(p.strategy, job::auto_strategy().name);
    QCOMPARE(p.strategy, std::string("single"));
    QVERIFY(plan::to_json(p)["strategy"] == "single");
    QVERIFY(p.reasons.front().rfind("strategy single: one process on cpu", 0) == 0);
    QCOMPARE(plan::apply_settings(in.spec, p.settings).strategy.name, std::string("single"));
    in.spec.strategy.name = "single";
    QCOMPARE(plan::make_plan(in).strategy, std::string("single"));
    in.spec.strategy.name = "megatron";
    try {
      plan::make_plan(in);
      QFAIL("expected an error");
    } catch (const Error& e) {
      QCOMPARE(int(e.kind()), int(ErrorKind::Unsupported));
      QVERIFY2(std::string(e.what()).find("strategy.name: \"megatron\"") != std::string::npos,
               e.what());
      QVERIFY2(e.hint().find("available plugins: single, gemini, ddp") != std::string::npos,
               e.hint().c_str());
    }
    // hybrid's layout must divide the processes, as the launch requires.
    in.spec.strategy.name = "hybrid";
    try {
      plan::make_plan(in);
      QFAIL("expected an error");
    } catch (const Error& e) {
      QCOMPARE(int(e.kind()), int(ErrorKind::Unsupported));
      QVERIFY2(std::string(e.what()).find("tp_size 2 × pp_size 1 = 2 does not divide the 1 "
                                          "processes") != std::string::npos,
               e.what());
      QVERIFY2(e.hint().find("--nproc 2") != std::string::npos, e.hint().c_str());
    }
    in.spec.strategy.name = "single";
    in.spec.strategy.options = {{"placement", "cpu"}};
    QVERIFY_THROWS_EXCEPTION(tessera::Error, plan::make_plan(in));
  }

  void planFollowsTheDeviceOption() {
    // A GPU is present, but strategy.options.device "cpu" plans for the host.
    auto in = inputs(64ull << 30);
    in.profile.gpus.push_back(test_gpu(80ull << 30, true));
    const plan::Plan assumed = plan::make_plan(in);
    QCOMPARE(assumed.tiers.at(0).tier, std::string("device"));
    QVERIFY2(assumed.time_source.find("the GPU's assumed 50000 GFLOP/s (not measured)") !=
                 std::string::npos,
             assumed.time_source.c_str());
    // The profile's measured rate replaces the assumption, in the job's precision.
    in.profile.gpus[0].rates.measured = true;
    in.profile.gpus[0].rates.fp32_flops = 25e12;
    in.profile.gpus[0].rates.bf16_flops = 400e12;
    in.profile.gpus[0].rates.measured_at = "2026-11-28T09:00:00Z";
    const plan::Plan measured = plan::make_plan(in);
    QVERIFY2(measured.time_source.find("the GPU's 25000 GFLOP/s (fp32 matrix products measured "
                                       "now, 2026-11-28T09:00:00Z)") != std::string::npos,
             measured.time_source.c_str());
    QVERIFY(measured.modelled_seconds_per_step > assumed.modelled_seconds_per_step);
    // gemini with device auto is its device tier on the GPU (the host tier beside it), unless
    // its options put parameter chunks on disk, which the device tier cannot do yet: the host.
    in.spec.strategy = {"gemini", nlohmann::json::object()};
    const plan::Plan gemini = plan::make_plan(in);
    QCOMPARE(gemini.tiers.at(0).tier, std::string("device"));
    QCOMPARE(gemini.tiers.at(1).tier, std::string("host"));
    QVERIFY(gemini.settings.device_tier);
    // With parameter chunks on disk too (the disk tier beside them when the profile has one).
    in.spec.strategy = {"gemini", {{"offload_param_frac", 0.5}}};
    QCOMPARE(plan::make_plan(in).tiers.at(0).tier, std::string("device"));
    // Placement auto is planned on the device too (every parameter chunk homed in host memory).
    in.spec.strategy = {"gemini", {{"placement", "auto"}}};
    QCOMPARE(plan::make_plan(in).tiers.at(0).tier, std::string("device"));
    // ddp over 2 processes: on the GPUs where this machine has one for each rank, each rank's
    // tier the whole of its GPU; with one GPU for 2 ranks, the CPU.
    in.spec.strategy = {"ddp", nlohmann::json::object()};
    in.processes = in.processes_per_node = 2;
    QCOMPARE(plan::make_plan(in).tiers.at(0).tier, std::string("host"));
    in.profile.gpus.push_back(in.profile.gpus[0]);
    const plan::Plan ddp = plan::make_plan(in);
    QCOMPARE(ddp.tiers.at(0).tier, std::string("device"));
    QCOMPARE(ddp.tiers.at(0).budget, std::uint64_t(80) << 30);
    // hybrid tp 2 as ddp: each rank's blocks on its GPU — the bytes device cpu plans in the
    // rank's share of host memory.
    in.spec.strategy = {"hybrid", {{"tp_size", 2}}};
    const plan::Plan hybrid = plan::make_plan(in);
    QCOMPARE(hybrid.tiers.at(0).tier, std::string("device"));
    QCOMPARE(hybrid.tiers.at(0).budget, std::uint64_t(80) << 30);
    // Their collectives timed at Gloo's measured link: the plan says NCCL's is not measured
    // (and on the CPU says nothing of NCCL).
    {
      auto with_link = in;
      with_link.profile.link = measured_link();
      const auto says_nccl_unmeasured = [](const plan::Plan& p) {
        return std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) {
          return r.find("the time above is Gloo's link, not NCCL's") != std::string::npos;
        });
      };
      for (const std::string strategy : {"ddp", "hybrid"}) {
        with_link.spec.strategy = {strategy, {{"tp_size", 2}}};
        if (strategy == "ddp") with_link.spec.strategy.options = nlohmann::json::object();
        QVERIFY2(says_nccl_unmeasured(plan::make_plan(with_link)), strategy.c_str());
        with_link.spec.strategy.options["device"] = "cpu";
        QVERIFY(!says_nccl_unmeasured(plan::make_plan(with_link)));
      }
    }
    in.spec.strategy = {"hybrid", {{"tp_size", 2}, {"device", "cpu"}}};
    const plan::Plan hybrid_on_cpu = plan::make_plan(in);
    QCOMPARE(hybrid_on_cpu.tiers.at(0).tier, std::string("host"));
    QVERIFY(hybrid.tiers[0].estimate.weights > 0);
    QCOMPARE(hybrid.tiers[0].estimate.weights, hybrid_on_cpu.tiers[0].estimate.weights);
    QCOMPARE(hybrid.tiers[0].estimate.optimizer, hybrid_on_cpu.tiers[0].estimate.optimizer);
    // zero stage 2 on the 2 GPUs keeps each rank's shard of the moments on its GPU; with the
    // optimizer offloaded (ZeRO-Offload) they and the float32 masters are in the rank's share of
    // host memory instead, in a host tier beside the device's.
    const double n = static_cast<double>(plan::count_parameters(in.model));
    in.spec.strategy = {"zero", {{"stage", 2}}};
    const plan::Plan zero = plan::make_plan(in);
    QCOMPARE(zero.tiers.at(0).tier, std::string("device"));
    QCOMPARE(zero.tiers.size(), std::size_t{1});
    QVERIFY(std::abs(static_cast<double>(zero.tiers[0].estimate.optimizer) - 4.0 * n) <= 1.0);
    in.spec.strategy = {"zero", {{"stage", 2}, {"offload_optimizer", true}}};
    const plan::Plan offloaded = plan::make_plan(in);
    QVERIFY(offloaded.settings.zero_offload);
    QCOMPARE(offloaded.tiers.size(), std::size_t{2});
    QCOMPARE(offloaded.tiers[0].estimate.optimizer, std::uint64_t{0});
    QCOMPARE(offloaded.tiers[1].tier, std::string("host"));
    QCOMPARE(offloaded.tiers[1].budget, in.profile.memory.usable() / 2);
    QVERIFY(std::abs(static_cast<double>(offloaded.tiers[1].estimate.optimizer) - 4.0 * n) <= 1.0);
    QVERIFY(std::abs(static_cast<double>(offloaded.tiers[1].estimate.weights) - 2.0 * n) <= 1.0);
    QVERIFY(offloaded.tiers[0].estimate.peak() < zero.tiers[0].estimate.peak());
    // gemini sharded over the 2 GPUs with its shards in host memory: each rank's GPU holds the
    // chunks gathered at once and the gradient chunks in flight (the same figures its plan on
    // the CPU puts among the host's), never the optimizer state; the shards, their moments and
    // reduced gradients stay in the rank's share of host memory, the same bytes as on the CPU
    // (with placement auto: every shard on disk, as on the CPU).
    in.spec.strategy = {"gemini", {{"device", "cpu"}}};
    const plan::Plan sharded_cpu = plan::make_plan(in);
    QCOMPARE(sharded_cpu.tiers.size(), std::size_t{1});
    const plan::MemoryEstimate& on_cpu = sharded_cpu.tiers[0].estimate;
    // By default (as on one GPU) the shards and their optimizer state live on the GPU: the GPU
    // holds all the CPU plan's weights (shards and whole chunks, nothing copied up) and moments,
    // the host none of them.
    in.spec.strategy = {"gemini", nlohmann::json::object()};
    const plan::Plan on_gpus = plan::make_plan(in);
    QCOMPARE(on_gpus.tiers.size(), std::size_t{2});
    QCOMPARE(on_gpus.tiers[0].estimate.optimizer, on_cpu.optimizer);
    QCOMPARE(on_gpus.tiers[0].estimate.weights, on_cpu.weights);
    QCOMPARE(on_gpus.tiers[1].estimate.optimizer, std::uint64_t{0});
    QCOMPARE(on_gpus.tiers[1].estimate.weights, std::uint64_t{0});
    in.spec.strategy = {"gemini", {{"host_param_frac", 1.0}, {"host_optim_frac", 1.0}}};
    const plan::Plan sharded = plan::make_plan(in);
    QCOMPARE(sharded.tiers.size(), std::size_t{2});
    QCOMPARE(sharded.tiers[0].tier, std::string("device"));
    QCOMPARE(sharded.tiers[1].tier, std::string("host"));
    QCOMPARE(sharded.tiers[1].budget, in.profile.memory.usable() / 2);
    const plan::MemoryEstimate& gpu_share = sharded.tiers[0].estimate;
    const plan::MemoryEstimate& host_share = sharded.tiers[1].estimate;
    QCOMPARE(gpu_share.optimizer, std::uint64_t{0});
    QCOMPARE(host_share.optimizer, on_cpu.optimizer);
    QCOMPARE(gpu_share.gathered_chunks, on_cpu.gathered_chunks);
    QCOMPARE(gpu_share.gradient_buckets, on_cpu.gradient_buckets);
    QVERIFY(gpu_share.gathered_chunks > 0 && gpu_share.gradient_buckets > 0);
    // Whole chunks on the GPU, shards on the host: together the CPU plan's weights, plus the
    // shards copied up for their gathers (a quarter of four chunks at most, W = 2: half).
    QCOMPARE(host_share.weights + gpu_share.gathered_chunks, on_cpu.weights);
    QCOMPARE(gpu_share.weights, gpu_share.gathered_chunks + gpu_share.gathered_chunks / 2);
    QVERIFY(host_share.gradients < on_cpu.gradients);
    // The activations of the same batch on that GPU under any strategy (its kernels' blocks and
    // saved tensors, not the CPU's: model/head_loss.h, RMSNorm in model/layers.cpp).
    QCOMPARE(gpu_share.activations, zero.tiers[0].estimate.activations);
    QVERIFY(gpu_share.activations != on_cpu.activations);
    QCOMPARE(host_share.activations, std::uint64_t{0});
    QVERIFY(std::any_of(sharded.reasons.begin(), sharded.reasons.end(), [](const std::string& r) {
              return r.find("planned as if it computed on the CPU") != std::string::npos;
            }) == false);
    QCOMPARE(plan::apply_settings(in.spec, sharded.settings).strategy.options,
             in.spec.strategy.options);
    in.spec.strategy = {"gemini", {{"placement", "auto"}}};
    const plan::Plan sharded_auto = plan::make_plan(in);
    QCOMPARE(sharded_auto.tiers.at(0).tier, std::string("device"));
    // Placement auto on the GPUs: every shard planned in host memory (what it needs at least);
    // those that fit move to the GPU after the first step.
    QCOMPARE(sharded_auto.settings.offload_param_frac, 0.0);
    QCOMPARE(sharded_auto.settings.host_param_frac, 1.0);
    // auto over several processes stays on the CPU, says so, and writes the device it planned.
    in.spec.strategy = {"auto", nlohmann::json::object()};
    const plan::Plan automatic = plan::make_plan(in);
    QCOMPARE(automatic.tiers.at(0).tier, std::string("host"));
    QVERIFY(
        std::any_of(automatic.reasons.begin(), automatic.reasons.end(), [](const std::string& r) {
          return r.find(
                     "strategy auto over several processes computes on the "
                     "CPU") == 0;
        }));
    QCOMPARE(plan::apply_settings(in.spec, automatic.settings).strategy.options.at("device"),
             nlohmann::json("cpu"));
    in.processes = in.processes_per_node = 1;
    in.spec.strategy = {"single", {{"device", "cpu"}}};
    const auto p = plan::make_plan(in);
    QCOMPARE(p.tiers.at(0).tier, std::string("host"));
    QCOMPARE(p.tiers.at(0).device, std::string("cpu"));
  }

  void parsesByteSizes() {
    QCOMPARE(plan::parse_byte_size("2GiB", "x"), std::uint64_t(2) << 30);
    QCOMPARE(plan::parse_byte_size("512MiB", "x"), std::uint64_t(512) << 20);
    QCOMPARE(plan::parse_byte_size("1.5GB", "x"), std::uint64_t(1500000000));
    QVERIFY_THROWS_EXCEPTION(tessera::Error, plan::parse_byte_size("lots", "x"));
    QVERIFY_THROWS_EXCEPTION(tessera::Error, plan::parse_byte_size("-1GiB", "x"));
  }

  // The step-time store: a record round-trips, the same key is replaced, the file is rewritten
  // whole (no temporary left beside it), and a corrupt file or record is skipped with a warning
  // naming the file.
  void stepTimeStoreRoundTripsAndReplaces() {
    QTemporaryDir dir;
    const std::filesystem::path file = dir.filePath("tessera/step_times.json").toStdString();
    const plan::StepTimeStore store(file);
    std::vector<std::string> warnings;
    QVERIFY(store.load(&warnings).empty());  // no file yet: nothing, silently
    QVERIFY(warnings.empty());
    plan::StepTimeRecord r;
    r.key = {"cpu: test × 2", "llama L4 H512", settings(8, false, "full")};
    r.seconds_per_step = 0.5;
    r.first_step_seconds = 2.0;
    r.steps_measured = 20;
    r.run = "/runs/a";
    r.recorded_at = "2026-01-01T00:00:00Z";
    store.record(r);
    plan::StepTimeRecord other = r;
    other.key.settings.micro_batch = 4;
    other.seconds_per_step = 0.3;
    store.record(other);
    r.seconds_per_step = 0.7;  // measured again: replaces the first record
    store.record(r);
    const auto records = store.load(&warnings);
    QVERIFY(warnings.empty());
    QCOMPARE(records.size(), std::size_t{2});
    QCOMPARE(records[0].key.settings.micro_batch, std::int64_t{4});
    QCOMPARE(records[1].seconds_per_step, 0.7);
    QCOMPARE(records[1].first_step_seconds, 2.0);
    QCOMPARE(records[1].run, std::string("/runs/a"));
    QVERIFY(plan::same(records[1].key, r.key));
    // A run of several processes is another key: recorded beside the one-process one, its
    // number kept.
    plan::StepTimeRecord ranks = r;
    ranks.key.processes = 2;
    QVERIFY(!plan::similar(ranks.key, r.key));
    store.record(ranks);
    const auto with_ranks = store.load(&warnings);
    QCOMPARE(with_ranks.size(), std::size_t{3});
    QCOMPARE(with_ranks.back().key.processes, 2);
    QCOMPARE(with_ranks[1].key.processes, 1);
    // Preference tuning's steps (two rows an example, a reference forward) are another key too:
    // a supervised run's time does not calibrate them.
    plan::StepTimeRecord pairs = r;
    pairs.key.settings.rows_per_example = 2;
    pairs.key.settings.reference_forward = true;
    QVERIFY(!plan::similar(pairs.key, r.key));
    const plan::StepTimeStore pair_store(dir.filePath("pairs/step_times.json").toStdString());
    pair_store.record(pairs);
    const auto read_back = pair_store.load(&warnings);
    QCOMPARE(read_back.size(), std::size_t{1});
    QVERIFY(plan::same(read_back[0].key, pairs.key));
    json stripped = json::parse(std::ifstream(file));
    stripped["records"].erase(2);
    std::ofstream(file) << stripped.dump();
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& entry :
         std::filesystem::directory_iterator(file.parent_path()))
      ++files;
    QCOMPARE(files, std::size_t{2});  // the store and its lock file, no temporary

    // One absurd record among good ones: that one is skipped, named by its index.
    json doc = json::parse(std::ifstream(file));
    doc["records"][0]["seconds_per_step"] = -1;
    std::ofstream(file) << doc.dump();
    warnings.clear();
    QCOMPARE(store.load(&warnings).size(), std::size_t{1});
    QCOMPARE(warnings.size(), std::size_t{1});
    QVERIFY(warnings[0].find("records[0]") != std::string::npos);

    // A corrupt file: nothing, one warning naming the file; recording replaces it.
    std::ofstream(file, std::ios::trunc) << "{\"records\": [ {\"device\": ";
    warnings.clear();
    QVERIFY(store.load(&warnings).empty());
    QCOMPARE(warnings.size(), std::size_t{1});
    QVERIFY(warnings[0].find(file.string()) != std::string::npos);
    store.record(r);
    warnings.clear();
    QCOMPARE(store.load(&warnings).size(), std::size_t{1});
    QVERIFY(warnings.empty());
  }

  // The FLOPs a step is planned at: 6 per token for each element of the layers, the final norm
  // and the LM head (tied too: the embedding's matrix is a product there), none for the input
  // embedding (a lookup), and the causal attention's 4 · hidden per layer over half the keys,
  // three times with backward. Counted here from the config, apart from the planner.
  void stepFlopsCountProductsAndAttentionNotTheLookup() {
    for (const bool tied : {false, true}) {
      plan::PlanInputs in = inputs(64ull << 30);
      json doc = small_llama();
      doc["tie_word_embeddings"] = tied;
      in.model = config(doc);
      const double h = 512, m = 1376, v = 8000, layers = 4, sequence = 128, batch = 8;
      const double layer = 4 * h * h + 3 * h * m + 2 * h;  // q k v o, gate up down, two norms
      const double products = layers * layer + h + v * h;  // + the final norm and the head
      const double attention = layers * 4 * h * sequence / 2;
      const double expected = (6 * products + 3 * attention) * sequence * batch;
      const plan::Plan p = plan::make_plan(in);
      QVERIFY2(std::abs(p.flops_per_step / expected - 1) < 1e-9,
               (std::to_string(p.flops_per_step) + " vs " + std::to_string(expected)).c_str());
      // What the model holds differs by the untied head; what it multiplies by does not.
      QCOMPARE(static_cast<double>(p.total_parameters),
               layers * layer + h + (tied ? 1 : 2) * v * h);
      // DPO: two rows an example (chosen and rejected), and the reference's forward over them
      // (2 FLOPs per element and the attention once more).
      in.spec.method.preference = tessera::job::PreferenceSpec{};
      const double dpo = (8 * products + 4 * attention) * sequence * batch * 2;
      const plan::Plan pairs = plan::make_plan(in);
      QVERIFY2(std::abs(pairs.flops_per_step / dpo - 1) < 1e-9,
               (std::to_string(pairs.flops_per_step) + " vs " + std::to_string(dpo)).c_str());
      // SimPO has no reference: two rows, no reference forward.
      in.spec.method.preference->loss = "simpo";
      const double simpo = (6 * products + 3 * attention) * sequence * batch * 2;
      QVERIFY(std::abs(plan::make_plan(in).flops_per_step / simpo - 1) < 1e-9);
    }
  }

  // A plan uses a measurement of the same job as measured, scales one of a similar job by the
  // cost model's ratio, ignores other models and devices, and says which it used.
  void planUsesMeasuredStepTimes() {
    plan::PlanInputs in = inputs(64ull << 30);
    const plan::Plan modelled = plan::make_plan(in);
    QVERIFY(!modelled.calibration);
    QCOMPARE(modelled.seconds_per_step, modelled.modelled_seconds_per_step);
    QVERIFY(modelled.time_source.find("estimated from") != std::string::npos);
    // The per-op overhead is on top of FLOPs at the rate.
    QVERIFY(modelled.seconds_per_step > modelled.flops_per_step / in.profile.cpu_flops);

    plan::StepTimeRecord r;
    r.key = plan::step_time_key(in.spec, in.model, in.profile);
    QCOMPARE(r.key.settings.micro_batch, modelled.settings.micro_batch);
    r.seconds_per_step = 3.0 * modelled.seconds_per_step;
    r.first_step_seconds = 5.0 * modelled.seconds_per_step;
    r.steps_measured = 20;
    r.run = "/runs/first-run";
    r.recorded_at = "2026-01-01T00:00:00Z";
    plan::StepTimeRecord other_model = r;
    other_model.key.model = "llama L2 H64";
    other_model.seconds_per_step = 100.0;
    in.step_times = {other_model};
    QVERIFY(!plan::make_plan(in).calibration);

    in.step_times = {other_model, r};
    const plan::Plan same = plan::make_plan(in);
    QVERIFY(same.calibration);
    QCOMPARE(same.seconds_per_step, r.seconds_per_step);
    QVERIFY(same.time_source.find("calibrated from run first-run's first 21 steps") !=
            std::string::npos);
    QVERIFY(std::abs(*same.total_seconds() -
                     (10 * r.seconds_per_step + 2.0 * modelled.seconds_per_step)) < 1e-9);
    QCOMPARE(plan::to_json(same)["time"]["calibrated"].get<bool>(), true);

    // Half the batch: the measurement scaled by the cost model's ratio.
    in.spec.training.batch_size = 4;
    const plan::Plan half = plan::make_plan(in);
    QVERIFY(half.calibration);
    QVERIFY(half.time_source.find("scaled from a similar run") != std::string::npos);
    QVERIFY(std::abs(half.seconds_per_step - r.seconds_per_step * half.modelled_seconds_per_step /
                                                 modelled.modelled_seconds_per_step) < 1e-12);
    QVERIFY(half.seconds_per_step < same.seconds_per_step);

    // A warning from the store reaches the plan's reasons.
    in.step_time_warnings = {"/cache/step_times.json: not a readable JSON file"};
    const plan::Plan warned = plan::make_plan(in);
    QVERIFY(std::any_of(warned.reasons.begin(), warned.reasons.end(), [](const std::string& w) {
      return w.rfind("warning: /cache/step_times.json", 0) == 0;
    }));
  }

  void profileSeesThisMachine() {
    plan::ProfileOptions options;
    const auto p = plan::probe_hardware(options);
    QVERIFY(p.cpu.logical_cores >= 1);
    QVERIFY(p.memory.total > 0);
    QVERIFY(p.memory.available <= p.memory.total);
    QVERIFY(!p.os.empty());
  }

  // The CPU's rate: a measured product rate (the caller's LibTorch) times the share a training
  // step sustains, said so; without a measurement the rough estimate, said so.
  void profileMeasuresTheCpuRate() {
    plan::ProfileOptions options;
    options.use_cache = false;
    const auto rough = plan::probe_hardware(options);
    QVERIFY(!rough.cpu_flops_measured);
    QVERIFY(rough.flops_source.rfind("rough estimate", 0) == 0);
    int calls = 0;
    int cores_given = 0;
    options.measure_cpu = [&](int cores) {
      ++calls;
      cores_given = cores;
      return plan::CpuRate{200e9, "a test's product", 300e6, "a test's Adam"};
    };
    const auto measured = plan::probe_hardware(options);
    QCOMPARE(calls, 1);
    QCOMPARE(cores_given, rough.cpu.physical_cores);
    QVERIFY(measured.cpu_flops_measured);
    QCOMPARE(measured.cpu_flops, 200e9 * plan::kCpuSustainedShare);
    QVERIFY2(measured.flops_source.rfind("measured: a test's product, 200 GFLOP/s", 0) == 0,
             measured.flops_source.c_str());
    QCOMPARE(plan::to_json(measured)["cpu"]["flops_measured"].get<bool>(), true);
    QCOMPARE(measured.cpu_adam_elements_per_s, 300e6);
    QVERIFY2(measured.cpu_adam_source.rfind("measured: a test's Adam (measured ", 0) == 0,
             measured.cpu_adam_source.c_str());
    QCOMPARE(plan::to_json(measured)["cpu"]["adam_elements_per_s"].get<double>(), 300e6);
    QVERIFY(rough.cpu_adam_elements_per_s == 0.0);
  }
};

QTEST_APPLESS_MAIN(TestPlan)
#include "test_plan.moc"
