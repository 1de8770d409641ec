#include "train/preference.h"

#include <cmath>

#include "core/error.h"

namespace tessera::train {

namespace F = torch::nn::functional;

const char* preference_loss_name(PreferenceLoss loss) {
  switch (loss) {
    case PreferenceLoss::Dpo:
      return "dpo";
    case PreferenceLoss::Ipo:
      return "ipo";
    case PreferenceLoss::Simpo:
      return "simpo";
    case PreferenceLoss::Orpo:
      return "orpo";
    case PreferenceLoss::Kto:
      return "kto";
  }
  return "?";
}

PreferenceLoss preference_loss_from_name(const std::string& name, const std::string& field) {
  if (name == "dpo") return PreferenceLoss::Dpo;
  if (name == "ipo") return PreferenceLoss::Ipo;
  if (name == "simpo") return PreferenceLoss::Simpo;
  if (name == "orpo") return PreferenceLoss::Orpo;
  if (name == "kto") return PreferenceLoss::Kto;
  throw_invalid(field + ": \"" + name + "\" is not a preference objective",
                "use dpo, ipo, simpo, orpo or kto");
}

bool PreferenceOptions::needs_reference() const {
  return loss == PreferenceLoss::Dpo || loss == PreferenceLoss::Ipo || loss == PreferenceLoss::Kto;
}

bool PreferenceOptions::averages_log_probs() const {
  return loss == PreferenceLoss::Simpo || loss == PreferenceLoss::Orpo;
}

void validate(const PreferenceOptions& o, const std::string& field) {
  if (!(o.beta > 0.0) || !std::isfinite(o.beta))
    throw_invalid(field + ".beta: must be a finite number > 0", "0.1 is the usual value");
  if (!(o.label_smoothing >= 0.0 && o.label_smoothing < 0.5))
    throw_invalid(field + ".label_smoothing: must be in [0, 0.5)",
                  "0 trusts every pair; 0.1 assumes one pair in ten is mislabelled");
  if (o.label_smoothing > 0.0 && o.loss != PreferenceLoss::Dpo && o.loss != PreferenceLoss::Simpo)
    throw_invalid(
        field + ".label_smoothing: applies to dpo and simpo, not " + preference_loss_name(o.loss),
        "remove label_smoothing");
  if (!std::isfinite(o.simpo_gamma)) throw_invalid(field + ".simpo_gamma: must be a finite number");
  if (!(o.sft_weight >= 0.0) || !std::isfinite(o.sft_weight))
    throw_invalid(field + ".sft_weight: must be a finite number >= 0");
  for (const auto& [name, weight] :
       {std::pair<const char*, double>{"desirable_weight", o.desirable_weight},
        {"undesirable_weight", o.undesirable_weight}})
    if (!(weight > 0.0) || !std::isfinite(weight))
      throw_invalid(field + "." + name + ": must be a finite number > 0");
}

SequenceLogProbs labelled_sums(const torch::Tensor& log_probs, const torch::Tensor& labels) {
  const std::int64_t length = labels.size(1);
  if (length < 2) {
    const auto zeros = torch::zeros({labels.size(0)}, log_probs.options());
    return {zeros, zeros.clone()};
  }
  const torch::Tensor mask = labels.narrow(1, 1, length - 1).ne(-100).to(torch::kFloat32);
  return {(log_probs * mask).sum(1), mask.sum(1)};
}

PreferenceSums& PreferenceSums::operator+=(const PreferenceSums& o) {
  pairs += o.pairs;
  chosen += o.chosen;
  rejected += o.rejected;
  reward_chosen += o.reward_chosen;
  reward_rejected += o.reward_rejected;
  margin += o.margin;
  accuracy += o.accuracy;
  log_prob_chosen += o.log_prob_chosen;
  log_prob_rejected += o.log_prob_rejected;
  kl += o.kl;
  kl_batches += o.kl_batches;
  return *this;
}

namespace {

// log(1 − eˣ) for x < 0, without cancellation on either side of −ln 2.
torch::Tensor log1mexp(const torch::Tensor& x) {
  return torch::where(x < -std::log(2.0), torch::log1p(-torch::exp(x)),
                      torch::log(-torch::expm1(x)));
}

// −(1−ε)·logσ(z) − ε·logσ(−z)
torch::Tensor smoothed_sigmoid_loss(const torch::Tensor& z, double label_smoothing) {
  torch::Tensor loss = -F::logsigmoid(z) * (1.0 - label_smoothing);
  if (label_smoothing > 0.0) loss = loss - F::logsigmoid(-z) * label_smoothing;
  return loss;
}

double sum_of(const torch::Tensor& t) {
  return t.sum().to(torch::kFloat64).item<double>();
}

}  // namespace

PreferenceBatchLoss kto_loss(const PreferenceOptions& o, const SequenceLogProbs& policy,
                             const SequenceLogProbs& reference, const torch::Tensor& desirable,
                             double kl) {
  if (policy.tokens.numel() > 0 && policy.tokens.min().item<float>() < 1.0f)
    throw_invalid("an example has a completion with no token left",
                  "raise dataset.max_length, or shorten the prompts");
  const torch::Tensor wanted = desirable.to(policy.sum.device(), torch::kBool);
  const torch::Tensor log_ratio = policy.sum - reference.sum.detach();
  const torch::Tensor desirable_loss = 1.0 - torch::sigmoid(o.beta * (log_ratio - kl));
  const torch::Tensor undesirable_loss = 1.0 - torch::sigmoid(o.beta * (kl - log_ratio));
  const torch::Tensor per_example = torch::where(wanted, o.desirable_weight * desirable_loss,
                                                 o.undesirable_weight * undesirable_loss);
  PreferenceBatchLoss out;
  out.loss = per_example.mean();
  const torch::Tensor rewards = o.beta * log_ratio.detach();
  const torch::Tensor unwanted = wanted.logical_not();
  const torch::Tensor log_probs = policy.sum.detach();
  out.sums.chosen = sum_of(wanted.to(torch::kFloat64));
  out.sums.rejected = sum_of(unwanted.to(torch::kFloat64));
  out.sums.reward_chosen = sum_of(rewards.masked_select(wanted));
  out.sums.reward_rejected = sum_of(rewards.masked_select(unwanted));
  out.sums.log_prob_chosen = sum_of(log_probs.masked_select(wanted));
  out.sums.log_prob_rejected = sum_of(log_probs.masked_select(unwanted));
  out.sums.kl = kl;
  out.sums.kl_batches = 1.0;
  return out;
}

torch::Tensor whole_sequence_labels(const torch::Tensor& input_ids,
                                    const torch::Tensor& attention_mask) {
  if (!attention_mask.defined()) return input_ids;
  return input_ids.masked_fill(attention_mask.eq(0), -100);
}

PreferenceBatchLoss preference_loss(const PreferenceOptions& o, const SequenceLogProbs& policy,
                                    const SequenceLogProbs* reference,
                                    const SequenceLogProbs* chosen_sequences) {
  const std::int64_t rows = policy.sum.size(0);
  if (rows % 2 != 0 || rows == 0)
    throw Error(ErrorKind::Internal, "preference batch with an odd number of rows");
  if (o.needs_reference() && reference == nullptr)
    throw Error(ErrorKind::Internal, "preference objective without its reference");
  const std::int64_t pairs = rows / 2;
  if (policy.tokens.min().item<float>() < 1.0f)
    throw_invalid("a preference pair has a chosen or rejected completion with no token left",
                  "raise dataset.max_length, or shorten the prompts");
  const auto chosen = [pairs](const torch::Tensor& t) { return t.narrow(0, 0, pairs); };
  const auto rejected = [pairs](const torch::Tensor& t) { return t.narrow(0, pairs, pairs); };

  torch::Tensor loss, reward_chosen, reward_rejected, log_prob_chosen, log_prob_rejected;
  if (o.needs_reference()) {
    log_prob_chosen = chosen(policy.sum);
    log_prob_rejected = rejected(policy.sum);
    const torch::Tensor chosen_ratio = log_prob_chosen - chosen(reference->sum).detach();
    const torch::Tensor rejected_ratio = log_prob_rejected - rejected(reference->sum).detach();
    torch::Tensor per_pair;
    if (o.loss == PreferenceLoss::Dpo) {
      per_pair = smoothed_sigmoid_loss(o.beta * (chosen_ratio - rejected_ratio), o.label_smoothing);
    } else {  // ipo: per-token log-ratios
      const torch::Tensor delta =
          chosen_ratio / chosen(policy.tokens) - rejected_ratio / rejected(policy.tokens);
      per_pair = (delta - 1.0 / (2.0 * o.beta)).pow(2);
    }
    loss = per_pair.mean();
    reward_chosen = o.beta * chosen_ratio.detach();
    reward_rejected = o.beta * rejected_ratio.detach();
  } else {
    const torch::Tensor mean_log_probs = policy.sum / policy.tokens;
    log_prob_chosen = chosen(mean_log_probs);
    log_prob_rejected = rejected(mean_log_probs);
    // The chosen completions' mean token loss, over all their tokens together.
    const torch::Tensor chosen_nll = -chosen(policy.sum).sum() / chosen(policy.tokens).sum();
    if (o.loss == PreferenceLoss::Simpo) {
      const torch::Tensor z = o.beta * (log_prob_chosen - log_prob_rejected) - o.simpo_gamma;
      loss = smoothed_sigmoid_loss(z, o.label_smoothing).mean();
      if (o.sft_weight > 0.0) loss = loss + o.sft_weight * chosen_nll;
    } else {  // orpo
      if (chosen_sequences == nullptr)
        throw Error(ErrorKind::Internal, "orpo without the chosen sequences' log-probabilities");
      const torch::Tensor sequence_nll =
          -chosen_sequences->sum.sum() / chosen_sequences->tokens.sum();
      const torch::Tensor log_odds = (log_prob_chosen - log_prob_rejected) -
                                     (log1mexp(log_prob_chosen) - log1mexp(log_prob_rejected));
      loss = sequence_nll - o.beta * F::logsigmoid(log_odds).mean();
    }
    reward_chosen = o.beta * log_prob_chosen.detach();
    reward_rejected = o.beta * log_prob_rejected.detach();
  }
  PreferenceBatchLoss out;
  out.loss = loss;
  out.sums.pairs = out.sums.chosen = out.sums.rejected = static_cast<double>(pairs);
  out.sums.reward_chosen = sum_of(reward_chosen);
  out.sums.reward_rejected = sum_of(reward_rejected);
  out.sums.margin = sum_of(reward_chosen - reward_rejected);
  out.sums.accuracy = sum_of(reward_chosen.gt(reward_rejected).to(torch::kFloat64));
  out.sums.log_prob_chosen = sum_of(log_prob_chosen.detach());
  out.sums.log_prob_rejected = sum_of(log_prob_rejected.detach());
  return out;
}

}  // namespace tessera::train
