#include "plan/step_times.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"

namespace tessera::plan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json key_json(const StepTimeKey& k) {
  const Settings& s = k.settings;
  return {{"device", k.device},
          {"model", k.model},
          {"method", s.method},
          {"lora_rank", s.lora_rank},
          {"quantize", s.quantize},
          {"precision", s.precision},
          {"micro_batch", s.micro_batch},
          {"gradient_accumulation", s.gradient_accumulation},
          {"sequence_length", s.sequence_length},
          {"activation_checkpointing", s.activation_checkpointing},
          {"strategy", s.strategy},
          {"offload_optim_frac", s.offload_optim_frac},
          {"offload_param_frac", s.offload_param_frac},
          {"device_tier", s.device_tier},
          {"host_optim_frac", s.host_optim_frac},
          {"host_param_frac", s.host_param_frac},
          {"zero_offload", s.zero_offload},
          {"zero_stage", s.zero_stage},
          {"tp_size", s.tp_size},
          {"pp_size", s.pp_size},
          {"pp_chunks", s.pp_chunks},
          {"sequence_parallel", s.sequence_parallel},
          {"rows_per_example", s.rows_per_example},
          {"reference_forward", s.reference_forward},
          {"processes", k.processes}};
}

json record_json(const StepTimeRecord& r) {
  json j = key_json(r.key);
  j["seconds_per_step"] = r.seconds_per_step;
  j["first_step_seconds"] = r.first_step_seconds;
  j["steps_measured"] = r.steps_measured;
  j["evaluation_batch_seconds"] = r.evaluation_batch_seconds;
  j["run"] = r.run;
  j["recorded_at"] = r.recorded_at;
  return j;
}

// Throws nlohmann's exceptions on a missing or mistyped field, tessera::Error on absurd values.
StepTimeRecord record_from_json(const json& j) {
  StepTimeRecord r;
  r.key.device = j.at("device").get<std::string>();
  r.key.model = j.at("model").get<std::string>();
  Settings& s = r.key.settings;
  s.method = j.at("method").get<std::string>();
  s.lora_rank = j.at("lora_rank").get<std::int64_t>();
  s.quantize = j.value("quantize", std::string("none"));  // records from before QLoRA: dense
  s.precision = j.at("precision").get<std::string>();
  s.micro_batch = j.at("micro_batch").get<std::int64_t>();
  s.gradient_accumulation = j.at("gradient_accumulation").get<std::int64_t>();
  s.sequence_length = j.at("sequence_length").get<std::int64_t>();
  s.activation_checkpointing = j.at("activation_checkpointing").get<bool>();
  s.strategy = j.at("strategy").get<std::string>();
  s.offload_optim_frac = j.at("offload_optim_frac").get<double>();
  s.offload_param_frac = j.at("offload_param_frac").get<double>();
  s.zero_stage = j.value("zero_stage", 0);  // records written before zero was planned: none
  s.tp_size = j.value("tp_size", 1);        // before hybrid was planned: one of each
  s.pp_size = j.value("pp_size", 1);
  s.pp_chunks = j.value("pp_chunks", 1);
  s.sequence_parallel = j.value("sequence_parallel", false);
  // Records from before preference tuning: supervised fine-tuning, a row an example.
  s.rows_per_example = j.value("rows_per_example", std::int64_t{1});
  s.reference_forward = j.value("reference_forward", false);
  r.key.processes = j.value("processes", 1);  // before several processes were recorded: one
  // Records written before gemini's device tier was planned: none.
  s.device_tier = j.value("device_tier", false);
  s.host_optim_frac = j.value("host_optim_frac", 0.0);
  s.host_param_frac = j.value("host_param_frac", 0.0);
  s.zero_offload = j.value("zero_offload", false);
  r.seconds_per_step = j.at("seconds_per_step").get<double>();
  r.first_step_seconds = j.at("first_step_seconds").get<double>();
  r.steps_measured = j.at("steps_measured").get<std::int64_t>();
  // Records from before evaluations were measured: none.
  r.evaluation_batch_seconds = j.value("evaluation_batch_seconds", 0.0);
  if (!(r.evaluation_batch_seconds >= 0.0 && std::isfinite(r.evaluation_batch_seconds)))
    throw_invalid("evaluation_batch_seconds must be a non-negative number");
  r.run = j.at("run").get<std::string>();
  r.recorded_at = j.at("recorded_at").get<std::string>();
  if (!(r.seconds_per_step > 0.0 && std::isfinite(r.seconds_per_step)) ||
      !(r.first_step_seconds >= 0.0 && std::isfinite(r.first_step_seconds)) ||
      r.steps_measured < 1 || s.micro_batch < 1 || s.gradient_accumulation < 1 ||
      s.rows_per_example < 1 || s.sequence_length < 1)
    throw_invalid(
        "seconds_per_step, steps_measured, micro_batch, gradient_accumulation and "
        "sequence_length must be positive");
  return r;
}

// An exclusive lock on FILE.lock for the read-modify-write of the store; released on scope exit.
class StoreLock {
 public:
  explicit StoreLock(const fs::path& file) {
    const fs::path lock = file.string() + ".lock";
    fd_ = ::open(lock.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ < 0)
      throw_io(lock.string() + ": cannot create the step-time store's lock file",
               "check that " + file.parent_path().string() + " is writable");
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~StoreLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;

 private:
  int fd_ = -1;
};

bool near(double a, double b) {
  return std::abs(a - b) < 1e-9;
}

}  // namespace

std::string model_fingerprint(const hf::ModelConfig& c) {
  return c.model_type + " L" + std::to_string(c.num_hidden_layers) + " H" +
         std::to_string(c.hidden_size) + " I" + std::to_string(c.intermediate_size) + " A" +
         std::to_string(c.num_attention_heads) + "/" + std::to_string(c.num_key_value_heads) +
         " V" + std::to_string(c.vocab_size);
}

std::string step_time_device(const HardwareProfile& p, bool on_gpu) {
  if (on_gpu && !p.gpus.empty()) return "cuda: " + p.gpus[0].name;
  return "cpu: " + p.cpu.model + " × " + std::to_string(p.cpu.physical_cores);
}

bool similar(const StepTimeKey& a, const StepTimeKey& b) {
  const Settings& x = a.settings;
  const Settings& y = b.settings;
  return a.device == b.device && a.model == b.model && a.processes == b.processes &&
         x.method == y.method &&
         (x.method != "lora" || (x.lora_rank == y.lora_rank && x.quantize == y.quantize)) &&
         x.precision == y.precision && x.activation_checkpointing == y.activation_checkpointing &&
         x.strategy == y.strategy && x.zero_stage == y.zero_stage &&
         near(x.offload_optim_frac, y.offload_optim_frac) &&
         near(x.offload_param_frac, y.offload_param_frac) && x.device_tier == y.device_tier &&
         near(x.host_optim_frac, y.host_optim_frac) && near(x.host_param_frac, y.host_param_frac) &&
         x.zero_offload == y.zero_offload && x.tp_size == y.tp_size && x.pp_size == y.pp_size &&
         x.pp_chunks == y.pp_chunks && x.sequence_parallel == y.sequence_parallel &&
         x.rows_per_example == y.rows_per_example && x.reference_forward == y.reference_forward;
}

bool same(const StepTimeKey& a, const StepTimeKey& b) {
  return similar(a, b) && a.settings.micro_batch == b.settings.micro_batch &&
         a.settings.gradient_accumulation == b.settings.gradient_accumulation &&
         a.settings.sequence_length == b.settings.sequence_length;
}

fs::path StepTimeStore::default_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg) return fs::path(xdg) / "tessera" / "step_times.json";
  if (home && *home) return fs::path(home) / ".cache" / "tessera" / "step_times.json";
  return {};
}

std::vector<StepTimeRecord> StepTimeStore::load(std::vector<std::string>* warnings) const {
  std::vector<StepTimeRecord> records;
  std::error_code ec;
  if (file_.empty() || !fs::exists(file_, ec)) return records;
  auto warn = [&](const std::string& what) {
    if (warnings)
      warnings->push_back(file_.string() + ": " + what +
                          "; measured step times are ignored until a run records them again "
                          "(delete the file to start afresh)");
  };
  json doc;
  try {
    doc = json::parse(core::read_text_file(file_));
  } catch (const std::exception& e) {
    warn(std::string("not a readable JSON file (") + e.what() + ")");
    return records;
  }
  if (!doc.is_object() || !doc.contains("records") || !doc["records"].is_array()) {
    warn("no \"records\" array");
    return records;
  }
  const json& list = doc["records"];
  for (std::size_t i = 0; i < list.size(); ++i) {
    try {
      records.push_back(record_from_json(list[i]));
    } catch (const std::exception& e) {
      if (warnings)
        warnings->push_back(file_.string() + ": records[" + std::to_string(i) + "] is skipped (" +
                            e.what() + ")");
    }
  }
  return records;
}

void StepTimeStore::record(const StepTimeRecord& r) const {
  if (file_.empty())
    throw_io("no cache folder for the step-time store (neither XDG_CACHE_HOME nor HOME is set)",
             "set HOME");
  std::error_code ec;
  fs::create_directories(file_.parent_path(), ec);
  if (ec)
    throw_io(
        file_.parent_path().string() + ": cannot create the cache folder (" + ec.message() + ")",
        "check the folder's permissions");
  const StoreLock lock(file_);
  std::vector<StepTimeRecord> records = load(nullptr);  // a corrupt file is replaced
  std::erase_if(records, [&](const StepTimeRecord& old) { return same(old.key, r.key); });
  records.push_back(r);
  if (records.size() > kMaxRecords)
    records.erase(records.begin(),
                  records.begin() + static_cast<std::ptrdiff_t>(records.size() - kMaxRecords));
  json list = json::array();
  for (const StepTimeRecord& each : records) list.push_back(record_json(each));
  core::write_file_atomic(file_, json{{"version", 1}, {"records", list}}.dump(2) + "\n");
}

}  // namespace tessera::plan
