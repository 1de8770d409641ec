#pragma once
// Ranks laid out on a mesh (data × pipeline × tensor, …): which ranks form a group along one
// dimension. Row-major like torch's DeviceMesh: the last dimension varies fastest, so with shape
// {2, 2} ranks {0, 1} and {2, 3} are the groups along dimension 1, {0, 2} and {1, 3} along 0.
// Torch-free.
#include <vector>

namespace tessera::dist {

// Every group along `dim`, each listing its global ranks in increasing order; the groups
// partition 0 .. product(shape)-1. Throws tessera::Error (InvalidInput) for an empty shape, a
// dimension not above 0 or `dim` out of range.
std::vector<std::vector<int>> mesh_groups(const std::vector<int>& shape, int dim);

}  // namespace tessera::dist
