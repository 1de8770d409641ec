#include "train/checkpoint_index.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/files.h"
#include "train/lora.h"

namespace tessera::train {
namespace fs = std::filesystem;

namespace {

std::string part_name(int rank) {
  return "state_index-rank" + std::to_string(rank) + ".json";
}

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

}  // namespace

void StateIndexPart::add(const std::string& group, const std::string& file,
                         const std::vector<optim::NamedTensor>& tensors,
                         const std::map<std::string, StateSlice>& slices) {
  for (const optim::NamedTensor& t : tensors) {
    std::vector<std::int64_t> shape(t.tensor.sizes().begin(), t.tensor.sizes().end());
    std::int64_t offset = 0;
    if (const auto it = slices.find(t.name); it != slices.end()) {
      if (it->second.numel != t.tensor.numel())
        throw Error(ErrorKind::Internal,
                    "checkpoint: \"" + t.name + "\" holds " + std::to_string(t.tensor.numel()) +
                        " elements, its slice says " + std::to_string(it->second.numel));
      shape = it->second.shape;
      offset = it->second.offset;
    }
    nlohmann::json& entry = groups_[group][t.name];
    entry["shape"] = shape;
    entry["dtype"] = "F32";
    entry["pieces"].push_back(
        {{"file", file}, {"key", t.name}, {"offset", offset}, {"numel", t.tensor.numel()}});
  }
}

void StateIndexPart::write(const fs::path& dir, int rank) const {
  core::write_file_atomic(dir / part_name(rank), nlohmann::json{{"groups", groups_}}.dump() + "\n");
}

void merge_state_index(const fs::path& dir, int world_size) {
  nlohmann::json groups = nlohmann::json::object();
  for (int rank = 0; rank < world_size; ++rank) {
    const fs::path part = dir / part_name(rank);
    const nlohmann::json parsed = nlohmann::json::parse(core::read_text_file(part));
    for (const auto& [group, tensors] : parsed.at("groups").items()) {
      for (const auto& [name, entry] : tensors.items()) {
        nlohmann::json& merged = groups[group][name];
        if (merged.is_null()) {
          merged = entry;
          continue;
        }
        if (merged.at("shape") != entry.at("shape"))
          throw Error(ErrorKind::Internal, "checkpoint: rank " + std::to_string(rank) +
                                               " saved \"" + name + "\" with shape " +
                                               entry.at("shape").dump() + ", another rank " +
                                               merged.at("shape").dump());
        for (const auto& piece : entry.at("pieces")) merged["pieces"].push_back(piece);
      }
    }
  }
  // Every tensor covered exactly once: pieces sorted by offset, end to end.
  for (auto& [group, tensors] : groups.items()) {
    for (auto& [name, entry] : tensors.items()) {
      auto& pieces = entry["pieces"];
      std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) {
        return a.at("offset").template get<std::int64_t>() <
               b.at("offset").template get<std::int64_t>();
      });
      std::int64_t next = 0;
      for (const auto& piece : pieces) {
        if (piece.at("offset").get<std::int64_t>() != next)
          throw Error(ErrorKind::Internal, "checkpoint: the saved pieces of \"" + name +
                                               "\" leave a gap or overlap at element " +
                                               std::to_string(next));
        next += piece.at("numel").get<std::int64_t>();
      }
      const std::int64_t expected = numel_of(entry.at("shape").get<std::vector<std::int64_t>>());
      if (next != expected)
        throw Error(ErrorKind::Internal, "checkpoint: the saved pieces of \"" + name + "\" hold " +
                                             std::to_string(next) + " of its " +
                                             std::to_string(expected) + " elements");
    }
  }
  core::write_file_atomic(
      dir / kStateIndex,
      nlohmann::json{{"format", kStateIndexFormat}, {"groups", groups}}.dump(1) + "\n");
  for (int rank = 0; rank < world_size; ++rank) fs::remove(dir / part_name(rank));
  core::fsync_directory(dir);
}

std::optional<StateIndex> StateIndex::open(const fs::path& dir) {
  const fs::path path = dir / kStateIndex;
  if (!fs::exists(path)) return std::nullopt;
  StateIndex index;
  index.dir_ = dir;
  try {
    index.index_ = nlohmann::json::parse(core::read_text_file(path));
    if (index.index_.at("format").get<int>() != kStateIndexFormat)
      throw_invalid(path.string() + ": unknown format " + index.index_.at("format").dump(),
                    "resume with the Tessera version that wrote the checkpoint");
    index.index_.at("groups").get<nlohmann::json::object_t>();
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(path.string() + " is invalid: " + e.what());
  }
  return index;
}

std::map<std::string, torch::Tensor> StateIndex::read(
    const std::string& group, const std::map<std::string, StateSlice>& slices) const {
  std::map<std::string, torch::Tensor> out;
  const auto groups = index_.at("groups");
  if (!groups.contains(group)) return out;
  std::map<std::string, std::map<std::string, torch::Tensor>> files;  // read once each
  auto tensor_in = [&](const std::string& file, const std::string& key) -> const torch::Tensor& {
    if (file.empty() || file.find('/') != std::string::npos || file == "..")
      throw_invalid((dir_ / kStateIndex).string() + ": invalid file name \"" + file + "\"");
    auto it = files.find(file);
    if (it == files.end()) it = files.emplace(file, read_safetensors_tensors(dir_ / file)).first;
    const auto found = it->second.find(key);
    if (found == it->second.end())
      throw_invalid((dir_ / file).string() + " has no tensor \"" + key + "\"",
                    "the checkpoint is damaged; resume from an earlier one");
    return found->second;
  };
  torch::NoGradGuard no_grad;
  for (const auto& [name, entry] : groups.at(group).items()) {
    const auto shape = entry.at("shape").get<std::vector<std::int64_t>>();
    const std::int64_t whole = numel_of(shape);
    std::int64_t begin = 0, count = whole;
    const auto slice = slices.find(name);
    if (slice != slices.end()) {
      if (slice->second.shape != shape)
        throw_invalid(dir_.string() + ": \"" + name + "\" was saved with shape " +
                          c10::str(c10::IntArrayRef(shape)) + ", this run has " +
                          c10::str(c10::IntArrayRef(slice->second.shape)),
                      kResumeSameTraining);
      begin = slice->second.offset;
      count = slice->second.numel;
      if (count == 0) continue;
    }
    torch::Tensor value = torch::empty({count}, torch::kFloat32);
    std::int64_t filled = 0;
    for (const auto& piece : entry.at("pieces")) {
      const std::int64_t offset = piece.at("offset").get<std::int64_t>();
      const std::int64_t numel = piece.at("numel").get<std::int64_t>();
      const std::int64_t lo = std::max(begin, offset);
      const std::int64_t hi = std::min(begin + count, offset + numel);
      if (lo >= hi) continue;
      const torch::Tensor& stored =
          tensor_in(piece.at("file").get<std::string>(), piece.at("key").get<std::string>());
      if (stored.numel() != numel)
        throw_invalid((dir_ / piece.at("file").get<std::string>()).string() + ": \"" +
                          piece.at("key").get<std::string>() + "\" has " +
                          std::to_string(stored.numel()) + " elements, the index says " +
                          std::to_string(numel),
                      "the checkpoint is damaged; resume from an earlier one");
      value.narrow(0, lo - begin, hi - lo)
          .copy_(stored.reshape(-1).narrow(0, lo - offset, hi - lo));
      filled += hi - lo;
    }
    if (filled != count)
      throw_invalid(dir_.string() + ": elements " + std::to_string(begin) + " to " +
                        std::to_string(begin + count) + " of \"" + name + "\" are not all saved",
                    "the checkpoint is damaged; resume from an earlier one");
    out[name] = slice != slices.end() ? value : value.view(shape);
  }
  return out;
}

}  // namespace tessera::train
