#pragma once
// The link between two local ranks, measured for the planner (plan::HardwareProfile::link): two
// threads of this process join a 2-rank c10d job on 127.0.0.1 and run `nodes check`'s link test
// (nodes/link/link_test.h), 4-byte all_reduces for the latency and `bytes` for the bandwidth.
#include <cstdint>

#include "plan/profile.h"

namespace tessera::runner {

inline constexpr std::uint64_t kLoopbackLinkTestBytes = 32ull << 20;

// Throws tessera::Error (Io) when the two ranks cannot meet on the loopback.
plan::LinkInfo measure_loopback_link(std::uint64_t bytes = kLoopbackLinkTestBytes);

}  // namespace tessera::runner
