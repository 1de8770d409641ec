#pragma once
// A model's weights split over a tensor-parallel group by its family's plan
// (hf::FamilyTraits::tensor_parallel_plan): each planned module's parameters replaced by this
// rank's block and its computation swapped for the parallel one (tensor_parallel.h), so that the
// model's forward and backward compute what the whole model computes, each rank holding 1 / size
// of the split weights. The attention computes with the heads its projections give it.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::dist {
class ProcessGroup;
}
namespace tessera::model {
class PretrainedModel;
}
namespace tessera::hf {
struct TensorSplitRule;
struct ModelConfig;
}  // namespace tessera::hf

namespace tessera::parallel {

// A parameter of a split model: the dimension its block is cut along (-1: whole on every rank)
// and its whole shape.
struct SplitParameter {
  std::string name;  // as named_parameters() gives it
  std::int64_t dim = -1;
  int parts = 1;  // equal parts side by side along `dim`, each split (gpt2's fused q/k/v)
  // Ranks holding each block: the tensor is cut into size / replicas blocks and rank r holds
  // block r / replicas (k and v with fewer kv heads than ranks: each rank holds the head its
  // query heads read). Its gradient is then each holder's share, summed over them.
  int replicas = 1;
  std::vector<std::int64_t> whole_shape;
};

// How many ranks of `size` hold each block of a module split by `rule` (SplitParameter::replicas):
// more than one for k and v when the model has fewer kv heads than ranks.
int replicas_of(const hf::TensorSplitRule& rule, const hf::ModelConfig& config, int size);

// This rank's block of the whole tensor of `p` (a contiguous copy; `whole` itself when p is
// whole on every rank).
torch::Tensor block_of(const torch::Tensor& whole, const SplitParameter& p, int rank, int size);

// Every parameter of `model` in named_parameters() order. Throws tessera::Error: Unsupported
// when the family has no plan; InvalidInput naming the config field, its value and the sizes that
// would divide every planned field when the group's size does not divide one.
// A parameter with no elements (released: another pipeline stage holds it) keeps none; its entry
// describes the split it would have, from its shape in `whole_shapes` (by name).
// `sequence_parallel`: Megatron-LM's sequence parallelism as well (model::SequenceShards): the
// layers compute on this rank's block of the positions, the column-parallel layers gathering
// them (all-gather; reduce-scatter in backward) and the row-parallel ones scattering their sums
// (reduce-scatter; all-gather in backward) instead of an all-reduce; the embedding and the head
// see every position. The gradients of the layers' whole tensors (norms, row biases, LoRA's B on
// a row layer) are then each rank's share: see sequence_parallel_shared().
std::vector<SplitParameter> split_model(
    model::PretrainedModel& model, dist::ProcessGroup& group,
    const std::map<std::string, std::vector<std::int64_t>>& whole_shapes = {},
    bool sequence_parallel = false);

// Under sequence parallelism, whether the gradient of `name` (a parameter or a LoRA matrix, whole
// on every rank) is this rank's share, to be summed over the tensor group: it is used inside the
// layers, on this rank's positions only. The family's layers are its pipeline plan's.
bool sequence_parallel_shared(const hf::ModelConfig& config, const std::string& name);

// The whole tensor of `p` from every rank's `block` (`block` itself when p is whole on every
// rank). Every rank of `group` calls it with its block, in the same order.
// For a replicated block (p.replicas > 1): the sum over the ranks holding the same block of their
// `gradient`s of it (each the share its query heads give). Every rank of `group` calls it.
torch::Tensor sum_over_replicas(const torch::Tensor& gradient, const SplitParameter& p,
                                dist::ProcessGroup& group);
torch::Tensor gather_whole(const torch::Tensor& block, const SplitParameter& p,
                           dist::ProcessGroup& group);

// Undoes split_model: every split parameter gathered whole into the model and the blocks
// computing as plain layers again (for the export). Every rank of `group` calls it.
void unsplit_model(model::PretrainedModel& model, const std::vector<SplitParameter>& layout,
                   dist::ProcessGroup& group);

}  // namespace tessera::parallel
