// CalculatorEnv: the example tool environment (docs/http-api.md, "Tool environments";
// docs/operations.md, "Custom workflows"): arithmetic questions the model may answer with the
// help of a `calculator` tool, served over HTTP by http::Server. The `slime_calculator_env`
// binary (examples/calculator_env) serves it on its own; tests start it in-process.
//
//   /reset   a question for the sample: metadata {"question", "answer"} when the sample has
//            them, else "What is <prompt>?" when the prompt is a string and the label a number
//            (the demo data's {"input": "4+6=", "label": "10"}), else "What is A op B?" drawn
//            from (seed, sample index); the `calculator`
//            tool schema (one string argument, `expression`: + - * / and parentheses).
//   /step    tool calls → the results as the observation ("calculator(2 + 3) = 5", one line
//            per call; an unknown tool or a bad expression is reported, not fatal), not done;
//            no tool call → the final answer is the number after the last "Answer:" (or in
//            the last \boxed{}): done, reward 1 when it equals the answer, else 0; a turn with
//            neither gets a reminder observation and the episode goes on.
//   /close   forgets the episode (episodes also end when done).
// Bad requests get 400 {"error": {"message"}}; an unknown episode 404.
//
// Thread-safety: the handlers run on the server's I/O threads; episodes are under a mutex.
#ifndef SLIME_WORKFLOW_CALCULATOR_ENV_H_
#define SLIME_WORKFLOW_CALCULATOR_ENV_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "slime/common/status.h"
#include "slime/http/server.h"

namespace slime::workflow {

struct CalculatorEnvOptions {
  uint64_t seed = 1;
  int max_operand = 99;  // operands drawn from [1, max_operand]
};

// Evaluates + - * / with parentheses and unary minus over doubles. Errors name the position.
StatusOr<double> EvaluateArithmetic(std::string_view expression);
// "5", "-3", "2.5" (integers without a fraction, others with up to 10 significant digits).
std::string FormatNumber(double value);
// The final answer of a turn: the number after the last "Answer:" or inside the last
// \boxed{...}; nullopt when there is none.
std::optional<double> ExtractFinalAnswer(std::string_view text);

class CalculatorEnv {
 public:
  static StatusOr<std::unique_ptr<CalculatorEnv>> Start(http::ServerOptions server,
                                                        CalculatorEnvOptions options);
  ~CalculatorEnv();
  int port() const;
  std::string url() const;  // "http://host:port"
  void Stop();
  int64_t open_episodes() const;

 private:
  struct State;
  CalculatorEnv() = default;
  std::shared_ptr<State> state_;
  std::unique_ptr<http::Server> server_;
  std::string host_;
};

}  // namespace slime::workflow

#endif  // SLIME_WORKFLOW_CALCULATOR_ENV_H_
