#include "parallel/split_model.h"

#include <torch/torch.h>

#include <map>

#include "core/error.h"
#include "dist/parallel_context.h"
#include "hf/families.h"
#include "model/layers.h"
#include "model/model.h"
#include "parallel/tensor_parallel.h"

namespace tessera::parallel {
namespace {

class ColumnLinear : public model::SplitLinear {
 public:
  explicit ColumnLinear(dist::ProcessGroup& group) : group_(group) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias) override {
    return column_parallel_linear(x, weight, bias, group_);
  }

 private:
  dist::ProcessGroup& group_;
};

class RowLinear : public model::SplitLinear {
 public:
  explicit RowLinear(dist::ProcessGroup& group) : group_(group) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias) override {
    return row_parallel_linear(x, weight, bias, group_);
  }

 private:
  dist::ProcessGroup& group_;
};

// An output head split along the vocabulary: its logits stay split, the loss spans the ranks.
class VocabularyHead : public model::SplitLinear, public model::SplitLogits {
 public:
  explicit VocabularyHead(dist::ProcessGroup& group) : group_(group) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias) override {
    return column_parallel_linear(x, weight, bias, group_);
  }
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) override {
    return vocab_parallel_cross_entropy(logits, targets, group_);
  }

 private:
  dist::ProcessGroup& group_;
};

class VocabularyEmbedding : public model::SplitEmbedding, public model::SplitLogits {
 public:
  explicit VocabularyEmbedding(dist::ProcessGroup& group) : group_(group) {}
  torch::Tensor lookup(const torch::Tensor& ids, const torch::Tensor& weight) override {
    return vocab_parallel_embedding(ids, weight, group_);
  }
  torch::Tensor attend(const torch::Tensor& hidden, const torch::Tensor& weight) override {
    return column_parallel_linear(hidden, weight, torch::Tensor(), group_);
  }
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) override {
    return vocab_parallel_cross_entropy(logits, targets, group_);
  }

 private:
  dist::ProcessGroup& group_;
};

void replace(torch::Tensor& parameter, const torch::Tensor& block) {
  torch::NoGradGuard no_grad;
  parameter.set_data(block);
}

}  // namespace

std::vector<SplitParameter> split_model(model::PretrainedModel& m, dist::ProcessGroup& group) {
  const hf::FamilyTraits& family = hf::family_of(m.config());
  const int rank = group.rank(), size = group.size();
  hf::check_tensor_parallel(m.config(), size);
  // Module name → the dimension each of its parameters is cut along.
  std::map<std::string, std::int64_t> cut;
  for (const auto& item : m.named_modules("", /*include_self=*/false)) {
    const std::optional<hf::TensorSplit> split = hf::tensor_split_of(family, item.key());
    if (!split) continue;
    const std::string prefix = item.key() + ".";
    if (auto* linear = dynamic_cast<model::LinearImpl*>(item.value().get())) {
      const bool out_in = linear->layout == model::LinearImpl::Layout::OutIn;
      const std::int64_t outputs = out_in ? 0 : 1, inputs = out_in ? 1 : 0;
      const std::int64_t weight_dim = *split == hf::TensorSplit::Row ? inputs : outputs;
      cut[prefix + "weight"] = weight_dim;
      replace(linear->weight,
              shard(linear->weight.detach(), weight_dim, rank, size, (prefix + "weight").c_str()));
      if (linear->bias.defined() && *split != hf::TensorSplit::Row) {
        cut[prefix + "bias"] = 0;
        replace(linear->bias,
                shard(linear->bias.detach(), 0, rank, size, (prefix + "bias").c_str()));
      }
      if (*split == hf::TensorSplit::Column)
        linear->split = std::make_shared<ColumnLinear>(group);
      else if (*split == hf::TensorSplit::Row)
        linear->split = std::make_shared<RowLinear>(group);
      else
        linear->split = std::make_shared<VocabularyHead>(group);
    } else if (auto* embedding = dynamic_cast<model::EmbeddingImpl*>(item.value().get())) {
      if (*split != hf::TensorSplit::Vocabulary)
        throw Error(ErrorKind::Internal, family.model_type +
                                             "'s tensor-parallel plan splits the "
                                             "embedding " +
                                             item.key() + " other than by vocabulary");
      cut[prefix + "weight"] = 0;
      replace(embedding->weight,
              shard(embedding->weight.detach(), 0, rank, size, (prefix + "weight").c_str()));
      embedding->split = std::make_shared<VocabularyEmbedding>(group);
    } else {
      throw Error(ErrorKind::Internal, family.model_type + "'s tensor-parallel plan names " +
                                           item.key() +
                                           ", which is neither a linear layer nor "
                                           "an embedding");
    }
  }
  std::vector<SplitParameter> parameters;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    SplitParameter p;
    p.name = item.key();
    const auto found = cut.find(p.name);
    p.dim = found == cut.end() ? -1 : found->second;
    p.whole_shape = item.value().sizes().vec();
    if (p.dim >= 0) p.whole_shape[static_cast<std::size_t>(p.dim)] *= size;
    parameters.push_back(std::move(p));
  }
  return parameters;
}

torch::Tensor gather_whole(const torch::Tensor& block, std::int64_t dim,
                           dist::ProcessGroup& group) {
  if (dim < 0 || group.size() == 1) return block;
  const torch::Tensor flat = group.all_gather(block.contiguous());
  std::vector<std::int64_t> shape = {group.size()};
  for (std::int64_t extent : block.sizes()) shape.push_back(extent);
  return torch::cat(flat.view(shape).unbind(0), dim);
}

void unsplit_model(model::PretrainedModel& m, const std::vector<SplitParameter>& layout,
                   dist::ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  auto parameters = m.named_parameters();
  for (const SplitParameter& p : layout)
    if (p.dim >= 0)
      replace(parameters[p.name], gather_whole(parameters[p.name].detach(), p.dim, group));
  for (const auto& item : m.named_modules("", /*include_self=*/false)) {
    if (auto* linear = dynamic_cast<model::LinearImpl*>(item.value().get())) linear->split.reset();
    if (auto* embedding = dynamic_cast<model::EmbeddingImpl*>(item.value().get()))
      embedding->split.reset();
  }
}

}  // namespace tessera::parallel
