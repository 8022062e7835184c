// EnvClient: the client side of the tool-environment protocol (docs/http-api.md, "Tool
// environments"), a small JSON-over-HTTP protocol so environments can be written in any
// language:
//
//   POST {env_url}/reset {"sample": {"index", "group_index", "prompt", "label", "metadata"}}
//     → {"episode_id": string, "observation": text | [chat messages] | null,
//        "tools": [OpenAI tool schemas] (optional)}
//   POST {env_url}/step {"episode_id", "action": {"text", "tool_calls": [{"id", "name",
//        "arguments"}]}}
//     → {"observation": text | [chat messages] | null, "reward": number (optional, default 0),
//        "done": bool, "info": object (optional)}
//   POST {env_url}/close {"episode_id"}  (optional for the environment: 404 is fine)
//
// Every call has a deadline (the caller passes what is left of the episode); an environment
// that does not answer in time, answers non-2xx, or answers something that is not the shape
// above is an error whose message names the URL, the call and what was wrong.
//
// Threads: not thread-safe (one http::Client); use one EnvClient per episode.
#ifndef SLIME_WORKFLOW_ENV_CLIENT_H_
#define SLIME_WORKFLOW_ENV_CLIENT_H_

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/data/sample.h"

namespace slime::http {
class Client;
}

namespace slime::workflow {

// "http://host:port[/prefix]" split; errors name the URL and the expected form.
struct EnvUrl {
  std::string host;
  int port = 0;
  std::string prefix;  // "" or "/prefix" (no trailing '/')
  std::string ToString() const;
};
StatusOr<EnvUrl> ParseEnvUrl(std::string_view url);

struct EnvReset {
  std::string episode_id;
  nlohmann::ordered_json observation;  // string, array of messages, or null
  nlohmann::ordered_json tools;        // array or null
};

struct EnvStep {
  nlohmann::ordered_json observation;  // string, array of messages, or null
  double reward = 0;
  bool done = false;
  nlohmann::ordered_json info = nlohmann::ordered_json::object();
};

class EnvClient {
 public:
  explicit EnvClient(EnvUrl url);
  ~EnvClient();
  EnvClient(const EnvClient&) = delete;
  EnvClient& operator=(const EnvClient&) = delete;

  StatusOr<EnvReset> Reset(const data::Sample& sample, std::chrono::milliseconds timeout);
  // `action` = {"text", "tool_calls"}.
  StatusOr<EnvStep> Step(const std::string& episode_id, const nlohmann::ordered_json& action,
                         std::chrono::milliseconds timeout);
  // Best effort: a 404 (no /close route) is OK.
  Status Close(const std::string& episode_id, std::chrono::milliseconds timeout);

  const EnvUrl& url() const { return url_; }

 private:
  StatusOr<nlohmann::ordered_json> Call(const std::string& route, const std::string& body,
                                        std::chrono::milliseconds timeout, bool allow_404);
  EnvUrl url_;
};

}  // namespace slime::workflow

#endif  // SLIME_WORKFLOW_ENV_CLIENT_H_
