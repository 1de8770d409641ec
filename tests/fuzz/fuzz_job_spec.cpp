// A job spec file (tessera-cli run JOB.json): parsed and validated. An accepted spec must survive
// its canonical form (to_json, then parsed again) unchanged, as a saved run's spec.json does.
#include <optional>

#include "fuzz_support.h"
#include "job/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = tessera::fuzz::write_input("job.json", data, size);
  std::optional<tessera::job::JobSpec> spec;
  tessera::fuzz::refusal_is_fine([&] { spec = tessera::job::load_job_spec(path); });
  if (!spec) return 0;
  // No refusal allowed from here: the engine wrote this form itself.
  const nlohmann::json canonical = tessera::job::to_json(*spec);
  const tessera::job::JobSpec again = tessera::job::parse_job_spec(canonical, "canonical");
  tessera::fuzz::require(tessera::job::to_json(again) == canonical,
                         "a spec's canonical form parses to the same spec");
  return 0;
}
