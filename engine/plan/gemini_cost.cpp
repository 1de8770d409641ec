#include "plan/gemini_cost.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "hf/families.h"
#include "memory/chunk_cache_policy.h"
#include "memory/chunk_layout.h"
#include "memory/disk_store.h"
#include "plan/activations.h"
#include "plan/cost_terms.h"
#include "plan/plan_text.h"
#include "plan/spec_settings.h"

namespace tessera::plan {

using cost::counts_of;
using cost::d;
using cost::linear_shape;
using cost::to_bytes;

namespace {

// Gemini's auto layout (memory::pack_gemini_chunks) of tensors of `numels` elements in a dtype of
// `element_bytes`: at most memory::kMaxChunkBytes per chunk, larger tensors alone.
memory::ChunkLayout auto_layout(const std::vector<double>& numels, double element_bytes) {
  std::vector<std::int64_t> n;
  for (double x : numels) n.push_back(static_cast<std::int64_t>(std::min(x, 9.0e15)));
  return memory::pack_gemini_chunks(n, std::vector<std::string>(n.size()),
                                    static_cast<std::int64_t>(element_bytes), std::nullopt);
}

// LoRA's adapter matrices (A then B of each target of each layer), in elements, in the order
// the trainer creates them.
std::vector<double> lora_adapter_numels(const hf::ModelConfig& c, const Settings& s) {
  std::vector<double> adapters;
  const auto targets = cost::lora_targets(c, s);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const auto& name : targets)
      if (const auto shape = linear_shape(c, name)) {
        adapters.push_back(d(s.lora_rank) * shape->first);
        adapters.push_back(d(s.lora_rank) * shape->second);
      }
  return adapters;
}

// gemini on W ranks (plugins/gemini/gemini_plugin.cpp) as it lays a model out and gathers it:
// the tensors in the model's registration order (the embedding, each layer's linears with their
// biases then its norms, the rest outside the layers, an untied head last), trainable and frozen
// ones packed apart by the plugin's own chunk search (memory/chunk_layout.h), each chunk's used
// elements padded to a multiple of W. LoRA's adapters are chunked apart and kept whole (no block
// fetches them). Then one step of the plugin's gathers, replayed: every block's chunks gathered
// when it computes (forward, and again before its backward when it needs its parameters there), at
// most kGatheredChunks whole at once, the chunk the traced order needs again last released first,
// the next chunk of that order gathered ahead; every gathered chunk released at the update. This is
// the plugin's behaviour from its second step on (its first traces the order, releasing the
// least recently used).
using memory::kGatheredChunks;   // gemini_plugin.cpp's: whole chunks at once
using memory::kReducesInFlight;  // and gradient chunks in flight

struct ShardedChunks {
  std::vector<double> fetched;    // elements of each chunk the blocks gather, in use order
  std::vector<double> kept;       // chunks kept whole (LoRA's adapters)
  std::vector<double> trainable;  // elements of each trainable chunk
  double all = 0;                 // Σ every chunk's elements
  double largest_trainable_tensor = 0;
  double layer_elements = 0;     // one layer's chunked elements (QLoRA's quantized weights not)
  double gathered_peak = 0;      // elements of fetched chunks whole at once, at most
  double gathered_elements = 0;  // elements all-gathered in a step, of fetched chunks
  std::int64_t gathers = 0;      // all-gathers of fetched chunks in a step
  // One step's block uses in order, each with its chunks (indices into `fetched`); empty when
  // only part of the model was replayed (deeper than kLayersReplayed).
  std::vector<std::vector<std::size_t>> step_blocks;
};

// The replay packs and replays at most this many layers; a deeper config's other layers are
// added as chunks of the replay's typical size (its median one), so a config of absurd depth is
// refused by its size, not by the estimate running out of memory.
constexpr std::int64_t kLayersReplayed = 64;

ShardedChunks replayed_chunks(const hf::ModelConfig& c, const Settings& s, int world_size);

// The plugin's gathers over one step's block uses (each block's chunks, in order), replayed with
// its own policy (memory/chunk_cache_policy.h): a block's chunks gathered when it computes, at
// most kGatheredChunks whole at once, the one the order needs again last released first, the
// next chunk of the order gathered ahead within the step. `gathered(ch)` and `released(ch)` are
// told of each.
template <typename Gathered, typename Released>
void replay_gathers(const std::vector<std::vector<std::size_t>>& blocks, std::size_t chunks,
                    Gathered gathered, Released released) {
  std::vector<std::size_t> trace;
  for (const auto& block : blocks)
    for (std::size_t ch : block)
      if (trace.empty() || trace.back() != ch) trace.push_back(ch);
  memory::ChunkCachePolicy policy(chunks);
  policy.use_order(std::move(trace));
  std::vector<bool> held(chunks, false);
  auto make_room = [&] {
    return policy.make_room(
        kGatheredChunks, [&](std::size_t ch) { return static_cast<bool>(held[ch]); },
        [&](std::size_t ch) {
          held[ch] = false;
          released(ch);
        });
  };
  auto gather = [&](std::size_t ch) {
    held[ch] = true;
    gathered(ch);
  };
  for (const auto& block : blocks) {
    policy.pin(block);
    for (std::size_t ch : block) {
      if (!held[ch]) {
        make_room();
        gather(ch);
      }
      const std::optional<std::size_t> next = policy.next_after(ch, /*across_steps=*/false);
      if (next && !held[*next] && make_room()) gather(*next);
    }
  }
}

ShardedChunks sharded_chunks(const hf::ModelConfig& c, const Settings& s, int world_size) {
  if (c.num_hidden_layers <= kLayersReplayed) return replayed_chunks(c, s, world_size);
  hf::ModelConfig replayed = c;
  replayed.num_hidden_layers = kLayersReplayed;
  ShardedChunks out = replayed_chunks(replayed, s, world_size);
  const double w = d(std::max(1, world_size));
  const double more = d(c.num_hidden_layers - kLayersReplayed);  // layers not replayed
  const double share = more / d(kLayersReplayed);
  // Each layer's tensors in the fetched chunks, and LoRA's adapters in the kept ones.
  const bool lora = s.method == "lora";
  double adapters = 0;
  for (double x : out.kept) adapters += x;
  const auto extend = [&](std::vector<double>& chunks, double elements) {
    if (chunks.empty() || elements <= 0) return;
    std::vector<double> sorted = chunks;
    std::nth_element(sorted.begin(),
                     sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
    // (At most a million of them: past that, larger ones.)
    const double typical = std::max({w, sorted[sorted.size() / 2], elements / 1e6});
    const double count = std::ceil(elements / typical);
    chunks.insert(chunks.end() - 1, static_cast<std::size_t>(count), typical);
    out.all += count * typical;
  };
  extend(out.fetched, more * out.layer_elements);
  if (lora) {
    extend(out.kept, adapters * share);
    out.trainable = out.kept;
  } else {
    out.trainable = out.fetched;
  }
  // The gathers repeat layer by layer; the peak of chunks whole at once stays the replay's.
  out.step_blocks.clear();  // indices of the replay's chunks, not of the extended list
  out.gathered_elements *= 1.0 + share;
  out.gathers = static_cast<std::int64_t>(d(out.gathers) * (1.0 + share));
  return out;
}

ShardedChunks replayed_chunks(const hf::ModelConfig& c, const Settings& s, int world_size) {
  ShardedChunks out;
  const bool lora = s.method == "lora";
  const double element = half_precision(s.precision) ? 2.0 : 4.0;
  const double w = d(std::max(1, world_size));
  const hf::ParameterShapes shapes = hf::family_of(c).parameter_shapes(c);
  const double v = d(c.vocab_size), h = d(c.hidden_size);
  const double head = !c.tie_word_embeddings && shapes.outside_layers >= 2 * v * h ? v * h : 0.0;
  const double rest = std::max(0.0, shapes.outside_layers - v * h - head);
  // Tensors (elements, block) and blocks (whether their backward needs them again).
  std::vector<std::pair<double, std::size_t>> tensors;
  std::vector<bool> backward;
  auto block = [&](std::initializer_list<double> numels, bool needed_in_backward) {
    for (double n : numels)
      if (n > 0) tensors.push_back({n, backward.size()});
    backward.push_back(needed_in_backward);
    return backward.size() - 1;
  };
  // QLoRA's quantized linear weights are held beside the chunks (their biases are chunked).
  const bool quantized = cost::quantized_base(c, s).elements > 0;
  const std::size_t embedding = block({v * h}, false);
  std::vector<std::vector<std::size_t>> layer_blocks;  // each layer's blocks, forward order
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::size_t first_tensor = tensors.size();
    // The layer's linears are registered (and chunked) before its two norms, which compute
    // before the attention's linears and before the MLP's (those reading the layer's third
    // input, LinearModule::input): the norms' chunk is used twice a layer.
    std::vector<std::size_t> linears;
    for (const hf::LinearModule& m : shapes.layer_linears)
      linears.push_back(block(
          {quantized ? 0.0 : m.in_features * m.out_features, m.bias ? m.out_features : 0.0}, true));
    const auto mlp = std::find_if(shapes.layer_linears.begin(), shapes.layer_linears.end(),
                                  [](const hf::LinearModule& m) { return m.input >= 2; });
    std::vector<std::size_t> blocks;
    if (mlp == shapes.layer_linears.end()) {
      blocks = {block({shapes.layer_other}, true)};
      blocks.insert(blocks.end(), linears.begin(), linears.end());
    } else {
      const auto split = linears.begin() + (mlp - shapes.layer_linears.begin());
      const std::size_t attention_norm = block({shapes.layer_other / 2}, true);
      const std::size_t mlp_norm = block({shapes.layer_other / 2}, true);
      blocks = {attention_norm};
      blocks.insert(blocks.end(), linears.begin(), split);
      blocks.push_back(mlp_norm);
      blocks.insert(blocks.end(), split, linears.end());
    }
    // LoRA: below the first layer's first adapted linear nothing needs a gradient (the
    // embedding is frozen), so backward runs none of the first layer's blocks before it.
    if (lora && l == 0) {
      const auto targets = cost::lora_targets(c, s);
      bool adapted = false;
      for (std::size_t b : blocks) {
        const auto at = std::find(linears.begin(), linears.end(), b);
        if (at != linears.end()) {
          const std::string& name = shapes.layer_linears[at - linears.begin()].name;
          adapted = adapted || std::find(targets.begin(), targets.end(), name) != targets.end();
        }
        backward[b] = adapted;
      }
    }
    layer_blocks.push_back(std::move(blocks));
    if (l == 0)  // every layer has the same tensors
      for (std::size_t t = first_tensor; t < tensors.size(); ++t)
        out.layer_elements += tensors[t].first;
  }
  const std::size_t outside = block({rest}, true);
  // The head: its own linear, or the embedding's weight again (tied).
  const std::size_t head_block = head > 0 ? block({head}, true) : embedding;

  // Chunks as the plugin packs them (auto_layout), the used elements padded to W.
  auto pack = [&](const std::vector<double>& numels) {
    const memory::ChunkLayout layout = auto_layout(numels, element);
    std::vector<double> chunks;
    std::vector<std::size_t> chunk_of(numels.size());
    for (const memory::ChunkSpec& spec : layout.chunks) {
      for (const memory::ChunkSlot& slot : spec.slots) chunk_of[slot.tensor] = chunks.size();
      chunks.push_back(std::ceil(d(spec.used) / w) * w);
    }
    return std::pair{chunks, chunk_of};
  };
  std::vector<double> numels;
  for (const auto& t : tensors) numels.push_back(t.first);
  // Not a structured binding: the lambdas below use these, which clang before 16 refuses.
  const auto packed = pack(numels);
  const auto& chunks = packed.first;
  const auto& chunk_of = packed.second;
  out.fetched = chunks;
  if (lora) {
    const std::vector<double> adapters = lora_adapter_numels(c, s);
    if (!adapters.empty()) out.kept = pack(adapters).first;
    out.trainable = out.kept;
    for (double a : adapters)
      out.largest_trainable_tensor = std::max(out.largest_trainable_tensor, a);
  } else {
    out.trainable = chunks;
    for (double n : numels)
      out.largest_trainable_tensor = std::max(out.largest_trainable_tensor, n);
  }
  for (double x : out.fetched) out.all += x;
  for (double x : out.kept) out.all += x;

  // The chunks of each block, in order.
  std::vector<std::vector<std::size_t>> block_chunks(backward.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto& mine = block_chunks[tensors[i].second];
    if (std::find(mine.begin(), mine.end(), chunk_of[i]) == mine.end()) mine.push_back(chunk_of[i]);
  }
  // One micro-batch's block uses: forward, then backward in reverse (each layer computed again
  // first under activation checkpointing).
  std::vector<std::size_t> uses = {embedding};
  for (const auto& blocks : layer_blocks) uses.insert(uses.end(), blocks.begin(), blocks.end());
  uses.push_back(outside);
  uses.push_back(head_block);
  auto backward_use = [&](std::size_t b) {
    if (backward[b] && !block_chunks[b].empty()) uses.push_back(b);
  };
  backward_use(head_block);
  backward_use(outside);
  for (auto layer = layer_blocks.rbegin(); layer != layer_blocks.rend(); ++layer) {
    if (s.activation_checkpointing)  // the layer's forward again, every block
      for (std::size_t b : *layer)
        if (!block_chunks[b].empty()) uses.push_back(b);
    for (auto b = layer->rbegin(); b != layer->rend(); ++b) backward_use(*b);
  }
  std::vector<std::size_t> step_uses;
  const std::int64_t micro_batches = std::clamp<std::int64_t>(s.gradient_accumulation, 1, 64);
  for (std::int64_t m = 0; m < micro_batches; ++m)
    step_uses.insert(step_uses.end(), uses.begin(), uses.end());
  for (std::size_t b : step_uses) out.step_blocks.push_back(block_chunks[b]);
  double whole = 0;
  replay_gathers(
      out.step_blocks, chunks.size(),
      [&](std::size_t ch) {
        whole += chunks[ch];
        ++out.gathers;
        out.gathered_elements += chunks[ch];
        out.gathered_peak = std::max(out.gathered_peak, whole);
      },
      [&](std::size_t ch) { whole -= chunks[ch]; });
  return out;
}

// A device tier's estimate computes there: the activations and the CUDA runtime (taken as the
// host process's baseline: the context, cuBLAS's workspace) of the job's estimate `in_memory`
// are the GPU's, the runtime its floor. The simulated device computes in host memory: nothing.
void computes_on_the_device(MemoryEstimate& device, const MemoryEstimate& in_memory,
                            bool simulated) {
  if (simulated) {
    device.floor = 0;
    return;
  }
  device.activations = in_memory.activations;
  device.runtime = in_memory.runtime;
  device.floor = device.runtime;
}

}  // namespace

// gemini sharded over W ranks with a device tier (gemini_plugin.cpp with a device): {the
// device's share, the host's} of one rank. The device holds the chunks gathered at once (at
// most four fetched ones, and LoRA's adapter chunks for good), the shards copied up for their
// gathers where some shard lives in host memory (at most one per gathered chunk), the float32
// gradient chunk being filled and those being reduce-scattered with their output shards,
// autograd's gradient of one tensor, the activations and the CUDA runtime; and the shards
// placed there: parameter shards but for the share host_param_frac in host memory (placement
// auto: all in host memory, their files on disk) and those on disk, optimizer shards (moments;
// float32 masters in bf16 or where the shard's values are on another tier, but for fp32 values in
// host memory, copied up for their update, two at a time) but for
// host_optim_frac and those on disk, each with its float32 gradient shard — the plugin's rule
// (memory::choose_offloaded_chunks) over the same sizes, from the last chunk back. The host
// keeps everything else of the rank's estimate on the CPU (its other shards, their optimizer
// state and reduced gradients, the disk tier's buffers, loading and the export), the host staging
// of the new values of the device's shards updated off it (kStagedUpdates buffers of the largest
// such shard, used in turn), plus, with
// gradient accumulation, one more host gradient shard per chunk (later micro-batches' shards
// copied down, added once the backward's copies are done).
std::pair<MemoryEstimate, MemoryEstimate> sharded_device_tiers(const hf::ModelConfig& c,
                                                               const Settings& s,
                                                               std::uint64_t checkpoint_bytes,
                                                               int world_size) {
  Settings on_cpu = s;
  on_cpu.device_tier = false;
  const MemoryEstimate all = estimate_memory(c, on_cpu, checkpoint_bytes, world_size);
  const ShardedChunks chunks = sharded_chunks(c, s, world_size);
  const auto counts = counts_of(c, s);
  const double w = d(std::max(1, world_size));
  const bool lora = s.method == "lora";
  double kept = 0, trainable_shards = 0;
  for (double x : chunks.kept) kept += x;
  for (double x : chunks.trainable) trainable_shards += x / w;
  const double autograd_tensor =
      chunks.largest_trainable_tensor * (counts.param_bytes + (counts.bf16 ? 4.0 : 0.0));
  // A group of one computes on a shard on the device in place, and gathers up only the chunks of
  // the other shards; the estimate on the CPU counted no whole chunk at all.
  const bool one = world_size <= 1;
  const double whole_on_cpu = one ? 0.0 : (chunks.gathered_peak + kept) * counts.param_bytes;

  // Parameter shards (the fetched chunks, then the kept ones) and optimizer shards by tier.
  using memory::ChunkTier;
  std::vector<std::uint64_t> value_sizes;
  std::vector<bool> may_go_to_disk;
  for (double x : chunks.fetched) {
    value_sizes.push_back(to_bytes(x / w * counts.param_bytes));
    may_go_to_disk.push_back(true);
  }
  for (double x : chunks.kept) {
    value_sizes.push_back(to_bytes(x / w * counts.param_bytes));
    may_go_to_disk.push_back(false);
  }
  const std::vector<ChunkTier> value_tiers =
      memory::place_chunks(value_sizes, std::clamp(s.offload_param_frac, 0.0, 1.0),
                           std::clamp(s.host_param_frac, 0.0, 1.0), true, may_go_to_disk);
  double device_values = 0;
  bool fetched_from_host = false;   // a gathered chunk's shard is copied up
  std::vector<double> gathered_up;  // one process: the fetched chunks gathered up, elements
  double kept_up = 0;               // and the kept ones held whole on the device
  for (std::size_t k = 0; k < value_sizes.size(); ++k) {
    const bool fetched = k < chunks.fetched.size();
    if (value_tiers[k] == ChunkTier::Device) {
      device_values += d(static_cast<std::int64_t>(value_sizes[k]));
    } else if (fetched) {
      fetched_from_host = true;
      gathered_up.push_back(chunks.fetched[k]);
    } else {
      kept_up += chunks.kept[k - chunks.fetched.size()];
    }
  }
  double whole = whole_on_cpu;
  double gathered = chunks.gathered_peak;  // fetched chunks whole on the device at once
  if (one) {
    // At most kGatheredChunks of the chunks whose shard is elsewhere, the replay's peak at most.
    std::sort(gathered_up.rbegin(), gathered_up.rend());
    double largest_up = 0;
    for (std::size_t k = 0; k < std::min(kGatheredChunks, gathered_up.size()); ++k)
      largest_up += gathered_up[k];
    gathered = std::min(chunks.gathered_peak, largest_up);
    whole = (gathered + kept_up) * counts.param_bytes;
  }
  std::vector<std::uint64_t> optim_sizes;
  for (double x : chunks.trainable) optim_sizes.push_back(to_bytes(x / w * 4.0));
  const std::vector<ChunkTier> optim_tiers =
      memory::place_chunks(optim_sizes, std::clamp(s.offload_optim_frac, 0.0, 1.0),
                           std::clamp(s.host_optim_frac, 0.0, 1.0), true);
  double device_optim = 0;  // elements of the optimizer shards on the device
  double device_masters = 0, host_masters = 0, disk_shards = 0;
  double staged_shard = 0;   // the largest fp32 shard in host memory updated on the device
  double staged_values = 0;  // the largest shard on the device updated off it (host staging)
  double fp32_disk_masters = 0, fp32_disk_growth = 0;  // fp32 masters on disk: their files grow
  for (std::size_t t = 0; t < chunks.trainable.size(); ++t) {
    const double shard = chunks.trainable[t] / w;
    const bool on_device = optim_tiers[t] == ChunkTier::Device;
    const bool on_disk = optim_tiers[t] == ChunkTier::Disk;
    const std::size_t value = lora ? chunks.fetched.size() + t : t;
    // The plugin's keeps_masters: in fp32, a shard in host memory updated on the device is
    // copied up for its update instead (at most kStagedUpdates at once).
    const ChunkTier values = value < value_tiers.size() ? value_tiers[value] : ChunkTier::Host;
    const bool keeps_masters = counts.bf16 || (values == ChunkTier::Device && !on_device) ||
                               (values == ChunkTier::Disk && on_device);
    if (!counts.bf16 && values == ChunkTier::Host && on_device)
      staged_shard = std::max(staged_shard, shard);
    if (values == ChunkTier::Device && !on_device) staged_values = std::max(staged_values, shard);
    if (on_disk) disk_shards += shard;
    if (on_device) device_optim += shard;
    if (!keeps_masters) continue;
    if (on_device) {
      device_masters += shard * 4.0;
    } else if (!on_disk) {
      host_masters += shard * 4.0;
    } else if (!counts.bf16) {
      fp32_disk_masters += shard * 4.0;
      // A third padded array (update_in_slices' alignment).
      fp32_disk_growth += d(memory::sliced_array_elements(static_cast<std::int64_t>(shard))) * 4.0;
    }
  }
  // The estimate on the CPU counted masters for the shards in host memory in bf16 only.
  const double cpu_host_masters = counts.bf16 ? (trainable_shards - disk_shards) * 4.0 : 0.0;

  // A group of one's gradient chunks whose optimizer shard is off the device: filled whole there
  // and copied down, kReducesInFlight on their way.
  double largest_off_device = 0;
  for (std::size_t t = 0; t < chunks.trainable.size(); ++t)
    if (optim_tiers[t] != ChunkTier::Device)
      largest_off_device = std::max(largest_off_device, chunks.trainable[t]);
  const std::uint64_t gradient_buckets =
      one ? to_bytes((1.0 + static_cast<double>(kReducesInFlight)) * largest_off_device * 4.0)
          : all.gradient_buckets;

  MemoryEstimate device;
  device.gathered_chunks = to_bytes(gathered * counts.param_bytes);
  device.weights = to_bytes(
      whole + (fetched_from_host && !one ? chunks.gathered_peak / w * counts.param_bytes : 0.0) +
      device_values + device_masters +
      d(static_cast<std::int64_t>(memory::kStagedUpdates)) * staged_shard * 4.0);
  device.optimizer = to_bytes(device_optim * 8.0);
  device.gradient_buckets = gradient_buckets;
  device.gradients =
      to_bytes(static_cast<double>(gradient_buckets) + autograd_tensor + device_optim * 4.0);
  computes_on_the_device(device, all, s.simulated_device);

  MemoryEstimate host = all;
  host.disk_gradients = 0;  // with a device tier the gradient shards stay in memory
  host.backward_gradients = 0;
  host.weights = to_bytes(static_cast<double>(all.weights) - whole_on_cpu - device_values -
                          cpu_host_masters + host_masters +
                          d(static_cast<std::int64_t>(memory::kStagedUpdates)) * staged_values *
                              counts.param_bytes);
  host.optimizer = to_bytes(static_cast<double>(all.optimizer) - device_optim * 8.0);
  // QLoRA's quantized base computes where the chunks do: on a GPU it moves there (the simulated
  // device computes in host memory, where it stays).
  if (!s.simulated_device) {
    const double quantized = cost::quantized_base(c, s).bytes;
    device.weights += to_bytes(quantized);
    host.weights = to_bytes(std::max(0.0, static_cast<double>(host.weights) - quantized));
  }
  // The disk tier goes with the device's estimate (the plan's), as one process's does: the
  // rank's files, with fp32 masters where the shard's values are on the device.
  device.disk_weights = to_bytes(static_cast<double>(all.disk_weights) + fp32_disk_masters);
  device.disk_optimizer =
      to_bytes(static_cast<double>(all.disk_optimizer) + fp32_disk_growth - fp32_disk_masters);
  device.disk_parameters = all.disk_parameters;
  device.disk_trainable_parameters = all.disk_trainable_parameters;
  host.disk_weights = host.disk_optimizer = host.disk_parameters = 0;
  host.disk_trainable_parameters = 0;
  host.gathered_chunks = 0;
  host.gradient_buckets = 0;
  host.gradients =
      to_bytes((trainable_shards - device_optim) * 4.0 * (s.gradient_accumulation > 1 ? 2.0 : 1.0));
  if (!s.simulated_device) host.activations = 0;
  return {device, host};
}

namespace {

// The bytes of parameter shards on disk (`shard_files`, by chunk; 0: not on disk) that one
// step's gathers read: the plugin's cache policy replayed over the step's block uses, as for the
// gathered peak, so a chunk still gathered from an earlier use is not read again (a small model's
// few disk chunks are read once a step, not in forward and again in backward). One process
// gathers only its chunks on disk; several ranks gather every fetched chunk. 0 when the step was
// not replayed whole.
std::uint64_t replayed_disk_reads(const ShardedChunks& chunks,
                                  const std::vector<std::uint64_t>& shard_files, bool one) {
  if (chunks.step_blocks.empty()) return 0;
  const std::size_t n = chunks.fetched.size();
  const auto on_disk = [&](std::size_t ch) { return ch < shard_files.size() && shard_files[ch]; };
  std::vector<std::vector<std::size_t>> blocks;
  for (const auto& block : chunks.step_blocks) {
    std::vector<std::size_t> gathered;
    for (std::size_t ch : block)
      if (ch < n && (!one || on_disk(ch))) gathered.push_back(ch);
    blocks.push_back(std::move(gathered));
  }
  std::uint64_t reads = 0;
  replay_gathers(
      blocks, n,
      [&](std::size_t ch) {
        if (on_disk(ch)) reads += shard_files[ch];
      },
      [](std::size_t) {});
  return reads;
}

// One rank of W (plugins/gemini/gemini_plugin.cpp; one process is a group of one).
void sharded_memory(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                    int world_size) {
  const auto [n, trainable, stored, param_bytes, lora, bf16] = counts_of(c, s);
  // One rank of gemini sharded over W (plugins/gemini/gemini_plugin.cpp, memory()): shard r
  // of every chunk in the compute dtype, the fetched chunks whole while blocks use them (at
  // most four at once: `gathered_chunks`, part of the weights) and LoRA's adapter chunks whole
  // for good; of the trainable chunks, the Adam moments of the shard (and its float32 masters
  // in bf16) and its float32 reduced gradients; during backward the float32 whole gradient
  // chunk being filled and two being reduce-scattered with their output shards
  // (`gradient_buckets`, part of the gradients), and autograd's gradient of one tensor before
  // it is copied in (widened to float32 in bf16).
  // With offload_optim_frac f, each rank's disk tier holds the optimizer shards (moments, and
  // the float32 masters in bf16) of the trainable chunks the plugin's rule picks
  // (memory::choose_offloaded_chunks over the shards' bytes, equal on every rank), one file per
  // chunk rounded up to the I/O alignment (memory::io_size, as DiskStore does); the update
  // streams them, at most three resident at once (`offload_buffers`). The reduced gradient
  // shard of each such chunk goes to a file beside it after each micro-batch (at most
  // kGradientWritesInFlight on their way, plus the one being filled), read back by the next
  // micro-batch and by the update; the other gradient shards stay in memory.
  // With offload_param_frac, the parameter shards of the chunks the same rule
  // picks (over every chunk's shard bytes but LoRA's adapter chunks) are files of the disk tier
  // too: read when their chunk is gathered and kept while it is (at most four), and streamed
  // through the update with the optimizer shards.
  const ShardedChunks chunks = sharded_chunks(c, s, world_size);
  const double w = d(world_size);
  const double arrays = bf16 ? 3.0 : 2.0;
  double trainable_shards = 0, largest = 0;
  std::vector<std::uint64_t> optim_sizes;  // each shard's optimizer bytes, as the rule ranks them
  std::vector<std::uint64_t> optim_files;  // on disk, each array padded for the sliced update
  std::vector<double> padded;              // elements of each padded array
  for (double x : chunks.trainable) {
    trainable_shards += x / w;
    largest = std::max(largest, x);
    optim_sizes.push_back(to_bytes(x / w * 4.0 * arrays));
    padded.push_back(d(memory::sliced_array_elements(static_cast<std::int64_t>(x / w))));
    optim_files.push_back(to_bytes(padded.back() * 4.0 * arrays));
  }
  const std::vector<bool> on_disk =
      memory::choose_offloaded_chunks(optim_sizes, std::clamp(s.offload_optim_frac, 0.0, 1.0));
  // A shard's buffer while resident: its file's size, at least one I/O block.
  const auto buffer_of = [](std::uint64_t bytes) {
    return std::max<std::uint64_t>(memory::io_size(bytes), memory::kIoAlignment);
  };
  double disk_shards = 0;
  std::uint64_t disk_files = 0;
  std::uint64_t gradient_files = 0;
  // Each trainable chunk's gradient shard bound for disk (0 for the others), in chunk order.
  std::vector<double> disk_gradients(on_disk.size(), 0.0);
  std::vector<std::uint64_t> disk_buffers;  // each on-disk shard's buffer while resident
  // One process in bf16 writes them in bf16 (its sums are rounded to bf16), several in float32.
  const double gradient_file_element = world_size == 1 && bf16 ? 2.0 : 4.0;
  const auto gradient_bytes_of = [&](std::size_t t) {
    return to_bytes(padded[t] * gradient_file_element);
  };
  double disk_padded = 0;  // elements of the on-disk shards' padded arrays
  for (std::size_t t = 0; t < on_disk.size(); ++t) {
    if (!on_disk[t]) continue;
    disk_shards += chunks.trainable[t] / w;
    disk_padded += padded[t];
    disk_files += memory::io_size(optim_files[t]);
    disk_buffers.push_back(buffer_of(optim_files[t]));
    gradient_files += memory::io_size(gradient_bytes_of(t));
    // In memory (as the plugin counts it): the shard's own bytes.
    disk_gradients[t] = chunks.trainable[t] / w * 4.0;
  }
  // Parameter shards: the fetched chunks then the kept ones, as the plugin orders them (frozen
  // chunks first; for full fine-tuning every chunk is fetched and trainable).
  std::vector<std::uint64_t> value_sizes;
  std::vector<bool> may_go_to_disk;
  for (double x : chunks.fetched) {
    value_sizes.push_back(to_bytes(x / w * param_bytes));
    may_go_to_disk.push_back(true);
  }
  for (double x : chunks.kept) {
    value_sizes.push_back(to_bytes(x / w * param_bytes));
    may_go_to_disk.push_back(false);
  }
  const std::vector<bool> values_on_disk = memory::choose_offloaded_chunks(
      value_sizes, std::clamp(s.offload_param_frac, 0.0, 1.0), may_go_to_disk);
  double disk_values = 0;         // bytes of the parameter shards on disk
  std::uint64_t value_files = 0;  // their files
  std::uint64_t largest_value_buffer = 0;
  std::vector<std::uint64_t> value_buffers;  // each on-disk shard's buffer while resident
  for (std::size_t k = 0; k < values_on_disk.size(); ++k) {
    if (!values_on_disk[k]) continue;
    value_buffers.push_back(buffer_of(value_sizes[k]));
    disk_values += d(static_cast<std::int64_t>(value_sizes[k]));
    value_files += memory::io_size(value_sizes[k]);
    largest_value_buffer = std::max(largest_value_buffer, buffer_of(value_sizes[k]));
  }
  // During the update: optimizer shards on disk stream through in slices (update_in_slices: at
  // most kUpdateSlicesInFlight, each with its arrays and gradients) beside the parameter shards
  // on disk of the chunk being updated and the next; the other trainable chunks with a
  // parameter shard on disk stream whole, up to three resident at once.
  std::vector<std::uint64_t> update_buffers;  // parameter shards streamed whole
  std::vector<std::uint64_t> sliced_values;   // parameter shards beside sliced optimizer shards
  for (std::size_t t = 0; t < chunks.trainable.size(); ++t) {
    if (lora || t >= values_on_disk.size() || !values_on_disk[t]) continue;
    (on_disk[t] ? sliced_values : update_buffers).push_back(buffer_of(value_sizes[t]));
  }
  std::sort(update_buffers.rbegin(), update_buffers.rend());
  std::sort(sliced_values.rbegin(), sliced_values.rend());
  const double slice_elements = std::min(
      d(static_cast<std::int64_t>(memory::kUpdateSlicesInFlight) * memory::kUpdateSliceElements),
      disk_padded);
  double sliced = slice_elements * (4.0 * arrays + 4.0);
  for (std::size_t i = 0; i < std::min<std::size_t>(2, sliced_values.size()); ++i)
    sliced += d(static_cast<std::int64_t>(sliced_values[i]));
  std::sort(disk_buffers.rbegin(), disk_buffers.rend());
  const double host_shards = trainable_shards - disk_shards;
  double kept = 0;
  for (double x : chunks.kept) kept += x;
  // A group of one computes on its shards (a gathered chunk is its shard) and adds gradients up
  // in its gradient shards: no whole chunks beside them, no reductions.
  const bool one = world_size == 1;
  const double gathered = one ? 0.0 : chunks.gathered_peak;
  const double at_rest = chunks.all / w * param_bytes - disk_values +
                         (one ? 0.0 : kept * param_bytes) + (bf16 ? host_shards * 4.0 : 0.0);
  e.gathered_chunks = to_bytes(gathered * param_bytes);
  e.weights = to_bytes(at_rest + gathered * param_bytes);
  e.optimizer = to_bytes(host_shards * 8.0);
  e.gradient_buckets = one ? 0
                           : to_bytes(largest * 4.0 + static_cast<double>(kReducesInFlight) *
                                                          (largest + largest / w) * 4.0);
  // The gradient shards in memory at the peak: those not bound for disk and the ones on their
  // way there: the one being filled and kGradientWritesInFlight written behind it, chunks next to
  // each other (backward finishes them in reverse chunk order, and they are written in it). A
  // shard written in bf16 is only its bf16 copy while it is written.
  const bool narrow_files = gradient_file_element < 4.0;
  double on_their_way = 0;
  const std::size_t window = memory::kGradientWritesInFlight + 1;
  for (std::size_t t = 0; t < disk_gradients.size(); ++t) {
    double written = 0, filled = 0;  // the copies written, and the most the one filled adds
    for (std::size_t j = t; j < std::min(t + window, disk_gradients.size()); ++j) {
      const double copy = narrow_files && disk_gradients[j] > 0
                              ? static_cast<double>(gradient_bytes_of(j))
                              : disk_gradients[j];
      written += copy;
      filled = std::max(filled, disk_gradients[j] - copy);
    }
    on_their_way = std::max(on_their_way, written + filled);
  }
  const double resident_gradients = (trainable_shards - disk_shards) * 4.0 + on_their_way;
  e.gradients = to_bytes(resident_gradients + static_cast<double>(e.gradient_buckets) +
                         chunks.largest_trainable_tensor * (param_bytes + (bf16 ? 4.0 : 0.0)));
  // When backward starts, the activations at their peak, only the first chunk's gradients are
  // being made (its whole float32 chunk on several ranks, its shard in one process) beside
  // autograd's tensor; the reductions in flight and the other shards come as backward frees the
  // activations (the shards exist from the micro-batch before with accumulation). Under
  // activation checkpointing a layer is recomputed beside them all along: the sum stays.
  if (!s.activation_checkpointing) {
    const double first_chunk = largest * 4.0;
    double made_in_backward = static_cast<double>(e.gradient_buckets) - (one ? 0.0 : first_chunk);
    if (s.gradient_accumulation <= 1)
      made_in_backward += resident_gradients - (one ? first_chunk : 0.0);
    e.backward_gradients = to_bytes(std::max(0.0, made_in_backward));
  }
  // The largest of the update's streamed shards (whole, then sliced) and the parameter shards of
  // the gathered chunks (none is gathered during the update).
  std::uint64_t streamed = 0;
  for (std::size_t i = 0; i < std::min<std::size_t>(3, update_buffers.size()); ++i)
    streamed += update_buffers[i];
  streamed = std::max(streamed, to_bytes(sliced));
  // At most kGatheredChunks of them, and no more than the replay's gathered peak (rounded to
  // whole I/O blocks).
  std::sort(value_buffers.rbegin(), value_buffers.rend());
  const std::uint64_t gathered_values = std::min(
      std::accumulate(value_buffers.begin(),
                      value_buffers.begin() + static_cast<std::ptrdiff_t>(
                                                  std::min(kGatheredChunks, value_buffers.size())),
                      std::uint64_t{0}),
      to_bytes(chunks.gathered_peak / w * param_bytes) + kGatheredChunks * memory::kIoAlignment);
  e.offload_buffers = std::max(streamed, gathered_values);
  // A rank whose update runs behind the next forward (full fine-tuning, optimizer shards on
  // disk, no parameter shard there, no device tier) reads the optimizer shard of the first such
  // chunk during backward and holds it until that chunk is updated (start_read_ahead); that
  // chunk's gradient shard stays in memory once written, so the update does not read it back.
  if (!lora && !s.device_tier && disk_values == 0) {
    for (std::size_t t = 0; t < on_disk.size(); ++t) {
      if (!on_disk[t]) continue;
      e.optimizer_read_ahead = buffer_of(optim_files[t]);
      e.offload_buffers += e.optimizer_read_ahead;
      e.gradient_read_ahead = memory::io_size(gradient_bytes_of(t));
      break;
    }
  }
  e.disk_parameters = value_files;
  e.disk_trainable_parameters = lora ? 0 : value_files;
  std::vector<std::uint64_t> shard_files(chunks.fetched.size(), 0);
  for (std::size_t k = 0; k < shard_files.size() && k < values_on_disk.size(); ++k)
    if (values_on_disk[k]) shard_files[k] = memory::io_size(value_sizes[k]);
  e.disk_gather_reads = replayed_disk_reads(chunks, shard_files, one);
  const std::uint64_t disk_masters = bf16 ? to_bytes(disk_shards * 4.0) : 0;
  e.disk_weights = disk_masters + value_files;
  e.disk_optimizer = disk_files - disk_masters;
  e.disk_gradients = gradient_files;
  // Loading: each chunk staged whole in float32 (read, then broadcast from rank 0) and cast,
  // beside the shards and optimizer state built so far (an on-disk shard through its buffer,
  // written before the next).
  double widest = 0;
  for (double x : chunks.fetched) widest = std::max(widest, x);
  for (double x : chunks.kept) widest = std::max(widest, x);
  e.load_peak = to_bytes(at_rest + static_cast<double>(e.optimizer) + widest * (4.0 + param_bytes) +
                         (disk_buffers.empty() ? 0.0 : static_cast<double>(disk_buffers.front())) +
                         static_cast<double>(largest_value_buffer) +
                         static_cast<double>(kRuntimeBaselineBytes));
  if (one) {
    // One process exports from its chunks as they are (the in-memory export), or, with
    // parameter shards on disk in full fine-tuning, streamed (exporter::export_streamed): the
    // shards in memory, those gathered from disk, and one tensor at a time in float32 (twice:
    // written, then compared with what was read back). LoRA gathers everything for the merge.
    if (value_files > 0 && !lora)
      e.export_peak = to_bytes(
          chunks.all * param_bytes - disk_values + static_cast<double>(gathered_values) +
          2.0 * chunks.largest_trainable_tensor * 4.0 + static_cast<double>(kRuntimeBaselineBytes));
    return;
  }
  // The export gathers every chunk whole on every rank (the shards stay) and rank 0 then
  // writes as one process does.
  e.export_peak =
      to_bytes(stored * param_bytes +
               (lora ? (bf16 ? trainable * 4.0 : 0.0) + cost::merge_working_set(c, s)
                     : (bf16 ? n * 4.0 : 0.0) + n * 4.0 * 2) +
               chunks.all / w * param_bytes + static_cast<double>(kRuntimeBaselineBytes));
}

}  // namespace

void gemini_memory(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                   std::uint64_t checkpoint_bytes, int world_size) {
  sharded_memory(e, c, s, std::max(1, world_size));
  // Beside the chunks, in host memory on every rank: a quantized base's codes and scales (QLoRA:
  // never chunked, each quantized from a float32 band of its rows at a time)
  // and preference tuning's frozen reference copy.
  const cost::QuantizedBase quantized = cost::quantized_base(c, s);
  e.weights += to_bytes(quantized.bytes + cost::reference_copy_bytes(c, s));
  e.load_peak +=
      to_bytes(quantized.bytes + quantized.load_band * 4.0 + cost::reference_copy_bytes(c, s));
  e.export_peak += to_bytes(quantized.bytes);
}

Communication gemini_communication(const hf::ModelConfig& c, const Settings& s, int world_size,
                                   std::uint64_t bucket_bytes) {
  Communication out;
  const double w = d(world_size);
  // gemini sharded (plugins/gemini/gemini_plugin.cpp): every trainable chunk's float32
  // gradients reduce-scattered in every micro-batch's backward, (W-1)/W of their padded bytes;
  // the all-gathers of the chunks as the blocks use them (the plugin's gathers replayed by
  // sharded_chunks: once per step when all fit in its four whole chunks, else again in each
  // backward and micro-batch for what was released) and of LoRA's adapter chunks after each
  // update, (W-1)/W of each chunk's bytes in the compute dtype; and the clipping norm, one
  // scalar all_reduce.
  const ShardedChunks chunks = sharded_chunks(c, s, world_size);
  const double element = half_precision(s.precision) ? 2.0 : 4.0;
  const double micro_batches = d(std::max<std::int64_t>(1, s.gradient_accumulation));
  double chunked = 0, kept = 0;
  for (double x : chunks.trainable) chunked += x;
  for (double x : chunks.kept) kept += x;
  out.gradient_bytes = to_bytes(micro_batches * (w - 1.0) / w * chunked * 4.0);
  out.all_gather_bytes = to_bytes((w - 1.0) / w * (chunks.gathered_elements + kept) * element);
  out.bytes = out.gradient_bytes + out.all_gather_bytes;
  out.calls = static_cast<std::int64_t>(micro_batches) *
                  static_cast<std::int64_t>(chunks.trainable.size()) +
              chunks.gathers + static_cast<std::int64_t>(chunks.kept.size()) + 1;
  return out;
}

std::string gemini_held(const hf::ModelConfig& c, const Settings& s, std::uint64_t checkpoint_bytes,
                        int world_size) {
  if (world_size <= 1) return {};
  return "each rank holds 1/" + std::to_string(world_size) +
         " of the parameters, gradients and optimizer state, gathering a chunk of parameters "
         "whole while a block computes with it (at most " +
         std::to_string(memory::kGatheredChunks) +
         " at once) and reduce-scattering the gradients chunk by chunk in every micro-batch" +
         (s.offload_optim_frac > 0.0
              ? ", with " + on_disk_phrase(s) + " of its shards on disk in a folder of its own (" +
                    gib(estimate_memory(c, s, checkpoint_bytes, world_size).disk()) + ")"
              : std::string());
}

job::StrategySpec gemini_written_as(const Settings& s) {
  job::StrategySpec out{"gemini", {{"offload_optim_frac", s.offload_optim_frac}}};
  if (s.offload_param_frac > 0.0) out.options["offload_param_frac"] = s.offload_param_frac;
  if (s.device_tier) {
    out.options["device"] = "cuda";
    out.options["host_optim_frac"] = s.host_optim_frac;
    out.options["host_param_frac"] = s.host_param_frac;
  } else {
    out.options["device"] = "cpu";
  }
  return out;
}

void check_gemini_chunk_size(const hf::ModelConfig& c, const job::JobSpec& spec) {
  if (spec.strategy.name != "gemini") return;
  const std::optional<std::uint64_t> chunk_bytes = size_option(spec.strategy.options, "chunk_size");
  if (!chunk_bytes) return;
  // The plugin packs in the compute dtype (fp32, or two bytes a value in bf16 and fp16).
  const std::uint64_t element = spec.precision == "fp32" ? 4 : 2;
  const auto capacity = static_cast<std::int64_t>(*chunk_bytes / element);
  const hf::ParameterShapes shapes = hf::family_of(c).parameter_shapes(c);
  // The largest tensor: the embedding (and an untied head of the same shape), or a layer's
  // largest linear weight.
  double largest = d(c.vocab_size) * d(c.hidden_size);
  std::string name = "the input embedding";
  // (QLoRA's quantized linear weights are held beside the chunks.)
  const bool quantized = spec.method.quantize != "none";
  for (const hf::LinearModule& m : shapes.layer_linears) {
    if (quantized || m.in_features * m.out_features <= largest) continue;
    largest = m.in_features * m.out_features;
    name = "a layer's " + m.name + " weight";
  }
  if (largest > d(capacity))
    throw_invalid("strategy.options.chunk_size: " + name + " has " +
                      std::to_string(static_cast<std::int64_t>(std::min(largest, 9.0e18))) +
                      " elements, more than a chunk of " + std::to_string(capacity) + " (" +
                      core::human_bytes(*chunk_bytes) + " in " + spec.precision + ")",
                  "use chunk_size \"auto\" or a size at least as large as the largest tensor");
}

}  // namespace tessera::plan
