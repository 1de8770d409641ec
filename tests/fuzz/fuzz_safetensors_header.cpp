// A .safetensors file: the 8-byte header length, the JSON header and the data buffer, opened,
// validated and memory-mapped as the model loader does; every tensor's bytes are then read.
#include "fuzz_support.h"
#include "hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = tessera::fuzz::write_input("model.safetensors", data, size);
  tessera::fuzz::refusal_is_fine([&] {
    const auto file = tessera::hf::SafetensorsFile::open(path);
    std::uint64_t checksum = 0;
    for (const auto& info : file->tensors()) {
      const auto view = file->view(info);
      tessera::fuzz::require(
          view.bytes.size() == info.numel() * tessera::hf::dtype_size(info.dtype),
          "a tensor's bytes match its dtype and shape");
      // Touch both ends: ASan reports a view that reaches past the mapping.
      if (!view.bytes.empty()) checksum += view.bytes.front() + view.bytes.back();
      tessera::fuzz::require(file->find(info.name) == &info, "find() returns the listed tensor");
    }
    (void)checksum;
  });
  return 0;
}
