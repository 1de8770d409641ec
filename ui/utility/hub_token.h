#pragma once
// The HuggingFace token the studio sends to the Hub. Kept in the system keychain (qtkeychain:
// the Secret Service, KWallet, the macOS Keychain, Windows' credential store); where there is no
// keychain (a desktop without a secret service, a headless test), saving falls back to the token
// file huggingface_hub's login writes (mode 0600), and reading to HF_TOKEN and that file, which
// the Hub client reads itself. The token is held in memory only while the studio runs: never in
// QSettings, logs, the runs database or job specs.
#include <QObject>
#include <QString>
#include <string>

namespace tessera::ui {

class HubToken : public QObject {
  Q_OBJECT
 public:
  enum class Source { None, Keychain, Environment, TokenFile };
  explicit HubToken(QObject* parent = nullptr);

  // Reads the keychain (asynchronously; changed() when done).
  void load();
  // Saves `token` (asynchronously; saved() when done): the keychain, else the token file. An
  // invalid token (empty, characters a header cannot carry) is refused at once.
  void save(const QString& token);
  // Removes the keychain entry and the token file (as `tessera-cli hub logout`).
  void forget();

  // The keychain's token for the client, or "" (the client then reads HF_TOKEN / the file).
  const std::string& keychain_token() const { return keychain_token_; }
  Source source() const;
  // One sentence for the Settings page: where the token in use comes from (never the token).
  QString describe() const;
  bool loading() const { return loading_; }

 Q_SIGNALS:
  void changed();
  void saved(bool ok, const QString& message);

 private:
  void save_to_file(const std::string& token, const QString& why_not_keychain);
  std::string keychain_token_;
  QString keychain_problem_;  // why the keychain could not be read, when it could not
  bool loading_ = false;
};

}  // namespace tessera::ui
