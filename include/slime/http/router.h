// Request, Handler and Router: what a server handler sees and how requests find it.
//
// A Router maps (method, exact path) to a Handler. It is filled before Server::Start and is
// immutable afterwards (the server keeps its own copy), so lookups take no lock.
//
// Dispatch rules (Router::Dispatch, called by the server on an I/O thread):
//   - the path must match exactly (no patterns; the query string is not part of it), else the
//     longest prefix route (AddPrefix) it starts with;
//   - method: the exact method, else a "*" route, else for HEAD the GET route (the writer then
//     sends the GET answer's status and headers, Content-Length included, without the body);
//   - unknown path -> 404 {"error":{"message":"no route for GET /x"}};
//   - known path, other method -> 405 with an `Allow` header and the allowed methods named in
//     the message;
//   - a handler that throws -> 500 with the exception's message, if it had not answered yet;
//   - with access keys set (SetAccessKeys, SGLang's --api-key / --admin-api-key), before any
//     of the above: a request without the right `Authorization: Bearer <key>` gets 401
//     {"error": {"message"}} and a `WWW-Authenticate: Bearer` header (a user key on an admin
//     route: 403), and reaches no handler. Keys are compared in constant time and never logged.
//
// Threads: Add is not thread-safe (call it while building); Dispatch is const and may run on
// many threads at once.
#ifndef SLIME_HTTP_ROUTER_H_
#define SLIME_HTTP_ROUTER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace slime::http {

class ResponseWriter;

// One parsed request, as handed to a handler. Plain data; the handler may copy what it needs.
struct Request {
  std::string method;                        // "GET", "POST", ... (as sent, case-sensitive)
  std::string target;                        // raw request target, e.g. "/generate?x=1"
  std::string path;                          // target before '?', percent-decoded ('+' kept)
  std::map<std::string, std::string> query;  // decoded query parameters (first value wins)
  std::vector<std::pair<std::string, std::string>> headers;  // in arrival order, names as sent
  std::string body;
  std::string remote_address;  // "ip:port" of the peer
  int version = 11;            // 10 for HTTP/1.0, 11 for HTTP/1.1

  // The first header named `name`, compared case-insensitively.
  std::optional<std::string> Header(std::string_view name) const;
};

// Runs on an I/O thread and must not block. It answers through the writer, now or later from
// any thread (keeping the shared_ptr). A writer destroyed without an answer sends 500.
using Handler = std::function<void(const Request&, std::shared_ptr<ResponseWriter>)>;

// Who may call what. Empty keys leave their routes open.
struct AccessKeys {
  std::string api_key;    // every route but `open_paths`
  std::string admin_key;  // `admin_paths` (the routes that change state); when empty, api_key
                          // guards them like any other route; when set, only it does
  std::set<std::string> admin_paths;
  std::set<std::string> open_paths = {"/health"};
};

class Router {
 public:
  void SetAccessKeys(AccessKeys keys) { keys_ = std::move(keys); }

  // Registers `handler` for `method` ("GET", "POST", ... or "*" for any) on `path` (must start
  // with '/'). Adding the same (method, path) again replaces the earlier handler.
  void Add(std::string method, std::string path, Handler handler);
  // Registers `handler` for every path that starts with `prefix` (must start and end with '/')
  // and has no exact route, e.g. "/sessions/" for "/sessions/<id>/v1/models". The handler reads
  // the rest from Request::path. Method rules as for exact routes.
  void AddPrefix(std::string method, std::string prefix, Handler handler);

  // Finds the handler for `request` and runs it, or answers 404/405 itself; turns an exception
  // from the handler into a 500. Never throws.
  void Dispatch(const Request& request, std::shared_ptr<ResponseWriter> writer) const;

  // The methods registered for `path`, sorted, with HEAD added where GET exists.
  std::vector<std::string> AllowedMethods(const std::string& path) const;

 private:
  // The route entry for `path`: exact first, then the longest matching prefix; null if none.
  const std::map<std::string, Handler>* Find(const std::string& path) const;

  // False (and the 401/403 sent) when `request` lacks the key its path needs.
  bool Authorized(const Request& request, ResponseWriter& writer) const;

  AccessKeys keys_;
  std::map<std::string, std::map<std::string, Handler>> routes_;  // path -> method -> handler
  std::map<std::string, std::map<std::string, Handler>> prefixes_;  // prefix -> method -> handler
};

}  // namespace slime::http

#endif  // SLIME_HTTP_ROUTER_H_
