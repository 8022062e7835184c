#include "slime/http/util.h"

#include <sys/resource.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "fmt/format.h"

namespace slime::http {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

nlohmann::json ErrorBody(std::string_view message) {
  return {{"error", {{"message", std::string(message)}}}};
}

std::string SseEvent(const nlohmann::json& data) {
  return "data: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

std::string UrlDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%' && i + 2 < s.size()) {
      int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += (plus_is_space && c == '+') ? ' ' : c;
  }
  return out;
}

std::string UrlEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::map<std::string, std::string> ParseQuery(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string name = UrlDecode(pair.substr(0, eq));
    std::string value = eq == std::string_view::npos ? "" : UrlDecode(pair.substr(eq + 1));
    out.emplace(std::move(name), std::move(value));  // first value wins
  }
  return out;
}

StatusOr<std::pair<std::string, int>> ParseHostPort(std::string_view address) {
  std::string_view rest = address;
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        fmt::format("invalid address \"{}\": {}; expected host:port, http://host:port or [v6]:port",
                    address, why));
  };
  if (rest.starts_with("https://")) return invalid("https is not supported");
  if (rest.starts_with("http://")) rest.remove_prefix(7);
  if (rest.ends_with('/')) rest.remove_suffix(1);
  std::string_view host, port;
  if (rest.starts_with('[')) {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return invalid("unterminated '['");
    host = rest.substr(1, close - 1);
    if (close + 1 >= rest.size() || rest[close + 1] != ':') return invalid("missing port");
    port = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return invalid("missing port");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return invalid("IPv6 hosts need [brackets]");
  }
  if (host.empty()) return invalid("empty host");
  if (host.find('/') != std::string_view::npos) return invalid("a path is not allowed");
  int value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value < 1 ||
      value > 65535) {
    return invalid("port must be a number in 1..65535");
  }
  return std::make_pair(std::string(host), value);
}

StatusOr<size_t> RaiseFileDescriptorLimit(size_t want) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(fmt::format("getrlimit(RLIMIT_NOFILE): {}", std::strerror(errno)));
  }
  rlim_t target = static_cast<rlim_t>(want);
  if (limit.rlim_max != RLIM_INFINITY && target > limit.rlim_max) target = limit.rlim_max;
  if (limit.rlim_cur != RLIM_INFINITY && target > limit.rlim_cur) {
    limit.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      return absl::InternalError(
          fmt::format("setrlimit(RLIMIT_NOFILE, {}): {}", target, std::strerror(errno)));
    }
  }
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(fmt::format("getrlimit(RLIMIT_NOFILE): {}", std::strerror(errno)));
  }
  return static_cast<size_t>(limit.rlim_cur);
}

}  // namespace slime::http
