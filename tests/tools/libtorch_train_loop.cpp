// tessera-libtorch-train-loop: the plain LibTorch baseline of tests/bench/bench_train.py. Loads the
// model with tessera's model::load_pretrained (the same model code as our trainer), then trains
// with torch::optim::AdamW in a plain loop: forward with labels, backward, clip, step, zero_grad.
// What separates it from tessera-train-probe is therefore only the trainer (our AdamW, clipping,
// bookkeeping, events), not the model.
//
//   tessera-libtorch-train-loop --model DIR --batches B.safetensors --steps N --report OUT.json
//       [--lr X] [--weight-decay X] [--max-grad-norm X] [--threads N]
//
// B holds `input_ids` [N, B, T] (I64), used in order (cycled). The report holds per-step losses
// and per-step wall seconds.
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/model.h"
#include "train/lora.h"

namespace {

using namespace tessera;

[[noreturn]] void usage(const std::string& why) {
  throw Error(ErrorKind::Usage, why,
              "usage: tessera-libtorch-train-loop --model DIR --batches B.safetensors --steps N "
              "--report OUT.json [--lr X] [--weight-decay X] [--max-grad-norm X] [--threads N]");
}

int run(int argc, char** argv) {
  std::string model_dir, batches_path, report_path;
  std::int64_t steps = 0;
  double lr = 1e-3, weight_decay = 0.0, max_grad_norm = 1.0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--model")
      model_dir = value();
    else if (arg == "--batches")
      batches_path = value();
    else if (arg == "--report")
      report_path = value();
    else if (arg == "--steps")
      steps = std::stoll(value());
    else if (arg == "--lr")
      lr = std::stod(value());
    else if (arg == "--weight-decay")
      weight_decay = std::stod(value());
    else if (arg == "--max-grad-norm")
      max_grad_norm = std::stod(value());
    else if (arg == "--threads")
      at::set_num_threads(static_cast<int>(std::stoll(value())));
    else
      usage("unknown argument \"" + arg + "\"");
  }
  if (model_dir.empty() || batches_path.empty() || report_path.empty() || steps <= 0)
    usage("--model, --batches, --steps and --report are required");

  auto tensors = train::read_safetensors_tensors(batches_path);
  if (!tensors.count("input_ids")) throw_invalid(batches_path + ": no input_ids tensor");
  torch::Tensor ids = tensors.at("input_ids").to(torch::kInt64);
  if (ids.dim() != 3 || ids.size(0) == 0)
    throw_invalid(batches_path + ": input_ids must be [N, B, T] with N > 0");

  auto model = model::load_pretrained(model_dir);
  model->train();
  std::vector<torch::Tensor> params = model->parameters();
  torch::optim::AdamW optimizer(
      params,
      torch::optim::AdamWOptions(lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(weight_decay));

  std::vector<double> losses, seconds;
  for (std::int64_t step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    model::ForwardInput in;
    in.input_ids = ids[step % ids.size(0)];
    in.labels = in.input_ids;
    torch::Tensor loss = model->forward(in).loss;
    loss.backward();
    if (max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, max_grad_norm);
    optimizer.step();
    optimizer.zero_grad(/*set_to_none=*/true);
    losses.push_back(loss.item<double>());
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  nlohmann::json report = {{"losses", losses}, {"step_seconds", seconds}};
  std::ofstream(report_path) << report.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tessera::Error& e) {
    std::cerr << "tessera-libtorch-train-loop: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    return e.kind() == tessera::ErrorKind::Io || e.kind() == tessera::ErrorKind::Internal ? 1 : 2;
  } catch (const std::exception& e) {
    std::cerr << "tessera-libtorch-train-loop: " << e.what() << "\n";
    return 1;
  }
}
