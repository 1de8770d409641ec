// The hub client's names, settings and file selection: nothing a server or a user names can
// leave the cache folder; the environment is read in huggingface_hub's order.
#include <QtTest>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "hf/hub/cache.h"
#include "hf/hub/client.h"
#include "hf/hub/names.h"
#include "hf/hub/settings.h"

using namespace tessera::hf::hub;

namespace {

bool rejects(void (*check)(std::string_view), const char* name) {
  try {
    check(name);
    return false;
  } catch (const tessera::Error& e) {
    return e.kind() == tessera::ErrorKind::InvalidInput;
  }
}

bool path_rejected(const char* path) {
  try {
    validate_repo_path(path, "the file list");
    return false;
  } catch (const tessera::Error& e) {
    return std::string(e.what()).find(path) != std::string::npos;
  }
}

RepoFile file(const char* path) {
  RepoFile f;
  f.path = path;
  f.size = 10;
  return f;
}

}  // namespace

class TestHub : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void repo_ids() {
    validate_repo_id("org/name");
    validate_repo_id("gpt2");
    validate_repo_id("Qwen/Qwen2.5-0.5B-Instruct");
    for (const char* bad :
         {"", "../x", "a/b/c", "a--b/c", "a/..", "/abs", "a/", "a b", "a/b\\c", "-a/b", "a/b."})
      QVERIFY2(rejects(validate_repo_id, bad), bad);
  }

  void revisions() {
    validate_revision("main");
    validate_revision("refs/convert/parquet");
    validate_revision("refs/pr/12");
    for (const char* bad : {"", "..", "refs/../../x", "/main", "a//b", "a/./b"})
      QVERIFY2(rejects(validate_revision, bad), bad);
  }

  void file_paths() {
    validate_repo_path("config.json", "list");
    validate_repo_path("data/train-00000-of-00002.parquet", "list");
    for (const char* bad : {"../../x", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b", ""})
      QVERIFY2(path_rejected(bad), bad);
  }

  void etags_and_folders() {
    QCOMPARE(normalize_etag("W/\"abc123\"", "u"), std::string("abc123"));
    QCOMPARE(normalize_etag("\"0123abcdef\"", "u"), std::string("0123abcdef"));
    QVERIFY_THROWS_EXCEPTION(tessera::Error, normalize_etag("\"../x\"", "u"));
    QCOMPARE(repo_folder_name("org/name", RepoType::Model), std::string("models--org--name"));
    QCOMPARE(repo_folder_name("squad", RepoType::Dataset), std::string("datasets--squad"));
    QCOMPARE(url_encode("refs/pr/1", false), std::string("refs%2Fpr%2F1"));
    QCOMPARE(url_encode("a b/c.json", true), std::string("a%20b/c.json"));
  }

  void snapshot_links_are_relative() {
    const std::filesystem::path dir = std::filesystem::path(TESSERA_TEST_TMP_DIR) / "hub-cache";
    std::filesystem::remove_all(dir);
    CacheRepo repo(dir, "org/name", RepoType::Model);
    const std::string commit(40, 'a');
    const std::string etag(64, 'b');
    std::filesystem::create_directories(repo.blob_path(etag).parent_path());
    { std::ofstream(repo.blob_path(etag)) << "x"; }
    repo.link(commit, "sub/w.safetensors", etag);
    const auto pointer = repo.pointer_path(commit, "sub/w.safetensors");
    QCOMPARE(std::filesystem::read_symlink(pointer).string(), "../../../blobs/" + etag);
    QVERIFY(std::filesystem::exists(pointer));
    repo.write_ref("main", commit);
    QCOMPARE(*repo.resolve("main"), commit);
    QVERIFY(!repo.resolve("dev"));
    QVERIFY_THROWS_EXCEPTION(tessera::Error, repo.pointer_path(commit, "../../x"));
    std::filesystem::remove_all(dir);
  }

  void environment_order() {
    ::setenv("HF_HOME", "/tmp/hf-home", 1);
    ::unsetenv("HF_HUB_CACHE");
    ::unsetenv("HUGGINGFACE_HUB_CACHE");
    ::unsetenv("HF_TOKEN_PATH");
    ::unsetenv("HF_ENDPOINT");
    ::setenv("HF_TOKEN", " hf_abc \n", 1);
    ::setenv("HF_HUB_OFFLINE", "1", 1);
    Settings s = Settings::from_environment();
    QCOMPARE(s.cache_dir.string(), std::string("/tmp/hf-home/hub"));
    QCOMPARE(s.token_path.string(), std::string("/tmp/hf-home/token"));
    QCOMPARE(s.token, std::string("hf_abc"));
    QVERIFY(s.offline);
    ::setenv("HUGGINGFACE_HUB_CACHE", "/tmp/legacy", 1);
    QCOMPARE(Settings::from_environment().cache_dir.string(), std::string("/tmp/legacy"));
    ::setenv("HF_HUB_CACHE", "/tmp/new", 1);
    ::setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
    s = Settings::from_environment();
    QCOMPARE(s.cache_dir.string(), std::string("/tmp/new"));
    QCOMPARE(s.endpoint, std::string("http://127.0.0.1:9"));
    // huggingface_hub reads TRANSFORMERS_OFFLINE only when HF_HUB_OFFLINE is unset.
    ::setenv("HF_HUB_OFFLINE", "0", 1);
    ::setenv("TRANSFORMERS_OFFLINE", "1", 1);
    QVERIFY(!Settings::from_environment().offline);
    ::unsetenv("HF_HUB_OFFLINE");
    QVERIFY(Settings::from_environment().offline);
    ::unsetenv("TRANSFORMERS_OFFLINE");
    QVERIFY(!Settings::from_environment().offline);
  }

  void selection() {
    const std::vector<RepoFile> model{file("config.json"),       file("model.safetensors"),
                                      file("pytorch_model.bin"), file("README.md"),
                                      file("tokenizer.json"),    file("onnx/model.safetensors")};
    Selection s = select_files("org/m", RepoType::Model, model, {});
    QCOMPARE(s.files.size(), std::size_t{3});
    QVERIFY(s.refusal.empty());
    s = select_files("org/m", RepoType::Model, {file("config.json"), file("pytorch_model.bin")},
                     {});
    QVERIFY(s.refusal.find("pickle") != std::string::npos);
    QVERIFY(s.files.empty());
    s = select_files("org/m", RepoType::Model, model, {"*.json"});
    QCOMPARE(s.files.size(), std::size_t{2});
    s = select_files("org/d", RepoType::Dataset,
                     {file("data/train.parquet"), file("README.md"), file("script.py")}, {"data/"});
    QCOMPARE(s.files.size(), std::size_t{1});
  }
};

QTEST_GUILESS_MAIN(TestHub)
#include "test_hub.moc"
