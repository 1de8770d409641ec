#include "job/strategies.h"

#include "core/error.h"

namespace tessera::job {
namespace {

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

std::string describe_options(const StrategyInfo& info) {
  if (info.options.empty()) return info.name + " takes no options";
  std::vector<std::string> parts;
  for (const auto& o : info.options) parts.push_back(o.key + " (" + join(o.values, " | ") + ")");
  return info.name + " takes: " + join(parts, ", ");
}

const StrategyInfo& resolve(const std::string& name) {
  if (name == kAutoStrategy) return auto_strategy();
  const StrategyInfo* info = find_strategy(name);
  if (info == nullptr)
    throw Error(ErrorKind::Internal, "strategy \"" + name + "\" is not in the strategy table");
  return *info;
}

}  // namespace

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> table = {
      {"single",
       "one process on one device: CUDA device 0 when present, else the CPU",
       {{"device",
         "where it trains: auto (CUDA device 0 when present, else the CPU), cpu or cuda",
         {"auto", "cpu", "cuda"}}},
       /*planned=*/true},
  };
  return table;
}

const StrategyInfo* find_strategy(const std::string& name) {
  for (const auto& s : strategies())
    if (s.name == name) return &s;
  return nullptr;
}

const StrategyInfo& auto_strategy() {
  for (const auto& s : strategies())
    if (s.planned) return s;
  throw Error(ErrorKind::Internal, "the strategy table has no strategy the planner models");
}

std::string strategy_names() {
  std::vector<std::string> names;
  for (const auto& s : strategies()) names.push_back(s.name);
  return join(names, ", ");
}

void validate_strategy(const std::string& name, const nlohmann::json& options,
                       const std::string& source) {
  const std::string at = source.empty() ? "" : source + ": ";
  const StrategyInfo* info = name == kAutoStrategy ? &auto_strategy() : find_strategy(name);
  if (info == nullptr)
    throw_invalid(at + "strategy.name is \"" + name +
                      "\", which is not a strategy this build has; expected one of: " +
                      std::string(kAutoStrategy) + ", " + strategy_names(),
                  "available plugins: " + strategy_names() + " (or auto, which lets the " +
                      "planner choose; see docs/job-spec.md)");
  if (!options.is_object()) throw_invalid(at + "strategy.options must be an object");
  for (const auto& [key, value] : options.items()) {
    const StrategyOption* option = nullptr;
    for (const auto& o : info->options)
      if (o.key == key) option = &o;
    if (option == nullptr)
      throw_invalid(
          at + "strategy.options." + key + " is not an option of strategy \"" + name + "\"",
          "remove it; " + describe_options(*info));
    bool allowed = false;
    if (value.is_string())
      for (const auto& v : option->values) allowed = allowed || value.get<std::string>() == v;
    if (!allowed)
      throw_invalid(at + "strategy.options." + key + " is " + value.dump() +
                        "; expected one of: " + join(option->values, ", "),
                    key + ": " + option->description);
  }
}

std::string strategy_option(const std::string& name, const nlohmann::json& options,
                            const std::string& key) {
  const StrategyInfo& info = resolve(name);
  for (const auto& o : info.options) {
    if (o.key != key) continue;
    if (options.is_object()) {
      auto it = options.find(key);
      if (it != options.end() && it->is_string()) return it->get<std::string>();
    }
    return o.values.front();
  }
  throw Error(ErrorKind::Internal, "strategy \"" + info.name + "\" has no option \"" + key + "\"");
}

}  // namespace tessera::job
