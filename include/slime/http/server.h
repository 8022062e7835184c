// Server: an asynchronous HTTP/1.1 server (Boost.Beast on Asio) for the engine's
// SGLang-compatible API, the rollout coordinator and /metrics.
//
// Model: `num_threads` I/O threads run one io_context; each connection lives on its own strand,
// so there is no thread per connection and thousands of requests can wait for their handlers
// at once (a waiting request costs a socket and a few KB). Per connection, one request is served
// at a time: the next pipelined request is read only after the current response is complete.
// While a handler has not finished answering, the connection keeps reading the socket so that
// a client disconnect is seen at once (ResponseWriter::OnClose); pipelined bytes are buffered.
//
// Protocol: HTTP/1.1 keep-alive (HTTP/1.0 closes unless it asks for keep-alive);
// `Expect: 100-continue` is answered with 100 before the body is read; a body larger than
// max_body_bytes gets 413, a request that does not parse gets 400, oversized headers 431 — each
// followed by closing the connection (after draining what the client is still sending, so the
// client sees the answer rather than a reset). A connection idle for idle_timeout between
// requests, or stalled that long mid-request or on a write, is closed. Routing, 404/405, HEAD
// and handler exceptions (500): see router.h and response_writer.h.
//
// Ownership: Start returns the owning pointer. The server owns its threads and sockets; writers
// that handlers keep past Stop stay valid (their calls are dropped, closed() is true).
// Threads: port/address/num_connections may be called from any thread; Stop from any thread
// except an I/O thread (it joins them). Handlers must not block an I/O thread.
#ifndef SLIME_HTTP_SERVER_H_
#define SLIME_HTTP_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "slime/common/status.h"
#include "slime/http/response_writer.h"
#include "slime/http/router.h"

namespace slime::http {

struct ServerOptions {
  std::string host = "127.0.0.1";  // address or name to bind; "0.0.0.0" for all interfaces
  int port = 0;                    // 0 = pick a free port (see Server::port())
  int num_threads = 2;             // I/O threads, >= 1
  size_t max_body_bytes = 64 << 20;
  std::chrono::seconds idle_timeout{300};
  std::string server_name = "slime-cpp";  // the Server header
};

namespace internal {
struct ServerCore;
}

class Server {
 public:
  // Binds, listens and starts the I/O threads. Errors: InvalidArgument for bad options,
  // Unavailable when the address cannot be bound (the message names host:port).
  static StatusOr<std::unique_ptr<Server>> Start(ServerOptions options, Router router);
  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  std::string address() const;  // "host:port"

  // Closes the listener and every connection (handlers waiting on a writer get OnClose), then
  // joins the I/O threads. Idempotent.
  void Stop();

  // Connections accepted and not yet closed.
  size_t num_connections() const;

 private:
  Server(std::shared_ptr<internal::ServerCore> core, int port);

  std::shared_ptr<internal::ServerCore> core_;
  const int port_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopped_{false};
};

}  // namespace slime::http

#endif  // SLIME_HTTP_SERVER_H_
