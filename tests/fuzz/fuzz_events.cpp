// The event stream a resumed run appends to (EventSink::open with append): whatever the file
// held, possibly cut mid-event by a kill, every complete line before the cut is kept, the torn
// tail is dropped, and each event written after it is one line of valid JSON, even when its
// message carries the input's bytes (invalid UTF-8 is replaced, never written). And launch's
// reader of the ranks' errors (last_rank_error) takes whatever the stream holds without throwing,
// and finds the same error before and after the append (the events appended name no rank).
#include <sstream>

#include "fuzz_support.h"
#include "job/events.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string before(tessera::fuzz::as_text(data, size));
  const auto path = tessera::fuzz::write_input("events.jsonl", data, size);
  {
    tessera::job::EventSink sink;
    sink.open(path.string(), /*append=*/true);
    sink.log("info", before);
    sink.progress("steps", 1, 2);
  }
  std::ifstream in(path, std::ios::binary);
  const std::string after((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  const std::size_t last_newline = before.rfind('\n');
  const std::size_t kept = last_newline == std::string::npos ? 0 : last_newline + 1;
  tessera::fuzz::require(after.compare(0, kept, before, 0, kept) == 0,
                         "complete lines before the torn tail are kept byte for byte");
  std::istringstream appended(after.substr(kept));
  std::string line;
  int events = 0;
  while (std::getline(appended, line)) {
    const auto event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    tessera::fuzz::require(event.is_object() && event.contains("type"),
                           "every appended line is one event object");
    ++events;
  }
  const int expected = kept < before.size() ? 3 : 2;  // the torn-tail warning, then ours
  tessera::fuzz::require(events == expected, "one line per event, the torn tail dropped");
  tessera::fuzz::require(!after.empty() && after.back() == '\n', "the stream ends with a newline");

  std::istringstream kept_lines(before.substr(0, kept));
  std::istringstream all_lines(after);
  const auto error_before = tessera::job::last_rank_error(kept_lines);
  const auto error_after = tessera::job::last_rank_error(all_lines);
  tessera::fuzz::require(
      error_before.has_value() == error_after.has_value() &&
          (!error_before || (error_before->rank == error_after->rank && error_before->rank >= 0 &&
                             error_before->message == error_after->message)),
      "the rank at fault is read the same before and after the append");
  return 0;
}
