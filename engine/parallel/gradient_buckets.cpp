// Gradient buckets shared by `ddp` and `zero`: what PyTorch's DistributedDataParallel does with
// its reducer, written from its documented behaviour on engine/dist's collectives.
#include "parallel/gradient_buckets.h"

#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/units.h"
#include "model/model.h"

namespace tessera::parallel {
namespace {

// Called by autograd once a trainable tensor's gradient is accumulated into its .grad.
class GradientReady : public torch::autograd::PostAccumulateGradHook {
 public:
  GradientReady(GradientBuckets* buckets, std::size_t index) : buckets_(buckets), index_(index) {}
  void operator()(const torch::autograd::Variable& tensor) override {
    buckets_->gradient_ready(index_, tensor);
  }

 private:
  GradientBuckets* buckets_;
  std::size_t index_;
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

std::uint64_t bucket_size_option(const nlohmann::json& options) {
  const auto it = options.find("bucket_size");
  if (it == options.end() || (it->is_string() && it->get<std::string>() == "auto"))
    return kDefaultBucketBytes;
  if (it->is_number_unsigned() && it->get<std::uint64_t>() > 0) return it->get<std::uint64_t>();
  if (it->is_string())
    return core::parse_byte_size(it->get<std::string>(), "strategy.options.bucket_size");
  throw_invalid("strategy.options.bucket_size is " + it->dump() + "; expected \"auto\" or a size",
                "write it like 25MiB, or a number of bytes");
}

void broadcast_from_rank0(dist::ProcessGroup* group, model::PretrainedModel& model,
                          const std::vector<optim::NamedTensor>& trainable, torch::Device through) {
  if (group == nullptr) return;
  torch::NoGradGuard no_grad;
  auto broadcast = [&](const torch::Tensor& tensor) {
    if (tensor.numel() == 0)
      return;  // a quantized Linear's emptied weight (QLoRA): nothing to send
    torch::Tensor data = tensor.detach();
    if (through.is_cuda() && !data.is_cuda()) {
      torch::Tensor on_device =
          data.to(through, /*non_blocking=*/false, /*copy=*/true).contiguous();
      group->broadcast(on_device, 0);
      data.copy_(on_device);
    } else if (data.is_contiguous()) {
      group->broadcast(data, 0);
    } else {
      torch::Tensor copy = data.contiguous();
      group->broadcast(copy, 0);
      data.copy_(copy);
    }
  };
  std::set<const void*> done;
  for (const auto& p : model.parameters())
    if (done.insert(p.unsafeGetTensorImpl()).second) broadcast(p);
  for (const optim::NamedTensor& t : trainable)
    if (done.insert(t.tensor.unsafeGetTensorImpl()).second) broadcast(t.tensor);
}

GradientBuckets::GradientBuckets(std::vector<optim::NamedTensor> params,
                                 std::function<double()> gradient_divisor,
                                 dist::ProcessGroup* group, Options options)
    : params_(std::move(params)),
      gradient_divisor_(std::move(gradient_divisor)),
      group_(group),
      options_(std::move(options)) {
  if (options_.segments < 1)
    throw Error(ErrorKind::Internal, "GradientBuckets: segments must be >= 1");
  std::vector<std::size_t> reversed;  // backward meets the last layers first
  for (std::size_t i = params_.size(); i-- > 0;) reversed.push_back(i);
  build(reversed);
  ready_.assign(params_.size(), false);
  for (std::size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i].tensor,
                                                   std::make_unique<GradientReady>(this, i));
  hooked_ = true;
}

GradientBuckets::~GradientBuckets() {
  remove_hooks();
}

void GradientBuckets::remove_hooks() {
  if (!hooked_) return;
  for (const optim::NamedTensor& t : params_)
    torch::autograd::impl::set_post_acc_grad_hooks(t.tensor, nullptr);
  hooked_ = false;
}

std::int64_t GradientBuckets::per_segment(std::size_t index) const {
  return ceil_div(params_[index].tensor.numel(), options_.segments);
}

// Buckets of consecutive tensors of `order`, each closed before it would pass the cap (a tensor
// larger than the cap is a bucket of its own). Every rank builds the same ones from the same
// order, so the collectives match.
void GradientBuckets::build(const std::vector<std::size_t>& order) {
  buckets_.clear();
  slot_of_.assign(params_.size(), {0, 0});
  std::uint64_t bytes = 0;
  for (std::size_t index : order) {
    const std::int64_t numel = per_segment(index);
    const auto tensor_bytes =
        static_cast<std::uint64_t>(numel) * static_cast<std::uint64_t>(options_.segments) * 4;
    if (buckets_.empty() ||
        (!buckets_.back().tensors.empty() && bytes + tensor_bytes > options_.cap_bytes)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    slot_of_[index] = {buckets_.size() - 1, b.segment_numel};
    b.tensors.push_back(index);
    b.segment_numel += numel;
    bytes += tensor_bytes;
  }
  if (options_.buffers == Buffers::Persistent)
    for (Bucket& b : buckets_) ensure_buffer(b);
}

void GradientBuckets::ensure_buffer(Bucket& bucket) {
  if (bucket.flat.defined()) return;
  // Padding must read as zero; in one segment there is none and every slot is written.
  // Where the gradients are: the GPU's buckets go through NCCL, the CPU's through Gloo.
  const auto options =
      torch::TensorOptions().dtype(torch::kFloat32).device(params_.front().tensor.device());
  const std::int64_t numel = bucket.segment_numel * options_.segments;
  bucket.flat =
      options_.segments == 1 ? torch::empty({numel}, options) : torch::zeros({numel}, options);
}

void GradientBuckets::place(std::size_t index, const torch::Tensor& gradient, bool add) {
  Bucket& bucket = buckets_[slot_of_[index].first];
  ensure_buffer(bucket);
  const std::int64_t offset = slot_of_[index].second;
  const std::int64_t n = params_[index].tensor.numel();
  const std::int64_t c = per_segment(index);
  // The compute gradient goes into its float32 slots piece by piece, widened by the copy (a whole
  // float32 copy of it first would be one more gradient of the largest tensor at the peak) and
  // unscaled there (the loss scale is a power of two: dividing and multiplying by its inverse
  // round alike).
  const torch::Tensor flat_gradient = gradient.defined() ? gradient.reshape(-1) : torch::Tensor();
  const double divisor = gradient.defined() ? gradient_divisor_() : 1.0;
  for (std::int64_t s = 0; s < options_.segments; ++s) {
    const std::int64_t count = std::clamp<std::int64_t>(n - s * c, 0, c);
    if (count == 0) break;
    torch::Tensor slot = bucket.flat.narrow(0, s * bucket.segment_numel + offset, count);
    if (!flat_gradient.defined()) {
      if (!add) slot.zero_();
    } else if (add) {
      slot.add_(flat_gradient.narrow(0, s * c, count), 1.0 / divisor);
    } else {
      slot.copy_(flat_gradient.narrow(0, s * c, count));
      if (divisor != 1.0) slot.div_(divisor);
    }
  }
}

torch::Tensor GradientBuckets::whole_gradient(std::size_t index) {
  const auto [bucket, offset] = slot_of_[index];
  return buckets_[bucket]
      .flat.narrow(0, offset, params_[index].tensor.numel())
      .view(params_[index].tensor.sizes());
}

std::uint64_t GradientBuckets::buffer_bytes() const {
  std::uint64_t bytes = 0;
  for (const Bucket& b : buckets_) {
    if (b.flat.defined()) bytes += static_cast<std::uint64_t>(b.flat.nbytes());
    if (b.result.defined()) bytes += static_cast<std::uint64_t>(b.result.nbytes());
  }
  return bytes;
}

double GradientBuckets::seconds_since_start() const {
  return std::chrono::duration<double>(Clock::now() - started_).count();
}

void GradientBuckets::start() {
  started_ = Clock::now();
  const std::uint64_t collectives = trace_.collectives;
  trace_ = {};
  trace_.collectives = collectives;
  for (Bucket& b : buckets_) {
    b.filled = 0;
    b.consumed = false;
    b.reduction = dist::PendingCollective();
    b.result = torch::Tensor();
    trace_.bucket_tensors.push_back(b.tensors.size());
    trace_.bucket_bytes.push_back(static_cast<std::uint64_t>(b.segment_numel) *
                                  static_cast<std::uint64_t>(options_.segments) * 4);
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  next_consume_ = 0;
  record_order_ = !order_settled_;
  ready_order_.clear();
  hook_error_ = nullptr;
  collecting_ = true;
}

void GradientBuckets::abandon() {
  collecting_ = false;
}

void GradientBuckets::gradient_ready(std::size_t index, const torch::Tensor& tensor) {
  if (!collecting_) return;
  try {
    torch::NoGradGuard no_grad;
    if (ready_[index]) {
      // A second accumulation in one backward (a tensor used by two reentrant backwards): added
      // while its bucket has not been sent, an error after.
      if (slot_of_[index].first < next_launch_)
        throw Error(ErrorKind::Internal, "strategy " + options_.plugin + ": the gradient of \"" +
                                             params_[index].name +
                                             "\" grew after its bucket was reduced");
      if (tensor.grad().defined()) place(index, tensor.grad(), true);
      tensor.mutable_grad() = torch::Tensor();
      return;
    }
    ready_[index] = true;
    if (record_order_) ready_order_.push_back(index);
    place(index, tensor.grad(), false);
    tensor.mutable_grad() = torch::Tensor();  // the bucket holds it now
    trace_.last_gradient_s = seconds_since_start();
    ++buckets_[slot_of_[index].first].filled;
    launch_full_buckets();
  } catch (...) {
    if (!hook_error_) hook_error_ = std::current_exception();
  }
}

// Starts, in bucket order, every bucket whose gradients are all in: each rank starts the same
// collectives in the same order whatever order its gradients come in.
void GradientBuckets::launch_full_buckets() {
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_].filled == buckets_[next_launch_].tensors.size()) {
    Bucket& b = buckets_[next_launch_++];
    if (options_.collective == Collective::AllReduceMean) {
      if (group_ != nullptr) b.reduction = group_->all_reduce_async(b.flat, dist::ReduceOp::Avg);
    } else if (group_ != nullptr) {
      b.result = torch::empty({b.segment_numel}, b.flat.options());
      b.reduction = group_->reduce_scatter_async(b.flat, b.result, dist::ReduceOp::Avg);
    } else {
      b.result = b.flat;  // one process: its one segment is the whole bucket
    }
    trace_.launched_s.push_back(seconds_since_start());
    ++trace_.collectives;
    if (options_.max_in_flight > 0)
      while (next_launch_ - next_consume_ > options_.max_in_flight) wait_and_consume(next_consume_);
  }
}

void GradientBuckets::wait_and_consume(std::size_t index) {
  Bucket& b = buckets_[index];
  b.reduction.wait();
  if (!b.consumed && options_.consume) options_.consume(index, b);
  b.consumed = true;
  if (options_.buffers == Buffers::PerBackward) {
    b.flat = torch::Tensor();
    b.result = torch::Tensor();
  }
  next_consume_ = std::max(next_consume_, index + 1);
}

void GradientBuckets::finish() {
  collecting_ = false;
  if (hook_error_) std::rethrow_exception(std::exchange(hook_error_, nullptr));
  trace_.backward_end_s = seconds_since_start();
  // Tensors autograd gave no gradient (unused in this forward) count as zero, as on a rank
  // where they were unused while another used them.
  for (std::size_t i = 0; i < ready_.size(); ++i) {
    if (ready_[i]) continue;
    ready_[i] = true;
    place(i, torch::Tensor(), false);
    ++buckets_[slot_of_[i].first].filled;
  }
  launch_full_buckets();
  for (std::size_t i = next_consume_; i < buckets_.size(); ++i) wait_and_consume(i);
  trace_.reduced_s = seconds_since_start();
  if (!order_settled_) {
    // From the next adoption on, buckets follow the order gradients came in on rank 0 (the same
    // graph on every rank; rank 0's so that all agree).
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

void GradientBuckets::adopt_learned_order() {
  if (rank0_order_.empty()) return;
  build(rank0_order_);
  rank0_order_.clear();
}

GradientShares::GradientShares(const std::vector<std::int64_t>& counts, torch::Device device) {
  std::int64_t elements = 0;
  for (std::int64_t n : counts) elements += n;
  flat_ = torch::zeros({elements}, torch::dtype(torch::kFloat32).device(device));
  std::int64_t offset = 0;
  for (std::int64_t n : counts) {
    views_.push_back(flat_.narrow(0, offset, n));
    offset += n;
  }
}

void GradientShares::add(const GradientBuckets& buckets, const GradientBuckets::Bucket& bucket) {
  torch::NoGradGuard no_grad;
  for (std::size_t i : bucket.tensors)
    if (views_[i].numel() > 0)
      views_[i].add_(bucket.result.narrow(0, buckets.offset_of(i), views_[i].numel()));
}

}  // namespace tessera::parallel
