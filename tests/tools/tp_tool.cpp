// tessera-tp-tool: test-only front end to engine/parallel, for
// tests/integration/test_tensor_parallel.py. One process per rank, started with torchrun's
// variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE).
//
//   tessera-tp-tool layers
//     A small language model's pieces (vocabulary-parallel embedding, a gated MLP of
//     column-parallel gate/up and a row-parallel down projection with biases, a residual, a
//     vocabulary-parallel head and cross-entropy with ignored targets) computed tensor-parallel
//     over the whole world, and where the world is 4 also over the tensor groups of a 2 × 2
//     (data × tensor) mesh, against the same model computed whole in this process: the loss, the
//     gathered logits and every weight's gradient block equal the whole model's within 1e-5
//     (fp32). Prints "ok rank R of N" and exits 0, or says what differs and exits 1.
//   tessera-tp-tool model <folder>
//     The model in <folder> (config.json + safetensors) split over the tensor groups of a
//     (world / 2) × 2 mesh by its family's plan (parallel/split_model.h) against the same model
//     whole in this process, on a batch with right padding and ignored labels: the loss, the
//     logits (gathered) and every parameter's gradient (this rank's block of the whole one)
//     within 1e-5, dropout included (drawn layout-free, model/dropout.h). With 4 ranks also split
//     over all 4: with 2 kv heads each k/v block is held by 2 ranks, whose gradients of it sum to
//     the block of the whole one. Prints "ok rank R of N".
//
// Exit codes: 0 ok, 1 a wrong result, 2 invalid input, 4 another error.
#include <torch/torch.h>

#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "dist/parallel_context.h"
#include "model/dropout.h"
#include "model/model.h"
#include "parallel/split_model.h"
#include "parallel/tensor_parallel.h"

namespace {

using tessera::dist::ParallelContext;
using tessera::dist::ProcessGroup;
namespace tp = tessera::parallel;

struct WrongResult : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect_close(const std::string& what, const torch::Tensor& actual,
                  const torch::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) throw WrongResult(what + ": shape differs");
  const double difference = (actual - expected).abs().max().item<double>();
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  if (!(difference <= 1e-5 * scale)) {
    std::ostringstream text;
    text << what << ": differs by " << difference << " (scale " << scale << ")";
    throw WrongResult(text.str());
  }
}

struct Weights {
  torch::Tensor embedding, gate, gate_bias, up, down, down_bias, head;
};

// The model's loss and logits from whole weights (`tensor_group` null) or from this rank's
// blocks of them over `tensor_group`.
std::pair<torch::Tensor, torch::Tensor> forward(const Weights& w, const torch::Tensor& ids,
                                                const torch::Tensor& targets,
                                                ProcessGroup* tensor_group) {
  if (!tensor_group) {
    const torch::Tensor h = torch::embedding(w.embedding, ids);
    const torch::Tensor mlp =
        torch::linear(torch::silu(torch::linear(h, w.gate, w.gate_bias)) * torch::linear(h, w.up),
                      w.down, w.down_bias);
    const torch::Tensor logits = torch::linear(h + mlp, w.head);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.view({-1, logits.size(-1)}), targets.view({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
    return {loss, logits};
  }
  ProcessGroup& g = *tensor_group;
  const torch::Tensor h = tp::vocab_parallel_embedding(ids, w.embedding, g);
  const torch::Tensor gated = torch::silu(tp::column_parallel_linear(h, w.gate, w.gate_bias, g)) *
                              tp::column_parallel_linear(h, w.up, torch::Tensor(), g);
  const torch::Tensor mlp = tp::row_parallel_linear(gated, w.down, w.down_bias, g);
  const torch::Tensor logits = tp::column_parallel_linear(h + mlp, w.head, torch::Tensor(), g);
  const torch::Tensor loss =
      tp::vocab_parallel_cross_entropy(logits.view({-1, logits.size(-1)}), targets.view({-1}), g);
  return {loss, tp::gather_last_dim(logits.detach(), g)};
}

void check_layers(ProcessGroup& group, const std::string& name) {
  const std::int64_t vocab = 12, hidden = 8, inner = 16;
  torch::manual_seed(7);  // the same whole model and batch on every rank
  Weights whole{torch::randn({vocab, hidden}),       torch::randn({inner, hidden}) * 0.3,
                torch::randn({inner}) * 0.1,         torch::randn({inner, hidden}) * 0.3,
                torch::randn({hidden, inner}) * 0.3, torch::randn({hidden}) * 0.1,
                torch::randn({vocab, hidden}) * 0.3};
  const torch::Tensor ids = torch::randint(0, vocab, {2, 5}, torch::kInt64);
  torch::Tensor targets = torch::randint(0, vocab, {2, 5}, torch::kInt64);
  targets[0][0] = -100;
  targets[1][4] = -100;

  const int r = group.rank(), n = group.size();
  Weights mine{tp::shard(whole.embedding, 0, r, n, "embedding"),
               tp::shard(whole.gate, 0, r, n, "gate"),
               tp::shard(whole.gate_bias, 0, r, n, "gate bias"),
               tp::shard(whole.up, 0, r, n, "up"),
               tp::shard(whole.down, 1, r, n, "down"),
               whole.down_bias.clone(),
               tp::shard(whole.head, 0, r, n, "head")};
  auto trainable = [](Weights& w) {
    return std::vector<torch::Tensor*>{&w.embedding, &w.gate,      &w.gate_bias, &w.up,
                                       &w.down,      &w.down_bias, &w.head};
  };
  for (auto* t : trainable(whole)) t->set_requires_grad(true);
  for (auto* t : trainable(mine)) t->set_requires_grad(true);

  auto [loss, logits] = forward(whole, ids, targets, nullptr);
  loss.backward();
  auto [tp_loss, tp_logits] = forward(mine, ids, targets, &group);
  tp_loss.backward();
  expect_close(name + " loss", tp_loss, loss.detach());
  expect_close(name + " logits", tp_logits, logits.detach());
  const std::vector<std::pair<const char*, std::int64_t>> split = {
      {"embedding", 0}, {"gate", 0},       {"gate bias", 0}, {"up", 0},
      {"down", 1},      {"down bias", -1}, {"head", 0}};
  const auto whole_tensors = trainable(whole);
  const auto my_tensors = trainable(mine);
  for (std::size_t i = 0; i < split.size(); ++i) {
    const auto [what, dim] = split[i];
    const torch::Tensor expected =
        dim < 0 ? whole_tensors[i]->grad() : tp::shard(whole_tensors[i]->grad(), dim, r, n, what);
    expect_close(name + " gradient of " + what, my_tensors[i]->grad(), expected);
  }
  // A split that does not divide is refused, naming the tensor and the sizes.
  try {
    tp::shard(whole.embedding.detach(), 1, 0, 3, "model.embed_tokens.weight");
    throw WrongResult("a split of 8 into 3 was not refused");
  } catch (const tessera::Error& e) {
    if (std::string(e.what()).find("model.embed_tokens.weight: 8 does not split into 3") ==
        std::string::npos)
      throw WrongResult(std::string("unexpected refusal: ") + e.what());
  }
}

void check_model(const std::string& folder, ProcessGroup& group, const std::string& name) {
  auto whole = tessera::model::load_pretrained(folder);
  auto split = tessera::model::load_pretrained(folder);
  whole->train();
  split->train();
  const std::vector<tp::SplitParameter> layout = tp::split_model(*split, group);
  const std::int64_t vocab = split->config().vocab_size;
  torch::manual_seed(3);
  tessera::model::ForwardInput in;
  in.input_ids = torch::randint(0, vocab, {2, 9}, torch::kInt64);
  in.attention_mask = torch::ones({2, 9}, torch::kInt64);
  in.attention_mask[1][7] = 0;
  in.attention_mask[1][8] = 0;
  in.labels = in.input_ids.masked_fill(in.attention_mask.eq(0), -100);
  // Dropout (gpt2's 0.1) drawn layout-free: the split model's ranks draw their heads' masks.
  tessera::model::ForwardOutput expected, actual;
  {
    tessera::model::DropoutScope scope({11, 0, 0, 0, 0});
    expected = whole->forward(in);
    expected.loss.backward();
  }
  {
    tessera::model::DropoutScope scope({11, 0, 0, 0, group.rank()});
    actual = split->forward(in);
    actual.loss.backward();
  }
  expect_close(name + " loss", actual.loss.detach(), expected.loss.detach());
  expect_close(name + " logits", tp::gather_last_dim(actual.logits.detach(), group),
               expected.logits.detach());
  const auto whole_parameters = whole->named_parameters();
  const auto split_parameters = split->named_parameters();
  std::size_t blocks = 0;
  for (const tp::SplitParameter& p : layout) {
    const torch::Tensor whole_gradient = whole_parameters[p.name].grad();
    const torch::Tensor block = tp::block_of(whole_gradient, p, group.rank(), group.size());
    // A kv head's block held by several ranks: each holder's gradient is a share of it.
    const torch::Tensor gradient = tp::sum_over_replicas(split_parameters[p.name].grad(), p, group);
    expect_close(name + " gradient of " + p.name, gradient, block);
    if (p.dim >= 0) ++blocks;
    if (split_parameters[p.name].sizes().vec() != block.sizes().vec())
      throw WrongResult(p.name + ": the block's shape differs");
  }
  if (blocks == 0) throw WrongResult(name + ": no parameter was split");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "layers" && !(mode == "model" && argc > 2)) {
    std::cerr << "usage: tessera-tp-tool layers | model <folder>\n";
    return 2;
  }
  torch::set_num_threads(1);
  try {
    std::unique_ptr<ParallelContext> context = ParallelContext::from_environment();
    if (mode == "model") {
      const int world = context->world_size();
      const std::shared_ptr<ProcessGroup> tensor_group = context->new_mesh_group({world / 2, 2}, 1);
      check_model(argv[2], *tensor_group, "tensor group of 2");
      if (world == 4) check_model(argv[2], context->world(), "world of 4 (2 kv heads)");
    } else {
      check_layers(context->world(), "world");
      if (context->world_size() == 4) {
        const std::shared_ptr<ProcessGroup> tensor_group = context->new_mesh_group({2, 2}, 1);
        check_layers(*tensor_group, "mesh 2x2 tensor group");
      }
    }
    std::cout << "ok rank " << context->rank() << " of " << context->world_size() << std::endl;
    return 0;
  } catch (const WrongResult& e) {
    std::cerr << "wrong: " << e.what() << std::endl;
    return 1;
  } catch (const tessera::Error& e) {
    std::cerr << e.what() << std::endl;
    return e.kind() == tessera::ErrorKind::InvalidInput ? 2 : 4;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 4;
  }
}
