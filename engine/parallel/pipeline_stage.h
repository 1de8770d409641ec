#pragma once
// A model cut into pipeline stages over a pipeline group (group rank = stage), by its family's
// pipeline plan (hf::FamilyTraits::pipeline_plan): each rank runs its stage's layers
// (model::PretrainedModel::stage), holds only their parameters, and passes activations forward
// and their gradients back to its neighbours point to point, in the 1F1B order
// (pipeline_schedule.h). A tied input embedding is held by the first stage (the embedding) and
// the last (the head); its gradient is the sum of both stages'.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/dropout.h"
#include "model/model.h"
#include "parallel/pipeline_schedule.h"

namespace tessera::dist {
class ProcessGroup;
}

namespace tessera::parallel {

class PipelineStages {
 public:
  // Balances the model's layers over the group's ranks (the cost of a layer is its parameters,
  // the head's is vocabulary × hidden, as matrix products cost by their weights) and sets
  // model.stage to this rank's. Throws tessera::Error (hf::check_pipeline_parallel) when the
  // model cannot be cut into that many stages.
  // `chunks` above 1: the interleaved schedule — the layers are cut into stages × chunks virtual
  // stages, this rank holding virtual stages stage, stage + stages, … (Megatron-LM's
  // interleaving; the bubble shrinks by the number of chunks, the sends grow by it).
  PipelineStages(model::PretrainedModel& model, dist::ProcessGroup& group, int chunks = 1);

  // The virtual stages' layers (chunk c of stage s is entry c · stages + s).
  const std::vector<StageLayers>& layout() const { return layout_; }
  int stage() const;
  int stages() const;
  int chunks() const { return chunks_; }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }
  dist::ProcessGroup& group() const { return *group_; }

  // Where a parameter or LoRA adapter (by name) runs: the stage of its layer (the first for the
  // embeddings, the last for the final norm and head).
  int owner(const std::string& name) const;
  // Whether this stage needs it: its owner, or (the tied embedding) the last stage too.
  bool holds(const std::string& name) const;
  // The tied embedding's name when the head reads it and there are several stages; else empty.
  const std::string& tied_embedding() const { return tied_; }

  // Frees the storage of the model's parameters this stage does not hold (they keep their
  // names, with no elements), so that each rank holds about 1 / stages of the model.
  void release_other_stages(model::PretrainedModel& model);

  // The step's micro-batches in the 1F1B order: forward of each on this stage (input_ids, mask
  // and labels from `inputs`, the hidden states from the previous stage), its activations sent
  // on; `backward(output, gradient, micro_batch)` runs the stage's backward — on the last stage
  // `output` is the loss and `gradient` undefined, elsewhere the gradient came from the next
  // stage — and the gradient of the stage's input goes back. Returns every micro-batch's loss
  // on every stage. `dropout[i]` is micro-batch i's stream. An interleaved stage runs each
  // micro-batch's backward once per chunk; the last backward of the step is micro-batch m − 1's
  // of chunk 0 in either schedule.
  using StageBackward = std::function<void(const torch::Tensor& output,
                                           const torch::Tensor& gradient, int micro_batch)>;
  // `activations`: the dtype and device the stages compute in (what they pass on).
  std::vector<double> run_one_f_one_b(model::PretrainedModel& model,
                                      const std::vector<model::ForwardInput>& inputs,
                                      const std::vector<model::DropoutStream>& dropout,
                                      const StageBackward& backward,
                                      const torch::TensorOptions& activations);
  // The loss of one batch through every stage, without gradients, on every stage.
  double forward_loss(model::PretrainedModel& model, const model::ForwardInput& input,
                      const torch::TensorOptions& activations);

  // Seconds of the last run_one_f_one_b this stage spent not computing (waiting for its
  // neighbours, and for the last stage to finish): the pipeline's bubble as this stage saw it.
  double last_idle_seconds() const { return idle_seconds_; }

  // Checkpoints and the export: tensors each held by some stages, made every stage's. For each
  // of `names`, in order, its owner broadcasts its tensor from `local` (this stage's, by name)
  // and the other stages receive it into `like(name)` (an empty tensor of its shape and dtype).
  // A name its owner does not have in `local` (an optimizer's state before the first step) is
  // left out on every stage. Every stage calls it with the same names. `keep_received` false:
  // this stage takes part but keeps only its own tensors (a checkpoint that another stage
  // writes), so it never holds the others' all at once.
  std::map<std::string, torch::Tensor> share(
      const std::vector<std::string>& names, const std::map<std::string, torch::Tensor>& local,
      const std::function<torch::Tensor(const std::string&)>& like,
      bool keep_received = true) const;

 private:
  // Points the model at chunk `chunk` of this stage's layers.
  void use_chunk(model::PretrainedModel& model, int chunk) const;

  dist::ProcessGroup* group_;
  int chunks_ = 1;
  std::vector<StageLayers> layout_;
  const model::PretrainedModel* model_;
  std::string tied_;
  double idle_seconds_ = 0.0;
};

}  // namespace tessera::parallel
