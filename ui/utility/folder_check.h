#pragma once
// Why a folder cannot be written, in words a person acts on: the nearest existing folder at or
// above the path is checked (where the new files would land).
#include <QString>

namespace tessera::ui {

// The nearest path at or above `path` that exists (absolute): where a new folder's bytes would
// land, and whose kind and file system decide whether it can be made.
QString nearest_existing_path(const QString& path);

// "" when `path` (a folder that may not exist yet) can be created and written, else the reason:
// "… is a file, not a folder", "… is on a read-only file system", "you have no permission to
// write in …".
QString unwritable_reason(const QString& path);

}  // namespace tessera::ui
