// Finds and loads the CUDA runtime module (runtime.h) before main(), where it should be loaded.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/runtime.h"

namespace tessera::cuda {
namespace {

constexpr const char* kModuleName = "libtessera_cuda.so";

struct Loaded {
  const Runtime* runtime = nullptr;
  std::string path;
  std::string status;
};

std::string program_directory() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string() : self.parent_path().string();
}

std::vector<std::string> candidate_paths() {
  std::vector<std::string> paths;
  if (const char* explicit_path = std::getenv("TESSERA_CUDA_MODULE");
      explicit_path && *explicit_path)
    return {explicit_path};
  const std::string directory = program_directory();
  if (!directory.empty()) {
    paths.push_back(directory + "/" + kModuleName);                 // a folder of binaries
    paths.push_back(directory + "/../lib/tessera/" + kModuleName);  // an installed tree
  }
#ifdef TESSERA_CUDA_MODULE_BUILD_PATH
  paths.push_back(TESSERA_CUDA_MODULE_BUILD_PATH);  // the build tree
#endif
  return paths;
}

Loaded load() {
  Loaded loaded;
  const char* choice = std::getenv("TESSERA_CUDA");
  const std::string wanted = choice ? choice : "";
  if (wanted == "0") {
    loaded.status = "not loaded: TESSERA_CUDA=0";
    return loaded;
  }
  if (wanted != "1") {
    // The driver's library: without it LibTorch could not use a GPU anyway. Kept open, as
    // LibTorch's CUDA runtime opens it again.
    if (::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) == nullptr) {
      loaded.status = "not loaded: no NVIDIA driver (libcuda.so.1) on this machine";
      return loaded;
    }
  }
  std::string errors;
  for (const std::string& path : candidate_paths()) {
    std::error_code error;
    if (!std::filesystem::exists(path, error)) continue;
    // Global: LibTorch's CUDA library opens more of its own later (linalg, nvrtc), which bind
    // to the symbols of the libraries the module brought in.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      errors += std::string(errors.empty() ? "" : "; ") + (why ? why : path);
      continue;
    }
    using Entry = const Runtime* (*)(int);
    auto entry = reinterpret_cast<Entry>(::dlsym(handle, "tessera_cuda_runtime"));
    const Runtime* runtime = entry ? entry(kRuntimeAbi) : nullptr;
    if (runtime == nullptr) {
      errors += std::string(errors.empty() ? "" : "; ") + path +
                " is from another build of Tessera (its interface differs)";
      continue;
    }
    loaded.runtime = runtime;
    loaded.path = std::filesystem::weakly_canonical(path, error).string();
    if (error) loaded.path = path;
    loaded.status = "loaded from " + loaded.path;
    return loaded;
  }
  const char* named = std::getenv("TESSERA_CUDA_MODULE");
  if (!errors.empty()) {
    loaded.status = "not loaded: " + errors;
  } else if (named != nullptr && *named != '\0') {
    loaded.status = std::string("not loaded: TESSERA_CUDA_MODULE names ") + named +
                    ", which does not exist (unset it to look beside the program)";
  } else {
#ifdef TESSERA_CUDA_MODULE_BUILD_PATH
    loaded.status = std::string("not installed: no ") + kModuleName +
                    " beside the program, in ../lib/tessera or in the build tree (install the "
                    "tessera-cuda package, or set TESSERA_CUDA_MODULE)";
#else
    loaded.status =
        "not built: this build of Tessera has no CUDA module (configure it with the "
        "CUDA toolkit present and TESSERA_WITH_CUDA on)";
#endif
  }
  return loaded;
}

const Loaded& loaded() {
  static const Loaded once = load();
  return once;
}

// Before main(): nothing may ask LibTorch about CUDA before the module is in (runtime.h).
const bool kLoadedAtStart = [] {
  (void)loaded();
  return true;
}();

}  // namespace

const Runtime* runtime() {
  return loaded().runtime;
}

std::string runtime_status() {
  return loaded().status;
}

std::string runtime_path() {
  return loaded().path;
}

std::string runtime_note() {
  return loaded().runtime != nullptr ? std::string()
                                     : " (Tessera's CUDA module is " + loaded().status + ")";
}

}  // namespace tessera::cuda
