// The job spec contract: defaults that work, every invalid or unknown field named, and a
// saved spec that reads back to the same choices.
#include <QtTest>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/files.h"
#include "job/events.h"
#include "job/job_spec.h"
#include "job/strategies.h"

using nlohmann::json;
using namespace tessera;

namespace {

json minimal() {
  return json{{"version", 1},
              {"model", {{"path", "/models/tiny"}}},
              {"dataset", {{"train", {"data.jsonl"}}}},
              {"output", {{"dir", "runs/a"}}}};
}

std::string error_text(const json& doc) {
  try {
    job::parse_job_spec(doc, "job.json");
  } catch (const Error& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "";
}

}  // namespace

class TestJobSpec : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void minimalSpecGetsWorkingDefaults() {
    auto spec = job::parse_job_spec(minimal(), "job.json");
    QCOMPARE(QString::fromStdString(spec.method.type), QString("full"));
    QCOMPARE(QString::fromStdString(spec.strategy.name), QString("auto"));
    QCOMPARE(QString::fromStdString(spec.precision), QString("fp32"));
    QVERIFY(spec.training.epochs.has_value());
    QCOMPARE(*spec.training.epochs, 1.0);
    QCOMPARE(QString::fromStdString(spec.dataset.format), QString("auto"));
  }

  void roundTripKeepsEveryChoice() {
    auto doc = minimal();
    doc["method"] = {{"type", "lora"},        {"rank", 4},         {"alpha", 8},
                     {"targets", {"q_proj"}}, {"quantize", "nf4"}, {"double_quant", true}};
    doc["training"] = {{"steps", 20}, {"learning_rate", 1e-3}, {"schedule", "cosine"}};
    doc["precision"] = "bf16";
    auto spec = job::parse_job_spec(doc, "job.json");
    auto again = job::parse_job_spec(job::to_json(spec), "again.json");
    QCOMPARE(job::to_json(again), job::to_json(spec));
    QCOMPARE(*again.training.steps, 20);
    QCOMPARE(again.method.lora_rank, 4);
    QCOMPARE(QString::fromStdString(again.method.quantize), QString("nf4"));
    QVERIFY(again.method.double_quant);
    QCOMPARE(QString::fromStdString(again.precision), QString("bf16"));
  }

  // Preference tuning: the objective's own fields round-trip; a field of another objective, an
  // unknown objective and an unknown field are named.
  void preferenceRoundTripsAndNamesItsFields() {
    auto doc = minimal();
    doc["method"] = {
        {"type", "lora"},
        {"preference",
         {{"loss", "simpo"}, {"beta", 2.0}, {"simpo_gamma", 0.6}, {"sft_weight", 0.5}}}};
    auto spec = job::parse_job_spec(doc, "job.json");
    QVERIFY(spec.method.preference.has_value());
    QCOMPARE(spec.method.preference->simpo_gamma, 0.6);
    auto again = job::parse_job_spec(job::to_json(spec), "again.json");
    QCOMPARE(job::to_json(again), job::to_json(spec));
    QCOMPARE(again.method.preference->sft_weight, 0.5);
    doc["method"]["preference"] = {{"loss", "dpo"}, {"simpo_gamma", 0.6}};
    auto text = error_text(doc);
    QVERIFY2(text.find("method.preference.simpo_gamma applies to simpo, and "
                       "method.preference.loss is \"dpo\"") != std::string::npos,
             text.c_str());
    doc["method"]["preference"] = {{"loss", "rlhf"}};
    QVERIFY(error_text(doc).find("method.preference.loss is \"rlhf\"; expected one of: dpo, ipo, "
                                 "simpo, orpo, kto") != std::string::npos);
    // KTO pairs each prompt with another example's completion: a batch of one has none.
    doc["method"]["preference"] = {{"loss", "kto"}, {"desirable_weight", 1.5}};
    doc["training"] = {{"batch_size", 1}};
    QVERIFY(error_text(doc).find("training.batch_size is 1, and kto estimates its KL term") !=
            std::string::npos);
    doc["training"] = {{"batch_size", 2}};
    QCOMPARE(job::parse_job_spec(doc, "job.json").method.preference->desirable_weight, 1.5);
    doc["method"]["preference"] = {{"loss", "dpo"}, {"desirable_weight", 1.5}};
    QVERIFY(error_text(doc).find("method.preference.desirable_weight applies to kto") !=
            std::string::npos);
    doc["method"]["preference"] = {{"loss", "dpo"}, {"bta", 0.1}};
    QVERIFY(error_text(doc).find("did you mean \"method.preference.beta\"") != std::string::npos);
    doc["method"]["preference"] = {{"loss", "dpo"}, {"label_smoothing", 0.5}};
    QVERIFY(error_text(doc).find("method.preference.label_smoothing must be between") !=
            std::string::npos);
  }

  void unknownFieldIsNamedWithSuggestion() {
    auto doc = minimal();
    doc["training"] = {{"lerning_rate", 0.1}};
    auto text = error_text(doc);
    QVERIFY2(text.find("job.json: training.lerning_rate is not a known field") != std::string::npos,
             text.c_str());
    QVERIFY2(text.find("did you mean \"training.learning_rate\"") != std::string::npos,
             text.c_str());
    doc = minimal();
    doc["colour"] = "red";
    QVERIFY(error_text(doc).find("colour is not a known field") != std::string::npos);
  }

  void invalidValuesAreNamed() {
    auto doc = minimal();
    doc["method"] = {{"type", "qlora"}};
    QVERIFY(error_text(doc).find("method.type is \"qlora\"; expected one of: full, lora") !=
            std::string::npos);
    doc = minimal();
    doc["method"] = {{"type", "lora"}, {"quantize", "q4"}};
    QVERIFY(
        error_text(doc).find("method.quantize is \"q4\"; expected one of: none, nf4, fp4, int8") !=
        std::string::npos);
    doc["method"] = {{"type", "full"}, {"quantize", "nf4"}};
    QVERIFY(error_text(doc).find("method.quantize \"nf4\" quantizes the frozen base of LoRA") !=
            std::string::npos);
    doc["method"] = {{"type", "lora"}, {"quantize", "int8"}, {"double_quant", true}};
    QVERIFY(error_text(doc).find("method.double_quant double-quantizes the absmax of a 4-bit "
                                 "base, and method.quantize is \"int8\"") != std::string::npos);
    doc = minimal();
    doc["training"] = {{"batch_size", 0}};
    QVERIFY(error_text(doc).find("training.batch_size must be at least 1") != std::string::npos);
    doc = minimal();
    doc["training"] = {{"steps", 5}, {"epochs", 1}};
    QVERIFY(error_text(doc).find("both set") != std::string::npos);
    doc = minimal();
    doc["version"] = 2;
    QVERIFY(error_text(doc).find("version is 2") != std::string::npos);
    doc = minimal();
    doc.erase("output");
    QVERIFY(error_text(doc).find("output is missing") != std::string::npos);
    doc = minimal();
    doc["dataset"]["train"] = json::array();
    QVERIFY(error_text(doc).find("dataset.train must name at least one file") != std::string::npos);
    doc = minimal();
    doc["dataset"]["config"] = "en";  // a config belongs to a Hub dataset
    QVERIFY2(error_text(doc).find("dataset.config") != std::string::npos &&
                 error_text(doc).find("hub_id") != std::string::npos,
             error_text(doc).c_str());
  }

  // LoRA's settings beside method full: auto's fallback, kept when the spec is saved; any other
  // strategy would drop them without a word, so it refuses them.
  void loraSettingsBesideFullAreAutosFallbackOnly() {
    auto doc = minimal();
    doc["method"] = {{"type", "full"}, {"rank", 32}, {"dropout", 0.1}};
    const job::JobSpec spec = job::parse_job_spec(doc, "job.json");
    QVERIFY(spec.method.lora_fallback_given);
    const job::JobSpec again = job::parse_job_spec(job::to_json(spec), "again");
    QCOMPARE(again.method.lora_rank, std::int64_t{32});
    QCOMPARE(again.method.lora_dropout, 0.1);
    doc["strategy"] = {{"name", "single"}};
    const std::string error = error_text(doc);
    QVERIFY2(error.find("job.json: method.rank is LoRA's setting, and method.type is \"full\" "
                        "under strategy \"single\"") != std::string::npos &&
                 error.find("remove method.rank") != std::string::npos,
             error.c_str());
    doc["method"] = {{"type", "full"}};
    QVERIFY(!job::parse_job_spec(doc, "job.json").method.lora_fallback_given);
    QVERIFY(!job::to_json(job::parse_job_spec(doc, "job.json"))["method"].contains("rank"));
  }

  // A held-out split beside validation files: one of the two would be ignored.
  void validationFilesAndSplitAreNotBothGiven() {
    auto doc = minimal();
    doc["dataset"]["validation"] = {"valid.jsonl"};
    doc["dataset"]["validation_split"] = 0.1;
    const std::string error = error_text(doc);
    QVERIFY2(error.find("dataset.validation_split holds out training rows") != std::string::npos,
             error.c_str());
    doc["dataset"]["validation_split"] = 0.0;
    QCOMPARE(error_text(doc), std::string());
  }

  void hubDatasetConfigRoundTrips() {
    auto doc = minimal();
    doc["dataset"] = {{"hub_id", "org/data"}, {"revision", "v1"}, {"config", "en"}};
    const auto spec = job::parse_job_spec(doc, "job.json");
    QCOMPARE(QString::fromStdString(spec.dataset.config), QString("en"));
    const json saved = job::to_json(spec);
    QCOMPARE(saved["dataset"]["config"], json("en"));
    QCOMPARE(job::parse_job_spec(saved, "again.json").dataset.config, std::string("en"));
    doc["dataset"].erase("config");  // no config: the dataset's default, and none written
    QVERIFY(!job::to_json(job::parse_job_spec(doc, "job.json"))["dataset"].contains("config"));
  }

  void strategyTableListsSingle() {
    QVERIFY(job::find_strategy("single") != nullptr);
    QVERIFY(job::find_strategy("auto") == nullptr);      // the planner's, not a plugin
    QVERIFY(job::find_strategy("megatron") == nullptr);  // not in this build
    QCOMPARE(QString::fromStdString(job::auto_strategy().name), QString("single"));
    QCOMPARE(QString::fromStdString(job::strategy_names()),
             QString("single, gemini, ddp, zero, hybrid"));
    QVERIFY(!job::find_strategy("single")->description.empty());
  }

  void unknownStrategyIsRefusedListingPlugins() {
    auto doc = minimal();
    doc["strategy"] = {{"name", "megatron"}};
    auto text = error_text(doc);
    QVERIFY2(text.find("job.json: strategy.name is \"megatron\"") != std::string::npos,
             text.c_str());
    QVERIFY2(
        text.find("expected one of: auto, single, gemini, ddp, zero, hybrid") != std::string::npos,
        text.c_str());
    QVERIFY2(text.find("available plugins: single, gemini, ddp, zero, hybrid") != std::string::npos,
             text.c_str());
  }

  void strategyOptionsAreValidated() {
    auto doc = minimal();
    doc["strategy"] = {{"name", "single"}, {"options", {{"device", "cpu"}}}};
    auto spec = job::parse_job_spec(doc, "job.json");
    QCOMPARE(QString::fromStdString(spec.strategy.options["device"].get<std::string>()),
             QString("cpu"));
    QCOMPARE(QString::fromStdString(
                 job::strategy_option(spec.strategy.name, spec.strategy.options, "device")),
             QString("cpu"));
    QCOMPARE(QString::fromStdString(job::strategy_option("single", json::object(), "device")),
             QString("auto"));
    // Unknown keys are refused, naming the key; auto takes the options of what it resolves to.
    for (const char* name : {"single", "auto"}) {
      doc["strategy"] = {{"name", name}, {"options", {{"stage", 3}}}};
      auto text = error_text(doc);
      QVERIFY2(text.find("job.json: strategy.options.stage is not an option of strategy") !=
                   std::string::npos,
               text.c_str());
      QVERIFY2(text.find("single takes: device (auto | cpu | cuda)") != std::string::npos,
               text.c_str());
    }
    doc["strategy"] = {{"name", "single"}, {"options", {{"device", "gpu"}}}};
    auto text = error_text(doc);
    QVERIFY2(text.find("strategy.options.device is \"gpu\"; expected one of: auto, cpu, cuda") !=
                 std::string::npos,
             text.c_str());
    doc["strategy"] = {{"name", "single"}, {"options", {{"device", 0}}}};
    QVERIFY(error_text(doc).find("strategy.options.device is 0") != std::string::npos);
    doc["strategy"] = {{"name", "single"}, {"options", "cpu"}};
    QVERIFY(error_text(doc).find("strategy.options must be an object") != std::string::npos);
    // The options survive a save and load.
    doc["strategy"] = {{"name", "auto"}, {"options", {{"device", "cuda"}}}};
    auto again = job::parse_job_spec(job::to_json(job::parse_job_spec(doc, "a.json")), "b.json");
    QCOMPARE(again.strategy.options, json({{"device", "cuda"}}));
  }

  void geminiOptionsAreValidated() {
    auto doc = minimal();
    doc["strategy"] = {{"name", "gemini"},
                       {"options",
                        {{"placement", "static"},
                         {"offload_optim_frac", 0.5},
                         {"offload_param_frac", 0.25},
                         {"offload_dir", "/tmp/offload"},
                         {"chunk_size", "64MiB"}}}};
    auto spec = job::parse_job_spec(doc, "job.json");
    QCOMPARE(spec.strategy.options["offload_optim_frac"].get<double>(), 0.5);
    QCOMPARE(spec.strategy.options["offload_param_frac"].get<double>(), 0.25);
    const std::vector<std::pair<json, std::string>> refused = {
        {{{"offload_optim_frac", 1.5}},
         "strategy.options.offload_optim_frac is 1.5; expected a number from 0 to 1"},
        {{{"offload_optim_frac", "half"}}, "strategy.options.offload_optim_frac is \"half\""},
        {{{"offload_param_frac", -0.25}},
         "strategy.options.offload_param_frac is -0.25; expected a number from 0 to 1"},
        {{{"placement", "dynamic"}},
         "strategy.options.placement is \"dynamic\"; expected one of: static, auto"},
        {{{"device", "gpu"}},
         "strategy.options.device is \"gpu\"; expected one of: auto, cpu, cuda"},
        {{{"host_param_frac", 2}}, "strategy.options.host_param_frac is 2; expected a number"},
        {{{"device_budget", "much"}}, "strategy.options.device_budget: \"much\" is not a size"},
        {{{"chunk_size", "lots"}}, "strategy.options.chunk_size: \"lots\" is not a size"},
        {{{"chunk_size", -5}}, "strategy.options.chunk_size is -5"},
        {{{"offload_dir", ""}}, "strategy.options.offload_dir is \"\"; expected a folder path"},
        // Together: shares of the same bytes past all of them (the run placed 50% and 50%
        // for these), a share that placement auto decides, device-tier options on the CPU.
        {{{"host_optim_frac", 0.8}, {"offload_optim_frac", 0.5}},
         "strategy.options.host_optim_frac and offload_optim_frac add up to 130% of the "
         "optimizer-state bytes"},
        {{{"host_param_frac", 0.6}, {"offload_param_frac", 0.6}},
         "host_param_frac and offload_param_frac add up to 120% of the parameter bytes"},
        {{{"placement", "auto"}, {"offload_param_frac", 0.5}},
         "strategy.options.offload_param_frac: placement \"auto\" decides"},
        {{{"device", "cpu"}, {"host_param_frac", 0.5}},
         "strategy.options.host_param_frac: with device \"cpu\" there is no device tier"},
        {{{"device", "cpu"}, {"device_budget", "1GiB"}},
         "strategy.options.device_budget: with device \"cpu\" there is no device tier"},
    };
    for (const auto& [options, needle] : refused) {
      doc["strategy"] = {{"name", "gemini"}, {"options", options}};
      const auto text = error_text(doc);
      QVERIFY2(text.find(needle) != std::string::npos, (needle + " not in: " + text).c_str());
    }
    // Shares that add up to all of the bytes, and device-tier options with a device, are kept.
    doc["strategy"] = {{"name", "gemini"},
                       {"options",
                        {{"device", "cuda"},
                         {"host_optim_frac", 0.5},
                         {"offload_optim_frac", 0.5},
                         {"device_budget", "1GiB"}}}};
    QCOMPARE(job::parse_job_spec(doc, "job.json").strategy.options["host_optim_frac"].get<double>(),
             0.5);
  }

  void autoDeviceIsTheGpuWhereTheStrategyCanUseIt() {
    const json none = json::object();
    // Written devices are kept; auto without a GPU is the CPU, saying nothing.
    QCOMPARE(job::device_for("ddp", "cpu", 2, 2, 4).device, std::string("cpu"));
    QCOMPARE(job::device_for("zero", "cuda", 2, 2, 0).device, std::string("cuda"));
    const auto no_gpu = job::device_for("ddp", "auto", 2, 2, 0);
    QCOMPARE(no_gpu.device, std::string("cpu"));
    QVERIFY(no_gpu.why_not_gpu.empty());
    // ddp and zero: a GPU for each rank of this machine, or the CPU saying why.
    QCOMPARE(job::device_for("ddp", "auto", 2, 2, 2).device, std::string("cuda"));
    // Ranks on several machines: the CPU, so that a node without a GPU agrees with the others.
    const auto nodes = job::device_for("ddp", "auto", 4, 2, 2);
    QCOMPARE(nodes.device, std::string("cpu"));
    QVERIFY(nodes.why_not_gpu.find("several machines") != std::string::npos);
    const auto few = job::device_for("zero", "auto", 4, 4, 2);
    QCOMPARE(few.device, std::string("cpu"));
    QVERIFY2(few.why_not_gpu.find("4 ranks on this machine but 2 GPU(s)") != std::string::npos,
             few.why_not_gpu.c_str());
    // gemini: one process, or sharded over several as ddp (whatever its options: shards on disk,
    // placement auto).
    QCOMPARE(job::device_for("gemini", "auto", 1, 1, 1).device, std::string("cuda"));
    QCOMPARE(job::device_for("gemini", "auto", 2, 2, 2).device, std::string("cuda"));
    QCOMPARE(job::device_for("gemini", "auto", 2, 2, 1).device, std::string("cpu"));
    QCOMPARE(job::device_for("single", "auto", 1, 1, 1).device, std::string("cuda"));
    // hybrid as ddp: its tensor and data groups on NCCL, a GPU for each rank of this machine.
    QCOMPARE(job::device_for("hybrid", "auto", 2, 2, 2).device, std::string("cuda"));
    QCOMPARE(job::device_for("hybrid", "auto", 4, 4, 2).device, std::string("cpu"));
    QCOMPARE(job::device_for("hybrid", "auto", 4, 2, 2).device, std::string("cpu"));
  }

  void zeroOptionsAreValidated() {
    // stage and offload_optimizer are a number and a boolean, as the issue writes them.
    auto doc = minimal();
    doc["strategy"] = {
        {"name", "zero"},
        {"options", {{"stage", 2}, {"offload_optimizer", true}, {"bucket_size", "4MiB"}}}};
    auto spec = job::parse_job_spec(doc, "job.json");
    QCOMPARE(spec.strategy.options["stage"].get<int>(), 2);
    QCOMPARE(job::strategy_option("zero", spec.strategy.options, "stage"), std::string("2"));
    // ZeRO-Offload on a GPU: the job layer takes device cuda (the plugin needs a GPU).
    doc["strategy"]["options"]["device"] = "cuda";
    QCOMPARE(job::parse_job_spec(doc, "job.json").strategy.options["device"], json("cuda"));
    QCOMPARE(job::strategy_option("zero", json::object(), "stage"), std::string("1"));
    QCOMPARE(job::strategy_option("zero", json::object(), "offload_optimizer"),
             std::string("false"));
    const std::vector<std::pair<json, std::string>> refused = {
        {{{"stage", 3}}, "strategy.options.stage is 3; expected one of: 1, 2"},
        {{{"stage", "2"}}, "strategy.options.stage is \"2\"; expected one of: 1, 2"},
        {{{"stage", 1.5}}, "strategy.options.stage is 1.5"},
        {{{"offload_optimizer", "yes"}},
         "strategy.options.offload_optimizer is \"yes\"; expected one of: false, true"},
        {{{"bucket_size", "lots"}}, "strategy.options.bucket_size: \"lots\" is not a size"},
        {{{"device", "gpu"}},
         "strategy.options.device is \"gpu\"; expected one of: auto, cpu, cuda"},
        {{{"chunk_size", "64MiB"}}, "strategy.options.chunk_size is not an option of strategy"},
    };
    for (const auto& [options, needle] : refused) {
      doc["strategy"] = {{"name", "zero"}, {"options", options}};
      const auto text = error_text(doc);
      QVERIFY2(text.find(needle) != std::string::npos, (needle + " not in: " + text).c_str());
    }
  }

  void brokenFileReportsLine() {
    std::filesystem::create_directories(TESSERA_TEST_TMP_DIR);
    auto path = std::filesystem::path(TESSERA_TEST_TMP_DIR) / "broken_job.json";
    std::ofstream(path) << "{\n  \"version\": 1,\n  \"model\": {,\n}\n";
    try {
      job::load_job_spec(path);
      QFAIL("expected an error");
    } catch (const Error& e) {
      QVERIFY2(std::string(e.what()).find("broken_job.json:3: not valid JSON") != std::string::npos,
               e.what());
    }
  }

  void savedSpecLoadsBack() {
    std::filesystem::create_directories(TESSERA_TEST_TMP_DIR);
    auto path = std::filesystem::path(TESSERA_TEST_TMP_DIR) / "saved_job.json";
    auto spec = job::parse_job_spec(minimal(), "job.json");
    job::save_job_spec(spec, path);
    QCOMPARE(job::to_json(job::load_job_spec(path)), job::to_json(spec));
  }

  void eventsAreVersionedJsonLines() {
    std::filesystem::create_directories(TESSERA_TEST_TMP_DIR);
    auto path = std::filesystem::path(TESSERA_TEST_TMP_DIR) / "events.jsonl";
    int heard = 0;
    {
      job::EventSink sink;
      sink.open(path.string());
      sink.set_listener([&](const json&) { ++heard; });
      sink.log("info", "hello");
      sink.progress("train", 3, 10, 12.5);
      sink.emit("metric", {{"step", 3}, {"loss", 2.5}, {"note", std::string("bad \xff byte")}});
    }
    QCOMPARE(heard, 3);
    std::ifstream in(path);
    std::string line;
    std::vector<json> events;
    while (std::getline(in, line)) events.push_back(json::parse(line));
    QCOMPARE(events.size(), std::size_t(3));
    for (const auto& e : events) {
      QCOMPARE(e["v"].get<int>(), job::kEventVersion);
      QVERIFY(e["t"].is_number());
    }
    QCOMPARE(QString::fromStdString(events[1]["type"].get<std::string>()), QString("progress"));
    QCOMPARE(events[1]["eta_s"].get<double>(), 12.5);
    QCOMPARE(events[2]["loss"].get<double>(), 2.5);
  }

  // launch reads the ranks' stream after a failure to name the rank at fault: whatever else the
  // stream holds (a torn line, another writer's text, fields of the wrong type) is passed over.
  void lastRankErrorSkipsWhatIsNotARankError() {
    std::istringstream stream(
        "{\"type\":\"error\",\"rank\":1,\"message\":\"rank 1 stopped answering\"}\n"
        "{\"type\":5,\"rank\":0}\n"
        "{\"type\":\"error\",\"rank\":-1,\"message\":\"negative\"}\n"
        "{\"type\":\"error\",\"rank\":1e300}\n"
        "{\"type\":\"error\",\"rank\":99999999999}\n"
        "{\"type\":\"error\",\"rank\":\"2\"}\n"
        "[1,2]\n"
        "not json\n"
        "{\"type\":\"error\",\"rank\":3,\"message\":7}\n"
        "{\"type\":\"error\",\"rank\":2,\"mess");
    const auto error = job::last_rank_error(stream);
    QVERIFY(error.has_value());
    QCOMPARE(error->rank, 3);
    QCOMPARE(QString::fromStdString(error->message), QString());

    std::istringstream none("{\"type\":\"log\",\"rank\":1}\n\n");
    QVERIFY(!job::last_rank_error(none).has_value());
  }
};

QTEST_APPLESS_MAIN(TestJobSpec)
#include "test_job_spec.moc"
