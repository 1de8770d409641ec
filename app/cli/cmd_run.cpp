// tessera-cli run JOB.json [--events FILE|-] [--resume DIR] [--simulate-host-memory SIZE]:
// executes a saved job spec.
#include "command.h"
#include "core/error.h"
#include "job/job_spec.h"
#include "plan/profile.h"
#include "run_job.h"

namespace tessera::cli {
namespace {

int run_run(const std::vector<std::string>& raw) {
  Args args(raw, {}, {"--events", "--resume", "--simulate-host-memory"});
  if (args.positionals().size() != 1) throw UsageError{"expected exactly one JOB.json"};
  const std::string& path = args.positionals()[0];
  job::JobSpec spec = job::load_job_spec(path);
  if (const std::string* resume = args.option("--resume")) spec.output.resume = *resume;
  const std::string* events = args.option("--events");
  std::optional<std::uint64_t> simulated;
  if (const std::string* size = args.option("--simulate-host-memory"))
    simulated = plan::parse_byte_size(*size, "--simulate-host-memory");
  return execute_job(spec, events ? *events : "", path, simulated);
}

const RegisterCommand kRunCommand{{
    "run",
    "run JOB.json [--events FILE|-] [--resume DIR] [--simulate-host-memory SIZE]",
    "Run a saved job spec (docs/job-spec.md); events go to FILE, stdout (-), or the run folder. "
    "Strategy auto trains with the plan's settings (--simulate-host-memory: plan against SIZE)",
    run_run,
}};

}  // namespace
}  // namespace tessera::cli
