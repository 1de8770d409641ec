// tessera-cli finetune: builds a job spec from flags and runs it (or prints it).
#include <iostream>

#include "command.h"
#include "core/error.h"
#include "job/job_spec.h"
#include "run_job.h"

namespace tessera::cli {
namespace {

double to_double(const std::string& flag, const std::string& value) {
  try {
    std::size_t used = 0;
    double v = std::stod(value, &used);
    if (used == value.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw UsageError{flag + " expects a non-negative number, got '" + value + "'"};
}

int run_finetune(const std::vector<std::string>& raw) {
  Args args(raw, {"--print-job", "--double-quant"},
            {"--model",
             "--data",
             "--validation",
             "--format",
             "--method",
             "--steps",
             "--epochs",
             "--batch-size",
             "--grad-accum",
             "--lr",
             "--seed",
             "--save-every",
             "--eval-every",
             "--resume",
             "--precision",
             "--out",
             "--events",
             "--max-length",
             "--lora-rank",
             "--lora-alpha",
             "--schedule",
             "--warmup-steps",
             "--validation-split",
             "--strategy",
             "--strategy-options",
             "--quantize",
             "--preference",
             "--beta",
             "--column"});
  args.expect_no_positionals();
  const std::string& model = args.required("--model", "PATH");
  const std::string& data = args.required("--data", "FILE");

  // Build the spec as JSON and let the job-spec parser validate it, so flags and files obey
  // exactly the same rules.
  nlohmann::json training = nlohmann::json::object();
  if (args.option("--steps")) training["steps"] = args.integer("--steps", 0, 1);
  if (auto v = args.option("--epochs")) training["epochs"] = to_double("--epochs", *v);
  if (args.option("--batch-size")) training["batch_size"] = args.integer("--batch-size", 0, 1);
  if (args.option("--grad-accum"))
    training["gradient_accumulation"] = args.integer("--grad-accum", 0, 1);
  if (args.option("--seed")) training["seed"] = args.integer("--seed", 0, 0);
  if (args.option("--save-every")) training["save_every"] = args.integer("--save-every", 0, 0);
  if (args.option("--eval-every")) training["eval_every"] = args.integer("--eval-every", 0, 0);
  if (auto v = args.option("--schedule")) training["schedule"] = *v;
  if (args.option("--warmup-steps"))
    training["warmup_steps"] = args.integer("--warmup-steps", 0, 0);
  std::string method = args.option("--method") ? *args.option("--method") : "full";
  // The learning rate follows the method unless given: LoRA trains far fewer weights.
  training["learning_rate"] = args.option("--lr") ? to_double("--lr", *args.option("--lr"))
                                                  : (method == "lora" ? 2e-4 : 2e-5);
  nlohmann::json method_json = {{"type", method}};
  if (args.option("--lora-rank")) method_json["rank"] = args.integer("--lora-rank", 0, 1);
  if (auto v = args.option("--lora-alpha")) method_json["alpha"] = to_double("--lora-alpha", *v);
  if (auto v = args.option("--quantize")) method_json["quantize"] = *v;
  if (args.flag("--double-quant")) method_json["double_quant"] = true;
  if (auto v = args.option("--preference")) {
    method_json["preference"] = {{"loss", *v}};
    if (auto beta = args.option("--beta"))
      method_json["preference"]["beta"] = to_double("--beta", *beta);
  } else if (args.option("--beta")) {
    throw UsageError{"--beta is the preference objective's; it needs --preference"};
  }
  nlohmann::json dataset = {{"train", {data}}};
  if (auto v = args.option("--validation")) dataset["validation"] = {*v};
  if (auto v = args.option("--format")) dataset["format"] = *v;
  if (args.option("--max-length")) dataset["max_length"] = args.integer("--max-length", 0, 2);
  if (auto v = args.option("--validation-split"))
    dataset["validation_split"] = to_double("--validation-split", *v);
  // --column ROLE=COLUMN (repeatable): dataset.columns, a role of the format read from a column
  // of another name.
  for (const std::string& mapping : args.option_values("--column")) {
    const std::size_t equals = mapping.find('=');
    if (equals == std::string::npos || equals == 0 || equals + 1 == mapping.size())
      throw UsageError{"--column " + mapping +
                       ": expected ROLE=COLUMN, e.g. --column instruction=question"};
    if (dataset["columns"].contains(mapping.substr(0, equals)))
      throw UsageError{"--column " + mapping + ": the role " + mapping.substr(0, equals) +
                       " is mapped twice"};
    dataset["columns"][mapping.substr(0, equals)] = mapping.substr(equals + 1);
  }
  nlohmann::json output = {{"dir", args.option("--out") ? *args.option("--out") : "runs/latest"}};
  if (auto v = args.option("--resume")) output["resume"] = *v;
  nlohmann::json doc = {
      {"version", job::kJobSpecVersion}, {"model", {{"path", model}}}, {"dataset", dataset},
      {"method", method_json},           {"training", training},       {"output", output}};
  if (auto v = args.option("--precision")) doc["precision"] = *v;
  if (args.option("--strategy") || args.option("--strategy-options")) {
    nlohmann::json strategy = {
        {"name", args.option("--strategy") ? *args.option("--strategy") : std::string("auto")}};
    if (auto v = args.option("--strategy-options")) {
      nlohmann::json options = nlohmann::json::parse(*v, nullptr, /*allow_exceptions=*/false);
      if (!options.is_object())
        throw UsageError{
            "--strategy-options expects a JSON object, e.g. "
            "'{\"offload_optim_frac\": 1}', got '" +
            *v + "'"};
      strategy["options"] = options;
    }
    doc["strategy"] = strategy;
  }
  job::JobSpec spec = job::parse_job_spec(doc, "finetune flags");

  if (args.flag("--print-job")) {
    std::cout << job::to_json(spec).dump(2) << "\n";
    return 0;
  }
  const std::string* events = args.option("--events");
  return execute_job(spec, events ? *events : "", "");
}

const RegisterCommand kFinetuneCommand{{
    "finetune",
    "finetune --model PATH --data FILE [--validation FILE] [--format F] [--column ROLE=COLUMN]... "
    "[--method full|lora] "
    "[--steps N | --epochs N] [--batch-size N] [--grad-accum N] [--lr X] [--schedule S] "
    "[--warmup-steps N] [--seed N] [--save-every N] [--eval-every N] [--max-length N] "
    "[--validation-split X] [--lora-rank R] [--lora-alpha A] [--quantize nf4|fp4|int8] "
    "[--double-quant] [--preference dpo|ipo|simpo|orpo|kto] [--beta B] [--resume DIR] "
    "[--precision fp32|bf16] [--strategy auto|single|gemini] [--strategy-options JSON] "
    "[--out DIR] [--events FILE|-] [--print-job]",
    "Fine-tune a model on a dataset (builds a job spec from the flags and runs it)",
    run_finetune,
}};

}  // namespace
}  // namespace tessera::cli
