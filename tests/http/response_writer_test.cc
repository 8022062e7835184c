// ResponseWriter framing and life cycle against a fake sink (no sockets), plus Router dispatch.
#include "slime/http/response_writer.h"

#include <vector>

#include "gtest/gtest.h"
#include "slime/http/router.h"

namespace slime::http {
namespace {

struct FakeSink : ResponseSink {
  struct Item {
    std::string bytes;
    bool last;
    bool close_after;
  };
  void Enqueue(uint64_t, std::string bytes, bool last, bool close_after) override {
    items.push_back({std::move(bytes), last, close_after});
  }
  std::string All() const {
    std::string out;
    for (const auto& item : items) out += item.bytes;
    return out;
  }
  std::vector<Item> items;
};

std::shared_ptr<ResponseWriter> MakeWriter(const std::shared_ptr<FakeSink>& sink,
                                           std::string method = "GET", int version = 11,
                                           bool keep_alive = true) {
  ResponseWriter::Context context;
  context.method = std::move(method);
  context.path = "/p";
  context.version = version;
  context.keep_alive = keep_alive;
  return std::make_shared<ResponseWriter>(sink, context);
}

TEST(ResponseWriterTest, SendFramesACompleteResponse) {
  auto sink = std::make_shared<FakeSink>();
  auto writer = MakeWriter(sink);
  writer->SetHeader("Retry-After", "3");
  writer->Send(200, "{\"ok\":true}");
  ASSERT_EQ(sink->items.size(), 1u);
  EXPECT_TRUE(sink->items[0].last);
  EXPECT_FALSE(sink->items[0].close_after);
  EXPECT_EQ(sink->All(),
            "HTTP/1.1 200 OK\r\nServer: slime-cpp\r\nContent-Type: application/json\r\n"
            "Retry-After: 3\r\nContent-Length: 11\r\n\r\n{\"ok\":true}");
  EXPECT_TRUE(writer->answered());
  writer->Send(500, "again");  // ignored
  EXPECT_EQ(sink->items.size(), 1u);
}

TEST(ResponseWriterTest, HeadSendsLengthWithoutBody) {
  auto sink = std::make_shared<FakeSink>();
  MakeWriter(sink, "HEAD")->Send(200, "hello", "text/plain");
  EXPECT_EQ(sink->All(),
            "HTTP/1.1 200 OK\r\nServer: slime-cpp\r\nContent-Type: text/plain\r\n"
            "Content-Length: 5\r\n\r\n");
}

TEST(ResponseWriterTest, Http10CloseAndKeepAlive) {
  auto sink = std::make_shared<FakeSink>();
  MakeWriter(sink, "GET", 10, /*keep_alive=*/false)->Send(404, "x", "text/plain");
  EXPECT_NE(sink->All().find("Connection: close\r\n"), std::string::npos);
  EXPECT_TRUE(sink->items[0].close_after);
  auto sink2 = std::make_shared<FakeSink>();
  MakeWriter(sink2, "GET", 10, /*keep_alive=*/true)->Send(200, "x", "text/plain");
  EXPECT_NE(sink2->All().find("Connection: keep-alive\r\n"), std::string::npos);
  EXPECT_FALSE(sink2->items[0].close_after);
}

TEST(ResponseWriterTest, StreamIsChunked) {
  auto sink = std::make_shared<FakeSink>();
  auto writer = MakeWriter(sink, "POST");
  EXPECT_FALSE(writer->Write("too early"));
  writer->StartStream();
  EXPECT_TRUE(writer->Write("data: 1\n\n"));
  EXPECT_TRUE(writer->Write(""));  // nothing sent
  EXPECT_TRUE(writer->Write(std::string(26, 'z')));
  writer->Finish();
  ASSERT_EQ(sink->items.size(), 4u);
  EXPECT_EQ(sink->items[0].bytes,
            "HTTP/1.1 200 OK\r\nServer: slime-cpp\r\nContent-Type: text/event-stream\r\n"
            "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_FALSE(sink->items[0].last);
  EXPECT_EQ(sink->items[1].bytes, "9\r\ndata: 1\n\n\r\n");
  EXPECT_EQ(sink->items[2].bytes, "1a\r\n" + std::string(26, 'z') + "\r\n");
  EXPECT_EQ(sink->items[3].bytes, "0\r\n\r\n");
  EXPECT_TRUE(sink->items[3].last);
  EXPECT_FALSE(sink->items[3].close_after);
}

TEST(ResponseWriterTest, Http10StreamIsARawBodyEndedByClose) {
  auto sink = std::make_shared<FakeSink>();
  auto writer = MakeWriter(sink, "GET", 10, /*keep_alive=*/true);
  writer->StartStream(200, "text/plain");
  writer->Write("abc");
  writer->Finish();
  EXPECT_EQ(sink->All(),
            "HTTP/1.1 200 OK\r\nServer: slime-cpp\r\nContent-Type: text/plain\r\n"
            "Cache-Control: no-cache\r\nConnection: close\r\n\r\nabc");
  EXPECT_TRUE(sink->items.back().last);
  EXPECT_TRUE(sink->items.back().close_after);
}

TEST(ResponseWriterTest, DroppedWriterAnswers500OrEndsTheStream) {
  auto sink = std::make_shared<FakeSink>();
  MakeWriter(sink).reset();
  ASSERT_EQ(sink->items.size(), 1u);
  EXPECT_TRUE(sink->All().starts_with("HTTP/1.1 500 Internal Server Error\r\n"));
  EXPECT_NE(sink->All().find("handler for GET /p finished without answering"), std::string::npos);

  auto sink2 = std::make_shared<FakeSink>();
  auto writer = MakeWriter(sink2);
  writer->StartStream();
  writer.reset();
  EXPECT_EQ(sink2->items.back().bytes, "0\r\n\r\n");
  EXPECT_TRUE(sink2->items.back().last);
}

TEST(ResponseWriterTest, InvalidStatusBecomes500) {
  auto sink = std::make_shared<FakeSink>();
  MakeWriter(sink)->Send(42, "x");
  EXPECT_TRUE(sink->All().starts_with("HTTP/1.1 500 "));
}

TEST(ResponseWriterTest, OnCloseRunsOnceAndOnlyBeforeTheAnswer) {
  auto sink = std::make_shared<FakeSink>();
  auto writer = MakeWriter(sink);
  int calls = 0;
  writer->OnClose([&] { ++calls; });
  writer->NotifyClosed();
  writer->NotifyClosed();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(writer->closed());
  writer->OnClose([&] { ++calls; });  // already closed: runs now
  EXPECT_EQ(calls, 2);
  writer->StartStream();
  EXPECT_FALSE(writer->Write("x"));

  auto answered = MakeWriter(sink);
  answered->OnClose([&] { ++calls; });
  answered->Send(200, "");
  answered->NotifyClosed();
  EXPECT_EQ(calls, 2);
}

TEST(RouterTest, DispatchRules) {
  Router router;
  std::vector<std::string> seen;
  auto record = [&seen](std::string tag) {
    return [&seen, tag](const Request& r, std::shared_ptr<ResponseWriter> w) {
      seen.push_back(tag + " " + r.method);
      w->Send(200, tag, "text/plain");
    };
  };
  router.Add("GET", "/a", record("get-a"));
  router.Add("POST", "/a", record("post-a"));
  router.Add("*", "/any", record("any"));
  router.Add("GET", "/throw", [](const Request&, std::shared_ptr<ResponseWriter>) {
    throw std::runtime_error("boom");
  });
  router.Add("GET", "/throw-mid-stream", [](const Request&, std::shared_ptr<ResponseWriter> w) {
    w->StartStream();
    w->Write("data: 1\n\n");
    throw std::runtime_error("late boom");
  });
  EXPECT_EQ(router.AllowedMethods("/a"), (std::vector<std::string>{"GET", "HEAD", "POST"}));

  auto run = [&](std::string method, std::string path) {
    auto sink = std::make_shared<FakeSink>();
    Request request;
    request.method = method;
    request.path = path;
    router.Dispatch(request, MakeWriter(sink, method));
    return sink->All();
  };
  EXPECT_TRUE(run("GET", "/a").ends_with("get-a"));
  EXPECT_TRUE(run("POST", "/a").ends_with("post-a"));
  std::string head = run("HEAD", "/a");
  EXPECT_NE(head.find("Content-Length: 5\r\n"), std::string::npos);
  EXPECT_TRUE(head.ends_with("\r\n\r\n"));
  EXPECT_TRUE(run("DELETE", "/any").ends_with("any"));
  EXPECT_EQ(seen,
            (std::vector<std::string>{"get-a GET", "post-a POST", "get-a HEAD", "any DELETE"}));

  std::string not_found = run("GET", "/x");
  EXPECT_TRUE(not_found.starts_with("HTTP/1.1 404 Not Found\r\n"));
  EXPECT_TRUE(not_found.ends_with(R"({"error":{"message":"no route for GET /x"}})"));
  std::string not_allowed = run("PUT", "/a");
  EXPECT_TRUE(not_allowed.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_NE(not_allowed.find("Allow: GET, HEAD, POST\r\n"), std::string::npos);
  EXPECT_TRUE(not_allowed.ends_with(
      R"({"error":{"message":"method PUT not allowed for /a; allowed: GET, HEAD, POST"}})"));
  std::string thrown = run("GET", "/throw");
  EXPECT_TRUE(thrown.starts_with("HTTP/1.1 500 "));
  EXPECT_TRUE(thrown.ends_with(R"({"error":{"message":"handler for GET /throw failed: boom"}})"));
  std::string mid_stream = run("GET", "/throw-mid-stream");  // status already out: stream ends
  EXPECT_TRUE(mid_stream.starts_with("HTTP/1.1 200 OK\r\n")) << mid_stream;
  EXPECT_TRUE(mid_stream.ends_with("9\r\ndata: 1\n\n\r\n0\r\n\r\n")) << mid_stream;
}

TEST(RouterTest, PrefixRoutesMatchTheLongestPrefixAfterExactPaths) {
  Router router;
  auto tagged = [](std::string tag) {
    return [tag](const Request& r, std::shared_ptr<ResponseWriter> w) {
      w->Send(200, tag + ":" + r.path, "text/plain");
    };
  };
  router.AddPrefix("POST", "/s/", tagged("s"));
  router.AddPrefix("GET", "/s/deep/", tagged("deep"));
  router.Add("POST", "/s/exact", tagged("exact"));
  router.AddPrefix("GET", "no-slash", tagged("never"));  // refused: ignored
  auto run = [&](std::string method, std::string path) {
    auto sink = std::make_shared<FakeSink>();
    Request request;
    request.method = method;
    request.path = path;
    router.Dispatch(request, MakeWriter(sink, method));
    return sink->All();
  };
  EXPECT_TRUE(run("POST", "/s/abc/v1/x").ends_with("s:/s/abc/v1/x"));
  EXPECT_TRUE(run("GET", "/s/deep/1").ends_with("deep:/s/deep/1"));
  EXPECT_TRUE(run("POST", "/s/exact").ends_with("exact:/s/exact"));
  std::string wrong_method = run("GET", "/s/abc");
  EXPECT_TRUE(wrong_method.starts_with("HTTP/1.1 405 ")) << wrong_method;
  EXPECT_NE(wrong_method.find("Allow: POST\r\n"), std::string::npos);
  EXPECT_TRUE(run("POST", "/s").starts_with("HTTP/1.1 404 "));
  EXPECT_TRUE(run("GET", "no-slash/x").starts_with("HTTP/1.1 404 "));
}

TEST(RequestTest, HeaderIsCaseInsensitive) {
  Request request;
  request.headers = {{"Content-Type", "a"}, {"X-Id", "1"}, {"x-id", "2"}};
  EXPECT_EQ(request.Header("content-type"), "a");
  EXPECT_EQ(request.Header("X-ID"), "1");
  EXPECT_EQ(request.Header("missing"), std::nullopt);
}

}  // namespace
}  // namespace slime::http
