#include "connection.h"

#include "boost/asio/post.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/string.hpp"
#include "boost/beast/http/error.hpp"
#include "boost/beast/http/read.hpp"
#include "fmt/format.h"
#include "slime/http/util.h"
#include "spdlog/spdlog.h"

namespace slime::http::internal {
namespace http = beast::http;

namespace {

constexpr uint32_t kMaxHeaderBytes = 64 << 10;
// Pipelined bytes buffered while a response is pending; beyond this we stop reading.
constexpr size_t kMaxPipelinedBytes = 1 << 20;
constexpr size_t kWatchChunk = 16 << 10;
// Coalesce queued chunks into writes of at most this many bytes.
constexpr size_t kMaxWriteBytes = 1 << 20;
// After an error response: how long and how much we keep reading (and discarding) what the
// client still sends, so that closing does not reset the connection under our answer.
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kMaxDrainBytes = 4 << 20;
constexpr size_t kDrainChunk = 16 << 10;

std::string Describe(const tcp::socket& socket) {
  beast::error_code ec;
  tcp::endpoint endpoint = socket.remote_endpoint(ec);
  if (ec) return "unknown";
  if (endpoint.address().is_v6()) {
    return fmt::format("[{}]:{}", endpoint.address().to_string(), endpoint.port());
  }
  return fmt::format("{}:{}", endpoint.address().to_string(), endpoint.port());
}

bool IsHttpParseError(const beast::error_code& ec) {
  return ec.category() == beast::error_code(http::error::bad_target).category();
}

}  // namespace

bool ServerCore::Register(uint64_t id, const std::shared_ptr<Connection>& connection) {
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return false;
  connections.emplace(id, connection);
  num_connections.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void ServerCore::Unregister(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu);
  if (connections.erase(id) > 0) num_connections.fetch_sub(1, std::memory_order_relaxed);
}

Connection::Connection(std::shared_ptr<ServerCore> core, uint64_t id, tcp::socket socket)
    : core_(std::move(core)),
      id_(id),
      stream_(std::move(socket)),
      remote_address_(Describe(stream_.socket())) {}

Connection::~Connection() = default;

void Connection::Start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadRequest(); });
}

void Connection::Close() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->DoClose(); });
}

void Connection::Enqueue(uint64_t request_seq, std::string bytes, bool last, bool close_after) {
  std::lock_guard<std::mutex> lock(post_mu_);
  if (!accepting_posts_) return;
  net::post(stream_.get_executor(), [self = shared_from_this(), request_seq,
                                     bytes = std::move(bytes), last, close_after]() mutable {
    self->DoEnqueue(request_seq, std::move(bytes), last, close_after);
  });
}

// ---- reading requests ----

void Connection::ReadRequest() {
  if (closed_ || closing_) return;
  parser_.emplace();
  parser_->body_limit(core_->options.max_body_bytes);
  parser_->header_limit(kMaxHeaderBytes);
  stream_.expires_after(core_->options.idle_timeout);
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

void Connection::OnHeader(beast::error_code ec) {
  if (closed_) return;
  if (ec) return OnReadError(ec);
  if (parser_->is_done()) return Dispatch();
  const auto& message = parser_->get();
  if (message.version() >= 11 && beast::iequals(message[http::field::expect], "100-continue")) {
    continue_line_ = "HTTP/1.1 100 Continue\r\n\r\n";
    stream_.expires_after(core_->options.idle_timeout);
    net::async_write(stream_, net::buffer(continue_line_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (self->closed_) return;
                       if (ec) return self->DoClose();
                       self->ReadBody();
                     });
    return;
  }
  ReadBody();
}

void Connection::ReadBody() {
  stream_.expires_after(core_->options.idle_timeout);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
}

void Connection::OnBody(beast::error_code ec) {
  if (closed_) return;
  if (ec) return OnReadError(ec);
  Dispatch();
}

void Connection::OnReadError(beast::error_code ec) {
  if (ec == http::error::body_limit) {
    return SendErrorAndClose(413, fmt::format("request body exceeds the limit of {} bytes",
                                              core_->options.max_body_bytes));
  }
  if (ec == http::error::header_limit) {
    return SendErrorAndClose(
        431, fmt::format("request headers exceed the limit of {} bytes", kMaxHeaderBytes));
  }
  if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
      ec == net::error::operation_aborted || ec == beast::error::timeout) {
    return DoClose();  // the client left, went idle, or we are stopping
  }
  if (IsHttpParseError(ec)) {
    return SendErrorAndClose(400, fmt::format("malformed HTTP request: {}", ec.message()));
  }
  spdlog::debug("http: connection {} read error: {}", remote_address_, ec.message());
  DoClose();
}

void Connection::Dispatch() {
  auto& message = parser_->get();
  Request request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  std::string_view target = request.target;
  size_t question = target.find('?');
  request.path = UrlDecode(target.substr(0, question), /*plus_is_space=*/false);
  if (question != std::string_view::npos) request.query = ParseQuery(target.substr(question + 1));
  request.version = message.version() == 10 ? 10 : 11;
  for (const auto& field : message) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  request.body = std::move(message.body());
  request.remote_address = remote_address_;

  ResponseWriter::Context context;
  context.request_seq = ++request_seq_;
  context.method = request.method;
  context.path = request.path;
  context.version = request.version;
  context.keep_alive = message.keep_alive();
  context.server_name = core_->options.server_name;
  parser_.reset();

  auto writer = std::make_shared<ResponseWriter>(shared_from_this(), std::move(context));
  writer_ = writer;
  in_response_ = true;
  Watch();  // see a disconnect while the handler works
  core_->router.Dispatch(request, std::move(writer));
}

// ---- watching for a disconnect while a response is pending ----

void Connection::Watch() {
  if (closed_ || watching_ || buffer_.size() >= kMaxPipelinedBytes) return;
  watching_ = true;
  stream_.expires_never();
  stream_.async_read_some(buffer_.prepare(kWatchChunk),
                          [self = shared_from_this()](beast::error_code ec, size_t bytes) {
                            self->OnWatch(ec, bytes);
                          });
}

void Connection::OnWatch(beast::error_code ec, size_t bytes) {
  watching_ = false;
  buffer_.commit(bytes);
  if (closed_) return;
  if (resume_after_watch_) {  // the response finished; we cancelled this read to move on
    resume_after_watch_ = false;
    if (ec && ec != net::error::operation_aborted) return DoClose();
    if (close_after_response_) return GracefulClose();
    return ReadRequest();
  }
  if (ec == net::error::operation_aborted) return;
  if (ec) {
    spdlog::debug("http: client {} went away before the response finished ({})", remote_address_,
                  ec.message());
    return DoClose();  // notifies the waiting writer
  }
  if (in_response_) Watch();  // pipelined bytes: keep them, keep watching
}

// ---- writing responses ----

void Connection::DoEnqueue(uint64_t request_seq, std::string bytes, bool last, bool close_after) {
  if (closed_) return;
  if (request_seq != request_seq_ || !in_response_) {
    spdlog::warn("http: dropping {} bytes from a stale response writer on {}", bytes.size(),
                 remote_address_);
    return;
  }
  queue_.push_back(Chunk{std::move(bytes), last, close_after});
  if (!writing_) WriteQueued();
}

void Connection::WriteQueued() {
  write_buffer_.clear();
  write_has_last_ = false;
  while (!queue_.empty() && write_buffer_.size() < kMaxWriteBytes && !write_has_last_) {
    Chunk& chunk = queue_.front();
    if (write_buffer_.empty()) {
      write_buffer_ = std::move(chunk.bytes);
    } else {
      write_buffer_ += chunk.bytes;
    }
    if (chunk.last) {
      write_has_last_ = true;
      write_close_after_ = chunk.close_after;
    }
    queue_.pop_front();
  }
  if (write_buffer_.empty()) {
    if (write_has_last_) ResponseDone(write_close_after_);
    return;
  }
  writing_ = true;
  stream_.expires_after(core_->options.idle_timeout);
  net::async_write(
      stream_, net::buffer(write_buffer_),
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
}

void Connection::OnWrite(beast::error_code ec) {
  writing_ = false;
  if (closed_) return;
  if (ec) {
    spdlog::debug("http: write to {} failed: {}", remote_address_, ec.message());
    return DoClose();
  }
  if (write_has_last_) return ResponseDone(write_close_after_);
  if (!queue_.empty()) WriteQueued();
}

void Connection::ResponseDone(bool close_after) {
  in_response_ = false;
  writer_.reset();
  close_after_response_ = close_after;
  if (watching_) {
    // The watch read may hold the start of the next request; cancel it and continue from its
    // completion, which keeps whatever it read.
    resume_after_watch_ = true;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
    return;
  }
  if (close_after) return GracefulClose();
  ReadRequest();
}

void Connection::SendErrorAndClose(int status, const std::string& message) {
  ResponseWriter::Context context;
  context.request_seq = ++request_seq_;
  context.method = "";  // the request did not parse (or was refused): always send the body
  context.path = "";
  context.keep_alive = false;
  context.server_name = core_->options.server_name;
  in_response_ = true;
  parser_.reset();
  auto writer = std::make_shared<ResponseWriter>(shared_from_this(), std::move(context));
  writer->SendJson(status, ErrorBody(message));
}

void Connection::GracefulClose() {
  if (closed_ || closing_) return;
  closing_ = true;
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  linger_deadline_ = std::chrono::steady_clock::now() + kLingerTime;
  drain_buffer_ = std::make_unique<char[]>(kDrainChunk);
  Drain();
}

void Connection::Drain() {
  stream_.expires_at(linger_deadline_);
  stream_.async_read_some(net::buffer(drain_buffer_.get(), kDrainChunk),
                          [self = shared_from_this()](beast::error_code ec, size_t bytes) {
                            if (self->closed_) return;
                            self->drained_ += bytes;
                            if (ec || self->drained_ > kMaxDrainBytes) return self->DoClose();
                            self->Drain();
                          });
}

void Connection::DoClose() {
  if (closed_) return;
  closed_ = true;
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    accepting_posts_ = false;
  }
  stream_.close();
  queue_.clear();
  core_->Unregister(id_);
  std::shared_ptr<ResponseWriter> writer = writer_.lock();
  writer_.reset();
  if (in_response_ && writer) writer->NotifyClosed();
}

}  // namespace slime::http::internal
