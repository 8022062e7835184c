// EnvClient (env_client.h): the tool-environment protocol over HTTP.
#include "slime/workflow/env_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "slime/http/client.h"

namespace slime::workflow {

using ojson = nlohmann::ordered_json;

std::string EnvUrl::ToString() const { return fmt::format("http://{}:{}{}", host, port, prefix); }

StatusOr<EnvUrl> ParseEnvUrl(std::string_view url) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(fmt::format(
        "env_url '{}' {}: expected http://host:port or http://host:port/prefix", url, why));
  };
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) return bad("does not start with http://");
  std::string_view rest = url.substr(kScheme.size());
  EnvUrl out;
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    out.prefix = std::string(rest.substr(slash));
    while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  }
  const size_t colon = hostport.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad("has no host:port");
  out.host = std::string(hostport.substr(0, colon));
  const std::string port(hostport.substr(colon + 1));
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return bad("has no valid port");
  }
  out.port = std::stoi(port);
  return out;
}

EnvClient::EnvClient(EnvUrl url) : url_(std::move(url)) {}
EnvClient::~EnvClient() = default;

StatusOr<ojson> EnvClient::Call(const std::string& route, const std::string& body,
                                std::chrono::milliseconds timeout, bool allow_404) {
  const std::string where = fmt::format("environment {}{}", url_.ToString(), route);
  if (timeout.count() <= 0) {
    return absl::DeadlineExceededError(
        fmt::format("{}: no time left in the episode (rollout.episode_timeout_s)", where));
  }
  http::ClientOptions o;
  o.timeout = timeout;
  o.keep_alive = false;
  http::Client client(url_.host, url_.port, o);
  StatusOr<http::Response> r = client.Post(url_.prefix + route, body);
  if (!r.ok()) {
    return Status(r.status().code(),
                  fmt::format("{}: {}", where, std::string(r.status().message())));
  }
  if (allow_404 && r->status == 404) return ojson(nullptr);
  if (r->status < 200 || r->status >= 300) return http::StatusFromHttp(r->status, where, r->body);
  ojson j = ojson::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(fmt::format("{}: the answer is not a JSON object: {}", where,
                                           r->body.substr(0, 200)));
  }
  return j;
}

namespace {

// An observation: a string, a list of {role, content} messages, or null.
Status CheckObservation(const ojson& o, const std::string& where) {
  if (o.is_null() || o.is_string()) return absl::OkStatus();
  if (!o.is_array()) {
    return absl::DataLossError(fmt::format(
        "{}: observation must be a string, a list of chat messages or null, got {}", where,
        o.dump().substr(0, 200)));
  }
  for (size_t i = 0; i < o.size(); ++i) {
    const ojson& m = o[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::DataLossError(
          fmt::format("{}: observation[{}] is not a chat message with a string role", where, i));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<EnvReset> EnvClient::Reset(const data::Sample& sample, std::chrono::milliseconds timeout) {
  const ojson body = {{"sample",
                       {{"index", sample.index},
                        {"group_index", sample.group_index},
                        {"prompt", sample.prompt},
                        {"label", sample.label},
                        {"metadata", sample.metadata}}}};
  SLIME_ASSIGN_OR_RETURN(ojson j, Call("/reset", body.dump(), timeout, false));
  const std::string where = fmt::format("environment {}/reset", url_.ToString());
  EnvReset out;
  const auto id = j.find("episode_id");
  if (id == j.end() || !(id->is_string() || id->is_number_integer())) {
    return absl::DataLossError(fmt::format("{}: the answer has no episode_id (string): {}", where,
                                           j.dump().substr(0, 200)));
  }
  out.episode_id = id->is_string() ? id->get<std::string>() : id->dump();
  out.observation = j.value("observation", ojson(nullptr));
  SLIME_RETURN_IF_ERROR(CheckObservation(out.observation, where));
  out.tools = j.value("tools", ojson(nullptr));
  if (!out.tools.is_null() && !out.tools.is_array()) {
    return absl::DataLossError(
        fmt::format("{}: tools must be a list of tool schemas, got {}", where,
                    out.tools.dump().substr(0, 200)));
  }
  if (out.tools.is_array() && out.tools.empty()) out.tools = nullptr;
  return out;
}

StatusOr<EnvStep> EnvClient::Step(const std::string& episode_id, const ojson& action,
                                  std::chrono::milliseconds timeout) {
  const ojson body = {{"episode_id", episode_id}, {"action", action}};
  SLIME_ASSIGN_OR_RETURN(ojson j, Call("/step", body.dump(), timeout, false));
  const std::string where = fmt::format("environment {}/step", url_.ToString());
  EnvStep out;
  out.observation = j.value("observation", ojson(nullptr));
  SLIME_RETURN_IF_ERROR(CheckObservation(out.observation, where));
  const auto reward = j.find("reward");
  if (reward != j.end() && !reward->is_null()) {
    if (!reward->is_number()) {
      return absl::DataLossError(
          fmt::format("{}: reward must be a number, got {}", where, reward->dump()));
    }
    out.reward = reward->get<double>();
    if (!std::isfinite(out.reward)) {
      return absl::DataLossError(fmt::format("{}: reward {} is not finite", where, out.reward));
    }
  }
  const auto done = j.find("done");
  if (done == j.end() || !done->is_boolean()) {
    return absl::DataLossError(fmt::format("{}: the answer has no boolean 'done': {}", where,
                                           j.dump().substr(0, 200)));
  }
  out.done = done->get<bool>();
  if (auto info = j.find("info"); info != j.end() && info->is_object()) out.info = *info;
  return out;
}

Status EnvClient::Close(const std::string& episode_id, std::chrono::milliseconds timeout) {
  const ojson body = {{"episode_id", episode_id}};
  return Call("/close", body.dump(), timeout, true).status();
}

}  // namespace slime::workflow
