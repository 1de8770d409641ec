#pragma once
// Crash-safe checkpoint folders. A checkpoint is written as
//   <run>/checkpoint-<step>.tmp-<random>/   every file written and fsynced
//   …/manifest.json                         last: each file's name, size and XXH3-128 checksum
//                                           (core/checksum.h; older manifests: "fnv1a64")
//   rename → <run>/checkpoint-<step>, fsync <run>
// so a kill -9 at any moment leaves either a temporary folder (ignored, removed by the next
// save) or a complete checkpoint. Older checkpoints are deleted only after the new one is in
// place. Resume picks the newest checkpoint whose manifest is present, parses, and matches
// every file's size and checksum; a torn one is skipped with a log message.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tessera::train {

inline constexpr int kCheckpointFormat = 1;

// A range of a tensor's elements: [offset, offset + numel) of the row-major flattening of a
// tensor of `shape`. What a rank holds of a sharded tensor (train/plugin.h state_slices()).
struct StateSlice {
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

// The step of a complete checkpoint folder's name "checkpoint-<digits>", or nullopt (temporary
// and other folders).
std::optional<std::int64_t> checkpoint_step(const std::string& folder_name);

// The processes of a job that write one checkpoint together. One process: the defaults (no
// collective). Several: every rank calls write_checkpoint() with the same step, and the two
// collectives below run on the job's group (the trainer makes them).
struct CheckpointRanks {
  int rank = 0;
  int world_size = 1;
  // Rank 0's `value` on every rank (a broadcast).
  std::function<std::string(const std::string& value)> from_rank0;
  // Every rank's `ok`, in rank order, once every rank has called it (an all-gather, so a
  // barrier too).
  std::function<std::vector<bool>(bool ok)> all_ok;
};

// Rank 0 creates the temporary folder and tells the others its name; every rank lets
// `write_files` fill it with its own files (each fsynced, e.g. via core::write_file_atomic /
// hf::write_safetensors; names distinct across ranks); once every rank has written (a barrier),
// rank 0 runs `before_manifest` (when given: the layout-free state index is merged there,
// train/checkpoint_index.h), writes manifest.json (every rank's files, `extra` merged in) last and
// renames the folder into place, and every rank returns the final path after that. A rank that
// fails makes every rank throw (naming it), and no one else renames or removes a save in progress.
std::filesystem::path write_checkpoint(
    const std::filesystem::path& run_dir, std::int64_t step,
    const std::function<void(const std::filesystem::path& tmp_dir)>& write_files,
    const nlohmann::json& extra = nlohmann::json::object(), const CheckpointRanks& ranks = {},
    const std::function<void(const std::filesystem::path& tmp_dir)>& before_manifest = {});

// Deletes complete checkpoints beyond the newest `keep_last` (keep_last <= 0 keeps all) and
// leftover temporary folders. Never deletes `keep`. In a job of several processes rank 0 alone
// calls it, after write_checkpoint() returned (no save is in progress then).
void prune_checkpoints(const std::filesystem::path& run_dir, std::int64_t keep_last,
                       const std::filesystem::path& keep);

// Checks a checkpoint folder against its manifest. Returns an empty string when valid, else
// why not; on success fills `manifest`.
std::string validate_checkpoint(const std::filesystem::path& dir, nlohmann::json* manifest);

struct FoundCheckpoint {
  std::filesystem::path path;
  std::int64_t step = 0;
  nlohmann::json manifest;
};

// `dir` is a checkpoint folder itself (has manifest.json) or a run folder holding
// checkpoint-<step> folders: the newest valid one. `log` receives a message per skipped
// folder. Throws tessera::Error (InvalidInput) naming `dir` when none is valid.
FoundCheckpoint find_resume_checkpoint(const std::filesystem::path& dir,
                                       const std::function<void(const std::string&)>& log);

}  // namespace tessera::train
