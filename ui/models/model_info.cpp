#include "ui/models/model_info.h"

#include <QDir>
#include <QDirIterator>
#include <QFile>
#include <QFileInfo>
#include <filesystem>
#include <map>
#include <system_error>

#include "core/error.h"
#include "hf/chat/chat_template.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/config.h"
#include "hf/families.h"
#include "hf/hub/settings.h"
#include "hf/safetensors.h"
#include "hf/tokenizer/tokenizer.h"
#include "plan/planner.h"

namespace tessera::ui {

namespace fs = std::filesystem;

QString human_count(std::uint64_t n) {
  const double v = static_cast<double>(n);
  if (n >= 1000000000ULL) return QString::number(v / 1e9, 'f', 2) + "B";
  if (n >= 1000000ULL) return QString::number(v / 1e6, 'f', 1) + "M";
  if (n >= 1000ULL) return QString::number(v / 1e3, 'f', 1) + "K";
  return QString::number(n);
}

QString human_bytes(std::uint64_t bytes) {
  return QString::fromStdString(core::human_bytes(bytes));
}

namespace {

std::uint64_t folder_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  // HF cache snapshots hold symlinks into blobs/: file_size follows them.
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      auto size = fs::file_size(it->path(), size_ec);
      if (!size_ec) total += size;
    }
  }
  return total;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// The runner fine-tunes causal language models only. This mirrors the head choice of
// model::head_from_config (engine/model/model.cpp), which the GUI cannot link (LibTorch).
bool is_causal_lm(const hf::ModelConfig& config) {
  for (const auto& arch : config.architectures) {
    if (ends_with(arch, "ForCausalLM") || ends_with(arch, "LMHeadModel")) return true;
    if (ends_with(arch, "ForSequenceClassification") || ends_with(arch, "Model")) return false;
  }
  return config.architectures.empty() && hf::family_of(config).causal_lm;
}

ModelSummary inspect_model(const QString& folder) {
  ModelSummary s;
  s.folder = folder;
  const fs::path dir = folder.toStdString();
  try {
    if (!fs::is_directory(dir))
      throw_invalid(dir.string() + ": not a folder", "choose a HuggingFace model folder");
    s.disk_bytes = folder_bytes(dir);
    if (!fs::exists(dir / "config.json"))
      throw_invalid(dir.string() + ": no config.json in this folder",
                    "choose a HuggingFace model folder (config.json + *.safetensors)");
    hf::ModelConfig config = hf::load_model_config(dir / "config.json");
    s.model_type = QString::fromStdString(config.model_type);
    s.architecture = s.model_type;
    if (!config.architectures.empty())
      s.architecture += " (" + QString::fromStdString(config.architectures.front()) + ")";
    s.context_length = config.max_position_embeddings;

    auto checkpoint = hf::SafetensorsCheckpoint::open(dir);
    std::map<std::string, std::uint64_t> by_dtype;
    for (const auto& name : checkpoint.names()) {
      const auto& info = checkpoint.info(name);
      if (info.dtype == hf::DType::F64 || info.dtype == hf::DType::F32 ||
          info.dtype == hf::DType::F16 || info.dtype == hf::DType::BF16) {
        s.parameters += info.numel();
        by_dtype[hf::dtype_name(info.dtype)] += info.numel();
      }
    }
    std::uint64_t most = 0;
    for (const auto& [name, count] : by_dtype)
      if (count > most) most = count, s.dtype = QString::fromStdString(name);
    if (config.quantization.stored()) {
      // Its linear weights are packed codes (and their absmax tensors floats): the parameters
      // are the dense model's, counted from the config as the planner counts them.
      s.quantization = QString::fromStdString(config.quantization.describe());
      s.parameters = static_cast<std::uint64_t>(plan::count_parameters(config));
    }

    s.chat_template = "none";
    if (fs::exists(dir / "tokenizer_config.json") || fs::exists(dir / "chat_template.jinja")) {
      auto tc = hf::load_tokenizer_config_from_folder(dir);
      if (tc.chat_template)
        s.chat_template = QString::fromStdString(hf::chat_template_name(*tc.chat_template));
    }
    if (!fs::exists(dir / "tokenizer.json"))
      throw_unsupported(dir.string() + ": no tokenizer.json in this folder",
                        "the engine tokenizes with tokenizer.json; save the tokenizer with "
                        "transformers (AutoTokenizer.save_pretrained) into this folder");
    auto tokenizer = hf::Tokenizer::from_folder(dir);
    s.has_tokenizer = true;
    s.tokenizer = QString::fromStdString(tokenizer.model_kind()) + ", vocabulary " +
                  QString::number(tokenizer.vocab_size());
    if (!is_causal_lm(config))
      throw_unsupported(dir.string() + ": " + config.model_type +
                            " is not a causal language model; fine-tuning other heads is not "
                            "supported yet",
                        "choose a " + hf::model_types_where([](const hf::FamilyTraits& f) {
                          return f.causal_lm;
                        }) + " model");
    s.trainable = true;
  } catch (const Error& e) {
    s.problem = QString::fromStdString(e.what());
    s.hint = QString::fromStdString(e.hint());
  } catch (const std::exception& e) {
    s.problem = QString::fromStdString(e.what());
  }
  return s;
}

QString model_display_name(const QString& folder) {
  const QFileInfo info(folder);
  const QDir snapshots = info.dir();
  QDir repo = snapshots;
  if (snapshots.dirName() == "snapshots" && repo.cdUp() && repo.dirName().startsWith("models--"))
    return repo.dirName().mid(QString("models--").size()).replace("--", "/");
  return info.fileName();
}

QString hf_hub_cache_dir() {
  // The Hub client's resolution (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME),
  // so the studio lists the cache its downloads fill.
  return QString::fromStdString(hf::hub::Settings::from_environment().cache_dir.string());
}

QList<CachedModel> scan_hf_cache(const QString& hub_dir) {
  QList<CachedModel> found;
  QDir hub(hub_dir);
  const auto repos = hub.entryList({"models--*"}, QDir::Dirs | QDir::NoDotAndDotDot, QDir::Name);
  for (const QString& repo_dir : repos) {
    // models--org--name → org/name (names may hold single dashes, never double ones)
    QString repo_id = repo_dir.mid(QString("models--").size()).replace("--", "/");
    QDir snapshots(hub.filePath(repo_dir + "/snapshots"));
    QString main_rev;
    QFile ref(hub.filePath(repo_dir + "/refs/main"));
    if (ref.open(QIODevice::ReadOnly)) main_rev = QString::fromUtf8(ref.readAll()).trimmed();
    const auto revs = snapshots.entryList(QDir::Dirs | QDir::NoDotAndDotDot, QDir::Name);
    for (const QString& rev : revs) {
      QString folder = snapshots.filePath(rev);
      if (!QFileInfo::exists(folder + "/config.json")) continue;
      found.push_back({repo_id, rev, folder, rev == main_rev});
    }
  }
  return found;
}

}  // namespace tessera::ui
