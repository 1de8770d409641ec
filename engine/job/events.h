#pragma once
// The event stream: versioned JSON lines, one object per line with a "type". The GUI, the
// CLI progress bar and the tests all read this one stream. Schema: docs/events.md.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <istream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace tessera::job {

inline constexpr int kEventVersion = 1;

// Writes events as JSON lines to a file or stdout, and/or hands them to a listener (the
// terminal progress bar). Thread-safe; every line is flushed so a reader never sees half
// an event, and a crash loses at most the event being written.
class EventSink {
 public:
  EventSink() = default;
  ~EventSink();
  EventSink(const EventSink&) = delete;
  EventSink& operator=(const EventSink&) = delete;

  // "-" is standard output; anything else is a file, created, or truncated unless `append`
  // (a resumed run adds to its folder's stream). Appending to a stream that ends mid-line (its
  // writer was killed during an event) first cuts that incomplete event off, so that every line
  // stays one event; torn_bytes_dropped() says how many bytes went.
  void open(const std::string& target, bool append = false);
  std::uint64_t torn_bytes_dropped() const { return torn_bytes_dropped_; }
  void set_listener(std::function<void(const nlohmann::json&)> listener);

  // Adds "v" and "t" (seconds since the Unix epoch) and writes the event.
  void emit(const std::string& type, nlohmann::json fields);

  void log(const std::string& level, const std::string& message);
  void progress(const std::string& phase, std::int64_t done, std::int64_t total,
                std::optional<double> eta_seconds = std::nullopt);
  void error(const std::string& code, const std::string& message, const std::string& hint);

 private:
  std::mutex mutex_;
  std::uint64_t torn_bytes_dropped_ = 0;
  std::FILE* file_ = nullptr;
  bool owns_file_ = false;
  std::function<void(const nlohmann::json&)> listener_;
};

// The last error event of a job's ranks that names a rank ({"type":"error","rank":R,...}) in an
// event stream, read from where `in` stands to its end. Lines that are not events (a torn tail,
// text, JSON of any other shape) are skipped, never thrown on: the stream is the ranks' output,
// and launch reads it after a failure, when anything may have been cut off.
struct RankError {
  int rank = 0;
  std::string message;
};
std::optional<RankError> last_rank_error(std::istream& in);

}  // namespace tessera::job
