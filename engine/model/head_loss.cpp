#include "model/head_loss.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <optional>

namespace tessera::model {
namespace {

constexpr std::int64_t kIgnored = -100;  // transformers' ignore_index

// Adds one block's share of the head's gradients, given g = d(·)/d(logits) of its rows (float32)
// and their hidden states h (from row `first`): the bias's (float32), the hidden rows' (written:
// a row's gradient comes from its own block alone) and the weight's, each where defined; the
// latter two through g narrowed to the compute dtype, as autograd passes it to the head's matmul.
void add_block_gradients(const torch::Tensor& g, const torch::Tensor& h,
                         const torch::Tensor& weight, std::int64_t first,
                         torch::Tensor& grad_hidden, torch::Tensor& grad_weight,
                         torch::Tensor& grad_bias) {
  if (grad_bias.defined()) grad_bias.add_(g.sum(0));
  const torch::Tensor g_compute = g.to(h.scalar_type());
  if (grad_hidden.defined()) {
    torch::Tensor rows_of_grad = grad_hidden.narrow(0, first, g.size(0));
    torch::mm_out(rows_of_grad, g_compute, weight);
  }
  if (grad_weight.defined()) grad_weight.addmm_(g_compute.t(), h);
}

// The loss, and its gradients computed block by block in forward: backward has only to scale
// them by the loss's own gradient (the loss is a scalar, so they are linear in it).
class HeadCrossEntropy : public torch::autograd::Function<HeadCrossEntropy> {
 public:
  // `bias` is optional: autograd takes no undefined tensor as an input.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight,
                               const std::optional<torch::Tensor>& bias,
                               const torch::Tensor& targets, std::int64_t block_rows,
                               const VocabularySplit* split, bool hidden_grad, bool weight_grad,
                               bool bias_grad) {
    const std::int64_t rows = hidden.size(0), columns = weight.size(0);
    const std::int64_t first_column = split ? split->first : 0;
    const auto f32 = hidden.options().dtype(torch::kFloat32);
    const torch::Tensor counted = targets.ne(kIgnored);
    // The targets in this block of the vocabulary (all of them without a split).
    const torch::Tensor mine =
        counted & targets.ge(first_column) & targets.lt(first_column + columns);
    const torch::Tensor local_targets =
        (targets - first_column).masked_fill(mine.logical_not(), 0).unsqueeze(1);
    const torch::Tensor count = counted.sum().to(torch::kFloat32);
    // The gradients' factor 1/count (no division by zero: with nothing counted they are zero).
    const torch::Tensor scale = count.clamp_min(1.0).reciprocal();
    torch::Tensor loss_sum = torch::zeros({}, f32);
    torch::Tensor grad_hidden = hidden_grad ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor grad_weight = weight_grad ? torch::zeros_like(weight) : torch::Tensor();
    torch::Tensor grad_bias = bias_grad ? torch::zeros({columns}, f32) : torch::Tensor();
    const bool any_grad = hidden_grad || weight_grad || bias_grad;
    for (std::int64_t first = 0; first < rows; first += block_rows) {
      const std::int64_t length = std::min(block_rows, rows - first);
      const torch::Tensor h = hidden.narrow(0, first, length);
      const torch::Tensor target = local_targets.narrow(0, first, length);
      const torch::Tensor is_mine = mine.narrow(0, first, length);
      const torch::Tensor weights = counted.narrow(0, first, length).to(torch::kFloat32);
      // As the whole-logits loss: logits in the hidden states' dtype, widened to float32; then,
      // in place, shifted by the row's largest logit (over every rank's block) and exponentiated.
      torch::Tensor logits = torch::linear(h, weight, bias).to(torch::kFloat32);
      torch::Tensor row_max = std::get<0>(logits.max(1));
      if (split) split->max_over_ranks(row_max);
      logits.sub_(row_max.unsqueeze(1));
      // [sum of exponentials, the target's shifted logit] of each row, over the ranks.
      torch::Tensor figures = torch::empty({2, length}, f32);
      figures[1].copy_(logits.gather(1, target).squeeze(1).masked_fill(is_mine.logical_not(), 0));
      torch::Tensor exps = logits.exp_();
      figures[0].copy_(exps.sum(1));
      if (split) split->sum_over_ranks(figures);
      loss_sum.add_(((figures[0].log() - figures[1]) * weights).sum());
      if (!any_grad) continue;
      // d(mean loss)/d(logits) = (softmax − one-hot(target)) / count on the rows that count,
      // made in place of the exponentials.
      torch::Tensor g = exps.div_(figures[0].unsqueeze(1));
      g.scatter_add_(1, target, (is_mine.to(torch::kFloat32) * -1.0).unsqueeze(1));
      g.mul_((weights * scale).unsqueeze(1));
      add_block_gradients(g, h, weight, first, grad_hidden, grad_weight, grad_bias);
    }
    ctx->save_for_backward({grad_hidden, grad_weight,
                            bias_grad ? grad_bias.to(bias->scalar_type()) : torch::Tensor()});
    // transformers' mean: NaN when no target counts (0 / 0), as its cross-entropy gives.
    return loss_sum / count;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& loss_grad = grads.at(0);
    auto scaled = [&](const torch::Tensor& gradient) {
      return gradient.defined() ? gradient * loss_grad.to(gradient.scalar_type()) : gradient;
    };
    return {scaled(saved[0]), scaled(saved[1]), scaled(saved[2]), torch::Tensor(), torch::Tensor(),
            torch::Tensor(),  torch::Tensor(),  torch::Tensor(),  torch::Tensor()};
  }
};

// In place of a block's float32 logits: d log p(target) / d logits = one-hot(target) − softmax,
// times each row's factor (0 on the rows that do not count).
torch::Tensor log_prob_gradient_(torch::Tensor& logits, const torch::Tensor& log_sum_exp,
                                 const torch::Tensor& target, const torch::Tensor& row_factor) {
  torch::Tensor g = logits.sub_(log_sum_exp.unsqueeze(1)).exp_().neg_();
  g.scatter_add_(1, target, torch::ones({logits.size(0), 1}, logits.options()));
  return g.mul_(row_factor.unsqueeze(1));
}

// log p(target) per row. Two ways to its gradients: with the head frozen, d log p / d hidden of
// each row is made in forward (a row's value depends only on its own hidden state); with the head
// training, backward recomputes each block's logits from the saved rows' log-sum-exp.
class HeadTargetLogProbs : public torch::autograd::Function<HeadTargetLogProbs> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight,
                               const std::optional<torch::Tensor>& bias,
                               const torch::Tensor& targets, std::int64_t block_rows,
                               bool hidden_grad, bool head_trains) {
    const std::int64_t rows = hidden.size(0);
    const auto f32 = hidden.options().dtype(torch::kFloat32);
    const torch::Tensor counted = targets.ne(kIgnored);
    const torch::Tensor target = targets.masked_fill(counted.logical_not(), 0).unsqueeze(1);
    const torch::Tensor bias_or_none = bias ? *bias : torch::Tensor();
    torch::Tensor log_probs = torch::empty({rows}, f32);
    torch::Tensor log_sum_exp = head_trains ? torch::empty({rows}, f32) : torch::Tensor();
    // Made in forward only where backward will not recompute the blocks.
    torch::Tensor jacobian =
        hidden_grad && !head_trains ? torch::empty_like(hidden) : torch::Tensor();
    for (std::int64_t first = 0; first < rows; first += block_rows) {
      const std::int64_t length = std::min(block_rows, rows - first);
      const torch::Tensor h = hidden.narrow(0, first, length);
      const torch::Tensor t = target.narrow(0, first, length);
      const torch::Tensor is_counted = counted.narrow(0, first, length);
      torch::Tensor logits = torch::linear(h, weight, bias_or_none).to(torch::kFloat32);
      const torch::Tensor lse = logits.logsumexp(1);
      log_probs.narrow(0, first, length)
          .copy_((logits.gather(1, t).squeeze(1) - lse).masked_fill(is_counted.logical_not(), 0));
      if (head_trains) log_sum_exp.narrow(0, first, length).copy_(lse);
      if (!jacobian.defined()) continue;
      const torch::Tensor g = log_prob_gradient_(logits, lse, t, is_counted.to(torch::kFloat32));
      torch::Tensor no_weight_grad, no_bias_grad;
      add_block_gradients(g, h, weight, first, jacobian, no_weight_grad, no_bias_grad);
    }
    if (head_trains) {
      ctx->save_for_backward({hidden, weight, bias_or_none, targets, log_sum_exp});
    } else {
      ctx->save_for_backward({jacobian});
    }
    ctx->saved_data["block_rows"] = block_rows;
    ctx->saved_data["hidden_grad"] = hidden_grad;
    ctx->saved_data["head_trains"] = head_trains;
    ctx->saved_data["weight_grad"] = weight.requires_grad();
    ctx->saved_data["bias_grad"] = bias && bias->requires_grad();
    return log_probs;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor row_grad = grads.at(0).to(torch::kFloat32);
    const bool hidden_grad = ctx->saved_data["hidden_grad"].toBool();
    const bool head_trains = ctx->saved_data["head_trains"].toBool();
    torch::autograd::tensor_list out(7);
    if (!head_trains) {
      if (hidden_grad) out[0] = saved[0] * row_grad.to(saved[0].scalar_type()).unsqueeze(1);
      return out;
    }
    const torch::Tensor &hidden = saved[0], &weight = saved[1], &bias = saved[2],
                        &targets = saved[3], &log_sum_exp = saved[4];
    const std::int64_t rows = hidden.size(0);
    const std::int64_t block_rows = ctx->saved_data["block_rows"].toInt();
    const auto f32 = hidden.options().dtype(torch::kFloat32);
    const torch::Tensor counted = targets.ne(kIgnored);
    const torch::Tensor target = targets.masked_fill(counted.logical_not(), 0).unsqueeze(1);
    const torch::Tensor weights = row_grad * counted.to(torch::kFloat32);
    torch::Tensor grad_hidden = hidden_grad ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor grad_weight =
        ctx->saved_data["weight_grad"].toBool() ? torch::zeros_like(weight) : torch::Tensor();
    torch::Tensor grad_bias = ctx->saved_data["bias_grad"].toBool()
                                  ? torch::zeros({weight.size(0)}, f32)
                                  : torch::Tensor();
    for (std::int64_t first = 0; first < rows; first += block_rows) {
      const std::int64_t length = std::min(block_rows, rows - first);
      const torch::Tensor h = hidden.narrow(0, first, length);
      // From the logits recomputed, times each row's gradient.
      torch::Tensor logits = torch::linear(h, weight, bias).to(torch::kFloat32);
      const torch::Tensor g =
          log_prob_gradient_(logits, log_sum_exp.narrow(0, first, length),
                             target.narrow(0, first, length), weights.narrow(0, first, length));
      add_block_gradients(g, h, weight, first, grad_hidden, grad_weight, grad_bias);
    }
    out[0] = grad_hidden;
    out[1] = grad_weight;
    out[2] = grad_bias.defined() ? grad_bias.to(bias.scalar_type()) : torch::Tensor();
    return out;
  }
};

// The reader in an autograd context (saved_data holds IValues: a capsule carries any object).
struct ReaderCapsule : torch::CustomClassHolder {
  explicit ReaderCapsule(HeadRowReader r) : read(std::move(r)) {}
  HeadRowReader read;
};

class StoredHeadTargetLosses : public torch::autograd::Function<StoredHeadTargetLosses> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const HeadRowReader* read, std::int64_t vocabulary,
                               const torch::Tensor& targets, std::int64_t block, bool hidden_grad) {
    const std::int64_t rows = hidden.size(0), width = hidden.size(1);
    const auto f32 = hidden.options().dtype(torch::kFloat32);
    const torch::Tensor counted = targets.ne(kIgnored);
    const torch::Tensor target = targets.masked_fill(counted.logical_not(), 0);
    torch::Tensor running_max = torch::full({rows}, -std::numeric_limits<float>::infinity(), f32);
    torch::Tensor exp_sum = torch::zeros({rows}, f32);
    torch::Tensor target_logit = torch::zeros({rows}, f32);
    // Σ exp(logit − running max)·weight-row, and the target's weight row, of each row.
    torch::Tensor weighted = hidden_grad ? torch::zeros({rows, width}, f32) : torch::Tensor();
    torch::Tensor target_row = hidden_grad ? torch::zeros_like(hidden) : torch::Tensor();
    for (std::int64_t first = 0; first < vocabulary; first += block) {
      const std::int64_t length = std::min(block, vocabulary - first);
      const torch::Tensor weight = (*read)(first, length);
      torch::Tensor logits = torch::linear(hidden, weight).to(torch::kFloat32);
      const torch::Tensor in_block = counted & target.ge(first) & target.lt(first + length);
      const torch::Tensor at = torch::nonzero(in_block).squeeze(1);
      if (at.numel() > 0) {
        const torch::Tensor local = target.index_select(0, at) - first;
        target_logit.index_copy_(
            0, at, logits.index_select(0, at).gather(1, local.unsqueeze(1)).squeeze(1));
        if (hidden_grad) target_row.index_copy_(0, at, weight.index_select(0, local));
      }
      const torch::Tensor new_max = torch::maximum(running_max, std::get<0>(logits.max(1)));
      // exp(−inf) = 0: nothing accumulated yet.
      const torch::Tensor rescale = (running_max - new_max).exp_();
      torch::Tensor exps = logits.sub_(new_max.unsqueeze(1)).exp_();
      exp_sum.mul_(rescale).add_(exps.sum(1));
      if (hidden_grad)
        weighted.mul_(rescale.unsqueeze(1)).add_(torch::mm(exps.to(hidden.scalar_type()), weight));
      running_max = new_max;
    }
    const torch::Tensor losses =
        (running_max + exp_sum.log() - target_logit).masked_fill(counted.logical_not(), 0);
    torch::Tensor jacobian;
    if (hidden_grad)  // d(−log p)/d hidden = softmax·weight − the target's row
      jacobian = (weighted.div_(exp_sum.unsqueeze(1)) - target_row.to(torch::kFloat32))
                     .mul_(counted.to(torch::kFloat32).unsqueeze(1))
                     .to(hidden.scalar_type());
    ctx->save_for_backward({jacobian});
    return losses;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::Tensor jacobian = ctx->get_saved_variables().at(0);
    torch::autograd::tensor_list out(6);
    if (jacobian.defined()) out[0] = jacobian * grads.at(0).to(jacobian.scalar_type()).unsqueeze(1);
    return out;
  }
};

class StoredHeadLogits : public torch::autograd::Function<StoredHeadLogits> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const HeadRowReader* read, std::int64_t vocabulary,
                               std::int64_t block) {
    const std::int64_t width = hidden.size(-1);
    const torch::Tensor rows = hidden.reshape({-1, width});
    std::vector<std::int64_t> shape = hidden.sizes().vec();
    shape.back() = vocabulary;
    torch::Tensor logits = torch::empty({rows.size(0), vocabulary}, hidden.options());
    for (std::int64_t first = 0; first < vocabulary; first += block) {
      const std::int64_t length = std::min(block, vocabulary - first);
      logits.narrow(1, first, length).copy_(torch::linear(rows, (*read)(first, length)));
    }
    ctx->saved_data["read"] = c10::IValue::make_capsule(c10::make_intrusive<ReaderCapsule>(*read));
    ctx->saved_data["vocabulary"] = vocabulary;
    ctx->saved_data["block"] = block;
    ctx->saved_data["shape"] = hidden.sizes().vec();
    return logits.view(shape);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto capsule = ctx->saved_data["read"].toCapsule();
    const HeadRowReader& read = static_cast<ReaderCapsule*>(capsule.get())->read;
    const std::int64_t vocabulary = ctx->saved_data["vocabulary"].toInt();
    const std::vector<std::int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const torch::Tensor grad = grads.at(0).reshape({-1, vocabulary});
    // Summed over the blocks in float32: one rounding to the compute dtype, as one matmul.
    torch::Tensor grad_hidden =
        torch::zeros({grad.size(0), shape.back()}, grad.options().dtype(torch::kFloat32));
    const std::int64_t block = ctx->saved_data["block"].toInt();
    for (std::int64_t first = 0; first < vocabulary; first += block) {
      const std::int64_t length = std::min(block, vocabulary - first);
      grad_hidden.addmm_(grad.narrow(1, first, length).to(torch::kFloat32),
                         read(first, length).to(torch::kFloat32));
    }
    return {grad_hidden.to(grad.scalar_type()).view(shape), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

bool head_log_probs_read_weight_in_backward(const at::Tensor& weight, const at::Tensor& bias) {
  return torch::GradMode::is_enabled() &&
         (weight.requires_grad() || (bias.defined() && bias.requires_grad()));
}

at::Tensor head_target_log_probs(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& targets,
                                 std::int64_t block_rows) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "head_target_log_probs: hidden [N, H] and weight [V, H] expected");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "head_target_log_probs: targets [N] expected");
  if (block_rows <= 0) block_rows = head_loss_block_rows(weight.size(0), hidden.is_cuda());
  const bool head_trains = head_log_probs_read_weight_in_backward(weight, bias);
  const bool hidden_grad = torch::GradMode::is_enabled() && hidden.requires_grad();
  return HeadTargetLogProbs::apply(
      hidden.contiguous(), weight,
      bias.defined() ? std::optional<torch::Tensor>(bias) : std::nullopt, targets.to(torch::kInt64),
      block_rows, hidden_grad, head_trains);
}

at::Tensor head_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                              const at::Tensor& bias, const at::Tensor& targets,
                              std::int64_t block_rows, const VocabularySplit* split) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "head_cross_entropy: hidden [N, H] and weight [V, H] expected");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "head_cross_entropy: targets [N] expected");
  if (block_rows <= 0) block_rows = head_loss_block_rows(weight.size(0), hidden.is_cuda());
  const bool grad = torch::GradMode::is_enabled();
  const bool bias_grad = grad && bias.defined() && bias.requires_grad();
  return HeadCrossEntropy::apply(
      hidden.contiguous(), weight,
      bias.defined() ? std::optional<torch::Tensor>(bias) : std::nullopt, targets.to(torch::kInt64),
      block_rows, split, grad && hidden.requires_grad(), grad && weight.requires_grad(), bias_grad);
}

}  // namespace tessera::model

namespace tessera::model {

at::Tensor stored_head_target_losses(const at::Tensor& hidden, const HeadRowReader& read,
                                     std::int64_t vocabulary, const at::Tensor& targets,
                                     std::int64_t block) {
  TORCH_CHECK(hidden.dim() == 2, "stored_head_target_losses: hidden [N, H] expected");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "stored_head_target_losses: targets [N] expected");
  if (block <= 0)
    block = head_vocabulary_block(hidden.size(0), hidden.size(1), hidden.element_size());
  return StoredHeadTargetLosses::apply(hidden.contiguous(), &read, vocabulary,
                                       targets.to(torch::kInt64), block,
                                       torch::GradMode::is_enabled() && hidden.requires_grad());
}

at::Tensor stored_head_logits(const at::Tensor& hidden, const HeadRowReader& read,
                              std::int64_t vocabulary, std::int64_t block) {
  if (block <= 0) block = head_vocabulary_block(0, hidden.size(-1), hidden.element_size());
  return StoredHeadLogits::apply(hidden, &read, vocabulary, block);
}

}  // namespace tessera::model
