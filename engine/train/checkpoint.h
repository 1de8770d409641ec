#pragma once
// Crash-safe checkpoint folders. A checkpoint is written as
//   <run>/checkpoint-<step>.tmp-<random>/   every file written and fsynced
//   …/manifest.json                         last: each file's name, size and FNV-1a 64 checksum
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

namespace tessera::train {

inline constexpr int kCheckpointFormat = 1;

// FNV-1a 64 of a file's bytes, as 16 hex digits.
std::string file_checksum(const std::filesystem::path& file);

// Creates the temporary folder, lets `write_files` fill it (every file it writes must be
// fsynced, e.g. via core::write_file_atomic / hf::write_safetensors), writes manifest.json
// (with `extra` merged in) last, and renames the folder into place. Returns the final path.
std::filesystem::path write_checkpoint(
    const std::filesystem::path& run_dir, std::int64_t step,
    const std::function<void(const std::filesystem::path& tmp_dir)>& write_files,
    const nlohmann::json& extra = nlohmann::json::object());

// Deletes complete checkpoints beyond the newest `keep_last` (keep_last <= 0 keeps all) and
// leftover temporary folders. Never deletes `keep`.
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
