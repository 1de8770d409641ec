// tessera-cli nodes discover|add|list|check|remove: the LAN nodes this machine works with
// (engine/nodes, docs/nodes.md). `add` pairs with a node's agent through a code shown on both
// sides; `check` runs the pre-flight checks there and measures the c10d link to it.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "nodes/checks.h"
#include "nodes/client.h"
#include "nodes/protocol.h"
#include "nodes/store.h"
#include "nodes/wire.h"
#include "plan/profile.h"

#ifdef TESSERA_WITH_TORCH
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include "nodes/link/link_test.h"
#include "optim/cpu_adam.h"
#endif

namespace tessera::cli {

nodes::BuildInfo this_build() {
  nodes::BuildInfo build;
  build.tessera = nodes::tessera_version();
#ifdef TESSERA_WITH_TORCH
  build.libtorch = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                   "." + std::to_string(TORCH_VERSION_PATCH);
  const auto& hooks = at::detail::getCUDAHooks();
  if (hooks.hasCUDART()) {
    const long runtime = hooks.versionCUDART();
    build.cuda = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  }
  build.nccl = nodes::loaded_nccl_version();
  build.cpu_adam_kernel = optim::simd_level_name(optim::detected_simd_level());
#endif
  return build;
}

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

nodes::ClientStore open_store() {
  return nodes::ClientStore(nodes::ClientStore::default_path());
}

int nodes_discover(const Args& args) {
  if (args.positionals().size() > 1) throw UsageError{"discover takes no arguments"};
  double seconds = 5.0;
  if (const std::string* value = args.option("--seconds")) {
    try {
      seconds = std::stod(*value);
    } catch (const std::exception&) {
      seconds = -1;
    }
    if (!(seconds > 0 && seconds <= 600))
      throw UsageError{"--seconds " + *value + " must be a number of seconds in (0, 600]"};
  }
  const std::uint16_t port =
      args.option("--discovery-port")
          ? nodes::parse_port(*args.option("--discovery-port"), "--discovery-port")
          : nodes::kDefaultDiscoveryPort;
  if (!args.flag("--json"))
    std::cerr << "listening for agents on UDP port " << port << " for " << seconds << " s...\n";
  const auto heard = nodes::listen_for_agents(
      port, std::chrono::milliseconds(static_cast<long long>(seconds * 1000)));
  const nodes::ClientStore store = open_store();
  if (args.flag("--json")) {
    json out = json::array();
    for (const auto& a : heard)
      out.push_back({{"name", a.name},
                     {"node_id", a.node_id},
                     {"address", a.address},
                     {"port", a.port},
                     {"version", a.version},
                     {"pairing", a.pairing},
                     {"paired_clients", a.paired_clients},
                     {"seen_from", a.seen_from},
                     {"paired_here", store.find_id(a.node_id) != nullptr}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (heard.empty()) {
    std::cout << "no agent announced itself in " << seconds
              << " s (agents on another subnet, or behind a firewall that drops UDP broadcasts, "
                 "are added by address: tessera-cli nodes add ADDRESS)\n";
    return 0;
  }
  for (const auto& a : heard) {
    const nodes::PairedNode* paired = store.find_id(a.node_id);
    std::printf("%-20s %s:%u  Tessera %s  %s\n", a.name.c_str(), a.address.c_str(), a.port,
                a.version.c_str(),
                paired ? ("paired here as " + paired->name).c_str()
                       : "not paired: tessera-cli nodes add ADDRESS:PORT");
  }
  return 0;
}

int nodes_add(const Args& args) {
  if (args.positionals().size() != 2) throw UsageError{"add needs ADDRESS[:PORT]"};
  const auto [host, port] =
      nodes::parse_host_port(args.positionals()[1], nodes::kDefaultAgentPort, "the node address");
  nodes::PairingPrompt prompt;
  if (const std::string* value = args.option("--expect-code")) {
    prompt.expected_code = nodes::normalise_code(*value);
    if (!prompt.expected_code)
      throw UsageError{"--expect-code \"" + *value + "\" is not a 6-digit code"};
  }
  prompt.print = [](const std::string& line) { std::cout << line << std::endl; };
  prompt.confirm = [](const std::string& code, const std::string& node) {
    std::cout << "Does \"" << node << "\" show the code " << code
              << "? Type the code (or yes) to confirm, anything else to refuse:" << std::endl;
    std::string line;
    if (!std::getline(std::cin, line)) return false;
    const auto typed = nodes::normalise_code(line);
    return line == "y" || line == "yes" || line == "Y" || line == "YES" ||
           (typed && *typed == code);
  };
  nodes::ClientStore store = open_store();
  const std::string name = nodes::pair_with_agent(store, host, port, nodes::host_name(), prompt);
  std::cout << "paired with \"" << name << "\" (" << host << ":" << port << "); secret saved in "
            << store.path().string() << "\n"
            << "note: " << nodes::kC10dWarning << "\n";
  return 0;
}

int nodes_list(const Args& args) {
  const nodes::ClientStore store = open_store();
  if (args.flag("--json")) {
    json out = json::array();
    for (const auto& n : store.nodes())
      out.push_back({{"name", n.name},
                     {"node_id", n.node_id},
                     {"address", n.address},
                     {"port", n.port},
                     {"paired_at", n.paired_at}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (store.nodes().empty()) {
    std::cout << "no paired node (tessera-cli nodes discover, then nodes add ADDRESS)\n";
    return 0;
  }
  for (const auto& n : store.nodes())
    std::printf("%-20s %s:%u  paired %s\n", n.name.c_str(), n.address.c_str(), n.port,
                n.paired_at.c_str());
  return 0;
}

const nodes::PairedNode& find_node(const nodes::ClientStore& store, const std::string& key) {
  const nodes::PairedNode* node = store.find(key);
  if (node == nullptr)
    throw_invalid(
        "no paired node is called or reachable at \"" + key + "\" in " + store.path().string(),
        "see tessera-cli nodes list; pair with tessera-cli nodes add ADDRESS");
  return *node;
}

std::uint64_t size_option(const Args& args, const char* name, std::uint64_t fallback) {
  const std::string* value = args.option(name);
  return value ? plan::parse_byte_size(*value, name) : fallback;
}

}  // namespace

// The c10d link test from this side: rank 1, the agent rank 0 (also launch's pre-flight).
nodes::CheckResult link_check(const nodes::ClientStore& store, const nodes::PairedNode& node,
                              std::uint64_t bytes) {
  nodes::CheckResult r;
  r.name = "c10d link";
  r.hint = "let TCP through between the two machines (the agent opens a free port on " +
           node.address +
           " for the test), or set GLOO_SOCKET_IFNAME to the interface that "
           "reaches the node";
#ifdef TESSERA_WITH_TORCH
  try {
    const json offer =
        nodes::request_node(store, node, {{"what", "link_test"}, {"bytes", bytes}}, 10s);
    const std::string master = offer.at("master_addr").get<std::string>();
    const auto port = offer.at("master_port").get<std::uint16_t>();
    const nodes::LinkMeasurement m = nodes::run_link_test(1, master, port, bytes, 20s);
    char text[256];
    std::snprintf(text, sizeof text,
                  "latency %.3f ms (4-byte all_reduce, median of %d), bandwidth %.0f MB/s (%s "
                  "all_reduce in %.1f ms, median of %d); Gloo, rendezvous at %s:%u",
                  m.latency_ms, m.small_runs, m.bandwidth_mb_s, core::human_bytes(m.bytes).c_str(),
                  m.large_ms, m.large_runs, master.c_str(), port);
    r.ok = true;
    r.detail = text;
    r.hint.clear();
    r.measured = {{"latency_ms", m.latency_ms}, {"bandwidth_mb_s", m.bandwidth_mb_s},
                  {"bytes", m.bytes},           {"large_ms", m.large_ms},
                  {"small_runs", m.small_runs}, {"large_runs", m.large_runs},
                  {"master_addr", master},      {"master_port", port}};
  } catch (const Error& e) {
    r.ok = false;
    r.reason = std::string("the c10d link test with ") + node.name + " failed: " + e.what();
    if (!e.hint().empty()) r.hint = e.hint() + "; " + r.hint;
  }
#else
  r.ok = false;
  r.reason = "this tessera-cli is built without LibTorch, so it cannot run c10d";
  r.hint = "use the LibTorch build of Tessera";
#endif
  return r;
}

namespace {

int nodes_check(const Args& args) {
  if (args.positionals().size() != 2) throw UsageError{"check needs NAME or ADDRESS[:PORT]"};
  const nodes::ClientStore store = open_store();
  const nodes::PairedNode& node = find_node(store, args.positionals()[1]);
  const nodes::Requirements needs = nodes::requirements_for(
      this_build(), size_option(args, "--need-ram", 0), size_option(args, "--need-disk", 0),
      size_option(args, "--need-gpu-memory", 0));
  const json answer = nodes::request_node(
      store, node,
      {{"what", "check"}, {"requirements", nodes::to_json(needs)}, {"node_name", node.name}}, 60s);
  std::vector<nodes::CheckResult> results;
  for (const json& item : answer.value("checks", json::array()))
    results.push_back(nodes::check_result_from_json(item));
  if (!args.flag("--no-link"))
    results.push_back(link_check(store, node, size_option(args, "--link-bytes", 64ull << 20)));
  bool all_ok = true;
  for (const auto& r : results) all_ok = all_ok && r.ok;

  if (args.flag("--json")) {
    json checks = json::array();
    for (const auto& r : results) checks.push_back(nodes::to_json(r));
    std::cout << json{{"node", node.name}, {"address", node.address},
                      {"port", node.port}, {"ok", all_ok},
                      {"checks", checks},  {"facts", answer.value("facts", json::object())}}
                     .dump(2)
              << "\n";
    return all_ok ? 0 : 1;
  }
  std::printf("pre-flight checks of \"%s\" (%s:%u)\n", node.name.c_str(), node.address.c_str(),
              node.port);
  int failed = 0;
  for (const auto& r : results) {
    std::printf("  %-4s %-16s %s\n", r.ok ? "ok" : "FAIL", r.name.c_str(), r.detail.c_str());
    if (!r.ok) {
      ++failed;
      std::printf("       reason: %s\n       what to do: %s\n", r.reason.c_str(), r.hint.c_str());
    }
  }
  if (failed == 0)
    std::printf("all %zu checks passed\n", results.size());
  else
    std::printf("%d of %zu checks failed: %s cannot take part in a job as it is\n", failed,
                results.size(), node.name.c_str());
  std::printf("note: %s\n", nodes::kC10dWarning);
  return all_ok ? 0 : 1;
}

int nodes_remove(const Args& args) {
  if (args.positionals().size() != 2) throw UsageError{"remove needs NAME"};
  nodes::ClientStore store = open_store();
  const std::string& name = args.positionals()[1];
  if (!store.remove(name))
    throw_invalid("no paired node is called \"" + name + "\" in " + store.path().string(),
                  "see tessera-cli nodes list");
  store.save();
  std::cout << "removed \"" << name << "\" and its secret from " << store.path().string()
            << " (the agent keeps its side until its state folder is cleared)\n";
  return 0;
}

int run_nodes(const std::vector<std::string>& raw) {
  Args args(raw, {"--json", "--no-link"},
            {"--seconds", "--discovery-port", "--expect-code", "--need-ram", "--need-disk",
             "--need-gpu-memory", "--link-bytes"});
  if (args.positionals().empty())
    throw UsageError{"nodes needs a subcommand: discover, add, list, check or remove"};
  const std::string& sub = args.positionals()[0];
  if (sub == "discover") return nodes_discover(args);
  if (sub == "add") return nodes_add(args);
  if (sub == "list") return nodes_list(args);
  if (sub == "check") return nodes_check(args);
  if (sub == "remove") return nodes_remove(args);
  throw UsageError{"unknown nodes subcommand \"" + sub + "\" (discover, add, list, check, remove)"};
}

const RegisterCommand kNodesCommand{{
    "nodes",
    "nodes discover [--seconds N] [--discovery-port P] [--json] | nodes add ADDRESS[:PORT] "
    "[--expect-code CODE] | nodes list [--json] | nodes check NAME|ADDRESS [--json] "
    "[--need-ram SIZE] [--need-disk SIZE] [--need-gpu-memory SIZE] [--link-bytes SIZE] "
    "[--no-link] | nodes remove NAME",
    "Find, pair with, list, check and remove the LAN nodes that run `tessera-cli agent` "
    "(docs/nodes.md)",
    run_nodes,
}};

}  // namespace
}  // namespace tessera::cli
