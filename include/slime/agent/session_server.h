// AgentSessionServer: one HTTP server that gives every rollout session an OpenAI-compatible
// endpoint, so an unmodified agent program (any OpenAI client) can generate through the rollout's
// engine with base_url http://host:port/sessions/<id>/v1:
//
//   POST /sessions/<id>/v1/chat/completions   chat completion (stream: true → SSE chunks)
//   GET  /sessions/<id>/v1/models             the one model name the server answers to
//
// Every call is rendered with the tokenizer's chat template (tools when sent), tokenized with the
// earlier replies' generated ids spliced in (trajectory.h, BuildPrompt), generated token-in/
// token-out through the session's rollout::EngineSession, answered in OpenAI format and recorded
// as an AgentTurn in the session's trajectory. Errors are OpenAI-shaped: unknown session or path
// → 404, a bad body or field → 400 naming the field (`param`), a prompt over the rollout's
// context limit → 400 code context_length_exceeded, an engine error → 502, a rollout being cut
// short → 503, a call past the session's max_turns → 400 max_turns_exceeded.
//
// Threads. The HTTP I/O threads only parse and validate; the engine call, the rendering and the
// recording run on the session's owner thread, in AgentSession::Serve — the thread that opened
// the session (the rollout's Generate call), so the EngineSession is used by one thread only and
// a slow engine never blocks an I/O thread. Calls of one session are served in arrival order.
// Open/Close/Find may be called from any thread.
//
// Ownership: the server owns the HTTP server and the session table; a session is shared with its
// owner (shared_ptr) and must be Closed by it; its EngineSession must outlive the Close.
#ifndef SLIME_AGENT_SESSION_SERVER_H_
#define SLIME_AGENT_SESSION_SERVER_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "nlohmann/json.hpp"
#include "slime/agent/openai_chat.h"
#include "slime/agent/trajectory.h"
#include "slime/common/status.h"
#include "slime/rollout/custom_generate.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::http {
class Server;
class ResponseWriter;
}  // namespace slime::http

namespace slime::agent {

struct SessionServerOptions {
  std::string host = "127.0.0.1";  // address to bind ("0.0.0.0": all interfaces)
  int port = 0;                    // 0 = an ephemeral port
  // Host written into base URLs; "" = `host`, or 127.0.0.1 when host is 0.0.0.0 / ::.
  std::string advertise_host;
  int num_threads = 2;             // HTTP I/O threads
  std::string model_name = "slime";  // what /v1/models lists and responses echo by default
  // Extra chat-template variables, e.g. {"enable_thinking": false} (tokenizer/chat_template.h).
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // Let requests set temperature / top_p / seed / penalties (openai_chat.h); off by default.
  bool honor_sampling_params = false;
};

// The ChatCodec of a tokenizer and its chat template, with one request's tools bound.
class TokenizerChatCodec : public ChatCodec {
 public:
  TokenizerChatCodec(const tokenizer::Tokenizer* tokenizer, nlohmann::ordered_json tools,
                     nlohmann::ordered_json kwargs);
  StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                               bool add_generation_prompt) const override;
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string SpecialTokenText(int32_t id) const override;

 private:
  const tokenizer::Tokenizer* tokenizer_;
  tokenizer::ChatTemplateOptions options_;
};

class AgentSessionServer;

// One rollout sample's session: its engine, its pending calls and its trajectory.
class AgentSession {
 public:
  const std::string& id() const { return id_; }
  // http://host:port/sessions/<id>/v1
  const std::string& base_url() const { return base_url_; }

  // Owner thread: serves the calls that are waiting (and those arriving meanwhile), waiting up
  // to `wait` for the first one. Returns how many calls were served.
  int Serve(std::chrono::milliseconds wait);

  // The turns recorded so far (a copy; any thread).
  std::vector<AgentTurn> turns() const;
  // The first engine error a call got (OK when none): the rollout reports it.
  Status engine_error() const;
  // Calls that were answered with an error (bad request, context limit, ...).
  int rejected_calls() const;
  // True once a call was refused because the session had made max_turns calls.
  bool turn_limit_hit() const;

 private:
  friend class AgentSessionServer;
  struct Call {
    ChatRequest request;
    std::shared_ptr<http::ResponseWriter> writer;
  };
  AgentSession(std::string id, std::string base_url, rollout::EngineSession* engine,
               int max_turns, const AgentSessionServer* server);
  // From an I/O thread: queues a parsed call; false once the session is closed.
  bool Post(Call call);
  // Answers every queued call "session finished" and refuses later ones.
  void Close();
  void Handle(Call& call);  // owner thread

  const std::string id_;
  const std::string base_url_;
  rollout::EngineSession* const engine_;
  const int max_turns_;
  const AgentSessionServer* const server_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<AgentTurn> turns_ ABSL_GUARDED_BY(mu_);
  Status engine_error_ ABSL_GUARDED_BY(mu_);
  int rejected_ ABSL_GUARDED_BY(mu_) = 0;
  bool turn_limit_hit_ ABSL_GUARDED_BY(mu_) = false;
};

class AgentSessionServer {
 public:
  // Starts the HTTP server. `tokenizer` must have a chat template of a supported family.
  // Errors: no usable chat template (naming the tokenizer), the address cannot be bound.
  static StatusOr<std::unique_ptr<AgentSessionServer>> Start(
      SessionServerOptions options, std::shared_ptr<const tokenizer::Tokenizer> tokenizer);
  ~AgentSessionServer();  // stops the HTTP server; open sessions are closed
  AgentSessionServer(const AgentSessionServer&) = delete;
  AgentSessionServer& operator=(const AgentSessionServer&) = delete;

  // A new session named `id` (letters, digits, '-', '_', '.'; unique among open sessions) whose
  // calls go to `engine`. With max_turns > 0, calls after the first max_turns are refused (400,
  // code max_turns_exceeded; turn_limit_hit() turns true). Errors: a bad or duplicate id.
  StatusOr<std::shared_ptr<AgentSession>> Open(const std::string& id,
                                               rollout::EngineSession* engine, int max_turns = 0);
  // Unregisters the session: calls still queued, and later ones, get 404 "session finished".
  void Close(const std::string& id);

  int port() const;
  std::string address() const;  // "advertised host:port"
  const SessionServerOptions& options() const { return options_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  ToolCallSyntax tool_call_syntax() const { return syntax_; }

 private:
  AgentSessionServer(SessionServerOptions options,
                     std::shared_ptr<const tokenizer::Tokenizer> tokenizer);
  void Dispatch(const std::string& method, const std::string& path, const std::string& body,
                std::shared_ptr<http::ResponseWriter> writer);

  const SessionServerOptions options_;
  const std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  ToolCallSyntax syntax_ = ToolCallSyntax::kNone;
  std::string advertised_host_;
  std::unique_ptr<http::Server> http_;

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<AgentSession>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace slime::agent

#endif  // SLIME_AGENT_SESSION_SERVER_H_
