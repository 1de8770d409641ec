#include "job/events.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace tessera::job {

EventSink::~EventSink() {
  if (owns_file_ && file_ != nullptr) std::fclose(file_);
}

void EventSink::open(const std::string& target, bool append) {
  std::lock_guard lock(mutex_);
  if (owns_file_ && file_ != nullptr) std::fclose(file_);
  owns_file_ = false;
  if (target == "-") {
    file_ = stdout;
    return;
  }
  file_ = std::fopen(target.c_str(), append ? "a" : "w");
  if (file_ == nullptr)
    throw_io(target + ": cannot write the event stream: " + std::strerror(errno));
  owns_file_ = true;
}

void EventSink::set_listener(std::function<void(const nlohmann::json&)> listener) {
  std::lock_guard lock(mutex_);
  listener_ = std::move(listener);
}

void EventSink::emit(const std::string& type, nlohmann::json fields) {
  using namespace std::chrono;
  fields["v"] = kEventVersion;
  fields["type"] = type;
  fields["t"] = duration<double>(system_clock::now().time_since_epoch()).count();
  std::lock_guard lock(mutex_);
  if (file_ != nullptr) {
    // Invalid UTF-8 from user data is replaced rather than aborting the stream.
    std::string line = fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }
  if (listener_) listener_(fields);
}

void EventSink::log(const std::string& level, const std::string& message) {
  emit("log", {{"level", level}, {"message", message}});
}

void EventSink::progress(const std::string& phase, std::int64_t done, std::int64_t total,
                         std::optional<double> eta_seconds) {
  nlohmann::json f = {{"phase", phase}, {"done", done}, {"total", total}};
  f["eta_s"] = eta_seconds ? nlohmann::json(*eta_seconds) : nlohmann::json(nullptr);
  emit("progress", std::move(f));
}

void EventSink::error(const std::string& code, const std::string& message,
                      const std::string& hint) {
  emit("error", {{"code", code}, {"message", message}, {"hint", hint}});
}

}  // namespace tessera::job
