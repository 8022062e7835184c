// The HTTP server over real sockets on 127.0.0.1 (port 0): protocol behaviour, errors,
// asynchronous answers, streaming, disconnects, and 2,000 requests in flight on 2 threads.
#include "slime/http/server.h"

#include <atomic>
#include <future>
#include <thread>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "slime/http/client.h"
#include "slime/http/metrics_route.h"
#include "slime/http/util.h"
#include "test_support.h"

namespace slime::http {
namespace {

using testing::BodyOf;
using testing::CountThreads;
using testing::Parker;
using testing::RawSocket;
using namespace std::chrono_literals;

class ServerTest : public ::testing::Test {
 protected:
  // Routes every test shares: GET /hello, POST /echo, GET /throw, GET /park (parker_).
  Router BaseRouter() {
    Router router;
    router.Add("GET", "/hello", [this](const Request& request, std::shared_ptr<ResponseWriter> w) {
      ++hello_calls_;
      w->Send(200, "hello from " + request.remote_address, "text/plain");
    });
    router.Add("POST", "/echo", [](const Request& request, std::shared_ptr<ResponseWriter> w) {
      w->SendJson(200, {{"method", request.method},
                        {"path", request.path},
                        {"query", request.query},
                        {"body", request.body},
                        {"x_test", request.Header("x-TEST").value_or("")}});
    });
    router.Add("GET", "/throw", [](const Request&, std::shared_ptr<ResponseWriter>) {
      throw std::runtime_error("boom");
    });
    router.Add("GET", "/park", parker_.handler());
    router.Add("POST", "/park", parker_.handler());
    return router;
  }

  void StartServer(Router router, ServerOptions options = {}) {
    auto server = Server::Start(std::move(options), std::move(router));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void StartServer() { StartServer(BaseRouter()); }

  Client MakeClient(ClientOptions options = {}) {
    options.timeout = options.timeout == ClientOptions{}.timeout ? 20s : options.timeout;
    return Client("127.0.0.1", server_->port(), options);
  }

  Parker parker_;
  std::atomic<int> hello_calls_{0};
  std::unique_ptr<Server> server_;
};

// Access keys (http::AccessKeys): each combination of a user and an admin key, per route kind;
// a refused request reaches no handler.
TEST_F(ServerTest, AccessKeysGuardRoutesByKind) {
  struct Case {
    std::string api, admin;
    // status of /hello (user route) and /echo (admin route) with no key, the user key, the
    // admin key, and "Bearer" in another case ("bearer USER")
    std::vector<int> hello, echo;
  };
  const std::vector<Case> cases = {
      {"", "", {200, 200, 200, 200}, {200, 200, 200, 200}},
      {"U", "", {401, 200, 401, 200}, {401, 200, 401, 200}},
      {"U", "A", {401, 200, 200, 200}, {401, 403, 200, 403}},
      {"", "A", {200, 200, 200, 200}, {401, 401, 200, 401}},
  };
  for (const Case& c : cases) {
    Router router = BaseRouter();
    AccessKeys keys;
    keys.api_key = c.api;
    keys.admin_key = c.admin;
    keys.admin_paths = {"/echo"};
    keys.open_paths = {"/throw"};
    router.SetAccessKeys(keys);
    server_.reset();
    StartServer(std::move(router));
    Client client = MakeClient();
    const std::vector<Headers> who = {{},
                                      {{"Authorization", "Bearer U"}},
                                      {{"Authorization", "Bearer A"}},
                                      {{"Authorization", "bearer U"}}};
    const int before = hello_calls_;
    int allowed = 0;
    for (size_t i = 0; i < who.size(); ++i) {
      auto h = client.Get("/hello", who[i]);
      ASSERT_TRUE(h.ok()) << h.status();
      EXPECT_EQ(h->status, c.hello[i]) << "api '" << c.api << "' admin '" << c.admin << "' who " << i;
      allowed += h->status == 200;
      auto e = client.Post("/echo", "{}", "application/json", who[i]);
      ASSERT_TRUE(e.ok()) << e.status();
      EXPECT_EQ(e->status, c.echo[i]) << "api '" << c.api << "' admin '" << c.admin << "' who " << i;
    }
    EXPECT_EQ(hello_calls_ - before, allowed) << "a refused request reached its handler";
    auto open = client.Get("/throw");  // an open path: no key needed (the handler's 500)
    ASSERT_TRUE(open.ok()) << open.status();
    EXPECT_EQ(open->status, 500);
  }
}

TEST_F(ServerTest, KeepAliveServesManyRequestsOnOneConnection) {
  StartServer();
  EXPECT_EQ(server_->address(), fmt::format("127.0.0.1:{}", server_->port()));
  Client client = MakeClient();
  std::string first;
  for (int i = 0; i < 5; ++i) {
    auto response = client.Get("/hello");
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status, 200);
    EXPECT_EQ(response->Header("Content-Type"), "text/plain");
    EXPECT_EQ(response->headers.at("server"), "slime-cpp");
    if (i == 0) first = response->body;
    EXPECT_EQ(response->body, first);  // same peer address and port: the same connection
    EXPECT_EQ(server_->num_connections(), 1u);
  }
  auto echo = client.Post("/echo?a=1&b=x%20y&a=2", "payload", "text/plain", {{"X-Test", "t"}});
  ASSERT_TRUE(echo.ok()) << echo.status();
  nlohmann::json j = echo->Json();
  EXPECT_EQ(j["method"], "POST");
  EXPECT_EQ(j["path"], "/echo");
  EXPECT_EQ(j["query"], nlohmann::json({{"a", "1"}, {"b", "x y"}}));
  EXPECT_EQ(j["body"], "payload");
  EXPECT_EQ(j["x_test"], "t");
  EXPECT_EQ(server_->num_connections(), 1u);
  EXPECT_TRUE(client.connected());
}

TEST_F(ServerTest, ErrorAnswersAndTheServerKeepsServing) {
  ServerOptions options;
  options.max_body_bytes = 1024;
  StartServer(BaseRouter(), options);
  Client client = MakeClient();

  auto not_found = client.Get("/nope");
  ASSERT_TRUE(not_found.ok()) << not_found.status();
  EXPECT_EQ(not_found->status, 404);
  EXPECT_EQ(not_found->body, R"({"error":{"message":"no route for GET /nope"}})");

  auto not_allowed = client.Request("DELETE", "/hello", "");
  ASSERT_TRUE(not_allowed.ok()) << not_allowed.status();
  EXPECT_EQ(not_allowed->status, 405);
  EXPECT_EQ(not_allowed->Header("allow"), "GET, HEAD");
  EXPECT_EQ(not_allowed->Json()["error"]["message"],
            "method DELETE not allowed for /hello; allowed: GET, HEAD");

  auto too_big = client.Post("/echo", std::string(4096, 'x'));
  ASSERT_TRUE(too_big.ok()) << too_big.status();
  EXPECT_EQ(too_big->status, 413);
  EXPECT_EQ(too_big->Json()["error"]["message"], "request body exceeds the limit of 1024 bytes");
  EXPECT_EQ(too_big->Header("connection"), "close");

  auto thrown = client.Get("/throw");
  ASSERT_TRUE(thrown.ok()) << thrown.status();
  EXPECT_EQ(thrown->status, 500);
  EXPECT_EQ(thrown->body, R"({"error":{"message":"handler for GET /throw failed: boom"}})");

  for (std::string garbage : {"GARBAGE\r\n\r\n", "GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
                              "GET / HTTP/9.9\r\n\r\n"}) {
    RawSocket raw(server_->port());
    ASSERT_TRUE(raw.ok());
    raw.Send(garbage);
    std::string response = raw.ReadResponse();
    EXPECT_TRUE(response.starts_with("HTTP/1.1 400 Bad Request\r\n")) << response;
    EXPECT_NE(response.find("malformed HTTP request"), std::string::npos) << response;
    EXPECT_TRUE(raw.ServerClosed());
  }

  auto hello = client.Get("/hello");
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->status, 200);
}

TEST_F(ServerTest, HandlerAnswersLaterFromAnotherThreadWithoutBlockingOthers) {
  StartServer();
  Client client = MakeClient();
  auto pending = std::async(std::launch::async, [&] { return client.Get("/park?who=a"); });
  ASSERT_TRUE(parker_.WaitFor(1));

  // The parked request holds no thread: another connection is served meanwhile.
  Client other = MakeClient();
  auto hello = other.Get("/hello");
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->status, 200);
  EXPECT_EQ(pending.wait_for(0s), std::future_status::timeout);

  auto parked = parker_.Take();
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_EQ(parked[0].first.query.at("who"), "a");
  std::thread answer([writer = parked[0].second] {
    writer->SendJson(202, {{"answered_by", "another thread"}});
  });
  answer.join();
  auto response = pending.get();
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 202);
  EXPECT_EQ(response->Json()["answered_by"], "another thread");
}

TEST_F(ServerTest, SseChunksArriveAsTheyAreWritten) {
  StartServer();
  Client client = MakeClient();
  std::promise<void> saw_first_line;
  std::vector<std::string> lines;
  auto stream = std::async(std::launch::async, [&] {
    return client.PostStream("/park", "{}", [&](std::string_view line) {
      lines.emplace_back(line);
      if (lines.size() == 1) saw_first_line.set_value();
      return true;
    });
  });
  ASSERT_TRUE(parker_.WaitFor(1));
  std::shared_ptr<ResponseWriter> writer = parker_.Take()[0].second;
  writer->StartStream();
  ASSERT_TRUE(writer->Write(SseEvent({{"i", 1}})));
  // Line 2 does not exist yet: the client must have received line 1 on its own.
  ASSERT_EQ(saw_first_line.get_future().wait_for(20s), std::future_status::ready);
  ASSERT_TRUE(writer->Write(SseEvent({{"i", 2}})));
  ASSERT_TRUE(writer->Write(std::string(kSseDone)));
  writer->Finish();
  Status status = stream.get();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(lines,
            (std::vector<std::string>{R"(data: {"i":1})", R"(data: {"i":2})", "data: [DONE]"}));
  // The stream ended with the terminating chunk; the connection serves the next request.
  auto hello = client.Get("/hello");
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(server_->num_connections(), 1u);
}

TEST_F(ServerTest, ClientDisconnectRunsOnCloseAndWritesFail) {
  StartServer();
  RawSocket raw(server_->port());
  ASSERT_TRUE(raw.ok());
  raw.Send("GET /park HTTP/1.1\r\nHost: t\r\n\r\n");
  ASSERT_TRUE(parker_.WaitFor(1));
  std::shared_ptr<ResponseWriter> writer = parker_.Take()[0].second;
  std::promise<void> closed;
  writer->OnClose([&] { closed.set_value(); });
  EXPECT_FALSE(writer->closed());
  raw.Close();
  ASSERT_EQ(closed.get_future().wait_for(20s), std::future_status::ready);
  EXPECT_TRUE(writer->closed());
  EXPECT_EQ(server_->num_connections(), 0u);
  writer->StartStream();
  EXPECT_FALSE(writer->Write("data: x\n\n"));
  bool called_now = false;
  writer->OnClose([&] { called_now = true; });  // already closed: runs at once
  EXPECT_TRUE(called_now);
}

TEST_F(ServerTest, StreamingClientThatStopsIsSeenAsADisconnect) {
  StartServer();
  Client client = MakeClient();
  std::promise<void> closed;
  std::atomic<int> lines{0};
  auto stream = std::async(std::launch::async, [&] {
    return client.PostStream("/park", "{}", [&](std::string_view) {
      ++lines;
      return false;  // stop after the first line
    });
  });
  ASSERT_TRUE(parker_.WaitFor(1));
  std::shared_ptr<ResponseWriter> writer = parker_.Take()[0].second;
  writer->OnClose([&] { closed.set_value(); });
  writer->StartStream();
  writer->Write(SseEvent({{"i", 1}}));
  ASSERT_TRUE(stream.get().ok());
  EXPECT_EQ(lines.load(), 1);
  ASSERT_EQ(closed.get_future().wait_for(20s), std::future_status::ready);
  EXPECT_FALSE(writer->Write(SseEvent({{"i", 2}})));
}

TEST_F(ServerTest, Http10HeadPipeliningAndExpectContinue) {
  StartServer();
  {  // HTTP/1.0 without keep-alive: answer, then close.
    RawSocket raw(server_->port());
    raw.Send("GET /hello HTTP/1.0\r\n\r\n");
    std::string response = raw.ReadResponse();
    EXPECT_TRUE(response.starts_with("HTTP/1.1 200 OK\r\n")) << response;
    EXPECT_NE(response.find("Connection: close\r\n"), std::string::npos);
    EXPECT_TRUE(BodyOf(response).starts_with("hello from 127.0.0.1:"));
    EXPECT_TRUE(raw.ServerClosed());
  }
  {  // HTTP/1.0 asking for keep-alive: two answers on one connection.
    RawSocket raw(server_->port());
    for (int i = 0; i < 2; ++i) {
      raw.Send("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
      std::string response = raw.ReadResponse();
      EXPECT_NE(response.find("Connection: keep-alive\r\n"), std::string::npos) << response;
    }
  }
  {  // HEAD: GET's headers, no body; a pipelined GET after it parses cleanly.
    RawSocket raw(server_->port());
    raw.Send("HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    std::string head = raw.ReadResponse(/*head_only=*/true);
    std::string get = raw.ReadResponse();
    EXPECT_TRUE(head.starts_with("HTTP/1.1 200 OK\r\n")) << head;
    EXPECT_EQ(BodyOf(head), "");
    std::string length = fmt::format("Content-Length: {}\r\n", BodyOf(get).size());
    EXPECT_NE(head.find(length), std::string::npos) << head << get;
    EXPECT_TRUE(BodyOf(get).starts_with("hello from")) << get;
  }
  {  // Pipelining: the second request waits until the first is answered.
    RawSocket raw(server_->port());
    int hello_before = hello_calls_.load();
    raw.Send("GET /park?n=1 HTTP/1.1\r\nHost: t\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    ASSERT_TRUE(parker_.WaitFor(1));
    EXPECT_EQ(hello_calls_.load(), hello_before);  // not read yet: one request at a time
    parker_.Take()[0].second->Send(200, "first", "text/plain");
    EXPECT_EQ(BodyOf(raw.ReadResponse()), "first");
    EXPECT_TRUE(BodyOf(raw.ReadResponse()).starts_with("hello from"));
    EXPECT_EQ(hello_calls_.load(), hello_before + 1);
  }
  {  // Expect: 100-continue gets 100 before the body is sent.
    RawSocket raw(server_->port());
    raw.Send(
        "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
        "Expect: 100-continue\r\n\r\n");
    EXPECT_EQ(raw.ReadResponse(), "HTTP/1.1 100 Continue\r\n\r\n");
    raw.Send("hello");
    std::string response = raw.ReadResponse();
    EXPECT_EQ(nlohmann::json::parse(BodyOf(response))["body"], "hello") << response;
  }
}

TEST_F(ServerTest, IdleConnectionIsClosedAfterTheTimeout) {
  ServerOptions options;
  options.idle_timeout = 1s;
  StartServer(BaseRouter(), options);
  RawSocket raw(server_->port());
  raw.Send("GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_TRUE(raw.ReadResponse().starts_with("HTTP/1.1 200"));
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(raw.ServerClosed());  // blocks until the server's idle timer closes it
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST_F(ServerTest, StopClosesParkedRequestsAndIsIdempotent) {
  StartServer();
  RawSocket raw(server_->port());
  raw.Send("GET /park HTTP/1.1\r\nHost: t\r\n\r\n");
  ASSERT_TRUE(parker_.WaitFor(1));
  std::shared_ptr<ResponseWriter> writer = parker_.Take()[0].second;
  bool closed = false;
  writer->OnClose([&] { closed = true; });
  server_->Stop();
  EXPECT_TRUE(closed);  // ran on an I/O thread before Stop joined it
  EXPECT_TRUE(writer->closed());
  EXPECT_EQ(server_->num_connections(), 0u);
  EXPECT_TRUE(raw.ServerClosed());
  server_->Stop();
  server_.reset();
  writer->Send(200, "too late");  // the writer outlives the server; its answer is dropped
  writer.reset();
}

TEST_F(ServerTest, MetricsRoute) {
  metrics::Registry registry;
  registry.GetCounter("slime_test_total", "Test counter.", {{"k", "v"}}).Increment(3);
  Router router;
  AddMetricsRoute(router, registry);
  StartServer(std::move(router));
  Client client = MakeClient();
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->Header("content-type"), "text/plain; version=0.0.4");
  EXPECT_EQ(response->body, registry.Exposition());
  EXPECT_NE(response->body.find("slime_test_total{k=\"v\"} 3\n"), std::string::npos);
}

TEST_F(ServerTest, StartFailsClearlyWhenThePortIsTaken) {
  StartServer();
  ServerOptions options;
  options.port = server_->port();
  auto second = Server::Start(options, Router());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(second.status().message()).find(fmt::format("127.0.0.1:{}", options.port)),
            std::string::npos)
      << second.status();
  options.num_threads = 0;
  EXPECT_EQ(Server::Start(options, Router()).status().code(), absl::StatusCode::kInvalidArgument);
}

// 2,000 connections whose handlers have not answered, served by 2 I/O threads.
TEST_F(ServerTest, TwoThousandConcurrentInFlightRequests) {
  constexpr int kClients = 2000;
  constexpr int kIoThreads = 2;
  // Both ends of every connection live in this process.
  auto limit = RaiseFileDescriptorLimit(2 * kClients + 512);
  ASSERT_TRUE(limit.ok()) << limit.status();
  if (*limit < 2 * kClients + 256) {
    GTEST_SKIP() << "the hard file descriptor limit (" << *limit << ") is below "
                 << 2 * kClients + 256 << "; raise it with ulimit -Hn";
  }
  const size_t threads_before = CountThreads();
  ServerOptions options;
  options.num_threads = kIoThreads;
  StartServer(BaseRouter(), options);

  std::vector<std::unique_ptr<RawSocket>> sockets;
  for (int i = 0; i < kClients; ++i) {
    sockets.push_back(std::make_unique<RawSocket>(server_->port()));
    ASSERT_TRUE(sockets.back()->ok()) << "connect " << i << ": " << std::strerror(errno);
    ASSERT_TRUE(sockets.back()->Send(fmt::format("GET /park?i={} HTTP/1.1\r\nHost: t\r\n\r\n", i)));
  }
  ASSERT_TRUE(parker_.WaitFor(kClients)) << "only " << parker_.size() << " requests arrived";
  EXPECT_EQ(server_->num_connections(), static_cast<size_t>(kClients));
  const size_t threads_peak = CountThreads();
  EXPECT_LE(threads_peak, threads_before + kIoThreads + 1)
      << "the server must not start a thread per connection";

  // Answer all of them, from two threads that are not I/O threads.
  auto parked = parker_.Take();
  ASSERT_EQ(parked.size(), static_cast<size_t>(kClients));
  auto answer = [&parked](size_t begin) {
    for (size_t i = begin; i < parked.size(); i += 2) {
      parked[i].second->Send(200, parked[i].first.query.at("i"), "text/plain");
    }
  };
  std::thread a(answer, 0), b(answer, 1);
  a.join();
  b.join();
  parked.clear();
  int answered = 0;
  for (int i = 0; i < kClients; ++i) {
    std::string response = sockets[i]->ReadResponse();
    EXPECT_TRUE(response.starts_with("HTTP/1.1 200 OK\r\n")) << i << ": " << response;
    if (BodyOf(response) == std::to_string(i)) ++answered;
  }
  EXPECT_EQ(answered, kClients);
}

}  // namespace
}  // namespace slime::http
