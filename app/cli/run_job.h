#pragma once
// Shared by `run` and `finetune`: executes a job spec with the terminal progress bar, the
// event stream, and Ctrl-C handling (stop after the current step, checkpoint, say how to
// resume).
#include <string>

#include "job/job_spec.h"

namespace tessera::cli {

// `events_target`: "-" (stdout), a file path, or empty (the run folder's events.jsonl).
// Returns the process exit code.
int execute_job(const job::JobSpec& spec, const std::string& events_target,
                const std::string& spec_path);

}  // namespace tessera::cli
