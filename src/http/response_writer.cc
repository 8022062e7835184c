#include "slime/http/response_writer.h"

#include "fmt/format.h"
#include "slime/http/util.h"
#include "spdlog/spdlog.h"

namespace slime::http {
namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// Status codes whose responses never carry a body.
bool BodyForbidden(int status) { return status < 200 || status == 204 || status == 304; }

}  // namespace

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 101:
      return "Switching Protocols";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 206:
      return "Partial Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 304:
      return "Not Modified";
    case 307:
      return "Temporary Redirect";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

ResponseWriter::ResponseWriter(std::shared_ptr<ResponseSink> sink, Context context)
    : sink_(std::move(sink)), context_(std::move(context)) {}

ResponseWriter::~ResponseWriter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kNew) {
    spdlog::warn("http: handler for {} {} dropped its response writer without answering",
                 context_.method, context_.path);
    SendLocked(500,
               ErrorBody(fmt::format("handler for {} {} finished without answering",
                                     context_.method, context_.path))
                   .dump(),
               "application/json");
  } else if (state_ == State::kStreaming) {
    sink_->Enqueue(context_.request_seq, stream_closes_ ? "" : "0\r\n\r\n", true,
                   stream_closes_ || !context_.keep_alive);
  }
}

void ResponseWriter::SetHeader(std::string name, std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kNew) {
    spdlog::warn("http: SetHeader({}) after the response to {} {} started; ignored", name,
                 context_.method, context_.path);
    return;
  }
  headers_.emplace_back(std::move(name), std::move(value));
}

std::string ResponseWriter::Head(int status, std::string_view content_type, bool chunked,
                                 bool close, const size_t* content_length) {
  std::string head = fmt::format("HTTP/1.1 {} {}\r\nServer: {}\r\n", status, ReasonPhrase(status),
                                 context_.server_name);
  if (!content_type.empty() && !BodyForbidden(status)) {
    head += fmt::format("Content-Type: {}\r\n", content_type);
  }
  for (const auto& [name, value] : headers_) {
    if (IEquals(name, "content-length") || IEquals(name, "transfer-encoding") ||
        IEquals(name, "connection") || IEquals(name, "server") ||
        (IEquals(name, "content-type") && !content_type.empty())) {
      continue;
    }
    head += fmt::format("{}: {}\r\n", name, value);
  }
  if (content_length != nullptr) head += fmt::format("Content-Length: {}\r\n", *content_length);
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  if (close) {
    head += "Connection: close\r\n";
  } else if (context_.version == 10) {
    head += "Connection: keep-alive\r\n";
  }
  head += "\r\n";
  return head;
}

void ResponseWriter::SendLocked(int status, std::string body, std::string content_type) {
  if (status < 100 || status > 599) {
    spdlog::error("http: handler for {} {} answered with invalid status {}; sending 500",
                  context_.method, context_.path, status);
    body = ErrorBody(fmt::format("handler answered with invalid HTTP status {}", status)).dump();
    status = 500;
    content_type = "application/json";
  }
  state_ = State::kDone;
  answered_.store(true, std::memory_order_release);
  bool close = !context_.keep_alive;
  if (BodyForbidden(status)) body.clear();
  size_t length = body.size();
  std::string bytes = Head(status, content_type, /*chunked=*/false, close,
                           BodyForbidden(status) ? nullptr : &length);
  if (context_.method != "HEAD") bytes += body;
  sink_->Enqueue(context_.request_seq, std::move(bytes), /*last=*/true, close);
}

void ResponseWriter::Send(int status, std::string body, std::string content_type) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kNew) {
    spdlog::warn("http: Send({}) for {} {} after the response started; ignored", status,
                 context_.method, context_.path);
    return;
  }
  SendLocked(status, std::move(body), std::move(content_type));
}

void ResponseWriter::SendJson(int status, const nlohmann::json& body) {
  Send(status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
       "application/json");
}

void ResponseWriter::StartStream(int status, std::string content_type) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kNew) {
    spdlog::warn("http: StartStream for {} {} after the response started; ignored", context_.method,
                 context_.path);
    return;
  }
  if (status < 100 || status > 599 || BodyForbidden(status)) {
    spdlog::error("http: stream for {} {} started with status {}; sending 500", context_.method,
                  context_.path, status);
    SendLocked(500, ErrorBody(fmt::format("cannot stream with HTTP status {}", status)).dump(),
               "application/json");
    return;
  }
  headers_.emplace_back("Cache-Control", "no-cache");
  if (context_.method == "HEAD") {
    bool close = !context_.keep_alive;
    state_ = State::kDone;
    sink_->Enqueue(context_.request_seq, Head(status, content_type, true, close, nullptr), true,
                   close);
    return;
  }
  // HTTP/1.0 has no chunked encoding: the body runs until the connection closes.
  stream_closes_ = context_.version == 10;
  bool close = stream_closes_ || !context_.keep_alive;
  state_ = State::kStreaming;
  sink_->Enqueue(context_.request_seq, Head(status, content_type, !stream_closes_, close, nullptr),
                 false, close);
}

bool ResponseWriter::Write(std::string data) {
  if (closed()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kStreaming) {
    if (state_ == State::kDone && context_.method == "HEAD" && !answered()) return true;
    spdlog::warn("http: Write for {} {} outside a stream; ignored", context_.method, context_.path);
    return false;
  }
  if (data.empty()) return true;
  if (!stream_closes_) data = fmt::format("{:x}\r\n{}\r\n", data.size(), data);
  sink_->Enqueue(context_.request_seq, std::move(data), false, false);
  return !closed();
}

void ResponseWriter::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kNew) {
    spdlog::warn("http: Finish for {} {} without StartStream; sending an empty 200",
                 context_.method, context_.path);
    SendLocked(200, "", "text/plain");
    return;
  }
  answered_.store(true, std::memory_order_release);
  if (state_ == State::kDone) return;  // HEAD stream, or a second Finish
  state_ = State::kDone;
  bool close = stream_closes_ || !context_.keep_alive;
  sink_->Enqueue(context_.request_seq, stream_closes_ ? "" : "0\r\n\r\n", true, close);
}

bool ResponseWriter::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ != State::kNew;
}

void ResponseWriter::OnClose(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed()) {
      on_close_ = std::move(fn);
      return;
    }
  }
  if (!answered() && fn) fn();
}

void ResponseWriter::NotifyClosed() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.exchange(true, std::memory_order_acq_rel)) return;
    if (!answered()) fn = std::move(on_close_);
    on_close_ = nullptr;
  }
  if (fn) fn();
}

}  // namespace slime::http
