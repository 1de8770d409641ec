#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <random>
#include <vector>

#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"

namespace tessera::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kPrefix = "checkpoint-";

bool is_temporary(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 &&
         (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos);
}

std::string random_suffix() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), static_cast<unsigned>(::getpid()));
  return buf;
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

}  // namespace

std::optional<std::int64_t> checkpoint_step(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::char_traits<char>::length(kPrefix));
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

namespace {

// Lists every file of `tmp` with its size and checksum in manifest.json (with `extra`), last.
void write_manifest(const fs::path& tmp, std::int64_t step, const nlohmann::json& extra) {
  nlohmann::json manifest = extra;
  manifest["format"] = kCheckpointFormat;
  manifest["step"] = step;
  manifest["checksum"] = std::string(core::kXxh3Field);
  nlohmann::json files = nlohmann::json::array();
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(tmp)) entries.push_back(e.path());
  std::sort(entries.begin(), entries.end());
  for (const fs::path& p : entries) {
    if (!fs::is_regular_file(p))
      throw Error(ErrorKind::Internal, p.string() + ": checkpoints hold only files");
    files.push_back({{"name", p.filename().string()},
                     {"size", static_cast<std::uint64_t>(fs::file_size(p))},
                     {std::string(core::kXxh3Field), core::xxh3_128_file(p)}});
  }
  manifest["files"] = files;
  core::write_file_atomic(tmp / kManifest, manifest.dump(2) + "\n");
  core::fsync_directory(tmp);
}

// Renames the complete `tmp` to `final_path` (displacing an older save of the same step).
void commit(const fs::path& run_dir, const fs::path& tmp, const fs::path& final_path,
            const std::string& name) {
  std::error_code ec;
  fs::path displaced;
  if (fs::exists(final_path)) {  // re-saving a step (e.g. after a resume): swap atomically-ish
    displaced = run_dir / (name + ".old-" + random_suffix());
    fs::rename(final_path, displaced, ec);
    if (ec)
      throw_io(final_path.string() + ": cannot move the old checkpoint away: " + ec.message());
  }
  fs::rename(tmp, final_path, ec);
  if (ec)
    throw_io(tmp.string() + ": cannot rename to " + final_path.string() + ": " + ec.message());
  core::fsync_directory(run_dir);
  if (!displaced.empty()) remove_quietly(displaced);
}

// Every rank's `ok` (one process: its own), then throws on every rank when one failed: a failed
// rank rethrows its own error, the others name the first failed rank.
void agree(const CheckpointRanks& ranks, const std::exception_ptr& error, const std::string& what,
           const std::function<void()>& on_failure) {
  std::vector<bool> oks{!error};
  if (ranks.world_size > 1) oks = ranks.all_ok(!error);
  const auto failed = std::find(oks.begin(), oks.end(), false);
  if (failed == oks.end()) return;
  if (on_failure) on_failure();
  if (error) std::rethrow_exception(error);
  throw_io("rank " + std::to_string(failed - oks.begin()) + " failed to " + what,
           "that rank's error (its log, prefixed [rank N] by tessera-cli launch) says why");
}

}  // namespace

fs::path write_checkpoint(const fs::path& run_dir, std::int64_t step,
                          const std::function<void(const fs::path&)>& write_files,
                          const nlohmann::json& extra, const CheckpointRanks& ranks,
                          const std::function<void(const fs::path&)>& before_manifest) {
  const bool distributed = ranks.world_size > 1;
  const bool leader = ranks.rank == 0;
  const std::string name = kPrefix + std::to_string(step);
  fs::path tmp;
  if (leader) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) {
      if (distributed) ranks.from_rank0("");
      throw_io(run_dir.string() + ": cannot create the run folder: " + ec.message());
    }
    tmp = run_dir / (name + ".tmp-" + random_suffix());
    if (!fs::create_directory(tmp, ec) || ec) {
      if (distributed) ranks.from_rank0("");
      throw_io(tmp.string() + ": cannot create a temporary checkpoint folder: " + ec.message(),
               "check free space and permissions of " + run_dir.string());
    }
  }
  if (distributed) {
    tmp = ranks.from_rank0(leader ? tmp.filename().string() : std::string());
    if (tmp.empty())
      throw_io("rank 0 could not create the folder of " + name + " in " + run_dir.string(),
               "rank 0's error says why");
    tmp = run_dir / tmp;
  }
  const auto remove_tmp = [&] {
    if (leader) remove_quietly(tmp);
  };
  std::exception_ptr error;
  try {
    write_files(tmp);
  } catch (...) {
    error = std::current_exception();
  }
  agree(ranks, error, "write its part of " + name, remove_tmp);
  // Every rank's files are in place: rank 0 alone lists them, commits and (the caller) prunes.
  const fs::path final_path = run_dir / name;
  if (leader) {
    try {
      if (before_manifest) before_manifest(tmp);
      write_manifest(tmp, step, extra);
      commit(run_dir, tmp, final_path, name);
    } catch (...) {
      error = std::current_exception();
    }
  }
  agree(ranks, error, "commit " + name, remove_tmp);
  return final_path;
}

void prune_checkpoints(const fs::path& run_dir, std::int64_t keep_last, const fs::path& keep) {
  std::vector<std::pair<std::int64_t, fs::path>> complete;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    if (is_temporary(name)) {
      remove_quietly(e.path());
    } else if (auto step = checkpoint_step(name)) {
      if (fs::exists(e.path() / kManifest)) complete.emplace_back(*step, e.path());
    }
  }
  if (keep_last <= 0) return;
  std::sort(complete.rbegin(), complete.rend());
  for (std::size_t i = static_cast<std::size_t>(keep_last); i < complete.size(); ++i)
    if (fs::weakly_canonical(complete[i].second) != fs::weakly_canonical(keep))
      remove_quietly(complete[i].second);
  core::fsync_directory(run_dir);
}

std::string validate_checkpoint(const fs::path& dir, nlohmann::json* manifest_out) {
  const fs::path manifest_path = dir / kManifest;
  if (!fs::is_regular_file(manifest_path)) return "no manifest.json (incomplete save)";
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(core::read_text_file(manifest_path));
    if (manifest.at("format").get<int>() != kCheckpointFormat)
      return "manifest.json: unknown format " + manifest.at("format").dump();
    for (const auto& f : manifest.at("files")) {
      const std::string name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        return "manifest.json: invalid file name \"" + name + "\"";
      const fs::path p = dir / name;
      if (!fs::is_regular_file(p)) return name + " is missing";
      if (fs::file_size(p) != f.at("size").get<std::uint64_t>())
        return name + " has " + std::to_string(fs::file_size(p)) + " bytes, the manifest says " +
               f.at("size").dump();
      // Manifests name their algorithm by the field; those before XXH3 hold "fnv1a64".
      const std::string xxh3(core::kXxh3Field), fnv(core::kLegacyFnvField);
      if (f.contains(xxh3)) {
        if (core::xxh3_128_file(p) != f.at(xxh3).get<std::string>())
          return name + " does not match its checksum (" + xxh3 + ")";
      } else if (f.contains(fnv)) {
        if (core::legacy_fnv_file(p) != f.at(fnv).get<std::string>())
          return name + " does not match its checksum (" + fnv + ")";
      } else {
        return "manifest.json: " + name + " has no checksum (" + xxh3 + " or " + fnv + ")";
      }
    }
    manifest.at("step").get<std::int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return std::string("manifest.json is invalid: ") + e.what();
  } catch (const Error& e) {
    return e.what();
  } catch (const fs::filesystem_error& e) {
    return e.what();
  }
  if (manifest_out) *manifest_out = std::move(manifest);
  return {};
}

FoundCheckpoint find_resume_checkpoint(const fs::path& dir,
                                       const std::function<void(const std::string&)>& log) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw_invalid("resume: " + dir.string() +
                      (fs::exists(dir, ec) ? " is not a folder" : " does not exist") +
                      (dir.filename().string().rfind("checkpoint-", 0) == 0
                           ? " (a run keeps its last training.keep_last checkpoints; older ones "
                             "are removed)"
                           : ""),
                  "give a run folder (holding checkpoint-<step> folders) or one checkpoint folder");
  FoundCheckpoint found;
  if (fs::exists(dir / kManifest)) {
    std::string why = validate_checkpoint(dir, &found.manifest);
    if (!why.empty())
      throw_invalid("resume: " + dir.string() + " is not a valid checkpoint: " + why,
                    "resume from the run folder to use the newest complete checkpoint");
    found.path = dir;
    found.step = found.manifest.at("step").get<std::int64_t>();
    return found;
  }
  std::vector<std::pair<std::int64_t, fs::path>> candidates;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    if (is_temporary(name)) {
      if (log) log("resume: ignoring " + e.path().string() + " (interrupted save)");
    } else if (auto step = checkpoint_step(name)) {
      candidates.emplace_back(*step, e.path());
    }
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (const auto& [step, path] : candidates) {
    std::string why = validate_checkpoint(path, &found.manifest);
    if (why.empty()) {
      found.path = path;
      found.step = found.manifest.at("step").get<std::int64_t>();
      return found;
    }
    if (log) log("resume: ignoring " + path.string() + ": " + why);
  }
  throw_invalid("resume: " + dir.string() + " holds no valid checkpoint (" +
                    std::to_string(candidates.size()) + " checkpoint folder(s) checked)",
                "resume from the run folder of a previous run (its --out), or start without "
                "--resume");
}

}  // namespace tessera::train
