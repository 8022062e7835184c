// Process-wide logging setup on top of spdlog.
//
// Every line carries the role and rank of the process that wrote it ("[trainer:3]"), so the
// interleaved output of a job stays readable. With a log directory, each process also writes
// its own file `<log_dir>/<role>-<rank>.log` (the per-actor log files of a run directory).
//
// Call InitLogging once, early in main(), before other threads start. After that, use spdlog's
// free functions (spdlog::info, ...) from any thread.
#ifndef SLIME_COMMON_LOGGING_H_
#define SLIME_COMMON_LOGGING_H_

#include <string>
#include <string_view>

#include "slime/common/status.h"

namespace slime {

struct LogOptions {
  // One of: trace, debug, info, warn, error, critical, off.
  std::string level = "info";
  // Role of this process: driver, trainer, engine, rollout, agent, worker, serve, ...
  std::string role = "driver";
  // Rank within the role; negative means "no rank" and prints just the role.
  int rank = -1;
  // When not empty, also log to `<log_dir>/<role>[-<rank>].log` (created if missing).
  std::string log_dir;
};

// The level names accepted by LogOptions::level.
inline constexpr std::string_view kLogLevels[] = {"trace", "debug", "info", "warn",
                                                  "error", "critical", "off"};

// Validates a level name; the error lists the valid names.
Status CheckLogLevel(std::string_view level);

// Installs the default logger (stderr, plus the file when log_dir is set).
Status InitLogging(const LogOptions& options);

// Changes the level of the installed logger.
Status SetLogLevel(std::string_view level);

}  // namespace slime

#endif  // SLIME_COMMON_LOGGING_H_
