#include "slime/agent/session_server.h"

#include <algorithm>
#include <cctype>
#include <ctime>

#include "fmt/format.h"
#include "slime/http/response_writer.h"
#include "slime/http/router.h"
#include "slime/http/server.h"
#include "slime/rollout/coordinator.h"
#include "spdlog/spdlog.h"

namespace slime::agent {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr std::string_view kPrefix = "/sessions/";

bool ValidSessionId(const std::string& id) {
  if (id.empty() || id.size() > 200) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

ToolCallSyntax SyntaxOf(const tokenizer::Tokenizer& tok) {
  if (!tok.chat_template().ok()) return ToolCallSyntax::kNone;
  switch (tok.chat_template()->tool_call_format()) {
    case tokenizer::ToolCallFormat::kHermes: return ToolCallSyntax::kHermes;
    case tokenizer::ToolCallFormat::kLlamaJson: return ToolCallSyntax::kLlamaJson;
    case tokenizer::ToolCallFormat::kNone: return ToolCallSyntax::kNone;
  }
  return ToolCallSyntax::kNone;
}

void SendError(const std::shared_ptr<http::ResponseWriter>& w, int status, std::string_view message,
               std::string_view type, std::string_view param = {}, std::string_view code = {}) {
  w->SendJson(status, OpenAiError(message, type, param, code));
}

}  // namespace

// ---- TokenizerChatCodec ---------------------------------------------------------------------

TokenizerChatCodec::TokenizerChatCodec(const tokenizer::Tokenizer* tokenizer, ojson tools,
                                       ojson kwargs)
    : tokenizer_(tokenizer) {
  options_.tools = std::move(tools);
  options_.kwargs = kwargs.is_object() ? std::move(kwargs) : ojson::object();
}

StatusOr<std::string> TokenizerChatCodec::Render(const ojson& messages,
                                                 bool add_generation_prompt) const {
  tokenizer::ChatTemplateOptions options = options_;
  options.add_generation_prompt = add_generation_prompt;
  // A null content (the session's own tool-call replies) renders as "", as OpenAI servers
  // pass it to chat templates, many of which fail on None.
  ojson normalized = messages;
  for (auto& m : normalized) {
    if (auto it = m.find("content"); m.is_object() && it != m.end() && it->is_null()) *it = "";
  }
  return tokenizer_->ApplyChatTemplate(normalized, options);
}

std::vector<int32_t> TokenizerChatCodec::Encode(std::string_view text) const {
  return tokenizer_->Encode(text, /*add_special_tokens=*/false);
}

std::string TokenizerChatCodec::SpecialTokenText(int32_t id) const {
  if (!tokenizer_->IsSpecial(id)) return "";
  return std::string(tokenizer_->TokenBytes(id));
}

// ---- AgentSession ---------------------------------------------------------------------------

AgentSession::AgentSession(std::string id, std::string base_url, rollout::EngineSession* engine,
                           int max_turns, const AgentSessionServer* server)
    : id_(std::move(id)),
      base_url_(std::move(base_url)),
      engine_(engine),
      max_turns_(max_turns),
      server_(server) {}

bool AgentSession::Post(Call call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    queue_.push_back(std::move(call));
  }
  cv_.notify_all();
  return true;
}

void AgentSession::Close() {
  std::deque<Call> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  for (auto& call : left) {
    SendError(call.writer, 404, fmt::format("session {} has finished", id_),
              "invalid_request_error", "", "session_not_found");
  }
}

int AgentSession::Serve(std::chrono::milliseconds wait) {
  int served = 0;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !queue_.empty() || closed_;
  });
  while (!queue_.empty() && !closed_) {
    Call call = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Handle(call);
    ++served;
    lock.lock();
  }
  return served;
}

std::vector<AgentTurn> AgentSession::turns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return turns_;
}

Status AgentSession::engine_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_error_;
}

int AgentSession::rejected_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_;
}

bool AgentSession::turn_limit_hit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return turn_limit_hit_;
}

void AgentSession::Handle(Call& call) {
  const auto& w = call.writer;
  const ChatRequest& request = call.request;
  auto reject = [&](int status, std::string_view message, std::string_view type,
                    std::string_view param = {}, std::string_view code = {}) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++rejected_;
    }
    SendError(w, status, message, type, param, code);
  };
  if (w->closed()) return;  // the agent hung up while the call waited
  if (engine_->aborting()) {
    reject(503, fmt::format("session {}: the rollout is being cut short; no more calls", id_),
           "server_error", "", "rollout_aborting");
    return;
  }
  std::vector<AgentTurn> history = turns();
  if (max_turns_ > 0 && static_cast<int>(history.size()) >= max_turns_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      turn_limit_hit_ = true;
    }
    reject(400, fmt::format("session {} has made its {} model calls (rollout.max_turns)", id_,
                            max_turns_),
           "invalid_request_error", "", "max_turns_exceeded");
    return;
  }
  const tokenizer::Tokenizer& tok = server_->tokenizer();
  TokenizerChatCodec codec(&tok, request.tools, server_->options().chat_template_kwargs);
  auto built = BuildPrompt(codec, request.messages, history);
  if (!built.ok()) {
    reject(400, fmt::format("the chat template cannot render the messages: {}",
                            std::string(built.status().message())),
           "invalid_request_error", "messages");
    return;
  }
  json overrides = request.overrides;
  const rollout::SamplingOptions& sampling = engine_->sampling();
  const int64_t prompt_len = static_cast<int64_t>(built->ids.size());
  std::optional<int64_t> max_new;
  if (overrides.contains("max_new_tokens")) max_new = overrides["max_new_tokens"].get<int64_t>();
  if (sampling.max_response_len) {
    max_new = std::min<int64_t>(max_new.value_or(*sampling.max_response_len),
                                *sampling.max_response_len);
  }
  if (sampling.max_context_len) {
    const int64_t budget = *sampling.max_context_len - prompt_len;
    if (budget < 1) {
      reject(400,
             fmt::format("the prompt has {} tokens; the rollout's context limit is {} "
                         "(rollout.rollout_max_context_len)",
                         prompt_len, *sampling.max_context_len),
             "invalid_request_error", "messages", "context_length_exceeded");
      return;
    }
    max_new = std::min<int64_t>(max_new.value_or(budget), budget);
  }
  if (max_new) overrides["max_new_tokens"] = *max_new;

  auto generated = engine_->Generate(built->ids, overrides);
  if (!generated.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (engine_error_.ok()) engine_error_ = generated.status();
    }
    reject(502, fmt::format("engine {}: {}", engine_->engine_address(),
                            std::string(generated.status().message())),
           "server_error", "", "engine_error");
    return;
  }
  AgentTurn turn;
  turn.prompt_text = std::move(built->text);
  turn.prompt_ids = std::move(built->ids);
  turn.output_ids = std::move(generated->output_ids);
  turn.log_probs = std::move(generated->log_probs);
  turn.output_text = tok.Decode(turn.output_ids, /*skip_special_tokens=*/false);
  turn.finish_reason = generated->finish_reason;
  turn.weight_version = generated->weight_version;
  const size_t index = history.size();
  turn.reply = ReplyMessage(tok.Decode(turn.output_ids, /*skip_special_tokens=*/true),
                            server_->tool_call_syntax(), !request.tools.is_null(),
                            fmt::format("call_{}_{}", id_, index));
  CompletionInfo info;
  info.id = fmt::format("chatcmpl-{}-{}", id_, index);
  info.model = request.model.empty() ? server_->options().model_name : request.model;
  info.created = static_cast<int64_t>(std::time(nullptr));
  info.prompt_tokens = static_cast<int64_t>(turn.prompt_ids.size());
  info.completion_tokens = static_cast<int64_t>(turn.output_ids.size());
  const std::string finish = OpenAiFinishReason(turn.finish_reason, turn.reply);
  const bool aborted = turn.finish_reason == "abort";
  ojson reply = turn.reply;
  {
    std::lock_guard<std::mutex> lock(mu_);
    turns_.push_back(std::move(turn));  // an aborted turn keeps its partial output
  }
  if (aborted) {
    reject(503, fmt::format("session {}: generation aborted (the rollout is being cut short)", id_),
           "server_error", "", "rollout_aborting");
    return;
  }
  if (!request.stream) {
    w->SendJson(200, json::parse(CompletionBody(info, reply, finish).dump()));
    return;
  }
  w->StartStream(200, "text/event-stream");
  for (auto& event : CompletionEvents(info, reply, finish, request.include_usage)) {
    if (!w->Write(std::move(event))) break;
  }
  w->Finish();
}

// ---- AgentSessionServer ---------------------------------------------------------------------

AgentSessionServer::AgentSessionServer(SessionServerOptions options,
                                       std::shared_ptr<const tokenizer::Tokenizer> tokenizer)
    : options_(std::move(options)), tokenizer_(std::move(tokenizer)) {}

AgentSessionServer::~AgentSessionServer() {
  if (http_) http_->Stop();
  std::map<std::string, std::shared_ptr<AgentSession>> sessions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions.swap(sessions_);
  }
  for (auto& [id, session] : sessions) session->Close();
}

StatusOr<std::unique_ptr<AgentSessionServer>> AgentSessionServer::Start(
    SessionServerOptions options, std::shared_ptr<const tokenizer::Tokenizer> tokenizer) {
  if (tokenizer == nullptr) return absl::InvalidArgumentError("agent session server: no tokenizer");
  if (!tokenizer->chat_template().ok()) {
    return absl::FailedPreconditionError(fmt::format(
        "agent session server: tokenizer {} has no usable chat template ({}); agents need the "
        "model's chat template (tokenizer_config.json \"chat_template\" or chat_template.jinja)",
        tokenizer->source(), std::string(tokenizer->chat_template().status().message())));
  }
  std::unique_ptr<AgentSessionServer> server(
      new AgentSessionServer(std::move(options), std::move(tokenizer)));
  AgentSessionServer* self = server.get();
  self->syntax_ = SyntaxOf(*self->tokenizer_);
  const auto& o = self->options_;
  self->advertised_host_ = !o.advertise_host.empty() ? o.advertise_host
                           : (o.host == "0.0.0.0" || o.host == "::" || o.host.empty())
                               ? "127.0.0.1"
                               : o.host;
  if (self->advertised_host_.find(':') != std::string::npos &&
      self->advertised_host_.front() != '[') {
    self->advertised_host_ = "[" + self->advertised_host_ + "]";
  }
  http::Router router;
  router.AddPrefix("*", std::string(kPrefix),
                   [self](const http::Request& r, std::shared_ptr<http::ResponseWriter> w) {
                     self->Dispatch(r.method, r.path, r.body, std::move(w));
                   });
  http::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.num_threads = o.num_threads;
  SLIME_ASSIGN_OR_RETURN(self->http_, http::Server::Start(so, std::move(router)));
  return server;
}

int AgentSessionServer::port() const { return http_->port(); }

std::string AgentSessionServer::address() const {
  return fmt::format("{}:{}", advertised_host_, http_->port());
}

StatusOr<std::shared_ptr<AgentSession>> AgentSessionServer::Open(const std::string& id,
                                                                 rollout::EngineSession* engine,
                                                                 int max_turns) {
  if (!ValidSessionId(id)) {
    return absl::InvalidArgumentError(fmt::format(
        "agent session id \"{}\" must be 1-200 letters, digits, '-', '_' or '.'", id));
  }
  if (engine == nullptr) return absl::InvalidArgumentError("agent session: no engine session");
  std::string base_url = fmt::format("http://{}{}{}/v1", address(), kPrefix, id);
  std::shared_ptr<AgentSession> session(
      new AgentSession(id, base_url, engine, max_turns, this));
  std::lock_guard<std::mutex> lock(mu_);
  if (!sessions_.emplace(id, session).second) {
    return absl::AlreadyExistsError(fmt::format("agent session {} is already open", id));
  }
  return session;
}

void AgentSessionServer::Close(const std::string& id) {
  std::shared_ptr<AgentSession> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    session = std::move(it->second);
    sessions_.erase(it);
  }
  session->Close();
}

void AgentSessionServer::Dispatch(const std::string& method, const std::string& path,
                                  const std::string& body,
                                  std::shared_ptr<http::ResponseWriter> w) {
  // path = /sessions/<id>/v1/<endpoint>
  std::string rest = path.substr(kPrefix.size());
  size_t slash = rest.find('/');
  std::string id = rest.substr(0, slash);
  std::string endpoint = slash == std::string::npos ? "" : rest.substr(slash);
  const bool chat = endpoint == "/v1/chat/completions";
  const bool models = endpoint == "/v1/models";
  if (!chat && !models) {
    SendError(w, 404,
              fmt::format("no route for {} {}; a session serves POST /sessions/<id>/v1/chat/"
                          "completions and GET /sessions/<id>/v1/models",
                          method, path),
              "invalid_request_error", "", "not_found");
    return;
  }
  const char* allowed = chat ? "POST" : "GET";
  if (method != allowed && !(models && method == "HEAD")) {
    w->SetHeader("Allow", allowed);
    SendError(w, 405, fmt::format("method {} not allowed for {}; allowed: {}", method, path, allowed),
              "invalid_request_error");
    return;
  }
  std::shared_ptr<AgentSession> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end()) session = it->second;
  }
  if (session == nullptr) {
    SendError(w, 404, fmt::format("unknown session \"{}\" (finished, or never opened)", id),
              "invalid_request_error", "", "session_not_found");
    return;
  }
  if (models) {
    w->SendJson(200, json{{"object", "list"},
                          {"data", json::array({json{{"id", options_.model_name},
                                                     {"object", "model"},
                                                     {"created", 0},
                                                     {"owned_by", "slime"}}})}});
    return;
  }
  AgentSession::Call call;
  ChatRequestError error;
  if (!ParseChatRequest(body, options_.honor_sampling_params, &call.request, &error)) {
    SendError(w, 400, error.message, "invalid_request_error", error.param);
    return;
  }
  call.writer = w;
  if (!session->Post(std::move(call))) {
    SendError(w, 404, fmt::format("session {} has finished", id), "invalid_request_error", "",
              "session_not_found");
  }
}

}  // namespace slime::agent
