// Client behaviour against a real server: errors, timeouts, reconnecting a kept connection.
#include "slime/http/client.h"

#include <future>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "slime/http/server.h"
#include "test_support.h"

namespace slime::http {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Server> StartOrDie(Router router, ServerOptions options = {}) {
  auto server = Server::Start(std::move(options), std::move(router));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

Router TextRoute(std::string path, std::string text) {
  Router router;
  router.Add("GET", path, [text](const Request&, std::shared_ptr<ResponseWriter> w) {
    w->Send(200, text, "text/plain");
  });
  return router;
}

TEST(ClientTest, ConnectionRefusedIsUnavailableNamingTheAddress) {
  auto server = StartOrDie(Router());
  ASSERT_NE(server, nullptr);
  int port = server->port();
  server->Stop();  // nothing listens there now
  Client client("127.0.0.1", port, {.timeout = 5s});
  auto response = client.Get("/x");
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_NE(std::string(response.status().message()).find(fmt::format("127.0.0.1:{}", port)),
            std::string::npos)
      << response.status();
}

TEST(ClientTest, TimeoutIsDeadlineExceeded) {
  testing::Parker parker;
  Router router;
  router.Add("GET", "/park", parker.handler());
  router.Add("POST", "/park", parker.handler());
  auto server = StartOrDie(std::move(router));
  ASSERT_NE(server, nullptr);
  Client client("127.0.0.1", server->port(), {.timeout = 200ms});
  auto response = client.Get("/park");
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded) << response.status();
  Status stream = client.PostStream("/park", "{}", [](std::string_view) { return true; });
  EXPECT_EQ(stream.code(), absl::StatusCode::kDeadlineExceeded) << stream;
}

TEST(ClientTest, PostStreamTurnsAnErrorStatusIntoAStatus) {
  auto server = StartOrDie(Router());
  ASSERT_NE(server, nullptr);
  Client client("127.0.0.1", server->port(), {.timeout = 20s});
  Status status = client.PostStream("/generate", "{}", [](std::string_view) { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(std::string(status.message()).find("no route for POST /generate"), std::string::npos)
      << status;
  // The error body was read completely, so the kept connection is still usable.
  EXPECT_TRUE(client.connected());
  EXPECT_EQ(server->num_connections(), 1u);
}

TEST(ClientTest, ReconnectsOnceWhenTheServerClosedTheKeptConnection) {
  auto first = StartOrDie(TextRoute("/who", "first"));
  ASSERT_NE(first, nullptr);
  const int port = first->port();
  Client client("127.0.0.1", port, {.timeout = 20s});
  auto a = client.Get("/who");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->body, "first");
  ASSERT_TRUE(client.connected());

  first->Stop();  // closes the connection the client keeps
  ServerOptions options;
  options.port = port;
  auto second = StartOrDie(TextRoute("/who", "second"), options);
  ASSERT_NE(second, nullptr);
  auto b = client.Get("/who");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->body, "second");
}

TEST(ClientTest, HeadAndCustomMethods) {
  Router router = TextRoute("/t", "twelve bytes");
  router.Add("PURGE", "/t", [](const Request& r, std::shared_ptr<ResponseWriter> w) {
    w->Send(200, r.method + ":" + r.body, "text/plain");
  });
  auto server = StartOrDie(std::move(router));
  ASSERT_NE(server, nullptr);
  Client client("127.0.0.1", server->port(), {.timeout = 20s});
  auto head = client.Request("HEAD", "/t", "");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");
  EXPECT_EQ(head->Header("content-length"), "12");
  auto purge = client.Request("PURGE", "/t", "x");
  ASSERT_TRUE(purge.ok()) << purge.status();
  EXPECT_EQ(purge->body, "PURGE:x");
  EXPECT_EQ(server->num_connections(), 1u);
}

// ClientOptions::bearer_token: every method (and PostStream) carries it against a server with
// access keys; a call's own Authorization header wins.
TEST(ClientTest, BearerTokenOpensAGuardedServer) {
  Router router;
  router.Add("*", "/k", [](const Request& r, std::shared_ptr<ResponseWriter> w) {
    w->Send(200, r.method, "text/plain");
  });
  AccessKeys keys;
  keys.api_key = "user-key";
  router.SetAccessKeys(keys);
  auto server = StartOrDie(std::move(router));
  ASSERT_NE(server, nullptr);

  Client open("127.0.0.1", server->port(), {.timeout = 20s});
  auto refused = open.Get("/k");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->status, 401);

  Client keyed("127.0.0.1", server->port(), {.timeout = 20s, .bearer_token = "user-key"});
  for (const std::string method : {"GET", "POST", "PUT"}) {
    auto r = keyed.Request(method, "/k", method == "GET" ? "" : "{}");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200) << method;
    EXPECT_EQ(r->body, method);
  }
  auto posted = keyed.Post("/k", "{}");
  ASSERT_TRUE(posted.ok()) << posted.status();
  EXPECT_EQ(posted->status, 200);
  std::string streamed;
  Status stream = keyed.PostStream("/k", "{}", [&](std::string_view line) {
    streamed += line;
    return true;
  });
  EXPECT_TRUE(stream.ok()) << stream;
  EXPECT_EQ(streamed, "POST");

  auto overridden = keyed.Get("/k", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_EQ(overridden->status, 401);

  Client wrong("127.0.0.1", server->port(), {.timeout = 20s, .bearer_token = "user-kex"});
  auto denied = wrong.Get("/k");
  ASSERT_TRUE(denied.ok()) << denied.status();
  EXPECT_EQ(denied->status, 401);
}

}  // namespace
}  // namespace slime::http
