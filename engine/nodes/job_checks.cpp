#include "nodes/job_checks.h"

#include <unistd.h>

#include "core/error.h"
#include "job/job_spec.h"

namespace tessera::nodes {

namespace fs = std::filesystem;

namespace {

// "data/train.jsonl" or "data/train.jsonl (/srv/work/data/train.jsonl)" when relative.
std::string shown(const std::string& written, const fs::path& resolved) {
  return fs::path(written).is_absolute() ? written : written + " (" + resolved.string() + ")";
}

fs::path resolve(const std::string& written, const fs::path& work_dir) {
  const fs::path path(written);
  return path.is_absolute() || work_dir.empty() ? path : work_dir / path;
}

}  // namespace

std::vector<CheckResult> job_file_checks(const nlohmann::json& job, const fs::path& work_dir,
                                         const std::string& node,
                                         const std::string& shared_marker) {
  std::vector<CheckResult> out;
  CheckResult spec_check;
  spec_check.name = "job spec";
  job::JobSpec spec;
  try {
    spec = job::parse_job_spec(job, "the job spec sent to " + node);
    spec_check.ok = true;
    spec_check.detail = "reads on " + node;
  } catch (const Error& e) {
    spec_check.reason = e.what();
    spec_check.hint = e.hint().empty() ? "use the same Tessera version on every node" : e.hint();
    out.push_back(spec_check);
    return out;
  }
  out.push_back(spec_check);

  CheckResult files;
  files.name = "job files";
  std::vector<std::string> missing, found;
  const auto need = [&](const std::string& written, bool directory, const std::string& role) {
    const fs::path path = resolve(written, work_dir);
    std::error_code error;
    const bool ok = directory ? fs::is_directory(path, error) : fs::is_regular_file(path, error);
    (ok ? found : missing).push_back(role + " " + shown(written, path));
  };
  if (!spec.model.path.empty()) need(spec.model.path, true, "model folder");
  for (const auto& f : spec.dataset.train_files) need(f, false, "training file");
  for (const auto& f : spec.dataset.validation_files) need(f, false, "validation file");
  if (spec.output.resume) need(*spec.output.resume, true, "checkpoint to resume");
  files.ok = missing.empty();
  files.measured = {{"missing", missing}, {"found", found}};
  std::string where =
      work_dir.empty() ? std::string() : " (relative paths from " + work_dir.string() + ")";
  if (files.ok) {
    files.detail = std::to_string(found.size()) + " path(s) found on " + node + where;
    if (!spec.model.hub_id.empty()) files.detail += "; the model comes from the Hub there";
  } else {
    for (const auto& m : missing) files.reason += (files.reason.empty() ? "" : "; ") + m;
    files.reason = node + " lacks: " + files.reason + where;
    files.hint = "copy the files to the same paths on " + node +
                 " (or a shared folder mounted at the same path), or start its agent with "
                 "--work-dir at the folder that holds them";
  }
  out.push_back(files);

  CheckResult output;
  output.name = "output folder";
  const fs::path dir = resolve(spec.output.dir, work_dir);
  std::error_code error;
  fs::path existing = dir;
  while (!existing.empty() && !fs::exists(existing, error)) existing = existing.parent_path();
  if (existing.empty()) existing = ".";
  output.ok = fs::is_directory(existing, error) && ::access(existing.c_str(), W_OK | X_OK) == 0;
  output.detail = shown(spec.output.dir, dir) +
                  (existing == dir ? " exists" : " can be made in " + existing.string());
  if (!output.ok) {
    output.detail = shown(spec.output.dir, dir);
    output.reason = node + " cannot write the output folder " + shown(spec.output.dir, dir) + ": " +
                    existing.string() + " is not a folder it may write in";
    output.hint = "make the folder writable for the agent's user on " + node +
                  ", or choose another output.dir";
  }
  out.push_back(output);

  if (!shared_marker.empty()) {
    CheckResult shared;
    shared.name = "shared output";
    // Only a plain file name: the client cannot make the agent probe other paths.
    const bool plain = shared_marker.find('/') == std::string::npos &&
                       shared_marker.rfind(".tessera-shared-", 0) == 0;
    shared.ok = plain && fs::is_regular_file(dir / shared_marker, error);
    if (shared.ok) {
      shared.detail = shown(spec.output.dir, dir) +
                      " is the client's folder (a file it wrote there is seen here)";
    } else {
      shared.detail = shown(spec.output.dir, dir);
      shared.reason = shown(spec.output.dir, dir) + " on " + node +
                      " is not the client's output folder (a file the client just wrote there is "
                      "not seen): each rank writes its part of every checkpoint into it and rank 0 "
                      "commits them, so it must be one folder shared by every node";
      shared.hint =
          "mount a shared folder (NFS, SMB) at the same path on every node and set "
          "output.dir to it";
    }
    out.push_back(shared);
  }
  return out;
}

}  // namespace tessera::nodes
