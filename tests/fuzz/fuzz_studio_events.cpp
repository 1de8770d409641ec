// The studio's reading of a run's event stream (ui/utility/event_stream.h), as its run monitor
// does it: the bytes arrive from the training process in pieces of any size (the first input
// byte picks them), LineSplitter hands out each complete line once, in order, byte for byte
// (less a trailing '\r'), and keeps the unterminated tail for take_rest(); every line that
// parses as a JSON object is applied (apply_event) and described for the log, whatever its
// fields hold, and the stream's running state stays consistent: the sequence number only grows,
// and each `ranks` array read back through the database's JSON is the same list.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fuzz_support.h"
#include "ui/utility/event_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera::ui;
  if (size == 0) return 0;
  std::uint32_t pieces = data[0] | 1u;
  const QByteArray input(reinterpret_cast<const char*>(data + 1), static_cast<qsizetype>(size - 1));

  // The lines the stream holds, as the splitter must hand them out.
  std::vector<QByteArray> expected;
  qsizetype start = 0;
  for (qsizetype at = input.indexOf('\n'); at >= 0; at = input.indexOf('\n', start)) {
    QByteArray line = input.mid(start, at - start);
    if (line.endsWith('\r')) line.chop(1);
    expected.push_back(line);
    start = at + 1;
  }

  LineSplitter splitter;
  StreamState state;
  RunSeries delta;
  RunBatch batch;
  std::size_t seen = 0;
  QByteArray line;
  for (qsizetype at = 0; at < input.size();) {
    const qsizetype n = std::min<qsizetype>(1 + pieces % 61, input.size() - at);
    pieces = pieces * 1103515245u + 12345u;
    splitter.feed(input.mid(at, n));
    at += n;
    while (splitter.next(line)) {
      tessera::fuzz::require(seen < expected.size() && line == expected[seen],
                             "each complete line is handed out once, in order, byte for byte");
      ++seen;
      if (line.trimmed().isEmpty()) continue;
      const auto event = nlohmann::json::parse(line.constBegin(), line.constEnd(), nullptr, false);
      if (event.is_discarded() || !event.is_object()) continue;
      const std::int64_t seq = state.seq;
      apply_event(event, line, state, delta, batch);
      (void)describe_event(event);
      tessera::fuzz::require(state.seq >= seq, "the sequence number never goes back");
      if (const auto ranks = event.find("ranks"); ranks != event.end()) {
        const auto metrics = metric_ranks_from_json(*ranks);
        tessera::fuzz::require(metric_ranks_from_json(to_json(metrics)).size() == metrics.size(),
                               "metric ranks survive the database's JSON");
        const auto memory = memory_ranks_from_json(*ranks);
        tessera::fuzz::require(memory_ranks_from_json(to_json(memory)).size() == memory.size(),
                               "memory ranks survive the database's JSON");
      }
    }
  }
  tessera::fuzz::require(seen == expected.size(), "every complete line is handed out");
  tessera::fuzz::require(splitter.consumed_total() == start, "consumed up to the last newline");
  tessera::fuzz::require(splitter.take_rest() == input.mid(start), "the tail is kept whole");
  return 0;
}
