// tessera-cli run JOB.json [--events FILE|-] [--resume DIR]: executes a saved job spec.
#include "command.h"
#include "core/error.h"
#include "job/job_spec.h"
#include "run_job.h"

namespace tessera::cli {
namespace {

int run_run(const std::vector<std::string>& raw) {
  Args args(raw, {}, {"--events", "--resume"});
  if (args.positionals().size() != 1) throw UsageError{"expected exactly one JOB.json"};
  const std::string& path = args.positionals()[0];
  job::JobSpec spec = job::load_job_spec(path);
  if (const std::string* resume = args.option("--resume")) spec.output.resume = *resume;
  const std::string* events = args.option("--events");
  return execute_job(spec, events ? *events : "", path);
}

const RegisterCommand kRegister{{
    "run",
    "run JOB.json [--events FILE|-] [--resume DIR]",
    "Run a saved job spec (docs/job-spec.md); events go to FILE, stdout (-), or the run folder",
    run_run,
}};

}  // namespace
}  // namespace tessera::cli
