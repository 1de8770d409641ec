#include "nodes/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "core/files.h"

namespace tessera::nodes {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

fs::path xdg_dir(const char* variable, const char* fallback_under_home) {
  if (const char* value = std::getenv(variable); value != nullptr && *value == '/')
    return fs::path(value);
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0')
    throw_invalid(std::string("neither ") + variable + " nor HOME is set",
                  "set HOME, or pass the folder explicitly");
  return fs::path(home) / fallback_under_home;
}

json read_json_file(const fs::path& path) {
  const std::string text = core::read_text_file(path);
  json parsed = json::parse(text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object())
    throw_invalid(path.string() + " is not a JSON object",
                  "restore it from a backup, or remove it and pair again");
  return parsed;
}

// A field of a stored file, with the file and field named when it is missing or mistyped.
template <typename T>
T field(const json& object, const char* name, const fs::path& path) {
  if (!object.contains(name))
    throw_invalid(path.string() + ": an entry lacks \"" + std::string(name) + "\"",
                  "remove the entry (or the file) and pair again");
  try {
    return object.at(name).get<T>();
  } catch (const json::exception&) {
    throw_invalid(path.string() + ": \"" + std::string(name) + "\" has the wrong type",
                  "remove the entry (or the file) and pair again");
  }
}

}  // namespace

void make_private_dir(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw_io("cannot create " + dir.string() + ": " + error.message());
  if (::chmod(dir.c_str(), 0700) != 0)
    throw_io("cannot make " + dir.string() + " private (0700): " + errno_text());
}

void write_private_file(const fs::path& path, const std::string& contents) {
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::string temp_name = ".";  // built step by step: GCC 12's -Wrestrict misfires on "." + …
  temp_name += path.filename().string();
  temp_name += ".tmp-";
  temp_name += to_hex(random_bytes(6));
  const fs::path temp = dir / temp_name;
  core::FileDescriptor fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (fd.get() < 0) throw_io("cannot create " + temp.string() + ": " + errno_text());
  // The umask can only narrow 0600; fchmod makes sure nothing wider was inherited.
  if (::fchmod(fd.get(), 0600) != 0)
    throw_io("cannot chmod " + temp.string() + ": " + errno_text());
  const char* data = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t written = ::write(fd.get(), data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      const std::string why = errno_text();
      ::unlink(temp.c_str());
      throw_io("cannot write " + temp.string() + ": " + why);
    }
    data += written;
    left -= static_cast<std::size_t>(written);
  }
  if (::fsync(fd.get()) != 0) {
    const std::string why = errno_text();
    ::unlink(temp.c_str());
    throw_io("cannot fsync " + temp.string() + ": " + why);
  }
  ::close(fd.release());
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(temp.c_str());
    throw_io("cannot rename " + temp.string() + " to " + path.string() + ": " + why);
  }
  core::fsync_directory(dir);
}

std::string utc_now_iso() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "node";
  return name;
}

// --- client --------------------------------------------------------------------------------

fs::path ClientStore::default_path() {
  return xdg_dir("XDG_CONFIG_HOME", ".config") / "tessera" / "nodes.json";
}

ClientStore::ClientStore(fs::path path) : path_(std::move(path)) {
  if (!fs::exists(path_)) return;
  const json stored = read_json_file(path_);
  client_id_ = stored.value("client_id", std::string());
  for (const json& entry : stored.value("nodes", json::array())) {
    PairedNode node;
    node.name = field<std::string>(entry, "name", path_);
    node.node_id = field<std::string>(entry, "node_id", path_);
    node.address = field<std::string>(entry, "address", path_);
    node.port = field<std::uint16_t>(entry, "port", path_);
    node.secret = from_hex(field<std::string>(entry, "secret", path_),
                           path_.string() + ": the secret of node " + node.name);
    node.paired_at = entry.value("paired_at", std::string());
    nodes_.push_back(std::move(node));
  }
}

const PairedNode* ClientStore::find(const std::string& key) const {
  for (const auto& node : nodes_)
    if (node.name == key) return &node;
  for (const auto& node : nodes_)
    if (node.address == key || node.address + ":" + std::to_string(node.port) == key) return &node;
  return nullptr;
}

const PairedNode* ClientStore::find_id(const std::string& node_id) const {
  for (const auto& node : nodes_)
    if (node.node_id == node_id) return &node;
  return nullptr;
}

std::string ClientStore::put(PairedNode node) {
  std::erase_if(nodes_, [&](const PairedNode& n) { return n.node_id == node.node_id; });
  const std::string base = node.name.empty() ? std::string("node") : node.name;
  std::string name = base;
  for (int i = 2; find(name) != nullptr; ++i) name = base + "-" + std::to_string(i);
  node.name = name;
  nodes_.push_back(std::move(node));
  return name;
}

bool ClientStore::remove(const std::string& name) {
  return std::erase_if(nodes_, [&](const PairedNode& n) { return n.name == name; }) > 0;
}

void ClientStore::save() const {
  std::string id = client_id_;
  if (id.empty()) {
    id = to_hex(random_bytes(16));
    const_cast<ClientStore*>(this)->client_id_ = id;
  }
  json nodes = json::array();
  for (const auto& n : nodes_)
    nodes.push_back({{"name", n.name},
                     {"node_id", n.node_id},
                     {"address", n.address},
                     {"port", n.port},
                     {"secret", to_hex(n.secret)},
                     {"paired_at", n.paired_at}});
  make_private_dir(path_.parent_path());
  write_private_file(path_,
                     json{{"version", 1}, {"client_id", id}, {"nodes", nodes}}.dump(2) + "\n");
}

// --- agent ---------------------------------------------------------------------------------

fs::path AgentStore::default_dir() {
  return xdg_dir("XDG_STATE_HOME", ".local/state") / "tessera" / "agent";
}

AgentStore::AgentStore(fs::path dir, const std::string& name) : dir_(std::move(dir)) {
  make_private_dir(dir_);
  const fs::path identity = dir_ / "agent.json";
  if (fs::exists(identity)) {
    const json stored = read_json_file(identity);
    node_id_ = field<std::string>(stored, "node_id", identity);
    name_ = stored.value("name", std::string());
  }
  const bool changed = node_id_.empty() || (!name.empty() && name != name_) || name_.empty();
  if (node_id_.empty()) node_id_ = to_hex(random_bytes(16));
  if (!name.empty()) name_ = name;
  if (name_.empty()) name_ = host_name();
  if (changed)
    write_private_file(identity,
                       json{{"version", 1}, {"node_id", node_id_}, {"name", name_}}.dump(2) + "\n");

  const fs::path clients = dir_ / "clients.json";
  if (!fs::exists(clients)) return;
  for (const json& entry : read_json_file(clients).value("clients", json::array())) {
    PairedClient client;
    client.client_id = field<std::string>(entry, "client_id", clients);
    client.name = entry.value("name", std::string());
    client.address = entry.value("address", std::string());
    client.secret = from_hex(field<std::string>(entry, "secret", clients),
                             clients.string() + ": the secret of client " + client.client_id);
    client.paired_at = entry.value("paired_at", std::string());
    clients_.push_back(std::move(client));
  }
}

std::optional<PairedClient> AgentStore::client(const std::string& client_id) const {
  for (const auto& c : clients_)
    if (c.client_id == client_id) return c;
  return std::nullopt;
}

void AgentStore::put_client(PairedClient client) {
  std::erase_if(clients_, [&](const PairedClient& c) { return c.client_id == client.client_id; });
  clients_.push_back(std::move(client));
  save_clients();
}

void AgentStore::save_clients() const {
  json clients = json::array();
  for (const auto& c : clients_)
    clients.push_back({{"client_id", c.client_id},
                       {"name", c.name},
                       {"address", c.address},
                       {"secret", to_hex(c.secret)},
                       {"paired_at", c.paired_at}});
  write_private_file(dir_ / "clients.json",
                     json{{"version", 1}, {"clients", clients}}.dump(2) + "\n");
}

}  // namespace tessera::nodes
