#pragma once
// The engine's one exception type. `kind` decides the CLI exit code and the event
// stream's error code; `hint` says what the user can do about it.
#include <stdexcept>
#include <string>

namespace tessera {

enum class ErrorKind {
  InvalidInput,  // a file, field or argument the user gave is wrong (exit 2)
  Usage,         // bad command-line usage (exit 2)
  Unsupported,   // valid input the engine does not handle (yet) (exit 2)
  OutOfMemory,   // the job needs more memory than a device has: the plan's change fits (exit 2)
  Io,            // the OS refused a read or write (exit 1)
  Internal,      // a bug or an unexpected state (exit 1)
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, std::string hint = {})
      : std::runtime_error(std::move(message)), kind_(kind), hint_(std::move(hint)) {}
  ErrorKind kind() const { return kind_; }
  const std::string& hint() const { return hint_; }

 private:
  ErrorKind kind_;
  std::string hint_;
};

// The hint of every refusal of a checkpoint that does not fit the run.
inline constexpr const char* kResumeSameTraining =
    "resume with the same model and method (full / LoRA and its targets)";

// Shorthands: the message should name the file/field/line and the fault.
[[noreturn]] void throw_invalid(std::string message, std::string hint = {});
[[noreturn]] void throw_unsupported(std::string message, std::string hint = {});
[[noreturn]] void throw_io(std::string message, std::string hint = {});

}  // namespace tessera
