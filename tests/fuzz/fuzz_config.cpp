// config.json as the model loader reads it: parsed, the family resolved and every field checked.
#include "fuzz_support.h"
#include "hf/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = tessera::fuzz::write_input("config.json", data, size);
  tessera::fuzz::refusal_is_fine([&] { (void)tessera::hf::load_model_config(path); });
  return 0;
}
