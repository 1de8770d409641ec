// Model families: parameter names equal transformers' names, checkpoints load (with or without
// the base-model prefix), and bad checkpoints or inputs give errors naming the tensor or field.
#include <torch/torch.h>

#include <QtTest>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "core/error.h"
#include "core/files.h"
#include "cuda/dequantize_value.h"
#include "hf/config.h"
#include "hf/families.h"
#include "hf/safetensors.h"
#include "model/dropout.h"
#include "model/head_loss.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/quantized_linear.h"
#include "quant/four_bit.h"
#include "quant/int8_rows.h"

using nlohmann::json;
using tessera::Error;
using tessera::ErrorKind;
using namespace tessera::model;
namespace fs = std::filesystem;

namespace {

json llama_config() {
  return json{{"model_type", "llama"},
              {"architectures", {"LlamaForCausalLM"}},
              {"vocab_size", 50},
              {"hidden_size", 16},
              {"intermediate_size", 24},
              {"num_hidden_layers", 1},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-5},
              {"max_position_embeddings", 64},
              {"tie_word_embeddings", false}};
}

json gpt2_config() {
  return json{{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}},
              {"vocab_size", 50},     {"n_embd", 16},
              {"n_layer", 1},         {"n_head", 2},
              {"n_positions", 32}};
}

json bert_config(const char* architecture) {
  return json{{"model_type", "bert"},     {"architectures", {architecture}},
              {"vocab_size", 50},         {"hidden_size", 16},
              {"intermediate_size", 32},  {"num_hidden_layers", 1},
              {"num_attention_heads", 2}, {"max_position_embeddings", 32},
              {"type_vocab_size", 2},     {"num_labels", 3}};
}

// A small config of every family in the registry (hf/families.cpp), with a qkv bias where the
// family has the option, so the registry's shapes are checked with their biases.
json small_config(const std::string& model_type) {
  if (model_type == "gpt2") return gpt2_config();
  if (model_type == "bert") return bert_config("BertForSequenceClassification");
  json c = llama_config();
  c["model_type"] = model_type;
  if (model_type == "llama") c["attention_bias"] = true;
  if (model_type == "mistral") c["architectures"] = {"MistralForCausalLM"};
  if (model_type == "qwen2") c["architectures"] = {"Qwen2ForCausalLM"};
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2") return json();
  return c;
}

std::shared_ptr<PretrainedModel> make(const json& config) {
  auto c = tessera::hf::parse_model_config(config, "config.json");
  auto model = create_model(c, head_from_config(c));
  init_weights(*model, 7);
  model->eval();
  return model;
}

std::set<std::string> parameter_names(PretrainedModel& model) {
  std::set<std::string> names;
  for (const auto& item : model.named_parameters()) names.insert(item.key());
  return names;
}

// Writes `model`'s parameters as a HF model folder; `rename` maps a name to the checkpoint name
// (empty = leave the tensor out), `reshape` may replace a tensor.
fs::path save(PretrainedModel& model, const json& config, const std::string& folder,
              std::function<std::string(const std::string&)> rename = {},
              std::function<torch::Tensor(const std::string&, torch::Tensor)> replace = {}) {
  fs::path dir = fs::path(TESSERA_TEST_TMP_DIR) / "model" / folder;
  fs::remove_all(dir);
  fs::create_directories(dir);
  tessera::core::write_file_atomic(dir / "config.json", config.dump());
  std::vector<torch::Tensor> keep;
  std::vector<tessera::hf::TensorToWrite> tensors;
  for (const auto& item : model.named_parameters()) {
    std::string name = rename ? rename(item.key()) : item.key();
    if (name.empty()) continue;
    torch::Tensor t = item.value().detach().to(torch::kFloat32).contiguous();
    if (replace) t = replace(item.key(), t).contiguous();
    keep.push_back(t);
    tessera::hf::TensorToWrite w;
    w.name = name;
    w.dtype =
        t.scalar_type() == torch::kBFloat16 ? tessera::hf::DType::BF16 : tessera::hf::DType::F32;
    w.shape.assign(t.sizes().begin(), t.sizes().end());
    w.bytes = {reinterpret_cast<const std::uint8_t*>(t.data_ptr()),
               static_cast<std::size_t>(t.numel() * t.element_size())};
    tensors.push_back(w);
  }
  tessera::hf::write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

template <typename F>
void expect_error(F&& f, ErrorKind kind, std::initializer_list<std::string> needles) {
  try {
    f();
    QFAIL("expected an error");
  } catch (const Error& e) {
    std::string text = std::string(e.what()) + " | " + e.hint();
    QVERIFY2(e.kind() == kind, text.c_str());
    for (const auto& n : needles)
      QVERIFY2(text.find(n) != std::string::npos, (text + " lacks: " + n).c_str());
  }
}

ForwardInput batch(std::vector<std::vector<std::int64_t>> rows, std::int64_t pad_to) {
  ForwardInput in;
  in.input_ids = torch::zeros({static_cast<std::int64_t>(rows.size()), pad_to}, torch::kInt64);
  in.attention_mask = torch::zeros_like(in.input_ids);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t i = 0; i < rows[r].size(); ++i) {
      in.input_ids[r][i] = rows[r][i];
      in.attention_mask[r][i] = 1;
    }
  return in;
}

// The head block tests' inputs: hidden [37, 16], weight [50, 16] and bias [50] in `dtype`,
// targets over the 50 columns with every fifth ignored (-100).
struct HeadCase {
  torch::Tensor hidden, weight, bias, targets;
};
HeadCase head_case(torch::ScalarType dtype) {
  const auto options = torch::TensorOptions().dtype(dtype);
  HeadCase c{torch::randn({37, 16}, options), torch::randn({50, 16}, options),
             torch::randn({50}, options), torch::randint(0, 50, {37}, torch::kInt64)};
  c.targets.index_put_({torch::arange(0, 37, 5)}, -100);
  return c;
}

// {value, and after backward of `objective(value)` the gradients of hidden, weight and bias}
// for value = `head(hidden, weight, bias)` on copies of the case's tensors, the weight and bias
// training where `trains`.
using HeadFunction =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;
std::vector<torch::Tensor> head_gradients(
    const HeadCase& c, bool trains, const HeadFunction& head,
    const std::function<torch::Tensor(const torch::Tensor&)>& objective) {
  const torch::Tensor h = c.hidden.clone().requires_grad_(true);
  const torch::Tensor w = c.weight.clone().requires_grad_(trains);
  const torch::Tensor b = c.bias.clone().requires_grad_(trains);
  const torch::Tensor value = head(h, w, b);
  objective(value).backward();
  return {value.detach(), h.grad(), w.grad(), b.grad()};
}

// Gradients 1.. of head_gradients against the whole logits' (defined alike, same dtype, close
// within rtol / atol in float32); the weight's defined exactly where it trains.
void compare_head_gradients(const std::vector<torch::Tensor>& ours,
                            const std::vector<torch::Tensor>& whole, bool trains, double rtol,
                            double atol, const char* dtype) {
  for (std::size_t i = 1; i < ours.size(); ++i) {
    QCOMPARE(ours[i].defined(), whole[i].defined());
    if (!ours[i].defined()) continue;
    QCOMPARE(ours[i].scalar_type(), whole[i].scalar_type());
    QVERIFY2(torch::allclose(ours[i].to(torch::kFloat32), whole[i].to(torch::kFloat32), rtol, atol),
             qPrintable(QString("gradient %1, %2, trains %3").arg(i).arg(dtype).arg(trains)));
  }
  QCOMPARE(ours[2].defined(), trains);
}

// The block computed on the host by the CUDA kernels' per-value code (cuda/dequantize_value.h)
// from the block they are given (four_bit_block, int8_block), rounded to `dtype` once, to
// nearest with ties to even, as the kernels' stores do.
torch::Tensor by_the_kernels_values(const QuantizedWeight& q, std::int64_t first_row,
                                    std::int64_t end_row, std::int64_t first_col,
                                    std::int64_t end_col, torch::Dtype dtype) {
  const std::int64_t rows = end_row - first_row, cols = end_col - first_col;
  torch::Tensor values = torch::empty({rows, cols}, torch::kFloat32);
  float* v = values.data_ptr<float>();
  const bool four_bit = q.format() != QuantizedFormat::Int8;
  const auto nibbles = four_bit ? q.four_bit_block(first_row, end_row, first_col, end_col)
                                : tessera::cuda::FourBitBlock{};
  const auto int8 =
      four_bit ? tessera::cuda::Int8Block{} : q.int8_block(first_row, end_row, first_col, end_col);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      v[r * cols + c] =
          four_bit ? tessera::cuda::four_bit_value(
                         nibbles, nibbles.code, (first_row + r) * q.in_features() + first_col + c)
                   : tessera::cuda::int8_value(int8, first_row + r, first_col + c);
  return values.to(dtype);
}

}  // namespace

class TestModel : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void llamaNamesAreHfNames() {
    auto model = make(llama_config());
    std::set<std::string> expected = {"model.embed_tokens.weight",
                                      "model.layers.0.self_attn.q_proj.weight",
                                      "model.layers.0.self_attn.k_proj.weight",
                                      "model.layers.0.self_attn.v_proj.weight",
                                      "model.layers.0.self_attn.o_proj.weight",
                                      "model.layers.0.mlp.gate_proj.weight",
                                      "model.layers.0.mlp.up_proj.weight",
                                      "model.layers.0.mlp.down_proj.weight",
                                      "model.layers.0.input_layernorm.weight",
                                      "model.layers.0.post_attention_layernorm.weight",
                                      "model.norm.weight",
                                      "lm_head.weight"};
    QCOMPARE(parameter_names(*model), expected);
    QCOMPARE(model->named_parameters()["model.layers.0.self_attn.k_proj.weight"].sizes().vec(),
             (std::vector<std::int64_t>{8, 16}));  // 2 kv heads × head_dim 4

    json tied = llama_config();
    tied["tie_word_embeddings"] = true;
    expected.erase("lm_head.weight");  // tied: lm_head is the embedding, as in transformers
    QCOMPARE(parameter_names(*make(tied)), expected);

    json qwen = llama_config();
    qwen["model_type"] = "qwen2";
    auto names = parameter_names(*make(qwen));
    QVERIFY(names.count("model.layers.0.self_attn.q_proj.bias"));
    QVERIFY(names.count("model.layers.0.self_attn.v_proj.bias"));
    QVERIFY(!names.count("model.layers.0.self_attn.o_proj.bias"));

    json base = llama_config();
    base["architectures"] = {"LlamaModel"};
    names = parameter_names(*make(base));
    QVERIFY(names.count("layers.0.self_attn.q_proj.weight"));
    QVERIFY(!names.count("lm_head.weight"));
  }

  void gpt2AndBertNamesAreHfNames() {
    auto gpt2 = make(gpt2_config());
    auto names = parameter_names(*gpt2);
    QVERIFY(names.count("transformer.h.0.attn.c_attn.weight"));
    QVERIFY(names.count("transformer.wpe.weight"));
    QVERIFY(!names.count("lm_head.weight"));  // tied by default
    // Conv1D keeps HF's [in, out] layout.
    QCOMPARE(gpt2->named_parameters()["transformer.h.0.attn.c_attn.weight"].sizes().vec(),
             (std::vector<std::int64_t>{16, 48}));

    names = parameter_names(*make(bert_config("BertForSequenceClassification")));
    QVERIFY(names.count("bert.encoder.layer.0.attention.self.query.weight"));
    QVERIFY(names.count("bert.encoder.layer.0.attention.output.LayerNorm.weight"));
    QVERIFY(names.count("bert.pooler.dense.weight"));
    QVERIFY(names.count("classifier.weight"));
    names = parameter_names(*make(bert_config("BertModel")));
    QVERIFY(names.count("encoder.layer.0.attention.self.query.weight"));
    QVERIFY(names.count("embeddings.token_type_embeddings.weight"));
  }

  void roundTripGivesSameLogits() {
    json config = llama_config();
    auto model = make(config);
    fs::path dir = save(*model, config, "roundtrip");
    auto loaded = load_pretrained(dir);
    torch::NoGradGuard no_grad;
    ForwardInput in = batch({{1, 2, 3, 4}, {5, 6}}, 4);
    auto a = model->forward(in);
    auto b = loaded->forward(in);
    QVERIFY(torch::equal(a.logits, b.logits));
    QCOMPARE(a.logits.sizes().vec(), (std::vector<std::int64_t>{2, 4, 50}));
  }

  // LoRA under `single` leaves the frozen input embedding and output head in the checkpoint
  // file: their parameters are empty, their dense shapes are the tables', and the model computes
  // what the loaded one does — logits (bf16: exactly), the loss and preference tuning's
  // log-probabilities with every trainable parameter's gradient (fp32) — also once the file is
  // deleted (it stays open). A tied table is the head's too and stays loaded; a trainable one
  // stays loaded.
  void frozenTablesLeftInTheFileComputeAsLoaded() {
    json config = llama_config();
    auto model = make(config);
    const fs::path dir = save(*model, config, "table_in_file");
    const auto c = tessera::hf::parse_model_config(config, "config.json");
    const std::vector<std::string> tables{"model.embed_tokens.weight", "lm_head.weight"};
    auto frozen_tables = [&](PretrainedModel& m) {
      for (const std::string& name : tables) m.named_parameters()[name].set_requires_grad(false);
    };
    for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
      auto loaded = load_pretrained(dir, dtype);
      auto leaves = create_model(c, head_from_config(c));
      const DeferredWeights weights(*leaves, tessera::hf::SafetensorsCheckpoint::open(dir));
      QVERIFY(weights.leave_frozen_tables_in_file(*leaves, dtype).empty());  // they train
      frozen_tables(*leaves);
      frozen_tables(*loaded);
      QCOMPARE(weights.leave_frozen_tables_in_file(*leaves, dtype), tables);
      weights.load_into(*leaves, dtype);
      for (const std::string& name : tables)
        QCOMPARE(leaves->named_parameters()[name].numel(), std::int64_t{0});
      for (const auto& [name, shape] : dense_parameter_shapes(*leaves))
        QCOMPARE(shape, loaded->named_parameters()[name].sizes().vec());
      const ForwardInput in = batch({{1, 2, 3, 2, 49}, {0, 7, 7}}, 5);
      if (dtype == torch::kBFloat16) {
        leaves->eval();
        loaded->eval();
        torch::NoGradGuard no_grad;
        QVERIFY(torch::equal(leaves->forward(in).logits, loaded->forward(in).logits));
        continue;
      }
      // Training's figures, dropout off (eval), gradients of every trainable parameter.
      leaves->eval();
      loaded->eval();
      ForwardInput labelled = in;
      labelled.labels = in.input_ids.clone();
      labelled.labels[1][3] = -100;
      labelled.labels[1][4] = -100;
      labelled.logits = false;
      auto figures = [&](PretrainedModel& m, bool log_probs) {
        m.zero_grad();
        ForwardInput asked = labelled;
        asked.label_log_probs = log_probs;
        const ForwardOutput out = m.forward(asked);
        const torch::Tensor value = log_probs ? out.label_log_probs : out.loss;
        (log_probs ? (value * torch::arange(1, 9).view({2, 4})).sum() : value).backward();
        std::vector<torch::Tensor> result{value.detach()};
        for (const auto& p : m.named_parameters())
          if (p.value().requires_grad()) result.push_back(p.value().grad().clone());
        return result;
      };
      for (const bool log_probs : {false, true}) {
        const auto ours = figures(*leaves, log_probs), whole = figures(*loaded, log_probs);
        QCOMPARE(ours.size(), whole.size());
        for (std::size_t i = 0; i < ours.size(); ++i)
          QVERIFY2(torch::allclose(ours[i], whole[i], 1e-5, 1e-6),
                   qPrintable(QString("log_probs %1, tensor %2").arg(log_probs).arg(i)));
      }
      fs::remove_all(dir);
      torch::NoGradGuard no_grad;
      QVERIFY(torch::allclose(leaves->forward(in).logits, loaded->forward(in).logits, 1e-5, 1e-6));
    }

    json tied = llama_config();
    tied["tie_word_embeddings"] = true;
    auto tied_model = make(tied);
    const fs::path tied_dir = save(*tied_model, tied, "table_tied");
    const auto tc = tessera::hf::parse_model_config(tied, "config.json");
    auto kept = create_model(tc, head_from_config(tc));
    for (auto& p : kept->parameters()) p.set_requires_grad(false);
    const DeferredWeights tied_weights(*kept, tessera::hf::SafetensorsCheckpoint::open(tied_dir));
    QVERIFY(tied_weights.leave_frozen_tables_in_file(*kept, torch::kBFloat16).empty());
  }

  void rightPaddingDoesNotChangeValidLogits() {
    auto model = make(llama_config());
    torch::NoGradGuard no_grad;
    auto padded = model->forward(batch({{1, 2, 3, 4, 5}, {6, 7}}, 5));
    auto alone = model->forward(batch({{6, 7}}, 2));
    QVERIFY(torch::allclose(padded.logits[1].narrow(0, 0, 2), alone.logits[0], 1e-5, 1e-5));
    QVERIFY(!padded.logits.isnan().any().item<bool>());
  }

  void oldGpt2CheckpointWithoutPrefixLoads() {
    json config = gpt2_config();
    auto model = make(config);
    // Original GPT-2 checkpoints: no "transformer." prefix and an attn.bias buffer per block.
    fs::path dir = save(*model, config, "gpt2_old", [](const std::string& n) {
      return n.substr(std::string("transformer.").size());
    });
    auto loaded = load_pretrained(dir);
    torch::NoGradGuard no_grad;
    ForwardInput in = batch({{1, 2, 3}}, 3);
    QVERIFY(torch::equal(model->forward(in).logits, loaded->forward(in).logits));
  }

  void bf16CheckpointLoadsIntoFloat32() {
    json config = llama_config();
    auto model = make(config);
    fs::path dir = save(*model, config, "bf16", {},
                        [](const std::string&, torch::Tensor t) { return t.to(torch::kBFloat16); });
    auto loaded = load_pretrained(dir, torch::kFloat32);
    auto original = model->named_parameters();
    for (const auto& item : loaded->named_parameters()) {
      QCOMPARE(item.value().scalar_type(), torch::kFloat32);
      QVERIFY(torch::equal(item.value(),
                           original[item.key()].to(torch::kBFloat16).to(torch::kFloat32)));
    }
  }

  void bertModelLoadsFromClassifierCheckpoint() {
    // A BertForSequenceClassification checkpoint ("bert." prefix + classifier) loaded as a
    // BertModel: the prefix is stripped and the classifier skipped, as transformers does.
    json cls_config = bert_config("BertForSequenceClassification");
    auto classifier = make(cls_config);
    json base_config = bert_config("BertModel");
    fs::path dir = save(*classifier, base_config, "bert_cls_as_base");
    LoadReport report;
    auto base = load_pretrained(dir, torch::kFloat32, torch::kCPU, &report);
    QCOMPARE(report.skipped, (std::vector<std::string>{"classifier.bias", "classifier.weight"}));
    torch::NoGradGuard no_grad;
    ForwardInput in = batch({{1, 2, 3}, {4, 5}}, 3);
    QVERIFY(torch::equal(base->forward(in).hidden_states, classifier->forward(in).hidden_states));
  }

  void missingTensorIsNamed() {
    json config = llama_config();
    auto model = make(config);
    fs::path dir = save(*model, config, "missing", [](const std::string& n) {
      return n == "model.norm.weight" ? std::string() : n;
    });
    expect_error([&] { load_pretrained(dir); }, ErrorKind::InvalidInput,
                 {"model.norm.weight", "missing", dir.string()});
  }

  void unexpectedTensorIsNamed() {
    json config = llama_config();
    auto model = make(config);
    fs::path dir = save(*model, config, "unexpected", [](const std::string& n) {
      return n == "model.norm.weight" ? std::string("model.final_norm.weight") : n;
    });
    expect_error([&] { load_pretrained(dir); }, ErrorKind::InvalidInput,
                 {"model.final_norm.weight", "model.norm.weight"});
  }

  void shapeMismatchNamesTensorAndShapes() {
    json config = llama_config();
    auto model = make(config);
    fs::path dir = save(*model, config, "shape", {}, [](const std::string& n, torch::Tensor t) {
      return n == "model.layers.0.self_attn.k_proj.weight" ? torch::zeros({16, 16}) : t;
    });
    expect_error([&] { load_pretrained(dir); }, ErrorKind::InvalidInput,
                 {"model.layers.0.self_attn.k_proj.weight", "[16, 16]", "[8, 16]"});
  }

  void unsupportedModelTypeIsNamed() {
    json config = llama_config();
    config["model_type"] = "t5";
    fs::path dir = fs::path(TESSERA_TEST_TMP_DIR) / "model" / "t5";
    fs::create_directories(dir);
    tessera::core::write_file_atomic(dir / "config.json", config.dump());
    expect_error([&] { load_pretrained(dir); }, ErrorKind::Unsupported, {"t5"});

    auto c = tessera::hf::parse_model_config(gpt2_config(), "config.json");
    expect_error([&] { create_model(c, TaskHead::SequenceClassification); }, ErrorKind::Unsupported,
                 {"gpt2", "sequence classification"});
  }

  // Pipeline stages: a model run as two stages (layers [0, 1) then [1, 3), the second from the
  // first's output) computes the whole model's loss and logits; a stage after the first needs
  // the previous one's output; bert has no stages.
  void stagesComposeToTheWholeModel() {
    for (json config : {llama_config(), gpt2_config()}) {
      config[config.contains("n_layer") ? "n_layer" : "num_hidden_layers"] = 3;
      auto model = make(config);
      torch::NoGradGuard no_grad;
      ForwardInput in = batch({{1, 2, 3, 4}, {5, 6, 7}}, 4);
      in.labels = in.input_ids.clone();
      const ForwardOutput whole = model->forward(in);
      model->stage = {0, 1};
      const ForwardOutput first = model->forward(in);
      QVERIFY(!first.logits.defined() && !first.loss.defined());
      QCOMPARE(first.hidden_states.sizes(), (c10::IntArrayRef{2, 4, 16}));
      model->stage = {1, -1};
      expect_error([&] { model->forward(in); }, ErrorKind::InvalidInput,
                   {"stage_input", "[2, 4, 16]"});
      in.stage_input = first.hidden_states;
      const ForwardOutput second = model->forward(in);
      QVERIFY(torch::allclose(second.logits, whole.logits, 1e-6, 1e-6));
      QVERIFY(torch::allclose(second.loss, whole.loss, 1e-6, 1e-6));
      model->stage = {1, 4};
      expect_error([&] { model->forward(in); }, ErrorKind::InvalidInput, {"[1, 4)", "3 layers"});
    }
    auto bert = make(bert_config("BertForSequenceClassification"));
    bert->stage = {0, 1};
    expect_error(
        [&] {
          bert->forward(batch({{1, 2}}, 2));
        },
        ErrorKind::Unsupported, {"pipeline stages"});
  }

  void badInputsAreNamed() {
    auto model = make(llama_config());
    torch::NoGradGuard no_grad;
    ForwardInput in = batch({{1, 2, 3}}, 3);
    in.input_ids[0][1] = 50;
    expect_error([&] { model->forward(in); }, ErrorKind::InvalidInput, {"input_ids", "50"});
    in = batch({{1, 2, 3}}, 3);
    in.attention_mask = torch::ones({1, 4}, torch::kInt64);
    expect_error([&] { model->forward(in); }, ErrorKind::InvalidInput, {"attention_mask"});
    in = batch({{1, 2, 3}}, 3);
    in.labels = torch::full({1, 3}, 77, torch::kInt64);
    expect_error([&] { model->forward(in); }, ErrorKind::InvalidInput, {"labels"});
  }

  // What the planner and LoRA read from a family's registry entry agrees with the modules its
  // builder makes: the parameter count, one layer's linears (name, shape, bias, layout), the
  // default LoRA targets and the base-model prefix of the weight names.
  void registryEntriesDescribeTheirModules() {
    for (const tessera::hf::FamilyTraits& family : tessera::hf::model_families()) {
      const std::string what = family.model_type + ": ";
      const json doc = small_config(family.model_type);
      QVERIFY2(!doc.is_null(), (what + "add a small config to small_config()").c_str());
      const auto config = tessera::hf::parse_model_config(doc, "config.json");
      QVERIFY(&tessera::hf::family_of(config) == &family);
      auto model = create_model(config, head_from_config(config));

      const tessera::hf::ParameterShapes shapes = family.parameter_shapes(config);
      double layer = shapes.layer_other;
      for (const auto& l : shapes.layer_linears)
        layer += l.in_features * l.out_features + (l.bias ? l.out_features : 0.0);
      std::int64_t numel = 0;
      for (const auto& p : model->parameters()) numel += p.numel();
      QCOMPARE(static_cast<double>(numel),
               shapes.outside_layers + static_cast<double>(config.num_hidden_layers) * layer);

      std::multiset<std::string> built, listed;
      for (const auto& item : model->named_modules("", /*include_self=*/false)) {
        auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value());
        if (!linear || item.key().find(".0.") == std::string::npos) continue;  // layer 0 only
        const std::string leaf = item.key().substr(item.key().rfind('.') + 1);
        built.insert(leaf + " " + std::to_string(linear->in_features) + "x" +
                     std::to_string(linear->out_features) + (linear->bias.defined() ? " b" : ""));
        QVERIFY2((linear->layout == LinearImpl::Layout::InOut) == family.conv1d_weights,
                 (what + item.key()).c_str());
      }
      for (const auto& l : shapes.layer_linears)
        listed.insert(l.name + " " + std::to_string(static_cast<std::int64_t>(l.in_features)) +
                      "x" + std::to_string(static_cast<std::int64_t>(l.out_features)) +
                      (l.bias ? " b" : ""));
      QVERIFY2(built == listed, (what + "layer_linears differ from the built layer").c_str());
      for (const auto& target : family.default_lora_targets)
        QVERIFY2(std::any_of(shapes.layer_linears.begin(), shapes.layer_linears.end(),
                             [&](const auto& l) { return l.name == target; }),
                 (what + target).c_str());
      if (model->head() != TaskHead::Base)
        for (const auto& name : parameter_names(*model))
          if (name.rfind(family.base_prefix + ".", 0) != 0)
            QVERIFY2(name.rfind("lm_head.", 0) == 0 || name.rfind("classifier.", 0) == 0,
                     (what + name).c_str());
      // GGUF (engine/export/gguf.cpp): every weight of a causal LM has a name llama.cpp reads,
      // and no two weights share one.
      if (family.gguf && model->head() == TaskHead::CausalLM) {
        std::set<std::string> gguf_names;
        for (const auto& name : parameter_names(*model)) {
          const auto gguf = tessera::hf::gguf_tensor(*family.gguf, name);
          QVERIFY2(gguf.has_value(), (what + name + " has no GGUF name").c_str());
          QVERIFY2(gguf_names.insert(gguf->name).second, (what + gguf->name + " twice").c_str());
        }
      }
    }
  }

  // Causal attention over an unpadded batch passes no mask (is_causal, grouped heads not
  // repeated, so a GPU may pick its flash or memory-efficient kernel) and computes what the dense
  // boolean mask computes, values and gradients; any padding, a KV cache or a sliding window
  // shorter than the keys keeps the dense mask.
  void causalAttentionWithoutMaskEqualsTheDenseMask() {
    torch::manual_seed(3);
    const std::int64_t b = 2, h = 4, kv = 2, t = 7, d = 8;
    torch::Tensor q = torch::randn({b, h, t, d}, torch::requires_grad());
    torch::Tensor k = torch::randn({b, kv, t, d}, torch::requires_grad());
    torch::Tensor v = torch::randn({b, kv, t, d}, torch::requires_grad());
    torch::Tensor keys = torch::ones({b, t}, torch::kInt64);
    torch::Tensor none = tessera::model::causal_attention_mask(keys, t);
    QVERIFY(!none.defined());
    torch::Tensor dense = tessera::model::build_causal_mask(keys, t);
    torch::Tensor fast = tessera::model::attention(q, k, v, none, 0.0, false);
    torch::Tensor slow = tessera::model::attention(q, k, v, dense, 0.0, false);
    QVERIFY(torch::allclose(fast, slow, 1e-6, 1e-6));
    auto grads = [&](const torch::Tensor& out) {
      return torch::autograd::grad({(out * out).sum()}, {q, k, v});
    };
    auto fast_grads = grads(fast);
    auto slow_grads = grads(slow);
    for (std::size_t i = 0; i < fast_grads.size(); ++i)
      QVERIFY(torch::allclose(fast_grads[i], slow_grads[i], 1e-5, 1e-6));

    torch::Tensor padded = keys.clone();
    padded[1][0] = 0;
    QVERIFY(tessera::model::causal_attention_mask(padded, t).defined());
    QVERIFY(tessera::model::causal_attention_mask(keys, t - 2).defined());  // a cache before
    QVERIFY(tessera::model::causal_attention_mask(keys, t, t - 1).defined());
    QVERIFY(!tessera::model::causal_attention_mask(keys, t, t).defined());
  }

  // Layout-free dropout (model/dropout.h): a row's masks depend on the seed, the step, the row's
  // global index and the site, not on which micro-batch or rank computes it.
  void dropoutMasksFollowTheRowNotTheLayout() {
    const double p = 0.25;
    const torch::Tensor x = torch::ones({4, 6, 32});
    auto masks = [&](std::int64_t step, std::int64_t first_row, const torch::Tensor& rows) {
      DropoutScope scope({7, step, first_row, 0});
      torch::Tensor a = tessera::model::dropout(rows, p, true);
      torch::Tensor b = tessera::model::dropout(rows, p, true);  // the next site
      return std::pair{a, b};
    };
    const auto [whole_a, whole_b] = masks(3, 0, x);
    const auto [front_a, front_b] = masks(3, 0, x.narrow(0, 0, 2));
    const auto [back_a, back_b] = masks(3, 2, x.narrow(0, 2, 2));
    QVERIFY(torch::equal(whole_a, torch::cat({front_a, back_a})));
    QVERIFY(torch::equal(whole_b, torch::cat({front_b, back_b})));
    // Sites, steps and rows draw other masks.
    QVERIFY(!torch::equal(whole_a, whole_b));
    QVERIFY(!torch::equal(whole_a, masks(4, 0, x).first));
    QVERIFY(!torch::equal(whole_a[0], whole_a[1]));
    // Kept values are scaled by 1 / (1 - p); about p of them are zero.
    const torch::Tensor kept = whole_a.ne(0);
    QVERIFY(torch::allclose(whole_a.masked_select(kept), torch::full({1}, 1.0 / (1.0 - p))));
    const double dropped = 1.0 - kept.to(torch::kFloat64).mean().item<double>();
    QVERIFY2(std::abs(dropped - p) < 0.05, std::to_string(dropped).c_str());
    // The gradient goes through the same mask.
    torch::Tensor w = torch::ones({2, 6, 32}, torch::requires_grad());
    {
      DropoutScope scope({7, 3, 0, 0});
      tessera::model::dropout(w, p, true).sum().backward();
    }
    QVERIFY(torch::equal(w.grad(), front_a));
    // Not training, or p = 0: the input itself. Outside a scope: torch's dropout, still p.
    QVERIFY(tessera::model::dropout(x, p, false).is_same(x));
    {
      DropoutScope scope({7, 3, 0, 0});
      QVERIFY(tessera::model::dropout(x, 0.0, true).is_same(x));
      QVERIFY(tessera::model::layout_free_dropout_active(p, true));
      QVERIFY(!tessera::model::layout_free_dropout_active(p, false));
    }
    QVERIFY(!tessera::model::layout_free_dropout_active(p, true));
    // Attention probabilities: a rank holding block b of the heads draws those heads' masks.
    const torch::Tensor probabilities = torch::ones({2, 4, 3, 5});
    auto heads = [&](std::int64_t block, const torch::Tensor& t) {
      DropoutScope scope({7, 3, 0, 0, block});
      return tessera::model::dropout_heads(t, p, true);
    };
    const torch::Tensor all_heads = heads(0, probabilities);
    QVERIFY(torch::equal(all_heads, torch::cat({heads(0, probabilities.narrow(1, 0, 2)),
                                                heads(1, probabilities.narrow(1, 2, 2))},
                                               1)));
    QVERIFY(!torch::equal(all_heads[0][0], all_heads[0][1]));
    const torch::Tensor outside = tessera::model::dropout(x, p, true);
    QVERIFY(std::abs(outside.eq(0).to(torch::kFloat64).mean().item<double>() - p) < 0.05);
  }

  // With layout-free dropout attention computes its probabilities itself: with (almost) nothing
  // dropped it equals scaled_dot_product_attention's result for the causal case (no mask),
  // grouped heads, a padded key and a query left with no key at all (zeros, as SDPA gives); and
  // its masks follow the row.
  void attentionWithDropoutComputesWhatSdpaDoes() {
    torch::manual_seed(5);
    const std::int64_t b = 2, h = 4, kv = 2, t = 6, d = 8;
    const torch::Tensor q = torch::randn({b, h, t, d});
    const torch::Tensor k = torch::randn({b, kv, t, d});
    const torch::Tensor v = torch::randn({b, kv, t, d});
    torch::Tensor keys = torch::ones({b, t}, torch::kInt64);
    keys[1][0] = 0;  // left padding: row 1's first query has no key
    const torch::Tensor padded = build_causal_mask(keys, t);
    for (const torch::Tensor& mask : {torch::Tensor(), padded}) {
      const torch::Tensor sdpa = attention(q, k, v, mask, 1e-12, false);
      DropoutScope scope({1, 0, 0, 0});
      const torch::Tensor explicit_path = attention(q, k, v, mask, 1e-12, true);
      QVERIFY2(torch::allclose(explicit_path, sdpa, 1e-5, 1e-6),
               std::to_string((explicit_path - sdpa).abs().max().item<double>()).c_str());
    }
    const torch::Tensor none = torch::Tensor();
    auto dropped = [&](std::int64_t first_row, std::int64_t begin, std::int64_t rows) {
      DropoutScope scope({1, 2, first_row, 0});
      return attention(q.narrow(0, begin, rows), k.narrow(0, begin, rows), v.narrow(0, begin, rows),
                       none, 0.5, true);
    };
    const torch::Tensor whole = dropped(0, 0, 2);
    QVERIFY(torch::equal(whole, torch::cat({dropped(0, 0, 1), dropped(1, 1, 1)})));
    QVERIFY(!torch::allclose(whole, attention(q, k, v, none, 0.0, false)));
  }

  void causalLossIgnoresMaskedLabels() {
    auto model = make(llama_config());
    torch::NoGradGuard no_grad;
    ForwardInput in = batch({{1, 2, 3, 4}}, 4);
    in.labels = in.input_ids.clone();
    auto full = model->forward(in);
    // Loss by hand: position t predicts token t+1.
    auto logp = torch::log_softmax(full.logits[0].narrow(0, 0, 3), -1);
    double expected = 0;
    for (int t = 0; t < 3; ++t)
      expected -= logp[t][in.input_ids[0][t + 1].item<std::int64_t>()].item<double>();
    QVERIFY(std::abs(full.loss.item<double>() - expected / 3) < 1e-5);
    in.labels[0][3] = -100;  // the last target no longer counts
    auto partial = model->forward(in);
    double expected2 = -(logp[0][2].item<double>() + logp[1][3].item<double>()) / 2;
    QVERIFY(std::abs(partial.loss.item<double>() - expected2) < 1e-5);
  }

  // Training's loss through the head a block of rows at a time (model/head_loss.h) equals the
  // loss of whole logits, and so do its gradients: of the hidden states, and of a head's weight
  // and bias where they train (full fine-tuning), frozen (LoRA) or not; blocks of 8 rows over 37
  // (the last one short), ignored targets, and a loss gradient other than 1 (accumulation).
  void headLossEqualsTheWholeLogitsLoss() {
    torch::manual_seed(5);
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const bool bf16 = dtype == torch::kBFloat16;
      for (const bool trains : {true, false}) {
        const HeadCase c = head_case(dtype);
        auto grads = [&](bool blocks) {
          return head_gradients(
              c, trains,
              [&](const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b) {
                return blocks ? head_cross_entropy(h, w, b, c.targets, 8)
                              : torch::nn::functional::cross_entropy(
                                    torch::linear(h, w, b).to(torch::kFloat32), c.targets,
                                    torch::nn::functional::CrossEntropyFuncOptions().ignore_index(
                                        -100));
              },
              [](const torch::Tensor& loss) { return loss * 0.375; });
        };
        const auto ours = grads(true), whole = grads(false);
        QCOMPARE(ours[0].scalar_type(), torch::kFloat32);
        const double tolerance = bf16 ? 1e-3 : 1e-6;
        QVERIFY2(std::abs(ours[0].item<double>() / whole[0].item<double>() - 1.0) < tolerance,
                 qPrintable(
                     QString("%1 vs %2").arg(ours[0].item<double>()).arg(whole[0].item<double>())));
        // bf16: the blocks' weight gradients are rounded once a block, not once.
        compare_head_gradients(ours, whole, trains, bf16 ? 2e-2 : 1e-5, bf16 ? 2e-3 : 1e-7,
                               bf16 ? "bf16" : "fp32");
        if (QTest::currentTestFailed()) return;
      }
    }
    // Nothing to predict: NaN, as the whole-logits mean gives (0 / 0).
    const torch::Tensor none = torch::full({4}, -100, torch::kInt64);
    QVERIFY(std::isnan(head_cross_entropy(torch::randn({4, 16}), torch::randn({50, 16}), {}, none)
                           .item<double>()));
  }

  // Preference tuning's per-token log-probabilities through the head in blocks: the values and
  // gradients of the whole logits' gather − logsumexp, under a gradient that differs per row
  // (as DPO's weights its rows), with the head frozen (gradient kept from forward) and
  // training (blocks recomputed in backward); ignored targets give 0 and no gradient.
  void headLogProbsEqualTheWholeLogitsOnes() {
    torch::manual_seed(6);
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const bool bf16 = dtype == torch::kBFloat16;
      for (const bool trains : {true, false}) {
        const HeadCase c = head_case(dtype);
        const torch::Tensor counted = c.targets.ne(-100);
        const torch::Tensor row_grad = torch::randn({37});
        auto grads = [&](bool blocks) {
          return head_gradients(
              c, trains,
              [&](const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b) {
                if (blocks) return head_target_log_probs(h, w, b, c.targets, 8);
                const torch::Tensor logits = torch::linear(h, w, b).to(torch::kFloat32);
                return (logits.gather(1, c.targets.clamp_min(0).unsqueeze(1)).squeeze(1) -
                        logits.logsumexp(1)) *
                       counted.to(torch::kFloat32);
              },
              [&](const torch::Tensor& log_probs) { return (log_probs * row_grad).sum(); });
        };
        const auto ours = grads(true), whole = grads(false);
        QCOMPARE(ours[0].scalar_type(), torch::kFloat32);
        QVERIFY(torch::equal(ours[0].masked_select(counted.logical_not()), torch::zeros({8})));
        QVERIFY(torch::allclose(ours[0], whole[0], bf16 ? 1e-3 : 1e-6, 1e-6));
        compare_head_gradients(ours, whole, trains, bf16 ? 2e-2 : 1e-5, bf16 ? 2e-2 : 1e-6,
                               bf16 ? "bf16" : "fp32");
        if (QTest::currentTestFailed()) return;
        // An ignored row's hidden state gets no gradient.
        QVERIFY(torch::equal(ours[1].index({torch::arange(0, 37, 5)}),
                             torch::zeros({8, 16}, torch::TensorOptions().dtype(dtype))));
      }
    }
  }

  // A frozen head read a block of the vocabulary at a time (left in its checkpoint file) gives
  // each row's −log p(target) and whole logits as the whole weight does, with the hidden states'
  // gradients, reading each block once (never more rows at once than a block), fp32 and bf16.
  void headReadByVocabularyBlocksEqualsTheWholeWeight() {
    torch::manual_seed(7);
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const bool bf16 = dtype == torch::kBFloat16;
      const HeadCase c = head_case(dtype);
      const torch::Tensor counted = c.targets.ne(-100);
      std::vector<std::pair<std::int64_t, std::int64_t>> reads;
      const HeadRowReader read = [&](std::int64_t first, std::int64_t count) {
        reads.emplace_back(first, count);
        return c.weight.narrow(0, first, count).clone();
      };
      const torch::Tensor row_grad = torch::randn({37});
      auto losses = [&](bool blocks) {
        const torch::Tensor h = c.hidden.clone().requires_grad_(true);
        torch::Tensor value;
        if (blocks) {
          value = stored_head_target_losses(h, read, 50, c.targets, 7);
        } else {
          const torch::Tensor logits = torch::linear(h, c.weight).to(torch::kFloat32);
          value = (logits.logsumexp(1) -
                   logits.gather(1, c.targets.clamp_min(0).unsqueeze(1)).squeeze(1)) *
                  counted.to(torch::kFloat32);
        }
        (value * row_grad).sum().backward();
        return std::pair{value.detach(), h.grad()};
      };
      reads.clear();
      const auto [ours, ours_grad] = losses(true);
      QCOMPARE(reads.size(), std::size_t{8});  // ⌈50 / 7⌉, each once, in order
      for (std::size_t i = 0; i < reads.size(); ++i)
        QCOMPARE(reads[i], (std::pair<std::int64_t, std::int64_t>{7 * static_cast<std::int64_t>(i),
                                                                  i < 7 ? 7 : 1}));
      const auto [whole, whole_grad] = losses(false);
      QCOMPARE(ours.scalar_type(), torch::kFloat32);
      QVERIFY(torch::equal(ours.masked_select(counted.logical_not()), torch::zeros({8})));
      QVERIFY(torch::allclose(ours, whole, bf16 ? 1e-3 : 1e-6, 1e-6));
      QCOMPARE(ours_grad.scalar_type(), dtype);
      // (Gradients of order 1-8 summed in another order: fp32 rounding differs by ~2e-6.)
      QVERIFY(torch::allclose(ours_grad.to(torch::kFloat32), whole_grad.to(torch::kFloat32),
                              bf16 ? 2e-2 : 1e-5, bf16 ? 2e-2 : 1e-5));
      QVERIFY(torch::equal(ours_grad.index({torch::arange(0, 37, 5)}),
                           torch::zeros({8, 16}, torch::TensorOptions().dtype(dtype))));

      // The logits [2, ..., V] and the hidden states' gradient through them.
      const torch::Tensor logit_grad = torch::randn({37, 50}).to(dtype).view({1, 37, 50});
      auto logits = [&](bool blocks) {
        const torch::Tensor h = c.hidden.clone().view({1, 37, 16}).requires_grad_(true);
        const torch::Tensor value =
            blocks ? stored_head_logits(h, read, 50, 7) : torch::linear(h, c.weight);
        (value.to(torch::kFloat32) * logit_grad.to(torch::kFloat32)).sum().backward();
        return std::pair{value.detach(), h.grad()};
      };
      const auto [ours_logits, ours_logits_grad] = logits(true);
      const auto [whole_logits, whole_logits_grad] = logits(false);
      QCOMPARE(ours_logits.sizes().vec(), (std::vector<std::int64_t>{1, 37, 50}));
      QVERIFY(torch::allclose(ours_logits.to(torch::kFloat32), whole_logits.to(torch::kFloat32),
                              bf16 ? 1e-2 : 1e-6, 1e-6));
      // bf16: within a rounding of the largest (sums of 50 products up to ~20: an ulp is 0.125).
      const double largest = whole_logits_grad.abs().max().item<double>();
      QVERIFY(torch::allclose(ours_logits_grad.to(torch::kFloat32),
                              whole_logits_grad.to(torch::kFloat32), bf16 ? 1e-2 : 1e-5,
                              bf16 ? 1e-2 * largest : 1e-5));
    }
  }

  // A model asked for label_log_probs gives them, with no logits and no loss where its head
  // allows blocks (llama's untied head, gpt2's tied one), equal in value and in every
  // parameter's gradient to the same figures from its whole logits.
  void modelLabelLogProbsEqualThoseOfItsLogits() {
    for (const json& config : {llama_config(), gpt2_config()}) {
      auto model = make(config);
      ForwardInput in = batch({{1, 2, 3, 4, 5}, {6, 7, 8}}, 5);
      in.labels = in.input_ids.clone();
      in.labels[0][1] = -100;
      in.labels[1][3] = -100;
      in.labels[1][4] = -100;
      const torch::Tensor row_grad = torch::randn({2, 4});
      auto run = [&](bool blocks) {
        model->zero_grad();
        ForwardInput asked = in;
        torch::Tensor log_probs;
        if (blocks) {
          asked.label_log_probs = true;
          ForwardOutput out = model->forward(asked);
          if (out.logits.defined() || out.loss.defined())
            throw std::runtime_error("logits or a loss computed beside the log-probabilities");
          log_probs = out.label_log_probs;
        } else {
          asked.labels = torch::Tensor();
          const torch::Tensor logits = model->forward(asked).logits.narrow(1, 0, 4);
          const torch::Tensor targets = in.labels.narrow(1, 1, 4);
          log_probs = (logits.gather(2, targets.clamp_min(0).unsqueeze(2)).squeeze(2) -
                       logits.logsumexp(2)) *
                      targets.ne(-100).to(torch::kFloat32);
        }
        (log_probs * row_grad).sum().backward();
        std::vector<torch::Tensor> result{log_probs.detach()};
        for (const auto& p : model->parameters()) result.push_back(p.grad().clone());
        return result;
      };
      const auto blocks = run(true), whole = run(false);
      QVERIFY(blocks[0].sizes() == torch::IntArrayRef({2, 4}));
      QCOMPARE(blocks[0][1][3].item<float>(), 0.0f);
      QCOMPARE(blocks.size(), whole.size());
      for (std::size_t i = 0; i < blocks.size(); ++i)
        QVERIFY2(torch::allclose(blocks[i], whole[i], 1e-5, 1e-7),
                 qPrintable(QString::fromStdString(config["model_type"].get<std::string>()) +
                            " tensor " + QString::number(i)));
    }
  }

  // A model asked for no logits (training's forward) gives the same loss and parameter
  // gradients as with them, untied head (llama) and tied (gpt2), and no logits.
  void modelLossWithoutLogitsEqualsTheLossOfLogits() {
    for (const json& config : {llama_config(), gpt2_config()}) {
      auto model = make(config);
      ForwardInput in = batch({{1, 2, 3, 4, 5}, {6, 7, 8}}, 5);
      in.labels = in.input_ids.clone();
      in.labels[1][3] = -100;
      in.labels[1][4] = -100;
      auto run = [&](bool logits) {
        model->zero_grad();
        in.logits = logits;
        ForwardOutput out = model->forward(in);
        if (out.logits.defined() != logits)
          throw std::runtime_error("logits given or not as asked");
        out.loss.backward();
        std::vector<torch::Tensor> result{out.loss.detach()};
        for (const auto& p : model->parameters()) result.push_back(p.grad().clone());
        return result;
      };
      const auto with = run(true), without = run(false);
      QCOMPARE(with.size(), without.size());
      for (std::size_t i = 0; i < with.size(); ++i)
        QVERIFY2(torch::allclose(with[i], without[i], 1e-5, 1e-7),
                 qPrintable(QString::fromStdString(config["model_type"].get<std::string>()) +
                            " tensor " + QString::number(i)));
    }
  }

  // QLoRA's base: a Linear on a quantized weight computes, in forward and backward, what the same
  // layer on the dequantized weight computes, though it dequantizes a tile of rows at a time in
  // forward and a band of columns at a time in backward (tiles of about 2^16 values here, so
  // many; with 4000 inputs its rows are not whole 4-bit blocks, and backward takes row tiles
  // instead of bands).
  void quantizedLinearComputesWithItsDequantizedWeight() {
    torch::manual_seed(3);
    for (const std::int64_t in : {std::int64_t{4000}, std::int64_t{4096}})
      for (QuantizedFormat format :
           {QuantizedFormat::NF4, QuantizedFormat::FP4, QuantizedFormat::Int8}) {
        const std::int64_t out = 300;
        Linear layer(in, out, /*bias=*/true, torch::TensorOptions().dtype(torch::kFloat32));
        torch::Tensor dense = torch::randn({out, in}) * 0.02;
        auto quantized = std::make_shared<QuantizedWeight>(dense, format);
        QCOMPARE(quantized->tile_rows(), out);  // one tile: fewer values than a tile holds
        // Tiles of about 2^16 values: many, the last as long as the others or shorter.
        quantized->set_tile_elements(std::int64_t{1} << 16);
        layer->quantized = quantized;
        const QuantizedWeight& q = *layer->quantized;
        QVERIFY(q.tile_rows() < out);
        QVERIFY((q.tile_rows() * in) % q.blocksize() == 0 || format == QuantizedFormat::Int8);
        const torch::Tensor whole = q.dequantize();
        QVERIFY(torch::equal(q.dequantize_rows(q.tile_rows() - 2, out),
                             whole.narrow(0, q.tile_rows() - 2, out - q.tile_rows() + 2)));
        // In a compute dtype: the float32 values cast.
        QVERIFY(
            torch::equal(q.dequantize_rows(0, out, torch::kBFloat16), whole.to(torch::kBFloat16)));
        QVERIFY(torch::equal(q.dequantize_rows(0, out, torch::kHalf), whole.to(torch::kHalf)));
        // Into a buffer reused from tile to tile (larger than the block, holding old values):
        // the same values; a buffer too small is refused.
        const torch::Tensor buffer = torch::full({out * in * 2 + 10}, 0x5A, torch::kUInt8);
        QVERIFY(
            torch::equal(q.dequantize_rows(q.tile_rows(), out, torch::kBFloat16, buffer),
                         whole.narrow(0, q.tile_rows(), out - q.tile_rows()).to(torch::kBFloat16)));
        QVERIFY(torch::equal(q.dequantize_rows(0, out, torch::kBFloat16, buffer),
                             whole.to(torch::kBFloat16)));
        QVERIFY_THROWS_EXCEPTION(
            tessera::Error, q.dequantize_rows(0, out, torch::kFloat32, buffer.narrow(0, 0, 64)));
        QCOMPARE(q.column_bands(), format == QuantizedFormat::Int8 || in % 64 == 0);
        if (q.column_bands()) {
          const std::int64_t band = q.band_columns();
          QVERIFY(band < in && (format == QuantizedFormat::Int8 || band % 64 == 0));
          QVERIFY(torch::equal(q.dequantize_columns(band, in, torch::kBFloat16),
                               whole.narrow(1, band, in - band).to(torch::kBFloat16)));
        }
        // Close to the weight it came from: within half the widest gap between codes (0.30 of
        // the block's absmax for NF4 and FP4's 0.33; 1/254 of the row's for int8, which
        // bitsandbytes quantizes from the weight rounded to float16: 2^-11 relative more).
        const double bound = format == QuantizedFormat::Int8 ? 0.5 / 127 + 1.0 / 2048 : 0.17;
        QVERIFY(((whole - dense).abs() / dense.abs().max()).max().item<double>() <= bound);
        {
          torch::NoGradGuard no_grad;
          layer->bias.uniform_(-0.1, 0.1);
        }
        torch::Tensor x = torch::randn({2, 5, in}).requires_grad_(true);
        torch::Tensor y = layer->forward(x);
        torch::Tensor x_ref = x.detach().clone().requires_grad_(true);
        torch::Tensor bias_ref = layer->bias.detach().clone().requires_grad_(true);
        torch::Tensor y_ref = torch::linear(x_ref, whole, bias_ref);
        QVERIFY(torch::allclose(y, y_ref, 1e-5, 1e-6));
        torch::Tensor gy = torch::randn_like(y);
        y.backward(gy);
        y_ref.backward(gy);
        QVERIFY(torch::allclose(x.grad(), x_ref.grad(), 1e-5, 1e-6));
        QVERIFY(torch::allclose(layer->bias.grad(), bias_ref.grad(), 1e-5, 1e-6));
        const std::uint64_t expected_bytes =
            format == QuantizedFormat::Int8
                ? static_cast<std::uint64_t>(out * in + out * 4)
                : static_cast<std::uint64_t>(out * in / 2 + (out * in + 63) / 64 * 4);
        QCOMPARE(q.bytes(), expected_bytes);
      }
  }

  // Double quantization (QLoRA's): the 4-bit absmax held as 8-bit codes in blocks of 256. Any
  // range of rows dequantizes as the whole weight does (tiles start inside a block of 256),
  // the values stay within the codes' precision of the plain 4-bit ones, and the storage is a
  // byte per block plus a float32 per 256 blocks and the 256-value code.
  void doubleQuantizedWeightDequantizesByRanges() {
    torch::manual_seed(4);
    const std::int64_t out = 300, in = 4000;
    const torch::Tensor dense = torch::randn({out, in}) * 0.02;
    const QuantizedWeight plain(dense, QuantizedFormat::NF4);
    const QuantizedWeight nested(dense, QuantizedFormat::NF4, 64, /*double_quant=*/true);
    QVERIFY(nested.nested().has_value() && !nested.scales().defined());
    QVERIFY(torch::equal(nested.codes(), plain.codes()));
    const torch::Tensor whole = nested.dequantize();
    for (const std::int64_t first : {std::int64_t{0}, nested.tile_rows() - 2, std::int64_t{38}})
      QVERIFY(
          torch::equal(nested.dequantize_rows(first, out), whole.narrow(0, first, out - first)));
    // An absmax restored from 8 bits is within 1/64 of its block's largest deviation from the
    // mean (the dynamic map's step near 1 is 1/71): the values move by that share at most.
    const double moved =
        ((whole - plain.dequantize()).abs().max() / plain.dequantize().abs().max()).item<double>();
    QVERIFY2(moved > 0 && moved < 1.0 / 64, std::to_string(moved).c_str());
    const std::int64_t blocks = out * in / 64;
    QCOMPARE(nested.bytes(), static_cast<std::uint64_t>(out * in / 2 + blocks +
                                                        (blocks + 255) / 256 * 4 + 256 * 4));
  }

  // QLoRA on a GPU: the storage there, a tile dequantizes as torch ops (a table of each packed
  // byte's two codes, times the block's absmax, cast), which must give the CPU loops' bits:
  // 4-bit with plain and double-quantized absmax, int8; float32, bf16 and fp16; the whole weight,
  // a tile of rows starting inside it (and, 4000 inputs, inside a row), a band of columns, and a
  // last block shorter than the others.
  // The CUDA kernel (cuda/dequantize.cu) is held to the same bits on a GPU by tests/gpu; here its
  // per-value code, run on the host from the block the kernel is given (by_the_kernels_values).
  void quantizedWeightDequantizesTheSameOnEveryPath() {
    torch::manual_seed(6);
    for (const std::int64_t in : {std::int64_t{4000}, std::int64_t{4096}, std::int64_t{100}})
      for (const QuantizedFormat format :
           {QuantizedFormat::NF4, QuantizedFormat::FP4, QuantizedFormat::Int8})
        for (const bool nested : {false, true}) {
          if (nested && format == QuantizedFormat::Int8) continue;
          const std::int64_t out = in == 100 ? 33 : 300;  // 3300 values: a last block of 36
          const torch::Tensor dense = torch::randn({out, in}) * 0.02;
          QuantizedWeight q(dense, format, 64, nested);
          q.set_tile_elements(std::int64_t{1} << 16);
          const std::int64_t tile = std::min(q.tile_rows(), out - 1);
          for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
            const std::string where = "in " + std::to_string(in) + ", format " +
                                      std::to_string(static_cast<int>(format)) + ", nested " +
                                      std::to_string(nested) + ", " +
                                      std::string(c10::toString(dtype));
            QVERIFY2(torch::equal(q.dequantize_block_with_ops(0, out, 0, in, dtype),
                                  q.dequantize_rows(0, out, dtype)),
                     where.c_str());
            QVERIFY2(torch::equal(q.dequantize_block_with_ops(tile, out, 0, in, dtype),
                                  q.dequantize_rows(tile, out, dtype)),
                     where.c_str());
            QVERIFY2(torch::equal(by_the_kernels_values(q, tile, out, 0, in, dtype),
                                  q.dequantize_rows(tile, out, dtype)),
                     where.c_str());
            if (q.column_bands()) {
              const std::int64_t band = q.band_columns() < in ? q.band_columns() : in / 2;
              for (const auto& [first, end] : {std::pair{std::int64_t{0}, band}, {band, in}}) {
                QVERIFY2(torch::equal(q.dequantize_block_with_ops(0, out, first, end, dtype),
                                      q.dequantize_columns(first, end, dtype)),
                         where.c_str());
                QVERIFY2(torch::equal(by_the_kernels_values(q, 0, out, first, end, dtype),
                                      q.dequantize_columns(first, end, dtype)),
                         where.c_str());
              }
            }
          }
        }
  }

  // A quantized weight moved to another device computes there by torch ops, forward and
  // backward: the meta device stands in for a GPU (the CPU's loops would read the storage, which
  // a meta tensor has none of). (Module::to refuses meta, so LinearImpl::to, which moves it with
  // the model, runs in the GPU check.)
  void quantizedLinearComputesOnTheDeviceOfItsStorage() {
    Linear layer(128, 64, /*bias=*/false, torch::TensorOptions().dtype(torch::kFloat32));
    for (const bool nested : {false, true})
      for (const QuantizedFormat format : {QuantizedFormat::NF4, QuantizedFormat::Int8}) {
        if (nested && format == QuantizedFormat::Int8) continue;
        layer->quantized =
            std::make_shared<QuantizedWeight>(torch::randn({64, 128}), format, 64, nested);
        layer->quantized->set_tile_elements(64 * 32);  // two tiles, two bands
        layer->quantized->to(torch::kMeta);
        QVERIFY(layer->quantized->device().is_meta());
        if (nested) QVERIFY(layer->quantized->nested()->scales.is_meta());
        const torch::Tensor x =
            torch::empty({2, 3, 128},
                         torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16))
                .requires_grad_(true);
        const torch::Tensor y = layer->forward(x);
        QVERIFY(y.is_meta() && y.scalar_type() == torch::kBFloat16 &&
                y.sizes() == torch::IntArrayRef({2, 3, 64}));
        y.sum().backward();
        QVERIFY(x.grad().is_meta() && x.grad().sizes() == x.sizes());
        // An input on another device than the weight is an internal error, not a crash.
        QVERIFY_THROWS_EXCEPTION(tessera::Error, layer->forward(torch::randn({2, 128})));
      }
  }

  // A weight quantized from its rows a band at a time (as QLoRA reads a checkpoint) is the whole
  // weight's quantization: the same 4-bit codes and absmax as quantize_four_bit over the whole
  // flattened weight (a row length that is not a multiple of the block, so bands start inside
  // rows' blocks only where the block allows), the same int8 rows, and no band holds more
  // than 2^20 values (4 MiB of float32).
  void weightReadByBandsIsTheWholeWeightsQuantization() {
    torch::manual_seed(5);
    const std::int64_t out = 1500, in = 1000;  // 1.5M values: two bands at least
    const torch::Tensor dense = torch::randn({out, in}) * 0.02;
    const auto values = std::span<const float>(dense.data_ptr<float>(), dense.numel());
    for (const QuantizedFormat format :
         {QuantizedFormat::NF4, QuantizedFormat::FP4, QuantizedFormat::Int8}) {
      std::vector<std::int64_t> bands;
      std::int64_t next_row = 0;
      const QuantizedWeight banded(
          out, in,
          [&](std::int64_t first_row, const torch::Tensor& rows) {
            QCOMPARE(first_row, next_row);  // in order, each row once
            next_row += rows.size(0);
            bands.push_back(rows.size(0));
            rows.copy_(dense.narrow(0, first_row, rows.size(0)));
          },
          format);
      QVERIFY(bands.size() >= 2);
      std::int64_t rows_read = 0;
      for (const std::int64_t rows : bands) {
        QVERIFY(rows * in <= (std::int64_t{1} << 20));
        rows_read += rows;
      }
      QCOMPARE(rows_read, out);
      if (format == QuantizedFormat::Int8) {
        const torch::Tensor halved = dense.to(torch::kHalf).to(torch::kFloat32);
        std::vector<std::int8_t> q(static_cast<std::size_t>(out * in));
        std::vector<float> scale(static_cast<std::size_t>(out));
        tessera::quant::quantize_int8_rows(
            std::span<const float>(halved.data_ptr<float>(), halved.numel()), out, in, q, scale);
        QVERIFY(std::memcmp(banded.codes().data_ptr(), q.data(), q.size()) == 0);
        QVERIFY(std::memcmp(banded.scales().data_ptr(), scale.data(), scale.size() * 4) == 0);
        continue;
      }
      std::vector<std::uint8_t> packed(tessera::quant::four_bit_packed_bytes(values.size()));
      std::vector<float> absmax(tessera::quant::four_bit_blocks(values.size(), 64));
      tessera::quant::quantize_four_bit(values,
                                        format == QuantizedFormat::NF4
                                            ? tessera::quant::FourBitType::NF4
                                            : tessera::quant::FourBitType::FP4,
                                        64, packed, absmax);
      QVERIFY(std::memcmp(banded.codes().data_ptr(), packed.data(), packed.size()) == 0);
      QVERIFY(std::memcmp(banded.scales().data_ptr(), absmax.data(), absmax.size() * 4) == 0);
    }
  }

  // quantize_linears quantizes every Linear but the head, empties their dense parameters, and the
  // model then computes what a dense model with the dequantized weights computes.
  void quantizedModelEqualsItsDequantizedCopy() {
    json config = llama_config();
    config["hidden_size"] = 64;
    config["intermediate_size"] = 128;
    config["num_hidden_layers"] = 2;
    auto model = make(config);
    auto dense = make(config);
    const std::vector<std::string> names =
        quantize_linears(*model, nullptr, QuantizeOptions{QuantizedFormat::NF4});
    QCOMPARE(names.size(), std::size_t{2 * 7});
    QVERIFY(quantized_weight_names(*model).count("model.layers.1.mlp.down_proj.weight") == 1);
    QVERIFY(quantized_weight_names(*model).count("lm_head.weight") == 0);
    std::uint64_t parameter_bytes = 0;
    for (const auto& p : model->named_parameters()) {
      const bool quantized = quantized_weight_names(*model).count(p.key()) == 1;
      QCOMPARE(p.value().numel() == 0, quantized);
      parameter_bytes += static_cast<std::uint64_t>(p.value().nbytes());
    }
    // Codes (half a byte a value) and a float32 absmax per 64 values.
    const std::uint64_t values = 2 * (4 * 64 * 64 + 3 * 64 * 128) - 2 * 2 * 64 * 32;
    QCOMPARE(quantized_weight_bytes(*model), values / 2 + values / 64 * 4);
    torch::NoGradGuard no_grad;
    auto dense_parameters = dense->named_parameters();
    for (const auto& [name, weight] : quantized_weights(*model))
      dense_parameters[name].copy_(weight->dequantize());
    std::map<std::string, std::vector<std::int64_t>> dense_shapes;
    for (const auto& [name, shape] : dense_parameter_shapes(*model)) dense_shapes[name] = shape;
    QCOMPARE(dense_shapes.size(), dense_parameters.size());
    for (const auto& p : dense_parameters)
      QVERIFY(dense_shapes.at(p.key()) == p.value().sizes().vec());
    ForwardInput in = batch({{1, 2, 3, 4, 5}, {6, 7, 8}}, 5);
    const torch::Tensor ours = model->forward(in).logits;
    QVERIFY(torch::allclose(ours, dense->forward(in).logits, 1e-5, 1e-6));
    dequantize_linears(*model);
    QVERIFY(quantized_weight_names(*model).empty());
    QVERIFY(torch::equal(model->forward(in).logits, dense->forward(in).logits));
  }
};

QTEST_APPLESS_MAIN(TestModel)
#include "test_model.moc"
