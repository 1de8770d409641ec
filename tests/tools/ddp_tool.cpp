// tessera-ddp-tool: test-only driver of the `ddp` plugin for tests/integration/test_ddp.py. One
// process per rank, started with torchrun's variables (or none, for one process).
//
//   tessera-ddp-tool train STEPS ACCUMULATION BUCKET_BYTES METHOD PRECISION [PLUGIN [OPTIONS]]
//     Builds a tiny random Llama on every rank from a different seed (so that prepare()'s
//     broadcast from rank 0 is what makes them equal), and runs STEPS optimizer steps: each
//     step takes W × ACCUMULATION micro-batches (W = world size), rank r the ACCUMULATION
//     consecutive ones from r × ACCUMULATION. METHOD full | lora, PRECISION fp32 | bf16,
//     PLUGIN ddp (default) | zero | gemini, OPTIONS the strategy options as JSON (zero:
//     {"stage": 2}).
//     With zero every rank also reports memory() after the last backward (before the update)
//     and what it holds counted from its tensors (plugins/zero/zero_plugin.h); rank 0 the
//     optimizer bytes of `single` and the gradient bytes of a one-process `ddp` for comparison.
//     With gemini (sharded on W > 1) every rank reports memory() and what it holds counted from
//     its buffers (plugins/gemini/gemini_plugin.h) at the same moment — with a disk tier
//     (offload_optim_frac) also disk_memory() and the bytes of the files in its folder then —
//     and after training gathers the weights (a collective) so that rank 0 can compare them.
//     Rank 0 then trains the `single` plugin in-process on the same micro-batches in order with
//     gradient accumulation W × ACCUMULATION from rank 0's initial weights, and compares.
//     Every rank prints one JSON line: whether its weights equal rank 0's bit for bit, and (rank
//     0) the largest relative difference of the weights (per tensor, in L2 norm and elementwise),
//     losses and gradient norms to single's, how far training moved the weights, and the last
//     step's bucket trace (plugins/ddp). STEPS 0: train until killed, printing "step K" after each
//     step.
//
// Exit codes: 0 ran (the test judges the numbers), 2 bad arguments, 3 a peer failed (stderr:
// "failed_rank=R" and "failed_host=H" lines, then the message), 4 another error.
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dist/parallel_context.h"
#include "hf/config.h"
#include "model/model.h"
#include "plugins/builtin_plugins.h"
#include "plugins/ddp/ddp_plugin.h"
#include "plugins/gemini/gemini_plugin.h"
#include "plugins/zero/zero_plugin.h"
#include "train/lora.h"
#include "train/plugin_registry.h"

namespace {

using namespace tessera;
using nlohmann::json;

constexpr std::int64_t kVocab = 256;
constexpr double kLearningRate = 1e-3;
// Below the gradient norms here (about 1 to 2 full, 0.2 to 0.3 LoRA): clipping acts every step.
double max_grad_norm(const std::string& method) {
  return method == "lora" ? 0.1 : 0.5;
}

struct Run {
  std::shared_ptr<model::PretrainedModel> model;
  std::unique_ptr<train::LoraModel> lora;
  std::unique_ptr<train::Plugin> plugin;
};

// A tiny Llama (about 110k parameters, tensors of 2 to 64 KiB) from `seed`; with LoRA, adapters
// drawn after seeding torch's generator with `seed` too.
Run make_run(const std::string& plugin, std::uint64_t seed, const std::string& method,
             const std::string& precision, const train::ProcessContext& process,
             std::uint64_t bucket_bytes, const json& strategy_options = json::object()) {
  const json config{{"model_type", "llama"},       {"architectures", {"LlamaForCausalLM"}},
                    {"vocab_size", kVocab},        {"hidden_size", 64},
                    {"intermediate_size", 128},    {"num_hidden_layers", 2},
                    {"num_attention_heads", 4},    {"num_key_value_heads", 2},
                    {"rms_norm_eps", 1e-5},        {"max_position_embeddings", 64},
                    {"tie_word_embeddings", false}};
  const auto parsed = hf::parse_model_config(config, "config.json");
  Run run;
  run.model = model::create_model(parsed, model::head_from_config(parsed));
  model::init_weights(*run.model, seed);
  std::vector<train::NamedTensor> trainable;
  if (method == "lora") {
    torch::manual_seed(seed);
    run.lora = std::make_unique<train::LoraModel>(run.model, train::LoraOptions{4, 8.0, 0.0, {}});
    trainable = run.lora->adapters();
  } else {
    for (const auto& item : run.model->named_parameters())
      trainable.push_back({item.key(), item.value()});
  }
  run.model->train();
  train::PluginOptions options;
  options.process = process;
  options.precision = train::precision_from_name(precision);
  options.device = "cpu";
  options.adamw.weight_decay = 0.01;
  if (plugin != "single") {
    options.strategy_options = strategy_options;
    if (plugin != "gemini") options.strategy_options["bucket_size"] = bucket_bytes;
  }
  run.plugin = train::make_plugin(plugin);
  run.plugin->prepare(*run.model, std::move(trainable), options);
  return run;
}

// Micro-batch `index` of optimizer step `step`: the same tokens in every process.
model::ForwardInput micro_batch(std::int64_t step, std::int64_t index) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 * step + index + 7);
  model::ForwardInput in;
  in.input_ids = at::randint(0, kVocab, {2, 16}, generator, torch::kInt64);
  in.attention_mask = torch::ones_like(in.input_ids);
  in.labels = in.input_ids.clone();
  return in;
}

// Forward and backward of micro-batches [first, first + count) of `step`; their mean loss.
double train_step(Run& run, std::int64_t step, std::int64_t first, std::int64_t count) {
  double loss_sum = 0.0;
  for (std::int64_t i = 0; i < count; ++i) {
    const torch::Tensor loss = run.model->forward(micro_batch(step, first + i)).loss;
    loss_sum += loss.item<double>();
    run.plugin->backward(loss, 1.0 / static_cast<double>(count), i + 1 == count);
  }
  return loss_sum / static_cast<double>(count);
}

// The trained weights, whole: the float32 masters where the plugin holds them whole (ddp,
// single), else (zero, which holds its shares) the compute tensors every rank has whole, or
// (sharded gemini, whose chunks are gathered only while in use) the gathered values — a
// collective there, which every rank calls.
std::vector<train::NamedTensor> whole_weights(Run& run) {
  if (run.plugin->state_layout() == train::Plugin::StateLayout::Replicated)
    return run.plugin->trainable_weights();
  if (run.lora) return run.lora->adapters();
  std::vector<train::NamedTensor> out;
  if (!run.plugin->weights_in_memory()) {
    run.plugin->visit_weights(*run.model, [&](const std::string& name, const torch::Tensor& value) {
      out.push_back({name, value.detach().clone()});
    });
    return out;
  }
  for (const auto& item : run.model->named_parameters()) out.push_back({item.key(), item.value()});
  return out;
}

torch::Tensor flat_weights(Run& run) {
  std::vector<torch::Tensor> pieces;
  for (const auto& w : whole_weights(run)) pieces.push_back(w.tensor.detach().reshape(-1));
  return torch::cat(pieces).to(torch::kFloat32);
}

// The largest over tensors of ‖a − b‖ / ‖b‖ (L2), or with `elementwise` of max |a − b| / max |b|.
double max_relative_difference(Run& a, Run& b, bool elementwise) {
  const auto wa = whole_weights(a);
  const auto wb = whole_weights(b);
  double worst = 0.0;
  for (std::size_t i = 0; i < wa.size(); ++i) {
    const torch::Tensor x = wa[i].tensor.detach().to(torch::kFloat32);
    const torch::Tensor y = wb[i].tensor.detach().to(torch::kFloat32);
    const torch::Tensor diff = x - y;
    const double scale = elementwise ? y.abs().max().item<double>() : y.norm().item<double>();
    const double distance =
        elementwise ? diff.abs().max().item<double>() : diff.norm().item<double>();
    worst = std::max(worst, distance / std::max(scale, 1e-12));
  }
  return worst;
}

// The bytes of the regular files in `folder` (the disk tier's scratch files), as the filesystem
// reports their sizes.
std::uint64_t folder_file_bytes(const std::string& folder) {
  std::uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (entry.is_regular_file()) total += entry.file_size();
  return total;
}

double relative(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-12);
}

int run_train(int argc, char** argv) {
  if (argc < 7 || argc > 9) {
    std::fprintf(stderr,
                 "usage: tessera-ddp-tool train STEPS ACCUMULATION BUCKET_BYTES full|lora "
                 "fp32|bf16\n");
    return 2;
  }
  const std::int64_t steps = std::stoll(argv[2]);
  const std::int64_t accumulation = std::stoll(argv[3]);
  const std::uint64_t bucket_bytes = std::stoull(argv[4]);
  const std::string method = argv[5];
  const std::string precision = argv[6];
  const std::string plugin = argc > 7 ? argv[7] : "ddp";
  const json strategy_options = argc > 8 ? json::parse(argv[8]) : json::object();

  std::shared_ptr<dist::ParallelContext> context = dist::ParallelContext::from_environment();
  const int rank = context->rank();
  const int world = context->world_size();
  train::ProcessContext process;
  process.rank = rank;
  process.world_size = world;
  if (world > 1) {
    process.parallel = context;
    process.data_group = &context->world();
  }
  Run ddp = make_run(plugin, 11 + static_cast<std::uint64_t>(rank), method, precision, process,
                     bucket_bytes, strategy_options);
  train::MemoryByCategory during_step;     // after the last backward of the last step
  plugins::GeminiShardHeld gemini_during;  // sharded gemini: its buffers at the same moment
  bool gemini_sharded = false;
  std::optional<train::DiskTierMemory> disk_during;  // the disk tier at the same moment
  std::uint64_t disk_files_during = 0;               // the bytes of its folder's files then
  const torch::Tensor initial = flat_weights(ddp);
  std::vector<double> ddp_losses, ddp_norms;
  for (std::int64_t step = 0; steps == 0 || step < steps; ++step) {
    torch::Tensor loss =
        torch::tensor(train_step(ddp, step, rank * accumulation, accumulation), torch::kDouble);
    during_step = ddp.plugin->memory();
    gemini_sharded = plugins::gemini_shard_held(*ddp.plugin, &gemini_during);
    disk_during = ddp.plugin->disk_memory();
    if (disk_during) disk_files_during = folder_file_bytes(disk_during->folder);
    context->world().all_reduce(loss, dist::ReduceOp::Avg);
    ddp_losses.push_back(loss.item<double>());
    ddp_norms.push_back(ddp.plugin->step(kLearningRate, max_grad_norm(method)).grad_norm);
    if (steps == 0) {
      std::printf("step %lld\n", static_cast<long long>(step + 1));
      std::fflush(stdout);
    }
  }

  json out;
  out["rank"] = rank;
  torch::Tensor mine = flat_weights(ddp);
  torch::Tensor rank0 = mine.clone();
  context->world().broadcast(rank0, 0);
  out["identical_to_rank0"] = torch::equal(mine, rank0);
  const parallel::BucketTrace* trace =
      plugin == "zero" ? plugins::zero_trace(*ddp.plugin) : plugins::ddp_trace(*ddp.plugin);
  if (trace != nullptr) {
    out["buckets"] = trace->bucket_tensors;
    out["bucket_bytes"] = trace->bucket_bytes;
    out["launched_s"] = trace->launched_s;
    out["last_gradient_s"] = trace->last_gradient_s;
    out["backward_end_s"] = trace->backward_end_s;
    out["reduced_s"] = trace->reduced_s;
    out["all_reduces"] = trace->collectives;
  }
  out["memory_gradients"] = ddp.plugin->memory().gradients;
  out["during_step"] = {{"weights", during_step.weights},
                        {"gradients", during_step.gradients},
                        {"optimizer", during_step.optimizer}};
  if (plugins::ZeroHeld held; plugins::zero_held(*ddp.plugin, &held)) {
    std::uint64_t weight_bytes = 0;  // the shares as the checkpoint gets them
    for (const auto& w : ddp.plugin->trainable_weights())
      weight_bytes += static_cast<std::uint64_t>(w.tensor.nbytes());
    std::uint64_t optimizer_bytes = 0;
    for (const auto& t : ddp.plugin->optimizer_state())
      optimizer_bytes += static_cast<std::uint64_t>(t.tensor.nbytes());
    out["held"] = {{"stage", held.stage},
                   {"shard_elements", held.shard_elements},
                   {"total_elements", held.total_elements},
                   {"moment_bytes", held.moment_bytes},
                   {"gradient_bytes", held.gradient_bytes},
                   {"checkpoint_weight_bytes", weight_bytes},
                   {"checkpoint_optimizer_bytes", optimizer_bytes}};
  }

  if (gemini_sharded) {
    const plugins::GeminiShardHeld& g = gemini_during;
    std::uint64_t weight_bytes = 0;  // the shares as the checkpoint gets them
    for (const auto& w : ddp.plugin->trainable_weights())
      weight_bytes += static_cast<std::uint64_t>(w.tensor.nbytes());
    std::uint64_t optimizer_bytes = 0;
    for (const auto& t : ddp.plugin->optimizer_state())
      optimizer_bytes += static_cast<std::uint64_t>(t.tensor.nbytes());
    out["gemini"] = {{"world_size", g.world_size},
                     {"chunks", g.chunks},
                     {"chunk_elements", g.chunk_elements},
                     {"shard_elements", g.shard_elements},
                     {"trainable_elements", g.trainable_elements},
                     {"trainable_shard_elements", g.trainable_shard_elements},
                     {"parameter_shard_bytes", g.parameter_shard_bytes},
                     {"gathered_bytes", g.gathered_bytes},
                     {"gathered_chunks", g.gathered_chunks},
                     {"master_bytes", g.master_bytes},
                     {"moment_bytes", g.moment_bytes},
                     {"gradient_bytes", g.gradient_bytes},
                     {"offloaded_gradient_bytes", g.offloaded_gradient_bytes},
                     {"all_gathers", g.all_gathers},
                     {"reduce_scatters", g.reduce_scatters},
                     {"prefetched", g.prefetched},
                     {"pipelined_chunks", g.pipelined_chunks},
                     {"updates_behind", g.updates_behind},
                     {"read_aheads", g.read_aheads},
                     {"read_ahead_moment_bytes", g.read_ahead_moment_bytes},
                     {"read_ahead_master_bytes", g.read_ahead_master_bytes},
                     {"read_ahead_gradient_bytes", g.read_ahead_gradient_bytes},
                     {"read_ahead_optimizer_file_bytes", g.read_ahead_optimizer_file_bytes},
                     {"read_ahead_gradient_file_bytes", g.read_ahead_gradient_file_bytes},
                     {"offloaded_chunks", g.offloaded_chunks},
                     {"offloaded_moment_bytes", g.offloaded_moment_bytes},
                     {"offloaded_master_bytes", g.offloaded_master_bytes},
                     {"offloaded_parameter_chunks", g.offloaded_parameter_chunks},
                     {"offloaded_parameter_bytes", g.offloaded_parameter_bytes},
                     {"cached_parameter_bytes", g.cached_parameter_bytes},
                     {"cached_parameter_limit", g.cached_parameter_limit},
                     {"checkpoint_weight_bytes", weight_bytes},
                     {"checkpoint_optimizer_bytes", optimizer_bytes}};
    if (disk_during)
      out["disk_during_step"] = {{"folder", disk_during->folder},
                                 {"used", disk_during->used},
                                 {"weights", disk_during->by_category.weights},
                                 {"gradients", disk_during->by_category.gradients},
                                 {"optimizer", disk_during->by_category.optimizer},
                                 {"bytes_read", disk_during->bytes_read},
                                 {"bytes_written", disk_during->bytes_written},
                                 {"file_bytes", disk_files_during}};
    ddp.plugin->gather_weights();  // every rank: rank 0 alone reads the weights below
  }
  if (rank == 0) {
    // The reference: one process, gradient accumulation over all W × ACCUMULATION micro-batches.
    Run single = make_run("single", 11, method, precision, train::ProcessContext{}, 0);
    double loss_diff = 0.0, norm_diff = 0.0;
    for (std::int64_t step = 0; step < steps; ++step) {
      const double loss = train_step(single, step, 0, world * accumulation);
      const double norm = single.plugin->step(kLearningRate, max_grad_norm(method)).grad_norm;
      loss_diff = std::max(loss_diff, relative(ddp_losses[static_cast<std::size_t>(step)], loss));
      norm_diff = std::max(norm_diff, relative(ddp_norms[static_cast<std::size_t>(step)], norm));
    }
    out["max_rel_diff"] = max_relative_difference(ddp, single, false);
    out["max_elementwise_rel_diff"] = max_relative_difference(ddp, single, true);
    out["loss_rel_diff"] = loss_diff;
    out["grad_norm_rel_diff"] = norm_diff;
    out["grad_norms"] = ddp_norms;
    out["max_grad_norm"] = max_grad_norm(method);
    out["moved"] = ((mine - initial).abs().max() / initial.abs().max()).item<double>();
    out["single_optimizer_bytes"] = single.plugin->memory().optimizer;
    if (plugin == "zero") {
      // ddp's gradient buffers for the same model: one process, one step.
      Run reference = make_run("ddp", 11, method, precision, train::ProcessContext{}, bucket_bytes);
      train_step(reference, 0, 0, 1);
      out["ddp_gradient_bytes"] = reference.plugin->memory().gradients;
    }
  }
  context->world().barrier();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "train") {
    std::fprintf(stderr, "usage: tessera-ddp-tool train STEPS ACCUMULATION BUCKET_BYTES ...\n");
    return 2;
  }
  tessera::plugins::register_builtin_plugins();
  try {
    return run_train(argc, argv);
  } catch (const tessera::dist::PeerFailure& error) {
    std::fprintf(stderr, "failed_rank=%d\nfailed_host=%s\nerror: %s\nhint: %s\n",
                 error.failed_rank(), error.failed_host().c_str(), error.what(),
                 error.hint().c_str());
    return 3;
  } catch (const tessera::Error& error) {
    std::fprintf(stderr, "error: %s\nhint: %s\n", error.what(), error.hint().c_str());
    return 4;
  }
}
