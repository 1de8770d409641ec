#include "job/job_spec.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "core/files.h"
#include "job/strategies.h"

namespace tessera::job {
namespace {

using nlohmann::json;

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Reads one JSON object of the spec; remembers which keys were read so that anything left
// over is reported as an unknown field (with the closest known name as a suggestion).
class ObjectReader {
 public:
  ObjectReader(const json& obj, std::string path, const std::string& source)
      : obj_(obj), path_(std::move(path)), source_(source) {
    if (!obj_.is_object()) fail(path_.empty() ? "the document" : path_, "must be a JSON object");
  }

  const json* get(const std::string& key) {
    known_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::string field(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }

  std::string string(const std::string& key, std::string fallback,
                     std::initializer_list<const char*> allowed = {}) {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail(field(key), "must be a string");
    std::string s = v->get<std::string>();
    if (allowed.size() > 0 &&
        std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return s == a; })) {
      std::string list;
      for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      fail(field(key), "is \"" + s + "\"; expected one of: " + list);
    }
    return s;
  }

  std::int64_t integer(const std::string& key, std::int64_t fallback, std::int64_t min_value) {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_number_integer()) fail(field(key), "must be an integer");
    auto x = v->get<std::int64_t>();
    if (x < min_value) fail(field(key), "must be at least " + std::to_string(min_value));
    return x;
  }

  double number(const std::string& key, double fallback, double min_value, double max_value) {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) fail(field(key), "must be a number");
    double x = v->get<double>();
    if (!(x >= min_value && x <= max_value))
      fail(field(key), "must be between " + json(min_value).dump() + " and " +
                           json(max_value).dump() + ", got " + json(x).dump());
    return x;
  }

  bool boolean(const std::string& key, bool fallback) {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(field(key), "must be true or false");
    return v->get<bool>();
  }

  std::vector<std::string> strings(const std::string& key) {
    const json* v = get(key);
    std::vector<std::string> out;
    if (v == nullptr) return out;
    if (v->is_string()) return {v->get<std::string>()};
    if (!v->is_array()) fail(field(key), "must be a string or a list of strings");
    for (const auto& e : *v) {
      if (!e.is_string()) fail(field(key), "must be a string or a list of strings");
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  void finish() const {
    for (const auto& [key, value] : obj_.items()) {
      if (known_.count(key)) continue;
      std::string best;
      std::size_t best_distance = 3;  // suggest only near misses
      for (const auto& k : known_) {
        std::size_t d = edit_distance(key, k);
        if (d < best_distance) {
          best_distance = d;
          best = k;
        }
      }
      fail(field(key), "is not a known field",
           best.empty() ? "remove it; see docs/job-spec.md for the fields"
                        : "did you mean \"" + field(best) + "\"?");
    }
  }

  [[noreturn]] void fail(const std::string& field_name, const std::string& what,
                         std::string hint = {}) const {
    throw_invalid(source_ + ": " + field_name + " " + what, std::move(hint));
  }

 private:
  const json& obj_;
  std::string path_;
  const std::string& source_;
  std::set<std::string> known_;
};

}  // namespace

NodesSpec parse_nodes_spec(const json& value, const std::string& source) {
  NodesSpec nodes;
  const auto fail = [&](const std::string& field_name, const std::string& what,
                        std::string hint = {}) -> void {
    throw_invalid(source + ": " + field_name + " " + what, std::move(hint));
  };
  const json* list = &value;
  json object_form;
  if (value.is_object()) {
    ObjectReader r(value, "nodes", source);
    list = r.get("ranks_per_node");
    if (list == nullptr)
      fail("nodes.ranks_per_node", "is missing",
           "give the machines and their ranks: [{\"name\": \"local\", \"nproc\": 1}, "
           "{\"name\": \"box2\", \"nproc\": 2}]");
    nodes.master_addr = r.string("master_addr", "");
    const std::int64_t port = r.integer("master_port", 0, 0);
    if (port > 65535)
      r.fail("nodes.master_port", "must be a TCP port (0 for a free one, up to 65535)");
    nodes.master_port = static_cast<std::uint16_t>(port);
    r.finish();
  } else if (!value.is_array()) {
    fail("nodes", "must be an object {\"ranks_per_node\": [...], \"master_addr\": ...} or a list",
         "see docs/job-spec.md (nodes)");
  }
  if (!list->is_array() || list->empty())
    fail("nodes.ranks_per_node", "must be a non-empty list of {\"name\", \"nproc\"}");
  bool has_local = false;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string field = "nodes.ranks_per_node[" + std::to_string(i) + "]";
    ObjectReader r((*list)[i], field, source);
    NodeRanks entry;
    entry.name = r.string("name", kLocalNode);
    if (entry.name.empty())
      r.fail(field + ".name", "is empty", "give a paired node's name, or \"local\"");
    entry.nproc = static_cast<int>(r.integer("nproc", 1, 1));
    if (entry.nproc > kMaxRanksPerNode)
      r.fail(field + ".nproc", "is " + std::to_string(entry.nproc) + "; at most " +
                                   std::to_string(kMaxRanksPerNode) + " ranks per node");
    r.finish();
    for (const NodeRanks& other : nodes.ranks_per_node)
      if (other.name == entry.name)
        r.fail(field + ".name", "\"" + entry.name + "\" is listed twice",
               "give each machine once, with all its ranks in nproc");
    has_local = has_local || entry.name == kLocalNode;
    nodes.ranks_per_node.push_back(std::move(entry));
  }
  if (!has_local)
    fail("nodes.ranks_per_node", "does not list this machine (\"local\")",
         "add {\"name\": \"local\", \"nproc\": 1}: rank 0 runs here and writes the event "
         "stream");
  return nodes;
}

json to_json(const NodesSpec& nodes) {
  json list = json::array();
  for (const NodeRanks& n : nodes.ranks_per_node)
    list.push_back({{"name", n.name}, {"nproc", n.nproc}});
  json out = {{"ranks_per_node", list}};
  if (!nodes.master_addr.empty()) out["master_addr"] = nodes.master_addr;
  if (nodes.master_port != 0) out["master_port"] = nodes.master_port;
  return out;
}

JobSpec parse_job_spec(const json& doc, const std::string& source) {
  JobSpec spec;
  ObjectReader top(doc, "", source);
  const json* version = top.get("version");
  if (version == nullptr)
    top.fail("version", "is missing", "add \"version\": 1 at the top of the job spec");
  if (!version->is_number_integer() || version->get<int>() != kJobSpecVersion)
    top.fail("version", "is " + version->dump() + "; this Tessera reads version " +
                            std::to_string(kJobSpecVersion));
  spec.name = top.string("name", "");
  spec.precision = top.string("precision", "fp32", {"fp32", "bf16", "fp16"});

  const json* model = top.get("model");
  if (model == nullptr) top.fail("model", "is missing", "give \"model\": {\"path\": FOLDER}");
  {
    ObjectReader r(*model, "model", source);
    spec.model.path = r.string("path", "");
    spec.model.hub_id = r.string("hub_id", "");
    spec.model.revision = r.string("revision", "main");
    if (spec.model.path.empty() && spec.model.hub_id.empty())
      r.fail("model", "needs \"path\" (a local folder) or \"hub_id\"");
    r.finish();
  }

  const json* dataset = top.get("dataset");
  if (dataset == nullptr)
    top.fail("dataset", "is missing", "give \"dataset\": {\"train\": [FILE]}");
  {
    ObjectReader r(*dataset, "dataset", source);
    spec.dataset.train_files = r.strings("train");
    spec.dataset.validation_files = r.strings("validation");
    spec.dataset.hub_id = r.string("hub_id", "");
    spec.dataset.revision = r.string("revision", "main");
    spec.dataset.config = r.string("config", "");
    if (!spec.dataset.config.empty() && spec.dataset.hub_id.empty())
      r.fail("dataset.config", "names a config of a Hub dataset: give dataset.hub_id too");
    if (spec.dataset.train_files.empty() && spec.dataset.hub_id.empty())
      r.fail("dataset.train", "must name at least one file (or give dataset.hub_id)");
    spec.dataset.format = r.string(
        "format", "auto",
        {"auto", "text", "instruction", "chat", "classification", "preference", "unpaired"});
    if (const json* cols = r.get("columns")) {
      if (!cols->is_object()) r.fail("dataset.columns", "must be an object of role → column");
      for (const auto& [role, column] : cols->items()) {
        if (!column.is_string()) r.fail("dataset.columns." + role, "must be a column name");
        spec.dataset.columns[role] = column.get<std::string>();
      }
    }
    spec.dataset.validation_split = r.number("validation_split", 0.0, 0.0, 0.9);
    if (spec.dataset.validation_split > 0.0 && !spec.dataset.validation_files.empty())
      r.fail("dataset.validation_split",
             "holds out training rows for validation, and dataset.validation names validation "
             "files already",
             "keep one: the files (remove dataset.validation_split), or the split (remove "
             "dataset.validation)");
    spec.dataset.max_length = r.integer("max_length", 512, 2);
    spec.dataset.packing = r.boolean("packing", true);
    spec.dataset.skip_bad_rows = r.boolean("skip_bad_rows", false);
    r.finish();
  }

  std::string lora_key;  // the first of LoRA's settings the method names
  if (const json* method = top.get("method")) {
    ObjectReader r(*method, "method", source);
    spec.method.type = r.string("type", "full", {"full", "lora"});
    for (const char* key : {"rank", "alpha", "dropout", "targets"})
      if (lora_key.empty() && r.get(key) != nullptr) lora_key = key;
    spec.method.lora_fallback_given = spec.method.type == "full" && !lora_key.empty();
    spec.method.lora_rank = r.integer("rank", 8, 1);
    spec.method.lora_alpha = r.number("alpha", 16.0, 1e-6, 1e6);
    spec.method.lora_dropout = r.number("dropout", 0.0, 0.0, 0.99);
    spec.method.lora_targets = r.strings("targets");
    spec.method.quantize = r.string("quantize", "none", {"none", "nf4", "fp4", "int8"});
    if (spec.method.quantize != "none" && spec.method.type != "lora")
      r.fail("method.quantize",
             "\"" + spec.method.quantize +
                 "\" quantizes the frozen base of LoRA (QLoRA), and method.type is \"" +
                 spec.method.type + "\"",
             "set method.type to \"lora\", or remove method.quantize");
    spec.method.double_quant = r.boolean("double_quant", false);
    if (spec.method.double_quant && spec.method.quantize != "nf4" && spec.method.quantize != "fp4")
      r.fail("method.double_quant",
             "double-quantizes the absmax of a 4-bit base, and method.quantize is \"" +
                 spec.method.quantize + "\"",
             "set method.quantize to nf4 or fp4, or remove method.double_quant");
    if (const json* preference = r.get("preference")) {
      ObjectReader pr(*preference, "method.preference", source);
      PreferenceSpec p;
      p.loss = pr.string("loss", p.loss, {"dpo", "ipo", "simpo", "orpo", "kto"});
      p.beta = pr.number("beta", p.beta, 1e-9, 1e6);
      const auto only_for = [&](const char* key, std::initializer_list<const char*> losses) {
        if (pr.get(key) == nullptr) return;
        if (std::none_of(losses.begin(), losses.end(),
                         [&](const char* l) { return p.loss == l; })) {
          std::string list;
          for (const char* l : losses) list += (list.empty() ? "" : " and ") + std::string(l);
          pr.fail(pr.field(key),
                  "applies to " + list + ", and method.preference.loss is \"" + p.loss + "\"",
                  "remove method.preference." + std::string(key));
        }
      };
      only_for("label_smoothing", {"dpo", "simpo"});
      p.label_smoothing = pr.number("label_smoothing", p.label_smoothing, 0.0, 0.499999);
      only_for("simpo_gamma", {"simpo"});
      p.simpo_gamma = pr.number("simpo_gamma", p.simpo_gamma, -1e6, 1e6);
      only_for("sft_weight", {"simpo"});
      p.sft_weight = pr.number("sft_weight", p.sft_weight, 0.0, 1e6);
      only_for("desirable_weight", {"kto"});
      p.desirable_weight = pr.number("desirable_weight", p.desirable_weight, 1e-6, 1e6);
      only_for("undesirable_weight", {"kto"});
      p.undesirable_weight = pr.number("undesirable_weight", p.undesirable_weight, 1e-6, 1e6);
      only_for("reference", {"dpo", "ipo", "kto"});
      p.reference = pr.string("reference", "");
      pr.finish();
      spec.method.preference = p;
    }
    r.finish();
  }

  if (const json* training = top.get("training")) {
    ObjectReader r(*training, "training", source);
    auto& t = spec.training;
    if (r.get("steps")) t.steps = r.integer("steps", 0, 1);
    if (r.get("epochs")) t.epochs = r.number("epochs", 0, 1e-6, 1e6);
    if (t.steps && t.epochs) r.fail("training.steps", "and training.epochs are both set; keep one");
    t.batch_size = r.integer("batch_size", t.batch_size, 1);
    if (t.batch_size < 2 && spec.method.preference && spec.method.preference->loss == "kto")
      r.fail("training.batch_size",
             "is 1, and kto estimates its KL term by pairing each prompt with another example's "
             "completion of the batch",
             "set training.batch_size to 2 or more");
    t.gradient_accumulation = r.integer("gradient_accumulation", t.gradient_accumulation, 1);
    t.learning_rate = r.number("learning_rate", t.learning_rate, 0.0, 10.0);
    t.weight_decay = r.number("weight_decay", t.weight_decay, 0.0, 10.0);
    t.adam_beta1 = r.number("adam_beta1", t.adam_beta1, 0.0, 0.999999);
    t.adam_beta2 = r.number("adam_beta2", t.adam_beta2, 0.0, 0.999999);
    t.adam_eps = r.number("adam_eps", t.adam_eps, 0.0, 1.0);
    t.schedule = r.string("schedule", t.schedule, {"constant", "linear", "cosine"});
    t.warmup_steps = r.integer("warmup_steps", t.warmup_steps, 0);
    t.max_grad_norm = r.number("max_grad_norm", t.max_grad_norm, 0.0, 1e9);
    t.seed = static_cast<std::uint64_t>(r.integer("seed", static_cast<std::int64_t>(t.seed), 0));
    t.eval_every = r.integer("eval_every", t.eval_every, 0);
    t.save_every = r.integer("save_every", t.save_every, 0);
    t.keep_last = r.integer("keep_last", t.keep_last, 1);
    t.log_every = r.integer("log_every", t.log_every, 1);
    t.activation_checkpointing = r.boolean("activation_checkpointing", false);
    r.finish();
  }
  if (!spec.training.steps && !spec.training.epochs) spec.training.epochs = 1.0;

  if (const json* strategy = top.get("strategy")) {
    ObjectReader r(*strategy, "strategy", source);
    spec.strategy.name = r.string("name", kAutoStrategy);
    if (const json* opts = r.get("options")) {
      if (!opts->is_object()) r.fail("strategy.options", "must be an object");
      spec.strategy.options = *opts;
    }
    r.finish();
    validate_strategy(spec.strategy.name, spec.strategy.options, source);
  }
  // LoRA's settings beside method full are auto's fallback; a named strategy would drop them.
  if (spec.method.lora_fallback_given && spec.strategy.name != kAutoStrategy)
    top.fail("method." + lora_key,
             "is LoRA's setting, and method.type is \"full\" under strategy \"" +
                 spec.strategy.name +
                 "\", which trains every weight (only strategy auto may "
                 "fall back to LoRA, with these settings)",
             "set method.type to \"lora\", or remove method." + lora_key);

  const json* output = top.get("output");
  if (output == nullptr) top.fail("output", "is missing", "give \"output\": {\"dir\": FOLDER}");
  {
    ObjectReader r(*output, "output", source);
    spec.output.dir = r.string("dir", "");
    if (spec.output.dir.empty()) r.fail("output.dir", "is missing");
    std::string resume = r.string("resume", "");
    if (!resume.empty()) spec.output.resume = resume;
    r.finish();
  }
  if (const json* nodes = top.get("nodes")) spec.nodes = parse_nodes_spec(*nodes, source);
  top.finish();
  return spec;
}

JobSpec load_job_spec(const std::filesystem::path& path) {
  std::string text = core::read_text_file(path);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    // Report a line number: people edit these files by hand.
    std::size_t line = 1;
    for (std::size_t i = 0; i < std::min<std::size_t>(e.byte, text.size()); ++i)
      if (text[i] == '\n') ++line;
    throw_invalid(path.string() + ":" + std::to_string(line) + ": not valid JSON",
                  "a job spec is a JSON document; see docs/job-spec.md");
  } catch (const json::out_of_range& e) {  // a number beyond a double's range (1e400)
    throw_invalid(path.string() + ": not valid JSON (" + e.what() + ")",
                  "a job spec is a JSON document; see docs/job-spec.md");
  }
  return parse_job_spec(doc, path.string());
}

json to_json(const JobSpec& s) {
  json model = json::object();
  if (!s.model.path.empty()) model["path"] = s.model.path;
  if (!s.model.hub_id.empty()) {
    model["hub_id"] = s.model.hub_id;
    model["revision"] = s.model.revision;
  }
  json columns = json::object();
  for (const auto& [role, col] : s.dataset.columns) columns[role] = col;
  json hub_dataset = json::object();
  if (!s.dataset.hub_id.empty())
    hub_dataset = {{"hub_id", s.dataset.hub_id}, {"revision", s.dataset.revision}};
  if (!s.dataset.config.empty()) hub_dataset["config"] = s.dataset.config;
  json training = {
      {"batch_size", s.training.batch_size},
      {"gradient_accumulation", s.training.gradient_accumulation},
      {"learning_rate", s.training.learning_rate},
      {"weight_decay", s.training.weight_decay},
      {"adam_beta1", s.training.adam_beta1},
      {"adam_beta2", s.training.adam_beta2},
      {"adam_eps", s.training.adam_eps},
      {"schedule", s.training.schedule},
      {"warmup_steps", s.training.warmup_steps},
      {"max_grad_norm", s.training.max_grad_norm},
      {"seed", s.training.seed},
      {"eval_every", s.training.eval_every},
      {"save_every", s.training.save_every},
      {"keep_last", s.training.keep_last},
      {"log_every", s.training.log_every},
      {"activation_checkpointing", s.training.activation_checkpointing},
  };
  if (s.training.steps) training["steps"] = *s.training.steps;
  if (s.training.epochs) training["epochs"] = *s.training.epochs;
  json method = {{"type", s.method.type}};
  if (s.method.type == "lora" || s.method.lora_fallback_given) {
    method["rank"] = s.method.lora_rank;
    method["alpha"] = s.method.lora_alpha;
    method["dropout"] = s.method.lora_dropout;
    method["targets"] = s.method.lora_targets;
    if (s.method.quantize != "none") method["quantize"] = s.method.quantize;
    if (s.method.double_quant) method["double_quant"] = true;
  }
  if (const auto& p = s.method.preference) {
    json preference = {{"loss", p->loss}, {"beta", p->beta}};
    if (p->loss == "dpo" || p->loss == "simpo") preference["label_smoothing"] = p->label_smoothing;
    if (p->loss == "simpo") {
      preference["simpo_gamma"] = p->simpo_gamma;
      preference["sft_weight"] = p->sft_weight;
    }
    if (p->loss == "kto") {
      preference["desirable_weight"] = p->desirable_weight;
      preference["undesirable_weight"] = p->undesirable_weight;
    }
    if (!p->reference.empty()) preference["reference"] = p->reference;
    method["preference"] = std::move(preference);
  }
  json output = {{"dir", s.output.dir}};
  if (s.output.resume) output["resume"] = *s.output.resume;
  json doc = {
      {"version", s.version},
      {"model", model},
      {"dataset",
       {{"train", s.dataset.train_files},
        {"validation", s.dataset.validation_files},
        {"format", s.dataset.format},
        {"columns", columns},
        {"validation_split", s.dataset.validation_split},
        {"max_length", s.dataset.max_length},
        {"packing", s.dataset.packing},
        {"skip_bad_rows", s.dataset.skip_bad_rows}}},
      {"method", method},
      {"training", training},
      {"precision", s.precision},
      {"strategy", {{"name", s.strategy.name}, {"options", s.strategy.options}}},
      {"output", output},
  };
  for (const auto& [key, value] : hub_dataset.items()) doc["dataset"][key] = value;
  if (!s.name.empty()) doc["name"] = s.name;
  if (s.nodes) doc["nodes"] = to_json(*s.nodes);
  return doc;
}

void save_job_spec(const JobSpec& spec, const std::filesystem::path& path) {
  core::write_file_atomic(path, to_json(spec).dump(2) + "\n");
}

std::optional<std::string> warmup_warning(std::int64_t warmup_steps, std::int64_t total_steps,
                                          double learning_rate) {
  if (warmup_steps <= 0 || warmup_steps < total_steps) return std::nullopt;
  // Step s (from 0) trains at s / warmup_steps of the rate, as transformers' schedules do.
  const double peak = static_cast<double>(std::max<std::int64_t>(total_steps - 1, 0)) /
                      static_cast<double>(warmup_steps);
  char figures[160];
  std::snprintf(figures, sizeof figures, "peaks at %.3g (%.0f%% of training.learning_rate %.3g)",
                learning_rate * peak, peak * 100.0, learning_rate);
  return "training.warmup_steps is " + std::to_string(warmup_steps) + " and the run has " +
         std::to_string(total_steps) + " steps: the learning rate rises for the whole run and " +
         figures +
         "; give fewer warm-up steps than steps (a tenth of them is common) to train at the rate "
         "you set";
}

}  // namespace tessera::job
