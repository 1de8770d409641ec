#pragma once
// Every plugin this build has, registered in one call. The runner and every tool or test that
// builds a Trainer call it first (registration is explicit: see train/plugin_registry.h).

namespace tessera::plugins {

// Idempotent and thread-safe.
void register_builtin_plugins();

}  // namespace tessera::plugins
