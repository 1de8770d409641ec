#pragma once
// The job spec: one versioned JSON document that holds every choice of a fine-tuning run.
// The GUI writes it, `tessera-cli run JOB.json` executes it, and `finetune` builds it from
// flags. Unknown or invalid fields are an error naming the field (with a suggestion for a
// likely typo), never ignored. Schema: docs/job-spec.md.
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tessera::job {

inline constexpr int kJobSpecVersion = 1;

struct ModelSource {
  std::string path;    // a local folder (set for local models and after a hub download)
  std::string hub_id;  // "org/name" when the model comes from the Hub
  std::string revision = "main";
};

struct DatasetSpec {
  // Files, or with hub_id the repository's files as patterns (empty: chosen by their split names).
  std::vector<std::string> train_files;
  std::vector<std::string> validation_files;  // empty: split off train by validation_split
  std::string hub_id;                         // "org/name" when the data comes from the Hub
  std::string revision = "main";
  std::string config;  // with hub_id: the dataset's config ("": its default config)
  // auto | text | instruction | chat | classification | preference | unpaired
  std::string format = "auto";
  std::map<std::string, std::string> columns;  // role → column name, e.g. {"text": "body"}
  double validation_split = 0.0;               // fraction of train rows held out
  std::int64_t max_length = 512;
  bool packing = true;  // text format: pack documents into blocks
  bool skip_bad_rows = false;
};

// Preference tuning (docs/job-spec.md "method.preference"): the objective and its parameters.
struct PreferenceSpec {
  std::string loss = "dpo";  // dpo | ipo | simpo | orpo | kto
  double beta = 0.1;
  double label_smoothing = 0.0;     // dpo, simpo
  double simpo_gamma = 0.5;         // simpo
  double sft_weight = 0.0;          // simpo
  double desirable_weight = 1.0;    // kto
  double undesirable_weight = 1.0;  // kto
  // dpo, ipo, kto: a model folder to compare with; empty: the model being trained as it starts
  // (LoRA: the base with the adapters off, no second copy).
  std::string reference;
};

struct MethodSpec {
  std::string type = "full";  // full | lora
  std::int64_t lora_rank = 8;
  double lora_alpha = 16.0;
  double lora_dropout = 0.0;
  std::vector<std::string> lora_targets;  // empty: the family's default (attention projections)
  // QLoRA: the frozen base's linear layers held as nf4 | fp4 | int8; "none": dense.
  std::string quantize = "none";
  bool double_quant = false;                 // with a 4-bit quantize: the absmax double-quantized
  std::optional<PreferenceSpec> preference;  // none: supervised fine-tuning
  // Method full with LoRA's settings written (rank, alpha, dropout, targets): what strategy
  // auto's plan trains if it falls back to LoRA. Kept in the saved spec; any other strategy
  // refuses them (it never trains LoRA for a full job).
  bool lora_fallback_given = false;
};

struct TrainingSpec {
  std::optional<std::int64_t> steps;  // exactly one of steps / epochs
  std::optional<double> epochs;
  std::int64_t batch_size = 8;
  std::int64_t gradient_accumulation = 1;
  double learning_rate = 2e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  std::string schedule = "linear";  // constant | linear | cosine
  std::int64_t warmup_steps = 0;
  double max_grad_norm = 1.0;  // 0: no clipping
  std::uint64_t seed = 42;
  std::int64_t eval_every = 0;  // 0: only at the end when a validation set exists
  std::int64_t save_every = 0;  // 0: only at the end
  std::int64_t keep_last = 2;
  std::int64_t log_every = 1;
  bool activation_checkpointing = false;
};

// The plugin that runs the job, by name, and its options; job/strategies.h lists them.
struct StrategySpec {
  std::string name = "auto";                          // auto (the planner chooses) | single
  nlohmann::json options = nlohmann::json::object();  // the plugin's, e.g. {"device": "cpu"}
};

struct OutputSpec {
  std::string dir;                    // the run folder: checkpoints, logs, final model
  std::optional<std::string> resume;  // a checkpoint folder to continue from
};

// The machines a job runs on (`tessera-cli launch`, docs/job-spec.md "nodes"): this one and the
// paired LAN nodes (docs/nodes.md), with the ranks each runs. Ranks are numbered from this
// machine's (0, 1, …; rank 0 writes the event stream), then each node's in the order listed.
struct NodeRanks {
  std::string name;  // a paired node's name, or "local" (this machine)
  int nproc = 1;
};
struct NodesSpec {
  std::vector<NodeRanks> ranks_per_node;
  // The address of this machine the other nodes reach it at (MASTER_ADDR); empty: the address
  // of the interface that routes to the remote nodes.
  std::string master_addr;
  std::uint16_t master_port = 0;  // 0: a free port
};
inline constexpr const char* kLocalNode = "local";
constexpr int kMaxRanksPerNode = 256;

struct JobSpec {
  int version = kJobSpecVersion;
  std::string name;
  ModelSource model;
  DatasetSpec dataset;
  MethodSpec method;
  TrainingSpec training;
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (fp16 only with CUDA)
  StrategySpec strategy;
  OutputSpec output;
  std::optional<NodesSpec> nodes;  // none: this machine alone (launch --nproc N)
};

// Parses a "nodes" value (the object form, or the list alone); `field` names it in errors.
// Used by parse_job_spec and by `launch --nodes`.
NodesSpec parse_nodes_spec(const nlohmann::json& value, const std::string& source);
nlohmann::json to_json(const NodesSpec& nodes);

// Parses and validates; `source` names the document in error messages (a file path).
JobSpec parse_job_spec(const nlohmann::json& doc, const std::string& source);
JobSpec load_job_spec(const std::filesystem::path& path);

// The canonical JSON form: every field written out, so a saved spec documents its defaults.
nlohmann::json to_json(const JobSpec& spec);

// Writes the spec atomically (temporary file, fsync, rename).
void save_job_spec(const JobSpec& spec, const std::filesystem::path& path);

// Said by the plan and at a run's start when warm-up lasts the whole run (transformers allows
// it, and so do we: it is the user's choice): the learning rate rises throughout and never
// reaches the one they set. Nothing otherwise.
std::optional<std::string> warmup_warning(std::int64_t warmup_steps, std::int64_t total_steps,
                                          double learning_rate);

}  // namespace tessera::job
