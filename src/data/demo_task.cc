// The demo addition task (see demo_task.h).
#include "slime/data/demo_task.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "slime/common/atomic_file.h"
#include "slime/data/sft_dataset.h"

namespace slime::data {
namespace {

using OJson = nlohmann::ordered_json;

int64_t Pow10(int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}

}  // namespace

Status DemoTaskOptions::Validate() const {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("demo task: " + what);
  };
  if (digits < 1 || digits > 3) return bad(fmt::format("digits is {}, expected 1, 2 or 3", digits));
  if (num_train < 1 || num_eval < 1 || num_sft < 1) {
    return bad(fmt::format("train ({}), eval ({}) and sft ({}) counts must be at least 1",
                           num_train, num_eval, num_sft));
  }
  if (num_sft > num_train) {
    return bad(fmt::format("sft count {} exceeds the train count {} (SFT problems are a subset "
                           "of the train problems)",
                           num_sft, num_train));
  }
  const int64_t space = Pow10(2 * digits);
  if (num_train + num_eval > space) {
    return bad(fmt::format("{} train + {} eval problems, but {}-digit addition has only {} "
                           "distinct problems",
                           num_train, num_eval, digits, space));
  }
  return absl::OkStatus();
}

StatusOr<DemoTaskFiles> MakeDemoTask(const DemoTaskOptions& options) {
  SLIME_RETURN_IF_ERROR(options.Validate());
  const int64_t base = Pow10(options.digits);
  const std::vector<int64_t> order =
      EpochSampler::EpochOrder(base * base, options.seed, /*epoch=*/0, /*shuffle=*/true);
  auto problem = [&](int64_t k) {
    const int64_t a = order[static_cast<size_t>(k)] / base;
    const int64_t b = order[static_cast<size_t>(k)] % base;
    return std::make_pair(fmt::format("{}+{}=", a, b), fmt::format("{}", a + b));
  };
  auto prompt_line = [](const std::pair<std::string, std::string>& p) {
    return OJson{{"input", p.first}, {"label", p.second}}.dump() + "\n";
  };
  DemoTaskFiles files;
  for (int64_t k = 0; k < options.num_eval; ++k) files.eval += prompt_line(problem(k));
  for (int64_t k = 0; k < options.num_train; ++k) {
    const auto p = problem(options.num_eval + k);
    files.train += prompt_line(p);
    if (k < options.num_sft) {
      files.sft += OJson{{"messages", OJson::array({OJson{{"role", "user"}, {"content", p.first}},
                                                    OJson{{"role", "assistant"},
                                                          {"content", p.second}}})}}
                       .dump() +
                   "\n";
    }
  }
  return files;
}

Status WriteDemoTask(const std::string& out_dir, const DemoTaskOptions& options) {
  SLIME_ASSIGN_OR_RETURN(DemoTaskFiles files, MakeDemoTask(options));
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("{}: cannot create directory: {}", out_dir, ec.message()));
  }
  SLIME_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/train.jsonl", files.train));
  SLIME_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/eval.jsonl", files.eval));
  SLIME_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/sft.jsonl", files.sft));
  return absl::OkStatus();
}

}  // namespace slime::data
