// The GGUF writer's parts that tests/parity/test_gguf_export.py cannot reach with random weights:
// half-precision rounding at its edges (every half value round-trips; ties go to even;
// subnormals; overflow to inf), q8_0's zero blocks and ties, and the container's reader refusing
// what is not a whole GGUF v3 file, naming the byte at fault.
#include <QtTest>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "export/gguf_file.h"
#include "export/gguf_quant.h"

using tessera::Error;
using tessera::ErrorKind;
namespace gguf = tessera::exporter::gguf;

namespace {

std::span<const std::uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// A small file: metadata of each kind we write and two tensors, data zeroed.
std::string small_file(std::uint32_t alignment, gguf::Layout* layout_out = nullptr) {
  gguf::Metadata m;
  m.add_string("general.architecture", "llama");
  m.add_u32("general.alignment", alignment);
  m.add_f32("llama.rope.freq_base", 10000.0f);
  m.add_bool("tokenizer.ggml.add_bos_token", true);
  const std::vector<std::string> tokens = {"<s>", "a", "ü"};
  m.add_strings("tokenizer.ggml.tokens", tokens);
  const std::vector<std::int32_t> types = {3, 1, 1};
  m.add_i32s("tokenizer.ggml.token_type", types);
  gguf::TensorInfo a{"token_embd.weight", {64, 3}, gguf::TensorType::Q8_0, 0};
  gguf::TensorInfo b{"output_norm.weight", {5}, gguf::TensorType::F32, 0};
  gguf::Layout layout = gguf::lay_out(m, {a, b});
  std::string file = layout.header + std::string(layout.data_bytes, '\0');
  if (layout_out) *layout_out = layout;
  return file;
}

void expect_invalid(const std::string& file, const char* needle) {
  try {
    gguf::read_contents(bytes_of(file), "x.gguf");
    QFAIL(qPrintable(QString("accepted; expected an error with \"%1\"").arg(needle)));
  } catch (const Error& e) {
    QCOMPARE(e.kind(), ErrorKind::InvalidInput);
    QVERIFY2(std::string(e.what()).find("x.gguf: byte ") == 0, e.what());
    QVERIFY2(std::string(e.what()).find(needle) != std::string::npos, e.what());
  }
}

}  // namespace

class GgufTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void everyHalfValueRoundTrips() {
    for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
      const float f = gguf::half_to_float(static_cast<std::uint16_t>(h));
      if (std::isnan(f)) {
        QVERIFY((gguf::float_to_half(f) & 0x7C00) == 0x7C00 && (gguf::float_to_half(f) & 0x3FF));
        continue;
      }
      QCOMPARE(gguf::float_to_half(f), static_cast<std::uint16_t>(h));
    }
  }

  void halfRoundsToNearestEven() {
    QCOMPARE(gguf::float_to_half(1.0f), std::uint16_t(0x3C00));
    QCOMPARE(gguf::float_to_half(-0.0f), std::uint16_t(0x8000));
    QCOMPARE(gguf::float_to_half(1.0f + std::ldexp(1.0f, -11)), std::uint16_t(0x3C00));  // tie
    QCOMPARE(gguf::float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), std::uint16_t(0x3C02));
    QCOMPARE(gguf::float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)),
             std::uint16_t(0x3C01));  // just past the tie
    QCOMPARE(gguf::float_to_half(65504.0f), std::uint16_t(0x7BFF));
    QCOMPARE(gguf::float_to_half(65519.0f), std::uint16_t(0x7BFF));
    QCOMPARE(gguf::float_to_half(65520.0f), std::uint16_t(0x7C00));  // rounds past the largest
    QCOMPARE(gguf::float_to_half(1e30f), std::uint16_t(0x7C00));
    QCOMPARE(gguf::float_to_half(-std::numeric_limits<float>::infinity()), std::uint16_t(0xFC00));
    QCOMPARE(gguf::float_to_half(std::ldexp(1.0f, -24)), std::uint16_t(0x0001));  // subnormal
    QCOMPARE(gguf::float_to_half(std::ldexp(1.0f, -25)), std::uint16_t(0x0000));  // tie → even
    QCOMPARE(gguf::float_to_half(3 * std::ldexp(1.0f, -25)), std::uint16_t(0x0002));
    QCOMPARE(gguf::float_to_half(std::ldexp(1.0f, -14)), std::uint16_t(0x0400));  // min normal
    QCOMPARE(gguf::float_to_half(1e-10f), std::uint16_t(0x0000));
  }

  void bfloat16RoundsToNearestEven() {
    QCOMPARE(gguf::float_to_bfloat16(1.0f), std::uint16_t(0x3F80));
    const float tie = std::bit_cast<float>(0x3F808000u);  // halfway between 0x3F80 and 0x3F81
    QCOMPARE(gguf::float_to_bfloat16(tie), std::uint16_t(0x3F80));
    QCOMPARE(gguf::float_to_bfloat16(std::bit_cast<float>(0x3F818000u)), std::uint16_t(0x3F82));
    QCOMPARE(gguf::float_to_bfloat16(std::bit_cast<float>(0x3F808001u)), std::uint16_t(0x3F81));
    const std::uint16_t nan = gguf::float_to_bfloat16(std::numeric_limits<float>::quiet_NaN());
    QVERIFY((nan & 0x7F80) == 0x7F80 && (nan & 0x7F) != 0);
  }

  void q8ZeroBlocksAndTies() {
    std::vector<float> x(64, 0.0f);
    // Second block: amax 127 makes d = 1, so 2.5 and -2.5 are ties: away from zero.
    x[32] = 127.0f;
    x[33] = 2.5f;
    x[34] = -2.5f;
    x[35] = 0.49f;
    std::vector<std::uint8_t> out(2 * 34);
    gguf::quantize_q8_0(x, out.data());
    for (int j = 0; j < 34; ++j) QCOMPARE(int(out[j]), 0);  // all-zero block: d = 0, q = 0
    QCOMPARE(int(out[34] | (out[35] << 8)), 0x3C00);        // d = 1.0 in f16
    QCOMPARE(int(std::int8_t(out[36])), 127);
    QCOMPARE(int(std::int8_t(out[37])), 3);
    QCOMPARE(int(std::int8_t(out[38])), -3);
    QCOMPARE(int(std::int8_t(out[39])), 0);
    std::vector<float> back(64);
    gguf::dequantize_q8_0(out, back.data());
    QCOMPARE(back[32], 127.0f);
    QCOMPARE(back[33], 3.0f);
    QVERIFY_THROWS_EXCEPTION(Error, gguf::quantize_q8_0(std::span(x).first(40), out.data()));
  }

  void containerRoundTrips() {
    gguf::Layout layout;
    const std::string file = small_file(64, &layout);
    const gguf::FileContents back = gguf::read_contents(bytes_of(file), "x.gguf");
    QCOMPARE(back.version, 3u);
    QCOMPARE(back.alignment, 64u);
    QCOMPARE(back.data_offset % 64, 0u);
    QCOMPARE(back.data_offset, layout.header.size());
    QVERIFY(back.tensors == layout.tensors);
    QCOMPARE(back.tensors[0].bytes(), std::uint64_t(3 * 2 * 34));
    QCOMPARE(back.tensors[1].offset, std::uint64_t(256));  // 204 bytes, padded to 64
    QCOMPARE(back.metadata[0].as_string(), std::string("llama"));
    QCOMPARE(back.metadata[2].as_f32(), 10000.0f);
    QVERIFY(back.metadata[3].as_bool());
    QCOMPARE(back.metadata[4].as_strings(), (std::vector<std::string>{"<s>", "a", "ü"}));
    QVERIFY_THROWS_EXCEPTION(Error, back.metadata[0].as_u32());  // wrong type: a bug, loudly
    gguf::Metadata twice;
    twice.add_u32("k", 1);
    QVERIFY_THROWS_EXCEPTION(Error, twice.add_u32("k", 2));
  }

  void readerRefusesWhatIsNotWholeGguf() {
    gguf::Layout layout;
    const std::string file = small_file(32, &layout);
    expect_invalid("GGML" + file.substr(4), "not a GGUF file");
    std::string v2 = file;
    v2[4] = 2;
    expect_invalid(v2, "version 2");
    expect_invalid(file.substr(0, 120), "the file ends inside");
    // Cut inside the last tensor's data (the padding after it may go).
    expect_invalid(file.substr(0, layout.header.size() + layout.tensors[1].offset + 10),
                   "beyond the end of the file");
    std::string huge = file;
    huge[8] = '\xFF';  // tensor count
    expect_invalid(huge, "counts larger than the file");
  }
};

QTEST_GUILESS_MAIN(GgufTest)
#include "test_gguf.moc"
