#pragma once
// One HTTP transfer at a time over libcurl, with the curl handles owned by RAII wrappers (the
// way ggml-cpp.h wraps ggml's C handles). No retries and no error mapping here: client.cpp
// decides what a status or a dropped connection means. Curl's types stay in http.cpp.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera::hf::hub {

struct HttpResponse {
  long status = 0;                             // of the last response (after redirects)
  std::map<std::string, std::string> headers;  // keys lower-case
  std::string body;                            // when no sink took it (capped at 16 MiB)
  std::string url;                             // the URL of the last response

  const std::string* header(const std::string& lower_name) const;
};

// A transfer that failed below HTTP: connection refused or dropped, timeout, truncated body.
// `retryable` when trying again (and resuming) may succeed; `aborted` when the sink stopped it.
struct TransportError {
  std::string message;
  bool retryable = false;
  bool aborted = false;
};

struct HttpRequest {
  enum class Method { Get, Head };
  Method method = Method::Get;
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  bool follow_redirects = false;     // curl follows (Authorization is not sent to other hosts)
  // Receives the body of a 2xx response, chunk by chunk, with the response's status and
  // headers; returns false to abort (TransportError with aborted). Bodies of other statuses
  // go to HttpResponse::body.
  std::function<bool(const HttpResponse& head, std::span<const char> chunk)> sink;
};

class HttpSession {
 public:
  // A transfer that receives no byte for `stall_timeout_s` (waiting for the response included)
  // counts as dropped: TransportError, retryable. Settings::download_timeout_s.
  explicit HttpSession(long stall_timeout_s = 30);
  ~HttpSession();
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  // Performs the request; a transport failure is thrown as TransportError.
  HttpResponse perform(const HttpRequest& request);

 private:
  struct Handle;
  std::unique_ptr<Handle> handle_;
  long stall_timeout_s_ = 30;
};

// "https://host:port" of a URL ("" when it has none), to compare hosts across redirects.
std::string url_origin(const std::string& url);

}  // namespace tessera::hf::hub
