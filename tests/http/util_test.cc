#include "slime/http/util.h"

#include "gtest/gtest.h"
#include "slime/http/client.h"

namespace slime::http {
namespace {

TEST(UtilTest, ErrorBodyAndSse) {
  EXPECT_EQ(ErrorBody("bad \"x\"").dump(), R"({"error":{"message":"bad \"x\""}})");
  EXPECT_EQ(SseEvent({{"text", "hi"}, {"i", 1}}), "data: {\"i\":1,\"text\":\"hi\"}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(UtilTest, UrlDecodeAndEncode) {
  EXPECT_EQ(UrlDecode("a%20b+c"), "a b c");
  EXPECT_EQ(UrlDecode("a%20b+c", /*plus_is_space=*/false), "a b+c");
  EXPECT_EQ(UrlDecode("%e2%82%AC"), "\xe2\x82\xac");
  EXPECT_EQ(UrlDecode("100%"), "100%");    // trailing '%' kept
  EXPECT_EQ(UrlDecode("%G1%2"), "%G1%2");  // malformed escapes kept
  EXPECT_EQ(UrlEncode("a b/c?d=e&f~g.h-i_j"), "a%20b%2Fc%3Fd%3De%26f~g.h-i_j");
  EXPECT_EQ(UrlDecode(UrlEncode("x y+z%\n")), "x y+z%\n");
}

TEST(UtilTest, ParseQuery) {
  auto q = ParseQuery("a=1&b=x%20y&flag&c=1+2&a=2&&=v");
  EXPECT_EQ(q.at("a"), "1");  // first value wins
  EXPECT_EQ(q.at("b"), "x y");
  EXPECT_EQ(q.at("flag"), "");
  EXPECT_EQ(q.at("c"), "1 2");
  EXPECT_EQ(q.at(""), "v");
  EXPECT_TRUE(ParseQuery("").empty());
}

TEST(UtilTest, ParseHostPort) {
  using P = std::pair<std::string, int>;
  EXPECT_EQ(*ParseHostPort("127.0.0.1:8000"), P("127.0.0.1", 8000));
  EXPECT_EQ(*ParseHostPort("http://engine-3:30000"), P("engine-3", 30000));
  EXPECT_EQ(*ParseHostPort("http://localhost:1/"), P("localhost", 1));
  EXPECT_EQ(*ParseHostPort("[::1]:65535"), P("::1", 65535));
  for (const char* bad : {"localhost", "host:", ":80", "host:0", "host:65536", "host:8x",
                          "https://h:1", "::1:80", "[::1]80", "h:1/path"}) {
    auto parsed = ParseHostPort(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(std::string(parsed.status().message()).find(bad), std::string::npos)
        << parsed.status();
  }
}

TEST(UtilTest, RaiseFileDescriptorLimitNeverLowers) {
  auto now = RaiseFileDescriptorLimit(0);
  ASSERT_TRUE(now.ok()) << now.status();
  auto again = RaiseFileDescriptorLimit(*now + 16);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GE(*again, *now);
}

TEST(UtilTest, StatusFromHttp) {
  EXPECT_TRUE(StatusFromHttp(204, "x", "").ok());
  EXPECT_EQ(StatusFromHttp(404, "GET /x", "nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(StatusFromHttp(503, "x", "").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromHttp(502, "x", "").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(StatusFromHttp(418, "x", "").code(), absl::StatusCode::kUnknown);
  Status s = StatusFromHttp(400, "POST /generate", "{\"error\":1}");
  EXPECT_EQ(std::string(s.message()), "POST /generate returned HTTP 400: {\"error\":1}");
}

}  // namespace
}  // namespace slime::http
