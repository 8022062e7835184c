// CalculatorEnv (calculator_env.h): the example tool environment.
#include "slime/workflow/calculator_env.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <map>
#include <mutex>
#include <random>

#include "nlohmann/json.hpp"
#include "slime/http/response_writer.h"
#include "slime/http/router.h"

namespace slime::workflow {

using json = nlohmann::json;

namespace {

// Recursive descent: expr = term (('+'|'-') term)*, term = unary (('*'|'/') unary)*,
// unary = '-' unary | primary, primary = number | '(' expr ')'.
class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}
  StatusOr<double> Parse() {
    SLIME_ASSIGN_OR_RETURN(double v, Expr(0));
    Skip();
    if (pos_ != s_.size()) return Error("unexpected character");
    return v;
  }

 private:
  Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(fmt::format("{} at position {} of '{}'", std::string(what),
                                                  pos_, std::string(s_)));
  }
  void Skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  StatusOr<double> Expr(int depth) {
    if (depth > 64) return Error("too deeply nested");
    SLIME_ASSIGN_OR_RETURN(double v, Term(depth));
    while (true) {
      Skip();
      if (pos_ >= s_.size() || (s_[pos_] != '+' && s_[pos_] != '-')) return v;
      const char op = s_[pos_++];
      SLIME_ASSIGN_OR_RETURN(double r, Term(depth));
      v = op == '+' ? v + r : v - r;
    }
  }
  StatusOr<double> Term(int depth) {
    SLIME_ASSIGN_OR_RETURN(double v, Unary(depth));
    while (true) {
      Skip();
      if (pos_ >= s_.size() || (s_[pos_] != '*' && s_[pos_] != '/' && s_[pos_] != 'x')) return v;
      const char op = s_[pos_++];
      SLIME_ASSIGN_OR_RETURN(double r, Unary(depth));
      if (op == '/') {
        if (r == 0) return Error("division by zero");
        v /= r;
      } else {
        v *= r;
      }
    }
  }
  StatusOr<double> Unary(int depth) {
    Skip();
    if (pos_ < s_.size() && s_[pos_] == '-') {
      ++pos_;
      SLIME_ASSIGN_OR_RETURN(double v, Unary(depth + 1));
      return -v;
    }
    if (pos_ < s_.size() && s_[pos_] == '(') {
      ++pos_;
      SLIME_ASSIGN_OR_RETURN(double v, Expr(depth + 1));
      Skip();
      if (pos_ >= s_.size() || s_[pos_] != ')') return Error("missing ')'");
      ++pos_;
      return v;
    }
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '.' || s_[pos_] == ',')) {
      ++pos_;
    }
    std::string digits;
    for (size_t i = start; i < pos_; ++i) {
      if (s_[i] != ',') digits += s_[i];  // 1,234 = 1234
    }
    if (digits.empty() || digits == ".") return Error("expected a number");
    char* end = nullptr;
    const double v = std::strtod(digits.c_str(), &end);
    if (end != digits.c_str() + digits.size()) return Error("malformed number");
    return v;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<double> EvaluateArithmetic(std::string_view expression) {
  if (expression.size() > 1000) return absl::InvalidArgumentError("expression too long");
  return Parser(expression).Parse();
}

std::string FormatNumber(double value) {
  if (std::isfinite(value) && std::fabs(value) < 1e15 && value == std::round(value)) {
    return fmt::format("{}", static_cast<int64_t>(std::llround(value)));
  }
  return fmt::format("{:.10g}", value);
}

std::optional<double> ExtractFinalAnswer(std::string_view text) {
  std::string_view number;
  const size_t answer = text.rfind("Answer:");
  const size_t boxed = text.rfind("\\boxed{");
  if (answer == std::string_view::npos && boxed == std::string_view::npos) return std::nullopt;
  if (answer != std::string_view::npos &&
      (boxed == std::string_view::npos || answer > boxed)) {
    number = text.substr(answer + 7);
  } else {
    number = text.substr(boxed + 7);
    number = number.substr(0, number.find('}'));
  }
  size_t b = 0;
  while (b < number.size() && std::isspace(static_cast<unsigned char>(number[b]))) ++b;
  size_t e = b;
  if (e < number.size() && number[e] == '-') ++e;
  while (e < number.size() && (std::isdigit(static_cast<unsigned char>(number[e])) ||
                               number[e] == '.' || number[e] == ',')) {
    ++e;
  }
  std::string digits;
  for (size_t i = b; i < e; ++i) {
    if (number[i] != ',') digits += number[i];
  }
  while (!digits.empty() && digits.back() == '.') digits.pop_back();  // "Answer: 5."
  if (digits.empty() || digits == "-") return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size()) return std::nullopt;
  return v;
}

struct CalculatorEnv::State {
  CalculatorEnvOptions options;
  mutable std::mutex mu;
  struct Episode {
    std::string question;
    double answer = 0;
    int steps = 0;
  };
  std::map<std::string, Episode> episodes;  // guarded by mu
  int64_t next_id = 0;                      // guarded by mu
};

namespace {

void SendError(const std::shared_ptr<http::ResponseWriter>& w, int status, const std::string& m) {
  w->SendJson(status, json{{"error", {{"message", m}}}});
}

json CalculatorTool() {
  return json::array({json{
      {"type", "function"},
      {"function",
       {{"name", "calculator"},
        {"description", "Evaluates an arithmetic expression with + - * / and parentheses."},
        {"parameters",
         {{"type", "object"},
          {"properties",
           {{"expression", {{"type", "string"}, {"description", "for example 37 * 12"}}}}},
          {"required", json::array({"expression"})}}}}}}});
}

}  // namespace

StatusOr<std::unique_ptr<CalculatorEnv>> CalculatorEnv::Start(http::ServerOptions server,
                                                              CalculatorEnvOptions options) {
  if (options.max_operand < 1) {
    return absl::InvalidArgumentError(
        fmt::format("max_operand = {} must be >= 1", options.max_operand));
  }
  auto state = std::make_shared<State>();
  state->options = options;
  http::Router router;
  router.Add("POST", "/reset", [state](const http::Request& req,
                                      std::shared_ptr<http::ResponseWriter> w) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("sample") ||
        !body["sample"].is_object()) {
      return SendError(w, 400, "/reset expects {\"sample\": {...}}");
    }
    const json& sample = body["sample"];
    State::Episode ep;
    const json meta = sample.value("metadata", json::object());
    if (meta.is_object() && meta.contains("question") && meta["question"].is_string() &&
        meta.contains("answer") && meta["answer"].is_number()) {
      ep.question = meta["question"].get<std::string>();
      ep.answer = meta["answer"].get<double>();
    } else if (std::optional<double> label =
                   sample.value("prompt", json()).is_string()
                       ? ExtractFinalAnswer("Answer: " + sample.value("label", std::string()))
                       : std::nullopt) {
      // A dataset row {"input": "4+6=", "label": "10"}: that question, that answer.
      std::string q = sample["prompt"].get<std::string>();
      while (!q.empty() && (q.back() == '=' || q.back() == ' ' || q.back() == '?')) q.pop_back();
      ep.question = fmt::format("What is {}?", q);
      ep.answer = *label;
    } else {
      const int64_t index = sample.value("index", int64_t{0});
      std::mt19937_64 rng(state->options.seed * 1000003u + static_cast<uint64_t>(index));
      std::uniform_int_distribution<int> operand(1, state->options.max_operand);
      const int a = operand(rng);
      const int b = operand(rng);
      const char op = "+-*"[rng() % 3];
      ep.answer = op == '+' ? a + b : op == '-' ? a - b : a * b;
      ep.question = fmt::format("What is {} {} {}?", a, op, b);
    }
    const std::string text = fmt::format(
        "{} You may call the calculator tool. Reply with the final answer as \"Answer: "
        "<number>\".",
        ep.question);
    std::string id;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      id = fmt::format("calc-{}", state->next_id++);
      state->episodes[id] = ep;
    }
    w->SendJson(200, json{{"episode_id", id}, {"observation", text}, {"tools", CalculatorTool()}});
  });
  router.Add("POST", "/step", [state](const http::Request& req,
                                     std::shared_ptr<http::ResponseWriter> w) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("episode_id") ||
        !body["episode_id"].is_string() || !body.contains("action") ||
        !body["action"].is_object()) {
      return SendError(w, 400, "/step expects {\"episode_id\": string, \"action\": {...}}");
    }
    const std::string id = body["episode_id"].get<std::string>();
    const json& action = body["action"];
    const std::string text = action.value("text", std::string());
    const json calls = action.value("tool_calls", json::array());
    State::Episode ep;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      auto it = state->episodes.find(id);
      if (it == state->episodes.end()) return SendError(w, 404, "unknown episode " + id);
      ++it->second.steps;
      ep = it->second;
    }
    json out = {{"reward", 0.0}, {"done", false}, {"info", {{"steps", ep.steps}}}};
    if (calls.is_array() && !calls.empty()) {
      std::string observation;
      for (const json& call : calls) {
        const std::string name = call.is_object() ? call.value("name", std::string()) : "";
        const json args = call.is_object() ? call.value("arguments", json::object()) : json();
        if (!observation.empty()) observation += "\n";
        if (name != "calculator") {
          observation += fmt::format("error: unknown tool '{}' (the only tool is calculator)", name);
          continue;
        }
        const std::string expr = args.is_object() && args.contains("expression") &&
                                         args["expression"].is_string()
                                     ? args["expression"].get<std::string>()
                                     : "";
        StatusOr<double> v = EvaluateArithmetic(expr);
        observation += v.ok() ? fmt::format("calculator({}) = {}", expr, FormatNumber(*v))
                              : fmt::format("calculator error: {}", std::string(v.status().message()));
      }
      out["observation"] = observation;
    } else if (std::optional<double> answer = ExtractFinalAnswer(text)) {
      const bool correct = std::fabs(*answer - ep.answer) < 1e-6;
      out["reward"] = correct ? 1.0 : 0.0;
      out["done"] = true;
      out["observation"] = nullptr;
      out["info"]["correct"] = correct;
      out["info"]["answer"] = ep.answer;
      std::lock_guard<std::mutex> lock(state->mu);
      state->episodes.erase(id);
    } else {
      out["observation"] =
          "No tool call and no final answer. Call the calculator tool, or reply \"Answer: "
          "<number>\".";
    }
    w->SendJson(200, out);
  });
  router.Add("POST", "/close", [state](const http::Request& req,
                                      std::shared_ptr<http::ResponseWriter> w) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("episode_id") ||
        !body["episode_id"].is_string()) {
      return SendError(w, 400, "/close expects {\"episode_id\": string}");
    }
    std::lock_guard<std::mutex> lock(state->mu);
    state->episodes.erase(body["episode_id"].get<std::string>());
    w->SendJson(200, json::object());
  });
  auto env = std::unique_ptr<CalculatorEnv>(new CalculatorEnv());
  env->host_ = server.host == "0.0.0.0" ? "127.0.0.1" : server.host;
  SLIME_ASSIGN_OR_RETURN(env->server_, http::Server::Start(server, std::move(router)));
  env->state_ = std::move(state);
  return env;
}

CalculatorEnv::~CalculatorEnv() { Stop(); }

int CalculatorEnv::port() const { return server_->port(); }

std::string CalculatorEnv::url() const { return fmt::format("http://{}:{}", host_, port()); }

void CalculatorEnv::Stop() {
  if (server_ != nullptr) server_->Stop();
}

int64_t CalculatorEnv::open_episodes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return static_cast<int64_t>(state_->episodes.size());
}

}  // namespace slime::workflow
