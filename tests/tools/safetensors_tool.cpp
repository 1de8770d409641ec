// tessera-st-tool: test-only front end to engine/hf/safetensors, so pytest can compare our
// reader and writer with the Python `safetensors` package.
//   tessera-st-tool dump PATH                 tensors of a file or model folder as JSON
//   tessera-st-tool reshard SRC DIR MAX_BYTES  rewrite SRC into DIR with
//                                             write_safetensors_sharded; prints the files
// Exit codes: 0 ok, 2 bad input (tessera::Error InvalidInput/Usage/Unsupported), 1 otherwise.
#include <QByteArrayView>
#include <QCryptographicHash>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "hf/safetensors.h"

namespace {

using nlohmann::json;
namespace hf = tessera::hf;

std::string sha256_hex(std::span<const std::uint8_t> bytes) {
  QCryptographicHash hash(QCryptographicHash::Sha256);
  // Fed in pieces: QByteArrayView's size is signed and a tensor may be large.
  constexpr std::size_t kChunk = std::size_t{1} << 30;
  for (std::size_t at = 0; at < bytes.size(); at += kChunk) {
    std::size_t n = std::min(kChunk, bytes.size() - at);
    hash.addData(QByteArrayView(reinterpret_cast<const char*>(bytes.data() + at),
                                static_cast<qsizetype>(n)));
  }
  return hash.result().toHex().toStdString();
}

int dump(const std::string& path) {
  auto ckpt = hf::SafetensorsCheckpoint::open(path);
  json out;
  out["files"] = json::array();
  json metadata = json::object();
  for (const auto& f : ckpt.files()) {
    out["files"].push_back(f->path().filename().string());
    metadata[f->path().filename().string()] = f->metadata();
  }
  out["metadata"] = metadata;
  json tensors = json::array();
  for (const auto& name : ckpt.names()) {
    auto view = ckpt.view(name);
    tensors.push_back({{"name", name},
                       {"dtype", hf::dtype_name(view.info->dtype)},
                       {"shape", view.info->shape},
                       {"nbytes", view.bytes.size()},
                       {"sha256", sha256_hex(view.bytes)}});
  }
  out["tensors"] = tensors;
  out["total_bytes"] = ckpt.total_bytes();
  out["parameter_count"] = ckpt.parameter_count();
  std::cout << out.dump(1) << "\n";
  return 0;
}

int reshard(const std::string& src, const std::string& dir, const std::string& max_bytes_text) {
  char* end = nullptr;
  unsigned long long max_bytes = std::strtoull(max_bytes_text.c_str(), &end, 10);
  if (end == max_bytes_text.c_str() || *end != '\0') {
    throw tessera::Error(tessera::ErrorKind::Usage, "MAX_BYTES must be a number");
  }
  auto ckpt = hf::SafetensorsCheckpoint::open(src);
  std::vector<hf::TensorToWrite> tensors;
  for (const auto& name : ckpt.names()) {
    auto view = ckpt.view(name);
    tensors.push_back({name, view.info->dtype, view.info->shape, view.bytes});
  }
  std::map<std::string, std::string> metadata;
  if (!ckpt.files().empty()) metadata = ckpt.files().front()->metadata();
  auto written = hf::write_safetensors_sharded(dir, tensors, max_bytes, metadata);
  json out = json::array();
  for (const auto& p : written) out.push_back(p.filename().string());
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 2 && args[0] == "dump") return dump(args[1]);
    if (args.size() == 4 && args[0] == "reshard") return reshard(args[1], args[2], args[3]);
    std::cerr << "usage: tessera-st-tool dump PATH | reshard SRC DIR MAX_BYTES\n";
    return 2;
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    switch (e.kind()) {
      case tessera::ErrorKind::InvalidInput:
      case tessera::ErrorKind::Usage:
      case tessera::ErrorKind::Unsupported:
        return 2;
      default:
        return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
