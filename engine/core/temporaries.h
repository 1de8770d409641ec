#pragma once
// Temporary files and folders that a killed process leaves behind. Every writer names its
// temporaries after its process id, so the next run, resume or export of a folder can tell those
// of processes that are gone (removed) from those of a live one (kept, whoever it is):
//   .<name>.tmp-<pid>-<n>      an export being written (engine/export), a GGUF file
//   <file>.tmp.<pid>.<n>       a file written atomically (core/files.h), a safetensors shard
//   .<name>.old-<pid>-<n>      an export moved aside while the new one is swapped in; removed only
//                              when <name> exists again (otherwise it is the only copy)
// Checkpoint folders' temporaries (checkpoint-<step>.tmp-…) are train/checkpoint.h's own.
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace tessera::core {

// The process id a temporary's name carries, or nullopt when the name is not one of the above.
std::optional<pid_t> temporary_owner(const std::string& name);

// Whether `pid` is a live process of this machine (a zombie counts as gone).
bool process_alive(pid_t pid);

// Removes the entries of `folder` (not below it) that are temporaries of processes no longer
// alive; returns how many. `log` hears each removal. Errors are not thrown: a temporary that
// cannot be removed stays and is reported through `log`.
int remove_dead_temporaries(const std::filesystem::path& folder,
                            const std::function<void(const std::string&)>& log = {});

}  // namespace tessera::core
