#include "parallel/tensor_parallel.h"

#include <string>

#include "core/error.h"
#include "dist/parallel_context.h"

namespace tessera::parallel {
namespace {

// autograd::Function keeps IValues only: the group (which outlives the step) as an address.
c10::IValue group_value(dist::ProcessGroup& group) {
  return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&group));
}
dist::ProcessGroup& group_of(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<dist::ProcessGroup*>(
      static_cast<std::intptr_t>(ctx->saved_data["group"].toInt()));
}

torch::Tensor all_reduced(const torch::Tensor& x, dist::ProcessGroup& group) {
  torch::Tensor sum = x.contiguous().clone();
  group.all_reduce(sum);
  return sum;
}

class CopyToGroup : public torch::autograd::Function<CopyToGroup> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               dist::ProcessGroup* group) {
    ctx->saved_data["group"] = group_value(*group);
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {all_reduced(grads.at(0), group_of(ctx)), torch::Tensor()};
  }
};

class ReduceFromGroup : public torch::autograd::Function<ReduceFromGroup> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x,
                               dist::ProcessGroup* group) {
    return all_reduced(x, *group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads.at(0), torch::Tensor()};
  }
};

class GatherLastDim : public torch::autograd::Function<GatherLastDim> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               dist::ProcessGroup* group) {
    ctx->saved_data["group"] = group_value(*group);
    return torch::cat(gather_blocks(x, *group).unbind(0), -1);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    dist::ProcessGroup& group = group_of(ctx);
    return {
        grads.at(0).chunk(group.size(), -1).at(static_cast<std::size_t>(group.rank())).contiguous(),
        torch::Tensor()};
  }
};

// [B, T, …] ⇄ [T, B, …]: the collectives concatenate and scatter flat blocks, so the sequence
// goes first.
torch::Tensor sequence_first(const torch::Tensor& x) {
  return x.movedim(1, 0).contiguous();
}

// x [B, T, …] padded with zeros to `padded` positions.
torch::Tensor padded_to(const torch::Tensor& x, std::int64_t padded) {
  if (x.size(1) == padded) return x;
  std::vector<std::int64_t> shape = x.sizes().vec();
  shape[1] = padded - x.size(1);
  return torch::cat({x, torch::zeros(shape, x.options())}, 1);
}

// Every rank's block [B, L, …] → [B, length, …].
torch::Tensor all_gather_sequence(const torch::Tensor& block, dist::ProcessGroup& group,
                                  std::int64_t length) {
  std::vector<std::int64_t> shape = block.sizes().vec();
  std::swap(shape[0], shape[1]);
  shape[0] *= group.size();
  return group.all_gather(sequence_first(block))
      .view(shape)
      .movedim(0, 1)
      .narrow(1, 0, length)
      .contiguous();
}

// x [B, T, …] summed over the ranks, this rank's block [B, L, …] of the sum.
torch::Tensor reduce_scatter_blocks(const torch::Tensor& x, dist::ProcessGroup& group) {
  const std::int64_t block = sequence_block_length(x.size(1), group.size());
  std::vector<std::int64_t> shape = x.sizes().vec();
  std::swap(shape[0], shape[1]);
  shape[0] = block;
  return group.reduce_scatter(sequence_first(padded_to(x, block * group.size())))
      .view(shape)
      .movedim(0, 1)
      .contiguous();
}

torch::Tensor own_block(const torch::Tensor& x, dist::ProcessGroup& group) {
  const std::int64_t block = sequence_block_length(x.size(1), group.size());
  return padded_to(x, block * group.size()).narrow(1, block * group.rank(), block).contiguous();
}

// This rank's block of x [B, T, …]: taken (`sums` false: every rank holds the same x) or
// reduce-scattered (`sums`: each rank holds partial sums). Backward, the blocks' gradients
// gathered either way.
class ToSequenceBlock : public torch::autograd::Function<ToSequenceBlock> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               dist::ProcessGroup* group, bool sums) {
    ctx->saved_data["group"] = group_value(*group);
    ctx->saved_data["length"] = x.size(1);
    return sums ? reduce_scatter_blocks(x, *group) : own_block(x, *group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {all_gather_sequence(grads.at(0), group_of(ctx), ctx->saved_data["length"].toInt()),
            torch::Tensor(), torch::Tensor()};
  }
};

class GatherSequence : public torch::autograd::Function<GatherSequence> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& block,
                               dist::ProcessGroup* group, std::int64_t length, bool sum_gradient) {
    ctx->saved_data["group"] = group_value(*group);
    ctx->saved_data["sum"] = sum_gradient;
    return all_gather_sequence(block, *group, length);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    dist::ProcessGroup& group = group_of(ctx);
    torch::Tensor g = ctx->saved_data["sum"].toBool() ? reduce_scatter_blocks(grads.at(0), group)
                                                      : own_block(grads.at(0), group);
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::int64_t sequence_block_length(std::int64_t length, int size) {
  return (length + size - 1) / size;
}

torch::Tensor split_sequence(const torch::Tensor& x, dist::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return ToSequenceBlock::apply(x, &group, /*sums=*/false);
}

torch::Tensor gather_sequence(const torch::Tensor& block, dist::ProcessGroup& group,
                              std::int64_t length, bool sum_gradient) {
  if (group.size() == 1) return block;
  return GatherSequence::apply(block, &group, length, sum_gradient);
}

torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, dist::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return ToSequenceBlock::apply(x, &group, /*sums=*/true);
}

torch::Tensor shard(const torch::Tensor& full, std::int64_t dim, int rank, int size,
                    const char* what) {
  const std::int64_t extent = full.size(dim);
  if (size < 1 || extent % size != 0)
    throw_invalid(std::string(what) + ": " + std::to_string(extent) + " does not split into " +
                      std::to_string(size) + " equal parts",
                  "choose a tensor-parallel size that divides " + std::to_string(extent));
  const std::int64_t block = extent / size;
  return full.narrow(dim, block * rank, block).contiguous();
}

torch::Tensor gather_blocks(const torch::Tensor& block, dist::ProcessGroup& group) {
  std::vector<std::int64_t> shape = {group.size()};
  for (std::int64_t extent : block.sizes()) shape.push_back(extent);
  return group.all_gather(block.contiguous()).view(shape);
}

torch::Tensor copy_to_group(const torch::Tensor& x, dist::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return CopyToGroup::apply(x, &group);
}

torch::Tensor reduce_from_group(const torch::Tensor& x, dist::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return ReduceFromGroup::apply(x, &group);
}

torch::Tensor gather_last_dim(const torch::Tensor& x, dist::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return GatherLastDim::apply(x, &group);
}

torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                     const torch::Tensor& bias, dist::ProcessGroup& group,
                                     bool gather_output) {
  torch::Tensor y = torch::linear(copy_to_group(x, group), weight, bias);
  return gather_output ? gather_last_dim(y, group) : y;
}

torch::Tensor row_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias, dist::ProcessGroup& group) {
  torch::Tensor y = reduce_from_group(torch::linear(x, weight), group);
  return bias.defined() ? y + bias : y;
}

torch::Tensor vocab_parallel_embedding(const torch::Tensor& ids, const torch::Tensor& weight,
                                       dist::ProcessGroup& group) {
  const std::int64_t rows = weight.size(0);
  const std::int64_t first = rows * group.rank();
  const torch::Tensor outside = (ids < first) | (ids >= first + rows);
  const torch::Tensor local = (ids - first).masked_fill(outside, 0);
  torch::Tensor found = torch::embedding(weight, local);
  found = found.masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_group(found, group);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, dist::ProcessGroup& group,
                                           std::int64_t ignore_index) {
  const std::int64_t columns = logits.size(-1);
  const std::int64_t first = columns * group.rank();
  const torch::Tensor z = logits.to(torch::kFloat32);
  // The largest logit of each row over the whole vocabulary (only for the exponentials' range:
  // the loss does not depend on it, so no gradient flows through it).
  torch::Tensor row_max = std::get<0>(z.detach().max(-1));
  if (group.size() > 1) row_max = std::get<0>(gather_blocks(row_max, group).max(0));
  const torch::Tensor shifted = z - row_max.unsqueeze(-1);
  const torch::Tensor sum_exp = reduce_from_group(shifted.exp().sum(-1), group);
  const torch::Tensor counted = targets != ignore_index;
  const torch::Tensor mine = counted & (targets >= first) & (targets < first + columns);
  const torch::Tensor local = (targets - first).masked_fill(mine.logical_not(), 0);
  const torch::Tensor picked =
      shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(mine.logical_not(), 0.0);
  const torch::Tensor target_logit = reduce_from_group(picked, group);
  const torch::Tensor losses =
      (sum_exp.log() - target_logit).masked_fill(counted.logical_not(), 0.0);
  return losses.sum() / counted.sum().to(torch::kFloat32);
}

}  // namespace tessera::parallel
