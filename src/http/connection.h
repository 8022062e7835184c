// Internal to the http module: the state shared by a server's threads and connections
// (ServerCore) and one accepted connection (Connection). See server.h for the behaviour.
//
// Ownership: Server holds the core; every Connection holds it too, so the io_context outlives
// the last socket even when a handler keeps a writer (and through it the Connection) past Stop.
// Threads: a Connection's members are touched only on its strand, except Enqueue and Close,
// which post to it.
#ifndef SLIME_SRC_HTTP_CONNECTION_H_
#define SLIME_SRC_HTTP_CONNECTION_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/string_body.hpp"
#include "slime/http/response_writer.h"
#include "slime/http/router.h"
#include "slime/http/server.h"

namespace slime::http::internal {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

class Connection;

struct ServerCore {
  ServerCore(ServerOptions options_in, Router router_in, int threads)
      : options(std::move(options_in)),
        router(std::move(router_in)),
        ioc(threads),
        acceptor(net::make_strand(ioc)),
        accept_retry(acceptor.get_executor()) {}

  // Registers a new connection; false when the server is stopping (the caller closes it).
  bool Register(uint64_t id, const std::shared_ptr<Connection>& connection);
  void Unregister(uint64_t id);

  const ServerOptions options;
  const Router router;
  net::io_context ioc;
  tcp::acceptor acceptor;          // used on its own strand only
  net::steady_timer accept_retry;  // re-arms accept after EMFILE; acceptor strand only
  // Keeps run() going until Stop, whatever else is pending.
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_guard;
  std::atomic<size_t> num_connections{0};
  std::atomic<uint64_t> next_connection_id{1};

  std::mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::unordered_map<uint64_t, std::weak_ptr<Connection>> connections ABSL_GUARDED_BY(mu);
};

class Connection : public ResponseSink, public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<ServerCore> core, uint64_t id, tcp::socket socket);
  ~Connection() override;

  void Start();  // posts the first read
  void Close();  // thread-safe: closes the socket on the strand, notifying a waiting writer

  // ResponseSink, any thread.
  void Enqueue(uint64_t request_seq, std::string bytes, bool last, bool close_after) override;

 private:
  struct Chunk {
    std::string bytes;
    bool last = false;
    bool close_after = false;
  };

  // All on the strand.
  void ReadRequest();
  void OnHeader(beast::error_code ec);
  void ReadBody();
  void OnBody(beast::error_code ec);
  void OnReadError(beast::error_code ec);
  void Dispatch();
  void Watch();
  void OnWatch(beast::error_code ec, size_t bytes);
  void DoEnqueue(uint64_t request_seq, std::string bytes, bool last, bool close_after);
  void WriteQueued();
  void OnWrite(beast::error_code ec);
  void ResponseDone(bool close_after);
  void SendErrorAndClose(int status, const std::string& message);
  void GracefulClose();
  void Drain();
  void DoClose();

  const std::shared_ptr<ServerCore> core_;  // declared first: destroyed after the stream
  const uint64_t id_;
  beast::tcp_stream stream_;
  const std::string remote_address_;
  beast::flat_buffer buffer_;
  std::optional<beast::http::request_parser<beast::http::string_body>> parser_;

  uint64_t request_seq_ = 0;
  bool in_response_ = false;  // a request was dispatched and its response is not done
  std::weak_ptr<ResponseWriter> writer_;
  bool watching_ = false;            // a disconnect-watch read is pending
  bool resume_after_watch_ = false;  // read the next request once the watch read returns
  std::deque<Chunk> queue_;
  std::string write_buffer_;  // bytes of the write in flight
  bool write_has_last_ = false;
  bool write_close_after_ = false;
  bool writing_ = false;
  bool close_after_response_ = false;  // the finished response asked to close the connection
  bool closing_ = false;               // graceful close started
  bool closed_ = false;
  std::string continue_line_;  // "100 Continue" bytes while they are written
  std::chrono::steady_clock::time_point linger_deadline_;
  std::unique_ptr<char[]> drain_buffer_;
  size_t drained_ = 0;

  std::mutex post_mu_;
  bool accepting_posts_ ABSL_GUARDED_BY(post_mu_) = true;
};

}  // namespace slime::http::internal

#endif  // SLIME_SRC_HTTP_CONNECTION_H_
