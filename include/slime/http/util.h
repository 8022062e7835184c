// Small HTTP helpers shared by the server, the client and the services built on them:
// the JSON error shape, Server-Sent Events framing, URL decoding, host:port parsing and the
// file-descriptor limit a server with thousands of connections needs.
//
// Threads: every function is stateless and may be called from any thread
// (RaiseFileDescriptorLimit changes a process-wide limit).
#ifndef SLIME_HTTP_UTIL_H_
#define SLIME_HTTP_UTIL_H_

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"

namespace slime::http {

// {"error":{"message": message}} — the error body of every non-2xx answer we produce
// (the OpenAI/SGLang shape).
nlohmann::json ErrorBody(std::string_view message);

// One Server-Sent Event carrying `data`: "data: " + data.dump() + "\n\n". Invalid UTF-8 in
// strings is replaced (U+FFFD) rather than throwing.
std::string SseEvent(const nlohmann::json& data);
// The OpenAI-style end-of-stream event.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// Percent-decodes `s`. With `plus_is_space` (query strings, form bodies) '+' becomes ' '.
// Malformed escapes ("%G1", a trailing "%") are kept literally.
std::string UrlDecode(std::string_view s, bool plus_is_space = true);
// Percent-encodes everything except unreserved characters (RFC 3986: A-Z a-z 0-9 - . _ ~).
std::string UrlEncode(std::string_view s);
// Parses "a=1&b=x%20y&flag" into {a:"1", b:"x y", flag:""}, decoding names and values.
// A repeated name keeps its first value.
std::map<std::string, std::string> ParseQuery(std::string_view query);

// Parses "host:port", "http://host:port" (an optional trailing '/' is allowed) and
// "[v6addr]:port" into (host, port); the port must be 1..65535. "https://" is rejected:
// the client speaks plain HTTP only.
StatusOr<std::pair<std::string, int>> ParseHostPort(std::string_view address);

// Raises this process's soft RLIMIT_NOFILE to min(hard limit, want) (never lowers it) and
// returns the soft limit now in force, which can be below `want` when the hard limit is.
// A server expecting N concurrent connections wants about N + a few hundred descriptors; a test
// opening both ends of N connections in one process wants 2N + a few hundred.
// Errors: only a failing getrlimit/setrlimit call (Internal); a low hard limit is not an error.
StatusOr<size_t> RaiseFileDescriptorLimit(size_t want);

}  // namespace slime::http

#endif  // SLIME_HTTP_UTIL_H_
