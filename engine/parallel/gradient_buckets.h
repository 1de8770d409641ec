#pragma once
// Gradient buckets for the data-parallel plugins (`ddp`, `zero`): post-accumulate-grad hooks
// copy each trainable tensor's gradient (float32, as the masters need it) into a flat bucket as
// soon as autograd has it, and each bucket's collective starts, in bucket order, once all its
// gradients are in, while backward still runs. Buckets are runs of consecutive tensors of an
// order (reverse parameter order for the first backward, then the order gradients came in on
// rank 0), closed before they would pass the cap.
//
// A bucket is `segments` equal segments (one per rank for ZeRO's reduce-scatter; one for an
// all-reduce): tensor t of n elements takes c = ⌈n / segments⌉ elements at the same offset in
// every segment, and its element j lies in segment j / c at position j % c (zero padding after
// its last element). So segment r of every bucket holds elements [r·c, (r+1)·c) of each of its
// tensors: a rank's share of a tensor does not depend on how the tensors are bucketed.
#include <torch/torch.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dist/parallel_context.h"
#include "optim/adamw.h"
#include "parallel/bucket_trace.h"

namespace tessera::model {
class PretrainedModel;
}

namespace tessera::parallel {

// strategy.options.bucket_size: absent or "auto" → kDefaultBucketBytes, else a size.
std::uint64_t bucket_size_option(const nlohmann::json& strategy_options);

// Every rank starts from rank 0's values: the model's parameters (frozen ones too) and the
// trainable tensors outside the model (LoRA's A is random per process). Nothing when `group` is
// null (one process). `through` a GPU: tensors still on the CPU go through it one at a time (a
// copy up, NCCL's broadcast, a copy back) instead of over Gloo's TCP — zero broadcasts before
// it rounds the model for the GPU, and a large model's float32 weights would otherwise cross the
// loopback or the LAN at a fraction of the GPUs' links.
void broadcast_from_rank0(dist::ProcessGroup* group, model::PretrainedModel& model,
                          const std::vector<optim::NamedTensor>& trainable,
                          torch::Device through = torch::kCPU);

class GradientBuckets {
 public:
  enum class Collective {
    AllReduceMean,      // every rank ends with the whole bucket averaged over the group
    ReduceScatterMean,  // rank r gets segment r of the average (Bucket::result)
  };
  // Buffers kept from step to step (ddp reads the reduced gradients from them in step()), or
  // made when a bucket's first gradient comes and dropped once consume() has read the result.
  enum class Buffers { Persistent, PerBackward };

  struct Bucket {
    std::vector<std::size_t> tensors;  // indices into the trainable tensors, in fill order
    std::int64_t segment_numel = 0;    // elements per segment
    torch::Tensor flat;                // segments × segment_numel float32 (undefined when dropped)
    torch::Tensor result;              // ReduceScatterMean: this rank's segment, once waited
    std::size_t filled = 0;            // tensors whose gradient is in, this backward
    bool consumed = false;
    dist::PendingCollective reduction;
  };

  struct Options {
    std::string plugin;  // names it in errors
    std::uint64_t cap_bytes = kDefaultBucketBytes;
    int segments = 1;
    Collective collective = Collective::AllReduceMean;
    Buffers buffers = Buffers::Persistent;
    // PerBackward: at most this many buckets in flight (older ones are waited on and consumed
    // when another starts), bounding the buffers a backward holds; 0 = no bound.
    std::size_t max_in_flight = 0;
    // Called once a bucket's collective has been waited on (PerBackward: before its buffers are
    // dropped).
    std::function<void(std::size_t bucket, Bucket&)> consume;
  };

  // `params`: the tensors the model computes with (hooks go on them); `gradient_divisor` what a
  // compute gradient is divided by as the buckets take it in float32 (the loss scale in fp16,
  // else 1); `group` null in one process (nothing is communicated; the buckets still fill).
  GradientBuckets(std::vector<optim::NamedTensor> params, std::function<double()> gradient_divisor,
                  dist::ProcessGroup* group, Options options);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Around one backward whose gradients are reduced: start() before it, then finish() after it
  // returned (unused tensors count as zero gradients; every bucket launched, waited on and
  // consumed) or abandon() when it threw. finish() rethrows what a hook failed with.
  void start();
  void finish();
  void abandon();

  // From the first finish() on: buckets follow rank 0's order of gradients. Call when nothing
  // is read from the buffers any more (after the step that read them).
  void adopt_learned_order();

  // Element range of tensor `index` in its bucket: segment_offset within every segment,
  // segment_numel of its elements per segment.
  std::size_t bucket_of(std::size_t index) const { return slot_of_[index].first; }
  std::int64_t offset_of(std::size_t index) const { return slot_of_[index].second; }
  std::int64_t per_segment(std::size_t index) const;
  std::vector<Bucket>& buckets() { return buckets_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Segments = 1: the whole (reduced) gradient of tensor `index` in its bucket, shaped.
  torch::Tensor whole_gradient(std::size_t index);
  // Bytes of the bucket buffers alive now.
  std::uint64_t buffer_bytes() const;
  const BucketTrace& trace() const { return trace_; }

  // Called by the hooks.
  void gradient_ready(std::size_t index, const torch::Tensor& tensor);

 private:
  using Clock = std::chrono::steady_clock;
  void build(const std::vector<std::size_t>& order);
  void ensure_buffer(Bucket& bucket);
  void place(std::size_t index, const torch::Tensor& gradient, bool add);
  void launch_full_buckets();
  void wait_and_consume(std::size_t bucket);
  double seconds_since_start() const;
  void remove_hooks();

  std::vector<optim::NamedTensor> params_;
  std::function<double()> gradient_divisor_;
  dist::ProcessGroup* group_;
  Options options_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::size_t, std::int64_t>> slot_of_;  // tensor → bucket, offset
  std::vector<bool> ready_;  // whose gradient is in the buckets, this backward
  std::size_t next_launch_ = 0;
  std::size_t next_consume_ = 0;
  bool collecting_ = false;
  bool hooked_ = false;
  bool order_settled_ = false;  // the ready order was recorded (first collecting backward)
  bool record_order_ = false;
  std::vector<std::size_t> ready_order_;
  std::vector<std::size_t> rank0_order_;  // the buckets' order once adopted
  std::exception_ptr hook_error_;
  Clock::time_point started_;
  BucketTrace trace_;
};

// ZeRO-2's gradients (zero's stage 2, hybrid's zero_stage 2): this member's share of each
// tensor's average, float32, each a flat view into one buffer, summed from the reduce-scattered
// buckets of every micro-batch (a bucket's segment r is member r's share of each of its tensors).
class GradientShares {
 public:
  GradientShares() = default;
  // `counts[i]`: the elements of tensor i this member owns (its element_share's count).
  GradientShares(const std::vector<std::int64_t>& counts, torch::Device device);
  // This member's segment of a reduce-scattered bucket of `buckets`, added in.
  void add(const GradientBuckets& buckets, const GradientBuckets::Bucket& bucket);
  // Tensor i's share of the averaged gradient (flat, `counts[i]` elements).
  const torch::Tensor& of(std::size_t i) const { return views_[i]; }
  const std::vector<torch::Tensor>& all() const { return views_; }
  void zero() { flat_.zero_(); }
  std::uint64_t bytes() const {
    return flat_.defined() ? static_cast<std::uint64_t>(flat_.nbytes()) : 0;
  }

 private:
  torch::Tensor flat_;
  std::vector<torch::Tensor> views_;
};

}  // namespace tessera::parallel
