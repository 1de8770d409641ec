#include "core/error.h"

namespace tessera {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidInput:
      return "invalid_input";
    case ErrorKind::Usage:
      return "usage";
    case ErrorKind::Unsupported:
      return "unsupported";
    case ErrorKind::OutOfMemory:
      return "out_of_memory";
    case ErrorKind::Io:
      return "io";
    case ErrorKind::Internal:
      return "internal";
  }
  return "internal";
}

void throw_invalid(std::string message, std::string hint) {
  throw Error(ErrorKind::InvalidInput, std::move(message), std::move(hint));
}
void throw_unsupported(std::string message, std::string hint) {
  throw Error(ErrorKind::Unsupported, std::move(message), std::move(hint));
}
void throw_io(std::string message, std::string hint) {
  throw Error(ErrorKind::Io, std::move(message), std::move(hint));
}

}  // namespace tessera
