#pragma once
// Whether a new run folder can be made and written, found out by doing it: the missing folders
// are created, a small file is written and synced, and everything the check made is removed
// again. Permission bits say nothing for root, and neither they nor the mount flags tell a full
// disk; only the system's answer to a real write does.
#include <QString>

namespace tessera::ui {

// "" when `folder` (which must not exist yet) can be created and written, else why not in words
// a person reads: "/mnt/cd is on a read-only file system", "/data/runs: permission denied",
// "/home/me/notes.txt is a file, not a folder", "no space left on the disk holding /scratch".
// Touches the file system: call it off the GUI thread.
QString new_folder_problem(const QString& folder);

}  // namespace tessera::ui
