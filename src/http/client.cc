#include "slime/http/client.h"

#include <cctype>
#include <cstdint>
#include <limits>
#include <optional>

#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core/error.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "boost/beast/http/buffer_body.hpp"
#include "boost/beast/http/error.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/read.hpp"
#include "boost/beast/http/string_body.hpp"
#include "boost/beast/http/write.hpp"
#include "fmt/format.h"

namespace slime::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunk = 16 << 10;
constexpr size_t kMaxErrorBody = 64 << 10;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Runs one asynchronous operation on `ioc` (the calling thread) to completion.
template <typename Initiate>
beast::error_code RunOp(net::io_context& ioc, Initiate&& initiate) {
  beast::error_code result = net::error::operation_aborted;
  initiate([&result](beast::error_code ec, auto&&...) { result = ec; });
  ioc.restart();
  ioc.run();
  return result;
}

// The connection ended before any byte of the answer: the server had closed a kept connection.
bool IsStaleConnection(const beast::error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::connection_aborted;
}

}  // namespace

nlohmann::json Response::Json() const { return nlohmann::json::parse(body); }

std::optional<std::string> Response::Header(std::string_view name) const {
  auto it = headers.find(Lower(name));
  if (it == headers.end()) return std::nullopt;
  return it->second;
}

Status StatusFromHttp(int status, std::string_view what, std::string_view body) {
  if (status >= 200 && status < 300) return absl::OkStatus();
  std::string message = fmt::format("{} returned HTTP {}: {}", what, status,
                                    body.substr(0, std::min<size_t>(body.size(), 2000)));
  switch (status) {
    case 400:
      return absl::InvalidArgumentError(message);
    case 401:
    case 403:
      return absl::PermissionDeniedError(message);
    case 404:
      return absl::NotFoundError(message);
    case 408:
    case 504:
      return absl::DeadlineExceededError(message);
    case 409:
      return absl::AbortedError(message);
    case 413:
    case 429:
      return absl::ResourceExhaustedError(message);
    case 503:
      return absl::UnavailableError(message);
    default:
      if (status >= 500 && status < 600) return absl::InternalError(message);
      return absl::UnknownError(message);
  }
}

struct Client::Impl {
  net::io_context ioc{1};
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  Status Connect(const std::string& host, int port, Clock::time_point deadline,
                 std::chrono::milliseconds timeout) {
    stream.reset();
    buffer.clear();
    beast::error_code ec;
    tcp::resolver resolver(ioc);
    auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec) {
      return absl::UnavailableError(
          fmt::format("cannot resolve {}:{}: {}", host, port, ec.message()));
    }
    stream.emplace(ioc);
    stream->expires_at(deadline);
    ec = RunOp(ioc, [&](auto handler) { stream->async_connect(endpoints, std::move(handler)); });
    if (ec) {
      stream.reset();
      if (ec == beast::error::timeout) {
        return absl::DeadlineExceededError(
            fmt::format("connect to {}:{} timed out after {} ms", host, port, timeout.count()));
      }
      return absl::UnavailableError(fmt::format("connect to {}:{}: {}", host, port, ec.message()));
    }
    stream->socket().set_option(tcp::no_delay(true), ec);
    return absl::OkStatus();
  }

  // Connects if needed and writes `request`. `reused` says whether a kept connection was used.
  Status Send(const bhttp::request<bhttp::string_body>& request, const std::string& host, int port,
              Clock::time_point deadline, std::chrono::milliseconds timeout,
              const std::string& what, bool* reused, bool* retry) {
    *retry = false;
    *reused = stream.has_value();
    if (!*reused) SLIME_RETURN_IF_ERROR(Connect(host, port, deadline, timeout));
    stream->expires_at(deadline);
    beast::error_code ec =
        RunOp(ioc, [&](auto handler) { bhttp::async_write(*stream, request, std::move(handler)); });
    if (!ec) return absl::OkStatus();
    stream.reset();
    if (ec == beast::error::timeout) {
      return absl::DeadlineExceededError(
          fmt::format("{}: timed out after {} ms", what, timeout.count()));
    }
    *retry = *reused;
    return absl::UnavailableError(
        fmt::format("{}: sending the request failed: {}", what, ec.message()));
  }
};

Client::Client(std::string host, int port, ClientOptions options)
    : host_(std::move(host)), port_(port), options_(options), impl_(std::make_unique<Impl>()) {}

Client::~Client() = default;

void Client::Close() {
  if (impl_->stream) {
    beast::error_code ignored;
    impl_->stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
    impl_->stream->close();
  }
  impl_->stream.reset();
}

bool Client::connected() const { return impl_->stream.has_value(); }

StatusOr<Response> Client::Get(const std::string& path, const Headers& headers) {
  return Request("GET", path, "", headers);
}

StatusOr<Response> Client::Post(const std::string& path, std::string body,
                                const std::string& content_type, const Headers& headers) {
  Headers all = headers;
  all.emplace("Content-Type", content_type);
  return Request("POST", path, std::move(body), all);
}

namespace {

bhttp::request<bhttp::string_body> BuildRequest(const std::string& method, const std::string& path,
                                                std::string body, const Headers& headers,
                                                const std::string& host, int port,
                                                const ClientOptions& options) {
  bhttp::request<bhttp::string_body> request;
  bhttp::verb verb = bhttp::string_to_verb(method);
  if (verb == bhttp::verb::unknown) {
    request.method_string(method);
  } else {
    request.method(verb);
  }
  request.target(path);
  request.version(11);
  request.set(bhttp::field::host, fmt::format("{}:{}", host, port));
  request.set(bhttp::field::user_agent, "slime-cpp");
  for (const auto& [name, value] : headers) request.set(name, value);
  if (!options.bearer_token.empty() && request.find(bhttp::field::authorization) == request.end()) {
    request.set(bhttp::field::authorization, "Bearer " + options.bearer_token);
  }
  request.body() = std::move(body);
  if (!request.body().empty() || method == "POST" || method == "PUT" || method == "PATCH") {
    request.content_length(request.body().size());
  }
  request.keep_alive(options.keep_alive);
  return request;
}

}  // namespace

StatusOr<Response> Client::Request(const std::string& method, const std::string& path,
                                   std::string body, const Headers& headers) {
  if (method.empty()) return absl::InvalidArgumentError("http client: empty method");
  const auto deadline = Clock::now() + options_.timeout;
  const std::string what = fmt::format("{} http://{}:{}{}", method, host_, port_, path);
  auto request =
      BuildRequest(method, path, std::move(body), headers, host_, port_, options_);
  for (int attempt = 0;; ++attempt) {
    bool reused = false, retry = false;
    Status sent =
        impl_->Send(request, host_, port_, deadline, options_.timeout, what, &reused, &retry);
    if (!sent.ok()) {
      if (retry && attempt == 0) continue;
      return sent;
    }
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // boost::none is broken in 1.74
    parser.skip(method == "HEAD");
    impl_->stream->expires_at(deadline);
    beast::error_code ec = RunOp(impl_->ioc, [&](auto handler) {
      bhttp::async_read(*impl_->stream, impl_->buffer, parser, std::move(handler));
    });
    if (ec) {
      bool got_nothing = !parser.got_some();
      Close();
      if (ec == beast::error::timeout) {
        return absl::DeadlineExceededError(
            fmt::format("{}: timed out after {} ms", what, options_.timeout.count()));
      }
      if (reused && got_nothing && attempt == 0 && IsStaleConnection(ec)) continue;
      if (IsStaleConnection(ec)) {
        return absl::UnavailableError(fmt::format(
            "{}: the connection closed before the response was complete: {}", what, ec.message()));
      }
      return absl::InternalError(fmt::format("{}: bad response: {}", what, ec.message()));
    }
    auto& message = parser.get();
    Response response;
    response.status = message.result_int();
    for (const auto& field : message) {
      std::string name = Lower(field.name_string());
      auto [it, inserted] = response.headers.emplace(name, std::string(field.value()));
      if (!inserted) it->second += ", " + std::string(field.value());
    }
    response.body = std::move(message.body());
    if (!message.keep_alive() || !options_.keep_alive) Close();
    return response;
  }
}

Status Client::PostStream(const std::string& path, std::string body,
                          const std::function<bool(std::string_view line)>& on_line,
                          const Headers& headers) {
  const auto deadline = Clock::now() + options_.timeout;
  const std::string what = fmt::format("POST http://{}:{}{}", host_, port_, path);
  Headers all = headers;
  all.emplace("Content-Type", "application/json");
  all.emplace("Accept", "text/event-stream");
  auto request =
      BuildRequest("POST", path, std::move(body), all, host_, port_, options_);
  for (int attempt = 0;; ++attempt) {
    bool reused = false, retry = false;
    Status sent =
        impl_->Send(request, host_, port_, deadline, options_.timeout, what, &reused, &retry);
    if (!sent.ok()) {
      if (retry && attempt == 0) continue;
      return sent;
    }
    bhttp::response_parser<bhttp::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // boost::none is broken in 1.74
    impl_->stream->expires_at(deadline);
    beast::error_code ec = RunOp(impl_->ioc, [&](auto handler) {
      bhttp::async_read_header(*impl_->stream, impl_->buffer, parser, std::move(handler));
    });
    if (ec) {
      bool got_nothing = !parser.got_some();
      Close();
      if (ec == beast::error::timeout) {
        return absl::DeadlineExceededError(
            fmt::format("{}: no response headers within {} ms", what, options_.timeout.count()));
      }
      if (reused && got_nothing && attempt == 0 && IsStaleConnection(ec)) continue;
      return absl::UnavailableError(
          fmt::format("{}: reading the response headers failed: {}", what, ec.message()));
    }
    const int status = parser.get().result_int();
    const bool success = status >= 200 && status < 300;
    std::string error_body;
    std::string pending;  // bytes of the current, incomplete line
    auto chunk = std::make_unique<char[]>(kReadChunk);
    // Feeds body bytes to on_line; false once the callback asked to stop.
    auto feed = [&](const char* data, size_t size) {
      pending.append(data, size);
      size_t start = 0;
      for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
        std::string_view line(pending.data() + start, nl - start);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (!line.empty() && !on_line(line)) return false;
      }
      pending.erase(0, start);
      return true;
    };
    while (!parser.is_done()) {
      parser.get().body().data = chunk.get();
      parser.get().body().size = kReadChunk;
      impl_->stream->expires_after(options_.timeout);
      ec = RunOp(impl_->ioc, [&](auto handler) {
        bhttp::async_read_some(*impl_->stream, impl_->buffer, parser, std::move(handler));
      });
      if (ec == bhttp::error::need_buffer) ec = {};
      size_t got = kReadChunk - parser.get().body().size;
      if (success) {
        if (!feed(chunk.get(), got)) {
          Close();  // the caller stopped: the server sees a disconnect
          return absl::OkStatus();
        }
      } else if (error_body.size() < kMaxErrorBody) {
        error_body.append(chunk.get(), got);
      }
      if (ec) {
        Close();
        if (ec == beast::error::timeout) {
          return absl::DeadlineExceededError(
              fmt::format("{}: no stream data for {} ms", what, options_.timeout.count()));
        }
        return absl::UnavailableError(
            fmt::format("{}: the stream ended early: {}", what, ec.message()));
      }
    }
    if (!parser.get().keep_alive() || !options_.keep_alive) Close();
    if (!success) return StatusFromHttp(status, what, error_body);
    if (!pending.empty()) {
      std::string_view line = pending;
      if (line.back() == '\r') line.remove_suffix(1);
      if (!line.empty()) on_line(line);
    }
    return absl::OkStatus();
  }
}

}  // namespace slime::http
