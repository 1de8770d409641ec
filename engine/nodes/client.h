#pragma once
// The client's side of the node protocol: listening for announcements, pairing (nodes add) and
// authenticated requests to a paired node.
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "nodes/store.h"

namespace tessera::nodes {

struct Announcement {
  std::string name, node_id, address, version, pairing, seen_from;
  std::uint16_t port = 0;
  std::size_t paired_clients = 0;
};
// Every agent heard on `port` within `duration`, once each (the latest announcement).
std::vector<Announcement> listen_for_agents(std::uint16_t port, std::chrono::milliseconds duration);

struct PairingPrompt {
  // The code both sides show; returns whether the user confirms it. Not called when
  // `expected_code` is set.
  std::function<bool(const std::string& code, const std::string& node_name)> confirm;
  std::optional<std::string> expected_code;
  std::function<void(const std::string& line)> print;
};
// Pairs with the agent at host:port and stores the secret in `store` (saved). Returns the name
// the node is stored under. Throws tessera::Error saying why a pairing failed (codes differ on
// either side, the agent refused, a commitment that does not verify) and storing nothing.
std::string pair_with_agent(ClientStore& store, const std::string& host, std::uint16_t port,
                            const std::string& client_name, const PairingPrompt& prompt);

// One authenticated request (body {"what": …, …}) to a paired node; its verified answer.
nlohmann::json request_node(const ClientStore& store, const PairedNode& node,
                            const nlohmann::json& body, std::chrono::milliseconds timeout);

}  // namespace tessera::nodes
