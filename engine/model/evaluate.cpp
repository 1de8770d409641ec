#include "model/evaluate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace tessera::model {

double EvalResult::mean_loss() const {
  return predicted_tokens > 0 ? total_loss / static_cast<double>(predicted_tokens) : 0.0;
}

double EvalResult::perplexity() const {
  return std::exp(mean_loss());
}

EvalResult evaluate_causal_lm(PretrainedModel& model,
                              const std::vector<std::vector<std::int32_t>>& sequences,
                              const EvalOptions& options) {
  if (model.head() != TaskHead::CausalLM)
    throw_unsupported(model.config().model_type + " " + task_head_name(model.head()) +
                          ": evaluation of token cross-entropy needs a causal LM",
                      "load a *ForCausalLM / GPT2LMHeadModel checkpoint");
  // Longest first, so each batch pads little and a too-long sequence fails early.
  std::vector<std::size_t> order(sequences.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return sequences[a].size() > sequences[b].size();
  });
  while (!order.empty() && sequences[order.back()].size() < 2) order.pop_back();
  if (order.empty())
    throw_invalid("evaluation: no sequence has two tokens or more, so nothing is predicted",
                  "give longer texts or a larger --max-length");

  torch::NoGradGuard no_grad;
  torch::InferenceMode inference;
  const bool was_training = model.is_training();
  model.eval();
  EvalResult result;
  result.sequences = static_cast<std::int64_t>(sequences.size());
  const std::int64_t budget = std::max<std::int64_t>(options.batch_tokens, 1);
  std::size_t done = sequences.size() - order.size();  // the one-token ones count as done
  for (std::size_t start = 0; start < order.size();) {
    const auto width = static_cast<std::int64_t>(sequences[order[start]].size());
    std::size_t end = start + 1;
    while (end < order.size() && static_cast<std::int64_t>(end - start + 1) * width <= budget)
      ++end;
    const auto rows = static_cast<std::int64_t>(end - start);
    torch::Tensor ids = torch::zeros({rows, width}, torch::kInt64);
    torch::Tensor mask = torch::zeros({rows, width}, torch::kInt64);
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto& seq = sequences[order[start + static_cast<std::size_t>(r)]];
      const auto n = static_cast<std::int64_t>(seq.size());
      ids[r].narrow(0, 0, n).copy_(
          torch::tensor(std::vector<std::int64_t>(seq.begin(), seq.end()), torch::kInt64));
      mask[r].narrow(0, 0, n).fill_(1);
    }
    ForwardInput in;
    in.input_ids = ids.to(options.device);
    in.attention_mask = mask.to(options.device);  // right padding: real tokens never see it
    // The loss is taken where the logits are: only its sum comes back to the host, never the
    // [rows, width, vocab] logits.
    torch::Tensor logits = model.forward(in).logits.to(torch::kFloat32);
    torch::Tensor predicted = logits.narrow(1, 0, width - 1).reshape({-1, logits.size(-1)});
    torch::Tensor targets = in.input_ids.narrow(1, 1, width - 1).reshape({-1});
    torch::Tensor valid = mask.narrow(1, 1, width - 1).reshape({-1}).to(torch::kBool);
    torch::Tensor losses = torch::nn::functional::cross_entropy(
        predicted, targets,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    result.total_loss +=
        losses.masked_select(valid.to(losses.device())).to(torch::kFloat64).sum().item<double>();
    result.predicted_tokens += valid.sum().item<std::int64_t>();
    done += static_cast<std::size_t>(rows);
    if (options.progress) options.progress(done, sequences.size());
    start = end;
  }
  if (was_training) model.train();
  return result;
}

}  // namespace tessera::model
