#pragma once
// Shared by `run` and `finetune`: executes a job spec with the terminal progress bar, the
// event stream, and Ctrl-C handling (stop after the current step, checkpoint, say how to
// resume).
#include <cstdint>
#include <optional>
#include <string>

#include "job/job_spec.h"

namespace tessera::cli {

// A new run (no output.resume) into the folder of an earlier one would replace its job.json and
// event stream (and prune its checkpoints): refused (tessera::Error, InvalidInput) before
// anything is written, so bad input in a new job never costs the earlier run. `resume_command`:
// how to continue the earlier run instead (run's, or launch's with its processes).
void refuse_new_run_over_earlier(const job::JobSpec& spec, const std::string& resume_command);

// `events_target`: "-" (stdout), a file path, or empty (the run folder's events.jsonl).
// Returns the process exit code.
// `simulate_host_memory`: plan a strategy-"auto" job against this budget (what-if, tests).
int execute_job(const job::JobSpec& spec, const std::string& events_target,
                const std::string& spec_path,
                std::optional<std::uint64_t> simulate_host_memory = std::nullopt);

}  // namespace tessera::cli
