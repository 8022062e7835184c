// Fuzz target: raw HTTP request bytes → the server's request handling (see fuzz_targets.h).
// Beast parses the bytes as src/http/connection.cc configures it (header and body limits), the
// result becomes a slime::http::Request the way Connection::Dispatch builds it, and a Router
// with the engine's JSON routes dispatches it to handlers that parse the body like
// src/engine/server.cc and answer through a ResponseWriter on a sink that drops the bytes.
#include <boost/beast/core/buffers_prefix.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "slime/engine/openai.h"
#include "slime/engine/protocol.h"
#include "slime/http/response_writer.h"
#include "slime/http/router.h"
#include "slime/http/util.h"

namespace slime::fuzz {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

// Drops the response bytes, keeping the status line.
class NullSink : public http::ResponseSink {
 public:
  void Enqueue(uint64_t, std::string bytes, bool, bool) override {
    if (status_line_.empty()) status_line_ = bytes.substr(0, bytes.find('\r'));
  }
  std::string status_line_;
};

const http::Router& FuzzRouter() {
  static const http::Router router = [] {
    http::Router r;
    r.Add("GET", "/health", [](const http::Request&, std::shared_ptr<http::ResponseWriter> w) {
      w->Send(200, "");
    });
    r.Add("POST", "/generate",
          [](const http::Request& req, std::shared_ptr<http::ResponseWriter> w) {
            StatusOr<nlohmann::json> body = engine::ParseJsonBody(req.body);
            if (!body.ok()) return w->SendJson(400, http::ErrorBody(std::string(body.status().message())));
            static engine::UnknownFieldLog log;
            engine::ProtocolLimits limits{4096, 258};
            auto parsed = engine::ParseGenerateRequest(*body, &FuzzTokenizer(), limits, &log);
            if (!parsed.ok()) {
              return w->SendJson(engine::HttpStatusFor(parsed.status()),
                                 engine::ErrorJson(parsed.status()));
            }
            w->SendJson(200, nlohmann::json{{"inputs", parsed->inputs.size()}});
          });
    for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
      const bool chat = std::string_view(path) == "/v1/chat/completions";
      r.Add("POST", path,
            [chat](const http::Request& req, std::shared_ptr<http::ResponseWriter> w) {
              StatusOr<nlohmann::json> body = engine::ParseJsonBody(req.body);
              if (!body.ok()) return w->SendJson(400, http::ErrorBody(std::string(body.status().message())));
              static engine::UnknownFieldLog log;
              engine::OpenAiContext ctx;
              ctx.tok = &FuzzTokenizer();
              ctx.limits = {4096, 258};
              ctx.log = &log;
              auto parsed = chat ? engine::ParseChatCompletionRequest(*body, ctx)
                                 : engine::ParseCompletionRequest(*body, ctx);
              if (!parsed.ok()) {
                return w->SendJson(engine::HttpStatusFor(parsed.status()),
                                   engine::OpenAiErrorJson(parsed.status()));
              }
              w->SendJson(200, nlohmann::json{{"inputs", parsed->inputs.size()}});
            });
    }
    http::AccessKeys keys;
    keys.api_key = "fuzz-key";
    keys.open_paths = {"/health", "/generate", "/v1/chat/completions"};  // completions: keyed
    r.SetAccessKeys(keys);
    return r;
  }();
  return router;
}

}  // namespace

int FuzzHttpRequest(const uint8_t* data, size_t size) {
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(64 << 10);  // src/http/connection.cc kMaxHeaderBytes
  parser.body_limit(1 << 20);
  parser.eager(true);
  beast::error_code ec;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  // Feed the bytes in pieces, as a socket would deliver them.
  while (!rest.empty() && !parser.is_done()) {
    size_t n = parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    if (ec == bhttp::error::need_more) break;
    if (ec) return 0;  // the server answers 400/413/431 and closes
    if (n == 0) break;
    rest.remove_prefix(n);
  }
  if (!parser.is_done()) {
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return 0;
  }
  auto& message = parser.get();
  http::Request request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  std::string_view target = request.target;
  size_t question = target.find('?');
  request.path = http::UrlDecode(target.substr(0, question), /*plus_is_space=*/false);
  if (question != std::string_view::npos) {
    request.query = http::ParseQuery(target.substr(question + 1));
  }
  request.version = message.version() == 10 ? 10 : 11;
  for (const auto& field : message) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  request.body = std::move(message.body());
  request.remote_address = "127.0.0.1:1";
  (void)request.Header("content-type");

  http::ResponseWriter::Context context;
  context.request_seq = 1;
  context.method = request.method;
  context.path = request.path;
  context.version = request.version;
  context.keep_alive = message.keep_alive();
  auto sink = std::make_shared<NullSink>();
  {
    auto writer = std::make_shared<http::ResponseWriter>(sink, std::move(context));
    FuzzRouter().Dispatch(request, writer);
  }
  // Every handler here answers bad input with a 4xx: a 500 means an exception escaped a handler
  // (the router's last resort), a bug the fuzzer must report.
  if (sink->status_line_.find(" 500 ") != std::string::npos) {
    throw std::logic_error("handler answered 500 (an exception escaped it): " +
                           sink->status_line_);
  }
  return 0;
}

}  // namespace slime::fuzz

SLIME_FUZZ_ENTRY(FuzzHttpRequest)
