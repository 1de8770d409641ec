#pragma once
// A model's weights split over a tensor-parallel group by its family's plan
// (hf::FamilyTraits::tensor_parallel_plan): each planned module's parameters replaced by this
// rank's block and its computation swapped for the parallel one (tensor_parallel.h), so that the
// model's forward and backward compute what the whole model computes, each rank holding 1 / size
// of the split weights. The attention computes with the heads its projections give it.
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::dist {
class ProcessGroup;
}
namespace tessera::model {
class PretrainedModel;
}

namespace tessera::parallel {

// A parameter of a split model: the dimension its block is cut along (-1: whole on every rank)
// and its whole shape.
struct SplitParameter {
  std::string name;  // as named_parameters() gives it
  std::int64_t dim = -1;
  std::vector<std::int64_t> whole_shape;
};

// Every parameter of `model` in named_parameters() order. Throws tessera::Error: Unsupported
// when the family has no plan; InvalidInput naming the config field, its value and the sizes that
// would divide every planned field when the group's size does not divide one.
std::vector<SplitParameter> split_model(model::PretrainedModel& model, dist::ProcessGroup& group);

}  // namespace tessera::parallel
