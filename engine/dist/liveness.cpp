#include "dist/liveness.h"

#include <algorithm>
#include <cstdio>

namespace tessera::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kFailureKey = "tessera/failure";

std::string heartbeat_key(int rank) {
  return "tessera/heartbeat/" + std::to_string(rank);
}

std::string seconds_text(Clock::duration duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(duration).count());
  return text;
}

std::vector<std::uint8_t> bytes(const std::string& text) {
  return {text.begin(), text.end()};
}

std::optional<std::pair<int, std::string>> parse_failure(const std::vector<std::uint8_t>& value) {
  const std::string text(value.begin(), value.end());
  const auto newline = text.find('\n');
  if (text.empty() || newline == std::string::npos) return std::nullopt;
  return std::pair{std::stoi(text.substr(0, newline)), text.substr(newline + 1)};
}

}  // namespace

LivenessMonitor::LivenessMonitor(std::string master_addr, std::uint16_t master_port, int rank,
                                 int world_size, std::chrono::milliseconds interval)
    : master_addr_(std::move(master_addr)),
      master_port_(master_port),
      rank_(rank),
      world_size_(world_size),
      interval_(interval),
      silence_limit_(3 * interval),
      last_counts_(static_cast<std::size_t>(world_size), -1),
      last_heard_(static_cast<std::size_t>(world_size), Clock::now()),
      store_last_answered_(Clock::now()) {
  thread_ = std::thread([this] { run(); });
}

LivenessMonitor::~LivenessMonitor() {
  {
    std::lock_guard lock(state_mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

c10d::TCPStore& LivenessMonitor::store() {
  if (!store_) {
    // Its own connection with a short timeout, so that a silent store is noticed within
    // two intervals and the main thread's blocking calls never delay a heartbeat.
    c10d::TCPStoreOptions options;
    options.port = master_port_;
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = 2 * interval_;
    store_ = c10::make_intrusive<c10d::TCPStore>(master_addr_, options);
  }
  return *store_;
}

void LivenessMonitor::beat() {
  auto& connection = store();
  connection.add(heartbeat_key(rank_), 1);
  std::vector<std::string> keys;
  for (int peer = 0; peer < world_size_; ++peer) keys.push_back(heartbeat_key(peer));
  // A rank that has not beaten yet has no key, and multiGet would wait for it.
  if (!connection.check(keys)) {
    for (int peer = 0; peer < world_size_; ++peer) {
      if (!connection.check({keys[static_cast<std::size_t>(peer)]})) {
        keys[static_cast<std::size_t>(peer)].clear();
      }
    }
    std::erase_if(keys, [](const std::string& key) { return key.empty(); });
  }
  const auto values = connection.multiGet(keys);
  const auto now = Clock::now();
  std::lock_guard lock(state_mutex_);
  store_last_answered_ = now;
  for (std::size_t index = 0; index < keys.size(); ++index) {
    const int peer = std::stoi(keys[index].substr(keys[index].rfind('/') + 1));
    const std::int64_t count = std::stoll(std::string(values[index].begin(), values[index].end()));
    auto& last = last_counts_[static_cast<std::size_t>(peer)];
    if (count != last) {
      last = count;
      last_heard_[static_cast<std::size_t>(peer)] = now;
    }
  }
}

void LivenessMonitor::run() {
  std::unique_lock state_lock(state_mutex_);
  while (!stopping_) {
    state_lock.unlock();
    try {
      std::lock_guard store_lock(store_mutex_);
      beat();
    } catch (const std::exception&) {
      // The store did not answer: store_last_answered_ stays behind, which is the evidence.
      // Reconnect on the next beat (a dead server's connection stays broken).
      std::lock_guard store_lock(store_mutex_);
      store_.reset();
    }
    state_lock.lock();
    wake_.wait_for(state_lock, interval_, [this] { return stopping_; });
  }
}

std::optional<LivenessMonitor::Suspect> LivenessMonitor::find_suspect(
    const std::vector<int>& ranks) {
  const auto deadline = Clock::now() + silence_limit_ + interval_;
  std::unique_lock lock(state_mutex_);
  while (true) {
    const auto now = Clock::now();
    if (now - store_last_answered_ > silence_limit_) {
      return Suspect{0, "hosts the rendezvous store, which has not answered for " +
                            seconds_text(now - store_last_answered_)};
    }
    std::optional<Suspect> suspect;
    Clock::duration longest{};
    for (int peer : ranks) {
      if (peer == rank_) continue;
      const auto silence = now - last_heard_[static_cast<std::size_t>(peer)];
      if (silence > silence_limit_ && silence > longest) {
        longest = silence;
        suspect = Suspect{peer, "has sent no heartbeat for " + seconds_text(silence)};
      }
    }
    if (suspect || now >= deadline) return suspect;
    wake_.wait_for(lock, interval_ / 2);
  }
}

std::optional<std::pair<int, std::string>> LivenessMonitor::recorded_failure() {
  try {
    std::unique_lock lock(store_mutex_, interval_);
    if (!lock.owns_lock() || !store_) return std::nullopt;
    if (!store_->check({kFailureKey})) return std::nullopt;
    return parse_failure(store_->get(kFailureKey));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::pair<int, std::string>> LivenessMonitor::record_failure(
    int rank, const std::string& text) {
  try {
    std::unique_lock lock(store_mutex_, interval_);
    if (!lock.owns_lock() || !store_) return std::nullopt;
    const auto recorded =
        store_->compareSet(kFailureKey, {}, bytes(std::to_string(rank) + "\n" + text));
    return parse_failure(recorded);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace tessera::dist
