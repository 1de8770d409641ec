// KV cache, generation, evaluation, export and the merged-LoRA check: the cache gives the
// logits of a full forward, generation follows the model's argmax and stops at EOS, the warpers
// keep what transformers keeps, an export reloads to the same model and never overwrites a
// user's folder unasked, and a merge that lost its delta is caught.
#include <torch/torch.h>

#include <QtTest>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "export/export.h"
#include "export/merge_check.h"
#include "hf/config.h"
#include "model/evaluate.h"
#include "model/generate.h"
#include "model/model.h"

using nlohmann::json;
using tessera::Error;
using tessera::ErrorKind;
using namespace tessera::model;
namespace fs = std::filesystem;
namespace ex = tessera::exporter;

namespace {

json decoder_config(const std::string& type, json extra = json::object()) {
  json c{{"model_type", type},
         {"architectures", {type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
         {"vocab_size", 61},
         {"hidden_size", 32},
         {"intermediate_size", 48},
         {"num_hidden_layers", 2},
         {"num_attention_heads", 4},
         {"num_key_value_heads", 2},
         {"rms_norm_eps", 1e-5},
         {"max_position_embeddings", 64},
         {"eos_token_id", 2},
         {"tie_word_embeddings", false}};
  c.update(extra);
  return c;
}

json gpt2_config() {
  return json{{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}},
              {"vocab_size", 61},     {"n_embd", 32},
              {"n_layer", 2},         {"n_head", 4},
              {"n_positions", 64},    {"eos_token_id", 2}};
}

// Weights with std ~0.1 (init_weights' 0.02 times 5) so logits are far from constant.
std::shared_ptr<PretrainedModel> make(const json& config, std::uint64_t seed = 3) {
  auto c = tessera::hf::parse_model_config(config, "config.json");
  auto model = create_model(c, head_from_config(c));
  init_weights(*model, seed);
  torch::NoGradGuard no_grad;
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  for (auto& p : model->parameters()) {
    if (p.dim() >= 2)
      p.mul_(5.0);
    else
      p.add_(at::normal(0.0, 0.1, p.sizes(), g));
  }
  model->eval();
  return model;
}

torch::Tensor random_ids(std::int64_t rows, std::int64_t length, std::int64_t vocab,
                         std::uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(3, vocab, {rows, length}, g, torch::kInt64);
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

fs::path tmp_dir(const std::string& name) {
  fs::path dir = fs::path(TESSERA_TEST_TMP_DIR) / "generate" / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

std::map<std::string, torch::Tensor> weights(PretrainedModel& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

}  // namespace

class TestGenerate : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void kvCacheMatchesFullForward_data() {
    QTest::addColumn<QString>("config");
    QTest::newRow("llama") << QString::fromStdString(decoder_config("llama").dump());
    QTest::newRow("llama_tied_bias") << QString::fromStdString(
        decoder_config("llama", {{"tie_word_embeddings", true}, {"attention_bias", true}}).dump());
    // A window of 3 < the 12 positions: the cached sliding mask itself is exercised.
    QTest::newRow("mistral_sliding") << QString::fromStdString(
        decoder_config("mistral",
                       {{"sliding_window", 3}, {"architectures", {"MistralForCausalLM"}}})
            .dump());
    QTest::newRow("qwen2") << QString::fromStdString(decoder_config("qwen2").dump());
    QTest::newRow("gpt2") << QString::fromStdString(gpt2_config().dump());
  }
  void kvCacheMatchesFullForward() {
    QFETCH(QString, config);
    auto model = make(json::parse(config.toStdString()));
    torch::NoGradGuard no_grad;
    const torch::Tensor ids = random_ids(1, 12, 61, 17);
    ForwardInput full;
    full.input_ids = ids;
    const torch::Tensor expected = model->forward(full).logits;
    QVERIFY(expected.std().item<double>() > 0.3);  // a bound of 1e-5 means something

    // Prefill 5 tokens, then 1, 2 and single tokens against the cache.
    KVCache cache;
    std::int64_t at = 0;
    for (std::int64_t step : {5, 1, 2, 1, 1, 1, 1}) {
      ForwardInput in;
      in.input_ids = ids.narrow(1, at, step);
      in.cache = &cache;
      const torch::Tensor logits = model->forward(in).logits;
      QCOMPARE(cache.length(), at + step);
      const double diff = max_diff(logits, expected.narrow(1, at, step));
      if (diff > 1e-5)
        QFAIL(
            qPrintable(QString("positions %1..%2 differ by %3").arg(at).arg(at + step).arg(diff)));
      at += step;
    }
    QCOMPARE(at, std::int64_t{12});
  }

  // A left-padded batch decoded with the cache, positions from the mask (as generate does),
  // gives each row the logits of that row run alone without padding.
  void leftPaddedBatchWithCacheMatchesRowsAlone() {
    for (const json& config : {decoder_config("llama"), gpt2_config()}) {
      auto model = make(config);
      torch::NoGradGuard no_grad;
      const torch::Tensor a = random_ids(1, 9, 61, 5);
      const torch::Tensor b = random_ids(1, 4, 61, 6);
      torch::Tensor ids = torch::zeros({2, 9}, torch::kInt64);
      torch::Tensor mask = torch::zeros({2, 9}, torch::kInt64);
      ids[0].copy_(a[0]);
      mask[0].fill_(1);
      ids[1].narrow(0, 5, 4).copy_(b[0]);
      mask[1].narrow(0, 5, 4).fill_(1);
      KVCache cache;
      ForwardInput prefill;
      prefill.input_ids = ids;
      prefill.attention_mask = mask;
      prefill.position_ids = (mask.cumsum(-1) - 1).masked_fill(mask.eq(0), 0);
      prefill.cache = &cache;
      torch::Tensor last = model->forward(prefill).logits.select(1, -1);
      // One more token for each row.
      const torch::Tensor next = torch::tensor({{7}, {11}}, torch::kInt64);
      ForwardInput step;
      step.input_ids = next;
      step.attention_mask = torch::cat({mask, torch::ones({2, 1}, torch::kInt64)}, 1);
      step.position_ids = torch::tensor({{9}, {4}}, torch::kInt64);
      step.cache = &cache;
      torch::Tensor after = model->forward(step).logits.select(1, -1);

      for (int row = 0; row < 2; ++row) {
        torch::Tensor alone = torch::cat({row == 0 ? a : b, next[row].unsqueeze(0)}, 1);
        ForwardInput in;
        in.input_ids = alone;
        torch::Tensor logits = model->forward(in).logits;
        QVERIFY(max_diff(last[row], logits[0][alone.size(1) - 2]) <= 1e-5);
        QVERIFY(max_diff(after[row], logits[0][alone.size(1) - 1]) <= 1e-5);
      }
    }
  }

  void greedyFollowsArgmaxAndStopsAtEos() {
    auto model = make(decoder_config("llama"));
    const std::vector<std::int64_t> prompt{1, 17, 23, 5};
    GenerateOptions options;
    options.max_new_tokens = 10;
    GenerateResult r = generate(*model, {prompt}, options);
    QCOMPARE(r.tokens.front().size(), std::size_t{10});
    QVERIFY(!r.stopped_at_eos.front());
    // Each new token is the argmax of a full forward over everything before it.
    std::vector<std::int64_t> all = prompt;
    all.insert(all.end(), r.tokens.front().begin(), r.tokens.front().end());
    ForwardInput in;
    in.input_ids = torch::tensor(all, torch::kInt64).unsqueeze(0);
    torch::Tensor argmax = model->forward(in).logits[0].argmax(-1);
    for (std::size_t i = 0; i < 10; ++i)
      QCOMPARE(argmax[static_cast<std::int64_t>(prompt.size() + i - 1)].item<std::int64_t>(),
               r.tokens.front()[i]);

    // With the third token declared EOS, generation stops right after it, EOS included.
    options.eos_token_ids = {r.tokens.front()[2]};
    GenerateResult stopped = generate(*model, {prompt}, options);
    QVERIFY(stopped.stopped_at_eos.front());
    const auto first_eos =
        std::find(r.tokens.front().begin(), r.tokens.front().end(), options.eos_token_ids[0]) -
        r.tokens.front().begin();
    QCOMPARE(stopped.tokens.front().size(), static_cast<std::size_t>(first_eos + 1));

    // A batch gives each prompt what it gets alone.
    const std::vector<std::int64_t> other{9, 4};
    options.eos_token_ids.clear();
    GenerateResult batch = generate(*model, {prompt, other}, options);
    QCOMPARE(batch.tokens[0], r.tokens.front());
    QCOMPARE(batch.tokens[1], generate(*model, {other}, options).tokens.front());

    // A callback can stop generation.
    int calls = 0;
    generate(*model, {prompt}, options, [&](std::size_t, std::int64_t) { return ++calls < 3; });
    QCOMPARE(calls, 3);
  }

  void samplingIsSeededAndWarpersFilter() {
    SamplingOptions s;
    s.greedy = false;
    // probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.8 keeps the first two (transformers keeps
    // tokens until the cumulative probability of the removed tail exceeds 1 - top_p).
    torch::Tensor scores = torch::tensor({0.5, 0.3, 0.15, 0.05}).log().unsqueeze(0);
    s.top_p = 0.8;
    torch::Tensor kept = torch::isfinite(warp_logits(scores, s))[0];
    QCOMPARE(kept.sum().item<std::int64_t>(), std::int64_t{2});
    QVERIFY(kept[0].item<bool>() && kept[1].item<bool>());
    s.top_p = 1.0;
    s.top_k = 3;
    kept = torch::isfinite(warp_logits(scores, s))[0];
    QCOMPARE(kept.sum().item<std::int64_t>(), std::int64_t{3});
    QVERIFY(!kept[3].item<bool>());
    s.top_k = 0;
    s.temperature = 2.0;
    QVERIFY(max_diff(warp_logits(scores, s), scores / 2.0) == 0.0);

    auto model = make(decoder_config("llama"));
    GenerateOptions options;
    options.max_new_tokens = 12;
    options.sampling.greedy = false;
    options.sampling.temperature = 1.5;
    options.sampling.seed = 42;
    const auto a = generate(*model, {{1, 2, 3}}, options).tokens.front();
    const auto b = generate(*model, {{1, 2, 3}}, options).tokens.front();
    options.sampling.seed = 43;
    const auto c = generate(*model, {{1, 2, 3}}, options).tokens.front();
    QCOMPARE(a, b);
    QVERIFY(a != c);

    options.sampling.top_p = 0.0;
    QVERIFY_THROWS_EXCEPTION(Error, generate(*model, {{1, 2}}, options));
  }

  void cacheInputsAreValidated() {
    auto model = make(decoder_config("llama"));
    KVCache cache;
    ForwardInput in;
    in.input_ids = random_ids(1, 4, 61, 1);
    in.cache = &cache;
    model->forward(in);
    ForwardInput next;
    next.input_ids = random_ids(1, 1, 61, 2);
    next.cache = &cache;
    next.attention_mask = torch::ones({1, 1}, torch::kInt64);  // must cover 4 + 1 positions
    try {
      model->forward(next);
      QFAIL("a mask not covering the cached positions was accepted");
    } catch (const Error& e) {
      QCOMPARE(e.kind(), ErrorKind::InvalidInput);
      QVERIFY(std::string(e.what()).find("[1, 5]") != std::string::npos);
    }
    next.attention_mask = torch::Tensor();
    next.input_ids = random_ids(2, 1, 61, 2);
    QVERIFY_THROWS_EXCEPTION(Error, model->forward(next));  // batch 2 on a cache of 1

    json bert{{"model_type", "bert"},     {"architectures", {"BertModel"}},
              {"vocab_size", 50},         {"hidden_size", 16},
              {"intermediate_size", 32},  {"num_hidden_layers", 1},
              {"num_attention_heads", 2}, {"max_position_embeddings", 32}};
    auto encoder = make(bert);
    KVCache other;
    ForwardInput b;
    b.input_ids = random_ids(1, 3, 50, 1);
    b.cache = &other;
    try {
      encoder->forward(b);
      QFAIL("bert accepted a KV cache");
    } catch (const Error& e) {
      QCOMPARE(e.kind(), ErrorKind::Unsupported);
    }
  }

  // Mean over all predicted tokens of the dataset, not the mean of per-sequence means; padding
  // and batch size change nothing.
  void evalIsTokenWeightedAndBatchIndependent() {
    auto model = make(decoder_config("llama"));
    std::vector<std::vector<std::int32_t>> seqs{{1, 5, 9, 13, 17, 21, 25}, {1, 8}, {4}, {1, 3, 5}};
    double total = 0.0;
    std::int64_t count = 0;
    for (const auto& s : seqs) {
      if (s.size() < 2) continue;
      ForwardInput in;
      in.input_ids = torch::tensor(std::vector<std::int64_t>(s.begin(), s.end())).unsqueeze(0);
      in.labels = in.input_ids;
      const auto n = static_cast<std::int64_t>(s.size()) - 1;
      total += model->forward(in).loss.item<double>() * static_cast<double>(n);
      count += n;
    }
    for (std::int64_t budget : {1, 8, 10000}) {
      EvalOptions o;
      o.batch_tokens = budget;
      EvalResult r = evaluate_causal_lm(*model, seqs, o);
      QCOMPARE(r.predicted_tokens, count);
      QCOMPARE(r.sequences, std::int64_t{4});
      QVERIFY(std::abs(r.mean_loss() - total / static_cast<double>(count)) <= 1e-6);
      QVERIFY(std::abs(r.perplexity() - std::exp(r.mean_loss())) <= 1e-9);
    }
    QVERIFY_THROWS_EXCEPTION(Error, evaluate_causal_lm(*model, {{4}, {5}}));
  }

  void parseSizeAsTransformers() {
    QCOMPARE(ex::parse_size("2GB"), std::uint64_t{2'000'000'000});
    QCOMPARE(ex::parse_size("500MB"), std::uint64_t{500'000'000});
    QCOMPARE(ex::parse_size("1GiB"), std::uint64_t{1} << 30);
    QCOMPARE(ex::parse_size("60kb"), std::uint64_t{60'000});
    QCOMPARE(ex::parse_size("123"), std::uint64_t{123});
    for (const char* bad : {"", "GB", "-1GB", "2XB", "0", "1.2.3MB"})
      QVERIFY_THROWS_EXCEPTION(Error, ex::parse_size(bad));
  }

  void exportReloadsVerifiesAndProtectsTheDestination() {
    const json config = decoder_config("llama", {{"torch_dtype", "float32"}});
    auto model = make(config);
    const fs::path src = tmp_dir("export_src");
    fs::create_directories(src);
    tessera::core::write_file_atomic(src / "tokenizer.json", "{}");
    tessera::core::write_file_atomic(src / "generation_config.json", R"({"top_k": 7})");
    const fs::path out = tmp_dir("export_out");
    ex::ExportOptions options;
    options.tokenizer_dir = src;
    options.source_dir = src;
    options.max_shard_bytes = 40'000;  // several shards for this ~90 kB model
    ex::ExportReport report = ex::export_pretrained(*model, out, options);
    QVERIFY(report.verify.passed);
    QCOMPARE(report.verify.max_abs_diff, 0.0);
    QVERIFY(fs::exists(out / "model.safetensors.index.json"));
    QVERIFY(fs::exists(out / "tokenizer.json"));
    const json gen = json::parse(tessera::core::read_text_file(out / "generation_config.json"));
    QCOMPARE(gen["top_k"].get<int>(), 7);
    QCOMPARE(gen["eos_token_id"].get<int>(), 2);
    const json written = json::parse(tessera::core::read_text_file(out / "config.json"));
    QCOMPARE(written["dtype"].get<std::string>(), std::string("float32"));
    QCOMPARE(written["torch_dtype"].get<std::string>(), std::string("float32"));
    auto reloaded = load_pretrained(out);
    auto before = weights(*model);
    for (const auto& [name, t] : weights(*reloaded)) QVERIFY(torch::equal(t, before.at(name)));
    // Only the destination appears next to it: no temporary folder is left behind.
    int entries = 0;
    for (const auto& e : fs::directory_iterator(out.parent_path()))
      entries += e.path().filename().string().find("export_out") != std::string::npos ? 1 : 0;
    QCOMPARE(entries, 1);

    // A non-empty destination is refused without force, and left as it was.
    try {
      ex::export_pretrained(*model, out, options);
      QFAIL("an existing export was overwritten without force");
    } catch (const Error& e) {
      QCOMPARE(e.kind(), ErrorKind::InvalidInput);
      QVERIFY(std::string(e.what()).find(out.string()) != std::string::npos);
    }
    // With force, a bf16 export replaces it.
    options.force = true;
    options.dtype = torch::kBFloat16;
    report = ex::export_pretrained(*model, out.string() + "/", options);  // "dir/" names dir
    QVERIFY(report.verify.passed);
    QCOMPARE(
        json::parse(tessera::core::read_text_file(out / "config.json"))["dtype"].get<std::string>(),
        std::string("bfloat16"));
    auto bf16 = load_pretrained(out, torch::kBFloat16);
    for (const auto& [name, t] : weights(*bf16))
      QVERIFY(torch::equal(t, before.at(name).to(torch::kBFloat16)));

    // A file in the way is an error naming it.
    const fs::path file = tmp_dir("export_file");
    tessera::core::write_file_atomic(file, "x");
    QVERIFY_THROWS_EXCEPTION(Error, ex::export_pretrained(*model, file, options));
  }

  void mergeCheckCatchesALostDelta() {
    auto g = at::make_generator<at::CPUGeneratorImpl>(9);
    std::map<std::string, torch::Tensor> base{{"q.weight", at::normal(0.0, 0.1, {16, 16}, g)},
                                              {"v.weight", at::normal(0.0, 0.1, {16, 16}, g)},
                                              {"o.weight", at::normal(0.0, 0.1, {16, 16}, g)}};
    // A LoRA delta: scaling * B·A of rank 2.
    auto lora_delta = [&] {
      return 2.0 * at::matmul(at::normal(0.0, 0.05, {16, 2}, g), at::normal(0.0, 0.05, {2, 16}, g));
    };
    std::map<std::string, torch::Tensor> deltas{{"q.weight", lora_delta()},
                                                {"v.weight", lora_delta()}};
    std::map<std::string, torch::Tensor> merged = base;
    for (const auto& [n, d] : deltas) merged[n] = base[n] + d;

    auto good = ex::check_merged_deltas(base, merged, deltas);
    QVERIFY2(good.passed, good.summary().c_str());
    QCOMPARE(good.entries.size(), std::size_t{3});

    // Merged weights stored in bf16 still pass: the rounding is accounted for.
    std::map<std::string, torch::Tensor> merged_bf16;
    for (const auto& [n, w] : merged) merged_bf16[n] = w.to(torch::kBFloat16);
    QVERIFY2(ex::check_merged_deltas(base, merged_bf16, deltas).passed,
             ex::check_merged_deltas(base, merged_bf16, deltas).summary().c_str());

    // The known failure: the base written back instead of the merge.
    auto lost = ex::check_merged_deltas(base, base, deltas);
    QVERIFY(!lost.passed);
    QCOMPARE(lost.failures(), std::size_t{2});
    QVERIFY(lost.summary().find("without the delta") != std::string::npos);

    // Half the delta (a wrong scaling) fails too.
    std::map<std::string, torch::Tensor> half = base;
    for (const auto& [n, d] : deltas) half[n] = base[n] + 0.5 * d;
    QVERIFY(!ex::check_merged_deltas(base, half, deltas).passed);

    // A zero delta cannot prove anything.
    std::map<std::string, torch::Tensor> zero{{"q.weight", torch::zeros({16, 16})}};
    auto z = ex::check_merged_deltas(base, base, zero);
    QVERIFY(!z.passed);
    QVERIFY(z.summary().find("zero") != std::string::npos);

    // A delta merged into the wrong module: the unadapted weight changed.
    std::map<std::string, torch::Tensor> wrong = merged;
    wrong["o.weight"] = base["o.weight"] + deltas["q.weight"];
    auto w = ex::check_merged_deltas(base, wrong, deltas);
    QVERIFY(!w.passed);
    QVERIFY(w.summary().find("o.weight") != std::string::npos);

    // Missing weights are failures, not silently skipped.
    std::map<std::string, torch::Tensor> missing = merged;
    missing.erase("v.weight");
    QVERIFY(!ex::check_merged_deltas(base, missing, deltas).passed);
  }
};

QTEST_APPLESS_MAIN(TestGenerate)
#include "test_generate.moc"
