// Client: a small synchronous HTTP/1.1 client for one server (host:port), used by tests and by
// the rollout coordinator to talk to engines.
//
// It keeps one connection open between requests (keep-alive). If that kept connection turns
// out to have been closed by the server (idle timeout, restart) — the request cannot be written
// or the connection ends before any byte of the response — the client reconnects and sends the
// request once more. That retry also applies to POST: it happens only when the server sent
// nothing back, which for our servers means the request was not processed.
//
// Errors: connection refused / unreachable -> Unavailable naming host:port; a timeout ->
// DeadlineExceeded; a malformed response -> Internal. A response with any status code is a
// successful call (check Response::status); only PostStream turns a non-2xx answer into a
// Status (see there).
//
// Ownership: the client owns its socket and a private io_context. Threads: not thread-safe;
// use one client per thread (they are cheap), or guard it.
#ifndef SLIME_HTTP_CLIENT_H_
#define SLIME_HTTP_CLIENT_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"

namespace slime::http {

struct ClientOptions {
  // Get/Post/Request: the whole call (connect, send, receive) must finish within this.
  // PostStream: connect through response headers must, and then each wait for more body bytes.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Keep the connection open between requests.
  bool keep_alive = true;
  // Set: every request carries `Authorization: Bearer <bearer_token>` (SGLang's --api-key)
  // unless the call passes its own Authorization header.
  std::string bearer_token;
};

// Extra request headers, name -> value.
using Headers = std::map<std::string, std::string>;

struct Response {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names; repeats joined with ", "

  // Parses the body as JSON; throws nlohmann::json::parse_error if it is not.
  nlohmann::json Json() const;
  // The header `name` (any case), if present.
  std::optional<std::string> Header(std::string_view name) const;
};

class Client {
 public:
  Client(std::string host, int port, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // `path` is the request target: "/generate", "/metrics?x=1".
  StatusOr<Response> Get(const std::string& path, const Headers& headers = {});
  StatusOr<Response> Post(const std::string& path, std::string body,
                          const std::string& content_type = "application/json",
                          const Headers& headers = {});
  // Any method ("PUT", "DELETE", "HEAD", ...). A body is sent with Content-Length when not empty.
  StatusOr<Response> Request(const std::string& method, const std::string& path, std::string body,
                             const Headers& headers = {});

  // POSTs `body` (JSON) and reads the response body line by line as it arrives (a chunked
  // SSE stream or any body). `on_line` gets each line without its "\n" / "\r\n"; empty lines
  // (SSE event separators) are skipped. Returning false stops reading and drops the connection,
  // which the server sees as a disconnect; the call then returns OK.
  // A non-2xx status is returned as an error whose message holds the status and the body:
  // 400 InvalidArgument, 401/403 PermissionDenied, 404 NotFound, 408/504 DeadlineExceeded,
  // 409 Aborted, 413/429 ResourceExhausted, 503 Unavailable, other 5xx Internal, else Unknown.
  Status PostStream(const std::string& path, std::string body,
                    const std::function<bool(std::string_view line)>& on_line,
                    const Headers& headers = {});

  // Drops the kept connection, if any.
  void Close();
  // Whether a kept connection is open (it may still have been closed by the server).
  bool connected() const;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  struct Impl;
  const std::string host_;
  const int port_;
  const ClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

// The Status for an HTTP error answer (the mapping PostStream uses); OK for 2xx.
Status StatusFromHttp(int status, std::string_view what, std::string_view body);

}  // namespace slime::http

#endif  // SLIME_HTTP_CLIENT_H_
