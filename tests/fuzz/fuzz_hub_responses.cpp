// What a Hub server answers, as the Hub client reads it: the input is the body of every response
// of a local HTTP server the client is pointed at (HF_ENDPOINT), read as a model search page, a
// model's and a dataset's repository info; the file list an info gave is then selected from and
// split as a dataset's files, and the input read as the dataset card (README.md's YAML header).
// Then a dataset's layout and its row preview, as the wizard's Dataset page asks for them: from
// the dataset viewer's first-rows answer (a client with a viewer endpoint), and from the first
// bytes of the split's file (one without). A preview never shows more rows than asked for.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <mutex>
#include <thread>
#include <vector>

#include "fuzz_support.h"
#include "hf/hub/client.h"
#include "hf/hub/datasets.h"

namespace {

// One thread answering every request with 200 and the current body.
class BodyServer {
 public:
  BodyServer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::perror("fuzz_hub_responses: cannot listen on 127.0.0.1");
      std::abort();
    }
    port_ = ntohs(address.sin_port);
    std::thread([this] { serve(); }).detach();  // lives as long as the process
  }
  int port() const { return port_; }
  void set_body(std::string body) {
    std::lock_guard lock(mutex_);
    body_ = std::move(body);
  }

 private:
  void serve() {
    for (;;) {
      const int connection = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (connection < 0) continue;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t got = ::recv(connection, buffer, sizeof buffer, 0);
        if (got <= 0) break;
        request.append(buffer, static_cast<std::size_t>(got));
      }
      std::string response;
      {
        std::lock_guard lock(mutex_);
        response = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body_.size()) + "\r\nConnection: close\r\n\r\n" + body_;
      }
      for (std::size_t sent = 0; sent < response.size();) {
        const ssize_t put =
            ::send(connection, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (put <= 0) break;
        sent += static_cast<std::size_t>(put);
      }
      ::close(connection);
    }
  }

  int listener_ = -1;
  int port_ = 0;
  std::mutex mutex_;
  std::string body_;
};

tessera::hf::hub::Settings settings_for(BodyServer& server, const std::string& cache) {
  tessera::hf::hub::Settings settings;
  settings.endpoint = "http://127.0.0.1:" + std::to_string(server.port());
  settings.cache_dir = tessera::fuzz::scratch_dir() / cache;
  settings.download_timeout_s = 5;
  return settings;
}

tessera::hf::hub::Client& client(BodyServer& server) {
  static tessera::hf::hub::Client made(settings_for(server, "hub"));
  return made;
}

// The same server answering as the dataset viewer too.
tessera::hf::hub::Client& viewer_client(BodyServer& server) {
  static tessera::hf::hub::Client made = [&] {
    tessera::hf::hub::Settings settings = settings_for(server, "hub-viewer");
    settings.viewer_endpoint = settings.endpoint;
    return tessera::hf::hub::Client(settings);
  }();
  return made;
}

void read_file_list(const tessera::hf::hub::RepoInfo& info, const std::string& card) {
  using namespace tessera::hf::hub;
  std::vector<std::string> paths;
  for (const RepoFile& file : info.files) paths.push_back(file.path);
  (void)select_files(info.id, info.type, info.files, {});
  if (info.type != RepoType::Dataset) return;
  (void)dataset_split_files(paths);
  (void)parquet_conversion_configs(paths);
  tessera::fuzz::refusal_is_fine([&] { (void)card_configs(card, paths, info.id); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera::hf::hub;
  static BodyServer server;
  const std::string body(tessera::fuzz::as_text(data, size));
  server.set_body(body);
  Client& hub = client(server);
  tessera::fuzz::refusal_is_fine([&] {
    SearchQuery query;
    query.text = "llama";
    query.limit = 5;
    (void)hub.search(query);
  });
  for (const RepoType type : {RepoType::Model, RepoType::Dataset}) {
    tessera::fuzz::refusal_is_fine(
        [&] { read_file_list(hub.info("org/repo", type, "main"), body); });
  }
  tessera::fuzz::refusal_is_fine([&] { (void)card_configs(body, {"data/train.jsonl"}, "org/d"); });
  constexpr int kRows = 5;
  for (Client* previewing : {&hub, &viewer_client(server)}) {
    tessera::fuzz::refusal_is_fine([&] { (void)previewing->dataset_layout("org/d", "main"); });
    tessera::fuzz::refusal_is_fine([&] {
      const RowPreview preview = previewing->preview_rows("org/d", "main", "", "", kRows);
      tessera::fuzz::require(preview.rows.size() <= static_cast<std::size_t>(kRows),
                             "a preview shows at most the rows asked for");
    });
  }
  return 0;
}
