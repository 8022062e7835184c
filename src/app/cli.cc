#include "slime/app/cli.h"

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "fmt/format.h"
#include "slime/app/job_plan.h"
#include "slime/app/runtime_commands.h"
#include "slime/app/convert.h"
#include "slime/app/demo_data.h"
#include "slime/app/render_chat.h"
#include "slime/app/serve.h"
#include "slime/app/sft.h"
#include "slime/app/version.h"
#include "slime/comm/accelerator.h"
#include "slime/common/logging.h"
#include "slime/common/signal_watcher.h"
#include "slime/config/config.h"
#include "slime/job/driver.h"
#include "slime/model/init_random_model.h"
#include "spdlog/spdlog.h"

namespace slime::app {
namespace {

constexpr const char* kSubcommands[] = {"train", "serve", "agent", "worker", "status",
                                        "runtime-check", "convert", "init-model", "sft",
                                        "make-demo-data", "make-byte-tokenizer", "render-chat"};

bool IsSubcommand(const char* arg) {
  for (const char* name : kSubcommands) {
    if (std::strcmp(arg, name) == 0) return true;
  }
  return false;
}

// Prints a user-facing error (no stack trace) and returns the usage exit code.
int UsageError(const std::string& message) {
  std::cerr << "slime_train: error: " << message << "\n";
  return kExitUsage;
}

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  bool dry_run = false;
  bool async_train = false;
  bool fully_async_train = false;
  std::string log_level;
};

int RunTrain(const TrainOptions& options) {
  // Before any thread starts (CUDA's included), so only the watcher receives SIGINT/SIGTERM.
  SignalWatcher signals;
  if (!options.log_level.empty()) {
    if (Status s = CheckLogLevel(options.log_level); !s.ok()) {
      return UsageError(fmt::format("--log-level: {}", std::string(s.message())));
    }
  }
  std::vector<std::string> warnings;
  StatusOr<config::Config> loaded =
      config::LoadConfig(options.config_path, options.overrides, &warnings);
  if (!loaded.ok()) return UsageError(std::string(loaded.status().message()));
  config::Config config = *std::move(loaded);

  LogOptions log;
  log.level = options.log_level.empty() ? config.debug.log_level : options.log_level;
  log.role = "driver";
  if (!options.dry_run) log.log_dir = config.cluster.run_dir + "/logs";
  if (Status s = InitLogging(log); !s.ok()) return UsageError(std::string(s.message()));
  for (const std::string& w : warnings) spdlog::warn("config: {}", w);

  if (options.async_train && options.fully_async_train) {
    return UsageError("--async and --fully-async are two different loops; pick one");
  }
  const job::TrainLoop loop = options.fully_async_train ? job::TrainLoop::kFullyAsync
                              : options.async_train     ? job::TrainLoop::kOneStepOff
                                                        : job::TrainLoop::kSync;
  if (Status s = job::CheckLoopConfig(config, loop); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (options.dry_run) {  // the real start checks the same in the driver's setup
    Status s = job::CheckInputFiles(config);
    if (!s.ok()) return UsageError(std::string(s.message()));
  }
  comm::AcceleratorInfo accel = comm::QueryAccelerators();
  StatusOr<JobPlan> job = PlanJob(config, accel.cuda_available);
  if (!job.ok()) return UsageError(fmt::format("placement: {}", std::string(job.status().message())));

  if (options.dry_run) {
    std::cout << "# resolved configuration (" << options.config_path << ")\n"
              << config::ToYaml(config, /*redact_secrets=*/true) << "\n"
              << "# placement plan (" << job->device_note << ")\n"
              << runtime::FormatPlan(job->plan);
    return kExitOk;
  }
  spdlog::info("config {} resolved; placement: {} actors on {} node(s)", options.config_path,
               job->plan.actors.size(), runtime::NumNodesUsed(job->plan));
  job::DriverOptions driver;
  driver.config = std::move(config);
  driver.placement = job->request;
  driver.loop = loop;
  return job::RunDriver(std::move(driver), &signals);
}

}  // namespace

int RunCli(int argc, char** argv) {
  // `slime_train --config X` is short for `slime_train train --config X`.
  std::vector<char*> args(argv, argv + argc);
  static char kTrain[] = "train";
  if (argc > 1 && !IsSubcommand(argv[1]) && std::strcmp(argv[1], "--help") != 0 &&
      std::strcmp(argv[1], "-h") != 0 && std::strcmp(argv[1], "--version") != 0) {
    args.insert(args.begin() + 1, kTrain);
  }

  CLI::App cli{"slime_train: native RL post-training for LLMs (a C++ re-implementation of slime)"};
  cli.require_subcommand(0, 1);
  bool version = false;
  cli.add_flag("--version", version, "Print version, git hash, torch, CUDA and NCCL and exit");

  TrainOptions train;
  CLI::App* train_cmd =
      cli.add_subcommand("train", "Run the RL job (the default: `slime_train --config F`)");
  train_cmd->add_option("-c,--config", train.config_path, "Job YAML (see docs/config.md)")
      ->required();
  train_cmd->add_option("--set", train.overrides,
                        "Override a key: --set section.key=value (repeatable; value is YAML)");
  train_cmd->add_flag("--dry-run", train.dry_run,
                      "Check the config and that its input files exist, print the resolved "
                      "config and the placement plan, then exit");
  train_cmd->add_flag("--async", train.async_train,
                      "One-step off-policy (slime's train_async.py): generate rollout N+1 while "
                      "training on N; not with colocated offload (docs/operations.md)");
  train_cmd->add_flag("--fully-async", train.fully_async_train,
                      "Fully asynchronous: the engines generate continuously, weight updates land "
                      "without draining them, no sample older than rollout.max_staleness "
                      "versions (default 1); not with colocated offload (docs/operations.md)");
  train_cmd->add_option("--log-level", train.log_level,
                        "trace|debug|info|warn|error|critical|off (default: debug.log_level)");

  std::string init_config, init_tokenizer, init_out,
      init_dtype = "bf16";
  int64_t seed = 0;
  ServeOptions serve_options;
  CLI::App* serve = cli.add_subcommand("serve", "Run a standalone SGLang-compatible engine");
  AddServeOptions(serve, &serve_options);
  RuntimeCommands runtime_commands = AddRuntimeCommands(&cli);  // agent, worker, status
  train::HfExportOptions convert_options;
  CLI::App* convert = cli.add_subcommand("convert", "Convert a checkpoint to HF safetensors");
  AddConvertOptions(convert, &convert_options);
  train::SftOptions sft_options;
  CLI::App* sft = cli.add_subcommand("sft", "Supervised fine-tuning on a JSONL of conversations");
  AddSftOptions(sft, &sft_options);
  MakeDemoDataOptions demo_data_options;
  CLI::App* make_demo_data = cli.add_subcommand(
      "make-demo-data", "Write the quickstart's synthetic addition task (prompts + SFT data)");
  AddMakeDemoDataOptions(make_demo_data, &demo_data_options);
  MakeByteTokenizerOptions byte_tokenizer_options;
  CLI::App* make_byte_tokenizer = cli.add_subcommand(
      "make-byte-tokenizer", "Write the byte-level subset of a tokenizer (the tiny model's)");
  AddMakeByteTokenizerOptions(make_byte_tokenizer, &byte_tokenizer_options);
  RenderChatOptions render_chat_options;
  CLI::App* render_chat = cli.add_subcommand(
      "render-chat", "Render a conversation with a tokenizer's chat template (or its ids)");
  AddRenderChatOptions(render_chat, &render_chat_options);
  CLI::App* init_model =
      cli.add_subcommand("init-model", "Write a random-weight HF model directory");
  init_model->add_option("--config", init_config, "HF config.json")->required();
  init_model->add_option("--tokenizer", init_tokenizer, "Directory with tokenizer files")
      ->required();
  init_model->add_option("--out", init_out, "Output directory")->required();
  init_model->add_option("--seed", seed, "Random seed");
  init_model->add_option("--dtype", init_dtype, "bf16|fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));

  try {
    cli.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  }
  if (version) {
    std::cout << VersionReport();
    return kExitOk;
  }
  if (train_cmd->parsed()) return RunTrain(train);
  if (serve->parsed()) return RunServe(serve_options);
  if (int code = RunRuntimeCommand(runtime_commands); code >= 0) return code;
  if (convert->parsed()) return RunConvert(convert_options);
  if (sft->parsed()) return RunSftCommand(sft_options);
  if (make_demo_data->parsed()) return RunMakeDemoData(demo_data_options);
  if (make_byte_tokenizer->parsed()) return RunMakeByteTokenizer(byte_tokenizer_options);
  if (render_chat->parsed()) return RunRenderChat(render_chat_options);
  if (init_model->parsed()) {
    if (Status s = InitLogging({.role = "init-model"}); !s.ok()) return UsageError(std::string(s.message()));
    Status s = model::InitRandomModel(init_config, init_tokenizer, init_out,
                                      static_cast<uint64_t>(seed), init_dtype);
    if (!s.ok()) {
      std::cerr << "slime_train init-model: error: " << s.message() << "\n";
      switch (s.code()) {
        case absl::StatusCode::kInvalidArgument:
        case absl::StatusCode::kNotFound:
        case absl::StatusCode::kFailedPrecondition:
        case absl::StatusCode::kUnimplemented:
        case absl::StatusCode::kAlreadyExists:
          return kExitUsage;
        default:
          return kExitFailure;
      }
    }
    std::cout << "wrote random-weight model (seed " << seed << ", " << init_dtype << ") to "
              << init_out << "\n";
    return kExitOk;
  }
  std::cout << cli.help();
  return kExitUsage;
}

}  // namespace slime::app
