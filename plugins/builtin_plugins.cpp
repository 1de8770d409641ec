#include "plugins/builtin_plugins.h"

#include <mutex>

#include "plugins/ddp/ddp_plugin.h"
#include "plugins/gemini/gemini_plugin.h"
#include "plugins/hybrid/hybrid_plugin.h"
#include "plugins/single/single_plugin.h"
#include "plugins/zero/zero_plugin.h"

namespace tessera::plugins {

void register_builtin_plugins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_single_plugin();
    register_gemini_plugin();
    register_ddp_plugin();
    register_zero_plugin();
    register_hybrid_plugin();
  });
}

}  // namespace tessera::plugins
