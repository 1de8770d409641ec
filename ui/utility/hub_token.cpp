#include "ui/utility/hub_token.h"

#include <qt6keychain/keychain.h>

#include <cstdlib>

#include "core/error.h"
#include "hf/hub/settings.h"

namespace tessera::ui {

namespace hub = hf::hub;

namespace {

const char* kService = "Tessera";
const char* kKey = "huggingface-token";

// Why the keychain could not be used, in words: without a Secret Service on the session bus
// QtKeychain says only "Unknown error".
QString keychain_problem(const QKeychain::Job& job) {
  switch (job.error()) {
    case QKeychain::NoBackendAvailable:
      return HubToken::tr("no keychain service is running (on Linux: GNOME Keyring or KWallet)");
    case QKeychain::AccessDenied:
    case QKeychain::AccessDeniedByUser:
      return HubToken::tr("the keychain refused access");
    default:
      break;
  }
  const QString detail = job.errorString().trimmed();
  if (detail.isEmpty() || detail.compare("Unknown error", Qt::CaseInsensitive) == 0)
    return HubToken::tr("no keychain service answered (on Linux: GNOME Keyring or KWallet)");
  return detail;
}

}  // namespace

HubToken::HubToken(QObject* parent) : QObject(parent) {}

void HubToken::load() {
  loading_ = true;
  auto* job = new QKeychain::ReadPasswordJob(kService, this);
  job->setAutoDelete(true);
  job->setInsecureFallback(false);  // never a plain-text copy in QSettings
  job->setKey(kKey);
  connect(job, &QKeychain::Job::finished, this, [this, job] {
    loading_ = false;
    keychain_problem_.clear();
    if (job->error() == QKeychain::NoError) {
      keychain_token_ = job->textData().trimmed().toStdString();
    } else {
      keychain_token_.clear();
      if (job->error() != QKeychain::EntryNotFound) keychain_problem_ = keychain_problem(*job);
    }
    Q_EMIT changed();
  });
  job->start();
}

void HubToken::save(const QString& token) {
  std::string clean;
  try {
    clean = hub::clean_token(token.toStdString());
  } catch (const Error& e) {
    Q_EMIT saved(false, tr("%1. %2").arg(QString::fromStdString(e.what()),
                                         tr("Paste the token from your Hugging Face account's "
                                            "Access Tokens page.")));
    return;
  }
  auto* job = new QKeychain::WritePasswordJob(kService, this);
  job->setAutoDelete(true);
  job->setInsecureFallback(false);
  job->setKey(kKey);
  job->setTextData(QString::fromStdString(clean));
  connect(job, &QKeychain::Job::finished, this, [this, job, clean] {
    if (job->error() == QKeychain::NoError) {
      keychain_token_ = clean;
      keychain_problem_.clear();
      Q_EMIT changed();
      Q_EMIT saved(true, tr("Token saved in the system keychain."));
      return;
    }
    save_to_file(clean, keychain_problem(*job));
  });
  job->start();
}

void HubToken::save_to_file(const std::string& token, const QString& why_not_keychain) {
  const hub::Settings settings = hub::Settings::from_environment();
  try {
    hub::save_token(settings.token_path, token);
  } catch (const Error& e) {
    Q_EMIT saved(false, tr("The system keychain is not available (%1), and the token file "
                           "cannot be written: %2. Set HF_TOKEN in the environment instead.")
                            .arg(why_not_keychain, QString::fromStdString(e.what())));
    return;
  }
  keychain_token_.clear();
  keychain_problem_ = why_not_keychain;
  Q_EMIT changed();
  Q_EMIT saved(true, tr("The system keychain is not available (%1); the token was saved to %2 "
                        "(readable by you only), the file huggingface_hub's login writes.")
                         .arg(why_not_keychain, QString::fromStdString(settings.token_path)));
}

void HubToken::forget() {
  auto* job = new QKeychain::DeletePasswordJob(kService, this);
  job->setAutoDelete(true);
  job->setInsecureFallback(false);
  job->setKey(kKey);
  job->start();
  keychain_token_.clear();
  const hub::Settings settings = hub::Settings::from_environment();
  try {
    hub::remove_token(settings.token_path);
  } catch (const Error&) {
    // describe() still names the file when it could not be removed.
  }
  Q_EMIT changed();
}

HubToken::Source HubToken::source() const {
  if (!keychain_token_.empty()) return Source::Keychain;
  const char* env = std::getenv("HF_TOKEN");
  if (env != nullptr && *env != '\0') return Source::Environment;
  if (!hub::Settings::from_environment().token.empty()) return Source::TokenFile;
  return Source::None;
}

QString HubToken::describe() const {
  if (loading_) return tr("Reading the system keychain…");
  const QString unavailable =
      keychain_problem_.isEmpty()
          ? QString()
          : tr(" (The system keychain is not available: %1. A token saved here goes to %2, "
               "readable by you only.)")
                .arg(keychain_problem_,
                     QString::fromStdString(hub::Settings::from_environment().token_path));
  switch (source()) {
    case Source::Keychain:
      return tr("A token is stored in the system keychain; it is sent to %1.")
          .arg(QString::fromStdString(hub::Settings::from_environment().endpoint));
    case Source::Environment:
      return tr("Using the token in the HF_TOKEN environment variable.") + unavailable;
    case Source::TokenFile:
      return tr("Using the token in %1.")
                 .arg(QString::fromStdString(hub::Settings::from_environment().token_path)) +
             unavailable;
    case Source::None:
      break;
  }
  return tr("No token: public models only. Gated and private models need a token from your "
            "Hugging Face account (Settings → Access Tokens).") +
         unavailable;
}

}  // namespace tessera::ui
