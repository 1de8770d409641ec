#include "parallel/split_model.h"

#include <torch/torch.h>

#include <cctype>
#include <map>
#include <memory>
#include <optional>

#include "core/error.h"
#include "dist/parallel_context.h"
#include "hf/families.h"
#include "model/dropout.h"
#include "model/head_loss.h"
#include "model/layers.h"
#include "model/model.h"
#include "parallel/tensor_parallel.h"

namespace tessera::parallel {
namespace {

// Sequence parallelism's state shared by a split model's layers.
struct SequenceState {
  explicit SequenceState(dist::ProcessGroup& g) : group(g) {}
  dist::ProcessGroup& group;
  // Positions of the hidden states entering the layers in the forward running now (a pipeline
  // runs other micro-batches' forwards before a backward: backward takes the length its forward
  // saved).
  std::int64_t length = 0;
  // The length for the layer running now: the dropout stream's when one is installed (activation
  // checkpointing recomputes a layer in backward under its forward's copy of the stream, perhaps
  // after other micro-batches' forwards), else `length`.
  std::int64_t current_length() const {
    const std::optional<model::DropoutStream> stream = model::current_dropout_stream();
    return stream && stream->sequence_blocks > 1 ? stream->sequence_length : length;
  }
  // Backward: every position of `block` (of sequences of `positions`) gathered again, once for
  // the layers that share it (q, k and v; gate and up), the last one kept until another block is
  // asked for.
  torch::Tensor regathered(const torch::Tensor& block, std::int64_t positions) {
    if (!block_.defined() || !block_.is_same(block)) {
      torch::NoGradGuard no_grad;
      block_ = block;
      whole_ = gather_sequence(block, group, positions, /*sum_gradient=*/false);
    }
    return whole_;
  }

 private:
  torch::Tensor block_;
  torch::Tensor whole_;
};

// Under sequence parallelism: `gathered` (every position of `block`) · Wᵀ + b, keeping only the
// block for backward, where the weight's gradient gathers the positions again: a layer's saved
// activations are then its blocks (as Megatron-LM's sequence parallelism keeps them), not the
// whole sequence torch::linear would keep.
class GatheredLinear : public torch::autograd::Function<GatheredLinear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gathered,
                               const torch::Tensor& block, const torch::Tensor& weight,
                               const torch::Tensor& bias, SequenceState* state) {
    ctx->saved_data["state"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(state));
    ctx->saved_data["length"] = state->current_length();
    // (No bias: an empty tensor, autograd's functions taking no undefined inputs.)
    const bool has_bias = bias.numel() > 0;
    ctx->saved_data["bias"] = has_bias;
    ctx->save_for_backward({block, weight});
    return torch::linear(gathered, weight, has_bias ? bias : torch::Tensor());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* state = reinterpret_cast<SequenceState*>(
        static_cast<std::intptr_t>(ctx->saved_data["state"].toInt()));
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& block = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor dy = grads.at(0);
    const std::int64_t out = weight.size(0), in = weight.size(1);
    torch::Tensor dx = dy.matmul(weight);
    torch::Tensor dw, db;
    if (ctx->needs_input_grad(2))
      dw = dy.reshape({-1, out}).t().matmul(
          state->regathered(block, ctx->saved_data["length"].toInt()).reshape({-1, in}));
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(3))
      db = dy.reshape({-1, out}).sum(0);
    return {dx, torch::Tensor(), dw, db, torch::Tensor()};
  }
};

// One copy_to_group per input: q, k and v (gate and up) read the same normalised input, so their
// input gradients are summed before one all-reduce instead of each being all-reduced (what
// Megatron's fused projections do). Holds the last input it copied, so that its address cannot
// be taken by another tensor while it is remembered.
//
// Under sequence parallelism the layers' inputs are blocks of the positions: the copy is every
// position gathered (one all-gather for q, k and v; their input gradients reduce-scattered once).
class SharedCopy {
 public:
  explicit SharedCopy(dist::ProcessGroup& group, std::shared_ptr<SequenceState> sequence = {})
      : group_(group), sequence_(std::move(sequence)) {}
  SequenceState* sequence() const { return sequence_.get(); }
  torch::Tensor of(const torch::Tensor& x) {
    const bool gathers = sequence_ != nullptr;
    if (!gathers && (!torch::GradMode::is_enabled() || !x.requires_grad()))
      return x;  // nothing flows back
    if (!input_.defined() || !input_.is_same(x)) {
      input_ = x;
      copy_ = gathers ? gather_sequence(x, group_, sequence_->current_length(),
                                        /*sum_gradient=*/true)
                      : copy_to_group(x, group_);
    }
    return copy_;
  }

 private:
  dist::ProcessGroup& group_;
  std::shared_ptr<SequenceState> sequence_;  // null: no sequence parallelism
  torch::Tensor input_;
  torch::Tensor copy_;
};

// x·W_rᵀ + b_r from the shared copy of x (column_parallel_linear with the copy shared).
torch::Tensor column_block(SharedCopy& copies, const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias) {
  return torch::linear(copies.of(x), weight, bias);
}

class ColumnLinear : public model::SplitLinear {
 public:
  explicit ColumnLinear(std::shared_ptr<SharedCopy> copies) : copies_(std::move(copies)) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias) override {
    if (copies_->sequence() != nullptr && torch::GradMode::is_enabled())
      return GatheredLinear::apply(copies_->of(x), x, weight,
                                   bias.defined() ? bias : torch::empty({0}, weight.options()),
                                   copies_->sequence());
    return column_block(*copies_, x, weight, bias);
  }
  // The adapter reads the same copy of x (its input gradient joins the one all-reduce); its B is
  // split by rows like the weight, so its output is this rank's block too.
  torch::Tensor adapt(const torch::Tensor& x, const torch::Tensor& y, model::LinearAdapter& adapter,
                      bool training) override {
    return adapter.forward(copies_->of(x), y, training);
  }

 protected:
  std::shared_ptr<SharedCopy> copies_;
};

class RowLinear : public model::SplitLinear {
 public:
  // `scatters`: sequence parallelism (the sum reduce-scattered over the positions).
  RowLinear(dist::ProcessGroup& group, bool scatters) : group_(group), scatters_(scatters) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias) override {
    if (!scatters_) return row_parallel_linear(x, weight, bias, group_);
    torch::Tensor y = reduce_scatter_sequence(torch::linear(x, weight), group_);
    return bias.defined() ? y + bias : y;
  }
  // The adapter's A is split by columns like the weight: its low-rank product is summed over the
  // ranks before the whole B (scattered over the positions like the layer's output).
  torch::Tensor adapt(const torch::Tensor& x, const torch::Tensor& y, model::LinearAdapter& adapter,
                      bool training) override {
    model::AdapterSplit split;
    split.reduce = [this](const torch::Tensor& h) {
      return scatters_ ? reduce_scatter_sequence(h, group_) : reduce_from_group(h, group_);
    };
    split.input_is_block = true;
    return adapter.forward(x, y, training, &split);
  }

 private:
  dist::ProcessGroup& group_;
  bool scatters_;
};

// Logits split along the vocabulary: their loss spans the ranks.
class VocabularyLoss : public model::SplitLogits {
 public:
  explicit VocabularyLoss(dist::ProcessGroup& group) : group_(group) {}
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) override {
    return vocab_parallel_cross_entropy(logits, targets, group_);
  }

 protected:
  // The loss a block of rows at a time through this rank's block of the head, from the head's
  // input as `copies` brings it to the ranks (whose backward sums its gradient over them).
  torch::Tensor head_loss_from(SharedCopy& copies, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& targets) {
    const torch::Tensor x = copies.of(hidden);
    model::VocabularySplit split;
    split.first = weight.size(0) * group_.rank();
    split.max_over_ranks = [this](torch::Tensor& t) {
      if (group_.size() > 1) t = std::get<0>(gather_blocks(t, group_).max(0));
    };
    split.sum_over_ranks = [this](torch::Tensor& t) { group_.all_reduce(t); };
    return model::head_cross_entropy(x.reshape({-1, x.size(-1)}), weight, bias, targets, 0, &split);
  }

  dist::ProcessGroup& group_;
};

// An output head split along the vocabulary: a column-parallel layer whose logits stay split.
class VocabularyHead : public ColumnLinear, public VocabularyLoss {
 public:
  VocabularyHead(dist::ProcessGroup& group, std::shared_ptr<SharedCopy> copies)
      : ColumnLinear(std::move(copies)), VocabularyLoss(group) {}
  torch::Tensor head_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                          const torch::Tensor& bias, const torch::Tensor& targets) override {
    return head_loss_from(*copies_, hidden, weight, bias, targets);
  }
};

// An embedding split along the vocabulary; as a tied head, its logits stay split too.
class VocabularyEmbedding : public model::SplitEmbedding, public VocabularyLoss {
 public:
  VocabularyEmbedding(dist::ProcessGroup& group, std::shared_ptr<SharedCopy> copies)
      : VocabularyLoss(group), copies_(std::move(copies)) {}
  torch::Tensor lookup(const torch::Tensor& ids, const torch::Tensor& weight) override {
    return vocab_parallel_embedding(ids, weight, group_);
  }
  torch::Tensor attend(const torch::Tensor& hidden, const torch::Tensor& weight) override {
    return column_block(*copies_, hidden, weight, torch::Tensor());
  }
  torch::Tensor head_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                          const torch::Tensor& bias, const torch::Tensor& targets) override {
    return head_loss_from(*copies_, hidden, weight, bias, targets);
  }

 private:
  std::shared_ptr<SharedCopy> copies_;
};

void replace(torch::Tensor& parameter, const torch::Tensor& block) {
  torch::NoGradGuard no_grad;
  parameter.set_data(block);
}

}  // namespace

std::vector<SplitParameter> split_model(
    model::PretrainedModel& m, dist::ProcessGroup& group,
    const std::map<std::string, std::vector<std::int64_t>>& whole_shapes, bool sequence_parallel) {
  const hf::FamilyTraits& family = hf::family_of(m.config());
  const int rank = group.rank(), size = group.size();
  hf::check_tensor_parallel(m.config(), size);
  // Parameter name → how it is cut.
  std::map<std::string, SplitParameter> cut;
  // The head (and a tied embedding's) reads every position; with sequence parallelism the
  // layers' column-parallel layers gather theirs.
  const auto copies = std::make_shared<SharedCopy>(group);
  std::shared_ptr<SequenceState> sequence;
  if (sequence_parallel) {
    sequence = std::make_shared<SequenceState>(group);
    dist::ProcessGroup* g = &group;
    m.sequence_shards.enter = [sequence, g](const torch::Tensor& h) {
      sequence->length = h.size(1);
      model::begin_sequence_blocks(h.size(1), g->rank(), g->size());
      return split_sequence(h, *g);
    };
    m.sequence_shards.leave = [sequence, g](const torch::Tensor& h) {
      model::end_sequence_blocks();
      // Every rank's use of the positions after this is the same (the head's input gradient is
      // all-reduced): backward takes this rank's block.
      return gather_sequence(h, *g, sequence->length, /*sum_gradient=*/false);
    };
    // Pipeline stages: the stage boundary carries this rank's block (PipelineStages sends and
    // receives blocks of ⌈T / parts⌉ positions).
    m.sequence_shards.resume = [sequence, g](std::int64_t length) {
      sequence->length = length;
      model::begin_sequence_blocks(length, g->rank(), g->size());
    };
    m.sequence_shards.pause = [] { model::end_sequence_blocks(); };
    m.sequence_shards.parts = size;
  }
  const auto layer_copies =
      sequence_parallel ? std::make_shared<SharedCopy>(group, sequence) : copies;
  auto split_parameter = [&](torch::Tensor& parameter, const std::string& name, std::int64_t dim,
                             int parts, int replicas = 1) {
    SplitParameter p;
    p.name = name;
    p.dim = dim;
    p.parts = parts;
    p.replicas = replicas;
    if (parameter.numel() == 0 && whole_shapes.count(name)) {
      p.whole_shape = whole_shapes.at(name);  // released: nothing to cut here
    } else {
      p.whole_shape = parameter.sizes().vec();
      replace(parameter, block_of(parameter.detach(), p, rank, size));
    }
    cut[name] = p;
  };
  for (const auto& item : m.named_modules("", /*include_self=*/false)) {
    const hf::TensorSplitRule* rule = hf::tensor_split_of(family, item.key());
    if (rule == nullptr) continue;
    const std::string prefix = item.key() + ".";
    if (auto* linear = dynamic_cast<model::LinearImpl*>(item.value().get())) {
      const bool out_in = linear->layout == model::LinearImpl::Layout::OutIn;
      const std::int64_t outputs = out_in ? 0 : 1, inputs = out_in ? 1 : 0;
      const bool row = rule->split == hf::TensorSplit::Row;
      const int replicas = replicas_of(*rule, m.config(), size);
      split_parameter(linear->weight, prefix + "weight", row ? inputs : outputs, rule->parts,
                      replicas);
      if (linear->bias.defined() && !row)
        split_parameter(linear->bias, prefix + "bias", 0, rule->parts, replicas);
      if (rule->split == hf::TensorSplit::Column)
        linear->split = std::make_shared<ColumnLinear>(layer_copies);
      else if (row)
        linear->split = std::make_shared<RowLinear>(group, sequence_parallel);
      else
        linear->split = std::make_shared<VocabularyHead>(group, copies);
    } else if (auto* embedding = dynamic_cast<model::EmbeddingImpl*>(item.value().get())) {
      if (rule->split != hf::TensorSplit::Vocabulary)
        throw Error(ErrorKind::Internal, family.model_type +
                                             "'s tensor-parallel plan splits the embedding " +
                                             item.key() + " other than by vocabulary");
      split_parameter(embedding->weight, prefix + "weight", 0, 1);
      embedding->split = std::make_shared<VocabularyEmbedding>(group, copies);
    } else {
      throw Error(ErrorKind::Internal, family.model_type + "'s tensor-parallel plan names " +
                                           item.key() +
                                           ", which is neither a linear layer nor an embedding");
    }
  }
  std::vector<SplitParameter> parameters;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    const auto found = cut.find(item.key());
    if (found != cut.end()) {
      parameters.push_back(found->second);
      continue;
    }
    SplitParameter p;
    p.name = item.key();
    p.whole_shape = item.value().numel() == 0 && whole_shapes.count(item.key())
                        ? whole_shapes.at(item.key())
                        : item.value().sizes().vec();
    parameters.push_back(std::move(p));
  }
  return parameters;
}

int replicas_of(const hf::TensorSplitRule& rule, const hf::ModelConfig& config, int size) {
  // Fewer kv heads than ranks (GQA): each kv head's block is held by several ranks.
  const std::int64_t kv_heads = config.num_key_value_heads;
  return rule.kv_heads && kv_heads > 0 && kv_heads < size ? size / static_cast<int>(kv_heads) : 1;
}

torch::Tensor block_of(const torch::Tensor& whole, const SplitParameter& p, int rank, int size) {
  if (p.dim < 0) return whole;
  if (p.replicas > 1) {
    rank /= p.replicas;
    size /= p.replicas;
  }
  if (p.parts == 1) return shard(whole, p.dim, rank, size, p.name.c_str());
  std::vector<torch::Tensor> blocks;
  for (const torch::Tensor& part : whole.chunk(p.parts, p.dim))
    blocks.push_back(shard(part, p.dim, rank, size, p.name.c_str()));
  return torch::cat(blocks, p.dim);
}

torch::Tensor gather_whole(const torch::Tensor& block, const SplitParameter& p,
                           dist::ProcessGroup& group) {
  if (p.dim < 0 || group.size() == 1) return block;
  std::vector<torch::Tensor> blocks = gather_blocks(block, group).unbind(0);
  if (p.replicas > 1) {  // one copy of each block: the first holder's
    std::vector<torch::Tensor> distinct;
    for (std::size_t i = 0; i < blocks.size(); i += static_cast<std::size_t>(p.replicas))
      distinct.push_back(blocks[i]);
    blocks = std::move(distinct);
  }
  if (p.parts == 1) return torch::cat(blocks, p.dim);
  // Each rank's block holds its block of every part: part i is the ranks' i-th pieces in order.
  std::vector<torch::Tensor> parts;
  for (int i = 0; i < p.parts; ++i) {
    std::vector<torch::Tensor> pieces;
    for (const torch::Tensor& b : blocks)
      pieces.push_back(b.chunk(p.parts, p.dim)[static_cast<std::size_t>(i)]);
    parts.push_back(torch::cat(pieces, p.dim));
  }
  return torch::cat(parts, p.dim);
}

void unsplit_model(model::PretrainedModel& m, const std::vector<SplitParameter>& layout,
                   dist::ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  auto parameters = m.named_parameters();
  for (const SplitParameter& p : layout)
    if (p.dim >= 0)
      replace(parameters[p.name], gather_whole(parameters[p.name].detach(), p, group));
  for (const auto& item : m.named_modules("", /*include_self=*/false)) {
    if (auto* linear = dynamic_cast<model::LinearImpl*>(item.value().get())) linear->split.reset();
    if (auto* embedding = dynamic_cast<model::EmbeddingImpl*>(item.value().get()))
      embedding->split.reset();
  }
  m.sequence_shards = {};
}

bool sequence_parallel_shared(const hf::ModelConfig& config, const std::string& name) {
  // "<layers>.<i>." at the start or after a dot: "model.layers.3.input_layernorm.weight",
  // "transformer.h.0.ln_1.bias", "base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight".
  const std::string layers = hf::family_of(config).pipeline_plan.layers + ".";
  for (std::size_t at = name.find(layers); at != std::string::npos;
       at = name.find(layers, at + 1)) {
    const std::size_t next = at + layers.size();
    if ((at == 0 || name[at - 1] == '.') && next < name.size() &&
        std::isdigit(static_cast<unsigned char>(name[next])))
      return true;
  }
  return false;
}

torch::Tensor sum_over_replicas(const torch::Tensor& gradient, const SplitParameter& p,
                                dist::ProcessGroup& group) {
  if (p.replicas <= 1 || group.size() == 1) return gradient;
  // Each rank's block in its place of a zero tensor of every block, summed over the group: block
  // b is then the sum of its holders' shares. (All blocks of k or v: a layer's kv projection,
  // small beside the layer.)
  const int blocks = group.size() / p.replicas;
  const int mine = group.rank() / p.replicas;
  std::vector<std::int64_t> shape = gradient.sizes().vec();
  shape[static_cast<std::size_t>(p.dim)] *= blocks;
  torch::Tensor all = torch::zeros(shape, gradient.options());
  all.narrow(p.dim, mine * gradient.size(p.dim), gradient.size(p.dim)).copy_(gradient);
  group.all_reduce(all);
  return all.narrow(p.dim, mine * gradient.size(p.dim), gradient.size(p.dim)).contiguous();
}

}  // namespace tessera::parallel
