// hf::Tokenizer on tiny hand-written tokenizer.json files: encodings that can be checked by
// hand, and bad files giving a tessera::Error that names the file and the field.
#include <QTemporaryDir>
#include <QTest>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "hf/tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using tessera::Error;
using tessera::ErrorKind;
using tessera::hf::Tokenizer;
using Ids = std::vector<std::int32_t>;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// "a b c ab bc abc" with merges a+b, ab+c: the smallest BPE that shows merge order.
json tiny_bpe() {
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "WhitespaceSplit"}}},
      {"post_processor", nullptr},
      {"decoder", nullptr},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"ab", 4}, {"bc", 5}, {"abc", 6}}},
        {"merges", {"a b", "ab c", "b c"}}}}};
}

json tiny_wordpiece() {
  return json{{"added_tokens",
               {{{"id", 0}, {"content", "[UNK]"}, {"special", true}, {"normalized", false}},
                {{"id", 1}, {"content", "[CLS]"}, {"special", true}, {"normalized", false}},
                {{"id", 2}, {"content", "[SEP]"}, {"special", true}, {"normalized", false}}}},
              {"normalizer",
               {{"type", "BertNormalizer"},
                {"clean_text", true},
                {"handle_chinese_chars", true},
                {"strip_accents", nullptr},
                {"lowercase", true}}},
              {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
              {"post_processor",
               {{"type", "TemplateProcessing"},
                {"single",
                 {{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                  {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}}},
                {"special_tokens",
                 {{"[CLS]", {{"id", "[CLS]"}, {"ids", {1}}, {"tokens", {"[CLS]"}}}},
                  {"[SEP]", {{"id", "[SEP]"}, {"ids", {2}}, {"tokens", {"[SEP]"}}}}}}}},
              {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
              {"model",
               {{"type", "WordPiece"},
                {"unk_token", "[UNK]"},
                {"continuing_subword_prefix", "##"},
                {"max_input_chars_per_word", 10},
                {"vocab",
                 {{"[UNK]", 0},
                  {"[CLS]", 1},
                  {"[SEP]", 2},
                  {"un", 3},
                  {"##aff", 4},
                  {"##able", 5},
                  {"hello", 6},
                  {"!", 7},
                  {"cafe", 8},
                  {"中", 9}}}}}};
}

}  // namespace

class TestTokenizer : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;
  fs::path dir() const { return fs::path(tmp_.path().toStdString()); }
  fs::path write_json(const std::string& name, const json& j) {
    const fs::path p = dir() / name;
    write_text(p, j.dump());
    return p;
  }
  // Loading `text` as tokenizer.json must fail with an InvalidInput error mentioning every
  // string in `needles`.
  void expect_load_error(const std::string& name, const std::string& text,
                         std::vector<std::string> needles,
                         ErrorKind kind = ErrorKind::InvalidInput) {
    const fs::path p = dir() / name;
    write_text(p, text);
    needles.push_back(p.string());
    try {
      Tokenizer::from_file(p);
      QFAIL(("no error for " + name).c_str());
    } catch (const Error& e) {
      QCOMPARE(static_cast<int>(e.kind()), static_cast<int>(kind));
      for (const auto& n : needles)
        QVERIFY2(std::string(e.what()).find(n) != std::string::npos,
                 (std::string("message lacks '") + n + "': " + e.what()).c_str());
    }
  }

 private Q_SLOTS:
  void bpe_merges_in_rank_order() {
    const Tokenizer tok = Tokenizer::from_file(write_json("bpe.json", tiny_bpe()));
    QCOMPARE(tok.encode("abc"), (Ids{6}));  // a+b first (rank 0), then ab+c
    QCOMPARE(tok.encode("bc"), (Ids{5}));
    QCOMPARE(tok.encode("abcbc a"), (Ids{6, 5, 1}));
    QCOMPARE(tok.encode("cab"), (Ids{3, 4}));
    QCOMPARE(tok.encode("axb"), (Ids{1, 0, 2}));  // unknown char → <unk>
    QCOMPARE(tok.encode(""), Ids{});
    QCOMPARE(tok.vocab_size(), std::size_t{7});
    QCOMPARE(tok.model_kind(), std::string("BPE"));
    QCOMPARE(tok.decode(Ids{6, 5}), std::string("abc bc"));  // no decoder: joined by spaces
  }

  void bpe_fuse_unk_and_ignore_merges() {
    json j = tiny_bpe();
    j["model"]["fuse_unk"] = true;
    const Tokenizer fused = Tokenizer::from_file(write_json("fuse.json", j));
    QCOMPARE(fused.encode("axyb"), (Ids{1, 0, 2}));
    j["model"]["fuse_unk"] = false;
    const Tokenizer unfused = Tokenizer::from_file(write_json("nofuse.json", j));
    QCOMPARE(unfused.encode("axyb"), (Ids{1, 0, 0, 2}));
  }

  void byte_level_round_trip() {
    // Byte-level alphabet: space is "Ġ" (U+0120), 'é' is the two bytes "Ã©".
    json j = tiny_bpe();
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    j["decoder"] = {{"type", "ByteLevel"}};
    j["model"]["vocab"] = {{"a", 0},
                           {"\xC4\xA0", 1},
                           {"\xC4\xA0"
                            "a",
                            2},
                           {"\xC3\x83", 3},
                           {"\xC2\xA9", 4},
                           {"\xC3\x83\xC2\xA9", 5}};
    j["model"]["merges"] = {"\xC4\xA0 a", "\xC3\x83 \xC2\xA9"};
    j["model"]["unk_token"] = nullptr;
    const Tokenizer tok = Tokenizer::from_file(write_json("bytelevel.json", j));
    QCOMPARE(tok.model_kind(), std::string("BPE (byte-level)"));
    QCOMPARE(tok.encode("a a"), (Ids{0, 2}));
    QCOMPARE(tok.encode("\xC3\xA9 a"), (Ids{5, 2}));
    QCOMPARE(tok.decode(Ids{5, 2, 2}), std::string("\xC3\xA9 a a"));
    QCOMPARE(tok.decode(Ids{3}), std::string("\xEF\xBF\xBD"));  // half a character
    // A character outside the vocabulary with no unk token is a clear error, not a crash.
    QVERIFY_THROWS_EXCEPTION(Error, tok.encode("b"));
  }

  void byte_fallback_and_metaspace() {
    json j = tiny_bpe();
    j["pre_tokenizer"] = {{"type", "Metaspace"},
                          {"replacement", "\xE2\x96\x81"},
                          {"prepend_scheme", "always"},
                          {"split", true}};
    j["decoder"] = {
        {"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
    j["model"]["byte_fallback"] = true;
    j["model"]["vocab"] = {{"<unk>", 0},
                           {"<0xC3>", 1},
                           {"<0xA9>", 2},
                           {"\xE2\x96\x81", 3},
                           {"a", 4},
                           {"\xE2\x96\x81"
                            "a",
                            5}};
    j["model"]["merges"] = {"\xE2\x96\x81 a"};
    const Tokenizer tok = Tokenizer::from_file(write_json("fallback.json", j));
    QCOMPARE(tok.model_kind(), std::string("BPE (byte fallback)"));
    QCOMPARE(tok.encode("a a"), (Ids{5, 5}));
    QCOMPARE(tok.encode("\xC3\xA9"), (Ids{3, 1, 2}));  // ▁ then é as two bytes
    QCOMPARE(tok.decode(Ids{5, 3, 1, 2}), std::string("a \xC3\xA9"));
    QCOMPARE(tok.decode(Ids{1}), std::string("\xEF\xBF\xBD"));
  }

  void wordpiece_bert_pipeline() {
    const Tokenizer tok = Tokenizer::from_file(write_json("wp.json", tiny_wordpiece()));
    QCOMPARE(tok.model_kind(), std::string("WordPiece"));
    QCOMPARE(tok.encode("UnAffable HELLO!"), (Ids{1, 3, 4, 5, 6, 7, 2}));
    QCOMPARE(tok.encode("UnAffable HELLO!", false), (Ids{3, 4, 5, 6, 7}));
    QCOMPARE(tok.encode("Café"), (Ids{1, 8, 2}));          // accents stripped with lowercase
    QCOMPARE(tok.encode("cafe\xCC\x81"), (Ids{1, 8, 2}));  // decomposed form too
    QCOMPARE(tok.encode("中中"), (Ids{1, 9, 9, 2}));       // CJK characters split apart
    QCOMPARE(tok.encode("unknown"), (Ids{1, 0, 2}));
    QCOMPARE(tok.encode("helloooooooooo"), (Ids{1, 0, 2}));  // longer than 10 chars → unk
    QCOMPARE(tok.encode("[CLS] hello [SEP]"), (Ids{1, 1, 6, 2, 2}));
    QCOMPARE(tok.decode(Ids{1, 3, 4, 5, 6, 7, 2}), std::string("[CLS] unaffable hello! [SEP]"));
    QCOMPARE(tok.decode(Ids{1, 3, 4, 5, 6, 7, 2}, true), std::string("unaffable hello!"));
    QCOMPARE(tok.special_tokens(), (std::vector<std::string>{"[UNK]", "[CLS]", "[SEP]"}));
    QCOMPARE(tok.token_to_id("##able"), std::optional<std::int32_t>(5));
    QCOMPARE(tok.id_to_token(4), std::optional<std::string>("##aff"));
    QCOMPARE(tok.id_to_token(99), std::optional<std::string>());
  }

  void added_tokens_strip_and_single_word() {
    json j = tiny_bpe();
    j["added_tokens"] = {{{"id", 7},
                          {"content", "<t>"},
                          {"special", true},
                          {"lstrip", true},
                          {"rstrip", true},
                          {"normalized", false}},
                         {{"id", 8},
                          {"content", "ca"},
                          {"special", false},
                          {"single_word", true},
                          {"normalized", true}}};
    const Tokenizer tok = Tokenizer::from_file(write_json("added.json", j));
    QCOMPARE(tok.encode("ab  <t>  c"), (Ids{4, 7, 3}));  // spaces around <t> are absorbed
    QCOMPARE(tok.encode("ca b"), (Ids{8, 2}));           // whole word: the added token
    QCOMPARE(tok.encode("cab"), (Ids{3, 4}));            // inside a word: not matched
    QCOMPARE(tok.vocab_size(), std::size_t{9});
    QCOMPARE(tok.decode(Ids{4, 7, 3}, true), std::string("ab c"));
  }

  void invalid_utf8_input_is_replaced_not_fatal() {
    const Tokenizer tok = Tokenizer::from_file(write_json("wp2.json", tiny_wordpiece()));
    QCOMPARE(tok.encode(std::string("hello\xFF\xFE", 7)), (Ids{1, 6, 2}));  // U+FFFD dropped
  }

  void encode_is_thread_safe() {
    Tokenizer tok = Tokenizer::from_file(write_json("wp3.json", tiny_wordpiece()));
    const Ids want = tok.encode("unaffable hello ! unaffable");
    std::vector<int> ok(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        int good = 0;
        for (int i = 0; i < 2000; ++i) good += tok.encode("unaffable hello ! unaffable") == want;
        ok[static_cast<std::size_t>(t)] = good;
      });
    }
    for (auto& th : threads) th.join();
    for (int good : ok) QCOMPARE(good, 2000);
    Tokenizer moved = std::move(tok);
    QCOMPARE(moved.encode("unaffable hello ! unaffable"), want);
  }

  void bad_files_name_file_and_field() {
    expect_load_error("notjson.json", "this is not json", {"not valid JSON"});
    std::string full = tiny_bpe().dump();
    expect_load_error("truncated.json", full.substr(0, full.size() / 2), {"not valid JSON"});
    expect_load_error("nomodel.json", R"({"version": "1.0", "added_tokens": []})", {"model"});
    json j = tiny_bpe();
    j["model"]["type"] = "Mystery";
    expect_load_error("unknown_model.json", j.dump(), {"model.type", "Mystery"});
    j = tiny_bpe();
    j["model"]["merges"] = {"a b", "a zz"};
    expect_load_error("bad_merge.json", j.dump(), {"model.merges[1]", "zz"});
    j = tiny_bpe();
    j["model"]["merges"] = {"abc"};
    expect_load_error("merge_shape.json", j.dump(), {"model.merges[0]"});
    j = tiny_bpe();
    j["model"]["vocab"]["a"] = "one";
    expect_load_error("bad_id.json", j.dump(), {"model.vocab", "'a'"});
    j = tiny_bpe();
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", {{{"type", "NFC"}}, {{"type", "Bogus"}}}}};
    expect_load_error("bad_norm.json", j.dump(), {"normalizer.normalizers[1].type", "Bogus"});
    j = tiny_bpe();
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
    expect_load_error("bad_regex.json", j.dump(), {"pre_tokenizer.pattern", "(unclosed"});
    j = tiny_wordpiece();
    j["post_processor"]["single"][0]["SpecialToken"]["id"] = "[NOPE]";
    expect_load_error("bad_template.json", j.dump(), {"post_processor.single[0]", "[NOPE]"});
    j = tiny_bpe();
    j["model"]["type"] = "Unigram";
    expect_load_error("unigram.json", j.dump(), {"model.type", "Unigram"}, ErrorKind::Unsupported);
  }

  // Every truncation of a valid file and random bytes as text: errors or ids, never a crash.
  void corrupt_files_and_random_text_never_crash() {
    const std::string full = tiny_wordpiece().dump();
    const fs::path p = dir() / "cut.json";
    int errors = 0;
    for (std::size_t n = 0; n < full.size(); n += 7) {
      write_text(p, full.substr(0, n));
      try {
        Tokenizer::from_file(p);
      } catch (const Error& e) {
        ++errors;
        QVERIFY(std::string(e.what()).find(p.string()) != std::string::npos);
      }
    }
    QCOMPARE(errors, static_cast<int>((full.size() + 6) / 7));
    const Tokenizer tok = Tokenizer::from_file(write_json("wp4.json", tiny_wordpiece()));
    std::mt19937 rng(7);
    for (int i = 0; i < 2000; ++i) {
      std::string text(rng() % 40, '\0');
      for (char& c : text) c = static_cast<char>(rng() % 256);
      const Ids ids = tok.encode(text);
      QVERIFY(ids.size() >= 2 && ids.front() == 1 && ids.back() == 2);
      tok.decode(ids);
    }
  }

  void missing_files_are_clear_errors() {
    try {
      Tokenizer::from_file(dir() / "absent.json");
      QFAIL("no error");
    } catch (const Error& e) {
      QVERIFY(std::string(e.what()).find("absent.json") != std::string::npos);
    }
    const fs::path empty_dir = dir() / "empty_model";
    fs::create_directories(empty_dir);
    try {
      Tokenizer::from_folder(empty_dir);
      QFAIL("no error");
    } catch (const Error& e) {
      QCOMPARE(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::InvalidInput));
      QVERIFY(std::string(e.what()).find("no tokenizer.json") != std::string::npos);
    }
    // A folder with a good tokenizer.json and a corrupt tokenizer_config.json.
    const fs::path model = dir() / "model";
    fs::create_directories(model);
    write_text(model / "tokenizer.json", tiny_wordpiece().dump());
    QCOMPARE(Tokenizer::from_folder(model).encode("hello"), (Ids{1, 6, 2}));
    write_text(model / "tokenizer_config.json", "{\"add_bos_token\": ");
    QVERIFY_THROWS_EXCEPTION(Error, Tokenizer::from_folder(model));
  }
};

QTEST_APPLESS_MAIN(TestTokenizer)
#include "test_tokenizer.moc"
