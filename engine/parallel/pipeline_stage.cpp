#include "parallel/pipeline_stage.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"
#include "dist/parallel_context.h"
#include "hf/families.h"
#include "parallel/tensor_parallel.h"

namespace tessera::parallel {
namespace {

// Point-to-point tags within one step, named by the virtual stage that receives: micro-batch m's
// activations into it, and the gradient of its output coming back to it.
int activation_tag(int receiver, int micro_batches, int micro_batch) {
  return 2 * (receiver * micro_batches + micro_batch);
}
int gradient_tag(int receiver, int micro_batches, int micro_batch) {
  return 2 * (receiver * micro_batches + micro_batch) + 1;
}
constexpr int kEvaluationTag = 1 << 24;

// What a stage boundary carries: [B, T, hidden], or under the model's sequence parallelism
// (split_model's SequenceShards) each tensor rank's block of the positions (the last one padded).
std::vector<std::int64_t> hidden_shape(const model::PretrainedModel& model,
                                       const model::ForwardInput& input) {
  const std::int64_t positions = input.input_ids.size(1);
  const model::SequenceShards& shards = model.sequence_shards;
  return {
      input.input_ids.size(0),
      shards.enter ? sequence_block_length(positions, static_cast<int>(shards.parts)) : positions,
      model.config().hidden_size};
}

}  // namespace

PipelineStages::PipelineStages(model::PretrainedModel& model, dist::ProcessGroup& group, int chunks)
    : group_(&group), chunks_(std::max(1, chunks)), model_(&model) {
  const hf::ModelConfig& config = model.config();
  hf::check_pipeline_parallel(config, group.size() * chunks_);
  const hf::FamilyTraits& family = hf::family_of(config);
  // Matrix products cost by their weights: a layer by its parameters, the head by its
  // vocabulary × hidden (tied or not); the embeddings are lookups.
  std::vector<double> layer_costs(static_cast<std::size_t>(config.num_hidden_layers), 0.0);
  for (const auto& item : model.named_parameters()) {
    const std::int64_t layer = hf::pipeline_layer_of(family, config, item.key());
    if (layer >= 0 && layer < config.num_hidden_layers)
      layer_costs[static_cast<std::size_t>(layer)] += static_cast<double>(item.value().numel());
  }
  const double head_cost =
      static_cast<double>(config.vocab_size) * static_cast<double>(config.hidden_size);
  layout_ = balance_stages(layer_costs, 0.0, head_cost, group.size() * chunks_);
  use_chunk(model, 0);
  if (config.tie_word_embeddings && group.size() > 1) {
    for (const auto& item : model.named_parameters())
      if (hf::pipeline_layer_of(family, config, item.key()) < 0 &&
          item.key().find(family.pipeline_plan.tied_embedding + ".") != std::string::npos &&
          item.key().ends_with(".weight"))
        tied_ = item.key();
  }
}

int PipelineStages::stage() const {
  return group_->rank();
}
int PipelineStages::stages() const {
  return group_->size();
}

void PipelineStages::use_chunk(model::PretrainedModel& model, int chunk) const {
  const StageLayers& range = layout_[static_cast<std::size_t>(chunk * stages() + stage())];
  model.stage = {range.first, range.end};
}

int PipelineStages::owner(const std::string& name) const {
  const hf::ModelConfig& config = model_->config();
  const std::int64_t layer = hf::pipeline_layer_of(hf::family_of(config), config, name);
  if (layer < 0) return 0;
  if (layer >= config.num_hidden_layers) return stages() - 1;
  // Virtual stage g (chunk g / stages) is stage g % stages's.
  for (std::size_t g = 0; g < layout_.size(); ++g)
    if (layer >= layout_[g].first && layer < layout_[g].end) return static_cast<int>(g) % stages();
  throw Error(ErrorKind::Internal, "pipeline: layer " + std::to_string(layer) + " has no stage");
}

bool PipelineStages::holds(const std::string& name) const {
  return owner(name) == stage() || (last() && !tied_.empty() && name == tied_);
}

void PipelineStages::release_other_stages(model::PretrainedModel& model) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters())
    if (!holds(item.key())) item.value().set_data(torch::empty({0}, item.value().options()));
}

std::vector<double> PipelineStages::run_one_f_one_b(
    model::PretrainedModel& model, const std::vector<model::ForwardInput>& inputs,
    const std::vector<model::DropoutStream>& dropout, const StageBackward& backward,
    const torch::TensorOptions& activations) {
  const int micro_batches = static_cast<int>(inputs.size());
  const int virtual_stages = stages() * chunks_;
  // Per (chunk, micro-batch): the received input (needing its gradient) and the output.
  const auto slot = [&](int chunk, int m) {
    return static_cast<std::size_t>(chunk * micro_batches + m);
  };
  std::vector<torch::Tensor> stage_inputs(inputs.size() * static_cast<std::size_t>(chunks_));
  std::vector<torch::Tensor> outputs(stage_inputs.size());
  // The last stage's losses, read back once after the schedule (on a GPU a read per micro-batch
  // would drain the queue between its forward and the next action).
  std::vector<torch::Tensor> loss_values(inputs.size());
  std::vector<dist::PendingCollective> sends;
  // The stage's idle time is the schedule's time less its own forwards and backwards (waits
  // for its neighbours, and at the end for the slowest stage: the losses' all-reduce ends the
  // schedule at the same moment on every stage).
  using Clock = std::chrono::steady_clock;
  const Clock::time_point schedule_start = Clock::now();
  double busy = 0.0;
  const auto timed = [&busy](const auto& work) {
    const Clock::time_point start = Clock::now();
    work();
    busy += std::chrono::duration<double>(Clock::now() - start).count();
  };
  const std::vector<PipelineAction> actions =
      interleaved_one_f_one_b(stage(), stages(), chunks_, micro_batches);
  // Each action's receive is posted kReceivesAhead actions before it runs: Gloo moves a message
  // only once its receive is posted, so a receive posted when the action starts puts the whole
  // transfer (and a round trip) on the critical path, where one posted ahead overlaps the
  // compute before it. Forward receives activations from the previous virtual stage, backward
  // the gradient of its output from the next; both are boundary-shaped.
  constexpr std::size_t kReceivesAhead = 2;
  struct Receive {
    torch::Tensor into;
    dist::PendingCollective pending;
  };
  std::vector<std::optional<Receive>> receives(actions.size());
  const auto post_receive = [&](std::size_t i) {
    if (i >= actions.size() || receives[i]) return;
    const PipelineAction& action = actions[i];
    const int g = action.chunk * stages() + stage();
    const bool forward = action.kind == PipelineAction::Forward;
    if (forward ? g == 0 : g == virtual_stages - 1) return;  // nothing comes in
    const int from = forward ? (g - 1 + stages()) % stages() : (g + 1) % stages();
    const int tag = forward ? activation_tag(g, micro_batches, action.micro_batch)
                            : gradient_tag(g, micro_batches, action.micro_batch);
    torch::Tensor into = torch::empty(
        hidden_shape(model, inputs[static_cast<std::size_t>(action.micro_batch)]), activations);
    dist::PendingCollective pending = group_->recv(into, from, tag);
    receives[i] = Receive{std::move(into), std::move(pending)};
  };
  const auto received = [&](std::size_t i) {
    post_receive(i);
    Receive& r = *receives[i];
    r.pending.wait();
    torch::Tensor into = std::move(r.into);
    receives[i].reset();
    return into;
  };
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& action = actions[i];
    for (std::size_t ahead = 1; ahead <= kReceivesAhead; ++ahead) post_receive(i + ahead);
    const int m = action.micro_batch;
    const auto mu = static_cast<std::size_t>(m);
    const std::size_t at = slot(action.chunk, m);
    // This chunk's place in the whole pipeline, and its neighbours' stages.
    const int g = action.chunk * stages() + stage();
    const int previous = (g - 1 + stages()) % stages(), next = (g + 1) % stages();
    const bool first_virtual = g == 0, last_virtual = g == virtual_stages - 1;
    if (action.kind == PipelineAction::Forward) {
      model::ForwardInput input = inputs[mu];
      if (!first_virtual) {
        torch::Tensor stage_input = received(i);
        stage_input.set_requires_grad(true);
        input.stage_input = stage_inputs[at] = stage_input;
      }
      model::ForwardOutput out;
      timed([&] {
        use_chunk(model, action.chunk);
        model::DropoutScope scope(dropout[mu]);
        out = model.forward(input);
      });
      if (last_virtual) {
        if (!out.loss.defined())
          throw_invalid("pipeline: the last stage computed no loss",
                        "pipeline parallelism trains causal language models with labels");
        outputs[at] = out.loss;
        loss_values[mu] = out.loss.detach();
      } else {
        outputs[at] = out.hidden_states;
        sends.push_back(group_->send(out.hidden_states.detach().contiguous(), next,
                                     activation_tag(g + 1, micro_batches, m)));
      }
    } else {
      torch::Tensor gradient;
      if (!last_virtual) gradient = received(i);
      timed([&] { backward(outputs[at], gradient, m); });
      if (!first_virtual) {
        const torch::Tensor& sent = stage_inputs[at].grad();
        if (!sent.defined())
          throw Error(ErrorKind::Internal,
                      "pipeline: stage " + std::to_string(stage()) + "'s input got no gradient");
        sends.push_back(
            group_->send(sent.contiguous(), previous, gradient_tag(g - 1, micro_batches, m)));
      }
      outputs[at] = torch::Tensor();
      stage_inputs[at] = torch::Tensor();
    }
  }
  for (dist::PendingCollective& send : sends) send.wait();
  // The losses are the last stage's (the others add zeros); every stage reports them.
  torch::Tensor shared = torch::zeros({micro_batches}, torch::kFloat64);
  if (std::all_of(loss_values.begin(), loss_values.end(),
                  [](const torch::Tensor& t) { return t.defined(); }))
    shared = torch::stack(loss_values).to(torch::kCPU, torch::kFloat64).reshape({micro_batches});
  group_->all_reduce(shared);
  idle_seconds_ =
      std::max(0.0, std::chrono::duration<double>(Clock::now() - schedule_start).count() - busy);
  return std::vector<double>(shared.data_ptr<double>(), shared.data_ptr<double>() + shared.numel());
}

double PipelineStages::forward_loss(model::PretrainedModel& model, const model::ForwardInput& input,
                                    const torch::TensorOptions& activations) {
  const int virtual_stages = stages() * chunks_;
  torch::Tensor loss = torch::zeros({1}, torch::kFloat64);
  // The batch through every virtual stage in order; this stage runs its chunks.
  for (int g = stage(); g < virtual_stages; g += stages()) {
    model::ForwardInput in = input;
    if (g > 0) {
      in.stage_input = torch::empty(hidden_shape(model, input), activations);
      group_->recv(in.stage_input, (g - 1) % stages(), kEvaluationTag + g).wait();
    }
    use_chunk(model, g / stages());
    const model::ForwardOutput out = model.forward(in);
    if (g == virtual_stages - 1)
      loss.fill_(out.loss.detach().to(torch::kFloat64).item<double>());
    else
      group_
          ->send(out.hidden_states.detach().contiguous(), (g + 1) % stages(),
                 kEvaluationTag + g + 1)
          .wait();
  }
  group_->broadcast(loss, stages() - 1);
  return loss.item<double>();
}

std::map<std::string, torch::Tensor> PipelineStages::share(
    const std::vector<std::string>& names, const std::map<std::string, torch::Tensor>& local,
    const std::function<torch::Tensor(const std::string&)>& like, bool keep_received) const {
  // Which names their owners have, agreed on by every stage in one collective.
  torch::Tensor present = torch::zeros({static_cast<std::int64_t>(names.size())}, torch::kInt32);
  for (std::size_t i = 0; i < names.size(); ++i)
    if (owner(names[i]) == stage() && local.count(names[i]))
      present[static_cast<std::int64_t>(i)] = 1;
  group_->all_reduce(present);
  std::map<std::string, torch::Tensor> all;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (present[static_cast<std::int64_t>(i)].item<int>() == 0) continue;
    const int from = owner(names[i]);
    torch::Tensor tensor =
        from == stage() ? local.at(names[i]).contiguous() : like(names[i]).contiguous();
    group_->broadcast(tensor, from);
    if (from == stage() || keep_received) all[names[i]] = tensor;
  }
  return all;
}

}  // namespace tessera::parallel
