#pragma once
// Where the pairing secrets live. The client: $XDG_CONFIG_HOME/tessera/nodes.json (default
// ~/.config/tessera/nodes.json). The agent: agent.json (its node id and name) and clients.json
// (one secret per paired client) in its state folder (default $XDG_STATE_HOME/tessera/agent,
// i.e. ~/.local/state/tessera/agent). All written 0600 by temp + fsync + rename, in folders made
// 0700.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "nodes/crypto.h"

namespace tessera::nodes {

// Writes `contents` to `path` with mode 0600: a temporary file in the same folder (created
// 0600, never wider), fsync, rename over `path`, fsync of the folder.
void write_private_file(const std::filesystem::path& path, const std::string& contents);
// Makes `dir` (and parents) and narrows it to 0700.
void make_private_dir(const std::filesystem::path& dir);

struct PairedNode {
  std::string name;
  std::string node_id;
  std::string address;
  std::uint16_t port = 0;
  Bytes secret;
  std::string paired_at;  // UTC, ISO 8601
};

// The client's side: its id (made at first use) and the nodes it paired with.
class ClientStore {
 public:
  static std::filesystem::path default_path();
  explicit ClientStore(std::filesystem::path path);  // reads it if it exists
  const std::filesystem::path& path() const { return path_; }
  const std::string& client_id() const { return client_id_; }
  const std::vector<PairedNode>& nodes() const { return nodes_; }
  // By name, by address, or by address:port.
  const PairedNode* find(const std::string& name_or_address) const;
  const PairedNode* find_id(const std::string& node_id) const;
  // Adds or replaces (same node id) and returns the name it is stored under (unique).
  std::string put(PairedNode node);
  bool remove(const std::string& name);
  void save() const;  // creates the client id on first save

 private:
  std::filesystem::path path_;
  std::string client_id_;
  std::vector<PairedNode> nodes_;
};

struct PairedClient {
  std::string client_id;
  std::string name;
  std::string address;
  Bytes secret;
  std::string paired_at;
};

// The agent's side.
class AgentStore {
 public:
  static std::filesystem::path default_dir();
  // Makes the folder and agent.json (a new node id) on first use. `name` empty: the stored one,
  // or the host name.
  AgentStore(std::filesystem::path dir, const std::string& name);
  const std::filesystem::path& dir() const { return dir_; }
  const std::string& node_id() const { return node_id_; }
  const std::string& name() const { return name_; }
  std::optional<PairedClient> client(const std::string& client_id) const;
  std::size_t client_count() const { return clients_.size(); }
  void put_client(PairedClient client);  // adds or replaces, and saves

 private:
  void save_clients() const;
  std::filesystem::path dir_;
  std::string node_id_;
  std::string name_;
  std::vector<PairedClient> clients_;
};

std::string utc_now_iso();
std::string host_name();

}  // namespace tessera::nodes
