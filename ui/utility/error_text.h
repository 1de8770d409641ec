#pragma once
// An engine error as the studio shows it: the message, then on its own line what to do.
#include <QString>

#include "core/error.h"

namespace tessera::ui {

QString error_text(const Error& error);

// The exception being handled (call inside a catch), as error_text shows an engine error; a
// QtConcurrent task's own exception is taken out of its QUnhandledException.
QString current_exception_text();

}  // namespace tessera::ui
