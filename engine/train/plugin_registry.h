#pragma once
// The plugin registry: name → factory of a Plugin (train/plugin.h). Plugins live in plugins/,
// above this layer, and register explicitly: the runner and every tool or test that builds a
// Trainer calls plugins::register_builtin_plugins() (plugins/builtin_plugins.h) first. No static
// initialisers: a static library drops an object file nothing refers to, and its registration
// with it.
//
// The torch-free side of the same table — descriptions and option validation for the job spec,
// the planner and the GUI — is job/strategies.h; both use the same names. `auto` is never a
// plugin: the planner resolves it before a trainer is built.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "train/plugin.h"

namespace tessera::train {

using PluginFactory = std::function<std::unique_ptr<Plugin>()>;

// Adds `name`, or replaces its factory (registering twice is harmless). Thread-safe.
void register_plugin(const std::string& name, PluginFactory factory);
// The registered names, sorted.
std::vector<std::string> registered_plugins();
// A new plugin of that name; tessera::Error (Unsupported) naming strategy.name and listing the
// registered plugins when there is none.
std::unique_ptr<Plugin> make_plugin(const std::string& name);

}  // namespace tessera::train
