// The `gemini` plugin: chunked parameters and optimizer state across host and disk
// (gemini_plugin.h). Shapes: P parameters, T trainable tensors; a chunk holds whole tensors.
#include "plugins/gemini/gemini_plugin.h"

#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/files.h"
#include "core/meminfo.h"
#include "core/units.h"
#include "memory/chunk_cache_policy.h"
#include "memory/chunk_layout.h"
#include "memory/disk_store.h"
#include "memory/tensor_state.h"
#include "model/layers.h"
#include "optim/clip.h"
#include "optim/cpu_adam.h"
#include "plugins/gemini/chunk_hooks.h"
#include "plugins/gemini/cpu_update.h"
#include "plugins/gemini/disk_chunks.h"
#include "plugins/gemini/gemini_options.h"
#include "plugins/gemini/gemini_state.h"
#include "plugins/gemini/sharded_gemini.h"
#include "plugins/gemini/tensor_entries.h"
#include "plugins/gemini/update_pipeline.h"
#include "train/device_tier.h"
#include "train/mixed_precision.h"
#include "train/param_groups.h"
#include "train/plugin_registry.h"

namespace tessera::plugins {
namespace {

namespace fs = std::filesystem;
using memory::TensorState;
using train::MemoryByCategory;
using train::NamedTensor;
using train::Precision;
using train::StepStats;

// One tensor in the chunks. `tensor` is the model's (or an adapter's) parameter object, whose
// data is a view into its parameter chunk.
struct Entry {
  std::string name;
  std::string model_name;  // its named_parameters() key; empty for adapters outside the model
  torch::Tensor tensor;
  std::size_t param_chunk = 0;
  std::int64_t param_offset = 0;
  bool trainable = false;
  // Trainable only:
  bool decays = true;
  std::size_t optim_chunk = 0;
  std::int64_t optim_offset = 0;  // element offset inside each of the chunk's arrays
  TensorState state = TensorState::Free;
  bool has_grad = false;    // a gradient arrived since the last update
  torch::Tensor grad;       // chunks updated where autograd made the gradient: it, as made
                            // (the others' gradients are in their gradient chunk)
  torch::Tensor grad_norm;  // float32 L2 norm of the final gradient (last micro-batch)
};

// The optimizer state of some trainable tensors: [master (bf16 only)] [exp_avg] [exp_avg_sq],
// `elements` floats each, in one 4 KiB-aligned buffer on the host or one region on disk.
//
// A chunk on disk has a gradient chunk beside it (the compute dtype, laid out like one of the
// arrays): gradients are accumulated into it as autograd produces them, the parameters' own
// .grad is dropped at once, and it is written back as soon as all its tensors' gradients are in
// (during backward, behind the compute) and read again by the update. A host chunk's gradients
// stay the tensors autograd made (a copy would cost time and save nothing).
//
// With a device tier, a chunk lives on the device (`on_device`: its arrays in device memory,
// updated there by the device Adam on the gradients autograd made) or in host memory or on disk
// (updated by the CPU Adam on host gradients, copied down from the device as they arrive); the
// latter keep float32 masters in fp32 too, so the update never reads a parameter back from the
// device: it writes the new values up.
struct OptimChunk {
  std::vector<std::size_t> entries;  // indices into entries_
  std::int64_t elements = 0;
  bool on_disk = false;
  bool on_device = false;
  std::size_t region = 0;
  memory::AlignedBuffer host;  // resident buffer (host chunks; disk chunks while in use)
  c10::DataPtr device_arrays;  // device chunks: the arrays in device memory

  memory::AlignedBuffer grads;       // resident gradients (from the first one to the update)
  std::size_t grad_region = 0;       // disk chunks
  bool grad_region_written = false;  // the region's file exists
  bool grads_on_disk = false;        // this step's gradients are in the region, not resident
  std::future<void> grad_write;      // a write-back of `grads` in flight
  std::size_t grads_this_backward = 0;
};

// A parameter chunk: every parameter in it is a view of `storage` (compute dtype). A chunk on
// disk is in memory only while a block uses it or while cached (at most
// memory::kCachedParameterChunks). Eviction takes the memory out from under the storage (its data
// pointer), so the views autograd saved for backward see the memory again when it comes back;
// it is written back first when the update changed it.
//
// With a device tier the storage is device memory: a chunk on the device keeps it; a chunk
// homed in host memory (`on_host`) has its values in `home` and comes to the device the same
// way a chunk on disk comes to memory (prefetched on the copy stream, `arrival` the event its
// compute waits for), and goes back to `home` when evicted after an update changed it.
struct ParamChunk {
  torch::Tensor storage;
  bool on_disk = false;
  bool on_host = false;
  // With a device: the values in host memory — for good when on_host; when on_disk, a copy
  // read from the file while the chunk is on the device or being updated on the host.
  c10::DataPtr home;
  std::shared_ptr<train::DeviceEvent> arrival;    // the copy to the device in flight
  std::shared_ptr<train::DeviceEvent> departure;  // the copy back to `home` in flight
  std::shared_ptr<train::DeviceEvent> home_read;  // the last copy that read `home`
  bool home_dirty = false;   // on_disk with a device: `home` holds values its file does not
  bool home_queued = false;  // in home_writes_
  bool streamed() const { return on_disk || on_host; }
  std::size_t region = 0;
  bool resident = true;
  bool dirty = false;     // changed since it was last written to its region
  c10::DataPtr incoming;  // a prefetch's buffer, while its read is in flight
  std::future<void> read;
  c10::DataPtr outgoing;  // an evicted buffer, while its write-back is in flight
  std::future<void> write;
};

// Write-backs of evicted parameter chunks in flight before eviction waits for the oldest.
constexpr std::size_t kParameterWritesInFlight = 2;

// Write-backs of gradient chunks allowed in flight before backward waits for the oldest: each
// holds its buffer until written.
constexpr std::size_t kGradientWritesInFlight = 2;

class GeminiPlugin : public train::Plugin {
 public:
  ~GeminiPlugin() override {
    update_.wait_quietly();
    remove_gradient_hooks(entries_, trainable_order_);
    hooked_blocks_.remove();
  }
  std::string name() const override { return "gemini"; }
  bool reads_deferred_weights() const override { return true; }

  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const train::PluginOptions& options) override {
    require_one_process(options.process, name());
    process_ = options.process;
    adamw_ = options.adamw;
    log_ = options.log;
    gemini_ = parse_gemini_options(options, "chunks");
    // "auto" is the device tier on the GPU when one is present and the options allow it.
    const std::string device =
        options.device == "auto" ? train::choose_plugin_device(options, name()) : options.device;
    if (device == "simulated" || device.rfind("cuda", 0) == 0) {
      device_ = train::make_device_tier(device, gemini_.device_budget, "strategy.options.device");
      if (gemini_.auto_placement) {
        // Every parameter chunk has its home in host memory; after the first step as many stay
        // on the device as its measured peak leaves room for in the budget.
        gemini_.offload_param_frac = 0.0;
        gemini_.host_param_frac = 1.0;
      }
    } else {
      train::require_cpu_device(options, name());
      if (gemini_.host_param_frac > 0.0 || gemini_.host_optim_frac > 0.0)
        throw_invalid(
            "strategy.options.host_param_frac / host_optim_frac: these place chunks between a "
            "device and host memory, and this job computes on the CPU",
            "remove them (offload_param_frac and offload_optim_frac place chunks on disk)");
    }
    precision_.emplace(options.precision, tensor_device());
    dtype_ = precision_->compute_dtype();
    deferred_ = options.deferred_weights.get();
    torch::NoGradGuard no_grad;

    // Every tensor in use order (the model's registration order, adapters after), trainable
    // ones recorded by their checkpoint names.
    trainable_order_ = collect_tensor_entries(model, trainable, entries_);
    quantized_bytes_ = model::quantized_weight_bytes(model);

    // Each chunk is filled from the float32 values (or straight from the checkpoint) in turn;
    // a parameter's own storage goes as soon as its chunk holds it.
    build_optimizer_chunks();
    // The building blocks and their parameters, for the hooks both placements install.
    const std::vector<BlockEntries> blocks = blocks_of_entries(model, entries_);
    build_parameter_chunks(model, blocks);
    install_update_waits(blocks);
    move_buffers(model, tensor_device(), dtype_);
    deferred_ = nullptr;
    for (Entry& e : entries_) {
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

  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) override {
    // Gradients go into the chunks the update reads: it is done first (its last chunks, the
    // first ones backward reaches, finish as the forward ends).
    settle_update();
    for (std::size_t i : trainable_order_)
      memory::transition(entries_[i].state, TensorState::Computing, entries_[i].name);
    last_micro_batch_ = last_micro_batch;
    (loss * precision_->backward_multiplier(multiplier)).backward();
    // Chunks on disk whose tensors did not all get a gradient go out now.
    for (OptimChunk& c : optim_chunks_) {
      if (c.on_disk && c.grads && !c.grads_on_disk) write_back_gradients(c);
      c.grads_this_backward = 0;
    }
    for (std::size_t i : trainable_order_)
      memory::transition(entries_[i].state, TensorState::HeldAfterBackward, entries_[i].name);
  }

  // The gradient of entry `i` is in its .grad: accumulate it as autograd would into .grad
  // (taken the first time, added after), into the gradient chunk for a chunk on disk, and drop
  // the .grad.
  void gradient_arrived(std::size_t i, const torch::Tensor& tensor) {
    torch::NoGradGuard no_grad;
    const torch::Tensor g = tensor.grad();
    if (!g.defined()) return;
    Entry& e = entries_[i];
    OptimChunk& c = optim_chunks_[e.optim_chunk];
    torch::Tensor slot;
    torch::Tensor norm_of;  // what the norm is taken from (the slot, unless a copy fills it)
    if (device_ && !c.on_device) {
      // Updated by the CPU Adam: the gradient goes down to the chunk's host gradients, the
      // first micro-batch's on the copy stream, later ones added on the host.
      make_gradients_resident(c);
      slot = gradient_view(c, e);
      if (e.has_grad) {
        wait_for_gradient_copies();
        slot.add_(g.to(torch::kCPU));
        norm_of = slot;
      } else {
        copy_gradient_down(slot, g);
        norm_of = g;
      }
    } else if (c.on_disk) {
      make_gradients_resident(c);
      slot = gradient_view(c, e);
      if (e.has_grad)
        slot.add_(g);
      else
        slot.copy_(g);
    } else {
      if (e.has_grad)
        e.grad.add_(g);
      else
        e.grad = g;
      slot = e.grad;
    }
    e.has_grad = true;
    tensor.mutable_grad() = torch::Tensor();
    if (!norm_of.defined()) norm_of = slot;
    // The norm as `single` takes it from its float32 master gradient (on the compute device).
    if (last_micro_batch_)
      e.grad_norm = precision_->master_gradient(norm_of).norm(2.0).to(tensor_device());
    if (c.on_disk && ++c.grads_this_backward == c.entries.size()) write_back_gradients(c);
  }

  // A block whose parameters the pipelined update changes is about to compute.
  void wait_for_update(const torch::nn::Module& block) {
    if (update_.running()) update_.wait_for(block_optim_chunks_.at(&block));
  }

  StepStats step(double lr, double max_grad_norm) override {
    torch::NoGradGuard no_grad;
    settle_update();
    wait_for_gradient_copies();
    // The global norm first, from the per-tensor norms the last backward took.
    std::vector<torch::Tensor> norms;
    for (std::size_t i : trainable_order_) {
      Entry& e = entries_[i];
      if (e.has_grad) {
        if (!e.grad_norm.defined())
          throw Error(ErrorKind::Internal,
                      "gemini: step() without a backward marked as the last micro-batch");
        norms.push_back(e.grad_norm);
      }
      memory::transition(e.state, TensorState::ReadyForUpdate, e.name);
    }
    const torch::Tensor total =
        norms.empty()
            ? torch::zeros({}, torch::TensorOptions(torch::kFloat32).device(tensor_device()))
            : torch::stack(norms).norm(2.0);
    StepStats stats;
    stats.grad_norm = total.item<double>();
    const std::optional<torch::Tensor> coef = optim::clip_coefficient(total, max_grad_norm);
    stats.applied = precision_->accept_step(stats.grad_norm);
    if (stats.applied) {
      update(lr, coef);  // consumes the gradient chunks as it goes
    } else {
      for (OptimChunk& chunk : optim_chunks_) {  // a skipped step's gradients go unused
        if (chunk.grad_write.valid()) finish_gradient_write(chunk, false);
        chunk.grads = memory::AlignedBuffer();
        chunk.grads_on_disk = false;
      }
    }
    for (std::size_t i : trainable_order_) {
      Entry& e = entries_[i];
      e.has_grad = false;
      e.grad = torch::Tensor();
      e.grad_norm = torch::Tensor();
      memory::transition(e.state, TensorState::Held, e.name);
    }
    cache_.unpin();
    while (!parameter_writes_.empty()) finish_parameter_write(parameter_writes_.front());
    if (cache_.tracing() && gemini_.auto_placement) size_cache_to_budget();
    cache_.end_tracing();  // the first step's order of chunk uses is the order of every later one
    return stats;
  }

  // AdamW at `lr` on every tensor that has a gradient, its gradient multiplied by `coef`
  // (clipping).
  void update(double lr, const std::optional<torch::Tensor>& coef) {
    ++steps_;
    with_gradient_.assign(entries_.size(), 0);
    for (std::size_t i = 0; i < entries_.size(); ++i) with_gradient_[i] = entries_[i].has_grad;
    if (device_) {
      // The new values go up after the compute that still reads the old ones.
      device_->copies_wait(*device_->record_compute());
      const std::optional<torch::Tensor> host_coef =
          coef ? std::optional<torch::Tensor>(coef->to(torch::kCPU)) : std::nullopt;
      for_each_optimizer_chunk(true, [&](OptimChunk& chunk) {
        if (chunk.on_device)
          update_on_device(chunk, lr, coef);
        else
          update_on_host(chunk, lr, host_coef);
      });
      // The compute after the update sees the new values; the staging can go once they are up.
      const std::shared_ptr<train::DeviceEvent> written = device_->record_copies();
      device_->compute_waits(*written);
      if (!update_staging_.empty()) {
        device_->host_waits(*written);
        update_staging_.clear();
      }
      return;
    }
    // Chunk by chunk: each gradient is widened (bf16) and clipped in turn, so no more than one
    // float32 copy exists at a time. Chunks on disk stream through in slices.
    for (OptimChunk& chunk : optim_chunks_) {
      if (chunk.on_disk) continue;
      float* base = static_cast<float*>(chunk.host.data());
      for (std::size_t i : chunk.entries) {
        Entry& e = entries_[i];
        if (!e.has_grad) continue;  // no gradient: no update, as torch does
        use_parameter_chunks({e.param_chunk});
        param_chunks_[e.param_chunk].dirty = true;
        CpuUpdateArrays where;
        where.exp_avg = base + moments_offset(chunk) + e.optim_offset;
        where.exp_avg_sq = where.exp_avg + chunk.elements;
        if (dtype_ == torch::kFloat32) {
          where.param = e.tensor.data_ptr<float>();  // the parameter chunk holds the masters
        } else {
          where.param = base + e.optim_offset;
          where.bf16_copy = static_cast<std::uint16_t*>(e.tensor.data_ptr());
        }
        cpu_adamw_update(precision_->master_gradient(e.grad).contiguous(), coef, where, adamw_, lr,
                         e.decays, steps_);
        e.tensor.unsafeGetTensorImpl()->bump_version();
        e.grad = torch::Tensor();
      }
    }
    // Chunks on disk: those every forward use of waits for (UpdateWait) on a worker, pipelined
    // with the next forward; the others (adapters no block fetches) here.
    std::vector<std::size_t> now;
    std::vector<std::size_t> later;
    for (std::size_t c = 0; c < optim_chunks_.size(); ++c) {
      OptimChunk& chunk = optim_chunks_[c];
      if (!chunk.on_disk) continue;
      // Gradients still being written: kept in memory and used from there.
      if (chunk.grad_write.valid()) finish_gradient_write(chunk, /*keep=*/true);
      (pipelined_ && waited_for_[c] ? later : now).push_back(c);
    }
    update_on_disk_in_slices(now, lr, coef, 0, {});
    if (!later.empty()) start_pipelined_update(std::move(later), lr, coef);
  }

  // --- The update pipelined with the next forward ----------------------------------------------
  // With every parameter in memory and no device tier, the update of optimizer chunks on disk
  // (bound by their I/O) runs on a worker in chunk order — the order forward uses them — while
  // step() returns and the next forward starts: each block waits only for the chunks of its own
  // parameters (UpdateWait). The worker touches nothing but those chunks' buffers, their files
  // and the parameters' values; everything else that reads parameters, gradients or optimizer
  // state waits for it to end first (settle_update).

  void start_pipelined_update(std::vector<std::size_t> chunks, double lr,
                              std::optional<torch::Tensor> coef) {
    update_.start(optim_chunks_.size(), chunks,
                  [this, chunks, lr, coef = std::move(coef)](const UpdatePipeline::ChunkDone& done,
                                                             int threads) {
                    torch::NoGradGuard no_grad;
                    update_on_disk_in_slices(chunks, lr, coef, threads, done);
                  });
  }

  // Waits for the pipelined update to end; rethrows its error.
  void settle_update() { update_.settle(); }
  void settle() override { settle_update(); }

  // --- The update of optimizer chunks on disk, in slices -------------------------------------
  // A chunk on disk is updated a slice of kSliceElements at a time, never whole: the slice's
  // arrays (masters in bf16, exp_avg, exp_avg_sq) and gradients are read, updated by the CPU
  // Adam and written back, the next slice read while one is updated and the previous one
  // written (three slices at most, across chunks). So the update holds a few tens of MB of
  // optimizer state whatever the largest tensor (an embedding's chunk is its whole size).
  // Slices start at multiples of kSliceElements inside a chunk whose arrays are padded to a
  // multiple of it (build_optimizer_chunks), so every range is aligned for O_DIRECT.

  static constexpr std::int64_t kSliceElements = memory::kUpdateSliceElements;

  struct OptimSlice {
    std::size_t chunk = 0;
    std::int64_t begin = 0;
    std::int64_t end = 0;
    memory::AlignedBuffer arrays;  // arrays_per_chunk × (end − begin) floats
    memory::AlignedBuffer grads;   // (end − begin) gradients, unless the chunk's are resident
    std::vector<std::future<void>> io;
  };

  // Updates `chunks` (on disk, gradient writes finished) in that order, calling `chunk_done(c)`
  // once chunk c's parameters hold their new values. `threads`: the CPU Adam's (0: torch's).
  void update_on_disk_in_slices(const std::vector<std::size_t>& chunks, double lr,
                                const std::optional<torch::Tensor>& coef, int threads,
                                const std::function<void(std::size_t)>& chunk_done) {
    std::vector<OptimSlice> slices;
    for (std::size_t c : chunks) {
      const OptimChunk& chunk = optim_chunks_[c];
      for (std::int64_t at = 0; at < chunk.elements; at += kSliceElements)
        slices.push_back({c, at, std::min(chunk.elements, at + kSliceElements), {}, {}, {}});
    }
    const auto start_read = [&](OptimSlice& slice) {
      const OptimChunk& chunk = optim_chunks_[slice.chunk];
      const std::int64_t length = slice.end - slice.begin;
      const int arrays = arrays_per_chunk(chunk);
      slice.arrays = memory::AlignedBuffer(static_cast<std::size_t>(length * 4 * arrays));
      for (int k = 0; k < arrays; ++k)
        slice.io.push_back(disk_->read_range(
            chunk.region, static_cast<std::uint64_t>((k * chunk.elements + slice.begin) * 4),
            static_cast<std::uint64_t>(length * 4),
            static_cast<char*>(slice.arrays.data()) + k * length * 4));
      if (!chunk.grads) {
        slice.grads = memory::AlignedBuffer(static_cast<std::size_t>(length * element_bytes()));
        slice.io.push_back(disk_->read_range(
            chunk.grad_region, static_cast<std::uint64_t>(slice.begin * element_bytes()),
            static_cast<std::uint64_t>(length * element_bytes()), slice.grads.data()));
      }
    };
    const auto start_write = [&](OptimSlice& slice) {
      const OptimChunk& chunk = optim_chunks_[slice.chunk];
      const std::int64_t length = slice.end - slice.begin;
      slice.grads = memory::AlignedBuffer();
      for (int k = 0; k < arrays_per_chunk(chunk); ++k)
        slice.io.push_back(disk_->write_range(
            chunk.region, static_cast<std::uint64_t>((k * chunk.elements + slice.begin) * 4),
            static_cast<std::uint64_t>(length * 4),
            static_cast<char*>(slice.arrays.data()) + k * length * 4));
    };
    // After the chunk's last slice its resident gradients go.
    const auto written = [&](std::size_t i) {
      if (i + 1 < slices.size() && slices[i + 1].chunk == slices[i].chunk) return;
      OptimChunk& chunk = optim_chunks_[slices[i].chunk];
      {
        std::lock_guard lock(update_.mutex());  // memory() reads the buffer's size
        chunk.grads = memory::AlignedBuffer();
      }
      chunk.grads_on_disk = false;
      if (chunk_done) chunk_done(slices[i].chunk);
    };
    stream_update_slices(
        slices, start_read, [&](std::size_t i) { update_slice(slices[i], lr, coef, threads); },
        start_write, written);
  }

  // The CPU Adam on the parts of the chunk's tensors inside `slice`.
  void update_slice(OptimSlice& slice, double lr, const std::optional<torch::Tensor>& coef,
                    int threads) {
    OptimChunk& chunk = optim_chunks_[slice.chunk];
    const std::int64_t length = slice.end - slice.begin;
    auto* arrays = static_cast<float*>(slice.arrays.data());
    const int count = arrays_per_chunk(chunk);
    float* masters = keeps_masters(chunk) ? arrays : nullptr;
    float* exp_avg = arrays + (count - 2) * length;
    float* exp_avg_sq = exp_avg + length;
    const char* grads =
        chunk.grads ? static_cast<const char*>(chunk.grads.data()) + slice.begin * element_bytes()
                    : static_cast<const char*>(slice.grads.data());
    for (std::size_t i : chunk.entries) {
      Entry& e = entries_[i];
      if (!with_gradient_[i]) continue;  // no gradient: no update, as torch does
      const std::int64_t lo = std::max(e.optim_offset, slice.begin);
      const std::int64_t hi = std::min(e.optim_offset + e.tensor.numel(), slice.end);
      if (lo >= hi) continue;
      const std::int64_t in_slice = lo - slice.begin;
      const std::int64_t in_tensor = lo - e.optim_offset;
      if (param_chunks_[e.param_chunk].streamed()) {  // never so when pipelined
        use_parameter_chunks({e.param_chunk});
        param_chunks_[e.param_chunk].dirty = true;
      }
      CpuUpdateArrays where;
      where.exp_avg = exp_avg + in_slice;
      where.exp_avg_sq = exp_avg_sq + in_slice;
      if (masters == nullptr) {
        where.param = e.tensor.data_ptr<float>() + in_tensor;  // the parameter chunk: masters
      } else {
        where.param = masters + in_slice;
        where.bf16_copy = static_cast<std::uint16_t*>(e.tensor.data_ptr()) + in_tensor;
      }
      cpu_adamw_update(precision_
                           ->master_gradient(torch::from_blob(
                               const_cast<char*>(grads) + in_slice * element_bytes(), {hi - lo},
                               torch::TensorOptions().dtype(dtype_)))
                           .contiguous(),
                       coef, where, adamw_, lr, e.decays, steps_, threads);
      e.tensor.unsafeGetTensorImpl()->bump_version();
    }
  }

  // The device Adam (a chunk whose arrays are in device memory): torch's fused AdamW over the
  // chunk's tensors (one call per weight decay), with the gradients autograd made on the device.
  void update_on_device(OptimChunk& chunk, double lr, const std::optional<torch::Tensor>& coef) {
    float* base = arrays_of(chunk);
    const auto on_device = torch::TensorOptions(torch::kFloat32).device(tensor_device());
    const std::int64_t moments = moments_offset(chunk);
    struct Group {
      optim::FusedAdamWLists lists;
      std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // master → compute dtype
    };
    Group groups[2];  // [0] without weight decay, [1] with
    for (std::size_t i : chunk.entries) {
      Entry& e = entries_[i];
      if (!e.has_grad) continue;
      use_parameter_chunks({e.param_chunk});
      ParamChunk& pc = param_chunks_[e.param_chunk];
      if (pc.streamed()) pc.dirty = true;
      torch::Tensor g = precision_->master_gradient(e.grad).contiguous();
      if (coef) g = g * *coef;
      const auto view = [&](std::int64_t at) {
        return torch::from_blob(base + at + e.optim_offset, e.tensor.sizes(), on_device);
      };
      Group& group = groups[e.decays && adamw_.weight_decay != 0.0 ? 1 : 0];
      torch::Tensor param = e.tensor.detach();
      if (keeps_masters(chunk)) {
        group.lists.params.push_back(view(0));
        group.copies.emplace_back(group.lists.params.back(), param);
      } else {
        group.lists.params.push_back(param);
      }
      group.lists.grads.push_back(std::move(g));
      group.lists.exp_avgs.push_back(view(moments));
      group.lists.exp_avg_sqs.push_back(view(moments + chunk.elements));
      e.grad = torch::Tensor();
    }
    for (int decays = 0; decays < 2; ++decays) {
      Group& group = groups[decays];
      optim::adamw_fused_step(group.lists, lr, adamw_, decays != 0 ? adamw_.weight_decay : 0.0,
                              steps_);
      for (auto& [master, param] : group.copies) param.copy_(master);
    }
  }

  // The CPU Adam on a chunk in host memory (or streamed from disk) with a device: its masters
  // and host gradients in, the new compute-dtype values written up to the device (or into the
  // home of a parameter chunk kept in host memory that is not on the device now).
  void update_on_host(OptimChunk& chunk, double lr, const std::optional<torch::Tensor>& coef) {
    float* base = static_cast<float*>(chunk.host.data());
    std::uint16_t* low = nullptr;  // bf16 staging for the new compute-dtype values
    if (dtype_ != torch::kFloat32) {
      update_staging_.push_back(
          device_->allocate_host(static_cast<std::size_t>(chunk.elements) * 2));
      low = static_cast<std::uint16_t*>(update_staging_.back().get());
    }
    for (std::size_t i : chunk.entries) {
      Entry& e = entries_[i];
      if (!e.has_grad) continue;
      CpuUpdateArrays where;
      where.param = base + e.optim_offset;
      where.exp_avg = base + moments_offset(chunk) + e.optim_offset;
      where.exp_avg_sq = where.exp_avg + chunk.elements;
      if (low != nullptr) where.bf16_copy = low + e.optim_offset;
      cpu_adamw_update(precision_->master_gradient(gradient_view(chunk, e)).contiguous(), coef,
                       where, adamw_, lr, e.decays, steps_);
      write_parameter(e, low != nullptr ? static_cast<const void*>(where.bf16_copy)
                                        : static_cast<const void*>(where.param));
      e.tensor.unsafeGetTensorImpl()->bump_version();
    }
    chunk.grads = memory::AlignedBuffer();
    chunk.grads_on_disk = false;
  }

  // New compute-dtype values of `e` from host memory `values` (alive until the update's copies
  // are done): into the home of its parameter chunk when that is in host memory and not on the
  // device now, else up to the device on the copy stream.
  void write_parameter(const Entry& e, const void* values) {
    ParamChunk& pc = param_chunks_[e.param_chunk];
    const std::size_t bytes = static_cast<std::size_t>(e.tensor.numel() * element_bytes());
    const std::size_t at = static_cast<std::size_t>(e.param_offset * element_bytes());
    if (pc.streamed() && !pc.resident) {
      if (pc.on_disk) load_home(e.param_chunk);
      if (pc.departure) {  // its eviction's copy back into home first
        device_->host_waits(*pc.departure);
        pc.departure.reset();
      }
      std::memcpy(static_cast<char*>(pc.home.get()) + at, values, bytes);
      if (pc.on_disk) {  // to its file, once the update has moved on (at most a few held)
        pc.home_dirty = true;
        queue_home(e.param_chunk);
        settle_homes(kHomesHeld);
      }
      return;
    }
    device_->copy_to_device(static_cast<char*>(pc.storage.data_ptr()) + at, values, bytes);
    if (pc.streamed()) pc.dirty = true;
  }

  // Gradients copied down to host gradient chunks: kept alive (and their buffers untouched)
  // until the copies are done.
  void copy_gradient_down(torch::Tensor& slot, const torch::Tensor& gradient) {
    device_->copies_wait(*device_->record_compute());
    torch::Tensor source = gradient.contiguous();
    device_->copy_to_host(slot.data_ptr(), source.data_ptr(),
                          static_cast<std::size_t>(source.nbytes()));
    gradients_in_transit_.push_back(std::move(source));
    gradients_arrived_ = device_->record_copies();
  }
  void wait_for_gradient_copies() {
    if (!gradients_arrived_) return;
    device_->host_waits(*gradients_arrived_);
    gradients_arrived_.reset();
    gradients_in_transit_.clear();
  }

  // Host memory (with a device tier, device_tier_memory() has the device's share).
  MemoryByCategory memory() const override { return held_in(/*device=*/false); }

  std::optional<train::DeviceTierMemory> device_tier_memory() const override {
    if (!device_) return std::nullopt;
    return train::device_tier_memory_of(*device_, held_in(/*device=*/true));
  }

  // What the chunks hold now in device memory (`device`) or in host memory, by category.
  MemoryByCategory held_in(bool device) const {
    MemoryByCategory m;
    // Without a device tier everything is host memory, the compute device's.
    const bool compute_side = device || !device_;
    if (!device) m.weights += quantized_bytes_;  // QLoRA's base, beside the chunks
    for (const ParamChunk& c : param_chunks_) {
      const auto bytes = static_cast<std::uint64_t>(c.storage.nbytes());
      if (compute_side && c.resident) m.weights += bytes;
      if (!device && c.home) m.weights += bytes;
      if (!device && c.incoming) m.weights += bytes;
      if (!device && c.outgoing) m.weights += bytes;
    }
    // Gradients that exist now (between backward and the update; none after a step).
    if (!device) {
      std::lock_guard lock(update_.mutex());  // the pipelined update frees them as it goes
      for (const OptimChunk& c : optim_chunks_) m.gradients += c.grads.size();
    }
    if (compute_side) {
      for (std::size_t i : trainable_order_)
        if (entries_[i].grad.defined())
          m.gradients += static_cast<std::uint64_t>(entries_[i].grad.nbytes());
      for (const torch::Tensor& g : gradients_in_transit_)
        m.gradients += static_cast<std::uint64_t>(g.nbytes());
    }
    for (const OptimChunk& c : optim_chunks_) {
      if (c.on_disk || (device_ && c.on_device != device)) continue;
      const std::uint64_t floats = static_cast<std::uint64_t>(c.elements);
      m.optimizer += floats * 8;
      if (keeps_masters(c)) m.weights += floats * 4;  // float32 masters
    }
    return m;
  }

  std::optional<train::DiskTierMemory> disk_memory() const override {
    if (!disk_) return std::nullopt;
    train::DiskTierMemory d;
    d.folder = disk_->folder().string();
    d.used = disk_->bytes_on_disk();
    // The tier's files: gradient chunks, and optimizer chunks (Adam moments, and float32 masters
    // in bf16).
    for (const OptimChunk& c : optim_chunks_)
      if (c.grad_region_written) d.by_category.gradients += disk_->region_bytes(c.grad_region);
    std::uint64_t parameter_files = 0;
    for (const ParamChunk& c : param_chunks_)
      if (c.on_disk) parameter_files += disk_->region_bytes(c.region);
    const std::uint64_t optimizer_files = d.used - d.by_category.gradients - parameter_files;
    // An optimizer file's share of masters: one array in arrays_per_chunk (with its padding).
    std::uint64_t master_files = 0;
    for (const OptimChunk& c : optim_chunks_)
      if (c.on_disk && keeps_masters(c))
        master_files +=
            disk_->region_bytes(c.region) / static_cast<std::uint64_t>(arrays_per_chunk(c));
    d.by_category.weights = parameter_files + master_files;
    d.by_category.optimizer = optimizer_files - master_files;
    d.bytes_read = disk_->bytes_read();
    d.bytes_written = disk_->bytes_written();
    return d;
  }

  void release_training_state() override {
    settle_update();
    remove_gradient_hooks(entries_, trainable_order_);
    wait_for_gradient_copies();
    // The optimizer chunks' files stay until the store goes with the plugin: the parameter
    // chunks on disk share it, and are read from there for the export.
    for (OptimChunk& c : optim_chunks_)
      if (c.grad_write.valid()) c.grad_write.wait();
    gradient_writes_.clear();
    optim_chunks_.clear();
    if (!weights_in_memory()) return;
    hooked_blocks_.remove();
    disk_.reset();
  }

  bool weights_in_memory() const override {
    return std::none_of(param_chunks_.begin(), param_chunks_.end(),
                        [](const ParamChunk& c) { return c.streamed(); });
  }

  // In the model's order, each chunk fetched as its first tensor comes (through the cache, so
  // about a chunk at a time is in memory).
  void visit_weights(model::PretrainedModel& model, const WeightVisit& visit) override {
    torch::NoGradGuard no_grad;
    settle_update();
    for (const Entry& e : entries_) {
      if (e.model_name.empty()) continue;  // adapters are not the model's
      use_parameter_chunks({e.param_chunk});
      visit(e.model_name, e.tensor);
    }
    cache_.unpin();
  }

  void gather_weights() override {
    settle_update();
    cache_limit_ = param_chunks_.size();
    for (std::size_t c = 0; c < param_chunks_.size(); ++c)
      if (param_chunks_[c].streamed()) fetch_parameter_chunk(c);
    while (!parameter_writes_.empty()) finish_parameter_write(parameter_writes_.front());
    if (device_) device_->host_waits(*device_->record_copies());  // nothing reads `home` now
    home_writes_.clear();  // every chunk is on the device, newest there: the files go
    for (ParamChunk& c : param_chunks_) {
      c.on_disk = c.on_host = false;
      c.home.clear();
      c.home_dirty = c.home_queued = false;
    }
    hooked_blocks_.remove();
    disk_.reset();
  }

  std::vector<NamedTensor> trainable_weights() override {
    settle_update();
    std::vector<NamedTensor> out;
    // fp32 without masters of their own: the parameter chunks hold the masters; those on disk
    // are read from their files, once every change has reached them.
    write_back_parameter_chunks();
    for (std::size_t i : trainable_order_) {
      const Entry& e = entries_[i];
      const ParamChunk& chunk = param_chunks_[e.param_chunk];
      if (keeps_masters(optim_chunks_[e.optim_chunk]))
        out.push_back({e.name, optimizer_view(e, 0)});
      else if (chunk.on_disk)
        out.push_back({e.name, mapped_region_view(chunk.region, e.param_offset * 4, e)});
      else if (chunk.on_host)
        out.push_back({e.name, home_view(chunk, e)});
      else
        out.push_back({e.name, e.tensor});
    }
    return out;
  }

  std::vector<NamedTensor> optimizer_state() override {
    settle_update();
    std::vector<NamedTensor> out;
    if (steps_ == 0) return out;  // as AdamW: no state before the first update
    for (std::size_t i : trainable_order_) {
      const Entry& e = entries_[i];
      const std::int64_t moments = moments_offset(optim_chunks_[e.optim_chunk]);
      out.push_back({"exp_avg." + e.name, optimizer_view(e, moments)});
      out.push_back({"exp_avg_sq." + e.name,
                     optimizer_view(e, moments + optim_chunks_[e.optim_chunk].elements)});
    }
    return out;
  }

  nlohmann::json state_json() const override { return gemini_state_json(*precision_, steps_); }

  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    torch::NoGradGuard no_grad;
    settle_update();
    for (std::size_t i : trainable_order_) {
      const Entry& e = entries_[i];
      auto it = weights.find(e.name);
      if (it == weights.end())
        throw_invalid(source + ": the checkpoint has no weight \"" + e.name + "\"",
                      kResumeSameTraining);
      if (it->second.sizes() != e.tensor.sizes())
        throw_invalid(source + ": weight \"" + e.name + "\" has shape " +
                      c10::str(it->second.sizes()) + ", the model has " +
                      c10::str(e.tensor.sizes()));
    }
    if (weights.size() != trainable_order_.size())
      throw_invalid(source + ": the checkpoint holds " + std::to_string(weights.size()) +
                        " weights but this run trains " + std::to_string(trainable_order_.size()),
                    kResumeSameTraining);
    std::size_t optimizer_used = 0;
    for_each_optimizer_chunk(false, [&](OptimChunk& chunk) {
      float* base = arrays_of(chunk);
      const auto where =
          torch::TensorOptions(torch::kFloat32)
              .device(chunk.on_device ? tensor_device() : torch::Device(torch::kCPU));
      for (std::size_t i : chunk.entries) {
        Entry& e = entries_[i];
        const torch::Tensor& w = weights.at(e.name);
        const auto view = [&](std::int64_t offset) {
          return torch::from_blob(base + offset + e.optim_offset, e.tensor.sizes(), where);
        };
        use_parameter_chunks({e.param_chunk});
        param_chunks_[e.param_chunk].dirty = true;
        if (!keeps_masters(chunk)) {
          e.tensor.detach().copy_(w);
        } else {
          view(0).copy_(w);
          e.tensor.detach().copy_(view(0));
        }
        const std::int64_t moments = moments_offset(chunk);
        for (const auto& [prefix, offset] :
             {std::pair<std::string, std::int64_t>{"exp_avg.", moments},
              std::pair<std::string, std::int64_t>{"exp_avg_sq.", moments + chunk.elements}}) {
          auto m = optimizer.find(prefix + e.name);
          if (m == optimizer.end()) {
            view(offset).zero_();  // never updated: torch keeps no state for it
            continue;
          }
          if (m->second.sizes() != e.tensor.sizes())
            throw_invalid(source + ": optimizer tensor \"" + m->first + "\" has shape " +
                          c10::str(m->second.sizes()) + " but the parameter has " +
                          c10::str(e.tensor.sizes()));
          view(offset).copy_(m->second);
          ++optimizer_used;
        }
      }
    });
    cache_.unpin();
    if (optimizer_used != optimizer.size())
      throw_invalid(source + ": the optimizer state names tensors this run does not train",
                    kResumeSameTraining);
    steps_ = restore_gemini_state(*precision_, state, source);
  }

 private:
  // The compute device: the device tier's, else the CPU.
  torch::Device tensor_device() const {
    return device_ ? torch::Device(device_->tensor_device()) : torch::Device(torch::kCPU);
  }
  // Whether the chunk's arrays start with float32 masters: in bf16, and with a device tier for
  // chunks the CPU Adam updates (it never reads the parameters back from the device).
  bool keeps_masters(const OptimChunk& chunk) const {
    return dtype_ != torch::kFloat32 || (device_ && !chunk.on_device);
  }
  // Float offset of exp_avg inside an optimizer chunk's buffer (after the masters, if any).
  std::int64_t moments_offset(const OptimChunk& chunk) const {
    return keeps_masters(chunk) ? chunk.elements : 0;
  }
  int arrays_per_chunk(const OptimChunk& chunk) const { return keeps_masters(chunk) ? 3 : 2; }
  float* arrays_of(const OptimChunk& chunk) const {
    return static_cast<float*>(chunk.on_device ? chunk.device_arrays.get() : chunk.host.data());
  }
  // The current values of `e` in a parameter chunk kept in host memory, on the host.
  torch::Tensor home_view(const ParamChunk& chunk, const Entry& e) const {
    if (chunk.resident) {
      // A prefetch may still be filling it: the read is ordered after that copy.
      if (chunk.arrival) device_->compute_waits(*chunk.arrival);
      return e.tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    if (chunk.departure) device_->host_waits(*chunk.departure);
    return torch::from_blob(static_cast<char*>(chunk.home.get()) + e.param_offset * element_bytes(),
                            e.tensor.sizes(), torch::TensorOptions().dtype(dtype_));
  }
  // Bytes of one element of the compute dtype (parameter and gradient chunks).
  std::int64_t element_bytes() const { return static_cast<std::int64_t>(c10::elementSize(dtype_)); }
  std::uint64_t chunk_bytes(const OptimChunk& chunk) const {
    return static_cast<std::uint64_t>(chunk.elements) * 4 * arrays_per_chunk(chunk);
  }
  std::uint64_t gradient_chunk_bytes(const OptimChunk& chunk) const {
    return static_cast<std::uint64_t>(chunk.elements) * element_bytes();
  }
  torch::Tensor gradient_view(const OptimChunk& chunk, const Entry& e) const {
    return torch::from_blob(
        static_cast<char*>(chunk.grads.data()) + e.optim_offset * element_bytes(), e.tensor.sizes(),
        torch::TensorOptions().dtype(dtype_));
  }

  // The chunk's gradients in memory, to add to: allocated (zero) on the first gradient of a
  // step, read back when an earlier micro-batch wrote them out, kept when a write is in flight.
  void make_gradients_resident(OptimChunk& c) {
    if (c.grads) {
      if (c.grad_write.valid()) finish_gradient_write(c, true);
      c.grads_on_disk = false;
      return;
    }
    c.grads = memory::AlignedBuffer(gradient_chunk_bytes(c));
    if (c.grads_on_disk) {
      disk_->read(c.grad_region, c.grads.data()).get();
      c.grads_on_disk = false;
    }
  }

  void write_back_gradients(OptimChunk& c) {
    wait_for_gradient_copies();  // with a device: the copies down into `grads` are done
    c.grad_write = disk_->write(c.grad_region, c.grads.data());
    c.grad_region_written = true;
    c.grads_on_disk = true;
    gradient_writes_.push_back(&c);
    while (gradient_writes_.size() > kGradientWritesInFlight)
      finish_gradient_write(*gradient_writes_.front(), false);
  }

  // Waits for the chunk's gradient write; frees the buffer unless `keep`.
  void finish_gradient_write(OptimChunk& c, bool keep) {
    gradient_writes_.erase(std::find(gradient_writes_.begin(), gradient_writes_.end(), &c));
    c.grad_write.get();
    if (!keep) c.grads = memory::AlignedBuffer();
  }

  // --- Parameter chunks on disk --------------------------------------------------------------

  memory::DiskStore& disk() {
    if (!disk_) disk_ = std::make_unique<memory::DiskStore>(gemini_.offload_dir);
    return *disk_;
  }

  static c10::StorageImpl& storage_of(const ParamChunk& chunk) {
    return *chunk.storage.storage().unsafeGetStorageImpl();
  }

  // Page-aligned memory for a chunk on disk (O_DIRECT), owned by the returned pointer.
  static c10::DataPtr aligned_memory(std::size_t bytes) {
    auto* buffer = new memory::AlignedBuffer(memory::io_size(bytes));
    return {buffer->data(), buffer,
            [](void* owner) { delete static_cast<memory::AlignedBuffer*>(owner); },
            c10::Device(c10::kCPU)};
  }

  // A moved-from DataPtr keeps its raw pointer: this one is empty afterwards.
  static c10::DataPtr take(c10::DataPtr& from) {
    c10::DataPtr out = std::move(from);
    from.clear();
    return out;
  }

  // Makes `chunks` resident (waiting for what is in flight), pins them until the next use, and
  // prefetches the chunk the traced order says comes next.
  void use_parameter_chunks(const std::vector<std::size_t>& chunks) {
    cache_.pin(chunks);
    for (std::size_t c : chunks) {
      fetch_parameter_chunk(c);
      if (!param_chunks_[c].streamed()) continue;
      if (cache_.tracing())
        cache_.record(c);
      else
        prefetch_after(c);
    }
  }

  void fetch_parameter_chunk(std::size_t c) {
    ParamChunk& chunk = param_chunks_[c];
    cache_.touch(c);
    if (device_ && chunk.streamed()) {
      if (!chunk.resident) {
        if (!chunk.incoming) make_room();
        bring_to_device(chunk, c);
      }
      if (chunk.arrival) {  // the compute that follows waits for the copy, the host does not
        device_->compute_waits(*chunk.arrival);
        chunk.arrival.reset();
      }
      return;
    }
    if (!chunk.on_disk || chunk.resident) return;
    if (!chunk.incoming) make_room();
    if (chunk.outgoing) {  // evicted a moment ago: its buffer still holds the values
      finish_parameter_write(c, /*keep=*/true);
      storage_of(chunk).set_data_ptr_noswap(take(chunk.outgoing));
    } else if (chunk.incoming) {
      chunk.read.get();
      storage_of(chunk).set_data_ptr_noswap(take(chunk.incoming));
    } else {
      c10::DataPtr memory = aligned_memory(chunk.storage.nbytes());
      disk().read(chunk.region, memory.get()).get();
      storage_of(chunk).set_data_ptr_noswap(std::move(memory));
    }
    chunk.resident = true;
  }

  // After a use of `c`: read ahead the next chunk of the traced order.
  void prefetch_after(std::size_t c) {
    const std::optional<std::size_t> n = cache_.next_after(c, /*across_steps=*/true);
    if (!n) return;
    ParamChunk& next = param_chunks_[*n];
    if (next.resident || next.incoming || next.outgoing || !make_room()) return;
    cache_.touch(*n);
    if (device_ && (next.on_host || next.home)) {
      bring_to_device(next, *n);
      return;
    }
    next.incoming = aligned_memory(next.storage.nbytes());
    next.read = disk().read(next.region, next.incoming.get());
  }

  // Evicts chunks on disk that no block is using until one more fits under the cache limit
  // (memory::ChunkCachePolicy chooses which). False when everything held is in use.
  bool make_room() {
    auto holds = [this](std::size_t c) {
      const ParamChunk& chunk = param_chunks_[c];
      return chunk.streamed() && (chunk.resident || static_cast<bool>(chunk.incoming));
    };
    if (device_) settle_homes(kHomesHeld);
    return cache_.make_room(cache_limit_, holds, [this](std::size_t c) {
      ParamChunk& chunk = param_chunks_[c];
      if (chunk.incoming) {
        chunk.read.get();
        chunk.incoming.clear();
      } else {
        evict_parameter_chunk(c);
      }
    });
  }

  // Placement auto, after the first step: the process's peak during it, less the cache it held
  // then (full by the peak, which comes in backward after forward filled it), is what the rest
  // of training needs; the cache grows to what the budget leaves beside that, less the
  // headroom and one chunk of margin.
  // With a device tier the same is done on the device: its measured peak (activations and
  // workspace included on a GPU) against the device budget.
  void size_cache_to_budget() {
    std::vector<std::uint64_t> streamed;
    for (const ParamChunk& c : param_chunks_)
      if (c.streamed()) streamed.push_back(c.storage.nbytes());
    const std::uint64_t peak = device_ ? device_->measured_peak() : core::process_peak_rss();
    const std::uint64_t budget = device_ ? device_->total() : gemini_.host_budget;
    const std::optional<std::size_t> limit = cache_limit_after_peak(
        streamed, cache_limit_, peak, budget, memory::kCachedParameterChunks);
    if (!limit) return;
    cache_limit_ = *limit;
    if (device_ && log_)
      log_("info", "gemini placement auto: " + std::to_string(cache_limit_) + " of " +
                       std::to_string(streamed.size()) + " parameter chunks stay on " +
                       device_->name() + " (measured peak " + core::human_bytes(peak) + " of " +
                       core::human_bytes(budget) + ")");
  }

  // A chunk kept in host memory comes to the device: device memory, filled from `home` on the
  // copy stream; `arrival` is what its compute will wait for.
  void bring_to_device(ParamChunk& chunk, std::size_t c) {
    const std::size_t bytes = static_cast<std::size_t>(chunk.storage.nbytes());
    if (chunk.on_disk) load_home(c);
    c10::DataPtr memory = device_->allocate(bytes, "parameter chunk " + std::to_string(c));
    if (chunk.departure) {
      // Its eviction's copy back is ahead on the same stream: nothing to wait for.
      chunk.departure.reset();
    }
    device_->copy_to_device(memory.get(), chunk.home.get(), bytes);
    chunk.arrival = chunk.home_read = device_->record_copies();
    storage_of(chunk).set_data_ptr_noswap(std::move(memory));
    chunk.resident = true;
  }

  // --- Parameter chunks on disk with a device -------------------------------------------------
  // The file is the chunk's home; `home` is a host copy while the chunk is on the device (the
  // source of its copy up, the destination of its copy back) or being updated by the CPU Adam.
  // Leaving the device, a chunk's home is queued (home_writes_): written to its file once the
  // copy back is done, or dropped once the copy up that read it is; at most kHomesHeld wait,
  // so a step never waits on the device for them unless more are in flight.

  static constexpr std::size_t kHomesHeld = 2;

  // `home` of chunk `c` in host memory: kept, taken back from a write-back or a read ahead, or
  // read from its file.
  void load_home(std::size_t c) {
    ParamChunk& chunk = param_chunks_[c];
    if (chunk.home) return;
    if (chunk.outgoing) {
      finish_parameter_write(c, /*keep=*/true);
      chunk.home = take(chunk.outgoing);
    } else if (chunk.incoming) {
      chunk.read.get();
      chunk.home = take(chunk.incoming);
    } else {
      chunk.home = aligned_memory(static_cast<std::size_t>(chunk.storage.nbytes()));
      disk().read(chunk.region, chunk.home.get()).get();
    }
  }

  void queue_home(std::size_t c) {
    ParamChunk& chunk = param_chunks_[c];
    if (chunk.home_queued) return;
    chunk.home_queued = true;
    home_writes_.push_back(c);
  }

  // Settles queued homes, oldest first: those whose copies are done (any, when `held` is 0)
  // without waiting, then the oldest ones waiting until at most `held` remain. A chunk back on
  // the device keeps its home (and its unwritten values) and leaves the queue.
  void settle_homes(std::size_t held) {
    std::deque<std::size_t> waiting;
    for (std::size_t c : home_writes_) {
      ParamChunk& chunk = param_chunks_[c];
      if (chunk.resident) {
        chunk.home_queued = false;
        continue;
      }
      const std::shared_ptr<train::DeviceEvent>& copy =
          chunk.home_dirty ? chunk.departure : chunk.home_read;
      if (copy && !device_->done(*copy)) {
        waiting.push_back(c);
        continue;
      }
      settle_home(c);
    }
    while (waiting.size() > held) {
      settle_home(waiting.front());
      waiting.pop_front();
    }
    home_writes_ = std::move(waiting);
  }

  // Writes the home of queued chunk `c` to its file (a write-back in flight, as the CPU's
  // evictions) or, unchanged, drops it — once its copies are done.
  void settle_home(std::size_t c) {
    ParamChunk& chunk = param_chunks_[c];
    chunk.home_queued = false;
    if (chunk.departure) device_->host_waits(*chunk.departure);
    if (chunk.home_read) device_->host_waits(*chunk.home_read);
    chunk.departure.reset();
    chunk.home_read.reset();
    if (!chunk.home_dirty) {
      chunk.home.clear();
      return;
    }
    chunk.home_dirty = false;
    chunk.outgoing = take(chunk.home);
    chunk.write = disk().write(chunk.region, chunk.outgoing.get());
    parameter_writes_.push_back(c);
    while (parameter_writes_.size() > kParameterWritesInFlight)
      finish_parameter_write(parameter_writes_.front());
  }

  void evict_parameter_chunk(std::size_t c) {
    ParamChunk& chunk = param_chunks_[c];
    if (device_) {
      // Back to `home` when the update changed it (after the compute that wrote it); the device
      // memory is freed in stream order, so nothing waits here. A chunk on disk queues its home
      // for its file.
      c10::DataPtr memory =
          storage_of(chunk).set_data_ptr(c10::DataPtr(nullptr, device_->tensor_device()));
      chunk.resident = false;
      chunk.arrival.reset();
      if (chunk.dirty) {
        device_->copies_wait(*device_->record_compute());
        device_->copy_to_host(chunk.home.get(), memory.get(),
                              static_cast<std::size_t>(chunk.storage.nbytes()));
        chunk.departure = device_->record_copies();
        chunk.dirty = false;
        if (chunk.on_disk) chunk.home_dirty = true;
      }
      if (chunk.on_disk) queue_home(c);
      return;
    }
    c10::DataPtr memory = storage_of(chunk).set_data_ptr(c10::DataPtr(nullptr, c10::kCPU));
    chunk.resident = false;
    if (!chunk.dirty) return;  // the file has these values: the memory just goes
    chunk.outgoing = std::move(memory);
    chunk.write = disk().write(chunk.region, chunk.outgoing.get());
    chunk.dirty = false;
    parameter_writes_.push_back(c);
    while (parameter_writes_.size() > kParameterWritesInFlight)
      finish_parameter_write(parameter_writes_.front());
  }

  // Waits for the write-back of chunk `c`; frees its buffer unless `keep`.
  void finish_parameter_write(std::size_t c, bool keep = false) {
    parameter_writes_.erase(std::find(parameter_writes_.begin(), parameter_writes_.end(), c));
    ParamChunk& chunk = param_chunks_[c];
    chunk.write.get();
    if (!keep) chunk.outgoing.clear();
  }

  // Every change to a parameter chunk on disk reaches its file (for checkpoints, which read
  // the files).
  void write_back_parameter_chunks() {
    if (device_) {
      // Chunks on the device with changes come down into their homes; every home the file
      // does not have yet is written.
      bool copied = false;
      for (ParamChunk& chunk : param_chunks_) {
        if (!chunk.on_disk || !chunk.resident || !chunk.dirty) continue;
        if (!copied) device_->copies_wait(*device_->record_compute());
        copied = true;
        device_->copy_to_host(chunk.home.get(), chunk.storage.data_ptr(),
                              static_cast<std::size_t>(chunk.storage.nbytes()));
        chunk.dirty = false;
        chunk.home_dirty = true;
      }
      if (copied) device_->host_waits(*device_->record_copies());
      settle_homes(0);
      while (!parameter_writes_.empty()) finish_parameter_write(parameter_writes_.front());
      for (ParamChunk& chunk : param_chunks_) {
        if (!chunk.on_disk || !chunk.home_dirty) continue;  // resident ones
        disk().write(chunk.region, chunk.home.get()).get();
        chunk.home_dirty = false;
      }
      return;
    }
    while (!parameter_writes_.empty()) finish_parameter_write(parameter_writes_.front());
    for (ParamChunk& chunk : param_chunks_) {
      if (!chunk.on_disk || !chunk.resident || !chunk.dirty) continue;
      disk().write(chunk.region, chunk.storage.data_ptr()).get();
      chunk.dirty = false;
    }
  }

  memory::ChunkLayout layout_for(const std::vector<std::size_t>& which,
                                 std::int64_t element_bytes) const {
    std::vector<std::int64_t> numels;
    std::vector<std::string> names;
    for (std::size_t i : which) {
      numels.push_back(entries_[i].tensor.numel());
      names.push_back(entries_[i].name);
    }
    return memory::pack_gemini_chunks(numels, names, element_bytes, gemini_.chunk_bytes);
  }

  void build_optimizer_chunks() {
    const memory::ChunkLayout layout = layout_for(trainable_order_, 4);
    std::vector<std::uint64_t> sizes;
    for (const auto& spec : layout.chunks) {
      OptimChunk chunk;
      chunk.elements = spec.used;
      for (const memory::ChunkSlot& slot : spec.slots) {
        const std::size_t entry = trainable_order_[slot.tensor];
        entries_[entry].optim_chunk = optim_chunks_.size();
        entries_[entry].optim_offset = slot.offset;
        chunk.entries.push_back(entry);
      }
      // Every chunk has the same arrays per element until placed: elements rank them alike.
      sizes.push_back(static_cast<std::uint64_t>(chunk.elements));
      optim_chunks_.push_back(std::move(chunk));
    }
    // Static placement: the last chunks (by bytes) go to disk, as close to the fraction as
    // whole chunks allow; with a device, the last of the others to host memory likewise, and
    // the rest stay on the device.
    const std::vector<bool> on_disk = choose_offloaded_chunks(sizes, gemini_.offload_optim_frac);
    std::vector<bool> not_on_disk(on_disk.size());
    for (std::size_t c = 0; c < on_disk.size(); ++c) not_on_disk[c] = !on_disk[c];
    const std::vector<bool> on_host =
        device_ ? choose_offloaded_chunks(sizes, gemini_.host_optim_frac, not_on_disk)
                : not_on_disk;
    for (std::size_t c = 0; c < optim_chunks_.size(); ++c) {
      optim_chunks_[c].on_disk = on_disk[c];
      optim_chunks_[c].on_device = device_ && !on_disk[c] && !on_host[c];
      // The arrays of a chunk on disk are padded to whole slices, so that the update's
      // ranges are aligned (update_on_disk_in_slices).
      if (on_disk[c] && !device_)
        optim_chunks_[c].elements = memory::sliced_array_elements(optim_chunks_[c].elements);
    }

    // Fill each chunk (masters from the float32 values; zero moments), then park it.
    for (std::size_t c = 0; c < optim_chunks_.size(); ++c) {
      OptimChunk& chunk = optim_chunks_[c];
      const auto bytes = static_cast<std::size_t>(chunk_bytes(chunk));
      if (chunk.on_device) {
        chunk.device_arrays = device_->allocate(bytes, "optimizer chunk " + std::to_string(c));
        torch::from_blob(chunk.device_arrays.get(), {static_cast<std::int64_t>(bytes / 4)},
                         torch::TensorOptions(torch::kFloat32).device(tensor_device()))
            .zero_();
      } else {
        chunk.host = memory::AlignedBuffer(bytes);
      }
      if (keeps_masters(chunk)) {
        float* base = arrays_of(chunk);
        const auto where =
            torch::TensorOptions(torch::kFloat32)
                .device(chunk.on_device ? tensor_device() : torch::Device(torch::kCPU));
        for (std::size_t i : chunk.entries) {
          const Entry& e = entries_[i];
          fill_entry(deferred_, e,
                     torch::from_blob(base + e.optim_offset, e.tensor.sizes(), where));
        }
      }
      if (chunk.on_disk) {
        chunk.grad_region =
            disk().add_region("gradient chunk " + std::to_string(c), gradient_chunk_bytes(chunk));
        chunk.region =
            disk().add_region("optimizer chunk " + std::to_string(c), chunk_bytes(chunk));
        disk_->write(chunk.region, chunk.host.data()).get();
        chunk.host = memory::AlignedBuffer();
      }
    }
  }

  void build_parameter_chunks(model::PretrainedModel& model,
                              const std::vector<BlockEntries>& blocks) {
    // The blocks that fetch their parameters (model::ParameterUse), by parameter.
    const std::vector<bool> fetched = fetched_entries(blocks, entries_.size());

    std::vector<std::size_t> all(entries_.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    const memory::ChunkLayout layout = layout_for(all, element_bytes());
    param_chunks_.resize(layout.chunks.size());
    cache_.resize(param_chunks_.size());
    // A chunk holding adapters, or a tensor no block fetches, never goes to disk.
    std::vector<std::uint64_t> capacities;
    std::vector<bool> may_go_to_disk;
    for (const auto& spec : layout.chunks) {
      capacities.push_back(static_cast<std::uint64_t>(spec.capacity));
      may_go_to_disk.push_back(
          std::all_of(spec.slots.begin(), spec.slots.end(),
                      [&](const memory::ChunkSlot& slot) { return fetched[slot.tensor]; }));
    }
    // Static placement: the last chunks (by bytes) go to disk, as close to the fraction as whole
    // chunks allow; they are the first ones backward needs, while still cached from forward.
    // With a device, chunks kept in host memory are chosen the same way (none on disk then).
    const std::vector<bool> on_disk =
        choose_offloaded_chunks(capacities, gemini_.offload_param_frac, may_go_to_disk);
    // With a device, the share kept in host memory comes from the chunks not on disk.
    std::vector<bool> may_stay_on_host = may_go_to_disk;
    for (std::size_t c = 0; c < on_disk.size(); ++c)
      may_stay_on_host[c] = may_go_to_disk[c] && !on_disk[c];
    const std::vector<bool> on_host =
        device_ ? choose_offloaded_chunks(capacities, gemini_.host_param_frac, may_stay_on_host)
                : std::vector<bool>(capacities.size(), false);
    for (std::size_t c = 0; c < param_chunks_.size(); ++c) {
      param_chunks_[c].on_disk = on_disk[c];
      param_chunks_[c].on_host = on_host[c];
    }

    // Fill each chunk (from the checkpoint or the float32 values); one on disk is written to
    // its file and leaves memory at once, so no more than one is in memory while loading. With
    // a device, a chunk on it is filled in device memory, one kept in host memory in its home.
    for (std::size_t c = 0; c < layout.chunks.size(); ++c) {
      const memory::ChunkSpec& spec = layout.chunks[c];
      ParamChunk& chunk = param_chunks_[c];
      chunk.storage = torch::empty({device_ ? 0 : spec.capacity},
                                   torch::TensorOptions().dtype(dtype_).device(tensor_device()));
      if (device_) {
        // The storage's memory is the tier's (none yet for a chunk kept in host memory).
        const auto bytes = static_cast<std::size_t>(spec.capacity * element_bytes());
        storage_of(chunk).set_nbytes(bytes);
        if (chunk.on_host)
          chunk.home = device_->allocate_host(bytes);
        else if (chunk.on_disk)  // filled in host memory, written, and dropped
          chunk.home = aligned_memory(bytes);
        else
          storage_of(chunk).set_data_ptr_noswap(
              device_->allocate(bytes, "parameter chunk " + std::to_string(c)));
        chunk.storage.unsafeGetTensorImpl()->set_sizes_contiguous({spec.capacity});
      }
      if (chunk.on_disk) {
        if (!device_) storage_of(chunk).set_data_ptr_noswap(aligned_memory(chunk.storage.nbytes()));
        chunk.region = disk().add_region("parameter chunk " + std::to_string(c),
                                         static_cast<std::uint64_t>(chunk.storage.nbytes()));
      }
      for (const memory::ChunkSlot& slot : spec.slots) {
        Entry& e = entries_[slot.tensor];
        torch::Tensor view =
            chunk.storage.narrow(0, slot.offset, slot.numel).view(e.tensor.sizes());
        if (chunk.home)
          fill_entry(
              deferred_, e,
              torch::from_blob(static_cast<char*>(chunk.home.get()) + slot.offset * element_bytes(),
                               e.tensor.sizes(), torch::TensorOptions().dtype(dtype_)));
        else
          fill_entry(deferred_, e, view);
        e.tensor.set_data(view);
        e.param_chunk = c;
        e.param_offset = slot.offset;
      }
      if (chunk.on_disk && device_) {
        disk().write(chunk.region, chunk.home.get()).get();
        chunk.home.clear();
      } else if (chunk.on_disk) {
        disk().write(chunk.region, chunk.storage.data_ptr()).get();
        storage_of(chunk).set_data_ptr_noswap(c10::DataPtr(nullptr, c10::kCPU));
      }
      if (chunk.streamed()) chunk.resident = false;  // on the device when first used
    }

    // Blocks with a parameter on disk (or away from the device) fetch their chunks when they
    // compute.
    chunk_fetch_ = std::make_shared<ChunkUseHook>(
        chunks_by_block(
            blocks, [&](std::size_t i) { return std::optional(entries_[i].param_chunk); },
            [&](std::size_t c) { return param_chunks_[c].streamed(); }),
        [this](const std::vector<std::size_t>& chunks) { use_parameter_chunks(chunks); },
        [this] { cache_.unpin(); });
    hooked_blocks_.set(blocks, chunk_fetch_->chunks(), chunk_fetch_);
  }

  // Pipelines the update of optimizer chunks on disk with the next forward when every parameter
  // chunk stays in memory and there is no device tier (the update would otherwise share the
  // chunk cache or the device's streams with the forward): every block with a parameter in such
  // a chunk waits for it (UpdateWait); a chunk with a tensor no block uses is updated in step().
  void install_update_waits(const std::vector<BlockEntries>& blocks) {
    waited_for_.assign(optim_chunks_.size(), false);
    if (device_ || std::any_of(param_chunks_.begin(), param_chunks_.end(),
                               [](const ParamChunk& c) { return c.streamed(); }))
      return;
    std::vector<bool> covered(entries_.size(), false);
    for (const BlockEntries& b : blocks)
      for (std::size_t i : b.entries) covered[i] = true;
    for (std::size_t c = 0; c < optim_chunks_.size(); ++c)
      waited_for_[c] = optim_chunks_[c].on_disk &&
                       std::all_of(optim_chunks_[c].entries.begin(), optim_chunks_[c].entries.end(),
                                   [&](std::size_t i) { return covered[i]; });
    const auto behind =
        static_cast<std::size_t>(std::count(waited_for_.begin(), waited_for_.end(), true));
    pipelined_ = behind > 0;  // LoRA: its adapters are in no block, all updated in step()
    if (!pipelined_) return;
    update_wait_ = std::make_shared<BlockEnterHook>(
        [this](const torch::nn::Module& block) { wait_for_update(block); });
    block_optim_chunks_ = chunks_by_block(
        blocks,
        [&](std::size_t i) {
          const Entry& e = entries_[i];
          return e.trainable ? std::optional(e.optim_chunk) : std::nullopt;
        },
        [&](std::size_t c) { return waited_for_[c]; });
    hooked_blocks_.set(blocks, block_optim_chunks_, update_wait_);
    if (log_)
      log_("info", "gemini: the update of " + std::to_string(behind) +
                       " optimizer chunks on disk runs behind the next forward, each block "
                       "waiting for its own");
  }

  // Runs `body` on every optimizer chunk in order with its buffer resident (and, `with_gradients`,
  // its gradient chunk), streamed through disk_chunks.h. Gradient chunks are read, never written
  // back: the update consumes them.
  template <typename Body>
  void for_each_optimizer_chunk(bool with_gradients, Body&& body) {
    memory::DiskStore* store = disk_.get();
    DiskChunkTransfers io;
    io.on_disk = [&](std::size_t c) { return optim_chunks_[c].on_disk; };
    io.read = [&, store](std::size_t c) {
      OptimChunk& chunk = optim_chunks_[c];
      std::vector<std::future<void>> reads;
      chunk.host = memory::AlignedBuffer(chunk_bytes(chunk));
      reads.push_back(store->read(chunk.region, chunk.host.data()));
      if (with_gradients && !chunk.grads && chunk.grads_on_disk) {
        chunk.grads = memory::AlignedBuffer(gradient_chunk_bytes(chunk));
        reads.push_back(store->read(chunk.grad_region, chunk.grads.data()));
      }
      return reads;
    };
    // Gradients written back late in backward may still be in memory: use them there.
    io.arrived = [&](std::size_t c) {
      if (with_gradients && optim_chunks_[c].grad_write.valid())
        finish_gradient_write(optim_chunks_[c], true);
    };
    io.write = [&, store](std::size_t c) {
      std::vector<std::future<void>> writes;
      writes.push_back(store->write(optim_chunks_[c].region, optim_chunks_[c].host.data()));
      return writes;
    };
    io.written = [&](std::size_t c) {
      // The update's copies up to the device read this buffer: they finish first.
      if (device_) device_->host_waits(*device_->record_copies());
      optim_chunks_[c].host = memory::AlignedBuffer();
    };
    stream_disk_chunks(optim_chunks_.size(), io, [&](std::size_t c) { body(optim_chunks_[c]); });
  }

  // A float32 tensor over the optimizer state of `e` at array offset `offset` (0: masters):
  // host memory for host chunks, a read-only map of the region file for disk chunks.
  torch::Tensor optimizer_view(const Entry& e, std::int64_t offset) const {
    const OptimChunk& chunk = optim_chunks_[e.optim_chunk];
    if (!chunk.on_disk) {
      const auto where =
          torch::TensorOptions(torch::kFloat32)
              .device(chunk.on_device ? tensor_device() : torch::Device(torch::kCPU));
      return torch::from_blob(arrays_of(chunk) + offset + e.optim_offset, e.tensor.sizes(), where);
    }
    return mapped_region_view(chunk.region, (offset + e.optim_offset) * 4, e);
  }

  // A float32 tensor shaped like `e` at `byte_offset` in a read-only map of a region's file.
  torch::Tensor mapped_region_view(std::size_t region, std::int64_t byte_offset,
                                   const Entry& e) const {
    return mapped_file_tensor(disk_->region_path(region), byte_offset, e.tensor.sizes(),
                              torch::kFloat32);
  }

  train::ProcessContext process_;
  // The device tier (device "simulated" in tests): declared first, so that the chunks' device
  // memory goes before it.
  std::unique_ptr<train::DeviceTier> device_;
  std::function<void(const std::string&, const std::string&)> log_;  // may be empty
  std::vector<c10::DataPtr> update_staging_;         // host buffers the update's copies read
  std::vector<torch::Tensor> gradients_in_transit_;  // device gradients being copied down
  std::shared_ptr<train::DeviceEvent> gradients_arrived_;
  std::optional<train::MixedPrecision> precision_;  // set by prepare()
  torch::Dtype dtype_ = torch::kFloat32;
  optim::AdamWOptions adamw_;
  GeminiOptions gemini_;
  const model::DeferredWeights* deferred_ = nullptr;  // during prepare() only
  std::vector<Entry> entries_;
  std::uint64_t quantized_bytes_ = 0;  // QLoRA: the base's quantized Linears, held by the layers
  std::vector<std::size_t> trainable_order_;  // entries_ index of each trainable tensor, in the
                                              // order prepare() was given them
  std::vector<ParamChunk> param_chunks_;
  std::vector<OptimChunk> optim_chunks_;
  std::unique_ptr<memory::DiskStore> disk_;
  std::deque<OptimChunk*> gradient_writes_;   // gradient write-backs in flight, oldest first
  std::deque<std::size_t> parameter_writes_;  // parameter chunk write-backs in flight
  // With a device: chunks on disk whose homes wait for their copies (settle_homes).
  std::deque<std::size_t> home_writes_;
  // The chunks each block with a parameter on disk fetches; the blocks with a hook of ours.
  std::shared_ptr<ChunkUseHook> chunk_fetch_;
  HookedBlocks hooked_blocks_;
  // Which parameter chunks on disk stay cached and which are read ahead: the order the first
  // step used them in; the block computing now pins its chunks.
  memory::ChunkCachePolicy cache_;
  std::size_t cache_limit_ = memory::kCachedParameterChunks;
  bool last_micro_batch_ = false;
  std::int64_t steps_ = 0;
  // The update (update()): which entries it changes (their gradient arrived).
  std::vector<char> with_gradient_;
  // The pipelined update (start_pipelined_update): whether it is on, the chunks each block
  // waits for, which chunks are left to it. Its worker (its mutex guards chunk.grads) is declared
  // last, so that it ends before anything it uses goes.
  bool pipelined_ = false;
  std::vector<bool> waited_for_;
  std::shared_ptr<BlockEnterHook> update_wait_;
  BlockChunks block_optim_chunks_;
  UpdatePipeline update_;
};

}  // namespace

std::unique_ptr<train::Plugin> make_one_process_gemini() {
  return std::make_unique<GeminiPlugin>();
}

}  // namespace tessera::plugins
