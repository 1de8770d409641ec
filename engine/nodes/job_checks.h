#pragma once
// The pre-flight checks of one job on a node, beside the node's own (checks.h): the spec reads
// there, the files it names exist there (relative paths resolved against the folder the ranks
// run in: the agent's --work-dir), and its output folder can be made there.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nodes/checks.h"

namespace tessera::nodes {

// `node` names the machine in the reasons ("box2", "this machine"). With `shared_marker` (a file
// name the client wrote into the output folder just before), also whether the output folder is
// the client's: every rank writes its part of a checkpoint there and rank 0 commits it.
std::vector<CheckResult> job_file_checks(const nlohmann::json& job,
                                         const std::filesystem::path& work_dir,
                                         const std::string& node,
                                         const std::string& shared_marker = {});

}  // namespace tessera::nodes
