// config.json → typed ModelConfig: every family maps, and every fault names file and field.
#include <QtTest>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "hf/config.h"
#include "hf/families.h"

using nlohmann::json;
using tessera::Error;
using tessera::ErrorKind;
using namespace tessera::hf;

namespace {

json llama_base() {
  return json{
      {"model_type", "llama"},    {"vocab_size", 100},      {"hidden_size", 64},
      {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
      {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-5},   {"max_position_embeddings", 256}};
}

// Runs `parse` expecting a tessera::Error whose message contains every needle.
template <typename F>
void expect_error(F&& parse, ErrorKind kind, std::initializer_list<const char*> needles) {
  try {
    parse();
    QFAIL("expected an error");
  } catch (const Error& e) {
    QCOMPARE(static_cast<int>(e.kind()), static_cast<int>(kind));
    std::string text = std::string(e.what()) + " " + e.hint();
    for (const char* n : needles)
      QVERIFY2(text.find(n) != std::string::npos, (text + " lacks: " + n).c_str());
  }
}

}  // namespace

class TestConfig : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void llamaDefaultsAndGqa() {
    auto c = parse_model_config(llama_base(), "cfg.json");
    QCOMPARE(c.family, ModelFamily::Llama);
    QCOMPARE(c.head_dim, 16);
    QCOMPARE(c.num_key_value_heads, 2);
    QCOMPARE(c.norm_eps, 1e-5);
    QCOMPARE(c.rope_theta, 10000.0);
    QCOMPARE(QString::fromStdString(c.rope_scaling.rope_type), QString("default"));
    QVERIFY(!c.tie_word_embeddings);
  }

  void ropeFromTransformers5Parameters() {
    auto doc = llama_base();
    doc["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                              {"factor", 8.0},           {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
    auto c = parse_model_config(doc, "cfg.json");
    QCOMPARE(c.rope_theta, 500000.0);
    QCOMPARE(QString::fromStdString(c.rope_scaling.rope_type), QString("llama3"));
    QCOMPARE(c.rope_scaling.factor, 8.0);
    QCOMPARE(c.rope_scaling.original_max_position_embeddings, 64);
  }

  void ropeFromLegacyScaling() {
    auto doc = llama_base();
    doc["rope_theta"] = 1e6;
    doc["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    auto c = parse_model_config(doc, "cfg.json");
    QCOMPARE(c.rope_theta, 1e6);
    QCOMPARE(QString::fromStdString(c.rope_scaling.rope_type), QString("linear"));
    QCOMPARE(c.rope_scaling.factor, 2.0);
  }

  void unknownRopeTypeIsUnsupported() {
    auto doc = llama_base();
    doc["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::Unsupported,
                 {"cfg.json", "yarn", "linear"});
  }

  void qwen2AlwaysHasQkvBias() {
    auto doc = llama_base();
    doc["model_type"] = "qwen2";
    doc["sliding_window"] = 4096;  // ignored unless use_sliding_window
    auto c = parse_model_config(doc, "cfg.json");
    QCOMPARE(c.family, ModelFamily::Qwen2);
    QVERIFY(c.attention_bias);
    QVERIFY(!c.attention_output_bias);  // qwen2's o_proj has none
    QVERIFY(!c.sliding_window.has_value());
    // llama's attention_bias covers o_proj too.
    doc["model_type"] = "llama";
    doc["attention_bias"] = true;
    QVERIFY(parse_model_config(doc, "cfg.json").attention_output_bias);
  }

  void gpt2NamesAreMapped() {
    json doc{{"model_type", "gpt2"}, {"vocab_size", 50},  {"n_embd", 32},      {"n_layer", 3},
             {"n_head", 4},          {"n_positions", 64}, {"n_inner", nullptr}};
    auto c = parse_model_config(doc, "cfg.json");
    QCOMPARE(c.hidden_size, 32);
    QCOMPARE(c.num_hidden_layers, 3);
    QCOMPARE(c.intermediate_size, 128);
    QCOMPARE(c.max_position_embeddings, 64);
    QVERIFY(c.tie_word_embeddings);
    QCOMPARE(QString::fromStdString(c.hidden_act), QString("gelu_new"));
  }

  void bertLabels() {
    json doc{{"model_type", "bert"},
             {"vocab_size", 50},
             {"hidden_size", 32},
             {"intermediate_size", 64},
             {"num_hidden_layers", 2},
             {"num_attention_heads", 4},
             {"id2label", {{"0", "neg"}, {"1", "neu"}, {"2", "pos"}}}};
    auto c = parse_model_config(doc, "cfg.json");
    QCOMPARE(c.num_labels, 3);
    QCOMPARE(QString::fromStdString(c.id2label.at(2)), QString("pos"));
    QCOMPARE(c.norm_eps, 1e-12);
    QCOMPARE(c.type_vocab_size, 2);
  }

  void unsupportedModelTypeListsSupported() {
    auto doc = llama_base();
    doc["model_type"] = "t5";
    expect_error([&] { parse_model_config(doc, "/m/config.json"); }, ErrorKind::Unsupported,
                 {"/m/config.json", "t5", "llama", "gpt2", "bert", "qwen2", "mistral"});
  }

  void missingFieldIsNamed() {
    auto doc = llama_base();
    doc.erase("hidden_size");
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::InvalidInput,
                 {"cfg.json", "hidden_size", "missing"});
  }

  void wrongTypeIsNamed() {
    auto doc = llama_base();
    doc["num_hidden_layers"] = "two";
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::InvalidInput,
                 {"num_hidden_layers", "integer", "string"});
    doc = llama_base();
    doc["num_key_value_heads"] = 3;
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::InvalidInput,
                 {"num_key_value_heads", "divide"});
    doc = llama_base();
    doc["vocab_size"] = -5;
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::InvalidInput,
                 {"vocab_size", "at least"});
  }

  // Heads that do not split the hidden size name the file, the field, both values and what to
  // write instead, not the head_dim the user never wrote.
  void headsNotDividingHiddenAreNamed() {
    auto doc = llama_base();
    doc["hidden_size"] = 96;
    doc["num_attention_heads"] = 7;
    doc["num_key_value_heads"] = 7;
    expect_error([&] { parse_model_config(doc, "/m/config.json"); }, ErrorKind::InvalidInput,
                 {"/m/config.json: num_attention_heads 7 does not divide hidden_size 96",
                  "the nearest: 6 or 8", "head_dim"});
    // Dividing, but leaving each head an odd number of dimensions to rotate.
    doc["num_attention_heads"] = 32;
    doc["num_key_value_heads"] = 32;
    expect_error(
        [&] { parse_model_config(doc, "/m/config.json"); }, ErrorKind::InvalidInput,
        {"/m/config.json: num_attention_heads 32", "96 / 32 = 3", "the nearest: 24 or 48"});
    // An odd head_dim as written.
    doc = llama_base();
    doc["head_dim"] = 13;
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::InvalidInput,
                 {"cfg.json: head_dim 13 is odd", "even"});
    // An even one as written needs no division (transformers' q_proj is heads × head_dim).
    doc["head_dim"] = 10;
    doc["num_attention_heads"] = 6;
    doc["num_key_value_heads"] = 3;
    QCOMPARE(parse_model_config(doc, "cfg.json").head_dim, 10);
    // gpt2 and bert under their own names.
    json gpt2{
        {"model_type", "gpt2"}, {"vocab_size", 50}, {"n_embd", 32}, {"n_layer", 1}, {"n_head", 5}};
    expect_error([&] { parse_model_config(gpt2, "g.json"); }, ErrorKind::InvalidInput,
                 {"g.json: n_head 5 does not divide n_embd 32", "the nearest: 4 or 8"});
  }

  // Sizes beyond 64 bits, as JSON may write them, are refused by name instead of wrapping.
  void hugeIntegersAreNamed() {
    auto doc = llama_base();
    doc["vocab_size"] = 1e30;
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::InvalidInput,
                 {"cfg.json", "vocab_size", "64-bit"});
    doc = json::parse(R"({"model_type": "llama", "vocab_size": 18446744073709551615})");
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::InvalidInput,
                 {"vocab_size", "18446744073709551615", "64-bit"});
    doc = llama_base();
    doc["num_hidden_layers"] = 2.5;
    expect_error([&] { parse_model_config(doc, "cfg.json"); }, ErrorKind::InvalidInput,
                 {"num_hidden_layers", "integer", "2.5"});
    doc = llama_base();
    doc["num_hidden_layers"] = 1e9;  // large but whole: read as written (its size is judged later)
    QCOMPARE(parse_model_config(doc, "cfg.json").num_hidden_layers, 1000000000);
  }

  // Fields the model's modules read are checked with the rest, naming the file and the value.
  void moduleFieldsAreCheckedWithTheFile() {
    auto doc = llama_base();
    doc["attention_dropout"] = 1.5;
    expect_error([&] { parse_model_config(doc, "/m/config.json"); }, ErrorKind::InvalidInput,
                 {"/m/config.json: attention_dropout 1.5", "[0, 1)"});
    doc = llama_base();
    doc["model_type"] = "qwen2";
    doc["use_sliding_window"] = true;
    doc["sliding_window"] = 64;
    doc["layer_types"] = {"full_attention"};
    expect_error([&] { parse_model_config(doc, "/m/config.json"); }, ErrorKind::InvalidInput,
                 {"/m/config.json", "layer_types", "num_hidden_layers 2", "1 entries"});
    doc["layer_types"] = {"full_attention", "chunked_attention"};
    expect_error([&] { parse_model_config(doc, "/m/config.json"); }, ErrorKind::InvalidInput,
                 {"/m/config.json", "layer_types", "[1] is \"chunked_attention\""});
    doc["layer_types"] = {"full_attention", "sliding_attention"};
    const ModelConfig qwen2 = parse_model_config(doc, "/m/config.json");
    QVERIFY(qwen2.sliding_window.has_value());
    // The builders read the parsed fields: which layers slide, and the dropout probabilities.
    QCOMPARE(qwen2.sliding_layers, (std::vector<bool>{false, true}));
    doc.erase("layer_types");
    doc["max_window_layers"] = 1;
    QCOMPARE(parse_model_config(doc, "/m/config.json").sliding_layers,
             (std::vector<bool>{false, true}));
    doc = llama_base();
    doc["attention_dropout"] = 0.25;
    QCOMPARE(parse_model_config(doc, "/m/config.json").dropout.at("attention_dropout"), 0.25);
    QVERIFY(parse_model_config(llama_base(), "/m/config.json").sliding_layers.empty());
  }

  // The families' tensor-parallel plans (hf/families.h): module names matched by their last
  // components with "*" for a layer index, gpt2's fused q/k/v in three parts, and the sizes a
  // split must divide named with the sizes that would.
  void tensorParallelPlansMatchModulesAndRefuseSizes() {
    const ModelConfig llama = parse_model_config(llama_base(), "config.json");
    const FamilyTraits& decoder = family_of(llama);
    const TensorSplitRule* q = tensor_split_of(decoder, "model.layers.3.self_attn.q_proj");
    QVERIFY(q != nullptr && q->split == TensorSplit::Column && q->parts == 1);
    QVERIFY(tensor_split_of(decoder, "model.layers.3.self_attn.o_proj")->split == TensorSplit::Row);
    QVERIFY(tensor_split_of(decoder, "model.embed_tokens")->split == TensorSplit::Vocabulary);
    QVERIFY(tensor_split_of(decoder, "lm_head")->split == TensorSplit::Vocabulary);
    QVERIFY(tensor_split_of(decoder, "model.layers.x.self_attn.q_proj") == nullptr);
    QVERIFY(tensor_split_of(decoder, "model.layers.3.input_layernorm") == nullptr);
    QVERIFY(tensor_split_of(decoder, "model.layers.3.self_attn") == nullptr);
    const FamilyTraits* gpt2 = find_family("gpt2");
    QVERIFY(gpt2 != nullptr);
    const TensorSplitRule* c_attn = tensor_split_of(*gpt2, "transformer.h.0.attn.c_attn");
    QVERIFY(c_attn != nullptr && c_attn->parts == 3);
    QVERIFY(tensor_split_of(*gpt2, "transformer.wpe") == nullptr);
    QVERIFY(find_family("bert")->tensor_parallel_plan.empty());

    check_tensor_parallel(llama, 2);  // 4 heads, 2 kv heads, 128, 100
    check_tensor_parallel(llama, 4);  // each kv head held by 2 of the 4 ranks
    QVERIFY(tensor_split_of(decoder, "model.layers.0.self_attn.k_proj")->kv_heads);
    QVERIFY(!q->kv_heads);
    expect_error([&] { check_tensor_parallel(llama, 8); }, ErrorKind::InvalidInput,
                 {"num_attention_heads (4) does not split into 8 equal parts",
                  "divide every split size of this model: 1, 2, 4"});
    json three_kv = llama_base();
    three_kv["num_attention_heads"] = 12;
    three_kv["num_key_value_heads"] = 3;
    three_kv["hidden_size"] = 96;
    expect_error([&] { check_tensor_parallel(parse_model_config(three_kv, "c.json"), 2); },
                 ErrorKind::InvalidInput,
                 {"num_key_value_heads (3) does not split into 2 equal parts (nor divides 2)"});
    json odd_vocab = llama_base();
    odd_vocab["vocab_size"] = 101;
    expect_error([&] { check_tensor_parallel(parse_model_config(odd_vocab, "c.json"), 2); },
                 ErrorKind::InvalidInput, {"vocab_size (101)", "divide every split size", ": 1"});
    json bert = {
        {"model_type", "bert"},         {"vocab_size", 100},      {"hidden_size", 64},
        {"intermediate_size", 128},     {"num_hidden_layers", 2}, {"num_attention_heads", 4},
        {"max_position_embeddings", 64}};
    expect_error([&] { check_tensor_parallel(parse_model_config(bert, "c.json"), 2); },
                 ErrorKind::Unsupported,
                 {"not supported yet for bert models", "llama, mistral, qwen2 or gpt2"});
  }

  void malformedFileNamesFile() {
    std::filesystem::create_directories(TESSERA_TEST_TMP_DIR);
    auto path = std::filesystem::path(TESSERA_TEST_TMP_DIR) / "bad_config.json";
    std::ofstream(path) << "{\"model_type\": \"llama\", ";
    expect_error([&] { load_model_config(path); }, ErrorKind::InvalidInput,
                 {"bad_config.json", "not valid JSON"});
    expect_error([&] { load_model_config(path.parent_path() / "absent.json"); }, ErrorKind::Io,
                 {"absent.json"});
  }

  // A folder a run writes beside its model (a LoRA adapter, a checkpoint) given as a model: said
  // what it is and where the run's model is, as bad input (exit 2), not an I/O error.
  void folderWithoutConfigSaysWhatItIs() {
    namespace fs = std::filesystem;
    const fs::path run = fs::path(TESSERA_TEST_TMP_DIR) / "run-without-config";
    fs::remove_all(run);
    fs::create_directories(run / "model");
    fs::create_directories(run / "adapter");
    fs::create_directories(run / "checkpoint-4");
    fs::create_directories(run / "empty");
    std::ofstream(run / "model" / "config.json") << "{}";
    std::ofstream(run / "adapter" / "adapter_config.json") << "{}";
    std::ofstream(run / "checkpoint-4" / "adapter_config.json") << "{}";
    std::ofstream(run / "checkpoint-4" / "trainer_state.json") << "{}";
    const std::string model = (run / "model").string();
    const std::string resume = "--resume " + run.string();
    expect_error([&] { load_model_config(run / "adapter" / "config.json"); },
                 ErrorKind::InvalidInput, {"a LoRA adapter", model.c_str()});
    expect_error([&] { load_model_config(run / "checkpoint-4" / "config.json"); },
                 ErrorKind::InvalidInput, {"a training checkpoint", resume.c_str()});
    expect_error([&] { load_model_config(run / "empty" / "config.json"); }, ErrorKind::InvalidInput,
                 {"no config.json in this folder"});
    expect_error([&] { load_model_config(run / "absent" / "config.json"); },
                 ErrorKind::InvalidInput, {"no such model folder"});
  }
};

QTEST_APPLESS_MAIN(TestConfig)
#include "test_config.moc"
