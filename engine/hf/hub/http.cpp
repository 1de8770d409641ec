#include "hf/hub/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <mutex>

#include "core/error.h"
#include "core/text.h"

namespace tessera::hf::hub {
namespace {

constexpr std::size_t kMaxBufferedBody = 16u << 20;

struct EasyDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
using EasyPtr = std::unique_ptr<CURL, EasyDeleter>;
using SlistPtr = std::unique_ptr<curl_slist, SlistDeleter>;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      throw Error(ErrorKind::Internal, "libcurl could not be initialised");
  });
}

// State of one transfer, reached from curl's callbacks.
struct Transfer {
  const HttpRequest* request = nullptr;
  HttpResponse response;
  bool aborted = false;
  // The stall check: when bytes last arrived. (curl's low-speed limit averages over its last
  // seconds, so a burst hides a stall for several seconds more than asked.)
  long stall_timeout_s = 30;
  curl_off_t last_received = -1;
  std::chrono::steady_clock::time_point last_arrival;
  bool stalled = false;
};

int on_progress(void* user, curl_off_t, curl_off_t received, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  const auto now = std::chrono::steady_clock::now();
  if (received != t->last_received) {
    t->last_received = received;
    t->last_arrival = now;
    return 0;
  }
  if (now - t->last_arrival >= std::chrono::seconds(t->stall_timeout_s)) {
    t->stalled = true;
    return 1;  // curl stops with CURLE_ABORTED_BY_CALLBACK
  }
  return 0;
}

std::size_t on_header(char* data, std::size_t size, std::size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * count);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.starts_with("HTTP/")) {  // a new response (after a redirect or a 100): start over
    t->response.headers.clear();
    const auto space = line.find(' ');
    t->response.status = space == std::string::npos ? 0 : std::atol(line.c_str() + space + 1);
  } else if (const auto colon = line.find(':'); colon != std::string::npos) {
    std::string value = line.substr(colon + 1);
    const auto first = value.find_first_not_of(" \t");
    value = first == std::string::npos ? std::string() : value.substr(first);
    t->response.headers[core::ascii_lower(line.substr(0, colon))] = value;
  }
  return size * count;
}

std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = size * count;
  const long status = t->response.status;
  if (status >= 200 && status < 300 && t->request->sink) {
    if (!t->request->sink(t->response, std::span<const char>(data, n))) {
      t->aborted = true;
      return 0;  // curl stops with CURLE_WRITE_ERROR
    }
    return n;
  }
  if (t->response.body.size() < kMaxBufferedBody)
    t->response.body.append(data, std::min(n, kMaxBufferedBody - t->response.body.size()));
  return n;
}

bool retryable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

}  // namespace

const std::string* HttpResponse::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? nullptr : &it->second;
}

struct HttpSession::Handle {
  EasyPtr easy;
};

HttpSession::HttpSession(long stall_timeout_s)
    : handle_(std::make_unique<Handle>()), stall_timeout_s_(std::max(1L, stall_timeout_s)) {
  global_init();
  handle_->easy.reset(curl_easy_init());
  if (!handle_->easy) throw Error(ErrorKind::Internal, "libcurl could not create a handle");
}

HttpSession::~HttpSession() = default;

HttpResponse HttpSession::perform(const HttpRequest& request) {
  CURL* curl = handle_->easy.get();
  curl_easy_reset(curl);  // keeps the connection cache: the next request reuses the socket
  Transfer transfer;
  transfer.request = &request;

  SlistPtr headers;
  for (const auto& h : request.headers) {
    curl_slist* grown = curl_slist_append(headers.get(), h.c_str());
    if (grown == nullptr) throw Error(ErrorKind::Internal, "libcurl: out of memory");
    (void)headers.release();
    headers.reset(grown);
  }
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "tessera/0.1");
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 15L);
  // A connection that brings no byte for the stall limit counts as dropped (then resumed).
  transfer.stall_timeout_s = stall_timeout_s_;
  transfer.last_arrival = std::chrono::steady_clock::now();
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, request.follow_redirects ? 1L : 0L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L * 1024L);
  if (request.method == HttpRequest::Method::Head) curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);

  const CURLcode code = curl_easy_perform(curl);
  char* effective = nullptr;
  curl_easy_getinfo(curl, CURLINFO_EFFECTIVE_URL, &effective);
  transfer.response.url = effective != nullptr ? effective : request.url;
  if (code != CURLE_OK) {
    TransportError error;
    error.aborted = transfer.aborted;
    error.retryable = !transfer.aborted && (transfer.stalled || retryable(code));
    error.message = transfer.stalled ? "no data for " + std::to_string(stall_timeout_s_) +
                                           " s (HF_HUB_DOWNLOAD_TIMEOUT)"
                                     : std::string(curl_easy_strerror(code));
    throw error;
  }
  return std::move(transfer.response);
}

std::string url_origin(const std::string& url) {
  const auto scheme = url.find("://");
  if (scheme == std::string::npos) return {};
  const auto end = url.find_first_of("/?#", scheme + 3);
  return core::ascii_lower(url.substr(0, end));
}

}  // namespace tessera::hf::hub
