// `gemini` sharded over the data-parallel group (gemini_plugin.h). Shapes: W ranks; a chunk of
// C elements (C a multiple of W) has shards of S = C / W, rank r holding [r·S, (r+1)·S).
// Written from the ZeRO paper's stage 3 and Colossal-AI's documented Gemini behaviour, on
// engine/dist's collectives.
#include "plugins/gemini/gemini_plugin.h"

#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/files.h"
#include "core/meminfo.h"
#include "core/units.h"
#include "dist/parallel_context.h"
#include "memory/chunk_cache_policy.h"
#include "memory/chunk_layout.h"
#include "memory/disk_store.h"
#include "memory/tensor_state.h"
#include "model/layers.h"
#include "model/quantized_linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/cpu_adam.h"
#include "plugins/gemini/chunk_hooks.h"
#include "plugins/gemini/cpu_update.h"
#include "plugins/gemini/disk_chunks.h"
#include "plugins/gemini/gemini_options.h"
#include "plugins/gemini/gemini_state.h"
#include "plugins/gemini/tensor_entries.h"
#include "plugins/gemini/update_pipeline.h"
#include "train/device_tier.h"
#include "train/mixed_precision.h"
#include "train/param_groups.h"
#include "train/plugin.h"
#include "train/plugin_registry.h"

namespace tessera::plugins {
namespace {

using memory::TensorState;
using train::MemoryByCategory;
using train::NamedTensor;
using train::StepStats;

using memory::kGatheredChunks;
using memory::kReducesInFlight;
using memory::kStagedUpdates;

std::int64_t round_up(std::int64_t n, std::int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

struct ShardEntry {
  std::string name;        // checkpoint name
  std::string model_name;  // named_parameters() key; empty for adapters outside the model
  torch::Tensor tensor;    // the parameter object; its data is a view of its chunk's `whole`
  bool trainable = false;
  bool decays = true;
  std::size_t chunk = 0;
  std::int64_t offset = 0;  // first element inside the chunk
  std::int64_t numel = 0;
  // This rank's part: the tensor's flat elements [own_start, own_start + own_count), at
  // `shard_offset` in the chunk's shard.
  std::int64_t own_start = 0;
  std::int64_t own_count = 0;
  std::int64_t shard_offset = 0;
  TensorState state = TensorState::Free;
  bool grad_this_backward = false;
  bool has_grad = false;  // a gradient arrived since the last update
  // Its part's norm, taken when the step's gradient shard is final (it may go to disk): a group
  // of one keeps single's float32 norm, several ranks the float64 square.
  torch::Tensor grad_norm;
  double grad_squares = 0.0;
};

// Page-aligned host memory that a parameter shard on disk is read into and written from: with a
// device tier the tier's (page-locked on a GPU, so its copies up and down overlap the compute),
// else mapped from the kernel.
struct ShardIoBuffer {
  memory::AlignedBuffer mapped;
  c10::DataPtr locked;
  void* data() const { return locked ? locked.get() : mapped.data(); }
};

struct ShardChunk {
  bool trainable = false;
  // Holds a tensor no block fetches (LoRA's adapters): gathered for good, again after updates.
  bool persistent = false;
  std::int64_t capacity = 0;  // C
  std::int64_t shard = 0;     // S
  std::vector<std::size_t> entries;
  torch::Tensor whole;  // C elements (compute dtype); its memory comes and goes
  bool gathered = false;
  std::optional<dist::PendingCollective> gathering;  // gathered ahead, not waited yet
  // With a device tier: this rank's shard copied up for the all-gather (until it is done), and
  // the copy's event (`values` is read by it until then).
  torch::Tensor upload;
  std::shared_ptr<train::DeviceEvent> uploaded;
  // A group of one's copy up into the chunk, which compute waits for at the chunk's first use,
  // not when it is gathered ahead (the block computing then would wait for it too).
  std::shared_ptr<train::DeviceEvent> compute_after;
  // Copies from the device into `values` (the update's new values) not yet known done: the host
  // waits for them before it writes or drops `values` (for_each_optim_chunk).
  std::shared_ptr<train::DeviceEvent> values_copied_down;
  torch::Tensor values;  // S elements, compute dtype: this rank's shard
  // A shard on the device updated by the CPU Adam: the copies up of its new values (from host
  // staging), which compute waits for before the chunk's next use (use_chunks, settle_update).
  // Set by the pipelined update's worker, read by the main thread once the chunk is done.
  std::shared_ptr<train::DeviceEvent> values_copied_up;
  // Static placement with a device tier: `values` is device memory (the share not in
  // host_param_frac nor on disk). A group of one then gathers the chunk as it, several ranks
  // all-gather from it with nothing copied up.
  bool values_on_device = false;
  // Static placement with offload_param_frac: `values` lives in a region of the disk tier and
  // is resident (a view of `values_buffer`) only while the chunk is gathered or streamed
  // through an update or a load.
  bool values_on_disk = false;
  std::size_t values_region = 0;
  ShardIoBuffer values_buffer;
  // Trainable chunks:
  std::size_t trainable_entries = 0;
  // float32 [masters] [exp_avg] [exp_avg_sq], S each (resident); masters where the shard's
  // values cannot serve (keeps_masters).
  torch::Tensor optim;
  // Static placement with a device tier: `optim` is device memory (the share not in
  // host_optim_frac nor on disk), updated there by the device Adam on a gradient shard that
  // stays in device memory too.
  bool optim_on_device = false;
  // Static placement with offload_optim_frac: `optim` lives in a region of the disk tier and is
  // resident (a view of `optim_buffer`) only while streamed through an update or a load.
  bool optim_on_disk = false;
  std::size_t optim_region = 0;
  memory::AlignedBuffer optim_buffer;
  // float32, S: this step's reduced gradients (until the update); in device memory with
  // optim_on_device, else host memory.
  torch::Tensor grad_shard;
  // float32, C: this backward's gradients (until reduce-scattered); in device memory with a
  // device tier.
  torch::Tensor grad_whole;
  std::size_t grads_in = 0;
  bool ready = false;     // every tensor's gradient of this backward is in
  bool launched = false;  // reduce-scattered in this backward
  // Chunks whose optimizer shard is on disk (no device tier): after each backward the step's
  // gradient shard so far goes to a region of the disk tier too, read back by the next
  // micro-batch's reduction and by the update with the optimizer shard; `grad_buffer` is its
  // memory while resident.
  bool grad_to_disk = false;
  std::size_t grad_region = 0;
  memory::AlignedBuffer grad_buffer;
  bool grad_on_disk = false;  // this step's gradient shard is in its region, not in memory
  bool grad_written = false;  // its region has been written (it takes room on disk)
};

class GeminiPlugin : public train::Plugin {
 public:
  ~GeminiPlugin() override {
    update_.wait_quietly();
    wait_in_flight(/*quietly=*/true);
    remove_gradient_hooks(entries_, trainable_order_);
    hooked_blocks_.remove();
  }
  std::string name() const override { return "gemini"; }
  bool reads_deferred_weights() const override { return true; }
  bool runs_distributed() const override { return true; }
  // One process writes its checkpoints as a replicated plugin does (model.safetensors, LoRA's
  // adapter_model.safetensors): its shards are whole tensors.
  StateLayout state_layout() const override {
    return world_ == 1 ? StateLayout::Replicated : StateLayout::Sharded;
  }

  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const train::PluginOptions& options) override {
    const train::ProcessContext& process = options.process;
    if (process.world_size == 1) {
      // One process: a group of one, whose collectives copy their input (and are never called
      // where a shard is its chunk).
      solo_ =
          std::make_unique<dist::ParallelContext>(dist::DistEnvironment{}, dist::ParallelOptions{});
      process_ = process;
      process_.data_group = &solo_->world();
    } else if (!process.parallel || process.data_group == nullptr) {
      throw Error(ErrorKind::Internal,
                  "strategy gemini: rank " + std::to_string(process.rank) + " of " +
                      std::to_string(process.world_size) +
                      " processes has no data-parallel group (ProcessContext::data_group)",
                  "start the job with `tessera-cli launch`, which joins the ranks");
    } else {
      process_ = process;
    }
    group_ = process_.data_group;
    rank_ = group_->rank();
    world_ = group_->size();
    adamw_ = options.adamw;
    log_ = options.log;
    read_options(options);
    // "auto" is the GPU when every rank of this machine has one (job::device_for).
    const std::string device =
        options.device == "auto" ? train::choose_plugin_device(options, name()) : options.device;
    if (device == "simulated" || device.rfind("cuda", 0) == 0) {
      // The gathered chunks and the gradient chunks being reduced live in device memory (the
      // collectives run there: NCCL on GPUs). The shards and their optimizer state live there
      // too but for the shares host_param_frac and host_optim_frac in host memory and those on
      // disk: a gather of a host shard uploads only this rank's shard, a reduction of a chunk
      // updated on the host copies down only its shard of the result (the hybrid Adam: device
      // shards updated by torch's fused AdamW, host ones by the CPU Adam). Placement auto starts
      // every parameter shard in host memory and moves some to the device after the first step.
      // Rank r's GPU is LOCAL_RANK's (as ddp and zero), made the current device.
      const std::string tier =
          device == "simulated" ? device : train::rank_cuda_device(options, name()).str();
      device_ = train::make_device_tier(tier, gemini_.device_budget, "strategy.options.device");
      // Placement auto: every parameter shard starts in host memory, and after the first step as
      // many move to the device as its measured peak leaves room for (move_shards_to_device).
      if (gemini_.auto_placement) gemini_.offload_param_frac = 0.0;
    } else {
      train::require_cpu_device(options, name());
      if (gemini_.host_param_frac > 0.0 || gemini_.host_optim_frac > 0.0 ||
          gemini_.device_budget > 0)
        throw_invalid(
            "strategy.options.host_param_frac / host_optim_frac / device_budget: these place and "
            "size shards on a device, and this job computes on the CPU",
            "remove them (offload_param_frac and offload_optim_frac place shards on disk)");
    }
    precision_.emplace(options.precision, tensor_device());
    dtype_ = precision_->compute_dtype();
    deferred_ = options.deferred_weights.get();
    torch::NoGradGuard no_grad;

    // Every tensor in use order (the model's registration order, adapters after), trainable
    // ones recorded by their checkpoint names.
    trainable_order_ = collect_tensor_entries(model, trainable, entries_);
    quantized_bytes_ = model::quantized_weight_bytes(model);

    build_chunks(model);
    move_buffers(model, tensor_device(), dtype_);
    // QLoRA's base computes where the chunks do: on a GPU its codes and scales go there (from
    // the caching allocator, beside the tier's budget, as activations do).
    model::move_quantized_weights(model, tensor_device());
    quantized_on_device_ = quantized_bytes_ > 0 && !tensor_device().is_cpu();
    deferred_ = nullptr;
    for (ShardEntry& e : entries_) {
      e.tensor.set_requires_grad(e.trainable);
      memory::transition(e.state, TensorState::Held, e.name);
    }
    install_gradient_hooks(
        entries_, trainable_order_,
        [this](std::size_t i, const torch::Tensor& t) { gradient_arrived(i, t); });
    // Placement auto measures the first step's peak from here.
    if (gemini_.auto_placement) {
      core::reset_process_peak_rss();
      if (device_) device_->reset_peak();
    }
  }

  torch::Device device() const override { return tensor_device(); }
  torch::Dtype compute_dtype() const override { return dtype_; }
  const train::ProcessContext& process() const override { return process_; }

  // Every micro-batch reduce-scatters: accumulating whole gradient chunks until the last one
  // would keep a whole model's gradients on every rank between micro-batches, which is what
  // sharding is for. The extra communication is (A − 1) reduce-scatters per step.
  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) override {
    last_micro_batch_ = last_micro_batch;
    // Gradients go into the shards the pipelined update reads: it is done first (its last
    // chunks, the first ones backward reaches, finish as the forward ends).
    settle_update();
    start_read_ahead();
    for (std::size_t i : trainable_order_)
      memory::transition(entries_[i].state, TensorState::Computing, entries_[i].name);
    for (ShardChunk& c : chunks_) {
      c.grads_in = 0;
      c.ready = c.launched = false;
    }
    for (ShardEntry& e : entries_) e.grad_this_backward = false;
    next_reduce_ = 0;
    try {
      (loss * precision_->backward_multiplier(multiplier)).backward();
      // Chunks some of whose tensors got no gradient go now, in the same order on every rank.
      for (ShardChunk& c : chunks_) c.ready = c.trainable;
      launch_ready_reductions();
      while (!reductions_.empty()) finish_reduction();
      add_copied_gradients();
      if (device_ && last_micro_batch_)  // the shards that came down: final now
        for (std::size_t c = 0; c < chunks_.size(); ++c)
          if (!chunks_[c].optim_on_device) gradient_done(c);
      while (!gradient_writes_.empty()) finish_gradient_write();
    } catch (...) {
      wait_in_flight(/*quietly=*/true);  // the error on its way is the one to report
      throw;
    }
    for (std::size_t i : trainable_order_)
      memory::transition(entries_[i].state, TensorState::HeldAfterBackward, entries_[i].name);
  }

  void gradient_arrived(std::size_t i, const torch::Tensor& tensor) {
    torch::NoGradGuard no_grad;
    const torch::Tensor g = tensor.grad();
    if (!g.defined()) return;
    ShardEntry& e = entries_[i];
    ShardChunk& c = chunks_[e.chunk];
    if (c.launched)
      throw Error(ErrorKind::Internal, "gemini: the gradient of \"" + e.name +
                                           "\" arrived after its chunk was reduce-scattered");
    const torch::Tensor master = precision_->master_gradient(g);
    if (adds_in_shard(c)) {
      // A group of one whose gradient shard is where autograd computes (host memory, or the
      // device for a chunk the device Adam updates): the gradients add up in the step's shard
      // itself (no reduction, no whole chunk per backward), taken the first time in the step and
      // added after. Only tensors with a gradient are read from it (the update and the norm), so
      // it is not zeroed. In bf16 the sum is rounded to bf16, as `single`'s .grad adds up, so
      // that one process trains to `single`'s values.
      if (c.grad_on_disk) {  // an earlier micro-batch's sum
        read_gradient_back(e.chunk);
      } else if (!c.grad_shard.defined()) {
        c.grad_shard = c.grad_to_disk ? resident_gradient(e.chunk)
                       : c.optim_on_device
                           ? device_tensor(c.capacity, torch::kFloat32,
                                           "gradient shard of chunk " + std::to_string(e.chunk))
                           : torch::empty({c.capacity}, torch::kFloat32);
      }
      torch::Tensor slot = c.grad_shard.narrow(0, e.offset, e.numel).view(g.sizes());
      if (!e.has_grad) {
        slot.copy_(master);
      } else {
        slot.add_(master);
        // (fp16's gradients are scaled there; these are not, so they stay float32.)
        if (g.scalar_type() == torch::kBFloat16) slot.copy_(slot.to(torch::kBFloat16));
      }
    } else {
      if (!c.grad_whole.defined()) c.grad_whole = zeroed_gradient_chunk(e.chunk);
      torch::Tensor slot = c.grad_whole.narrow(0, e.offset, e.numel).view(g.sizes());
      if (e.grad_this_backward)
        slot.add_(master);
      else
        slot.copy_(master);
    }
    tensor.mutable_grad() = torch::Tensor();
    if (e.grad_this_backward) return;
    e.grad_this_backward = e.has_grad = true;
    if (++c.grads_in == c.trainable_entries) {
      c.ready = true;
      launch_ready_reductions();
    }
  }

  StepStats step(double lr, double max_grad_norm) override {
    torch::NoGradGuard no_grad;
    settle_update();
    // The norms for clipping are taken in the last micro-batch's backward: a step after any other
    // would clip by a norm of nothing.
    const bool has_gradients = std::any_of(trainable_order_.begin(), trainable_order_.end(),
                                           [&](std::size_t i) { return entries_[i].has_grad; });
    if (has_gradients && !last_micro_batch_)
      throw Error(ErrorKind::Internal,
                  "gemini: step() after a backward not marked as the last micro-batch "
                  "(Plugin::backward's last_micro_batch): the gradient norms were never taken");
    // The gathered chunks hold the values before this update: they go.
    release_gathered();
    // The global norm. Several ranks sum their parts' squares in float64; a group of one takes
    // it as `single` does (each tensor's float32 norm, then the norm of those), so that one
    // process trains to `single`'s values.
    // Norms of gradient shards in device memory stay there until one read of them all.
    double local_squares = 0.0;
    std::vector<torch::Tensor> norms;
    std::vector<torch::Tensor> device_squares;
    // Norms taken in host memory (chunks the CPU Adam updates), copied up together: one copy,
    // not a stream synchronization per tensor.
    std::vector<std::size_t> host_norm_at;
    std::vector<torch::Tensor> host_norms;
    for (std::size_t i : trainable_order_) {
      ShardEntry& e = entries_[i];
      memory::transition(e.state, TensorState::ReadyForUpdate, e.name);
      if (!e.has_grad || e.own_count == 0) continue;
      if (world_ > 1) {
        if (e.grad_norm.defined())
          device_squares.push_back(e.grad_norm);
        else
          local_squares += e.grad_squares;
      } else if (e.grad_norm.defined()) {
        if (e.grad_norm.device() != tensor_device()) {
          host_norm_at.push_back(norms.size());
          host_norms.push_back(e.grad_norm);
        }
        norms.push_back(e.grad_norm);
      } else {
        throw Error(ErrorKind::Internal,
                    "gemini: step() without a backward marked as the last micro-batch");
      }
      e.grad_norm = torch::Tensor();
      e.grad_squares = 0.0;
    }
    if (!host_norms.empty()) {
      const torch::Tensor up = torch::stack(host_norms).to(tensor_device());
      for (std::size_t k = 0; k < host_norm_at.size(); ++k)
        norms[host_norm_at[k]] = up[static_cast<std::int64_t>(k)];
    }
    torch::Tensor total;
    if (world_ == 1) {
      total = norms.empty() ? torch::zeros({}, torch::kFloat32) : torch::stack(norms).norm(2.0);
    } else {
      if (!device_squares.empty())
        local_squares += torch::stack(device_squares).square().sum().item<double>();
      torch::Tensor squares = torch::tensor({local_squares}, torch::kFloat64);
      group_->all_reduce(squares, dist::ReduceOp::Sum);
      total = torch::sqrt(squares).to(torch::kFloat32).reshape({});
    }
    StepStats stats;
    stats.grad_norm = total.item<double>();
    const std::optional<torch::Tensor> coef = optim::clip_coefficient(total, max_grad_norm);
    stats.applied = precision_->accept_step(stats.grad_norm);
    if (stats.applied) {
      update(lr, coef);  // consumes the gradient shards as it goes
    } else {
      for (ShardChunk& c : chunks_) drop_gradient_shard(c, /*on_disk=*/false);
      drop_read_ahead();
    }
    for (std::size_t i : trainable_order_) {
      ShardEntry& e = entries_[i];
      e.has_grad = false;
      memory::transition(e.state, TensorState::Held, e.name);
    }
    if (stats.applied) gather_persistent(true);
    if (gathered_.tracing() && gemini_.auto_placement) {
      if (device_) {
        // Shards change tiers: the update behind is done first, and the moved ones are the
        // device Adam's from now on.
        settle_update();
        move_shards_to_device();
        choose_pipelined_chunks();
      } else {
        size_shard_cache_to_budget();
      }
    }
    gathered_.end_tracing();  // the first step's order of chunk uses is every later step's
    gathered_.next_step();
    return stats;
  }

  void settle() override { settle_update(); }

  // Host memory (with a device tier the gathered chunks are device_tier_memory()'s).
  MemoryByCategory memory() const override {
    std::lock_guard lock(update_.mutex());  // the pipelined update frees buffers as it goes
    MemoryByCategory m;
    const std::uint64_t element = c10::elementSize(dtype_);
    if (!quantized_on_device_) m.weights += quantized_bytes_;  // QLoRA's base, beside the chunks
    for (const ShardChunk& c : chunks_) {
      const auto shard = static_cast<std::uint64_t>(c.shard);
      const auto capacity = static_cast<std::uint64_t>(c.capacity);
      if (c.values.defined() && !c.values_on_device) m.weights += shard * element;
      if ((!device_ || gather_to_host_) && !aliases(c) && (c.gathered || c.gathering))
        m.weights += capacity * element;
      if (!c.trainable || c.optim_on_device) continue;
      if (keeps_masters(c) && c.optim.defined()) m.weights += shard * 4;  // masters
      if (c.optim.defined()) m.optimizer += shard * 8;
      if (c.grad_shard.defined()) m.gradients += shard * 4;
      if (!device_ && c.grad_whole.defined()) m.gradients += capacity * 4;
    }
    if (!device_) m.gradients += reductions_bytes();
    for (const GradientWrite& w : gradient_writes_) m.gradients += w.narrow.size();  // bf16 copies
    m.weights += host_staging_bytes();
    for (const CopiedGradient& g : copied_gradients_)
      m.gradients += static_cast<std::uint64_t>(g.host.numel()) * 4;
    return m;
  }

  // The host staging of the CPU Adam's new values for shards on the device: kStagedUpdates
  // buffers of the largest such shard, from the first update on (prepare_values_staging).
  std::uint64_t host_staging_bytes() const {
    return static_cast<std::uint64_t>(values_staging_.size()) * values_staging_bytes_;
  }

  std::uint64_t reductions_bytes() const {
    std::uint64_t bytes = 0;
    for (const Reduction& r : reductions_)
      bytes += static_cast<std::uint64_t>(r.input.numel() +
                                          (r.output.is_same(r.input) ? 0 : r.output.numel())) *
               4;
    return bytes;
  }

  std::optional<train::DeviceTierMemory> device_tier_memory() const override {
    if (!device_) return std::nullopt;
    // Gathered chunks and the shards copied up for their gathers; the gradient chunks of this
    // backward and those being reduce-scattered; the shards placed on the device, with their
    // optimizer state and gradient shards.
    MemoryByCategory held;
    const std::uint64_t element = c10::elementSize(dtype_);
    for (const ShardChunk& c : chunks_) {
      const auto shard = static_cast<std::uint64_t>(c.shard);
      if (!gather_to_host_ && !aliases(c) && (c.gathered || c.gathering))
        held.weights += static_cast<std::uint64_t>(c.capacity) * element;
      if (c.upload.defined() && !gather_to_host_)
        held.weights += static_cast<std::uint64_t>(c.upload.nbytes());
      if (c.grad_whole.defined()) held.gradients += static_cast<std::uint64_t>(c.capacity) * 4;
      if (c.values_on_device && c.values.defined()) held.weights += shard * element;
      if (!c.optim_on_device) continue;
      if (c.optim.defined()) {
        held.optimizer += shard * 8;
        if (keeps_masters(c)) held.weights += shard * 4;
      }
      if (c.grad_shard.defined()) held.gradients += shard * 4;
    }
    held.gradients += reductions_bytes();
    if (quantized_on_device_) held.weights += quantized_bytes_;  // QLoRA's base on the GPU
    return train::device_tier_memory_of(*device_, held);
  }

  std::optional<train::DiskTierMemory> disk_memory() const override {
    if (!disk_) return std::nullopt;
    train::DiskTierMemory d;
    d.folder = disk_->folder().string();
    d.used = disk_->bytes_on_disk();
    // Optimizer shards: their float32 masters (bf16) count as weights, the rest of each file
    // (the moments and the padding to the I/O alignment) as optimizer state. Parameter shards
    // count as weights, gradient shards (once first written) as gradients.
    std::lock_guard lock(update_.mutex());
    for (const ShardChunk& c : chunks_) {
      if (c.values_on_disk) d.by_category.weights += disk_->region_bytes(c.values_region);
      if (c.grad_written) d.by_category.gradients += disk_->region_bytes(c.grad_region);
      if (!c.optim_on_disk) continue;
      const std::uint64_t masters = keeps_masters(c) ? static_cast<std::uint64_t>(c.shard) * 4 : 0;
      d.by_category.weights += masters;
      d.by_category.optimizer += disk_->region_bytes(c.optim_region) - masters;
    }
    d.bytes_read = disk_->bytes_read();
    d.bytes_written = disk_->bytes_written();
    return d;
  }

  void release_training_state() override {
    settle_update();
    wait_in_flight();
    remove_gradient_hooks(entries_, trainable_order_);
    const bool values_on_disk = std::any_of(chunks_.begin(), chunks_.end(),
                                            [](const ShardChunk& c) { return c.values_on_disk; });
    for (ShardChunk& c : chunks_) {
      c.optim = c.grad_shard = c.grad_whole = torch::Tensor();
      c.optim_buffer = memory::AlignedBuffer();
      if (!values_on_disk) c.optim_on_disk = false;
    }
    if (!values_on_disk) disk_.reset();  // only optimizer shards were there
    if (weights_in_memory()) hooked_blocks_.remove();
    // Training's page-locked buffers (the staging, the gradient shards the GPU's pool kept for
    // reuse) go back to the system before the export.
    if (device_) drop_values_staging();
  }

  bool weights_in_memory() const override {
    return std::all_of(chunks_.begin(), chunks_.end(),
                       [](const ShardChunk& c) { return c.gathered && !c.gathering; });
  }

  // A collective unless gather_weights() ran: every rank calls it.
  void visit_weights(model::PretrainedModel& model, const WeightVisit& visit) override {
    (void)model;
    torch::NoGradGuard no_grad;
    settle_update();
    for (const ShardEntry& e : entries_) {
      if (e.model_name.empty()) continue;
      gathered_.pin({e.chunk});
      gather(e.chunk);  // not use_chunks(): this is no step's order of uses
      visit(e.model_name, e.tensor);
    }
    gathered_.unpin();
  }

  // Every chunk gathered for good (a collective: every rank calls it), so that rank 0 alone can
  // export or merge afterwards. The model's weights are then whole on every rank.
  void gather_weights() override {
    torch::NoGradGuard no_grad;
    settle_update();
    if (device_ && gather_to_host_)
      return;       // done: a second call (rank 0's export) is no collective
    if (device_) {  // whole for the export: in host memory, not in the device's budget
      for (std::size_t c = 0; c < chunks_.size(); ++c)
        if (chunks_[c].gathered) release(c);
      gathered_.unpin();
      gather_to_host_ = true;
      for (ShardChunk& chunk :
           chunks_) {  // a GPU's tensors become host tensors (all-gathered by Gloo)
        if (chunk.whole.device().is_cpu()) continue;
        chunk.whole = torch::empty({chunk.capacity}, dtype_);
        for (std::size_t i : chunk.entries) {
          ShardEntry& e = entries_[i];
          e.tensor.set_data(chunk.whole.narrow(0, e.offset, e.numel).view(e.tensor.sizes()));
        }
      }
    }
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      gather(c);
      chunks_[c].persistent = true;
    }
  }

  std::vector<NamedTensor> trainable_weights() override {
    settle_update();
    std::vector<NamedTensor> out;
    for (std::size_t i : trainable_order_) {
      const ShardEntry& e = entries_[i];
      if (e.own_count > 0) out.push_back({e.name, as_saved(e, master_of(e))});
    }
    return out;
  }
  // A group of one's part of a tensor is the tensor: saved in its shape.
  torch::Tensor as_saved(const ShardEntry& e, const torch::Tensor& part) const {
    return world_ == 1 ? part.view(e.tensor.sizes()) : part;
  }

  std::vector<NamedTensor> optimizer_state() override {
    settle_update();
    std::vector<NamedTensor> out;
    if (steps_ == 0) return out;  // as AdamW: no state before the first update
    for (std::size_t i : trainable_order_) {
      const ShardEntry& e = entries_[i];
      if (e.own_count == 0) continue;
      out.push_back({"exp_avg." + e.name, as_saved(e, moment_of(e, 0))});
      out.push_back({"exp_avg_sq." + e.name, as_saved(e, moment_of(e, 1))});
    }
    return out;
  }

  std::map<std::string, train::StateSlice> state_slices() const override {
    std::map<std::string, train::StateSlice> slices;
    for (std::size_t i : trainable_order_) {
      const ShardEntry& e = entries_[i];
      const auto sizes = e.tensor.sizes();
      const train::StateSlice slice{std::vector<std::int64_t>(sizes.begin(), sizes.end()),
                                    e.own_start, e.own_count};
      slices[e.name] = slice;
      slices["exp_avg." + e.name] = slice;
      slices["exp_avg_sq." + e.name] = slice;
    }
    return slices;
  }

  nlohmann::json state_json() const override { return gemini_state_json(*precision_, steps_); }

  // `weights` / `optimizer` hold this rank's ranges (a layout-free checkpoint) or whole tensors
  // (an older one-file checkpoint of a replicated plugin). Every rank calls it (it gathers).
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    torch::NoGradGuard no_grad;
    settle_update();
    std::map<std::string, std::size_t> index_of;
    for (std::size_t i : trainable_order_) index_of[entries_[i].name] = i;
    const auto own_part = [&](const std::string& name, const ShardEntry& e,
                              const torch::Tensor& value) {
      if (value.numel() == e.own_count) return value.reshape(-1);
      if (value.numel() == e.numel) return value.reshape(-1).narrow(0, e.own_start, e.own_count);
      throw_invalid(source + ": \"" + name + "\" has " + std::to_string(value.numel()) +
                        " elements; this rank holds " + std::to_string(e.own_count) + " of the " +
                        std::to_string(e.numel) + " of " + e.name,
                    kResumeSameTraining);
    };
    for (const auto& [name, value] : weights)
      if (!index_of.count(name))
        throw_invalid(
            source + ": the checkpoint has weight \"" + name + "\", which this run does not train",
            kResumeSameTraining);
    // This rank's parts by entry, every name checked before anything changes.
    std::vector<torch::Tensor> own_weight(entries_.size());
    std::vector<std::array<torch::Tensor, 2>> own_moments(entries_.size());
    for (std::size_t i : trainable_order_) {
      const ShardEntry& e = entries_[i];
      if (e.own_count == 0) continue;
      const auto it = weights.find(e.name);
      if (it == weights.end())
        throw_invalid(source + ": the checkpoint has no weight \"" + e.name + "\"",
                      kResumeSameTraining);
      own_weight[i] = own_part(it->first, e, it->second);
    }
    for (const auto& [name, value] : optimizer) {
      const bool squared = name.rfind("exp_avg_sq.", 0) == 0;
      const auto it = index_of.find(name.substr(name.find('.') + 1));
      if (it == index_of.end() || (!squared && name.rfind("exp_avg.", 0) != 0))
        throw_invalid(source + ": unexpected optimizer tensor \"" + name + "\"",
                      kResumeSameTraining);
      const ShardEntry& e = entries_[it->second];
      if (e.own_count == 0) continue;
      own_moments[it->second][squared ? 1 : 0] = own_part(name, e, value);
    }
    // Chunk by chunk: the optimizer shards on disk are read, filled and written back in turn.
    for_each_optim_chunk(every_chunk, [&](std::size_t c) {
      for (std::size_t i : chunks_[c].entries) {
        const ShardEntry& e = entries_[i];
        if (e.own_count == 0) continue;
        master_of(e).copy_(own_weight[i]);
        own_values(e).copy_(master_of(e));
        for (int which : {0, 1}) {
          if (own_moments[i][which].defined())
            moment_of(e, which).copy_(own_moments[i][which]);
          else
            moment_of(e, which).zero_();  // never updated: torch keeps no state for it
        }
      }
    });
    steps_ = restore_gemini_state(*precision_, state, source);
    release_gathered();
    gather_persistent(false);
  }

  GeminiShardHeld held() const {
    std::lock_guard lock(update_.mutex());
    GeminiShardHeld h;
    h.world_size = world_;
    h.chunks = static_cast<std::int64_t>(chunks_.size());
    const auto gradient_file_element = static_cast<std::uint64_t>(narrow_gradient_files() ? 2 : 4);
    for (std::size_t index = 0; index < chunks_.size(); ++index) {
      const ShardChunk& c = chunks_[index];
      const bool read_ahead = read_ahead_ == index;
      h.chunk_elements += c.whole.numel();
      h.shard_elements += c.shard;
      if (c.values.defined()) h.parameter_shard_bytes += c.values.nbytes();
      if (c.values_on_disk) {
        h.offloaded_parameter_bytes += values_bytes(c);
        ++h.offloaded_parameter_chunks;
        if (c.values.defined()) h.cached_parameter_bytes += values_bytes(c);
      }
      if (c.whole.storage().data() != nullptr && !aliases(c)) {
        h.gathered_bytes += c.whole.nbytes();
        if (!c.persistent) ++h.gathered_chunks;
      }
      // (Unpadded, as memory() counts them: a shard bound for disk pads each of its arrays.)
      const auto arrays = static_cast<std::uint64_t>(arrays_of(c));
      const auto shard_bytes = static_cast<std::uint64_t>(c.shard) * 4;
      if (c.optim.defined()) {
        h.moment_bytes += shard_bytes * 2;
        h.master_bytes += shard_bytes * (arrays - 2);
        if (read_ahead) {
          h.read_ahead_moment_bytes = shard_bytes * 2;
          h.read_ahead_master_bytes = shard_bytes * (arrays - 2);
        }
      }
      if (c.optim_on_disk && (!c.optim.defined() || read_ahead)) {
        h.offloaded_moment_bytes += shard_bytes * 2;
        h.offloaded_master_bytes += shard_bytes * (arrays - 2);
        ++h.offloaded_chunks;
      }
      if (c.grad_shard.defined()) h.gradient_bytes += c.grad_shard.nbytes();
      if (c.grad_on_disk || (read_ahead && c.grad_written))
        h.offloaded_gradient_bytes += static_cast<std::uint64_t>(c.shard) * gradient_file_element;
      if (read_ahead && c.grad_shard.defined()) h.read_ahead_gradient_bytes = c.grad_shard.nbytes();
      if (c.grad_whole.defined()) h.gradient_bytes += c.grad_whole.nbytes();
      if (read_ahead) {
        h.read_ahead_optimizer_file_bytes = disk_->region_bytes(c.optim_region);
        h.read_ahead_gradient_file_bytes = disk_->region_bytes(c.grad_region);
      }
    }
    for (const ShardEntry& e : entries_) {
      if (!e.trainable) continue;
      h.trainable_elements += e.numel;
      h.trainable_shard_elements += e.own_count;
    }
    h.all_gathers = all_gathers_;
    h.reduce_scatters = reduce_scatters_;
    h.prefetched = prefetched_;
    h.pipelined_chunks = std::count(pipelined_.begin(), pipelined_.end(), true);
    h.updates_behind = updates_behind_;
    h.read_aheads = read_aheads_;
    h.cached_parameter_limit = static_cast<std::int64_t>(cached_shards_);
    return h;
  }

 private:
  struct CopiedGradient {
    std::size_t chunk = 0;
    torch::Tensor host;  // a later micro-batch's shard, copied down, to add to grad_shard
  };

  struct Reduction {
    std::size_t chunk = 0;
    torch::Tensor input;   // the chunk's whole gradients, alive until the collective is done
    torch::Tensor output;  // this rank's shard of their mean
    memory::AlignedBuffer output_buffer;  // under `output` where it may go to disk
    dist::PendingCollective work;
  };

  void read_options(const train::PluginOptions& options) {
    gemini_ = parse_gemini_options(options, "shards");
    if (gemini_.auto_placement) {
      // Every parameter shard has its place on disk; after the first step the shards kept in
      // memory grow to what this rank's share of host_budget (the machine's memory by default,
      // shared by the ranks on it) leaves beside the rest of the process.
      const int ranks_here =
          options.process.parallel ? std::max(1, options.process.parallel->local_world_size()) : 1;
      rank_budget_ = gemini_.host_budget / static_cast<std::uint64_t>(ranks_here);
    }
    // Each rank's DiskStore makes a folder of its own (tessera-offload-<pid>) inside
    // gemini_.offload_dir.
  }

  // --- memory --------------------------------------------------------------------------------

  // A group of one whose shard is where it computes (host memory without a device tier or
  // exporting from it; the device for a shard placed there): a chunk and its shard are the same
  // elements, so a gathered chunk is the shard's memory.
  bool aliases(const ShardChunk& chunk) const {
    if (world_ != 1) return false;
    return chunk.values_on_device ? device_ && !gather_to_host_ : !device_ || gather_to_host_;
  }
  // A group of one whose step's gradient shard is where autograd computes (host memory without
  // a device tier; the device for a chunk the device Adam updates): gradients add up in it, with
  // no reduction.
  bool adds_in_shard(const ShardChunk& chunk) const {
    return world_ == 1 && (!device_ || chunk.optim_on_device);
  }

  torch::Device tensor_device() const {
    return device_ ? torch::Device(device_->tensor_device()) : torch::Device(torch::kCPU);
  }

  static std::size_t bytes_of(std::int64_t numel, torch::Dtype dtype) {
    return static_cast<std::size_t>(numel) * c10::elementSize(dtype);
  }

  // `numel` elements of the device tier's memory, counted in its budget (`what` names them in
  // an out-of-memory), written first by compute or, for `FirstWriter::copies`, by a copy up.
  torch::Tensor device_tensor(std::int64_t numel, torch::Dtype dtype, const std::string& what,
                              train::FirstWriter first_writer = train::FirstWriter::compute) {
    return train::tensor_over(device_->allocate(bytes_of(numel, dtype), what, first_writer), numel,
                              dtype);
  }
  // Chunk `c`'s whole float32 gradients, zero: in device memory with a device tier.
  torch::Tensor zeroed_gradient_chunk(std::size_t c) {
    const std::int64_t capacity = chunks_[c].capacity;
    if (!device_) return torch::zeros({capacity}, torch::kFloat32);
    return device_tensor(capacity, torch::kFloat32, "gradient chunk " + std::to_string(c)).zero_();
  }

  // Float32 host memory the device copies into (page-locked on a GPU).
  torch::Tensor host_tensor(std::int64_t numel) {
    return train::tensor_over(device_->allocate_host(bytes_of(numel, torch::kFloat32)), numel,
                              torch::kFloat32);
  }

  // `numel` elements of host memory that stays (device_tier.h allocate_host_resident).
  torch::Tensor host_resident_tensor(std::int64_t numel, torch::Dtype dtype) {
    return train::tensor_over(device_->allocate_host_resident(bytes_of(numel, dtype)), numel,
                              dtype);
  }

  // --- chunks ---------------------------------------------------------------------------------

  // Trainable and frozen tensors go in separate chunks (each in use order), so that a frozen
  // chunk has no gradient or optimizer state at all.
  void build_chunks(model::PretrainedModel& model) {
    const std::vector<BlockEntries> blocks = blocks_of_entries(model, entries_);
    const std::vector<bool> fetched = fetched_entries(blocks, entries_.size());

    const std::int64_t element_bytes = static_cast<std::int64_t>(c10::elementSize(dtype_));
    for (const bool trainable : {false, true}) {
      std::vector<std::size_t> which;
      std::vector<std::int64_t> numels;
      std::vector<std::string> names;
      for (std::size_t i = 0; i < entries_.size(); ++i) {
        if (entries_[i].trainable != trainable) continue;
        which.push_back(i);
        numels.push_back(entries_[i].tensor.numel());
        names.push_back(entries_[i].name);
      }
      if (which.empty()) continue;
      const memory::ChunkLayout layout =
          memory::pack_gemini_chunks(numels, names, element_bytes, gemini_.chunk_bytes);
      for (const memory::ChunkSpec& spec : layout.chunks) {
        ShardChunk chunk;
        chunk.trainable = trainable;
        chunk.capacity = round_up(spec.used, world_);
        chunk.shard = chunk.capacity / world_;
        for (const memory::ChunkSlot& slot : spec.slots) {
          const std::size_t i = which[slot.tensor];
          ShardEntry& e = entries_[i];
          e.chunk = chunks_.size();
          e.offset = slot.offset;
          e.numel = slot.numel;
          const std::int64_t begin = rank_ * chunk.shard;
          const std::int64_t lo = std::max(e.offset, begin);
          const std::int64_t hi = std::min(e.offset + e.numel, begin + chunk.shard);
          e.own_count = std::max<std::int64_t>(hi - lo, 0);
          e.own_start = e.own_count > 0 ? lo - e.offset : 0;
          e.shard_offset = e.own_count > 0 ? lo - begin : 0;
          chunk.entries.push_back(i);
          if (!fetched[i]) chunk.persistent = true;
          if (trainable) ++chunk.trainable_entries;
        }
        chunks_.push_back(std::move(chunk));
      }
    }
    gathered_.resize(chunks_.size());
    // The gradients go back in chunk order from the last: backward meets the chunks about so.
    for (std::size_t c = chunks_.size(); c-- > 0;)
      if (chunks_[c].trainable) reduce_order_.push_back(c);

    // Static placement of the optimizer shards: memory::place_chunks' rule over the trainable
    // chunks' shard sizes, which are equal on every rank, so every rank offloads the same chunks;
    // with a device tier, the share kept in host memory is chosen so from the rest, and the
    // others live on the device.
    std::vector<std::size_t> trainable_chunks;
    std::vector<std::uint64_t> optim_sizes;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      if (!chunks_[c].trainable) continue;
      trainable_chunks.push_back(c);
      optim_sizes.push_back(static_cast<std::uint64_t>(chunks_[c].shard) * 4);
    }
    const std::vector<memory::ChunkTier> optim_tiers = memory::place_chunks(
        optim_sizes, gemini_.offload_optim_frac, gemini_.host_optim_frac, device_ != nullptr);
    for (std::size_t t = 0; t < trainable_chunks.size(); ++t) {
      chunks_[trainable_chunks[t]].optim_on_disk = optim_tiers[t] == memory::ChunkTier::Disk;
      chunks_[trainable_chunks[t]].optim_on_device = optim_tiers[t] == memory::ChunkTier::Device;
    }
    // And of the parameter shards, over every chunk but those kept whole (LoRA's adapters):
    // the same on every rank too.
    std::vector<std::uint64_t> value_sizes;
    std::vector<bool> may_go_to_disk;
    for (const ShardChunk& chunk : chunks_) {
      value_sizes.push_back(values_bytes(chunk));
      may_go_to_disk.push_back(!chunk.persistent);
    }
    // With a device tier, the share kept in host memory likewise from the rest (placement auto:
    // all of them, moved after the first step), and the others on the device.
    const std::vector<memory::ChunkTier> value_tiers = memory::place_chunks(
        value_sizes, gemini_.offload_param_frac,
        gemini_.auto_placement ? 1.0 : gemini_.host_param_frac, device_ != nullptr, may_go_to_disk);
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      chunks_[c].values_on_disk = value_tiers[c] == memory::ChunkTier::Disk;
      chunks_[c].values_on_device = value_tiers[c] == memory::ChunkTier::Device;
    }

    // Fill each chunk whole in float32 (from the checkpoint or the tensors), take rank 0's
    // values (adapters are drawn per process), keep this rank's shard; only persistent chunks
    // stay whole.
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      ShardChunk& chunk = chunks_[c];
      torch::Tensor staged = torch::zeros({chunk.capacity}, torch::kFloat32);
      for (std::size_t i : chunk.entries) {
        const ShardEntry& e = entries_[i];
        fill_entry(deferred_, e, staged.narrow(0, e.offset, e.numel).view(e.tensor.sizes()));
      }
      group_->broadcast(staged, 0);
      const torch::Tensor own = staged.narrow(0, rank_ * chunk.shard, chunk.shard);
      if (chunk.values_on_disk) {
        // Written at once; resident until the chunk is released below, as when gathered.
        chunk.values_region =
            disk().add_region("parameter shard of chunk " + std::to_string(c), values_bytes(chunk));
        make_values_resident(chunk);
        chunk.values.copy_(own);
        disk_->write(chunk.values_region, chunk.values_buffer.data()).get();
      } else if (chunk.values_on_device) {
        chunk.values =
            device_tensor(chunk.shard, dtype_, "parameter shard of chunk " + std::to_string(c));
        chunk.values.copy_(own);
      } else if (device_) {
        // Copied up for each gather: page-locked on a GPU, so the copies run beside the compute.
        chunk.values = host_resident_tensor(chunk.shard, dtype_);
        chunk.values.copy_(own);
      } else {
        chunk.values = own.to(dtype_, /*non_blocking=*/false, /*copy=*/true);
      }
      if (chunk.trainable) {
        chunk.grad_to_disk = chunk.optim_on_disk && !device_;
        if (chunk.grad_to_disk)
          chunk.grad_region = disk().add_region("gradient shard of chunk " + std::to_string(c),
                                                gradient_file_bytes(chunk));
        if (chunk.optim_on_disk) {
          chunk.optim_region = disk().add_region("optimizer shard of chunk " + std::to_string(c),
                                                 optim_bytes(chunk));
          make_optim_resident(chunk);  // zeros
        } else if (chunk.optim_on_device) {
          chunk.optim = device_tensor(arrays_of(chunk) * chunk.shard, torch::kFloat32,
                                      "optimizer shard of chunk " + std::to_string(c))
                            .zero_();
        } else {
          chunk.optim = torch::zeros({arrays_of(chunk) * chunk.shard}, torch::kFloat32);
        }
        if (keeps_masters(chunk)) chunk.optim.narrow(0, 0, chunk.shard).copy_(own);
        if (chunk.optim_on_disk) {  // written at once: only one such shard in memory at a time
          disk_->write(chunk.optim_region, chunk.optim_buffer.data()).get();
          drop_resident_optim(chunk);
        }
      }
      chunk.whole = staged.to(tensor_device(), dtype_);
      chunk.gathered = true;
      for (std::size_t i : chunk.entries) {
        ShardEntry& e = entries_[i];
        e.tensor.set_data(chunk.whole.narrow(0, e.offset, e.numel).view(e.tensor.sizes()));
      }
      if (!chunk.persistent) {
        release(c);
      } else if (device_ || aliases(chunk)) {
        // Kept whole in device memory (gathered there, every rank alike), or the shard itself.
        release(c);
        gather(c);
      }
    }

    // Blocks gather their chunks (those not kept gathered) when they compute.
    chunk_use_ = std::make_shared<ChunkUseHook>(
        chunks_by_block(
            blocks, [&](std::size_t i) { return std::optional(entries_[i].chunk); },
            [&](std::size_t c) { return !chunks_[c].persistent; }),
        [this](const std::vector<std::size_t>& chunks) { use_chunks(chunks); },
        [this] { gathered_.unpin(); });
    hooked_blocks_.set(blocks, chunk_use_->chunks(), chunk_use_);
    choose_pipelined_chunks();
  }

  static c10::StorageImpl& storage_of(const ShardChunk& chunk) {
    return *chunk.whole.storage().unsafeGetStorageImpl();
  }

  // The whole chunk's memory goes; the views autograd saved see it again when it is gathered.
  // The device memory goes in stream order (its release waits for the copy that filled it); the
  // host shard it was copied from is waited for only where it may go below (a disk-homed one):
  // one that stays is settled before anything writes it (the update, the next gather), so the
  // host need not wait here for a GPU that runs behind it.
  void release(std::size_t c) {
    ShardChunk& chunk = chunks_[c];
    finish_gather(chunk);
    chunk.compute_after.reset();  // unused: its memory goes after the copy, in stream order
    if (chunk.values_on_disk) settle_upload(chunk);
    storage_of(chunk).set_data_ptr_noswap(c10::DataPtr(nullptr, chunk.whole.device()));
    chunk.gathered = false;
    // Unchanged since it was read (only updates and loads change shards, and they write back):
    // dropped unless the shards kept in memory are still under their limit.
    if (chunk.values_on_disk) keep_or_drop_values(chunk);
  }

  // Placement auto keeps up to cached_shards_ parameter shards of on-disk chunks in memory
  // (those of gathered chunks included); static placement only those of gathered chunks.
  void keep_or_drop_values(ShardChunk& chunk) {
    if (!chunk.values.defined()) return;
    std::size_t resident = 0;
    for (const ShardChunk& c : chunks_)
      if (c.values_on_disk && c.values.defined()) ++resident;
    if (!gemini_.auto_placement || resident > cached_shards_) drop_resident_values(chunk);
  }

  // After the first step (placement auto): the rank's peak less the shards it held then is the
  // rest of the process; the shards that fit beside it in the budget (less the headroom and one
  // shard of margin) stay in memory from now on, at least as many as chunks are gathered.
  void size_shard_cache_to_budget() {
    std::vector<std::uint64_t> on_disk;
    for (const ShardChunk& c : chunks_)
      if (c.values_on_disk) on_disk.push_back(values_bytes(c));
    if (const std::optional<std::size_t> limit = cache_limit_after_peak(
            on_disk, cached_shards_, core::process_peak_rss(), rank_budget_, kGatheredChunks))
      cached_shards_ = *limit;
  }

  // Placement auto with a device tier, after the first step: the device's measured peak (the
  // chunks, gradients and optimizer state it held, and on a GPU the activations and workspace)
  // is what it needs beside the shards; as many parameter shards as fit beside it in its budget
  // (on a GPU, less what NCCL or another process took since: DeviceTier::capacity)
  // (less the headroom and one shard of margin) move there from host memory, in chunk order, and
  // stay: a group of one then computes on them in place, several ranks gather from them with
  // nothing copied up. A shard whose optimizer state is on disk moves only where its float32
  // masters stay as they are (bf16), as the file's layout depends on them.
  void move_shards_to_device() {
    std::vector<std::size_t> movable;
    std::uint64_t largest = 0;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const ShardChunk& chunk = chunks_[c];
      if (chunk.values_on_device || chunk.values_on_disk) continue;
      if (chunk.trainable && chunk.optim_on_disk && dtype_ == torch::kFloat32) continue;
      movable.push_back(c);
      largest = std::max(largest, values_bytes(chunk));
    }
    const std::uint64_t peak = device_->measured_peak();
    const std::uint64_t capacity = device_->capacity();
    if (movable.empty()) return;  // the same on every rank (the placement is)
    // A group of one gathered up to kGatheredChunks of them at the peak, copies a moved shard no
    // longer needs (it computes on the shard): of k moved, min(kGatheredChunks, n − k) remain.
    const std::size_t n = movable.size();
    const std::uint64_t gathered = world_ == 1 ? largest : 0;
    const std::uint64_t rest =
        peak - std::min<std::uint64_t>(peak, std::min(kGatheredChunks, n) * gathered);
    std::size_t count = 0;  // nothing measured: nothing moves
    for (std::size_t k = 1; peak != 0 && k <= n; ++k)
      if (items_within_budget(rest + std::min(kGatheredChunks, n - k) * gathered, 0, capacity,
                              largest, 0, n) >= k)
        count = k;
    if (world_ > 1) {
      // The ranks' peaks differ a little; they move the same shards (a chunk kept whole is
      // gathered again when its shard moves: a collective), as many as the tightest rank can.
      const torch::Tensor counts =
          group_->all_gather(torch::tensor({static_cast<double>(count)}, torch::kFloat64));
      count = static_cast<std::size_t>(counts.min().item<double>());
    }
    for (std::size_t k = 0; k < count; ++k) move_shard_to_device(movable[k]);
    if (log_ && rank_ == 0)
      log_("info", "gemini placement auto: " + std::to_string(count) + " of " +
                       std::to_string(movable.size()) +
                       " parameter shards in host memory move to " + device_->name() +
                       " (measured peak " + core::human_bytes(peak) + " of " +
                       core::human_bytes(capacity) + ")");
  }

  // Chunk `c`'s parameter shard moves from host memory to the device; its optimizer shard (in
  // memory) takes or drops its float32 masters as the new placement needs them.
  void move_shard_to_device(std::size_t c) {
    ShardChunk& chunk = chunks_[c];
    const bool was_gathered = chunk.gathered;
    if (was_gathered) release(c);
    settle_upload(chunk);
    const bool had_masters = keeps_masters(chunk);
    torch::Tensor values =
        device_tensor(chunk.shard, dtype_, "parameter shard of chunk " + std::to_string(c));
    values.copy_(chunk.values);
    const torch::Tensor host_values = chunk.values;
    chunk.values = values;
    chunk.values_on_device = true;
    if (chunk.trainable && chunk.optim.defined() && keeps_masters(chunk) != had_masters) {
      // The arrays change: [masters] [exp_avg] [exp_avg_sq], S each, on the optimizer's tier.
      const torch::Tensor old = chunk.optim;
      const std::int64_t n = stride(chunk);
      torch::Tensor relaid = chunk.optim_on_device
                                 ? device_tensor(arrays_of(chunk) * n, torch::kFloat32,
                                                 "optimizer shard of chunk " + std::to_string(c))
                                 : torch::empty({arrays_of(chunk) * n}, torch::kFloat32);
      const std::int64_t from = had_masters ? n : 0;
      const std::int64_t to = had_masters ? 0 : n;
      relaid.narrow(0, to, 2 * n).copy_(old.narrow(0, from, 2 * n));
      if (!had_masters) relaid.narrow(0, 0, chunk.shard).copy_(host_values);  // fp32: the masters
      chunk.optim = relaid;
    }
    if (was_gathered) gather(c);
  }

  // Starts the all-gather of chunk `c` into fresh memory under its storage.
  void start_gather(std::size_t c) {
    ShardChunk& chunk = chunks_[c];
    if (chunk.values_on_disk && !chunk.values.defined()) {
      make_values_resident(chunk);
      disk_->read(chunk.values_region, chunk.values_buffer.data()).get();
    }
    const auto bytes = static_cast<std::size_t>(chunk.whole.nbytes());
    if (aliases(chunk)) {
      // A group of one whose shard is where it computes: the chunk is its shard. The module's
      // views see the shard's memory (not owned here: release() only takes it away from them).
      storage_of(chunk).set_data_ptr_noswap(
          c10::DataPtr(chunk.values.data_ptr(), chunk.values.device()));
      chunk.gathered = true;
      return;
    }
    if (device_ && !gather_to_host_) {
      // A group of one copies its shard up into the chunk; several ranks' all-gather writes it
      // on the collective's stream, queued after the compute (from shards on the device) or after
      // the copy of this rank's shard up (issue_after_copies): in both of the latter cases the
      // block comes from the pool of the stream the collective waits for.
      const bool copied_up = !chunk.values_on_device;
      storage_of(chunk).set_data_ptr_noswap(
          device_->allocate(bytes, "gathered chunk " + std::to_string(c),
                            copied_up ? train::FirstWriter::copies : train::FirstWriter::compute));
      settle_upload(chunk);
      if (chunk.values_on_device) {  // several ranks: gathered from the shards on the devices
        chunk.gathering = group_->all_gather_async(chunk.values, chunk.whole);
        chunk.gathered = true;
        ++all_gathers_;
        return;
      }
      if (world_ == 1) {
        // A group of one: the shard is copied up into the chunk itself, no collective.
        device_->copy_to_device(chunk.whole.data_ptr(), chunk.values.data_ptr(), bytes);
        chunk.uploaded = device_->record_copies_up();
        chunk.compute_after = chunk.uploaded;
        chunk.gathered = true;
        return;
      }
      // Only this rank's shard goes up; the all-gather, queued after that copy (not after the
      // compute: gathered ahead, the block computing now would wait for the copy too), fills the
      // rest from the other ranks' devices. The compute waits for the collective at the chunk's
      // first use (finish_gather).
      chunk.upload =
          device_tensor(chunk.shard, dtype_, "parameter shard of chunk " + std::to_string(c),
                        train::FirstWriter::copies);
      device_->copy_to_device(chunk.upload.data_ptr(), chunk.values.data_ptr(),
                              static_cast<std::size_t>(values_bytes(chunk)));
      chunk.uploaded = device_->record_copies_up();
      device_->issue_after_copies(
          [&] { chunk.gathering = group_->all_gather_async(chunk.upload, chunk.whole); });
    } else {
      storage_of(chunk).set_data_ptr_noswap(c10::GetCPUAllocator()->allocate(bytes));
      // (A shard on the device is gathered in host memory for the export from a host copy of
      // it, alive until the gather is done.)
      if (chunk.values_on_device) chunk.upload = chunk.values.to(torch::kCPU);
      chunk.gathering = group_->all_gather_async(
          chunk.values_on_device ? chunk.upload : chunk.values, chunk.whole);
    }
    chunk.gathered = true;
    ++all_gathers_;
  }

  // Chunk `c` whole in memory now (waiting for a gather ahead, or gathering it).
  void gather(std::size_t c) {
    ShardChunk& chunk = chunks_[c];
    gathered_.touch(c);
    if (!chunk.gathered) {
      if (!chunk.persistent) make_room();
      start_gather(c);
    }
    finish_gather(chunk);
    if (chunk.compute_after) {
      device_->compute_waits(*chunk.compute_after);
      chunk.compute_after.reset();
    }
  }

  // Waits for the chunk's all-gather, if one is in flight; its uploaded shard goes (on a GPU
  // in stream order: the compute stream waited for the collective).
  void finish_gather(ShardChunk& chunk) {
    if (!chunk.gathering) return;
    chunk.gathering->wait();
    chunk.gathering.reset();
    chunk.upload = torch::Tensor();
  }

  // The host shard may change or go once its copy to the device is done.
  void settle_upload(ShardChunk& chunk) {
    if (!chunk.uploaded) return;
    device_->host_waits(*chunk.uploaded);
    chunk.uploaded.reset();
  }

  void use_chunks(const std::vector<std::size_t>& chunks) {
    if (update_behind_) {  // the block's chunks must have their new shards first
      std::vector<std::size_t> waited;
      for (std::size_t c : chunks)
        if (pipelined_[c]) waited.push_back(c);
      update_.wait_for(waited);
    }
    if (device_)
      for (std::size_t c : chunks) wait_values_copied_up(chunks_[c]);
    gathered_.pin(chunks);
    for (std::size_t c : chunks) {
      gather(c);
      if (chunks_[c].persistent) continue;
      if (gathered_.tracing())
        gathered_.record(c);
      else
        gather_ahead(c);
    }
  }

  // After a use of `c`: start gathering the next chunk of the traced order (not across the end
  // of a step: the next use comes after the update, which changes every chunk).
  void gather_ahead(std::size_t c) {
    const std::optional<std::size_t> next = gathered_.next_after(c, /*across_steps=*/false);
    if (!next || aliases(chunks_[*next])) return;  // nothing to move ahead of time
    // Not a chunk the update may still be changing: waiting for it here would hold up this
    // block, and skipping it only where the update is late would make the ranks' gathers differ.
    if (update_behind_ && pipelined_[*next]) return;
    if (chunks_[*next].gathered || !make_room()) return;
    gathered_.touch(*next);
    start_gather(*next);
    ++prefetched_;
  }

  // Releases gathered chunks no block is using until one more fits under kGatheredChunks
  // (memory::ChunkCachePolicy chooses which). Every decision depends only on the order of uses,
  // the same on every rank, so every rank issues the same all-gathers in the same order. False
  // when everything gathered is in use.
  bool make_room() {
    auto holds = [this](std::size_t c) { return !chunks_[c].persistent && chunks_[c].gathered; };
    return gathered_.make_room(kGatheredChunks, holds, [this](std::size_t c) { release(c); });
  }

  void release_gathered() {
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      if (!chunks_[c].persistent && chunks_[c].gathered) release(c);
    gathered_.unpin();
  }

  // After an update (or a load): the chunks kept whole take the new shards.
  void gather_persistent(bool trainable_only) {
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      if (!chunks_[c].persistent || (trainable_only && !chunks_[c].trainable)) continue;
      finish_gather(chunks_[c]);
      chunks_[c].gathered = false;
      gather(c);
    }
  }

  // --- gradients ------------------------------------------------------------------------------

  void launch_ready_reductions() {
    while (next_reduce_ < reduce_order_.size() && chunks_[reduce_order_[next_reduce_]].ready) {
      const std::size_t c = reduce_order_[next_reduce_++];
      ShardChunk& chunk = chunks_[c];
      chunk.launched = true;
      if (adds_in_shard(chunk)) {  // already in the step's shard
        gradient_done(c);
        continue;
      }
      if (!chunk.grad_whole.defined()) chunk.grad_whole = zeroed_gradient_chunk(c);
      Reduction r;
      r.chunk = c;
      r.input = std::move(chunk.grad_whole);
      chunk.grad_whole = torch::Tensor();
      if (world_ == 1) {
        r.output = r.input;  // a group of one on a device: its shard is the whole, copied down
      } else {
        if (device_) {
          r.output = device_tensor(chunk.shard, torch::kFloat32,
                                   "reduced gradient shard " + std::to_string(c));
        } else if (chunk.grad_to_disk) {  // page-aligned: it may become the shard written out
          r.output_buffer = memory::AlignedBuffer(gradient_bytes(chunk));
          r.output = torch::from_blob(r.output_buffer.data(), {chunk.shard}, torch::kFloat32);
        } else {
          r.output = torch::empty({chunk.shard}, torch::kFloat32);
        }
        r.work = group_->reduce_scatter_async(r.input, r.output, dist::ReduceOp::Avg);
        ++reduce_scatters_;
      }
      reductions_.push_back(std::move(r));
      while (reductions_.size() > kReducesInFlight) finish_reduction();
    }
  }

  // Waits for the oldest reduce-scatter and adds this rank's shard into the step's gradients.
  // With a device tier the shard of a chunk updated on the host is copied down behind the
  // collective, into the host gradient shard (the first micro-batch) or a buffer added to it
  // once the backward's copies are done (add_copied_gradients); its device memory goes at once,
  // in stream order. That of a chunk updated on the device stays there.
  void finish_reduction() {
    Reduction& r = reductions_.front();
    r.work.wait();
    ShardChunk& chunk = chunks_[r.chunk];
    if (device_ && !chunk.optim_on_device) {
      torch::Tensor destination = host_tensor(chunk.shard);
      if (chunk.grad_shard.defined())
        copied_gradients_.push_back({r.chunk, destination});
      else
        chunk.grad_shard = destination;
      device_->copies_down_wait(*device_->record_compute());
      device_->copy_to_host(destination.data_ptr(), r.output.data_ptr(),
                            static_cast<std::size_t>(r.output.nbytes()));
      gradients_copied_ = device_->record_copies();
    } else {
      if (chunk.grad_on_disk) read_gradient_back(r.chunk);  // an earlier micro-batch's sum
      if (chunk.grad_shard.defined()) {
        chunk.grad_shard.add_(r.output);
      } else {
        std::lock_guard lock(update_.mutex());
        chunk.grad_shard = r.output;
        chunk.grad_buffer = std::move(r.output_buffer);
      }
      gradient_done(r.chunk);
    }
    reductions_.pop_front();
  }

  // Chunk `c`'s gradient shard holds the step's sum up to this backward: in the last
  // micro-batch its tensors' norms are taken; a shard bound for disk starts its write (at most
  // kGradientWritesInFlight at once; the backward waits for the rest before it returns). A shard
  // written in bf16 leaves memory as its copy is made (but the one read ahead's, which the update
  // takes from memory): only the half-size copy waits for the disk.
  void gradient_done(std::size_t c) {
    ShardChunk& chunk = chunks_[c];
    if (!chunk.grad_shard.defined()) return;
    if (last_micro_batch_) take_norms(chunk);
    if (!chunk.grad_to_disk) return;
    GradientWrite write{c, {}, {}};
    const void* from = chunk.grad_buffer.data();
    if (narrow_gradient_files()) {
      write.narrow = memory::AlignedBuffer(gradient_file_bytes(chunk));
      torch::from_blob(write.narrow.data(), {chunk.shard}, torch::kBFloat16)
          .copy_(chunk.grad_shard);
      from = write.narrow.data();
      // (In its region once finish_gradient_write has waited for the write.)
      if (read_ahead_ != c) drop_gradient_shard(chunk, /*on_disk=*/false);
    }
    write.io = disk_->write(chunk.grad_region, from);
    gradient_writes_.push_back(std::move(write));
    while (gradient_writes_.size() > memory::kGradientWritesInFlight) finish_gradient_write();
  }

  // The norm of each of the chunk's tensors with a gradient, from its final gradient shard.
  void take_norms(const ShardChunk& chunk) {
    for (std::size_t i : chunk.entries) {
      ShardEntry& e = entries_[i];
      if (!e.has_grad || e.own_count == 0) continue;
      if (world_ == 1) {
        e.grad_norm = own_gradient(e).norm(2.0);
      } else if (chunk.optim_on_device) {  // read once for all in step()
        e.grad_norm = optim::norm_in_float64(own_gradient(e));
      } else {
        const double norm = optim::norm_in_float64(own_gradient(e)).item<double>();
        e.grad_squares = norm * norm;
      }
    }
  }

  // The oldest gradient write is done: its shard's memory goes.
  void finish_gradient_write() {
    GradientWrite done = std::move(gradient_writes_.front());
    gradient_writes_.pop_front();
    const std::size_t c = done.chunk;
    done.io.get();
    if (read_ahead_ == c) {  // written, and kept for the update (start_read_ahead)
      std::lock_guard lock(update_.mutex());
      chunks_[c].grad_written = true;
      return;
    }
    drop_gradient_shard(chunks_[c], /*on_disk=*/true);
  }

  // The chunk's gradient shard leaves memory: it is in its region (`on_disk`), or used up.
  void drop_gradient_shard(ShardChunk& chunk, bool on_disk) {
    std::lock_guard lock(update_.mutex());  // memory() reads it; the pipelined update drops it
    chunk.grad_shard = torch::Tensor();
    chunk.grad_buffer = memory::AlignedBuffer();
    chunk.grad_on_disk = on_disk;
    if (on_disk) chunk.grad_written = true;
  }

  // Chunk `c`'s gradient shard, written by an earlier backward, resident again once the
  // returned read is done.
  std::future<void> read_gradient(std::size_t c) {
    ShardChunk& chunk = chunks_[c];
    torch::Tensor shard = resident_gradient(c);
    std::future<void> read;
    // A bf16 file is read and widened now: every caller waits for it at once (a gradient shard
    // goes to disk only beside its optimizer shard, and those the update streams in slices or
    // reads ahead, never through for_each_optim_chunk).
    if (narrow_gradient_files()) {
      memory::AlignedBuffer narrow(gradient_file_bytes(chunk));
      disk_->read(chunk.grad_region, narrow.data()).get();
      shard.copy_(torch::from_blob(narrow.data(), {chunk.shard}, torch::kBFloat16));
      std::promise<void> ready;
      ready.set_value();
      read = ready.get_future();
    } else {
      read = disk_->read(chunk.grad_region, chunk.grad_buffer.data());
    }
    std::lock_guard lock(update_.mutex());
    chunk.grad_shard = shard;
    chunk.grad_on_disk = false;
    return read;
  }
  // The same, waited for now (the reduction or the gradient that needs it waits).
  void read_gradient_back(std::size_t c) { read_gradient(c).get(); }

  // A zeroed float32 shard of chunk `c` in page-aligned memory (written to and read from disk).
  torch::Tensor resident_gradient(std::size_t c) {
    ShardChunk& chunk = chunks_[c];
    memory::AlignedBuffer buffer(gradient_bytes(chunk));
    std::lock_guard lock(update_.mutex());
    chunk.grad_buffer = std::move(buffer);
    return torch::from_blob(chunk.grad_buffer.data(), {chunk.shard}, torch::kFloat32);
  }

  // At the end of a backward: the host waits for the gradient shards' copies and adds those of
  // later micro-batches into the step's.
  void add_copied_gradients() {
    if (!gradients_copied_) return;
    device_->host_waits(*gradients_copied_);
    gradients_copied_.reset();
    for (CopiedGradient& g : copied_gradients_) chunks_[g.chunk].grad_shard.add_(g.host);
    copied_gradients_.clear();
  }

  // `quietly` (a destructor, or the way out of an error): a failure to wait on the device (a
  // sticky CUDA error after a device-side fault) is not thrown over the first error.
  void wait_in_flight(bool quietly = false) {
    for (GradientWrite& w : gradient_writes_)
      if (w.io.valid()) w.io.wait();
    gradient_writes_.clear();
    if (read_ahead_io_.valid()) read_ahead_io_.wait();
    for (Reduction& r : reductions_) {
      try {
        r.work.wait();
      } catch (const std::exception&) {  // the first error is already on its way
      }
    }
    reductions_.clear();
    for (ShardChunk& c : chunks_) {
      if (!c.gathering) continue;
      try {
        c.gathering->wait();
      } catch (const std::exception&) {
      }
      c.gathering.reset();
      c.upload = torch::Tensor();
    }
    if (device_) {  // no host buffer may go while a copy still uses it
      try {
        device_->host_waits(*device_->record_copies());
      } catch (const std::exception&) {
        if (!quietly) throw;
      }
      for (ShardChunk& c : chunks_) c.uploaded.reset();
      gradients_copied_.reset();
      copied_gradients_.clear();
    }
  }

  // --- the update -----------------------------------------------------------------------------

  torch::Tensor own_gradient(const ShardEntry& e) const {
    return chunks_[e.chunk].grad_shard.narrow(0, e.shard_offset, e.own_count);
  }
  // Resident memory, or a read-only map of the shard's file on disk (the checkpoint reads it
  // from there a tensor at a time).
  torch::Tensor own_values(const ShardEntry& e) const {
    const ShardChunk& c = chunks_[e.chunk];
    if (c.values.defined()) return c.values.narrow(0, e.shard_offset, e.own_count);
    if (!c.values_on_disk || !disk_)
      throw Error(ErrorKind::Internal, "gemini: the parameter shard of \"" + e.name +
                                           "\" is neither resident nor on disk");
    return mapped_region(c.values_region, e.shard_offset, e.own_count, dtype_);
  }
  // Float32 master values of this rank's part: the shard itself in fp32 where the update runs
  // beside it.
  torch::Tensor master_of(const ShardEntry& e) const {
    if (!keeps_masters(chunks_[e.chunk])) return own_values(e);
    return optim_part(e, 0);
  }
  torch::Tensor moment_of(const ShardEntry& e, int which) const {
    return optim_part(e, arrays_of(chunks_[e.chunk]) - 2 + which);
  }

  // Chunk by chunk, so that the optimizer shards on disk stream through (one read ahead, one
  // written behind); each tensor's update is independent of the others'. The chunks the
  // pipelined update takes (pipelined_) are left to its worker.
  // With a device tier, chunks whose optimizer shard is there are updated by the device Adam,
  // the others by the CPU Adam (the hybrid Adam); new values cross to the tier their shard
  // lives in on the copy stream, behind the compute that read the old ones.
  void update(double lr, const std::optional<torch::Tensor>& coef) {
    ++steps_;
    with_gradient_.assign(entries_.size(), 0);
    for (std::size_t i = 0; i < entries_.size(); ++i) with_gradient_[i] = entries_[i].has_grad;
    const std::optional<torch::Tensor> host_coef =
        coef ? std::optional<torch::Tensor>(coef->to(torch::kCPU)) : std::nullopt;
    const std::optional<torch::Tensor> device_coef =
        coef ? std::optional<torch::Tensor>(coef->to(tensor_device())) : std::nullopt;
    if (device_) {
      device_->copies_wait(*device_->record_compute());
      prepare_values_staging();
    }
    // Optimizer shards on disk are updated in slices (update_in_slices), those the pipelined
    // update takes (pipelined_) by its worker.
    std::vector<std::size_t> sliced;
    std::vector<std::size_t> later;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      if (!chunks_[c].trainable) continue;
      if (pipelined_[c])
        later.push_back(c);
      else if (chunks_[c].optim_on_disk)
        sliced.push_back(c);
    }
    for_each_optim_chunk([&](std::size_t c) { return !pipelined_[c] && !chunks_[c].optim_on_disk; },
                         [&](std::size_t c) {
                           if (chunks_[c].optim_on_device)
                             update_on_device(c, lr, device_coef);
                           else
                             update_chunk(c, lr, host_coef, 0);
                         });
    update_in_slices(sliced, lr, host_coef, 0, {});
    if (device_) {
      // The compute after the update sees the new values; the host memory the copies read or
      // write is settled before anything else uses it.
      const std::shared_ptr<train::DeviceEvent> crossed = device_->record_copies();
      device_->compute_waits(*crossed);
      if (!update_device_staging_.empty()) {
        device_->host_waits(*crossed);
        update_device_staging_.clear();
      }
    }
    if (later.empty()) return;
    // With a device tier the worker's chunks are those with their optimizer shard in host memory
    // (choose_pipelined_chunks): the CPU Adam, and for a shard on the device the copies up of its
    // new values from host staging (values_staging_), which a block using the chunk waits for
    // (use_chunks). A host shard's last copy up (a gather of the backward) is done before the
    // worker writes it.
    if (device_)
      for (std::size_t c : later) settle_upload(chunks_[c]);
    const std::optional<std::size_t> ahead = std::exchange(read_ahead_, std::nullopt);
    auto ahead_read = std::make_shared<std::future<void>>(std::move(read_ahead_io_));
    update_.start(chunks_.size(), later,
                  [this, later, lr, coef, host_coef, ahead, ahead_read](
                      const UpdatePipeline::ChunkDone& done, int threads) {
                    torch::NoGradGuard no_grad;
                    if (!device_) {
                      if (ahead)
                        update_read_ahead_first(*ahead, *ahead_read, later, lr, host_coef, threads,
                                                done);
                      else
                        update_in_slices(later, lr, coef, threads, done);
                      return;
                    }
                    for (std::size_t c : later) {
                      update_chunk(c, lr, host_coef, threads);
                      done(c);
                    }
                  });
    update_behind_ = true;
    ++updates_behind_;
  }

  // The CPU Adam on this rank's part of chunk `c`'s tensors (its resident optimizer shard, laid
  // out as a slice of the whole shard); its gradient shard goes. The new values of a shard on the
  // device go up through host staging.
  void update_chunk(std::size_t c, double lr, const std::optional<torch::Tensor>& coef,
                    int threads) {
    ShardChunk& chunk = chunks_[c];
    char* staging = begin_values_staging(chunk);
    try {
      update_range(chunk, 0, stride(chunk), chunk.optim.data_ptr<float>(),
                   chunk.grad_shard.defined() ? chunk.grad_shard.data_ptr<float>() : nullptr, lr,
                   coef, threads, staging);
    } catch (...) {
      // The copies queued from the buffer so far: its next use and the chunk's wait for them.
      if (staging != nullptr) end_values_staging(chunk);
      throw;
    }
    if (staging != nullptr) end_values_staging(chunk);
    drop_gradient_shard(chunk, /*on_disk=*/false);
  }

  // The host staging of the new values of shards on the device updated by the CPU Adam:
  // kStagedUpdates buffers of the largest such shard, kept from the first update that needs them
  // (the main thread makes them, before the worker starts). Made again larger where placement
  // auto moved a larger shard there; gone where none is left.
  void prepare_values_staging() {
    std::uint64_t largest = 0;
    for (const ShardChunk& chunk : chunks_)
      if (chunk.trainable && chunk.values_on_device && !chunk.optim_on_device)
        largest = std::max(largest, values_bytes(chunk));
    if (largest != 0 && largest <= values_staging_bytes_) return;
    drop_values_staging();
    if (largest == 0) return;
    for (std::size_t k = 0; k < kStagedUpdates; ++k)
      values_staging_.push_back({device_->allocate_host(largest), nullptr});
    values_staging_bytes_ = largest;
  }

  // The staging's buffers go, freed after their copies (the tier's frees are stream-ordered) and
  // given back to the system where those are done.
  void drop_values_staging() {
    values_staging_.clear();
    values_staging_bytes_ = 0;
    next_staging_ = 0;
    device_->release_cached_host();
  }

  // The next staging buffer for the new values of chunk's shard on the device, once the copies
  // up from its last use are done (the host waits for them); null for a shard in host memory.
  char* begin_values_staging(const ShardChunk& chunk) {
    if (!chunk.values_on_device) return nullptr;
    ValuesStaging& staging = values_staging_.at(next_staging_);
    if (staging.copied) device_->host_waits(*staging.copied);
    staging.copied.reset();
    return static_cast<char*>(staging.memory.get());
  }
  // After update_range queued the chunk's copies up from that buffer: the event that the buffer's
  // next use and the compute before the chunk's next use wait for.
  void end_values_staging(ShardChunk& chunk) {
    std::shared_ptr<train::DeviceEvent> copied = device_->record_copies_up();
    values_staging_[next_staging_].copied = copied;
    next_staging_ = (next_staging_ + 1) % values_staging_.size();
    chunk.values_copied_up = std::move(copied);
  }

  // The compute waits for the copies up of the new values of chunk `c`'s shard on the device.
  void wait_values_copied_up(ShardChunk& chunk) {
    if (!chunk.values_copied_up) return;
    device_->compute_waits(*chunk.values_copied_up);
    chunk.values_copied_up.reset();
  }

  // The device Adam on this rank's part of chunk `c`'s tensors (its optimizer and gradient
  // shards in device memory): torch's fused AdamW, one call per weight decay. Masters (bf16, or
  // a shard in host memory) are cast into the shard, or copied down to it; the gradient shard
  // goes.
  // `device_coef`: the clipping coefficient on the device (update() moves it there once: a copy
  // per chunk from host memory would hold the host until the GPU is idle, each time).
  void update_on_device(std::size_t c, double lr, const std::optional<torch::Tensor>& device_coef) {
    ShardChunk& chunk = chunks_[c];
    torch::Tensor staged;  // a float32 shard in host memory, copied up for the update
    const auto bytes = static_cast<std::size_t>(values_bytes(chunk));
    // At most kStagedUpdates chunks' device staging at once: the oldest one's copies are waited
    // for.
    if (update_device_staging_.size() >= kStagedUpdates) {
      device_->host_waits(*update_device_staging_.front().copied);
      update_device_staging_.pop_front();
    }
    if (stages_values_up(chunk)) {
      staged = device_tensor(chunk.shard, torch::kFloat32,
                             "parameter shard of chunk " + std::to_string(c) + " for its update",
                             train::FirstWriter::copies);
      device_->copy_to_device(staged.data_ptr(), chunk.values.data_ptr(), bytes);
      device_->compute_waits(*device_->record_copies_up());
    }
    const auto param_of = [&](const ShardEntry& e) {
      return staged.defined() ? staged.narrow(0, e.shard_offset, e.own_count) : master_of(e);
    };
    optim::FusedAdamWLists groups[2];  // [0] without weight decay, [1] with
    std::vector<std::size_t> updated;
    for (std::size_t i : chunk.entries) {
      ShardEntry& e = entries_[i];
      if (!with_gradient_[i] || e.own_count == 0) continue;
      torch::Tensor g = own_gradient(e);
      if (device_coef) g = g * *device_coef;
      optim::FusedAdamWLists& group = groups[e.decays && adamw_.weight_decay != 0.0 ? 1 : 0];
      group.params.push_back(param_of(e));
      group.grads.push_back(std::move(g));
      group.exp_avgs.push_back(moment_of(e, 0));
      group.exp_avg_sqs.push_back(moment_of(e, 1));
      updated.push_back(i);
    }
    for (int decays = 0; decays < 2; ++decays)
      optim::adamw_fused_step(groups[decays], lr, adamw_, decays != 0 ? adamw_.weight_decay : 0.0,
                              steps_);
    if (staged.defined()) {
      device_->copies_down_wait(*device_->record_compute());
      device_->copy_to_host(chunk.values.data_ptr(), staged.data_ptr(), bytes);
      update_device_staging_.push_back({{std::move(staged)}, device_->record_copies()});
    } else if (keeps_masters(chunk) && chunk.values_on_device) {
      for (std::size_t i : updated) own_values(entries_[i]).copy_(master_of(entries_[i]));
    } else if (keeps_masters(chunk)) {
      // A shard in host memory: the new values in the compute dtype go down behind the update,
      // from device memory alive until the copies are done.
      std::vector<torch::Tensor> low;
      for (std::size_t i : updated)
        low.push_back(master_of(entries_[i]).to(dtype_, /*non_blocking=*/false, /*copy=*/true));
      if (!low.empty()) {
        device_->copies_down_wait(*device_->record_compute());
        for (std::size_t k = 0; k < updated.size(); ++k)
          device_->copy_to_host(own_values(entries_[updated[k]]).data_ptr(), low[k].data_ptr(),
                                static_cast<std::size_t>(low[k].nbytes()));
        update_device_staging_.push_back({std::move(low), device_->record_copies()});
        if (chunk.values_on_disk) chunk.values_copied_down = update_device_staging_.back().copied;
      }
    }
    for (std::size_t i : updated) entries_[i].tensor.unsafeGetTensorImpl()->bump_version();
    drop_gradient_shard(chunk, /*on_disk=*/false);
  }

  // --- the update of optimizer shards on disk, in slices ---------------------------------------
  // A shard whose optimizer state is on disk is updated kSliceElements at a time, never whole:
  // the slice's arrays (masters, exp_avg, exp_avg_sq: each padded to whole slices in the file,
  // stride()) and, when the step's gradient shard is on disk too, its gradients are read, updated
  // by the CPU Adam and written back, the next slice read while one is updated and the previous
  // one written (three slices at most, across chunks). So the
  // update holds a few tens of MB of optimizer state whatever the largest tensor's shard. A
  // parameter shard on disk is read whole before its chunk's first slice and written after its
  // last; one on the device takes its new values from host staging, copied up.
  static constexpr std::int64_t kSliceElements = memory::kUpdateSliceElements;

  struct OptimSlice {
    std::size_t chunk = 0;
    std::int64_t begin = 0;  // elements of the shard, padded (stride())
    std::int64_t end = 0;
    memory::AlignedBuffer arrays;  // arrays_of(chunk) × (end − begin) floats
    memory::AlignedBuffer grads;   // (end − begin) floats, when the gradient shard is on disk
    memory::AlignedBuffer narrow_grads;  // as read, in bf16 (narrow_gradient_files)
    std::vector<std::future<void>> io;
  };

  // Updates `chunks` (optimizer shards on disk) in that order, calling `chunk_done(c)` once
  // chunk c's shard holds its new values. `threads`: the CPU Adam's (0: torch's).
  void update_in_slices(const std::vector<std::size_t>& chunks, double lr,
                        const std::optional<torch::Tensor>& coef, int threads,
                        const std::function<void(std::size_t)>& chunk_done) {
    // Buffers of slices done, taken again by the next slices' reads: a fresh mapping is faulted
    // in and zeroed by the kernel page by page (for gpt2-small all on disk, 1.5 GB a step).
    // At most as many as are in flight at once, all gone when the update ends.
    std::vector<memory::AlignedBuffer> spare;
    const auto take = [&spare](std::size_t bytes) {
      for (auto it = spare.begin(); it != spare.end(); ++it) {
        if (it->size() != bytes) continue;
        memory::AlignedBuffer buffer = std::move(*it);
        spare.erase(it);
        return buffer;
      }
      return memory::AlignedBuffer(bytes);
    };
    const auto give = [&spare](memory::AlignedBuffer& buffer) {
      if (buffer && spare.size() < 2 * (memory::kUpdateSlicesAhead + 1))
        spare.push_back(std::move(buffer));
      buffer = memory::AlignedBuffer();
    };
    std::vector<OptimSlice> slices;
    for (std::size_t c : chunks)
      for (std::int64_t at = 0; at < stride(chunks_[c]); at += kSliceElements)
        slices.push_back(
            {c, at, std::min(stride(chunks_[c]), at + kSliceElements), {}, {}, {}, {}});
    const auto start_read = [&](OptimSlice& slice) {
      ShardChunk& chunk = chunks_[slice.chunk];
      const std::int64_t length = slice.end - slice.begin;
      const int arrays = arrays_of(chunk);
      slice.arrays = take(static_cast<std::size_t>(length * 4 * arrays));
      for (int k = 0; k < arrays; ++k)
        slice.io.push_back(disk_->read_range(
            chunk.optim_region, static_cast<std::uint64_t>((k * stride(chunk) + slice.begin) * 4),
            static_cast<std::uint64_t>(length * 4),
            static_cast<char*>(slice.arrays.data()) + k * length * 4));
      if (chunk.grad_on_disk) {
        const std::int64_t bytes = narrow_gradient_files() ? 2 : 4;
        memory::AlignedBuffer& into = bytes == 2 ? slice.narrow_grads : slice.grads;
        into = take(static_cast<std::size_t>(length * bytes));
        slice.io.push_back(
            disk_->read_range(chunk.grad_region, static_cast<std::uint64_t>(slice.begin * bytes),
                              static_cast<std::uint64_t>(length * bytes), into.data()));
      }
      if (slice.begin == 0 && chunk.values_on_disk && !chunk.values.defined()) {
        make_values_resident(chunk);
        slice.io.push_back(disk_->read(chunk.values_region, chunk.values_buffer.data()));
      }
    };
    const auto start_write = [&](OptimSlice& slice) {
      const ShardChunk& chunk = chunks_[slice.chunk];
      const std::int64_t length = slice.end - slice.begin;
      give(slice.grads);
      for (int k = 0; k < arrays_of(chunk); ++k)
        slice.io.push_back(disk_->write_range(
            chunk.optim_region, static_cast<std::uint64_t>((k * stride(chunk) + slice.begin) * 4),
            static_cast<std::uint64_t>(length * 4),
            static_cast<char*>(slice.arrays.data()) + k * length * 4));
    };
    char* staging = nullptr;       // the chunk's new values on their way to the device
    ShardChunk* staged = nullptr;  // that chunk
    const auto update = [&](std::size_t i) {
      OptimSlice& slice = slices[i];
      ShardChunk& chunk = chunks_[slice.chunk];
      if (slice.begin == 0) {
        settle_upload(chunk);  // a chunk kept whole was copied up from this shard
        staging = begin_values_staging(chunk);
        staged = &chunk;
      }
      if (slice.narrow_grads) {  // widened for the CPU Adam
        const std::int64_t length = slice.end - slice.begin;
        slice.grads = take(static_cast<std::size_t>(length * 4));
        torch::from_blob(slice.grads.data(), {length}, torch::kFloat32)
            .copy_(torch::from_blob(slice.narrow_grads.data(), {length}, torch::kBFloat16));
        give(slice.narrow_grads);
      }
      // (No gradient shard at all when none of the chunk's tensors got a gradient this step.)
      float* grads = slice.grads                  ? static_cast<float*>(slice.grads.data())
                     : chunk.grad_shard.defined() ? chunk.grad_shard.data_ptr<float>() + slice.begin
                                                  : nullptr;
      update_range(chunk, slice.begin, slice.end, static_cast<float*>(slice.arrays.data()), grads,
                   lr, coef, threads, staging);
    };
    // After the chunk's last slice its parameter shard goes back to disk, its gradients go.
    const auto written = [&](std::size_t i) {
      if (i + 1 < slices.size() && slices[i + 1].chunk == slices[i].chunk) return;
      ShardChunk& chunk = chunks_[slices[i].chunk];
      if (chunk.values_on_disk) {
        disk_->write(chunk.values_region, chunk.values_buffer.data()).get();
        keep_or_drop_values(chunk);
      }
      drop_gradient_shard(chunk, /*on_disk=*/false);
      if (staging != nullptr) end_values_staging(chunk);
      staging = nullptr;
      if (chunk_done) chunk_done(slices[i].chunk);
    };
    try {
      stream_update_slices(slices, start_read, update, start_write, written,
                           [&give](OptimSlice& slice) { give(slice.arrays); });
    } catch (...) {
      // The copies queued from the buffer so far: its next use and the chunk's wait for them.
      if (staging != nullptr) end_values_staging(*staged);
      throw;
    }
  }

  // The CPU Adam on the parts of the chunk's tensors inside elements [begin, end) of this rank's
  // shard: `arrays` holds the optimizer arrays of that range one after the other ([masters]
  // [exp_avg] [exp_avg_sq], end − begin floats each), `grads` its gradients (null when none
  // arrived). New values go into the shard, or for a shard on the device into `staging` and up.
  void update_range(const ShardChunk& chunk, std::int64_t begin, std::int64_t end, float* arrays,
                    float* grads, double lr, const std::optional<torch::Tensor>& coef, int threads,
                    char* staging) {
    const std::int64_t length = end - begin;
    const std::size_t element = c10::elementSize(dtype_);
    const int count = arrays_of(chunk);
    float* masters = keeps_masters(chunk) ? arrays : nullptr;
    float* exp_avg = arrays + (count - 2) * length;
    float* exp_avg_sq = exp_avg + length;
    // New values in staging not yet copied up: elements [run_lo, run_hi) of the shard. Adjacent
    // tensors' go up in one copy (one launch, not one per tensor), a few MiB at a time so that
    // the copy runs beside the update of the next ones.
    std::int64_t run_lo = 0, run_hi = 0;
    const auto copy_up = [&] {
      if (run_lo < run_hi)
        device_->copy_to_device(static_cast<char*>(chunk.values.data_ptr()) + run_lo * element,
                                staging + run_lo * element,
                                static_cast<std::size_t>(run_hi - run_lo) * element);
      run_lo = run_hi = 0;
    };
    constexpr std::size_t kCopyUpBytes = std::size_t{8} << 20;
    for (std::size_t i : chunk.entries) {
      ShardEntry& e = entries_[i];
      if (!with_gradient_[i] || e.own_count == 0) continue;  // no gradient: no update, as torch
      const std::int64_t lo = std::max(e.shard_offset, begin);
      const std::int64_t hi = std::min(e.shard_offset + e.own_count, end);
      if (lo >= hi) continue;
      const std::int64_t in_range = lo - begin;
      CpuUpdateArrays where;
      where.exp_avg = exp_avg + in_range;
      where.exp_avg_sq = exp_avg_sq + in_range;
      // The shard's values at `lo`: host staging for a shard on the device, else its memory.
      char* values = staging != nullptr
                         ? staging + lo * element
                         : static_cast<char*>(chunk.values.data_ptr()) + lo * element;
      if (masters != nullptr) {
        where.param = masters + in_range;
        if (dtype_ != torch::kFloat32) {  // bf16, or fp16 (a GPU's)
          where.low_precision_copy = reinterpret_cast<std::uint16_t*>(values);
          where.copy_kind = low_precision_copy_of(dtype_);
        }
      } else {
        where.param = reinterpret_cast<float*>(values);  // fp32 values in host memory: masters
      }
      cpu_adamw_update(torch::from_blob(grads + in_range, {hi - lo}, torch::kFloat32), coef, where,
                       adamw_, lr, e.decays, steps_, threads);
      if (staging != nullptr) {
        const auto bytes = static_cast<std::size_t>(hi - lo) * element;
        if (dtype_ == torch::kFloat32) std::memcpy(values, where.param, bytes);
        if (lo != run_hi) copy_up();
        if (run_lo == run_hi) run_lo = lo;
        run_hi = hi;
        if (static_cast<std::size_t>(run_hi - run_lo) * element >= kCopyUpBytes) copy_up();
      }
      e.tensor.unsafeGetTensorImpl()->bump_version();
    }
    if (staging != nullptr) copy_up();
  }

  // The next update's first reads overlap the last micro-batch's backward: the optimizer shard
  // of the first chunk the update takes (the chunk the next forward needs first, so the one it
  // would wait on) is read from disk as backward starts, and that chunk's gradient shard, once
  // written, stays in memory for the update instead of being read back. The plan counts the
  // shard among the disk tier's buffers (plan/gemini_cost.cpp). Each rank reads its own shard.
  void start_read_ahead() {
    if (read_ahead_ || !last_micro_batch_ || device_) return;
    const auto first = std::find(pipelined_.begin(), pipelined_.end(), true);
    if (first == pipelined_.end()) return;
    const auto c = static_cast<std::size_t>(first - pipelined_.begin());
    ShardChunk& chunk = chunks_[c];
    if (!chunk.optim_on_disk || chunk.optim.defined()) return;
    make_optim_resident(chunk);
    read_ahead_io_ = disk_->read(chunk.optim_region, chunk.optim_buffer.data());
    read_ahead_ = c;
    if (read_aheads_++ == 0 && log_ && rank_ == 0)
      log_("info", "gemini: the optimizer shard of chunk " + std::to_string(c) + " (" +
                       core::human_bytes(optim_bytes(chunk)) +
                       "), the first the next forward needs, is read from disk during backward");
  }

  // The chunk read ahead (start_read_ahead) is updated first, in memory, and written back while
  // the other chunks stream through in slices.
  void update_read_ahead_first(std::size_t c, std::future<void>& read,
                               const std::vector<std::size_t>& chunks, double lr,
                               const std::optional<torch::Tensor>& coef, int threads,
                               const UpdatePipeline::ChunkDone& done) {
    ShardChunk& chunk = chunks_[c];
    std::future<void> write;
    try {
      read.get();
      if (chunk.grad_on_disk) read_gradient_back(c);  // written before the read-ahead began
      update_chunk(c, lr, coef, threads);
      write = disk_->write(chunk.optim_region, chunk.optim_buffer.data());
      done(c);
      std::vector<std::size_t> rest;
      for (std::size_t other : chunks)
        if (other != c) rest.push_back(other);
      update_in_slices(rest, lr, coef, threads, done);
      write.get();
    } catch (...) {
      if (write.valid()) write.wait();  // nothing may outlive its buffer
      drop_resident_optim(chunk);
      throw;
    }
    drop_resident_optim(chunk);
  }

  // A step not taken (fp16's overflow): the shard read ahead goes unused.
  void drop_read_ahead() {
    if (!read_ahead_) return;
    ShardChunk& chunk = chunks_[*read_ahead_];
    read_ahead_.reset();
    std::future<void> read = std::move(read_ahead_io_);
    read.wait();
    drop_resident_optim(chunk);
    read.get();  // its error, if any
  }

  // Waits for the update pipelined with the forward, if one runs; rethrows its error. Every rank
  // calls it at the same points (it decides whether the forward gathers ahead).
  void settle_update() {
    update_behind_ = false;  // the worker has ended, whether it failed or not
    update_.settle();
    if (!device_) return;
    // Shards no block used since the update (or the update's whole, before a checkpoint).
    for (ShardChunk& chunk : chunks_) wait_values_copied_up(chunk);
  }

  // Pipelines the CPU Adam with the next forward when no parameter shard is on disk (the update
  // would otherwise share the disk reads with the forward): a chunk which a block gathers (not
  // LoRA's adapters, gathered after every update) is updated on a worker, and each block waits
  // for its own chunks (use_chunks). Without a device tier: the chunks whose optimizer shard is on
  // disk. With one: those whose optimizer shard is in host memory (the CPU Adam's), so that the
  // GPU computes the next forward's first blocks while the host updates the later ones; those
  // whose optimizer shard is on the device or on disk are updated at once, as before.
  void choose_pipelined_chunks() {
    pipelined_.assign(chunks_.size(), false);
    if (std::any_of(chunks_.begin(), chunks_.end(),
                    [](const ShardChunk& c) { return c.values_on_disk; }))
      return;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const ShardChunk& chunk = chunks_[c];
      const bool gathered_by_blocks = chunk.trainable && !chunk.persistent;
      pipelined_[c] =
          gathered_by_blocks &&
          (device_ ? !chunk.optim_on_device && !chunk.optim_on_disk : chunk.optim_on_disk);
    }
    const auto behind = std::count(pipelined_.begin(), pipelined_.end(), true);
    if (behind > 0 && log_ && rank_ == 0)
      log_("info", "gemini: the update of " + std::to_string(behind) +
                       (device_ ? " optimizer shards in host memory (the CPU Adam's)"
                                : " optimizer shards on disk") +
                       " runs behind the next forward, each block waiting for its own");
  }

  // --- optimizer shards in the disk tier ------------------------------------------------------

  // Float32 masters beside the moments: in bf16, and with a device tier where the update runs
  // on another tier than the shard's values (the CPU Adam never reads a value back from the
  // device, the device Adam never from disk).
  // A float32 shard in host memory updated on the device keeps none: the update copies the shard
  // up and its new values back down (update_on_device), as device memory is the scarcer tier.
  bool keeps_masters(const ShardChunk& chunk) const {
    if (dtype_ != torch::kFloat32) return true;
    if (chunk.values_on_device == chunk.optim_on_device) return false;
    return !chunk.optim_on_device || chunk.values_on_disk;
  }
  // The float32 shard in host memory the device Adam updates without masters: copied up.
  bool stages_values_up(const ShardChunk& chunk) const {
    return chunk.optim_on_device && !chunk.values_on_device && !keeps_masters(chunk);
  }
  int arrays_of(const ShardChunk& chunk) const { return keeps_masters(chunk) ? 3 : 2; }
  std::uint64_t optim_bytes(const ShardChunk& chunk) const {
    return static_cast<std::uint64_t>(stride(chunk)) * 4 * arrays_of(chunk);
  }
  // Elements of each optimizer array: the shard's, padded for slices where it is on disk
  // (update_in_slices).
  static std::int64_t stride(const ShardChunk& chunk) {
    return chunk.optim_on_disk ? memory::sliced_array_elements(chunk.shard) : chunk.shard;
  }
  // A gradient shard bound for disk, padded likewise.
  static std::uint64_t gradient_bytes(const ShardChunk& chunk) {
    return static_cast<std::uint64_t>(stride(chunk)) * 4;
  }
  // One process in bf16 keeps the step's gradient sums rounded to bf16 (gradient_arrived, as
  // `single`'s .grad adds up), so its gradient shards go to disk in bf16, exactly: half the bytes
  // each way. Several ranks' reduced shards are float32 means, and go as they are.
  bool narrow_gradient_files() const { return world_ == 1 && dtype_ == torch::kBFloat16; }
  std::uint64_t gradient_file_bytes(const ShardChunk& chunk) const {
    return static_cast<std::uint64_t>(stride(chunk)) * (narrow_gradient_files() ? 2 : 4);
  }

  memory::DiskStore& disk() {
    if (!disk_) disk_ = std::make_unique<memory::DiskStore>(gemini_.offload_dir);
    return *disk_;
  }

  // A fresh zeroed buffer under `optim` (page-aligned, as O_DIRECT needs).
  void make_optim_resident(ShardChunk& chunk) {
    memory::AlignedBuffer buffer(optim_bytes(chunk));
    std::lock_guard lock(update_.mutex());  // memory() reads it
    chunk.optim_buffer = std::move(buffer);
    chunk.optim = torch::from_blob(chunk.optim_buffer.data(), {arrays_of(chunk) * stride(chunk)},
                                   torch::kFloat32);
  }
  void drop_resident_optim(ShardChunk& chunk) {
    std::lock_guard lock(update_.mutex());
    chunk.optim = torch::Tensor();
    chunk.optim_buffer = memory::AlignedBuffer();
  }

  std::uint64_t values_bytes(const ShardChunk& chunk) const {
    return static_cast<std::uint64_t>(chunk.shard) * c10::elementSize(dtype_);
  }
  void make_values_resident(ShardChunk& chunk) {
    if (device_) {
      // The disk store moves whole aligned blocks: the tail past the shard is zeroed once here.
      static_assert(train::DeviceTier::kHostIoAlignment % memory::kIoAlignment == 0);
      const std::uint64_t bytes = values_bytes(chunk), io = memory::io_size(bytes);
      chunk.values_buffer = {{}, device_->allocate_host_io(io)};
      std::memset(static_cast<char*>(chunk.values_buffer.data()) + bytes, 0, io - bytes);
    } else {
      chunk.values_buffer = {memory::AlignedBuffer(values_bytes(chunk)), {}};
    }
    chunk.values = torch::from_blob(chunk.values_buffer.data(), {chunk.shard}, dtype_);
  }
  void drop_resident_values(ShardChunk& chunk) {
    chunk.values = torch::Tensor();
    chunk.values_buffer = {};
  }

  // Runs body(c) on every trainable chunk c that `include` takes, in order, with its optimizer
  // and parameter shards resident: those on disk are read ahead and written back behind
  // (disk_chunks.h). No chunk it takes is gathered meanwhile
  // (the update released them; the forward waits for them).
  static bool every_chunk(std::size_t) { return true; }
  template <typename Include, typename Body>
  void for_each_optim_chunk(Include&& include, Body&& body) {
    DiskChunkTransfers io;
    io.on_disk = [&](std::size_t c) {
      return include(c) && chunks_[c].trainable &&
             (chunks_[c].optim_on_disk || chunks_[c].values_on_disk || chunks_[c].grad_on_disk);
    };
    io.read = [&](std::size_t c) {
      ShardChunk& chunk = chunks_[c];
      std::vector<std::future<void>> reads;
      if (chunk.optim_on_disk) {
        make_optim_resident(chunk);
        reads.push_back(disk_->read(chunk.optim_region, chunk.optim_buffer.data()));
      }
      if (chunk.values_on_disk && !chunk.values.defined()) {
        make_values_resident(chunk);
        reads.push_back(disk_->read(chunk.values_region, chunk.values_buffer.data()));
      }
      if (chunk.grad_on_disk) reads.push_back(read_gradient(c));
      return reads;
    };
    io.write = [&](std::size_t c) {
      ShardChunk& chunk = chunks_[c];
      std::vector<std::future<void>> writes;
      if (chunk.optim_on_disk)
        writes.push_back(disk_->write(chunk.optim_region, chunk.optim_buffer.data()));
      if (chunk.values_on_disk) {
        if (chunk.values_copied_down) {  // the new values land before the file takes them
          device_->host_waits(*chunk.values_copied_down);
          chunk.values_copied_down.reset();
        }
        writes.push_back(disk_->write(chunk.values_region, chunk.values_buffer.data()));
      }
      return writes;
    };
    io.written = [&](std::size_t c) {
      if (chunks_[c].optim_on_disk) drop_resident_optim(chunks_[c]);
      if (chunks_[c].values_on_disk) keep_or_drop_values(chunks_[c]);
    };
    stream_disk_chunks(chunks_.size(), io, [&](std::size_t c) {
      if (!chunks_[c].trainable || !include(c)) return;
      settle_upload(chunks_[c]);  // a chunk kept whole was copied up from this shard
      body(c);
    });
  }

  // Array `array` of the optimizer shard ([masters (bf16)] [exp_avg] [exp_avg_sq]) over this
  // rank's part of `e`: resident memory, or a read-only map of the shard's file on disk (the
  // checkpoint reads it from there a tensor at a time).
  torch::Tensor optim_part(const ShardEntry& e, std::int64_t array) const {
    const ShardChunk& c = chunks_[e.chunk];
    const std::int64_t at = array * stride(c) + e.shard_offset;
    if (c.optim.defined()) return c.optim.narrow(0, at, e.own_count);
    if (!c.optim_on_disk || !disk_)
      throw Error(ErrorKind::Internal, "gemini: the optimizer state of \"" + e.name +
                                           "\" is neither resident nor on disk");
    return mapped_region(c.optim_region, at, e.own_count, torch::kFloat32);
  }

  // `count` elements of `dtype` from element `at` of region `region`'s file, mapped read-only.
  torch::Tensor mapped_region(std::size_t region, std::int64_t at, std::int64_t count,
                              torch::Dtype dtype) const {
    return mapped_file_tensor(disk_->region_path(region),
                              at * static_cast<std::int64_t>(c10::elementSize(dtype)), {count},
                              dtype);
  }

  train::ProcessContext process_;
  std::unique_ptr<dist::ParallelContext> solo_;  // one process: its group of one
  dist::ProcessGroup* group_ = nullptr;
  int rank_ = 0;
  int world_ = 1;
  // The device tier (a GPU, or the simulated device): the gathered chunks and the gradient
  // chunks live there. Declared first among the chunks' owners, so their memory goes before it.
  std::unique_ptr<train::DeviceTier> device_;
  bool gather_to_host_ = false;  // after gather_weights(): chunks whole in host memory
  std::optional<train::MixedPrecision> precision_;
  torch::Dtype dtype_ = torch::kFloat32;
  optim::AdamWOptions adamw_;
  const model::DeferredWeights* deferred_ = nullptr;  // during prepare() only
  std::vector<ShardEntry> entries_;
  std::uint64_t quantized_bytes_ = 0;  // QLoRA: the base's quantized Linears, held by the layers
  bool quantized_on_device_ = false;   // ... on the GPU (its device tier), not in host memory
  std::vector<std::size_t> trainable_order_;
  std::vector<ShardChunk> chunks_;
  std::vector<std::size_t> reduce_order_;
  std::size_t next_reduce_ = 0;
  std::deque<Reduction> reductions_;
  bool last_micro_batch_ = false;
  // Gradient shards on their way to the disk tier (gradient_done), oldest first.
  struct GradientWrite {
    std::size_t chunk = 0;
    std::future<void> io;
    memory::AlignedBuffer narrow;  // the bf16 copy written (narrow_gradient_files), or none
  };
  std::deque<GradientWrite> gradient_writes_;
  // The chunk whose optimizer shard is being read ahead for the next update (start_read_ahead),
  // the read, and how many steps read one ahead.
  std::optional<std::size_t> read_ahead_;
  std::future<void> read_ahead_io_;
  std::uint64_t read_aheads_ = 0;
  // A device tier's gradient shards on their way down: the last copy's event, and the later
  // micro-batches' shards to add once it is done.
  std::shared_ptr<train::DeviceEvent> gradients_copied_;
  std::vector<CopiedGradient> copied_gradients_;
  std::shared_ptr<ChunkUseHook> chunk_use_;
  HookedBlocks hooked_blocks_;
  GeminiOptions gemini_;
  std::uint64_t rank_budget_ = 0;  // auto: this rank's share of host_budget
  // Parameter shards of on-disk chunks kept in memory (auto grows it after the first step).
  std::size_t cached_shards_ = kGatheredChunks;
  // After chunks_: destroyed first, so no transfer outlives a chunk's buffer.
  std::unique_ptr<memory::DiskStore> disk_;
  // Which chunks stay gathered and which are gathered ahead: the order the first step used
  // them in; the block computing now pins its chunks.
  memory::ChunkCachePolicy gathered_;
  std::int64_t steps_ = 0;
  std::function<void(const std::string&, const std::string&)> log_;  // may be empty
  // The update (update()): which entries it changes (their gradient arrived).
  std::vector<char> with_gradient_;
  // With a device tier, the host staging of new values going up (prepare_values_staging): used in
  // turn by the update's thread (the main thread, or the pipelined update's worker; never both
  // at once), each buffer with the event after the copies up from its last use.
  struct ValuesStaging {
    c10::DataPtr memory;
    std::shared_ptr<train::DeviceEvent> copied;
  };
  std::vector<ValuesStaging> values_staging_;
  std::uint64_t values_staging_bytes_ = 0;  // each buffer's
  std::size_t next_staging_ = 0;
  // The memory the update's copies read until they are done: device copies of new values going
  // down and of float32 shards copied up for their update (kStagedUpdates chunks' at most).
  // Per chunk updated: its device staging and the event after its copies.
  struct DeviceStaging {
    std::vector<torch::Tensor> tensors;
    std::shared_ptr<train::DeviceEvent> copied;
  };
  std::deque<DeviceStaging> update_device_staging_;
  // The chunks whose update runs behind the next forward (choose_pipelined_chunks), and whether
  // one may be running now (from step() to the next settle_update()).
  std::vector<bool> pipelined_;
  bool update_behind_ = false;
  std::uint64_t all_gathers_ = 0;
  std::uint64_t reduce_scatters_ = 0;
  std::uint64_t prefetched_ = 0;
  std::uint64_t updates_behind_ = 0;
  // Its worker, declared last: it ends before anything it uses goes.
  UpdatePipeline update_;
};

}  // namespace

void register_gemini_plugin() {
  train::register_plugin("gemini", [] { return std::make_unique<GeminiPlugin>(); });
}

bool gemini_shard_held(const train::Plugin& plugin, GeminiShardHeld* held) {
  const auto* gemini = dynamic_cast<const GeminiPlugin*>(&plugin);
  if (gemini == nullptr) return false;
  *held = gemini->held();
  return true;
}

}  // namespace tessera::plugins
