#pragma once
// How the plan's reasons and explanation write figures and placements (internal to
// engine/plan). Torch-free.
#include <cstdint>
#include <string>
#include <vector>

#include "plan/settings.h"

namespace tessera::plan {

// "1.25 GiB": every memory figure of the reasons, in one unit so that they compare at a glance.
std::string gib(std::uint64_t bytes);
// "250 ms" below a second, else "1.25 s".
std::string seconds_text(double seconds);
// "25%".
std::string percent(double fraction);
std::string join(const std::vector<std::string>& parts);
// What gemini keeps on disk: "100% of the optimizer state and 50% of the parameters" (each part
// only when it is above 0, the optimizer state when neither is).
std::string on_disk_phrase(const Settings& s);
// What gemini's device tier keeps in host memory: "50% of the optimizer state and 25% of the
// parameters" (each part only when above 0; "nothing").
std::string in_host_phrase(const Settings& s);
// The method: "full fine-tuning", "LoRA (rank 8)" or "QLoRA (rank 8, nf4 base)".
std::string method_phrase(const Settings& s);

}  // namespace tessera::plan
