// The `zero` plugin: ZeRO stages 1 and 2 over the data-parallel group (written from the ZeRO
// paper's description and DeepSpeed's / Colossal-AI's documented behaviour, on engine/dist's
// collectives and the gradient buckets ddp uses).
#include "plugins/zero/zero_plugin.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "dist/parallel_context.h"
#include "optim/clip.h"
#include "parallel/gradient_buckets.h"
#include "train/dense_training.h"
#include "train/device_tier.h"
#include "train/mixed_precision.h"
#include "train/param_groups.h"
#include "train/plugin_registry.h"

namespace tessera::train {
namespace {

class ZeroPlugin : public Plugin {
 public:
  std::string name() const override { return "zero"; }
  bool runs_distributed() const override { return true; }
  StateLayout state_layout() const override { return StateLayout::Sharded; }

  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const PluginOptions& options) override {
    const ProcessContext& process = options.process;
    if (process.world_size < 1 || process.rank < 0 || process.rank >= process.world_size)
      throw_invalid("strategy zero: rank " + std::to_string(process.rank) + " of " +
                    std::to_string(process.world_size) + " processes is not a place in the job");
    if (process.world_size > 1 && (!process.parallel || process.data_group == nullptr))
      throw Error(ErrorKind::Internal,
                  "strategy zero: rank " + std::to_string(process.rank) + " of " +
                      std::to_string(process.world_size) +
                      " processes has no data-parallel group (ProcessContext::data_group)",
                  "start the job with `tessera-cli launch`, which joins the ranks");
    process_ = process;
    group_ = process.world_size > 1 ? process.data_group : nullptr;
    rank_ = process.rank;
    world_ = process.world_size;
    // On a GPU (device "cuda", or "auto" with a GPU for each rank of this machine): rank r on GPU
    // LOCAL_RANK, its collectives over NCCL (as ddp). The tests' simulated device computes on
    // the CPU, with ZeRO-Offload's copies through it.
    const std::string device = train::choose_plugin_device(options, name());
    const bool simulated = device == "simulated";
    if (device == "cuda")
      device_ = train::rank_cuda_device(options, name());
    else if (!simulated)
      train::require_cpu_device(options, name());
    read_options(options);
    if (simulated && !offload_requested_)
      throw_invalid(
          "strategy zero: strategy.options.device \"simulated\" is for ZeRO-Offload's "
          "tests",
          "set offload_optimizer true, or use device cpu");
    // ZeRO-Offload: on a GPU the masters and moments of this rank's shares live in host memory
    // and the fused CPU Adam updates them; the gradients come down and the new values go up
    // through the device tier's copy stream (tier_), one copy per tensor, queued together.
    offloaded_ = offload_requested_ && (device_.is_cuda() || simulated);
    if (offloaded_)
      // It allocates no device memory (the budget is never drawn on): host buffers and copies.
      tier_ =
          train::make_device_tier(simulated ? device : device_.str(),
                                  simulated ? kSimulatedTierBudget : 0, "strategy.options.device");
    if (offload_requested_ && !offloaded_ && options.log)
      options.log("warning",
                  "strategy.options.offload_optimizer: this job computes on the CPU, so the "
                  "optimizer state is in host memory and updated by the CPU Adam already; the "
                  "option changes nothing here");
    const torch::Device master_device = offloaded_ ? torch::Device(torch::kCPU) : device_;

    precision_.emplace(options.precision, device_);
    dtype_ = precision_->compute_dtype();
    torch::NoGradGuard no_grad;
    std::set<const void*> trainable_impls;
    for (const NamedTensor& t : trainable) trainable_impls.insert(t.tensor.unsafeGetTensorImpl());
    for (auto& p : model.parameters())
      if (!trainable_impls.count(p.unsafeGetTensorImpl())) p.set_requires_grad(false);
    // Every rank starts from rank 0's values, before anything is rounded (on a GPU through it).
    parallel::broadcast_from_rank0(group_, model, trainable, device_);

    // Masters of this rank's shares from the loaded values (bf16: before rounding).
    shares_.clear();
    masters_.clear();
    for (const NamedTensor& t : trainable)
      shares_.push_back(element_share(t.tensor.numel(), rank_, world_));
    if (offloaded_) allocate_host_buffers();
    for (std::size_t i = 0; i < trainable.size(); ++i) {
      const NamedTensor& t = trainable[i];
      const ElementShare& s = shares_[i];
      torch::Tensor master;
      if (offloaded_) {
        master = host_share_of(host_masters_, i);
        master.copy_(t.tensor.detach().reshape(-1).narrow(0, s.start, s.count));
      } else if (separate_masters()) {
        master = t.tensor.detach()
                     .reshape(-1)
                     .narrow(0, s.start, s.count)
                     .to(master_device, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
      }
      masters_.push_back({t.name, master});
    }
    model.to(device_, dtype_);
    for (NamedTensor& t : trainable) {
      if (t.tensor.device() != device_ || t.tensor.scalar_type() != dtype_ ||
          !t.tensor.is_contiguous())
        t.tensor.set_data(t.tensor.to(device_, dtype_).contiguous());
      t.tensor.set_requires_grad(true);
    }
    params_ = std::move(trainable);
    // fp32 on one device: the masters are this rank's range of the compute tensors themselves,
    // updated in place; the other ranks' ranges come from the all-gather.
    if (!separate_masters())
      for (std::size_t i = 0; i < params_.size(); ++i) masters_[i].tensor = own_range(i);

    // AdamW over the non-empty shares, grouped for weight decay as transformers' Trainer does.
    const std::vector<bool> decays = train::decays_weight(model, params_);
    std::vector<NamedTensor> owned;
    std::vector<bool> owned_decays;
    std::vector<torch::Tensor> copies;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (shares_[i].count == 0) continue;
      owned.push_back(masters_[i]);
      owned_decays.push_back(decays[i]);
    }
    optimizer_ = std::make_unique<optim::AdamW>(
        train::split_by_decay(owned, owned_decays, options.adamw.weight_decay), options.adamw);
    if (separate_masters() && !offloaded_) {
      // The update writes this rank's range of the compute copy in the same pass.
      std::map<std::string, std::size_t> index_of;
      for (std::size_t i = 0; i < params_.size(); ++i) index_of[params_[i].name] = i;
      for (const NamedTensor& m : optimizer_->params())
        copies.push_back(own_range(index_of.at(m.name)));
      optimizer_->set_compute_copies(std::move(copies));
    }

    model_weight_bytes_ = model_and_adapter_bytes(model, params_);

    if (stage_ == 2) {
      std::vector<std::int64_t> counts;
      for (const ElementShare& s : shares_) counts.push_back(s.count);
      gradient_shares_ = parallel::GradientShares(counts, device_);
    }

    parallel::GradientBuckets::Options bucket_options;
    bucket_options.plugin = name();
    bucket_options.cap_bytes = bucket_cap_;
    bucket_options.segments = world_;
    if (stage_ == 2) {
      bucket_options.collective = parallel::GradientBuckets::Collective::ReduceScatterMean;
      bucket_options.buffers = parallel::GradientBuckets::Buffers::PerBackward;
      // Two buckets in flight: one filling while the previous one is reduced.
      bucket_options.max_in_flight = 2;
      bucket_options.consume = [this](std::size_t, parallel::GradientBuckets::Bucket& bucket) {
        gradient_shares_.add(*buckets_, bucket);
      };
    }
    buckets_ = std::make_unique<parallel::GradientBuckets>(
        params_, [this] { return precision_->gradient_divisor(); }, group_, bucket_options);
  }

  torch::Device device() const override { return device_; }
  torch::Dtype compute_dtype() const override { return dtype_; }
  const ProcessContext& process() const override { return process_; }

  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) override {
    const double factor = precision_->backward_multiplier(multiplier);
    // Stage 1 communicates on the last micro-batch only (earlier ones accumulate into .grad, as
    // ddp); stage 2 reduce-scatters every micro-batch, so no whole gradient outlives it.
    if (stage_ == 1 && !last_micro_batch) {
      (loss * factor).backward();
      return;
    }
    buckets_->start();
    try {
      (loss * factor).backward();
    } catch (...) {
      buckets_->abandon();
      throw;
    }
    buckets_->finish();
    if (stage_ == 2) buckets_->adopt_learned_order();  // its buffers are gone already
    if (last_micro_batch) reduced_ = true;
  }

  StepStats step(double lr, double max_grad_norm) override {
    if (!reduced_)
      throw Error(ErrorKind::Internal,
                  "strategy zero: step() before a backward of the last micro-batch");
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> gradients;
    std::vector<torch::Tensor> norms;
    // Offloaded: the shares' gradients go down to the CPU Adam beside its masters, queued on the
    // copy stream before the norms, which the compute stream works out meanwhile.
    const std::shared_ptr<DeviceEvent> gradients_down =
        offloaded_ ? copy_gradients_down() : nullptr;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (shares_[i].count == 0) continue;
      torch::Tensor g = own_gradient(i);
      norms.push_back(optim::norm_in_float64(g));
      if (offloaded_) g = host_share_of(host_gradients_, i);
      masters_[i].tensor.mutable_grad() = g;
      gradients.push_back(g);
    }
    // The share norms in one transfer from the device, summed in order on the host.
    double local_squares = 0.0;
    if (!norms.empty()) {
      const torch::Tensor on_host = torch::stack(norms).to(torch::kCPU);
      const double* norm = on_host.data_ptr<double>();
      for (std::int64_t i = 0; i < on_host.numel(); ++i) local_squares += norm[i] * norm[i];
    }
    if (gradients_down) tier_->host_waits(*gradients_down);
    // The global norm: every rank's squared share norms summed, so every rank clips alike.
    torch::Tensor squares = torch::tensor({local_squares}, torch::kFloat64);
    if (group_ != nullptr) group_->all_reduce(squares, dist::ReduceOp::Sum);
    const torch::Tensor total =
        torch::sqrt(squares).to(torch::kFloat32).reshape({});  // as torch's float32 total
    StepStats stats;
    stats.grad_norm = optim::apply_clip_coefficient(gradients, total, max_grad_norm);
    stats.applied = precision_->accept_step(stats.grad_norm);
    if (stats.applied) {
      optimizer_->step(lr);
      if (offloaded_) copy_values_up();  // into this rank's range of the compute tensors
    }
    for (NamedTensor& m : masters_)
      if (m.tensor.defined()) m.tensor.mutable_grad() = torch::Tensor();
    for (NamedTensor& p : params_) p.tensor.mutable_grad() = torch::Tensor();
    if (stage_ == 2) gradient_shares_.zero();
    reduced_ = false;
    if (stats.applied) gather_parameters();
    if (stage_ == 1) buckets_->adopt_learned_order();
    return stats;
  }

  MemoryByCategory memory() const override {
    MemoryByCategory m = host_share();
    m.weights += model_weight_bytes_ + (offloaded_ ? 0 : master_bytes());
    m.gradients += gradient_bytes();
    if (!offloaded_) m.optimizer = optimizer_ ? optimizer_->state_bytes() : 0;
    return m;
  }

  // ZeRO-Offload's host memory: the masters and the new values on their way up (weights), the
  // gradients come down (gradients), the moments (optimizer).
  MemoryByCategory host_share() const override {
    MemoryByCategory m;
    if (!offloaded_) return m;
    m.weights = bytes_of(host_masters_) + bytes_of(host_values_);
    m.gradients = bytes_of(host_gradients_);
    m.optimizer = optimizer_ ? optimizer_->state_bytes() : 0;
    return m;
  }

  void release_training_state() override {
    if (values_up_) tier_->host_waits(*values_up_);  // the copies read the host buffers
    values_up_.reset();
    buckets_.reset();
    optimizer_.reset();
    masters_.clear();
    host_masters_ = host_gradients_ = host_values_ = torch::Tensor();
    gradient_shares_ = parallel::GradientShares();
  }

  std::vector<NamedTensor> trainable_weights() override {
    std::vector<NamedTensor> out;
    for (std::size_t i = 0; i < masters_.size(); ++i)
      if (shares_[i].count > 0) out.push_back(masters_[i]);
    return out;
  }
  std::vector<NamedTensor> optimizer_state() override { return optimizer_->state_tensors(); }
  std::map<std::string, StateSlice> state_slices() const override {
    std::map<std::string, StateSlice> slices;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto sizes = params_[i].tensor.sizes();
      const StateSlice slice{std::vector<std::int64_t>(sizes.begin(), sizes.end()),
                             shares_[i].start, shares_[i].count};
      slices[params_[i].name] = slice;
      slices["exp_avg." + params_[i].name] = slice;
      slices["exp_avg_sq." + params_[i].name] = slice;
    }
    return slices;
  }
  nlohmann::json state_json() const override {
    nlohmann::json state = {{"optimizer_steps", optimizer_->steps_taken()}};
    precision_->write_state(state);
    return state;
  }

  // `weights` / `optimizer` hold this rank's ranges (a layout-free checkpoint read for it) or
  // whole tensors (a checkpoint of `single` or `ddp` in the older one-file form).
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    torch::NoGradGuard no_grad;
    std::map<std::string, std::size_t> index_of;
    for (std::size_t i = 0; i < params_.size(); ++i) index_of[params_[i].name] = i;
    auto own_part = [&](const std::string& name, std::size_t i, const torch::Tensor& value) {
      const ElementShare& s = shares_[i];
      const std::int64_t n = params_[i].tensor.numel();
      if (value.numel() == s.count) return value.reshape(-1);
      if (value.numel() == n) return value.reshape(-1).narrow(0, s.start, s.count);
      throw_invalid(source + ": \"" + name + "\" has " + std::to_string(value.numel()) +
                        " elements; this rank holds " + std::to_string(s.count) + " of the " +
                        std::to_string(n) + " of " + params_[i].name,
                    kResumeSameTraining);
    };
    for (const auto& [name, value] : weights) {
      const auto it = index_of.find(name);
      if (it == index_of.end())
        throw_invalid(
            source + ": the checkpoint has weight \"" + name + "\", which this run does not train",
            kResumeSameTraining);
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (shares_[i].count == 0) continue;
      const auto it = weights.find(params_[i].name);
      if (it == weights.end())
        throw_invalid(source + ": the checkpoint has no weight \"" + params_[i].name + "\"",
                      kResumeSameTraining);
      masters_[i].tensor.copy_(own_part(it->first, i, it->second));
      if (separate_masters()) own_range(i).copy_(masters_[i].tensor);
    }
    std::map<std::string, torch::Tensor> moments;
    for (const auto& [name, value] : optimizer) {
      const bool squared = name.rfind("exp_avg_sq.", 0) == 0;
      const std::string param = name.substr(name.find('.') + 1);
      const auto it = index_of.find(param);
      if (it == index_of.end() || (!squared && name.rfind("exp_avg.", 0) != 0))
        throw_invalid(source + ": unexpected optimizer tensor \"" + name + "\"",
                      kResumeSameTraining);
      if (shares_[it->second].count == 0) continue;
      moments[name] = own_part(name, it->second, value);
    }
    precision_->restore_state(state, source);
    try {
      optimizer_->load_state(moments, state.at("optimizer_steps").get<std::int64_t>(), source);
    } catch (const nlohmann::json::exception& e) {
      throw_invalid(source + ": trainer_state.json: plugin state is invalid (" + e.what() + ")");
    }
    gather_parameters();  // every rank's ranges into every rank's compute tensors
  }

  plugins::ZeroHeld held() const {
    plugins::ZeroHeld h;
    h.stage = stage_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      h.shard_elements += shares_[i].count;
      h.total_elements += params_[i].tensor.numel();
    }
    h.master_bytes = master_bytes();
    if (optimizer_)
      for (const NamedTensor& t : optimizer_->state_tensors())
        h.moment_bytes += static_cast<std::uint64_t>(t.tensor.nbytes());
    h.gradient_bytes = gradient_bytes();
    return h;
  }
  const parallel::BucketTrace* trace() const { return buckets_ ? &buckets_->trace() : nullptr; }

 private:
  void read_options(const PluginOptions& options) {
    const nlohmann::json& o = options.strategy_options;
    stage_ = 1;  // the strategy table's default, as Colossal-AI's LowLevelZeroPlugin
    if (const auto it = o.find("stage"); it != o.end()) {
      if (!it->is_number_integer() || (it->get<int>() != 1 && it->get<int>() != 2))
        throw_invalid("strategy.options.stage is " + it->dump() + "; expected 1 or 2",
                      "1 shards the optimizer state, 2 the gradients too");
      stage_ = it->get<int>();
    }
    offload_requested_ = false;
    if (const auto it = o.find("offload_optimizer"); it != o.end()) {
      if (!it->is_boolean())
        throw_invalid("strategy.options.offload_optimizer is " + it->dump() +
                      "; expected true or false");
      offload_requested_ = it->get<bool>();
    }
    bucket_cap_ = parallel::bucket_size_option(o);
  }

  // Masters apart from the compute tensors: bf16 / fp16, or float32 offloaded to the host.
  bool separate_masters() const { return precision_->keeps_masters() || offloaded_; }

  // --- ZeRO-Offload -----------------------------------------------------------------------------

  // The simulated device's budget: the tier allocates nothing for ZeRO-Offload.
  static constexpr std::uint64_t kSimulatedTierBudget = std::uint64_t{1} << 20;

  // One flat host buffer each, of every share in tensor order (host_offsets_): the float32
  // masters, the float32 gradients copied down, and in bf16 / fp16 the new values rounded for
  // the copy up. Host memory that stays (page-locked at its own size on a GPU, so the copies
  // run beside the compute).
  void allocate_host_buffers() {
    host_offsets_.clear();
    std::int64_t total = 0;
    for (const ElementShare& s : shares_) {
      host_offsets_.push_back(total);
      total += s.count;
    }
    const auto buffer = [&](torch::Dtype dtype) {
      return train::tensor_over(
          tier_->allocate_host_resident(static_cast<std::size_t>(std::max<std::int64_t>(total, 1)) *
                                        c10::elementSize(dtype)),
          total, dtype);
    };
    host_masters_ = buffer(torch::kFloat32);
    host_gradients_ = buffer(torch::kFloat32);
    host_values_ = dtype_ == torch::kFloat32 ? torch::Tensor() : buffer(dtype_);
  }
  torch::Tensor host_share_of(const torch::Tensor& buffer, std::size_t i) const {
    return buffer.narrow(0, host_offsets_[i], shares_[i].count);
  }
  static std::uint64_t bytes_of(const torch::Tensor& t) {
    return t.defined() ? static_cast<std::uint64_t>(t.nbytes()) : 0;
  }

  // Queues each share's averaged gradient (float32, contiguous in its bucket or in the gradient
  // shares) down into host_gradients_, after the compute that made it; the event says when it
  // has landed.
  std::shared_ptr<DeviceEvent> copy_gradients_down() {
    // The last step's values went up before this step's forward read them: the host buffers
    // they came from are free again (a wait that finds them long done).
    if (values_up_) tier_->host_waits(*values_up_);
    values_up_.reset();
    tier_->copies_wait(*tier_->record_compute());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (shares_[i].count == 0) continue;
      const torch::Tensor g = own_gradient(i);
      if (!g.is_contiguous() || g.scalar_type() != torch::kFloat32)
        throw Error(ErrorKind::Internal, "strategy zero: a gradient share is not flat float32");
      tier_->copy_to_host(host_share_of(host_gradients_, i).data_ptr(), g.data_ptr(),
                          static_cast<std::size_t>(g.nbytes()));
    }
    return tier_->record_copies();
  }

  // Queues the updated masters up into this rank's range of each compute tensor (rounded on the
  // host first in bf16 / fp16), after the compute queued so far; the next forward (and the
  // all-gather) waits for them. The host buffers stay untouched until values_up_ is done.
  void copy_values_up() {
    const torch::Tensor& source = host_values_.defined() ? host_values_ : host_masters_;
    if (host_values_.defined()) host_values_.copy_(host_masters_);
    tier_->copies_wait(*tier_->record_compute());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (shares_[i].count == 0) continue;
      const torch::Tensor destination = own_range(i);
      tier_->copy_to_device(destination.data_ptr(), host_share_of(source, i).data_ptr(),
                            static_cast<std::size_t>(destination.nbytes()));
    }
    values_up_ = tier_->record_copies();
    tier_->compute_waits(*values_up_);
  }

  // This rank's range of trainable tensor `i`, flat, in the compute tensor.
  torch::Tensor own_range(std::size_t i) const {
    return params_[i].tensor.detach().view(-1).narrow(0, shares_[i].start, shares_[i].count);
  }

  // This rank's share of the averaged gradient of tensor `i` (float32, flat).
  torch::Tensor own_gradient(std::size_t i) {
    if (stage_ == 2) return gradient_shares_.of(i);
    auto& bucket = buckets_->buckets()[buckets_->bucket_of(i)];
    return bucket.flat.narrow(0, rank_ * bucket.segment_numel + buckets_->offset_of(i),
                              shares_[i].count);
  }

  // After the update: every rank's ranges, bucket by bucket, into every rank's compute tensors
  // (an all-gather in the compute dtype). The copies in and out of a bucket go as one list each
  // (on a GPU a few multi-tensor kernels, not a launch per tensor and rank).
  void gather_parameters() {
    if (group_ == nullptr) return;  // one process owns every range: written in place
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> into, from;
    const auto copy_all = [&] {
      if (!into.empty()) at::_foreach_copy_(into, from);
      into.clear();
      from.clear();
    };
    for (const auto& bucket : buckets_->buckets()) {
      torch::Tensor send =
          torch::zeros({bucket.segment_numel}, torch::dtype(dtype_).device(device_));
      for (std::size_t i : bucket.tensors) {
        if (shares_[i].count == 0) continue;
        into.push_back(send.narrow(0, buckets_->offset_of(i), shares_[i].count));
        from.push_back(own_range(i));
      }
      copy_all();
      const torch::Tensor gathered = group_->all_gather(send);
      for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        for (std::size_t i : bucket.tensors) {
          const ElementShare s = element_share(params_[i].tensor.numel(), r, world_);
          if (s.count == 0) continue;
          into.push_back(params_[i].tensor.detach().view(-1).narrow(0, s.start, s.count));
          from.push_back(
              gathered.narrow(0, r * bucket.segment_numel + buckets_->offset_of(i), s.count));
        }
      }
      copy_all();
    }
  }

  std::uint64_t master_bytes() const {
    std::uint64_t bytes = 0;
    if (precision_ && separate_masters())
      for (const NamedTensor& m : masters_)
        if (m.tensor.defined()) bytes += static_cast<std::uint64_t>(m.tensor.nbytes());
    return bytes;
  }

  std::uint64_t gradient_bytes() const {
    std::uint64_t bytes = buckets_ ? buckets_->buffer_bytes() : 0;
    bytes += gradient_shares_.bytes();
    // Gradients autograd holds now (stage 1's earlier micro-batches).
    for (const NamedTensor& p : params_)
      if (p.tensor.grad().defined()) bytes += static_cast<std::uint64_t>(p.tensor.grad().nbytes());
    return bytes;
  }

  ProcessContext process_;
  dist::ProcessGroup* group_ = nullptr;  // null in one process: nothing to communicate
  int rank_ = 0;
  int world_ = 1;
  int stage_ = 1;
  torch::Device device_ = torch::kCPU;
  bool offload_requested_ = false;  // strategy.options.offload_optimizer
  bool offloaded_ = false;  // ... and on a GPU (or the simulated device): the update on the host
  std::uint64_t bucket_cap_ = parallel::kDefaultBucketBytes;
  std::optional<MixedPrecision> precision_;  // set by prepare()
  torch::Dtype dtype_ = torch::kFloat32;
  std::vector<NamedTensor> params_;   // compute tensors, whole on every rank
  std::vector<ElementShare> shares_;  // per tensor of params_: this rank's range
  std::vector<NamedTensor> masters_;  // per tensor: float32 values of this rank's range
  std::unique_ptr<optim::AdamW> optimizer_;
  parallel::GradientShares gradient_shares_;  // stage 2: this rank's share of each gradient
  std::unique_ptr<parallel::GradientBuckets> buckets_;
  bool reduced_ = false;  // this step's gradients are reduced
  std::uint64_t model_weight_bytes_ = 0;
  // ZeRO-Offload: the copies' tier, its host buffers (allocate_host_buffers) and the event of
  // the last copy up. Declared after what views the buffers, destroyed before the tier.
  std::unique_ptr<DeviceTier> tier_;
  std::vector<std::int64_t> host_offsets_;
  torch::Tensor host_masters_;
  torch::Tensor host_gradients_;
  torch::Tensor host_values_;
  std::shared_ptr<DeviceEvent> values_up_;
};

}  // namespace
}  // namespace tessera::train

namespace tessera::plugins {

void register_zero_plugin() {
  train::register_plugin("zero", [] { return std::make_unique<train::ZeroPlugin>(); });
}

bool zero_held(const train::Plugin& plugin, ZeroHeld* held) {
  const auto* zero = dynamic_cast<const train::ZeroPlugin*>(&plugin);
  if (zero == nullptr) return false;
  *held = zero->held();
  return true;
}

const parallel::BucketTrace* zero_trace(const train::Plugin& plugin) {
  const auto* zero = dynamic_cast<const train::ZeroPlugin*>(&plugin);
  return zero != nullptr ? zero->trace() : nullptr;
}

}  // namespace tessera::plugins
