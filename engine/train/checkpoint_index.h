#pragma once
// Layout-free checkpoint state: every tensor of the training state is saved by name and element
// range, whatever layout held it. Each rank writes the ranges it holds to its own files and
// lists them in a part of the index (state_index-rank<r>.json); once every rank has written, rank
// 0 merges the parts into state_index.json (each tensor's shape, dtype and pieces: file, key,
// element offset and count; train/checkpoint.h's write_checkpoint calls it before the manifest).
// A run of any layout reads what it needs by assembling its ranges from the pieces: `single` and
// `ddp` whole tensors, `zero` on any number of ranks its shares (Plugin::state_slices()).
// The idea is torch.distributed.checkpoint's (shards + metadata, resharded at load); the format
// is ours. Checkpoints written before the index have no state_index.json: the trainer reads them
// as before.
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "train/checkpoint.h"

namespace tessera::train {

inline constexpr const char* kStateIndex = "state_index.json";
inline constexpr int kStateIndexFormat = 1;

// What one rank wrote, for the index.
class StateIndexPart {
 public:
  // `tensors` as written to `file` (in the checkpoint folder) under their names, in `group`
  // ("model" | "optimizer"); a tensor named in `slices` is that range of its whole tensor (flat),
  // any other is whole. Float tensors are recorded as float32, which is how they are written.
  void add(const std::string& group, const std::string& file,
           const std::vector<optim::NamedTensor>& tensors,
           const std::map<std::string, StateSlice>& slices = {});
  // Writes state_index-rank<rank>.json into `dir`, fsynced.
  void write(const std::filesystem::path& dir, int rank) const;

 private:
  nlohmann::json groups_ = nlohmann::json::object();
};

// Rank 0, once every rank of `world_size` has written its files and part: merges the parts into
// state_index.json (written atomically) and removes them. Throws tessera::Error (Internal) when
// the parts disagree on a tensor's shape or its pieces do not cover it exactly once.
void merge_state_index(const std::filesystem::path& dir, int world_size);

class StateIndex {
 public:
  // The index of checkpoint folder `dir`, or nullopt when it has none (an older checkpoint).
  // Throws tessera::Error (InvalidInput) naming the file when it is unreadable.
  static std::optional<StateIndex> open(const std::filesystem::path& dir);

  // Every tensor of `group`, read from the pieces that hold the wanted elements: for a name in
  // `slices` its range, flat (left out when the range is empty), for any other the whole tensor
  // in its shape. Float32 CPU tensors. Throws InvalidInput naming the checkpoint and tensor when a
  // range is not in the files or a slice's shape differs from the saved one.
  std::map<std::string, torch::Tensor> read(const std::string& group,
                                            const std::map<std::string, StateSlice>& slices) const;

 private:
  std::filesystem::path dir_;
  nlohmann::json index_;
};

}  // namespace tessera::train
