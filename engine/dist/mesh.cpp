#include "dist/mesh.h"

#include <string>

#include "core/error.h"

namespace tessera::dist {

std::vector<std::vector<int>> mesh_groups(const std::vector<int>& shape, int dim) {
  if (shape.empty()) throw_invalid("a process mesh needs at least one dimension");
  if (dim < 0 || dim >= static_cast<int>(shape.size())) {
    throw_invalid("mesh dimension " + std::to_string(dim) + " is out of range for a mesh of " +
                  std::to_string(shape.size()) + " dimensions");
  }
  long long world = 1;
  for (int extent : shape) {
    if (extent < 1)
      throw_invalid("a process mesh dimension must be 1 or more, not " + std::to_string(extent));
    world *= extent;
  }
  // stride of `dim` in the row-major layout: the product of the dimensions after it.
  long long stride = 1;
  for (std::size_t later = static_cast<std::size_t>(dim) + 1; later < shape.size(); ++later) {
    stride *= shape[later];
  }
  const long long extent = shape[static_cast<std::size_t>(dim)];
  std::vector<std::vector<int>> groups;
  for (long long first = 0; first < world; ++first) {
    if ((first / stride) % extent != 0) continue;  // not the group's first rank
    std::vector<int> group;
    for (long long step = 0; step < extent; ++step) {
      group.push_back(static_cast<int>(first + step * stride));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace tessera::dist
