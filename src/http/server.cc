#include "slime/http/server.h"

#include <pthread.h>

#include <cerrno>

#include "boost/asio/post.hpp"
#include "connection.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace slime::http {
namespace {

using internal::Connection;
using internal::ServerCore;
using internal::tcp;
namespace net = internal::net;
namespace beast = internal::beast;

void Accept(const std::shared_ptr<ServerCore>& core) {
  core->acceptor.async_accept(
      net::make_strand(core->ioc), [core](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !core->acceptor.is_open()) return;
        if (ec) {
          bool out_of_fds = ec == net::error::no_descriptors || ec.value() == ENFILE;
          beast::error_code ignored;
          spdlog::warn("http: accept on port {} failed: {}{}",
                       core->acceptor.local_endpoint(ignored).port(), ec.message(),
                       out_of_fds ? " (raise the file descriptor limit: ulimit -n)" : "");
          // Back off briefly instead of spinning while no descriptor is free.
          core->accept_retry.expires_after(std::chrono::milliseconds(out_of_fds ? 100 : 10));
          core->accept_retry.async_wait([core](beast::error_code ec) {
            if (!ec) Accept(core);
          });
          return;
        }
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        uint64_t id = core->next_connection_id.fetch_add(1);
        auto connection = std::make_shared<Connection>(core, id, std::move(socket));
        if (core->Register(id, connection)) {
          connection->Start();
        } else {
          connection->Close();  // stopping
        }
        Accept(core);
      });
}

void RunIoThread(const std::shared_ptr<ServerCore>& core, int index) {
  pthread_setname_np(pthread_self(), fmt::format("http-io-{}", index).substr(0, 15).c_str());
  for (;;) {
    try {
      core->ioc.run();
      return;
    } catch (const std::exception& e) {
      spdlog::error("http: I/O thread {} caught an exception and continues: {}", index, e.what());
    }
  }
}

}  // namespace

Server::Server(std::shared_ptr<internal::ServerCore> core, int port)
    : core_(std::move(core)), port_(port) {}

StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options, Router router) {
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        fmt::format("http server num_threads must be >= 1, got {}", options.num_threads));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        fmt::format("http server port must be 0..65535, got {}", options.port));
  }
  if (options.idle_timeout.count() <= 0) {
    return absl::InvalidArgumentError("http server idle_timeout must be positive");
  }
  const std::string where = fmt::format("{}:{}", options.host, options.port);
  const int num_threads = options.num_threads;
  auto core = std::make_shared<ServerCore>(std::move(options), std::move(router), num_threads);
  const ServerOptions& opts = core->options;

  beast::error_code ec;
  tcp::resolver resolver(core->ioc);
  auto endpoints = resolver.resolve(opts.host, std::to_string(opts.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) {
    return absl::UnavailableError(
        fmt::format("http server cannot resolve {}: {}", where, ec ? ec.message() : "no address"));
  }
  tcp::endpoint endpoint = endpoints.begin()->endpoint();
  tcp::acceptor& acceptor = core->acceptor;
  auto fail = [&](const char* step) {
    return absl::UnavailableError(
        fmt::format("http server cannot listen on {} ({}): {}", where, step, ec.message()));
  };
  if (acceptor.open(endpoint.protocol(), ec); ec) return fail("open");
  if (acceptor.set_option(net::socket_base::reuse_address(true), ec); ec) return fail("setsockopt");
  if (acceptor.bind(endpoint, ec); ec) return fail("bind");
  if (acceptor.listen(net::socket_base::max_listen_connections, ec); ec) return fail("listen");
  int port = acceptor.local_endpoint(ec).port();
  if (ec) return fail("local_endpoint");

  std::unique_ptr<Server> server(new Server(core, port));
  core->work_guard.emplace(net::make_work_guard(core->ioc));
  Accept(core);
  for (int i = 0; i < num_threads; ++i) {
    server->threads_.emplace_back([core, i] { RunIoThread(core, i); });
  }
  spdlog::debug("http: listening on {}:{} with {} I/O threads", opts.host, port, num_threads);
  return server;
}

Server::~Server() { Stop(); }

std::string Server::address() const {
  const std::string& host = core_->options.host;
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port_);
  return fmt::format("{}:{}", host, port_);
}

size_t Server::num_connections() const {
  return core_->num_connections.load(std::memory_order_relaxed);
}

void Server::Stop() {
  if (stopped_.exchange(true)) return;
  std::vector<std::shared_ptr<Connection>> live;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->stopping = true;
    for (const auto& [id, weak] : core_->connections) {
      if (auto connection = weak.lock()) live.push_back(std::move(connection));
    }
  }
  net::post(core_->acceptor.get_executor(), [core = core_] {
    beast::error_code ignored;
    core->acceptor.close(ignored);
    core->accept_retry.cancel();
  });
  for (const auto& connection : live) connection->Close();
  live.clear();
  core_->work_guard.reset();
  for (std::thread& thread : threads_) {
    if (thread.get_id() == std::this_thread::get_id()) {
      spdlog::error("http: Server::Stop called on one of its I/O threads; not joining it");
      thread.detach();
    } else if (thread.joinable()) {
      thread.join();
    }
  }
  threads_.clear();
}

}  // namespace slime::http
