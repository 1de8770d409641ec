// safetensors reader, validator and writer: round trips, sharding, and every kind of bad
// file giving a clear tessera::Error (never a crash).
#include <QTemporaryDir>
#include <QTest>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/files.h"
#include "hf/safetensors.h"

namespace fs = std::filesystem;
using tessera::Error;
using tessera::ErrorKind;
using namespace tessera::hf;

namespace {

const DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,
                            DType::I32, DType::I16, DType::I8,  DType::U8,   DType::BOOL};

std::vector<std::uint8_t> random_bytes(std::size_t n, std::mt19937& rng, bool boolean = false) {
  std::vector<std::uint8_t> out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(boolean ? rng() % 2 : rng() % 256);
  return out;
}

void write_raw(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_raw(const fs::path& path) {
  return tessera::core::read_text_file(path);
}

std::string le64(std::uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
  return out;
}

// A raw safetensors image: header length (or a lie), header text, `data_len` data bytes.
std::string raw_file(const std::string& header, std::size_t data_len,
                     std::optional<std::uint64_t> claimed_len = std::nullopt) {
  return le64(claimed_len.value_or(header.size())) + header + std::string(data_len, '\x11');
}

// Runs `open` and returns the error it must throw.
template <typename F>
Error expect_error(F&& open) {
  try {
    open();
  } catch (const Error& e) {
    return e;
  }
  throw std::runtime_error("expected a tessera::Error, but opening succeeded");
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

class TestSafetensors : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;
  fs::path dir() const { return fs::path(tmp_.path().toStdString()); }

  // Writes `bytes` to a fresh file and checks that opening it fails with InvalidInput and a
  // message naming the file and containing every one of `needles`.
  void expect_invalid_file(const std::string& name, const std::string& bytes,
                           const std::vector<std::string>& needles,
                           ErrorKind kind = ErrorKind::InvalidInput) {
    const fs::path path = dir() / name;
    write_raw(path, bytes);
    Error e = expect_error([&] { SafetensorsFile::open(path); });
    const std::string msg = e.what();
    QVERIFY2(e.kind() == kind, msg.c_str());
    QVERIFY2(contains(msg, path.string()), msg.c_str());
    for (const auto& needle : needles) {
      QVERIFY2(contains(msg, needle), (msg + "  [expected: " + needle + "]").c_str());
    }
  }

  std::string valid_file_bytes() {
    std::mt19937 rng(7);
    auto a = random_bytes(4 * 6, rng);
    auto b = random_bytes(2 * 3, rng);
    auto path = dir() / "valid_source.safetensors";
    write_safetensors(path, {{"a", DType::F32, {2, 3}, a}, {"b", DType::BF16, {3}, b}},
                      {{"format", "pt"}});
    return read_raw(path);
  }

 private Q_SLOTS:
  void initTestCase() { QVERIFY(tmp_.isValid()); }

  void dtypeNamesAndSizes() {
    for (DType d : kAllDTypes) {
      auto back = dtype_from_name(dtype_name(d));
      QVERIFY(back.has_value());
      QCOMPARE(static_cast<int>(*back), static_cast<int>(d));
    }
    QCOMPARE(dtype_size(DType::F64), std::size_t{8});
    QCOMPARE(dtype_size(DType::BF16), std::size_t{2});
    QCOMPARE(dtype_size(DType::BOOL), std::size_t{1});
    QVERIFY(!dtype_from_name("f32").has_value());
  }

  void roundTripEveryDtype() {
    std::mt19937 rng(1);
    std::vector<std::vector<std::uint8_t>> storage;
    std::vector<TensorToWrite> tensors;
    for (DType d : kAllDTypes) {
      std::vector<std::int64_t> shape{3, 5};
      storage.push_back(random_bytes(15 * dtype_size(d), rng, d == DType::BOOL));
      tensors.push_back({std::string("t_") + dtype_name(d), d, shape, storage.back()});
    }
    storage.push_back(random_bytes(4, rng));
    tensors.push_back({"scalar", DType::F32, {}, storage.back()});
    tensors.push_back({"empty", DType::F16, {0, 4}, {}});
    storage.push_back(random_bytes(2 * 7, rng));
    tensors.push_back({"odd.bf16/name ü", DType::BF16, {7}, storage.back()});

    const auto path = dir() / "all_dtypes.safetensors";
    write_safetensors(path, tensors, {{"format", "pt"}, {"note", "round trip"}});

    // The header is space-padded to a multiple of 8, so the data buffer is 8-aligned.
    const std::string raw = read_raw(path);
    std::uint64_t header_len = 0;
    std::memcpy(&header_len, raw.data(), 8);
    QCOMPARE(header_len % 8, std::uint64_t{0});

    auto file = SafetensorsFile::open(path);
    QCOMPARE(file->tensors().size(), tensors.size());
    QCOMPARE(file->metadata().at("format"), std::string("pt"));
    QCOMPARE(file->metadata().at("note"), std::string("round trip"));
    for (const auto& t : tensors) {
      const TensorInfo* info = file->find(t.name);
      QVERIFY2(info != nullptr, t.name.c_str());
      QCOMPARE(static_cast<int>(info->dtype), static_cast<int>(t.dtype));
      QCOMPARE(info->shape, t.shape);
      auto view = file->view(*info);
      QCOMPARE(view.bytes.size(), t.bytes.size());
      QVERIFY(std::equal(view.bytes.begin(), view.bytes.end(), t.bytes.begin()));
      // Every tensor starts aligned to its element size (larger dtypes are written first).
      QCOMPARE(reinterpret_cast<std::uintptr_t>(view.bytes.data()) % dtype_size(t.dtype),
               std::uintptr_t{0});
    }
    QCOMPARE(file->find("scalar")->numel(), std::uint64_t{1});
    QCOMPARE(file->find("empty")->numel(), std::uint64_t{0});

    auto ckpt = SafetensorsCheckpoint::open(path);
    QCOMPARE(ckpt.names().size(), tensors.size());
    std::uint64_t bytes = 0, params = 0;
    for (const auto& t : tensors) {
      bytes += t.bytes.size();
      params += t.bytes.size() / dtype_size(t.dtype);
    }
    QCOMPARE(ckpt.total_bytes(), bytes);
    QCOMPARE(ckpt.parameter_count(), params);
    Error missing = expect_error([&] { ckpt.view("nope"); });
    QVERIFY(contains(missing.what(), "'nope'"));
  }

  void emptyFileRoundTrip() {
    const auto path = dir() / "empty.safetensors";
    write_safetensors(path, {});
    auto file = SafetensorsFile::open(path);
    QVERIFY(file->tensors().empty());
    QCOMPARE(file->file_size() % 8, std::uint64_t{0});
  }

  void writerRefusesBadTensors() {
    std::vector<std::uint8_t> eight(8);
    const auto path = dir() / "bad_write.safetensors";
    Error size = expect_error([&] { write_safetensors(path, {{"w", DType::F32, {3}, eight}}); });
    QVERIFY2(contains(size.what(), "'w'") && contains(size.what(), "needs 12 bytes"), size.what());
    Error dup = expect_error([&] {
      write_safetensors(path, {{"w", DType::F32, {2}, eight}, {"w", DType::F32, {2}, eight}});
    });
    QVERIFY2(contains(dup.what(), "twice"), dup.what());
    Error neg = expect_error([&] { write_safetensors(path, {{"w", DType::U8, {-8}, eight}}); });
    QVERIFY2(contains(neg.what(), "negative"), neg.what());
    QVERIFY(!fs::exists(path));
  }

  // A loader that copies tensors out one at a time (gemini's disk tier, the streamed export's
  // check) drops each one's mapped pages: the checkpoint never ends up resident as a whole.
  void releasingATensorDropsItsPagesFromTheResidentSet() {
    constexpr std::size_t kTensorBytes = 8u << 20;
    std::vector<std::uint8_t> a(kTensorBytes, 1), b(kTensorBytes, 2);
    const auto path = dir() / "resident.safetensors";
    write_safetensors(path, {{"a", DType::U8, {std::int64_t(kTensorBytes)}, a},
                             {"b", DType::U8, {std::int64_t(kTensorBytes)}, b}});
    const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(path);
    // The resident kB of this file's mapping, from /proc/self/smaps.
    const auto resident_kb = [&] {
      std::ifstream smaps("/proc/self/smaps");
      std::string line;
      bool ours = false;
      long kb = 0;
      while (std::getline(smaps, line)) {
        if (line.find('-') != std::string::npos && line.find(':') != 2 &&
            line.find("Rss:") == std::string::npos && std::isxdigit(line[0]))
          ours = line.find(path.filename().string()) != std::string::npos;
        else if (ours && line.rfind("Rss:", 0) == 0)
          kb += std::stol(line.substr(4));
      }
      return kb;
    };
    std::uint64_t sum = 0;
    for (const char* name : {"a", "b"})
      for (std::uint8_t byte : checkpoint.view(name).bytes) sum += byte;
    QCOMPARE(sum, std::uint64_t(3 * kTensorBytes));
    const long both = resident_kb();
    QVERIFY2(both >= long(2 * kTensorBytes / 1024), std::to_string(both).c_str());
    checkpoint.release_resident_pages("a");
    const long one = resident_kb();
    QVERIFY2(one <= long(kTensorBytes / 1024) + 8, std::to_string(one).c_str());
    QVERIFY2(one >= long(kTensorBytes / 1024) - 8, std::to_string(one).c_str());
    checkpoint.release_resident_pages("b");
    QVERIFY2(resident_kb() <= 8, std::to_string(resident_kb()).c_str());
    // The mapping stays valid: a later read faults the pages in again.
    QCOMPARE(checkpoint.view("b").bytes[kTensorBytes - 1], std::uint8_t(2));
  }

  void shardedWriteAndRead() {
    std::mt19937 rng(2);
    std::vector<std::vector<std::uint8_t>> storage;
    std::vector<TensorToWrite> tensors;
    for (int i = 0; i < 10; ++i) {
      storage.push_back(random_bytes(100, rng));
      tensors.push_back(
          {"layer." + std::to_string(i) + ".weight", DType::F32, {25}, storage.back()});
    }
    storage.push_back(random_bytes(1000, rng));  // larger than a shard: a shard of its own
    tensors.push_back({"big", DType::I16, {20, 25}, storage.back()});

    const auto model = dir() / "sharded";
    // A stale single file from an earlier save must not survive next to the new shards.
    fs::create_directories(model);
    write_safetensors(model / "model.safetensors", {tensors[0]});

    auto written = write_safetensors_sharded(model, tensors, 250, {{"format", "pt"}});
    // 10 x 100 bytes at most 250 per shard: 5 shards of two, then "big" alone.
    QCOMPARE(written.size(), std::size_t{7});
    QCOMPARE(written[0].filename().string(), std::string("model-00001-of-00006.safetensors"));
    QCOMPARE(written[5].filename().string(), std::string("model-00006-of-00006.safetensors"));
    QCOMPARE(written[6].filename().string(), std::string("model.safetensors.index.json"));
    QVERIFY(!fs::exists(model / "model.safetensors"));

    auto index = nlohmann::json::parse(read_raw(model / "model.safetensors.index.json"));
    QCOMPARE(index["metadata"]["total_size"].get<std::uint64_t>(), std::uint64_t{2000});
    QCOMPARE(index["metadata"]["total_parameters"].get<std::uint64_t>(), std::uint64_t{750});
    QCOMPARE(index["weight_map"].size(), tensors.size());
    QCOMPARE(index["weight_map"]["layer.0.weight"].get<std::string>(),
             std::string("model-00001-of-00006.safetensors"));
    QCOMPARE(index["weight_map"]["layer.3.weight"].get<std::string>(),
             std::string("model-00002-of-00006.safetensors"));
    QCOMPARE(index["weight_map"]["big"].get<std::string>(),
             std::string("model-00006-of-00006.safetensors"));

    auto ckpt = SafetensorsCheckpoint::open(model);
    QCOMPARE(ckpt.files().size(), std::size_t{6});
    QCOMPARE(ckpt.names().size(), tensors.size());
    QCOMPARE(ckpt.total_bytes(), std::uint64_t{2000});
    for (const auto& t : tensors) {
      auto view = ckpt.view(t.name);
      QVERIFY(std::equal(view.bytes.begin(), view.bytes.end(), t.bytes.begin(), t.bytes.end()));
    }
    for (const auto& f : ckpt.files()) QCOMPARE(f->metadata().at("format"), std::string("pt"));
    // Opening the index file itself works too.
    QCOMPARE(SafetensorsCheckpoint::open(model / "model.safetensors.index.json").names().size(),
             tensors.size());

    // Saving again with fewer shards removes the stale ones; everything fitting makes one file.
    written = write_safetensors_sharded(model, tensors, 1 << 20);
    QCOMPARE(written.size(), std::size_t{1});
    QCOMPARE(written[0].filename().string(), std::string("model.safetensors"));
    QVERIFY(!fs::exists(model / "model.safetensors.index.json"));
    QVERIFY(!fs::exists(model / "model-00001-of-00006.safetensors"));
    QCOMPARE(SafetensorsCheckpoint::open(model).names().size(), tensors.size());
  }

  // Tensors arriving one at a time, in reverse order: the same files, byte for byte, as the
  // one-call writer; a tensor of the wrong size or a missing one is refused; without finish()
  // nothing is left behind.
  void streamingWriterWritesTheSameFiles() {
    std::mt19937 rng(3);
    std::vector<std::vector<std::uint8_t>> storage;
    std::vector<TensorToWrite> tensors;
    for (int i = 0; i < 7; ++i) {
      storage.push_back(random_bytes(100, rng));
      tensors.push_back({"layer." + std::to_string(i) + ".weight", i % 2 ? DType::BF16 : DType::F32,
                         i % 2 ? std::vector<std::int64_t>{50} : std::vector<std::int64_t>{25},
                         storage.back()});
    }
    for (std::uint64_t shard_bytes : {std::uint64_t{250}, std::uint64_t{1} << 20}) {
      const auto reference = dir() / ("stream-ref-" + std::to_string(shard_bytes));
      const auto streamed = dir() / ("stream-" + std::to_string(shard_bytes));
      fs::remove_all(reference);
      fs::remove_all(streamed);
      fs::create_directories(streamed);
      const auto expected =
          write_safetensors_sharded(reference, tensors, shard_bytes, {{"format", "pt"}});
      std::vector<TensorToWrite> layout = tensors;
      for (auto& t : layout) t.bytes = {};
      StreamingSafetensorsWriter writer(streamed, layout, shard_bytes, {{"format", "pt"}});
      for (auto it = tensors.rbegin(); it != tensors.rend(); ++it)
        writer.write(it->name, it->bytes);
      const auto written = writer.finish();
      QCOMPARE(written.size(), expected.size());
      for (std::size_t i = 0; i < written.size(); ++i) {
        QCOMPARE(written[i].filename(), expected[i].filename());
        QVERIFY2(read_raw(written[i]) == read_raw(expected[i]), written[i].c_str());
      }
    }

    const auto broken = dir() / "stream-broken";
    fs::remove_all(broken);
    fs::create_directories(broken);
    {
      std::vector<TensorToWrite> layout = tensors;
      for (auto& t : layout) t.bytes = {};
      StreamingSafetensorsWriter writer(broken, layout, 1 << 20);
      try {
        writer.write("layer.0.weight", std::span<const std::uint8_t>(storage[0].data(), 10));
        QFAIL("expected an error for a tensor of the wrong size");
      } catch (const tessera::Error& e) {
        QVERIFY2(std::string(e.what()).find("needs 100 bytes, got 10") != std::string::npos,
                 e.what());
      }
      writer.write("layer.0.weight", tensors[0].bytes);
      try {
        writer.finish();
        QFAIL("expected an error for the tensors never written");
      } catch (const tessera::Error& e) {
        QVERIFY2(std::string(e.what()).find("was never written") != std::string::npos, e.what());
      }
    }
    QVERIFY(fs::is_empty(broken));
  }

  void truncatedFiles() {
    const std::string good = valid_file_bytes();
    std::uint64_t header_len = 0;
    std::memcpy(&header_len, good.data(), 8);
    const std::size_t data_begin = 8 + header_len;
    struct Cut {
      std::size_t at;
      const char* fault;
    };
    const Cut cuts[] = {{0, "too short"},
                        {5, "too short"},
                        {8, "runs past the end of the file"},
                        {20, "runs past the end of the file"},
                        {data_begin - 1, "runs past the end of the file"},
                        {data_begin, "run past the data buffer"},
                        {data_begin + 3, "run past the data buffer"},
                        {good.size() - 1, "run past the data buffer"}};
    for (const auto& cut : cuts) {
      expect_invalid_file("truncated_" + std::to_string(cut.at) + ".safetensors",
                          good.substr(0, cut.at), {cut.fault});
    }
  }

  void badHeaderLength() {
    const std::string header = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
    expect_invalid_file("huge_len.safetensors", raw_file(header, 4, std::uint64_t{1} << 63),
                        {"header length 9223372036854775808", "exceeds the limit"});
    expect_invalid_file("past_end_len.safetensors", raw_file(header, 4, 1000),
                        {"header length 1000", "runs past the end"});
    // Lying lengths inside the file: the JSON is cut short, or swallows data bytes.
    expect_invalid_file("short_len.safetensors", raw_file(header, 4, header.size() - 3),
                        {"not valid UTF-8 JSON"});
    expect_invalid_file("long_len.safetensors", raw_file(header, 4, header.size() + 2),
                        {"not valid UTF-8 JSON"});
    expect_invalid_file("zero_len.safetensors", raw_file("", 0), {"not a JSON object"});
  }

  void headerNotJsonObject() {
    expect_invalid_file("text.safetensors", raw_file("hello world", 0), {"not a JSON object"});
    expect_invalid_file("array.safetensors", raw_file("[1, 2]", 0), {"not a JSON object"});
    expect_invalid_file("broken.safetensors", raw_file(R"({"a": {"dtype": )", 0),
                        {"not valid UTF-8 JSON"});
    expect_invalid_file("bad_utf8.safetensors",
                        raw_file("{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[0],"
                                 "\"data_offsets\":[0,0]}}",
                                 0),
                        {"not valid UTF-8 JSON"});
    std::string deep = "{\"__metadata__\":" + std::string(200, '[') + std::string(200, ']') + "}";
    expect_invalid_file("deep.safetensors", raw_file(deep, 0), {"nested deeper"});
  }

  void badEntries() {
    auto one = [](const std::string& entry, std::size_t data_len) {
      return raw_file("{\"w\":" + entry + "}", data_len);
    };
    expect_invalid_file("unknown_dtype.safetensors",
                        one(R"({"dtype":"F12","shape":[2],"data_offsets":[0,8]})", 8),
                        {"'w'", "unknown dtype 'F12'"});
    expect_invalid_file("unsupported_dtype.safetensors",
                        one(R"({"dtype":"U32","shape":[2],"data_offsets":[0,8]})", 8),
                        {"'w'", "'U32' is not supported"}, ErrorKind::Unsupported);
    expect_invalid_file("no_dtype.safetensors", one(R"({"shape":[2],"data_offsets":[0,8]})", 8),
                        {"'w'", "missing \"dtype\""});
    expect_invalid_file("dtype_type.safetensors",
                        one(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})", 8),
                        {"'w'", "\"dtype\" must be a string"});
    expect_invalid_file("shape_type.safetensors",
                        one(R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})", 8),
                        {"'w'", "\"shape\" must be an array"});
    expect_invalid_file("negative_dim.safetensors",
                        one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", 8),
                        {"'w'", "shape[0] must be a non-negative integer"});
    expect_invalid_file("float_dim.safetensors",
                        one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", 8),
                        {"'w'", "shape[0] must be a non-negative integer"});
    expect_invalid_file("offsets_arity.safetensors",
                        one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4,8]})", 8),
                        {"'w'", "\"data_offsets\" must be an array [begin, end]"});
    expect_invalid_file("entry_type.safetensors", one("[1]", 0), {"'w'", "must be an object"});
    expect_invalid_file("begin_after_end.safetensors",
                        one(R"({"dtype":"U8","shape":[0],"data_offsets":[8,0]})", 8),
                        {"'w'", "begin 8 > end 0"});
    expect_invalid_file("size_mismatch.safetensors",
                        one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", 8),
                        {"'w'", "needs 12 bytes", "span 8"});
    expect_invalid_file(
        "shape_overflow.safetensors",
        one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})", 8),
        {"'w'", "overflows"});
    expect_invalid_file("huge_dim.safetensors",
                        one(R"({"dtype":"U8","shape":[18446744073709551615],)"
                            R"("data_offsets":[0,8]})",
                            8),
                        {"'w'", "too large"});
    expect_invalid_file(
        "huge_offset.safetensors",
        one(R"({"dtype":"U8","shape":[8],"data_offsets":[18446744073709551608,18446744073709551616]})",
            8),
        {"'w'", "data_offsets[1] must be a non-negative integer"});
    expect_invalid_file("out_of_bounds.safetensors",
                        one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 4),
                        {"'w'", "run past the data buffer"});
    expect_invalid_file(
        "metadata_type.safetensors",
        raw_file(
            R"({"__metadata__":{"format":1},"w":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})",
            0),
        {"__metadata__", "'format'", "must be a string"});
    expect_invalid_file("metadata_not_object.safetensors", raw_file(R"({"__metadata__":"pt"})", 0),
                        {"__metadata__ must be an object"});
  }

  void badLayout() {
    const std::string a8 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
    expect_invalid_file(
        "overlap.safetensors",
        raw_file("{" + a8 + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
        {"'b'", "overlap tensor 'a'"});
    expect_invalid_file(
        "gap.safetensors",
        raw_file("{" + a8 + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
        {"'b'", "gap", "[8, 12)"});
    expect_invalid_file("late_start.safetensors",
                        raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                        {"'a'", "gap", "[0, 4)"});
    expect_invalid_file("trailing.safetensors", raw_file("{" + a8 + "}", 12), {"4 trailing bytes"});
    expect_invalid_file("no_tensors_trailing.safetensors", raw_file("{}", 3), {"3 trailing bytes"});
    expect_invalid_file(
        "duplicate.safetensors",
        raw_file("{" + a8 + R"(,"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
        {"duplicate key 'a'"});
    expect_invalid_file(
        "duplicate_field.safetensors",
        raw_file(R"({"a":{"dtype":"F32","dtype":"U8","shape":[2],"data_offsets":[0,8]}})", 8),
        {"duplicate key 'dtype'"});
    // Zero-length tensors may share an offset with their neighbours.
    const auto ok = dir() / "zero_len_ok.safetensors";
    write_raw(ok,
              raw_file("{" + a8 + R"(,"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})", 8));
    QCOMPARE(SafetensorsFile::open(ok)->tensors().size(), std::size_t{2});
  }

  void missingShard() {
    const auto model = dir() / "missing_shard";
    std::vector<std::uint8_t> bytes(8);
    write_safetensors_sharded(model, {{"a", DType::F32, {2}, bytes}, {"b", DType::F32, {2}, bytes}},
                              8);
    fs::remove(model / "model-00002-of-00002.safetensors");
    Error e = expect_error([&] { SafetensorsCheckpoint::open(model); });
    const std::string msg = e.what();
    QVERIFY(e.kind() == ErrorKind::InvalidInput);
    QVERIFY2(contains(msg, (model / "model.safetensors.index.json").string()), msg.c_str());
    QVERIFY2(contains(msg, "'model-00002-of-00002.safetensors'"), msg.c_str());
    QVERIFY2(contains(msg, "does not exist"), msg.c_str());
  }

  void indexNamesWrongShard() {
    const auto model = dir() / "wrong_shard";
    std::vector<std::uint8_t> bytes(8);
    write_safetensors_sharded(model, {{"a", DType::F32, {2}, bytes}, {"b", DType::F32, {2}, bytes}},
                              8);
    tessera::core::write_file_atomic(model / "model.safetensors.index.json",
                                     R"({"weight_map":{"a":"model-00002-of-00002.safetensors",)"
                                     R"("b":"model-00002-of-00002.safetensors"}})");
    Error e = expect_error([&] { SafetensorsCheckpoint::open(model); });
    QVERIFY2(contains(e.what(), "'a'") && contains(e.what(), "does not hold it"), e.what());
  }

  void indexEscapingFolder() {
    const auto model = dir() / "escape" / "model";
    fs::create_directories(model);
    std::vector<std::uint8_t> bytes(8);
    write_safetensors(dir() / "escape" / "outside.safetensors", {{"a", DType::F32, {2}, bytes}});
    const auto index = model / "model.safetensors.index.json";
    auto expect_refused = [&](const std::string& shard, const std::string& fault) {
      tessera::core::write_file_atomic(index,
                                       nlohmann::json{{"weight_map", {{"a", shard}}}}.dump());
      Error e = expect_error([&] { SafetensorsCheckpoint::open(model); });
      const std::string msg = e.what();
      QVERIFY2(e.kind() == ErrorKind::InvalidInput, msg.c_str());
      QVERIFY2(contains(msg, index.string()), msg.c_str());
      QVERIFY2(contains(msg, fault), (msg + "  [expected: " + fault + "]").c_str());
    };
    expect_refused("../outside.safetensors", "'..'");
    expect_refused((dir() / "escape" / "outside.safetensors").string(), "not a relative path");
    fs::create_symlink(dir() / "escape" / "outside.safetensors", model / "link.safetensors");
    expect_refused("link.safetensors", "outside the model folder");
    fs::create_directories(model / "sub");
    fs::create_directory_symlink(dir() / "escape", model / "sub" / "up");
    expect_refused("sub/up/outside.safetensors", "outside the model folder");
  }

  void huggingFaceCacheLayoutAllowed() {
    // <repo>/snapshots/<rev>/model.safetensors -> ../../blobs/<hash>, as the hub cache has.
    const auto repo = dir() / "models--org--tiny";
    fs::create_directories(repo / "blobs");
    fs::create_directories(repo / "snapshots" / "abc123");
    std::vector<std::uint8_t> bytes(8, 3);
    write_safetensors(repo / "blobs" / "deadbeef", {{"a", DType::F32, {2}, bytes}});
    tessera::core::write_file_atomic(repo / "blobs" / "cafe",
                                     R"({"weight_map":{"a":"model.safetensors"}})");
    fs::create_symlink("../../blobs/deadbeef", repo / "snapshots" / "abc123" / "model.safetensors");
    fs::create_symlink("../../blobs/cafe",
                       repo / "snapshots" / "abc123" / "model.safetensors.index.json");
    auto ckpt = SafetensorsCheckpoint::open(repo / "snapshots" / "abc123");
    QCOMPARE(ckpt.names(), std::vector<std::string>{"a"});
    QCOMPARE(ckpt.view("a").bytes[0], std::uint8_t{3});
  }

  void pickleRefused() {
    auto check = [](const Error& e, const std::string& file) {
      const std::string msg = e.what();
      QVERIFY2(e.kind() == ErrorKind::InvalidInput, msg.c_str());
      QVERIFY2(contains(msg, file), msg.c_str());
      QVERIFY2(contains(msg, "arbitrary code"), msg.c_str());
      QVERIFY2(contains(msg, "never unpickles"), msg.c_str());
      QVERIFY2(contains(e.hint(), "safe_serialization=True"), e.hint().c_str());
      QVERIFY2(contains(e.hint(), "safetensors.torch.save_file"), e.hint().c_str());
    };
    const auto model = dir() / "pickle_model";
    fs::create_directories(model);
    write_raw(model / "config.json", "{}");
    write_raw(model / "pytorch_model.bin", "PK\x03\x04 not really a zip");
    check(expect_error([&] { SafetensorsCheckpoint::open(model); }),
          (model / "pytorch_model.bin").string());
    check(expect_error([&] { SafetensorsCheckpoint::open(model / "pytorch_model.bin"); }),
          (model / "pytorch_model.bin").string());
    for (const char* name : {"weights.pt", "weights.pth", "last.ckpt"}) {
      write_raw(dir() / name, "\x80\x02}q\x00.");
      check(expect_error([&] { SafetensorsCheckpoint::open(dir() / name); }),
            (dir() / name).string());
    }
    // No telling extension, but the bytes of a torch zip archive.
    write_raw(dir() / "weights", "PK\x03\x04....");
    check(expect_error([&] { SafetensorsCheckpoint::open(dir() / "weights"); }),
          (dir() / "weights").string());
    // A safetensors file next to a pickle is used, and the pickle is ignored.
    std::vector<std::uint8_t> bytes(4);
    write_safetensors(model / "model.safetensors", {{"a", DType::F32, {1}, bytes}});
    QCOMPARE(SafetensorsCheckpoint::open(model).names().size(), std::size_t{1});
  }

  void folderWithoutWeights() {
    const auto model = dir() / "no_weights";
    fs::create_directories(model);
    write_raw(model / "config.json", "{}");
    Error e = expect_error([&] { SafetensorsCheckpoint::open(model); });
    const std::string msg = e.what();
    QVERIFY(e.kind() == ErrorKind::InvalidInput);
    QVERIFY2(contains(msg, model.string()), msg.c_str());
    QVERIFY2(contains(msg, "model.safetensors.index.json") && contains(msg, "model.safetensors") &&
                 contains(msg, "pytorch_model.bin"),
             msg.c_str());
    Error gone = expect_error([&] { SafetensorsCheckpoint::open(dir() / "does_not_exist"); });
    QVERIFY2(contains(gone.what(), "no such file or folder"), gone.what());
  }

  // Random corruptions of a valid file: opening either succeeds with views inside the file,
  // or throws tessera::Error; it never crashes or reads out of bounds.
  void corruptedFilesNeverCrash() {
    const std::string good = valid_file_bytes();
    std::mt19937 rng(12345);
    const auto path = dir() / "fuzz.safetensors";
    int failures = 0, successes = 0;
    for (int round = 0; round < 3000; ++round) {
      std::string bytes = good;
      switch (rng() % 3) {
        case 0:
          bytes.resize(rng() % bytes.size());
          break;
        case 1:
          for (int flips = 1 + static_cast<int>(rng() % 4); flips > 0; --flips) {
            bytes[rng() % bytes.size()] ^= static_cast<char>(1u << (rng() % 8));
          }
          break;
        default:
          bytes[rng() % std::min<std::size_t>(bytes.size(), 80)] =
              static_cast<char>("{}[]\",:0123456789-e. \xff"[rng() % 23]);
          break;
      }
      write_raw(path, bytes);
      try {
        auto file = SafetensorsFile::open(path);
        std::uint64_t covered = 0;
        unsigned checksum = 0;
        for (const auto& t : file->tensors()) {
          auto view = file->view(t);
          covered += view.bytes.size();
          for (auto b : view.bytes) checksum += b;  // touches every byte of the view
        }
        QVERIFY(covered + 8 <= file->file_size());
        ++successes;
        (void)checksum;
      } catch (const Error&) {
        ++failures;
      }
    }
    QVERIFY(failures > 1000);
    QVERIFY(successes > 0);  // flips inside tensor data leave a valid file
  }
};

QTEST_APPLESS_MAIN(TestSafetensors)
#include "test_safetensors.moc"
