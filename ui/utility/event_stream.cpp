#include "ui/utility/event_stream.h"

#include <QDateTime>
#include <cmath>
#include <limits>
#include <optional>

namespace tessera::ui {

using nlohmann::json;

bool LineSplitter::next(QByteArray& line) {
  const qsizetype end = buffer_.indexOf('\n', std::max(consumed_, scan_from_));
  if (end < 0) {
    scan_from_ = buffer_.size();
    return false;
  }
  line = buffer_.mid(consumed_, end - consumed_);
  if (line.endsWith('\r')) line.chop(1);
  consumed_total_ += end + 1 - consumed_;
  consumed_ = end + 1;
  scan_from_ = consumed_;
  // Compact now and then so the buffer does not grow with the whole stream.
  if (consumed_ > (1 << 16) && consumed_ * 2 > buffer_.size()) {
    buffer_.remove(0, consumed_);
    scan_from_ -= consumed_;
    consumed_ = 0;
  }
  return true;
}

QByteArray LineSplitter::take_rest() {
  QByteArray rest = buffer_.mid(consumed_);
  buffer_.clear();
  consumed_ = scan_from_ = 0;
  return rest;
}

namespace {

double number(const json& e, const char* key) {
  auto it = e.find(key);
  return it != e.end() && it->is_number() ? it->get<double>() : kMissing;
}

// A count or index: the number when it is a whole one within `lowest` … `highest`, else none.
// The engine writes integers there; anything else (1e300, -1, 2.5) is read as missing rather
// than cast out of range, which is undefined behaviour (tests/fuzz: fuzz_studio_events).
std::optional<std::int64_t> whole(const json& e, const char* key, std::int64_t lowest = 0,
                                  std::int64_t highest = std::numeric_limits<std::int64_t>::max()) {
  const double v = number(e, key);
  // 2^63 is the first double above int64's range; the comparison stays in doubles.
  if (!(v >= static_cast<double>(lowest) && v < 9223372036854775808.0) || v != std::floor(v))
    return std::nullopt;
  const auto n = static_cast<std::int64_t>(v);
  if (n > highest) return std::nullopt;
  return n;
}

QString text(const json& e, const char* key) {
  auto it = e.find(key);
  return it != e.end() && it->is_string() ? QString::fromStdString(it->get<std::string>())
                                          : QString();
}

}  // namespace

QList<RankMetric> metric_ranks_from_json(const json& ranks) {
  QList<RankMetric> out;
  if (!ranks.is_array()) return out;
  for (const json& r : ranks) {
    if (!r.is_object()) continue;
    const auto rank = whole(r, "rank", 0, std::numeric_limits<int>::max());
    if (!rank) continue;
    RankMetric m;
    m.rank = static_cast<int>(*rank);
    m.loss = number(r, "loss");
    m.tokens_per_s = number(r, "tokens_per_s");
    if (auto mesh = r.find("mesh"); mesh != r.end() && mesh->is_object()) {
      const int most = std::numeric_limits<int>::max();
      const auto dp = whole(*mesh, "dp", 0, most), pp = whole(*mesh, "pp", 0, most),
                 tp = whole(*mesh, "tp", 0, most);
      if (dp && pp && tp) {
        m.dp = static_cast<int>(*dp);
        m.pp = static_cast<int>(*pp);
        m.tp = static_cast<int>(*tp);
      }
    }
    const double idle = number(r, "pipeline_idle_s"), step = number(r, "step_s");
    if (present(idle) && present(step) && step > 0) m.pipeline_idle_share = idle / step;
    out.push_back(m);
  }
  return out;
}

QList<RankMemory> memory_ranks_from_json(const json& ranks) {
  QList<RankMemory> out;
  if (!ranks.is_array()) return out;
  for (const json& r : ranks) {
    if (!r.is_object()) continue;
    const auto rank = whole(r, "rank", 0, std::numeric_limits<int>::max());
    if (!rank) continue;
    RankMemory m;
    m.rank = static_cast<int>(*rank);
    m.host = text(r, "host");
    m.used = number(r, "used");
    if (auto it = r.find("by_category"); it != r.end() && it->is_object())
      for (int i = 0; i < 4; ++i)
        m.by_category[i] = number(*it, memory_categories()[i].toUtf8().constData());
    out.push_back(m);
  }
  return out;
}

namespace {
json number_or_null(double v) {
  return present(v) ? json(v) : json(nullptr);
}
}  // namespace

json to_json(const QList<RankMetric>& ranks) {
  json out = json::array();
  for (const RankMetric& r : ranks) {
    json entry = {{"rank", r.rank},
                  {"loss", number_or_null(r.loss)},
                  {"tokens_per_s", number_or_null(r.tokens_per_s)}};
    if (r.dp >= 0) entry["mesh"] = {{"dp", r.dp}, {"pp", r.pp}, {"tp", r.tp}};
    // Stored as the share over a step of 1 (what the stream's pair of seconds gives).
    if (present(r.pipeline_idle_share)) {
      entry["pipeline_idle_s"] = r.pipeline_idle_share;
      entry["step_s"] = 1.0;
    }
    out.push_back(std::move(entry));
  }
  return out;
}

json to_json(const QList<RankMemory>& ranks) {
  json out = json::array();
  for (const RankMemory& r : ranks) {
    json categories = json::object();
    for (int i = 0; i < 4; ++i)
      categories[memory_categories()[i].toStdString()] = number_or_null(r.by_category[i]);
    out.push_back({{"rank", r.rank},
                   {"host", r.host.toStdString()},
                   {"used", number_or_null(r.used)},
                   {"by_category", categories}});
  }
  return out;
}

QString describe_event(const json& e) {
  if (!e.is_object()) return {};
  const QString type = text(e, "type");
  if (type == "log") return "[" + text(e, "level") + "] " + text(e, "message");
  if (type == "error") {
    QString s = "[error] " + text(e, "message");
    if (!text(e, "hint").isEmpty()) s += " — " + text(e, "hint");
    return s;
  }
  if (type == "checkpoint")
    return QString("[checkpoint] step %1: %2").arg(number(e, "step")).arg(text(e, "path"));
  if (type == "done") {
    QString s = "[done] " + text(e, "status");
    if (!text(e, "output").isEmpty()) s += ": " + text(e, "output");
    return s;
  }
  if (type == "plan") {
    QString s = "[plan] " + text(e, "strategy");
    if (auto it = e.find("reasons"); it != e.end() && it->is_array())
      for (const auto& r : *it)
        if (r.is_string()) s += "; " + QString::fromStdString(r.get<std::string>());
    return s;
  }
  return {};
}

void apply_event(const json& e, const QByteArray& line, StreamState& state, RunSeries& delta,
                 RunBatch& batch) {
  if (!e.is_object()) return;
  const QString type = text(e, "type");
  double t = number(e, "t");
  if (!present(t)) t = double(QDateTime::currentMSecsSinceEpoch()) / 1000.0;
  if (type == "metric") {
    MetricPoint p;
    p.step = whole(e, "step").value_or(0);
    p.t = t;
    p.loss = number(e, "loss");
    p.lr = number(e, "lr");
    p.grad_norm = number(e, "grad_norm");
    p.tokens_per_s = number(e, "tokens_per_s");
    p.eval_loss = number(e, "eval_loss");
    if (auto it = e.find("preference"); it != e.end() && it->is_object()) {
      p.reward_chosen = number(*it, "reward_chosen");
      p.reward_rejected = number(*it, "reward_rejected");
      p.reward_margin = number(*it, "reward_margin");
      p.reward_accuracy = number(*it, "reward_accuracy");
      p.kl = number(*it, "kl");
    }
    if (auto it = e.find("ranks"); it != e.end()) p.ranks = metric_ranks_from_json(*it);
    delta.metrics.push_back(p);
    batch.metrics.push_back(p);
    return;
  }
  if (type == "memory") {
    MemorySample m;
    m.t = t;
    m.tier = text(e, "tier");
    if (m.tier.isEmpty()) m.tier = "host";
    m.device = text(e, "device");
    m.used = number(e, "used");
    if (!present(m.used)) m.used = 0;
    m.reserved = number(e, "reserved");
    m.budget = number(e, "budget");
    m.system_used = number(e, "system_used");
    if (auto it = e.find("by_category"); it != e.end() && it->is_object())
      for (int i = 0; i < 4; ++i)
        m.by_category[i] = number(*it, memory_categories()[i].toUtf8().constData());
    if (auto it = e.find("traffic"); it != e.end() && it->is_object()) {
      m.traffic.read_bytes = number(*it, "read_bytes");
      m.traffic.written_bytes = number(*it, "written_bytes");
      m.traffic.read_bytes_per_s = number(*it, "read_bytes_per_s");
      m.traffic.written_bytes_per_s = number(*it, "written_bytes_per_s");
    }
    if (auto it = e.find("ranks"); it != e.end()) m.ranks = memory_ranks_from_json(*it);
    delta.memory.push_back(m);
    batch.memory.push_back(m);
    return;
  }
  if (type == "progress") {
    delta.has_progress = true;
    delta.phase = text(e, "phase");
    delta.done = whole(e, "done").value_or(0);
    delta.total = whole(e, "total").value_or(0);
    delta.eta_s = number(e, "eta_s");
    // Only the training steps are kept, on the run's row (the runs list shows them).
    if (delta.phase == "train" && delta.total > 0) {
      batch.steps = {{delta.done, delta.total}};
      state.steps_done = delta.done;
      state.total_steps = delta.total;
    }
    return;  // progress is transient: not stored row by row
  }
  if (type == "error") {
    state.last_error = text(e, "message");
    if (!text(e, "hint").isEmpty()) state.last_error += "\n" + text(e, "hint");
    delta.last_error = state.last_error;
  } else if (type == "done") {
    state.done_status = text(e, "status");
    const auto steps = whole(e, "steps"), total = whole(e, "total_steps");
    if (steps && total && *total > 0) {
      state.steps_done = *steps;
      state.total_steps = *total;
      batch.steps = {{state.steps_done, state.total_steps}};
    }
  } else if (type == "checkpoint") {
    const auto step = whole(e, "step");
    if (step) state.last_checkpoint_step = *step;
    batch.checkpoints.push_back({step.value_or(0), text(e, "path"), t});
  }
  const QString shown = describe_event(e);
  if (!shown.isEmpty()) delta.log << shown;
  batch.events.push_back({state.seq++, t, type, QString::fromUtf8(line)});
}

}  // namespace tessera::ui
