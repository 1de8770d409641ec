#include "job/events.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include "core/error.h"

namespace tessera::job {

EventSink::~EventSink() {
  if (owns_file_ && file_ != nullptr) std::fclose(file_);
}

namespace {

// Cuts `path` back to just after its last newline when it does not end with one; returns the
// bytes cut. A missing or empty file is left alone.
std::uint64_t drop_torn_tail(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  std::uint64_t dropped = 0;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const off_t size = st.st_size;
    char block[4096];
    off_t end = size;  // search backwards for the last '\n'
    off_t keep = 0;
    bool ends_with_newline = false;
    while (end > 0) {
      const off_t begin = std::max<off_t>(0, end - static_cast<off_t>(sizeof block));
      const ssize_t got = ::pread(fd, block, static_cast<std::size_t>(end - begin), begin);
      if (got <= 0) break;
      if (end == size && block[got - 1] == '\n') {
        ends_with_newline = true;
        break;
      }
      const char* nl =
          static_cast<const char*>(::memrchr(block, '\n', static_cast<std::size_t>(got)));
      if (nl != nullptr) {
        keep = begin + (nl - block) + 1;
        break;
      }
      end = begin;
    }
    if (!ends_with_newline) {
      if (::ftruncate(fd, keep) != 0)
        throw_io(path + ": cannot cut off the incomplete last event: " + std::strerror(errno));
      dropped = static_cast<std::uint64_t>(size - keep);
    }
  }
  ::close(fd);
  return dropped;
}

}  // namespace

void EventSink::open(const std::string& target, bool append) {
  {
    std::lock_guard lock(mutex_);
    torn_bytes_dropped_ = 0;
    if (owns_file_ && file_ != nullptr) std::fclose(file_);
    owns_file_ = false;
    if (target == "-") {
      file_ = stdout;
      return;
    }
    if (append) torn_bytes_dropped_ = drop_torn_tail(target);
    file_ = std::fopen(target.c_str(), append ? "a" : "w");
    if (file_ == nullptr)
      throw_io(target + ": cannot write the event stream: " + std::strerror(errno));
    owns_file_ = true;
  }
  if (torn_bytes_dropped_ > 0)
    log("warning", target +
                       " ended in the middle of an event (its writer was killed while "
                       "writing it): the last " +
                       std::to_string(torn_bytes_dropped_) +
                       " bytes, that incomplete event, were dropped");
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

std::optional<RankError> last_rank_error(std::istream& in) {
  std::optional<RankError> found;
  for (std::string line; std::getline(in, line);) {
    const auto event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!event.is_object()) continue;
    const auto type = event.find("type");
    const auto rank = event.find("rank");
    if (type == event.end() || *type != "error" || rank == event.end()) continue;
    // A rank is a small non-negative integer; anything else names no rank.
    if (!rank->is_number_unsigned() || rank->get<std::uint64_t>() > INT_MAX) continue;
    const auto message = event.find("message");
    found = RankError{static_cast<int>(rank->get<std::uint64_t>()),
                      message != event.end() && message->is_string() ? message->get<std::string>()
                                                                     : std::string()};
  }
  return found;
}

}  // namespace tessera::job
