// A sharded checkpoint's model.safetensors.index.json, opened through the model folder as the
// loader does, beside real shards; every tensor it maps is then looked up and read.
#include <vector>

#include "fuzz_support.h"
#include "hf/safetensors.h"

namespace {

// The shards the seeds' indexes name: model-0000{1,2}-of-00002 and model.safetensors.
const std::filesystem::path& model_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path made = tessera::fuzz::scratch_dir() / "model";
    std::filesystem::create_directories(made);
    const std::vector<std::uint8_t> w(6 * 4, 1);
    const std::vector<std::uint8_t> ids(2 * 8, 2);
    using tessera::hf::DType;
    tessera::hf::write_safetensors(made / "model-00001-of-00002.safetensors",
                                   {{"w", DType::F32, {2, 3}, w}});
    tessera::hf::write_safetensors(made / "model-00002-of-00002.safetensors",
                                   {{"ids", DType::I64, {2}, ids}});
    return made;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path index = model_dir() / "model.safetensors.index.json";
  {
    std::ofstream out(index, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  tessera::fuzz::refusal_is_fine([&] {
    const auto checkpoint = tessera::hf::SafetensorsCheckpoint::open(model_dir());
    for (const std::string& name : checkpoint.names()) {
      const auto view = checkpoint.view(name);
      tessera::fuzz::require(view.info != nullptr && view.info->name == name,
                             "a mapped name views its own tensor");
      tessera::fuzz::require(checkpoint.contains(name), "a listed name is contained");
    }
    (void)checkpoint.total_bytes();
    (void)checkpoint.parameter_count();
  });
  return 0;
}
