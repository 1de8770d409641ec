#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"

namespace tessera::model {

void validate(const GenerateOptions& options) {
  if (options.max_new_tokens < 0)
    throw_invalid("max_new_tokens must be 0 or more, got " +
                  std::to_string(options.max_new_tokens));
  const SamplingOptions& s = options.sampling;
  if (!s.greedy) {
    if (!(s.temperature > 0.0) || !std::isfinite(s.temperature))
      throw_invalid("temperature must be a positive number, got " + std::to_string(s.temperature),
                    "use --greedy for deterministic decoding (temperature 0 in other tools)");
    if (s.top_k < 0)
      throw_invalid("top_k must be 0 (off) or positive, got " + std::to_string(s.top_k));
    if (!(s.top_p > 0.0 && s.top_p <= 1.0))
      throw_invalid("top_p must be in (0, 1], got " + std::to_string(s.top_p));
  }
}

torch::Tensor warp_logits(const torch::Tensor& scores, const SamplingOptions& o) {
  if (o.greedy) return scores;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  torch::Tensor out = scores;
  if (o.temperature != 1.0) out = out / o.temperature;
  if (o.top_k > 0) {
    const std::int64_t k = std::min<std::int64_t>(o.top_k, out.size(-1));
    torch::Tensor kth = std::get<0>(torch::topk(out, k)).narrow(-1, k - 1, 1);
    out = out.masked_fill(out < kth, neg_inf);
  }
  if (o.top_p < 1.0) {
    auto [sorted, indices] = torch::sort(out, /*dim=*/-1, /*descending=*/false);
    torch::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
    torch::Tensor remove = cumulative <= (1.0 - o.top_p);
    remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);  // keep at least the best token
    remove = remove.scatter(-1, indices, remove);
    out = out.masked_fill(remove, neg_inf);
  }
  return out;
}

GenerateResult generate(PretrainedModel& model,
                        const std::vector<std::vector<std::int64_t>>& prompts,
                        const GenerateOptions& options, const TokenCallback& on_token) {
  validate(options);
  if (model.head() != TaskHead::CausalLM || !model.supports_cache())
    throw_unsupported(model.config().model_type + " " + task_head_name(model.head()) +
                          ": generation needs a causal LM of a decoder family",
                      "load a *ForCausalLM / GPT2LMHeadModel checkpoint");
  if (prompts.empty()) throw_invalid("generate: no prompt given");
  std::size_t longest = 0;
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    if (prompts[r].empty())
      throw_invalid("generate: prompt " + std::to_string(r + 1) + " has no tokens",
                    "a prompt needs at least one token (e.g. the BOS token)");
    longest = std::max(longest, prompts[r].size());
  }
  const auto rows = static_cast<std::int64_t>(prompts.size());
  const auto width = static_cast<std::int64_t>(longest);
  const std::int64_t pad =
      options.pad_token_id.value_or(options.eos_token_ids.empty() ? 0 : options.eos_token_ids[0]);

  // Left padding: every row's last prompt token sits in the last column.
  torch::Tensor ids = torch::full({rows, width}, pad, torch::kInt64);
  torch::Tensor mask = torch::zeros({rows, width}, torch::kInt64);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto& p = prompts[static_cast<std::size_t>(r)];
    const auto n = static_cast<std::int64_t>(p.size());
    ids[r].narrow(0, width - n, n).copy_(torch::tensor(p, torch::kInt64));
    mask[r].narrow(0, width - n, n).fill_(1);
  }
  torch::Tensor positions = (mask.cumsum(-1) - 1).masked_fill(mask.eq(0), 0);

  torch::NoGradGuard no_grad;
  torch::InferenceMode inference;
  const bool was_training = model.is_training();
  model.eval();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.sampling.seed);

  GenerateResult result;
  result.tokens.resize(prompts.size());
  result.stopped_at_eos.assign(prompts.size(), false);
  std::vector<bool> finished(prompts.size(), false);
  KVCache cache;
  torch::Tensor step_ids = ids;
  torch::Tensor step_positions = positions;
  for (std::int64_t step = 0; step < options.max_new_tokens; ++step) {
    ForwardInput in;
    in.input_ids = step_ids.to(options.device);
    in.attention_mask = mask.to(options.device);
    in.position_ids = step_positions.to(options.device);
    in.cache = &cache;
    in.logits_to_keep = 1;
    torch::Tensor scores = model.forward(in).logits.select(1, -1).to(torch::kFloat32).cpu();
    torch::Tensor next;
    if (options.sampling.greedy) {
      next = scores.argmax(-1);
    } else {
      torch::Tensor probs = warp_logits(scores, options.sampling).softmax(-1);
      next = at::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(1);
    }
    bool keep_going = false;
    bool stop_requested = false;
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto row = static_cast<std::size_t>(r);
      if (finished[row]) {
        next[r] = pad;
        continue;
      }
      const std::int64_t token = next[r].item<std::int64_t>();
      result.tokens[row].push_back(token);
      if (std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), token) !=
          options.eos_token_ids.end()) {
        finished[row] = true;
        result.stopped_at_eos[row] = true;
      } else {
        keep_going = true;
      }
      if (on_token && !on_token(row, token)) stop_requested = true;
    }
    if (!keep_going || stop_requested) break;
    step_ids = next.unsqueeze(1);
    step_positions = step_positions.narrow(1, step_positions.size(1) - 1, 1) + 1;
    mask = torch::cat({mask, torch::ones({rows, 1}, torch::kInt64)}, 1);
  }
  if (was_training) model.train();
  return result;
}

std::vector<std::int64_t> eos_token_ids(const hf::ModelConfig& config,
                                        const std::filesystem::path& model_dir) {
  std::vector<std::int64_t> ids = config.eos_token_ids;
  const std::filesystem::path path = model_dir / "generation_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    nlohmann::json doc = nlohmann::json::parse(core::read_text_file(path), nullptr, false);
    if (doc.is_discarded() || !doc.is_object())
      throw_invalid(path.string() + ": not a JSON object",
                    "fix or delete generation_config.json (config.json's eos_token_id is used "
                    "without it)");
    auto add = [&](const nlohmann::json& v) {
      if (!v.is_number_integer())
        throw_invalid(path.string() + ": eos_token_id must be an integer or a list of integers");
      const auto id = v.get<std::int64_t>();
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    };
    if (doc.contains("eos_token_id") && !doc["eos_token_id"].is_null()) {
      const nlohmann::json& eos = doc["eos_token_id"];
      if (eos.is_array())
        for (const auto& v : eos) add(v);
      else
        add(eos);
    }
  }
  return ids;
}

}  // namespace tessera::model
