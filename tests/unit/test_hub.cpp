// The hub client's names, settings and file selection: nothing a server or a user names can
// leave the cache folder; the environment is read in huggingface_hub's order.
#include <QtTest>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "hf/hub/cache.h"
#include "hf/hub/client.h"
#include "hf/hub/datasets.h"
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

// The error card_configs throws, or "" when it parsed.
std::string card_error(const std::string& card, const std::vector<std::string>& paths) {
  try {
    card_configs(card, paths, "org/d");
    return {};
  } catch (const tessera::Error& e) {
    return e.what();
  }
}

std::vector<std::string> split_names(const std::vector<DatasetSplit>& splits) {
  std::vector<std::string> out;
  for (const auto& s : splits) out.push_back(s.name);
  return out;
}

using Paths = std::vector<std::string>;

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
    // The dataset viewer: the public Hub's, else the endpoint's own root, else the override.
    QCOMPARE(s.viewer_endpoint, std::string("http://127.0.0.1:9"));
    ::unsetenv("HF_ENDPOINT");
    QCOMPARE(Settings::from_environment().viewer_endpoint,
             std::string("https://datasets-server.huggingface.co"));
    ::setenv("TESSERA_HUB_VIEWER_ENDPOINT", "http://viewer:8/", 1);
    QCOMPARE(Settings::from_environment().viewer_endpoint, std::string("http://viewer:8"));
    ::unsetenv("TESSERA_HUB_VIEWER_ENDPOINT");
    // The stall limit: huggingface_hub's variable, 30 s when unset or not a positive number.
    ::unsetenv("HF_HUB_DOWNLOAD_TIMEOUT");
    QCOMPARE(Settings::from_environment().download_timeout_s, 30L);
    ::setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5", 1);
    QCOMPARE(Settings::from_environment().download_timeout_s, 5L);
    for (const char* bad : {"abc", "0", "-3", "2.5"}) {
      ::setenv("HF_HUB_DOWNLOAD_TIMEOUT", bad, 1);
      QCOMPARE(Settings::from_environment().download_timeout_s, 30L);
    }
    ::unsetenv("HF_HUB_DOWNLOAD_TIMEOUT");
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

  void globs_as_the_hub_matches_data_files() {
    QVERIFY(glob_match("data/*.csv", "data/a.csv"));
    QVERIFY(!glob_match("data/*.csv", "data/sub/a.csv"));  // '*' stays in its folder
    QVERIFY(glob_match("data/**/*.csv", "data/a.csv"));    // '**' spans zero or more folders
    QVERIFY(glob_match("data/**/*.csv", "data/x/y/a.csv"));
    QVERIFY(glob_match("**", "a/b/c.jsonl"));
    QVERIFY(glob_match("./train.csv", "train.csv"));
    QVERIFY(glob_match("data/train-0000[0-9].parquet", "data/train-00003.parquet"));
    QVERIFY(!glob_match("data/train-?.csv", "data/train-/.csv"));
    const Paths repo{"README.md", ".hidden/a.csv", "data/a.csv", "data/.b.csv", "__x__/c.csv"};
    QCOMPARE(resolve_data_files("**/*.csv", repo), (Paths{"data/a.csv"}));
    QCOMPARE(resolve_data_files(".hidden/*.csv", repo), (Paths{".hidden/a.csv"}));
    QCOMPARE(resolve_data_files("*", repo), Paths{});  // README.md only when named
    QCOMPARE(resolve_data_files("README.md", repo), (Paths{"README.md"}));
  }

  void splits_from_file_names() {
    // Sharded names give any split name, train / validation / test first.
    auto splits = dataset_split_files(
        {"data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
         "data/extra-00000-of-00001.parquet", "data/test-00000-of-00001.parquet", "README.md"});
    QCOMPARE(split_names(splits), (Paths{"train", "test", "extra"}));
    QCOMPARE(splits[0].files.size(), std::size_t{2});
    QCOMPARE(splits[0].sizes, (std::vector<std::int64_t>{-1, -1}));
    // A folder word wins over file names; eval is the test split, as on the Hub.
    splits = dataset_split_files({"train/a.jsonl", "dev/b.jsonl", "eval/c.jsonl", "x_test.jsonl"});
    QCOMPARE(split_names(splits), (Paths{"train", "validation", "test"}));
    QCOMPARE(splits[2].files, (Paths{"eval/c.jsonl"}));
    // File-name words need a separator (digits count): "interval" is no "val".
    splits = dataset_split_files({"my_train0.csv", "valid.csv", "interval.csv", "notes.md"});
    QCOMPARE(split_names(splits), (Paths{"train", "validation"}));
    QCOMPARE(splits[0].files, (Paths{"my_train0.csv"}));
    // No split named: all of it is train; files Tessera does not read are left out.
    splits = dataset_split_files({"a.jsonl", "b.jsonl", "img.png", ".hidden.jsonl"});
    QCOMPARE(split_names(splits), (Paths{"train"}));
    QCOMPARE(splits[0].files, (Paths{"a.jsonl", "b.jsonl"}));
    QVERIFY(dataset_split_files({"README.md", "script.py"}).empty());
  }

  void parquet_conversion_branch() {
    const auto configs = parquet_conversion_configs(
        {".gitattributes", "plain/train/0000.parquet", "plain/train/0001.parquet",
         "plain/partial-test/0000.parquet", "default/validation/0000.parquet",
         "old/imdb-train.parquet", "old/imdb-unsupervised-00000-of-00002.parquet"});
    QCOMPARE(configs.size(), std::size_t{3});
    QCOMPARE(configs[0].name, std::string("default"));  // the default first
    QVERIFY(configs[0].is_default && !configs[1].is_default);
    QCOMPARE(configs[1].name, std::string("old"));
    QCOMPARE(split_names(configs[1].splits), (Paths{"train", "unsupervised"}));
    QCOMPARE(configs[2].revision, std::string("refs/convert/parquet"));
    QCOMPARE(split_names(configs[2].splits), (Paths{"train", "test"}));
    QCOMPARE(configs[2].splits[0].files,
             (Paths{"plain/train/0000.parquet", "plain/train/0001.parquet"}));
  }

  void card_configs_in_three_shapes() {
    const Paths repo{"README.md",        "main.csv",       "data/a.csv",    "data/b.csv",
                     "data/sub/c.csv",   "en/train.jsonl", "en/test.jsonl", "fr/train-1.jsonl",
                     "fr/train-2.jsonl", "fr/dev.jsonl"};
    const std::string card =
        "---\n"
        "license: mit\n"
        "configs:\n"
        "- config_name: one\n"
        "  data_files: main.csv\n"  // a string: the train split
        "- config_name: many\n"
        "  data_files: [data/*.csv, en/train.jsonl]\n"  // a list: all train
        "- config_name: fr\n"
        "  default: true\n"
        "  data_files:\n"
        "  - split: train\n"
        "    path: fr/train-*.jsonl\n"
        "  - split: validation\n"
        "    path: [fr/dev.jsonl]\n"
        "- config_name: en\n"
        "  data_dir: en\n"  // no data_files: the file names inside data_dir
        "---\n"
        "# A card\n";
    const auto configs = card_configs(card, repo, "org/d");
    QCOMPARE(configs.size(), std::size_t{4});
    QCOMPARE(configs[0].name, std::string("fr"));  // the default first
    QVERIFY(configs[0].is_default);
    QCOMPARE(split_names(configs[0].splits), (Paths{"train", "validation"}));
    QCOMPARE(configs[0].splits[0].files, (Paths{"fr/train-1.jsonl", "fr/train-2.jsonl"}));
    QCOMPARE(configs[0].splits[1].files, (Paths{"fr/dev.jsonl"}));
    QCOMPARE(configs[1].name, std::string("one"));
    QVERIFY(!configs[1].is_default);
    QCOMPARE(configs[1].splits[0].name, std::string("train"));
    QCOMPARE(configs[1].splits[0].files, (Paths{"main.csv"}));
    QCOMPARE(configs[2].splits[0].files, (Paths{"data/a.csv", "data/b.csv", "en/train.jsonl"}));
    QCOMPARE(split_names(configs[3].splits), (Paths{"train", "test"}));
    QCOMPARE(configs[3].splits[1].files, (Paths{"en/test.jsonl"}));
    // One config is the default even unflagged; no header, or none with configs, is no config.
    const auto single =
        card_configs("---\nconfigs:\n- config_name: x\n  data_files: main.csv\n---\n", repo, "o/d");
    QVERIFY(single.size() == 1 && single[0].is_default);
    QVERIFY(card_configs("# no header\n", repo, "org/d").empty());
    QVERIFY(card_configs("---\nlicense: mit\n---\n", repo, "org/d").empty());
    QVERIFY(card_configs("---\r\nconfigs:\r\n- config_name: a\r\n  data_files: main.csv\r\n---\r\n",
                         repo, "org/d")
                .size() == 1);
  }

  void malformed_cards_name_the_line() {
    const Paths repo{"a.csv"};
    // Line numbers are README.md's: the header starts on line 2.
    std::string e =
        card_error("---\nconfigs:\n- config_name: a\n  data_files: [a.csv\n---\n", repo);
    QVERIFY2(e.find("org/d") != std::string::npos &&
                 e.find("README.md line 5") != std::string::npos &&
                 e.find("malformed") != std::string::npos,
             e.c_str());
    e = card_error(
        "---\nconfigs:\n- config_name: a\n  data_files:\n  - split: train\n"
        "  - split: test\n    path: a.csv\n---\n",
        repo);
    QVERIFY2(e.find("README.md line 5") != std::string::npos &&
                 e.find("data_files[0]") != std::string::npos,
             e.c_str());
    e = card_error("---\nconfigs:\n- data_files: a.csv\n---\n", repo);
    QVERIFY2(e.find("line 3") != std::string::npos && e.find("config_name") != std::string::npos,
             e.c_str());
    e = card_error("---\nconfigs: {a: 1}\n---\n", repo);
    QVERIFY2(e.find("line 2") != std::string::npos, e.c_str());
    e = card_error(
        "---\nconfigs:\n- config_name: a\n  default: true\n  data_files: a.csv\n"
        "- config_name: b\n  default: yes\n  data_files: a.csv\n---\n",
        repo);
    QVERIFY2(e.find("line 6") != std::string::npos && e.find("second default") != std::string::npos,
             e.c_str());
    e = card_error("---\nconfigs:\n- config_name: a\n  data_files: {train: a.csv}\n---\n", repo);
    QVERIFY2(e.find("line 4") != std::string::npos, e.c_str());
  }
};

QTEST_GUILESS_MAIN(TestHub)
#include "test_hub.moc"
