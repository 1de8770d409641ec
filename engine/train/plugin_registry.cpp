#include "train/plugin_registry.h"

#include <map>
#include <mutex>

#include "core/error.h"

namespace tessera::train {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, PluginFactory> factories;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_plugin(const std::string& name, PluginFactory factory) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> registered_plugins() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.factories) names.push_back(name);
  return names;
}

std::unique_ptr<Plugin> make_plugin(const std::string& name) {
  PluginFactory factory;
  std::string available;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (auto it = r.factories.find(name); it != r.factories.end()) factory = it->second;
    for (const auto& [n, f] : r.factories) available += (available.empty() ? "" : ", ") + n;
  }
  if (factory) return factory();
  if (available.empty())
    throw Error(ErrorKind::Internal,
                "strategy.name: plugin \"" + name + "\": no plugin is registered",
                "call plugins::register_builtin_plugins() before building a trainer");
  if (name == "auto")
    throw_unsupported("strategy.name: \"auto\" is not a plugin; the planner resolves it",
                      "plan the job first (plan::apply_settings), or name a plugin: " + available);
  throw_unsupported("strategy.name: plugin \"" + name + "\" is not available",
                    "available plugins: " + available);
}

}  // namespace tessera::train
