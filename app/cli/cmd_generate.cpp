// tessera-cli generate: text generation with a KV cache (greedy or sampled), as transformers'
// generate() computes it.
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "device_option.h"
#include "hf/chat/chat_template.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/tokenizer/text_streamer.h"
#include "hf/tokenizer/tokenizer.h"
#include "model/generate.h"
#include "model/model.h"
#include "plan/model_size.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

double real_option(const Args& args, const std::string& name, double fallback) {
  const std::string* v = args.option(name);
  if (v == nullptr) return fallback;
  try {
    std::size_t used = 0;
    const double x = std::stod(*v, &used);
    if (used == v->size()) return x;
  } catch (const std::exception&) {
  }
  throw UsageError{name + " needs a number, got \"" + *v + "\""};
}

// Sampling defaults as transformers takes them: generation_config.json, else its own defaults
// (temperature 1, top_k 50, top_p 1).
model::SamplingOptions sampling_defaults(const fs::path& model_dir) {
  model::SamplingOptions s;
  s.top_k = 50;
  const fs::path path = model_dir / "generation_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return s;
  const nlohmann::json doc = nlohmann::json::parse(core::read_text_file(path), nullptr, false);
  if (!doc.is_object()) return s;  // model::eos_token_ids reports a broken file
  if (doc.contains("temperature") && doc["temperature"].is_number())
    s.temperature = doc["temperature"].get<double>();
  if (doc.contains("top_k") && doc["top_k"].is_number_integer())
    s.top_k = doc["top_k"].get<std::int64_t>();
  if (doc.contains("top_p") && doc["top_p"].is_number()) s.top_p = doc["top_p"].get<double>();
  return s;
}

// Why generation ended, as --json reports it.
const char* stop_reason(const model::GenerateResult& result, bool stopped_at_string) {
  if (stopped_at_string) return "stop_string";
  return result.stopped_at_eos.front() ? "eos" : "max_new_tokens";
}

std::size_t count_replacement_chars(const std::string& text) {
  std::size_t n = 0;
  for (std::size_t at = text.find("\xEF\xBF\xBD"); at != std::string::npos;
       at = text.find("\xEF\xBF\xBD", at + 3))
    ++n;
  return n;
}

std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

int run_generate(const std::vector<std::string>& raw) {
  Args args(raw, {"--chat", "--greedy", "--json", "--json-lines"},
            {"--model", "--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p",
             "--seed", "--dtype", "--stop", "--device"});
  const std::string& model_arg = args.required("--model", "PATH");
  const std::string& prompt = args.required("--prompt", "TEXT");
  args.expect_no_positionals();
  const fs::path model_dir = model_arg;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    throw_invalid(model_dir.string() + ": no such model folder",
                  "--model takes a folder with config.json, *.safetensors and tokenizer.json");

  model::GenerateOptions options;
  options.max_new_tokens = args.integer("--max-new-tokens", 64, 0);
  options.sampling = sampling_defaults(model_dir);
  options.sampling.greedy = args.flag("--greedy");
  options.sampling.temperature = real_option(args, "--temperature", options.sampling.temperature);
  options.sampling.top_k = args.integer("--top-k", options.sampling.top_k, 0);
  options.sampling.top_p = real_option(args, "--top-p", options.sampling.top_p);
  if (args.flag("--greedy") && (args.option("--temperature") || args.option("--top-k") ||
                                args.option("--top-p") || args.option("--seed")))
    throw UsageError{
        "--greedy takes no sampling options (--temperature, --top-k, --top-p, --seed)"};
  const std::int64_t seed = args.integer("--seed", -1, 0);
  options.sampling.seed = seed >= 0 ? static_cast<std::uint64_t>(seed)
                                    : static_cast<std::uint64_t>(std::random_device{}());
  const std::vector<std::string> stop_strings = args.option_values("--stop");
  for (const std::string& stop : stop_strings)
    if (stop.empty()) throw UsageError{"--stop needs a non-empty TEXT"};
  try {
    model::validate(options);
  } catch (const Error& e) {
    throw UsageError{e.what()};
  }

  const hf::Tokenizer tokenizer = hf::Tokenizer::from_folder(model_dir);
  std::vector<std::int32_t> prompt_ids;
  if (args.flag("--chat")) {
    const hf::TokenizerConfig config = hf::load_tokenizer_config_from_folder(model_dir);
    if (!config.chat_template)
      throw_invalid(model_dir.string() + ": the tokenizer has no chat template",
                    "drop --chat, or use a model whose tokenizer_config.json or "
                    "chat_template.jinja has one");
    const hf::ChatTemplate chat = hf::ChatTemplate::parse(*config.chat_template, "chat_template");
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    messages.push_back({{"role", "user"}, {"content", prompt}});
    // As apply_chat_template: the template writes any BOS itself, so no special tokens are added.
    prompt_ids = tokenizer.encode(chat.render(messages, /*add_generation_prompt=*/true, config),
                                  /*add_special_tokens=*/false);
  } else {
    prompt_ids = tokenizer.encode(prompt, /*add_special_tokens=*/true);
  }
  if (prompt_ids.empty())
    throw_invalid("the prompt has no tokens", "give a non-empty --prompt (or use --chat)");

  const std::string dtype_name = args.option("--dtype") ? *args.option("--dtype") : "float32";
  const torch::Dtype dtype = model::dtype_from_string(dtype_name);
  // A config.json asking for more than this machine has is refused before anything is built.
  plan::check_model_folder_fits(model_dir, static_cast<double>(c10::elementSize(dtype)),
                                dtype_name);
  const c10::Device device = device_option(args);
  std::shared_ptr<model::PretrainedModel> model = model::load_pretrained(model_dir, dtype, device);
  options.device = device;
  options.eos_token_ids = model::eos_token_ids(model->config(), model_dir);
  options.pad_token_id = model->config().pad_token_id;

  // --json: one object at the end. --json-lines: {"text": PIECE} lines as the reply is decoded,
  // then that object. Plain: the pieces themselves, then a newline.
  const bool json_lines = args.flag("--json-lines");
  const bool json = json_lines || args.flag("--json");
  hf::TextStreamer streamer(tokenizer);
  auto emit = [&](const std::string& piece) {
    if (piece.empty() || (json && !json_lines)) return;
    std::cout << (json_lines ? json_line({{"text", piece}}) : piece) << std::flush;
  };
  // --stop: as transformers' stop_strings, generation ends with the token that completes a stop
  // string, which stays in the reply. The reply is decoded whole after each token (not the
  // streamer's pieces, which hold back a byte-fallback run until it ends), so a stop string is
  // seen at the token that completes it.
  std::vector<std::int32_t> reply_ids;
  std::optional<std::string> matched_stop;
  model::GenerateResult result = model::generate(
      *model, {std::vector<std::int64_t>(prompt_ids.begin(), prompt_ids.end())}, options,
      [&](std::size_t, std::int64_t token) {
        emit(streamer.add(static_cast<std::int32_t>(token)));
        if (stop_strings.empty()) return true;
        reply_ids.push_back(static_cast<std::int32_t>(token));
        const std::string text = tokenizer.decode(reply_ids, /*skip_special_tokens=*/true);
        for (const std::string& stop : stop_strings)
          if (text.find(stop) != std::string::npos) {
            matched_stop = stop;
            return false;
          }
        return true;
      });
  emit(streamer.finish());
  if (json) {
    const std::vector<std::int64_t>& generated = result.tokens.front();
    nlohmann::json tokens = nlohmann::json::array();
    for (std::int64_t id : generated)
      tokens.push_back(tokenizer.id_to_token(static_cast<std::int32_t>(id)).value_or(""));
    const std::string text = streamer.text();
    nlohmann::json out;
    out["prompt_ids"] = prompt_ids;
    out["generated_ids"] = generated;
    out["tokens"] = std::move(tokens);
    out["text"] = text;
    out["stop_reason"] = stop_reason(result, matched_stop.has_value());
    if (matched_stop) out["stop_string"] = *matched_stop;
    out["stopped_at_eos"] = static_cast<bool>(result.stopped_at_eos.front());
    out["eos_token_ids"] = options.eos_token_ids;
    out["max_new_tokens"] = options.max_new_tokens;
    out["replacement_chars"] = count_replacement_chars(text);
    out["greedy"] = options.sampling.greedy;
    out["device"] = device.str();
    if (!options.sampling.greedy) out["seed"] = options.sampling.seed;
    std::cout << json_line(out);
  } else {
    std::cout << "\n";
  }
  std::cout.flush();
  if (!std::cout) throw_io("cannot write to standard output");
  return 0;
}

const RegisterCommand kGenerateCommand{{
    "generate",
    "generate --model PATH --prompt TEXT [--chat] [--max-new-tokens N] [--greedy] "
    "[--temperature T] [--top-k K] [--top-p P] [--seed S] [--dtype float32|bfloat16] "
    "[--stop TEXT]... [--device auto|cpu|cuda|cuda:N] [--json | --json-lines]",
    "continue a prompt with a causal LM as transformers' generate does, printing the reply as "
    "it is decoded; --stop TEXT (repeatable): end once the reply contains TEXT, kept in the reply, "
    "as transformers' stop_strings; --json: ids, tokens, text and stop reason at the end "
    "(README.md), "
    "--device: where it computes (auto: CUDA device 0 when present, else the CPU), "
    "--json-lines: {\"text\": PIECE} lines first",
    run_generate,
}};

}  // namespace
}  // namespace tessera::cli
