#include "slime/common/logging.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "fmt/format.h"
#include "slime/common/strings.h"
#include "spdlog/sinks/basic_file_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace slime {
namespace {

StatusOr<spdlog::level::level_enum> ParseLevel(std::string_view level) {
  for (std::string_view name : kLogLevels) {
    if (name == level) return spdlog::level::from_str(std::string(name));
  }
  std::vector<std::string> names(std::begin(kLogLevels), std::end(kLogLevels));
  return absl::InvalidArgumentError(
      fmt::format("unknown log level '{}'; valid levels: {}", level, JoinQuoted(names)));
}

}  // namespace

Status CheckLogLevel(std::string_view level) { return ParseLevel(level).status(); }

Status InitLogging(const LogOptions& options) {
  SLIME_ASSIGN_OR_RETURN(spdlog::level::level_enum level, ParseLevel(options.level));
  std::string tag =
      options.rank >= 0 ? fmt::format("{}:{}", options.role, options.rank) : options.role;
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!options.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.log_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(fmt::format(
          "cannot create log directory '{}': {}", options.log_dir, ec.message()));
    }
    std::string file =
        options.rank >= 0
            ? fmt::format("{}/{}-{}.log", options.log_dir, options.role, options.rank)
            : fmt::format("{}/{}.log", options.log_dir, options.role);
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file));
    } catch (const spdlog::spdlog_ex& e) {
      return absl::FailedPreconditionError(
          fmt::format("cannot open log file '{}': {}", file, e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>(tag, sinks.begin(), sinks.end());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

Status SetLogLevel(std::string_view level) {
  SLIME_ASSIGN_OR_RETURN(spdlog::level::level_enum parsed, ParseLevel(level));
  spdlog::default_logger()->set_level(parsed);
  return absl::OkStatus();
}

}  // namespace slime
