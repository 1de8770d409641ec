#include "plan/replica_cost.h"

#include <algorithm>
#include <cmath>

#include "plan/cost_terms.h"

namespace tessera::plan {

using cost::counts_of;
using cost::d;
using cost::to_bytes;

// One rank of several. ddp keeps a whole replica and moves every gradient into float32
// buckets (plugins/ddp): 4 bytes per trainable parameter. Autograd's gradients sum in place over
// the micro-batches before the last, so with accumulation all are held when the last backward
// starts; without, each leaves for its bucket as it arrives (GradientBuckets::gradient_ready):
// one tensor's at a time (measured on the 21M llama at 2 ranks, micro-batch 4 without
// accumulation: 969 MiB VmHWM, planned 1150 when every gradient was counted). zero
// (plugins/zero) keeps every weight for forward and backward but owns 1/W of each trainable
// tensor: AdamW's moments and, in bf16, the float32 masters of its share (in fp32 the masters
// are the weights themselves). Stage 1 reduces whole buckets as ddp does; stage 2
// reduce-scatters each bucket while backward runs (two in flight at most) and keeps only its
// share of the averaged gradients, in float32.
void replica_memory(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                    std::uint64_t checkpoint_bytes, int world_size) {
  const auto [n, trainable, stored, param_bytes, lora, bf16] = counts_of(c, s);
  const double h = d(c.hidden_size), m = d(c.intermediate_size), v = d(c.vocab_size);
  const double ranks = d(std::max(1, world_size));
  if (s.strategy == "ddp" || s.strategy == "zero") {
    const double buckets = trainable * 4.0;
    const double whole =
        s.strategy == "zero" ? trainable * param_bytes : static_cast<double>(e.gradients);
    const double one_tensor = (lora ? trainable : std::max(v * h, h * m)) * param_bytes;
    const double autograd = s.gradient_accumulation > 1 ? whole : std::min(whole, one_tensor);
    e.gradient_buckets = to_bytes(buckets);
    e.gradients = to_bytes(autograd + buckets);
    // A quantized base (QLoRA) is held whole on every rank beside the dense weights.
    const double quantized = cost::quantized_base(c, s).bytes;
    if (s.strategy == "zero" && s.zero_offload) {  // masters and moments in host memory
      e.weights = to_bytes(stored * param_bytes + quantized);
      e.optimizer = 0;
    } else if (s.strategy == "zero") {
      e.weights =
          to_bytes(stored * param_bytes + quantized + (bf16 ? trainable * 4.0 / ranks : 0.0));
      e.optimizer = to_bytes(trainable * 8.0 / ranks);
    }
    if (s.strategy == "zero" && s.zero_stage >= 2) {  // offloaded or not
      e.gradient_buckets = to_bytes(std::min(buckets, 2.0 * d(kDefaultBucketBytes)));
      e.gradients = to_bytes(buckets / ranks + static_cast<double>(e.gradient_buckets));
    }
  }
}

MemoryEstimate zero_offload_host_memory(const hf::ModelConfig& c, const Settings& s,
                                        int world_size) {
  const auto counts = counts_of(c, s);
  const double share = counts.trainable / d(std::max(1, world_size));
  MemoryEstimate host;
  // The float32 masters, and in bf16 / fp16 the new values rounded for the copy up.
  host.weights = to_bytes(share * (counts.bf16 ? 6.0 : 4.0));
  host.optimizer = to_bytes(share * 8.0);
  host.gradients = to_bytes(share * 4.0);
  host.runtime = kRuntimeBaselineBytes;
  return host;
}

Communication replica_communication(const hf::ModelConfig& c, const Settings& s, int world_size,
                                    std::uint64_t bucket_bytes) {
  Communication out;
  const double w = d(world_size);
  const double trainable = s.method == "lora"
                               ? d(count_lora_parameters(c, s.lora_rank, s.lora_targets))
                               : d(count_parameters(c));
  const double gradients = trainable * 4.0;  // reduced in float32 (the buckets)
  const double buckets =
      std::ceil(gradients / d(static_cast<std::int64_t>(std::max<std::uint64_t>(bucket_bytes, 1))));
  if (s.strategy == "zero" && s.zero_stage >= 2) {
    // A reduce-scatter of every bucket in every micro-batch's backward: (W-1)/W of the bytes.
    const double micro_batches = d(std::max<std::int64_t>(1, s.gradient_accumulation));
    out.gradient_bytes = to_bytes(micro_batches * (w - 1.0) / w * gradients);
    out.calls = static_cast<std::int64_t>(micro_batches * buckets);
  } else {
    // An all_reduce of every bucket in the last micro-batch's backward: 2(W-1)/W of the bytes.
    out.gradient_bytes = to_bytes(2.0 * (w - 1.0) / w * gradients);
    out.calls = static_cast<std::int64_t>(buckets);
  }
  if (s.strategy == "zero") {
    // After the update, the other ranks' shares of the parameters, bucket by bucket.
    out.all_gather_bytes =
        to_bytes((w - 1.0) / w * trainable * (half_precision(s.precision) ? 2.0 : 4.0));
    out.calls += static_cast<std::int64_t>(buckets);
  }
  out.bytes = out.gradient_bytes + out.all_gather_bytes;
  return out;
}

std::string ddp_held(const hf::ModelConfig&, const Settings&, std::uint64_t, int) {
  return "each rank holds the whole model with its gradients, float32 gradient buckets and "
         "optimizer state";
}

std::string zero_held(const hf::ModelConfig&, const Settings& s, std::uint64_t, int world_size) {
  return "each rank holds the whole model but 1/" + std::to_string(world_size) +
         " of the optimizer state" + (s.zero_stage >= 2 ? " and of the gradients" : "");
}

job::StrategySpec ddp_written_as(const Settings&) {
  return {"ddp", {{"device", "cpu"}}};
}

job::StrategySpec zero_written_as(const Settings& s) {
  return {"zero", {{"stage", s.zero_stage}, {"device", "cpu"}}};
}

bool zero_valid(const Settings& s) {
  return s.zero_stage == 1 || s.zero_stage == 2;
}

}  // namespace tessera::plan
