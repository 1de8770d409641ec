#include "runner/trainer_event_writer.h"

namespace tessera::runner {
namespace {

// A rank's place on hybrid's dp × pp × tp mesh (train::MeshShape).
nlohmann::json mesh_coordinates(int rank, const train::MeshShape& mesh) {
  return {{"dp", rank / (mesh.tp * mesh.pp)},
          {"pp", (rank / mesh.tp) % mesh.pp},
          {"tp", rank % mesh.tp}};
}

}  // namespace

nlohmann::json preference_json(const train::PreferenceMetrics& m) {
  nlohmann::json out = {{"reward_chosen", m.reward_chosen},
                        {"reward_rejected", m.reward_rejected},
                        {"reward_margin", m.margin},
                        {"log_prob_chosen", m.log_prob_chosen},
                        {"log_prob_rejected", m.log_prob_rejected}};
  if (m.accuracy) {
    out["pairs"] = m.pairs;
    out["reward_accuracy"] = *m.accuracy;
  } else {
    out["desirable"] = m.desirable;
    out["undesirable"] = m.undesirable;
  }
  if (m.kl) out["kl"] = *m.kl;
  return out;
}

void TrainerEventWriter::on_step(const train::StepReport& r) {
  nlohmann::json metric = {{"step", r.step},
                           {"loss", r.loss},
                           {"lr", r.lr},
                           {"grad_norm", r.grad_norm},
                           {"tokens_per_s", r.tokens_per_s}};
  if (!r.ranks.empty()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& rank : r.ranks) {
      nlohmann::json entry = {{"rank", rank.rank},
                              {"loss", rank.loss},
                              {"targets", rank.targets},
                              {"tokens_per_s", rank.tokens_per_s}};
      if (r.mesh) entry["mesh"] = mesh_coordinates(rank.rank, *r.mesh);
      if (rank.step_s) entry["step_s"] = *rank.step_s;
      if (rank.pipeline_idle_s) entry["pipeline_idle_s"] = *rank.pipeline_idle_s;
      ranks.push_back(std::move(entry));
    }
    metric["ranks"] = std::move(ranks);
  }
  const auto traffic_json = [](const dist::Traffic& traffic) {
    const auto kind = [](const dist::CollectiveTraffic& t) {
      return nlohmann::json{{"calls", t.calls}, {"bytes", t.bytes}, {"ring_bytes", t.ring_bytes}};
    };
    const dist::CollectiveTraffic total = traffic.total();
    return nlohmann::json{{"all_reduce", kind(traffic.all_reduce)},
                          {"reduce_scatter", kind(traffic.reduce_scatter)},
                          {"all_gather", kind(traffic.all_gather)},
                          {"broadcast", kind(traffic.broadcast)},
                          {"send", kind(traffic.send)},
                          {"bytes", total.bytes},
                          {"ring_bytes", total.ring_bytes}};
  };
  if (r.traffic) metric["traffic"] = traffic_json(*r.traffic);
  if (r.tensor_traffic) metric["tensor_traffic"] = traffic_json(*r.tensor_traffic);
  if (r.pipeline_traffic) metric["pipeline_traffic"] = traffic_json(*r.pipeline_traffic);
  if (r.preference) metric["preference"] = preference_json(*r.preference);
  sink_.emit("metric", metric);
}

void TrainerEventWriter::on_eval(const train::EvalResult& r) {
  if (recorder_) recorder_->on_evaluation(r.seconds, r.batches);
  nlohmann::json metric = {{"step", r.step}, {"eval_loss", r.loss}};
  if (r.perplexity) metric["perplexity"] = *r.perplexity;
  if (r.accuracy) metric["accuracy"] = *r.accuracy;
  if (r.preference) metric["eval_preference"] = preference_json(*r.preference);
  sink_.emit("metric", metric);
}

void TrainerEventWriter::on_memory(const train::MemoryReport& r) {
  nlohmann::json event = {{"tier", r.on_disk     ? "disk"
                                   : r.on_device ? "device"
                                                 : "host"},
                          {"device", r.device},
                          {"used", r.used},
                          {"reserved", r.reserved},
                          {"budget", r.budget ? nlohmann::json(*r.budget) : nlohmann::json()},
                          {"by_category",
                           {{"weights", r.by_category.weights},
                            {"gradients", r.by_category.gradients},
                            {"optimizer", r.by_category.optimizer},
                            {"activations_other", r.activations_other}}}};
  if (r.system_used) event["system_used"] = *r.system_used;
  if (r.peak) event["peak"] = *r.peak;
  if (r.total) event["total"] = *r.total;
  if (r.free) event["free"] = *r.free;
  if (!r.ranks.empty()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& rank : r.ranks) {
      nlohmann::json entry = {{"rank", rank.rank},
                              {"host", rank.host},
                              {"used", rank.used},
                              {"by_category",
                               {{"weights", rank.by_category.weights},
                                {"gradients", rank.by_category.gradients},
                                {"optimizer", rank.by_category.optimizer},
                                {"activations_other", rank.activations_other}}}};
      if (r.mesh) entry["mesh"] = mesh_coordinates(rank.rank, *r.mesh);
      ranks.push_back(std::move(entry));
    }
    event["ranks"] = std::move(ranks);
  }
  if (r.simulated) event["simulated"] = true;
  if (r.bytes_to_device)
    event["traffic"] = {{"to_device_bytes", *r.bytes_to_device},
                        {"to_host_bytes", r.bytes_to_host.value_or(0)}};
  if (r.on_disk)
    event["traffic"] = {{"read_bytes", r.bytes_read},
                        {"written_bytes", r.bytes_written},
                        {"read_bytes_per_s", r.read_bytes_per_s},
                        {"written_bytes_per_s", r.written_bytes_per_s}};
  sink_.emit("memory", event);
}

void TrainerEventWriter::on_checkpoint(std::int64_t step, const std::filesystem::path& path) {
  sink_.emit("checkpoint", {{"step", step}, {"path", path.string()}});
}

void TrainerEventWriter::on_progress(const std::string& phase, std::int64_t done,
                                     std::int64_t total, std::optional<double> eta_seconds) {
  sink_.progress(phase, done, total, eta_seconds);
}

void TrainerEventWriter::on_log(const std::string& level, const std::string& message) {
  sink_.log(level, message);
}

void TrainerEventWriter::on_step_time(std::int64_t /*step*/, double seconds) {
  if (recorder_) recorder_->on_step_time(seconds);
}

}  // namespace tessera::runner
