// The `ddp` plugin: every rank a whole replica, gradients averaged over the data-parallel group
// in buckets launched during backward (what PyTorch's DistributedDataParallel does; written
// from its documented behaviour, on engine/dist's collectives).
#include "plugins/ddp/ddp_plugin.h"

#include <torch/csrc/autograd/function_hook.h>

#include <chrono>
#include <exception>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/units.h"
#include "dist/parallel_context.h"
#include "plugins/single/dense_training.h"
#include "train/plugin_registry.h"

namespace tessera::train {
namespace {

using Clock = std::chrono::steady_clock;

class DdpPlugin;

// Called by autograd once a trainable tensor's gradient is accumulated into its .grad.
class GradientReady : public torch::autograd::PostAccumulateGradHook {
 public:
  GradientReady(DdpPlugin* plugin, std::size_t index) : plugin_(plugin), index_(index) {}
  void operator()(const torch::autograd::Variable& tensor) override;

 private:
  DdpPlugin* plugin_;
  std::size_t index_;
};

// A flat float32 buffer holding the gradients of some trainable tensors, all-reduced as one.
struct Bucket {
  std::vector<std::size_t> tensors;  // indices into the trainable tensors, in fill order
  std::int64_t numel = 0;
  torch::Tensor flat;
  std::size_t filled = 0;  // tensors whose gradient is in, this backward
  dist::PendingCollective reduction;
};

class DdpPlugin : public Plugin {
 public:
  ~DdpPlugin() override { remove_hooks(); }
  std::string name() const override { return "ddp"; }
  bool runs_distributed() const override { return true; }

  void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
               const PluginOptions& options) override {
    const ProcessContext& process = options.process;
    if (process.world_size < 1 || process.rank < 0 || process.rank >= process.world_size)
      throw_invalid("strategy ddp: rank " + std::to_string(process.rank) + " of " +
                    std::to_string(process.world_size) + " processes is not a place in the job");
    if (process.world_size > 1 && (!process.parallel || process.data_group == nullptr))
      throw Error(ErrorKind::Internal,
                  "strategy ddp: rank " + std::to_string(process.rank) + " of " +
                      std::to_string(process.world_size) +
                      " processes has no data-parallel group (ProcessContext::data_group)",
                  "start the job with `tessera-cli launch`, which joins the ranks");
    process_ = process;
    group_ = process.world_size > 1 ? process.data_group : nullptr;
    if (options.device == "cuda")
      throw_unsupported("strategy.options.device: \"cuda\" is not supported yet by ddp",
                        "use device \"cpu\" (or \"auto\", which is the CPU for ddp)");
    if (options.device != "auto" && options.device != "cpu")
      throw_invalid("strategy.options.device: \"" + options.device + "\" is not a device for ddp",
                    "use auto or cpu");
    bucket_cap_ = bucket_cap(options.strategy_options);
    dense_.prepare(model, std::move(trainable), options, torch::kCPU);
    broadcast_from_rank0(model);

    const auto& params = dense_.params();
    std::vector<std::size_t> reversed;  // backward meets the last layers first
    for (std::size_t i = params.size(); i-- > 0;) reversed.push_back(i);
    build_buckets(reversed);
    ready_.assign(params.size(), false);
    for (std::size_t i = 0; i < params.size(); ++i)
      torch::autograd::impl::set_post_acc_grad_hooks(params[i].tensor,
                                                     std::make_unique<GradientReady>(this, i));
    hooked_ = true;
  }

  torch::Device device() const override { return dense_.device(); }
  torch::Dtype compute_dtype() const override { return dense_.compute_dtype(); }
  const ProcessContext& process() const override { return process_; }

  void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) override {
    // Earlier micro-batches accumulate into .grad and communicate nothing (DDP's no_sync).
    if (!last_micro_batch) {
      dense_.backward(loss, multiplier);
      return;
    }
    start_reduction();
    try {
      dense_.backward(loss, multiplier);
    } catch (...) {
      reducing_ = false;
      throw;
    }
    trace_.backward_end_s = seconds_since_start();
    reducing_ = false;
    if (hook_error_) std::rethrow_exception(std::exchange(hook_error_, nullptr));
    finish_reduction();
  }

  StepStats step(double lr, double max_grad_norm) override {
    if (!reduced_)
      throw Error(ErrorKind::Internal,
                  "strategy ddp: step() before a backward of the last micro-batch");
    std::vector<torch::Tensor> gradients(dense_.params().size());
    for (std::size_t i = 0; i < gradients.size(); ++i) gradients[i] = reduced_gradient(i);
    // Clipping sees the reduced gradients, the same on every rank, so every rank takes the
    // same step.
    const StepStats stats = dense_.step(lr, max_grad_norm, &gradients);
    reduced_ = false;
    if (!rank0_order_.empty()) {
      build_buckets(rank0_order_);
      rank0_order_.clear();
    }
    return stats;
  }

  MemoryByCategory memory() const override {
    std::uint64_t bucket_bytes = 0;
    for (const Bucket& b : buckets_) bucket_bytes += static_cast<std::uint64_t>(b.flat.nbytes());
    return dense_.memory(bucket_bytes);
  }
  void release_training_state() override {
    remove_hooks();
    buckets_.clear();
    dense_.release_training_state();
  }

  std::vector<NamedTensor> trainable_weights() override { return dense_.trainable_weights(); }
  std::vector<NamedTensor> optimizer_state() override { return dense_.optimizer_state(); }
  nlohmann::json state_json() const override { return dense_.state_json(); }
  void load_state(const std::map<std::string, torch::Tensor>& weights,
                  const std::map<std::string, torch::Tensor>& optimizer,
                  const nlohmann::json& state, const std::string& source) override {
    dense_.load_state(weights, optimizer, state, source);
  }

  const plugins::DdpTrace& trace() const { return trace_; }

  void gradient_ready(std::size_t index, const torch::Tensor& tensor) {
    if (!reducing_) return;
    try {
      torch::NoGradGuard no_grad;
      if (ready_[index]) {
        // A second accumulation in one backward (a tensor used by two reentrant backwards):
        // added while its bucket has not been sent, an error after.
        const std::size_t bucket = slot_of_[index].first;
        if (bucket < next_launch_)
          throw Error(ErrorKind::Internal, "strategy ddp: the gradient of \"" +
                                               dense_.params()[index].name +
                                               "\" grew after its bucket was all-reduced");
        if (tensor.grad().defined())
          bucket_slot(index).add_(dense_.precision().master_gradient(tensor.grad()).view(-1));
        tensor.mutable_grad() = torch::Tensor();
        return;
      }
      ready_[index] = true;
      if (record_order_) ready_order_.push_back(index);
      const torch::Tensor g = tensor.grad();
      torch::Tensor slot = bucket_slot(index);
      if (g.defined())
        slot.copy_(dense_.precision().master_gradient(g).view(-1));
      else
        slot.zero_();
      tensor.mutable_grad() = torch::Tensor();  // the bucket holds it now
      trace_.last_gradient_s = seconds_since_start();
      ++buckets_[slot_of_[index].first].filled;
      launch_full_buckets();
    } catch (...) {
      if (!hook_error_) hook_error_ = std::current_exception();
    }
  }

 private:
  static std::uint64_t bucket_cap(const nlohmann::json& options) {
    const auto it = options.find("bucket_size");
    if (it == options.end() || (it->is_string() && it->get<std::string>() == "auto"))
      return plugins::kDefaultBucketBytes;
    if (it->is_number_unsigned() && it->get<std::uint64_t>() > 0) return it->get<std::uint64_t>();
    if (it->is_string())
      return core::parse_byte_size(it->get<std::string>(), "strategy.options.bucket_size");
    throw_invalid("strategy.options.bucket_size is " + it->dump() + "; expected \"auto\" or a size",
                  "write it like 25MiB, or a number of bytes");
  }

  // Every rank starts from rank 0's values: the model's parameters (frozen ones too), adapters
  // outside the model (LoRA's A is random per process) and the float32 masters.
  void broadcast_from_rank0(model::PretrainedModel& model) {
    if (group_ == nullptr) return;
    torch::NoGradGuard no_grad;
    auto broadcast = [&](const torch::Tensor& tensor) {
      torch::Tensor data = tensor.detach();
      if (data.is_contiguous()) {
        group_->broadcast(data, 0);
      } else {
        torch::Tensor copy = data.contiguous();
        group_->broadcast(copy, 0);
        data.copy_(copy);
      }
    };
    std::set<const void*> done;
    for (const auto& p : model.parameters())
      if (done.insert(p.unsafeGetTensorImpl()).second) broadcast(p);
    for (const NamedTensor& t : dense_.params())
      if (done.insert(t.tensor.unsafeGetTensorImpl()).second) broadcast(t.tensor);
    for (const NamedTensor& m : dense_.trainable_weights())
      if (done.insert(m.tensor.unsafeGetTensorImpl()).second) broadcast(m.tensor);
  }

  // Buckets of consecutive tensors of `order`, each closed before it would pass the cap (a
  // tensor larger than the cap is a bucket of its own). Every rank builds the same ones from the
  // same order, so the all_reduces match.
  void build_buckets(const std::vector<std::size_t>& order) {
    const auto& params = dense_.params();
    buckets_.clear();
    slot_of_.assign(params.size(), {0, 0});
    std::uint64_t bytes = 0;
    for (std::size_t index : order) {
      const std::int64_t numel = params[index].tensor.numel();
      const auto tensor_bytes = static_cast<std::uint64_t>(numel) * sizeof(float);
      if (buckets_.empty() ||
          (!buckets_.back().tensors.empty() && bytes + tensor_bytes > bucket_cap_)) {
        buckets_.emplace_back();
        bytes = 0;
      }
      Bucket& b = buckets_.back();
      slot_of_[index] = {buckets_.size() - 1, b.numel};
      b.tensors.push_back(index);
      b.numel += numel;
      bytes += tensor_bytes;
    }
    for (Bucket& b : buckets_)
      b.flat = torch::empty({b.numel}, torch::TensorOptions().dtype(torch::kFloat32));
  }

  torch::Tensor bucket_slot(std::size_t index) {
    const auto [bucket, offset] = slot_of_[index];
    return buckets_[bucket].flat.narrow(0, offset, dense_.params()[index].tensor.numel());
  }
  torch::Tensor reduced_gradient(std::size_t index) {
    return bucket_slot(index).view(dense_.params()[index].tensor.sizes());
  }

  void start_reduction() {
    started_ = Clock::now();
    const std::uint64_t all_reduces = trace_.all_reduces;
    trace_ = {};
    trace_.all_reduces = all_reduces;
    for (Bucket& b : buckets_) {
      b.filled = 0;
      b.reduction = dist::PendingCollective();
      trace_.bucket_tensors.push_back(b.tensors.size());
      trace_.bucket_bytes.push_back(static_cast<std::uint64_t>(b.flat.nbytes()));
    }
    std::fill(ready_.begin(), ready_.end(), false);
    next_launch_ = 0;
    record_order_ = !order_settled_;
    ready_order_.clear();
    reducing_ = true;
  }

  // Starts, in bucket order, every bucket whose gradients are all in: each rank starts the same
  // all_reduces in the same order whatever order its gradients come in.
  void launch_full_buckets() {
    while (next_launch_ < buckets_.size() &&
           buckets_[next_launch_].filled == buckets_[next_launch_].tensors.size()) {
      Bucket& b = buckets_[next_launch_++];
      if (group_ != nullptr) b.reduction = group_->all_reduce_async(b.flat, dist::ReduceOp::Avg);
      trace_.launched_s.push_back(seconds_since_start());
      ++trace_.all_reduces;
    }
  }

  void finish_reduction() {
    // Tensors autograd gave no gradient (unused in this forward) count as zero, as on a rank
    // where they were unused while another used them.
    for (std::size_t i = 0; i < ready_.size(); ++i) {
      if (ready_[i]) continue;
      ready_[i] = true;
      bucket_slot(i).zero_();
      ++buckets_[slot_of_[i].first].filled;
    }
    launch_full_buckets();
    for (Bucket& b : buckets_) b.reduction.wait();
    trace_.reduced_s = seconds_since_start();
    reduced_ = true;
    if (!order_settled_) {
      // From the second step on, buckets follow the order gradients came in on rank 0 (the
      // same graph on every rank; rank 0's so that all agree).
      order_settled_ = true;
      const std::size_t n = ready_.size();
      std::vector<std::int64_t> order(ready_order_.begin(), ready_order_.end());
      std::vector<bool> seen(n, false);
      for (std::size_t i : ready_order_) seen[i] = true;
      for (std::size_t i = n; i-- > 0;)
        if (!seen[i]) order.push_back(static_cast<std::int64_t>(i));
      torch::Tensor shared = torch::tensor(order, torch::kInt64);
      if (group_ != nullptr) group_->broadcast(shared, 0);
      rank0_order_.clear();
      for (std::int64_t i = 0; i < shared.numel(); ++i)
        rank0_order_.push_back(static_cast<std::size_t>(shared[i].item<std::int64_t>()));
    }
  }

  double seconds_since_start() const {
    return std::chrono::duration<double>(Clock::now() - started_).count();
  }

  void remove_hooks() {
    if (!hooked_) return;
    for (const NamedTensor& t : dense_.params())
      torch::autograd::impl::set_post_acc_grad_hooks(t.tensor, nullptr);
    hooked_ = false;
  }

  ProcessContext process_;
  dist::ProcessGroup* group_ = nullptr;  // null in one process: nothing to reduce
  DenseTraining dense_;
  std::uint64_t bucket_cap_ = plugins::kDefaultBucketBytes;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::size_t, std::int64_t>> slot_of_;  // tensor → bucket, offset
  std::vector<bool> ready_;  // whose gradient is in the buckets, this backward
  std::size_t next_launch_ = 0;
  bool reducing_ = false;  // in the last micro-batch's backward
  bool reduced_ = false;   // the buckets hold this step's averaged gradients
  bool hooked_ = false;
  bool order_settled_ = false;  // the ready order was recorded (first reducing backward)
  bool record_order_ = false;
  std::vector<std::size_t> ready_order_;
  std::vector<std::size_t> rank0_order_;  // the buckets' order from the next step on
  std::exception_ptr hook_error_;
  Clock::time_point started_;
  plugins::DdpTrace trace_;
};

void GradientReady::operator()(const torch::autograd::Variable& tensor) {
  plugin_->gradient_ready(index_, tensor);
}

}  // namespace
}  // namespace tessera::train

namespace tessera::plugins {

void register_ddp_plugin() {
  train::register_plugin("ddp", [] { return std::make_unique<train::DdpPlugin>(); });
}

const DdpTrace* ddp_trace(const train::Plugin& plugin) {
  const auto* ddp = dynamic_cast<const train::DdpPlugin*>(&plugin);
  return ddp != nullptr ? &ddp->trace() : nullptr;
}

}  // namespace tessera::plugins
