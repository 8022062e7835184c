// Loads a generate plugin (a shared library behind the C ABI of generate_plugin.h) and serves it
// as a rollout::CustomGenerator: the host side of that ABI.
//
// LoadGeneratePlugin dlopens the library (RTLD_NOW | RTLD_LOCAL), calls its one entry symbol,
// checks the table's ABI version before reading anything else of it (major must equal ours;
// any minor of that major is accepted, reading only the fields both sides know), then calls
// init with the config. Every failure names the file and what to do about it.
//
// Generate marshals the sample into a slime_generate_input, the EngineSession into a
// slime_generate_engine and the output callbacks into data::Sample segments
// (data::Sample::AppendResponse, so loss masks and log-probs follow the sample invariants), then
// checks what the plugin built: a status on every segment, a reward on all segments or none,
// data::Sample::Validate on each. A plugin error or a bad output fails with a message naming the
// plugin and the sample. `rewarded` is true iff every segment got a reward.
//
// Ownership: the generator owns the plugin state and the library handle; destroying it calls
// the plugin's destroy and then dlclose. It must outlive every Generate call.
// Threads: Generate may be called concurrently (the ABI requires the plugin to allow it); each
// call has its own engine and output handles.
#ifndef SLIME_PLUGIN_PLUGIN_GENERATOR_H_
#define SLIME_PLUGIN_PLUGIN_GENERATOR_H_

#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/rollout/custom_generate.h"

namespace slime::rollout {
struct SamplingOptions;
}

namespace slime::plugin {

struct PluginOptions {
  std::string path;         // the plugin's shared library (.so)
  std::string config_json;  // passed to the plugin's init; "" is sent as "null"
};

// Errors (absl codes): NotFound — the file does not exist; FailedPrecondition — it cannot be
// loaded, lacks the entry symbol, speaks another ABI major or has an incomplete table;
// InvalidArgument — config_json is not JSON, or the plugin's init refused it.
StatusOr<std::unique_ptr<rollout::CustomGenerator>> LoadGeneratePlugin(
    const PluginOptions& options);

// The rollout's sampling options as the plugin sees them (slime_generate_input's
// sampling_params_json): SGLang's names, unset optionals left out.
nlohmann::json SamplingParamsJson(const rollout::SamplingOptions& sampling);

}  // namespace slime::plugin

#endif  // SLIME_PLUGIN_PLUGIN_GENERATOR_H_
