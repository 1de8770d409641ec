// The plan as `tessera-cli plan --json` and the studio read it (plan::to_json).
#include <algorithm>
#include <cstdint>

#include "plan/cost_terms.h"
#include "plan/planner.h"
#include "plan/strategy_costs.h"

namespace tessera::plan {

using cost::to_bytes;
using nlohmann::json;

json to_json(const Plan& p) {
  json tiers = json::array();
  for (const auto& t : p.tiers) {
    const auto& e = t.estimate;
    tiers.push_back({{"tier", t.tier},
                     {"device", t.device},
                     {"budget", t.budget},
                     {"simulated", t.simulated},
                     {"usable_after_headroom",
                      static_cast<std::uint64_t>(static_cast<double>(t.budget) * (1 - kHeadroom))},
                     {"headroom_fraction", kHeadroom},
                     // The disk tier holds its files; the host's floors do not apply to it.
                     {"peak", t.tier == "disk" ? e.training_peak() : e.peak()},
                     {"training_peak", e.training_peak()},
                     {"load_peak", e.load_peak},
                     {"export_peak", e.export_peak},
                     {"save_peak", e.save_peak},
                     {"by_category",
                      {{"weights", e.weights},
                       {"gradients", e.gradients},
                       {"gradient_buckets", e.gradient_buckets},
                       {"gathered_chunks", e.gathered_chunks},
                       {"optimizer", e.optimizer},
                       {"activations", e.activations},
                       {"runtime", e.runtime}}}});
  }
  const Settings& s = p.settings;
  json out = {
      {"fits", p.fits},
      {"strategy", p.strategy},
      {"settings",
       {{"method", s.method},
        {"lora_rank", s.method == "lora" ? json(s.lora_rank) : json(nullptr)},
        {"quantize", s.method == "lora" ? s.quantize : std::string("none")},
        {"double_quant", s.method == "lora" && s.quantize != "none" && s.double_quant},
        {"precision", s.precision},
        {"micro_batch", s.micro_batch},
        {"gradient_accumulation", s.gradient_accumulation},
        {"activation_checkpointing", s.activation_checkpointing},
        {"sequence_length", s.sequence_length},
        {"strategy", s.strategy},
        {"offload_optim_frac", s.offload_optim_frac},
        {"offload_param_frac", s.offload_param_frac},
        {"device_tier", s.device_tier},
        {"host_optim_frac", s.host_optim_frac},
        {"host_param_frac", s.host_param_frac},
        {"zero_offload", s.zero_offload},
        {"zero_stage",
         s.strategy == "zero" || s.strategy == "hybrid" ? json(s.zero_stage) : json(nullptr)},
        {"tp_size", s.tp_size},
        {"pp_size", s.pp_size},
        {"pp_chunks", s.pp_chunks},
        {"sequence_parallel", s.sequence_parallel}}},
      {"ranks",
       {{"processes", p.processes},
        {"on_this_machine", p.processes_per_node},
        {"host_usable", p.host_usable},
        {"per_rank", p.processes > 1}}},
      {"parameters",
       {{"total", p.total_parameters},
        {"checkpoint", p.checkpoint_parameters ? json(*p.checkpoint_parameters) : json(nullptr)},
        {"trainable", p.trainable_parameters}}},
      {"memory", tiers},
      {"time",
       {{"flops_per_step", p.flops_per_step},
        {"seconds_per_step", p.seconds_per_step},
        {"steps", p.total_steps ? json(*p.total_steps) : json(nullptr)},
        {"steps_source", p.steps_source},
        {"total_seconds", p.total_seconds() ? json(*p.total_seconds()) : json(nullptr)},
        {"evaluations", p.evaluations},
        {"evaluation_batches", p.evaluation_batches},
        {"seconds_per_evaluation", p.seconds_per_evaluation},
        {"modelled_seconds_per_step", p.modelled_seconds_per_step},
        {"warmup_seconds", p.warmup_seconds},
        {"source", p.time_source},
        {"calibrated", p.calibration.has_value()},
        {"calibration_run", p.calibration ? json(p.calibration->run) : json(nullptr)},
        {"calibration_exact",
         p.calibration ? json(same(p.calibration->key,
                                   StepTimeKey{p.calibration->key.device, p.calibration->key.model,
                                               p.settings, p.calibration->key.processes}))
                       : json(nullptr)},
        {"disk_bytes_per_step", p.disk_bytes_per_step},
        {"disk_read_bytes_per_step", p.disk_read_bytes_per_step},
        {"disk_write_bytes_per_step", p.disk_write_bytes_per_step},
        {"disk_gradient_read_ahead_bytes", p.disk_gradient_read_ahead_bytes},
        {"disk_seconds_per_step", p.disk_seconds_per_step},
        {"host_update_seconds_per_step", p.host_update_seconds_per_step},
        {"copy_seconds_per_step", p.copy_seconds_per_step},
        {"exposed_copy_seconds_per_step", p.exposed_copy_seconds_per_step},
        {"compute_seconds_per_step", p.compute_seconds_per_step},
        {"communication",
         {{"bytes_per_step", p.communication.bytes},
          {"gradient_bytes", p.communication.gradient_bytes},
          {"all_gather_bytes", p.communication.all_gather_bytes},
          {"calls", p.communication.calls},
          {"seconds_per_step", p.communication.seconds},
          {"link", p.link_source}}},
        {"rough", !p.calibration.has_value()}}},
      {"reasons", p.reasons},
      {"explanation", p.explanation}};
  if (p.hybrid) {
    json stages = json::array();
    for (const HybridStage& st : p.hybrid->stages) {
      const HybridStageMemory held = hybrid_stage_memory(st, s);
      stages.push_back(
          {{"stage", st.stage},
           {"layers", st.layers},
           {"layer_count", st.layer_count},
           {"parameters", st.parameters},
           {"trainable", st.trainable},
           {"micro_batches_held", st.micro_batches_held},
           {"by_category",
            {{"weights", to_bytes(held.weights)},
             {"gradients", to_bytes(held.gradients)},
             {"gradient_buckets", to_bytes(held.gradient_buckets)},
             {"optimizer", to_bytes(held.optimizer)},
             {"activations", to_bytes(held.activations)},
             {"runtime", kRuntimeBaselineBytes}}},
           {"training_peak", to_bytes(held.total()) + kRuntimeBaselineBytes},
           {"tensor_traffic", {{"ring_bytes", st.tensor_bytes}, {"calls", st.tensor_calls}}},
           {"pipeline_traffic", {{"send_bytes", st.pipeline_bytes}, {"sends", st.pipeline_sends}}},
           {"data_traffic", {{"ring_bytes", st.data_bytes}, {"calls", st.data_calls}}}});
    }
    out["ranks"]["hybrid"] = {{"tp_size", p.hybrid->tp},
                              {"pp_size", p.hybrid->pp},
                              {"dp_size", p.hybrid->dp},
                              {"zero_stage", s.zero_stage},
                              {"sequence_parallel", s.sequence_parallel},
                              {"pp_chunks", p.hybrid->chunks},
                              {"micro_batches", p.hybrid->micro_batches},
                              {"bubble", p.hybrid->bubble},
                              {"stages", stages}};
  }
  if (!p.what_would_fit.empty()) out["what_would_fit"] = p.what_would_fit;
  json alternatives = json::array();
  for (const auto& a : p.alternatives)
    alternatives.push_back({{"method", a.settings.method},
                            {"strategy", a.settings.strategy},
                            {"precision", a.settings.precision},
                            {"micro_batch", a.settings.micro_batch},
                            {"peak", a.peak},
                            {"seconds_per_step", a.seconds_per_step},
                            {"summary", a.summary}});
  out["alternatives"] = alternatives;
  json candidates = json::array();
  for (const auto& c : p.candidates)
    candidates.push_back(
        {{"strategy", c.settings.strategy},
         {"zero_stage", c.settings.strategy == "zero" || c.settings.strategy == "hybrid"
                            ? json(c.settings.zero_stage)
                            : json(nullptr)},
         {"tp_size", c.settings.tp_size},
         {"pp_size", c.settings.pp_size},
         {"pp_chunks", c.settings.pp_chunks},
         {"sequence_parallel", c.settings.sequence_parallel},
         {"layout", strategy_phrase(c.settings)},
         {"family", c.family},
         {"chosen", c.chosen},
         {"fits", c.fits},
         {"micro_batch", c.settings.micro_batch},
         {"gradient_accumulation", c.settings.gradient_accumulation},
         {"activation_checkpointing", c.settings.activation_checkpointing},
         {"precision", c.settings.precision},
         {"peak_per_rank", c.peak},
         {"peak_when", c.peak_when},
         {"by_category",
          {{"weights", c.weights},
           {"gradients", c.gradients},
           {"optimizer", c.optimizer},
           {"activations", c.activations}}},
         {"seconds_per_step", c.seconds_per_step},
         {"communication_seconds_per_step", c.communication_seconds},
         {"bubble", c.bubble},
         {"summary", c.summary}});
  out["strategies"] = candidates;
  return out;
}

}  // namespace tessera::plan
