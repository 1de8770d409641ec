#pragma once
// Preference tuning's objectives on a batch of pairs: DPO (with conservative label smoothing),
// IPO, SimPO and ORPO, defined as TRL defines them (DPOTrainer; CPOTrainer's loss_type "simpo";
// ORPOTrainer), so that the parity tests can hold our losses and metrics to theirs.
//
// A preference batch holds 2·P rows: the P chosen sequences (prompt + chosen completion) first,
// then the P rejected ones in the same order; labels are -100 on the prompt and on padding, so
// a row's log-probability is that of its completion given its prompt.
//
// With π = the policy's completion log-probability (summed over its tokens; averaged for SimPO
// and ORPO), ρ = the reference's (DPO, IPO), β, label smoothing ε, c / r = chosen / rejected:
// - dpo:   Δ = (π_c − ρ_c) − (π_r − ρ_r); loss = −(1−ε)·logσ(βΔ) − ε·logσ(−βΔ)
// - ipo:   Δ = (π_c − ρ_c)/n_c − (π_r − ρ_r)/n_r (n: completion tokens); loss = (Δ − 1/(2β))²
// - simpo: Δ = π̄_c − π̄_r − γ/β; loss = −(1−ε)·logσ(βΔ) − ε·logσ(−βΔ) + w·NLL(chosen)
// - orpo:  log-odds = (π̄_c − π̄_r) − (log(1−e^π̄_c) − log(1−e^π̄_r));
//          loss = NLL(chosen sequences) − β·logσ(log-odds)
// each averaged over the pairs; NLL(chosen) = the mean token loss over every chosen completion;
// ORPO's NLL(chosen sequences) is over every token of the chosen rows, prompt included, as
// TRL's ORPOTrainer computes it.
// Rewards: β·(π − ρ) with a reference, β·π̄ without; a pair is right when its chosen reward is
// above its rejected one.
//
// KTO (TRL's KTOTrainer) is unpaired: a batch holds N examples (prompt + completion, each
// desirable or not) and then N mismatched rows, example i's prompt with example i−1's completion
// (the last's for the first), whose log-ratio π − ρ, averaged over the rows (and the data-parallel
// ranks) and floored at 0, estimates the KL term z. A desirable example's loss is
// w_d·(1 − σ(β(π − ρ − z))), an undesirable one's w_u·(1 − σ(β(z − (π − ρ)))); the loss is their
// mean. Rewards β·(π − ρ), averaged over the desirable ("chosen") and the undesirable
// ("rejected") examples apart; no accuracy.
#include <torch/torch.h>

#include <string>

namespace tessera::train {

enum class PreferenceLoss { Dpo, Ipo, Simpo, Orpo, Kto };
const char* preference_loss_name(PreferenceLoss loss);
// "dpo" | "ipo" | "simpo" | "orpo" | "kto"; throws InvalidInput naming `field` otherwise.
PreferenceLoss preference_loss_from_name(const std::string& name, const std::string& field);

struct PreferenceOptions {
  PreferenceLoss loss = PreferenceLoss::Dpo;
  double beta = 0.1;
  double label_smoothing = 0.0;     // dpo, simpo: the chance a pair's labels are swapped (cDPO)
  double simpo_gamma = 0.5;         // simpo: γ, the target reward margin
  double sft_weight = 0.0;          // simpo: w, the chosen completions' NLL added (CPO's cpo_alpha)
  double desirable_weight = 1.0;    // kto: w_d
  double undesirable_weight = 1.0;  // kto: w_u
  // DPO, IPO and KTO compare with a reference model; SimPO and ORPO need none.
  bool needs_reference() const;
  // KTO's batches are unpaired examples and their mismatched rows; the others' are pairs.
  bool unpaired() const { return loss == PreferenceLoss::Kto; }
  // Whether the objective works on per-token means of the log-probabilities (SimPO, ORPO).
  bool averages_log_probs() const;
};
// Throws InvalidInput naming `field` + ".beta" etc. for values out of their range.
void validate(const PreferenceOptions& options, const std::string& field);

// Each row's summed log-probability of its labelled tokens and their count, from each
// position's log-probability of the token after it (model::ForwardOutput::label_log_probs,
// [rows, T − 1], of the labels or of the input ids, which the labels equal wherever they keep a
// token) over the positions `labels` [rows, T] keeps (labels shifted left by one, as the
// causal-LM loss does).
struct SequenceLogProbs {
  torch::Tensor sum;     // [rows]
  torch::Tensor tokens;  // [rows], float32
};
SequenceLogProbs labelled_sums(const torch::Tensor& log_probs, const torch::Tensor& labels);

// The metrics of a batch as sums over its pairs, so that micro-batches and ranks add up; the
// reported figure is each sum over `pairs`.
struct PreferenceSums {
  double pairs = 0.0;     // paired objectives
  double chosen = 0.0;    // the rows reward_chosen sums over (a pair's chosen, KTO's desirable)
  double rejected = 0.0;  // ... and reward_rejected
  double reward_chosen = 0.0;
  double reward_rejected = 0.0;
  // Pairs: Σ (chosen − rejected reward), each difference taken as TRL takes it (in float32).
  double margin = 0.0;
  double accuracy = 0.0;         // pairs whose chosen reward is above the rejected one
  double log_prob_chosen = 0.0;  // π (averaged per token for SimPO / ORPO)
  double log_prob_rejected = 0.0;
  double kl = 0.0;          // KTO: the sum of the batches' KL estimates z
  double kl_batches = 0.0;  // ... and their number
  PreferenceSums& operator+=(const PreferenceSums& other);
};

struct PreferenceBatchLoss {
  torch::Tensor loss;  // scalar float32, with gradients through `policy`
  PreferenceSums sums;
};

// The objective of one batch of pairs. `reference` is used (and required) when
// options.needs_reference(); its tensors carry no gradient. `chosen_sequences` (ORPO only,
// required there): the policy's log-probabilities of the chosen rows' every token.
PreferenceBatchLoss preference_loss(const PreferenceOptions& options,
                                    const SequenceLogProbs& policy,
                                    const SequenceLogProbs* reference,
                                    const SequenceLogProbs* chosen_sequences = nullptr);

// KTO's objective on a batch's N examples: `policy` and `reference` over those rows, `desirable`
// [N] bool, `kl` the batch's KL estimate z (already floored at 0).
PreferenceBatchLoss kto_loss(const PreferenceOptions& options, const SequenceLogProbs& policy,
                             const SequenceLogProbs& reference, const torch::Tensor& desirable,
                             double kl);

// Labels that put every attended token of `input_ids` in the loss (ORPO's chosen sequences).
torch::Tensor whole_sequence_labels(const torch::Tensor& input_ids,
                                    const torch::Tensor& attention_mask);

}  // namespace tessera::train
