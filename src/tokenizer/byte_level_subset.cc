// The byte-level subset of a BPE tokenizer (see include/slime/tokenizer/byte_level_subset.h).
#include "slime/tokenizer/byte_level_subset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "slime/common/atomic_file.h"
#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer {
namespace {

// tokenizer.json is read into std::map objects: an ordered_json object finds keys by linear scan,
// quadratic over a 150k-entry vocabulary. tokenizer_config.json keeps its key order.
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

template <typename J>
StatusOr<J> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fmt::format("{}: cannot open", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return J::parse(buffer.str());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

// A ByteLevel step anywhere in the pre-tokenizer (alone or inside a Sequence).
bool HasByteLevel(const Json& node) {
  if (!node.is_object()) return false;
  if (node.value("type", "") == "ByteLevel") return true;
  for (const char* key : {"pretokenizers", "pre_tokenizers"}) {
    if (node.contains(key) && node[key].is_array()) {
      for (const Json& step : node[key]) {
        if (HasByteLevel(step)) return true;
      }
    }
  }
  return false;
}

// Rewrites the "ids" of every TemplateProcessing special token below `node`.
Status RemapPostProcessor(Json& node, const std::map<int64_t, int64_t>& added, const std::string& file) {
  if (node.is_array()) {
    for (Json& item : node) SLIME_RETURN_IF_ERROR(RemapPostProcessor(item, added, file));
    return absl::OkStatus();
  }
  if (!node.is_object()) return absl::OkStatus();
  if (node.contains("special_tokens") && node["special_tokens"].is_object()) {
    for (auto& [name, token] : node["special_tokens"].items()) {
      if (!token.contains("ids") || !token["ids"].is_array()) continue;
      for (Json& id : token["ids"]) {
        auto it = id.is_number_integer() ? added.find(id.get<int64_t>()) : added.end();
        if (it == added.end()) {
          return absl::InvalidArgumentError(fmt::format(
              "{}: post_processor special token '{}' has id {}, which is not an added token",
              file, name, id.dump()));
        }
        id = it->second;
      }
    }
  }
  for (auto& [key, child] : node.items()) {
    if (key != "special_tokens") SLIME_RETURN_IF_ERROR(RemapPostProcessor(child, added, file));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<ByteLevelSubsetInfo> WriteByteLevelSubset(const std::string& from_dir,
                                                   const std::string& out_dir) {
  const std::string tok_path = from_dir + "/tokenizer.json";
  const std::string cfg_path = from_dir + "/tokenizer_config.json";
  SLIME_ASSIGN_OR_RETURN(Json tok, ReadJson<Json>(tok_path));
  SLIME_ASSIGN_OR_RETURN(OrderedJson cfg, ReadJson<OrderedJson>(cfg_path));
  if (!tok.contains("model") || !tok["model"].is_object() || tok["model"].value("type", "") != "BPE") {
    return absl::InvalidArgumentError(fmt::format("{}: model.type must be BPE", tok_path));
  }
  if (!HasByteLevel(tok.value("pre_tokenizer", Json()))) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: the pre_tokenizer has no ByteLevel step, so its vocabulary has no byte alphabet",
        tok_path));
  }
  const Json& vocab = tok["model"]["vocab"];
  if (!vocab.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: model.vocab must be an object", tok_path));
  }

  // The 256 byte tokens, in the order of their old ids.
  std::vector<std::pair<int64_t, std::string>> bytes;
  for (int b = 0; b < 256; ++b) {
    const std::string spelling = BytesToByteLevel(std::string(1, static_cast<char>(b)));
    auto it = vocab.find(spelling);
    if (it == vocab.end() || !it->is_number_integer()) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: the byte 0x{:02x} (token '{}') is not in model.vocab", tok_path, b, spelling));
    }
    bytes.emplace_back(it->get<int64_t>(), spelling);
  }
  std::sort(bytes.begin(), bytes.end());
  Json new_vocab = Json::object();
  for (size_t i = 0; i < bytes.size(); ++i) new_vocab[bytes[i].second] = static_cast<int64_t>(i);
  tok["model"]["vocab"] = std::move(new_vocab);
  tok["model"]["merges"] = Json::array();

  // Added tokens follow, in the order of their old ids.
  ByteLevelSubsetInfo info;
  std::map<int64_t, int64_t> added;  // old id -> new id
  if (tok.contains("added_tokens")) {
    Json& list = tok["added_tokens"];
    if (!list.is_array()) {
      return absl::InvalidArgumentError(fmt::format("{}: added_tokens must be an array", tok_path));
    }
    std::vector<int64_t> old_ids;
    for (const Json& a : list) {
      if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content")) {
        return absl::InvalidArgumentError(
            fmt::format("{}: an added token lacks an integer id or content: {}", tok_path, a.dump()));
      }
      old_ids.push_back(a["id"].get<int64_t>());
    }
    std::vector<int64_t> sorted = old_ids;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) added[sorted[i]] = 256 + static_cast<int64_t>(i);
    for (Json& a : list) {
      const int64_t id = added.at(a["id"].get<int64_t>());
      a["id"] = id;
      info.special[a["content"].get<std::string>()] = id;
    }
    std::sort(list.begin(), list.end(),
              [](const Json& x, const Json& y) { return x["id"].get<int64_t>() < y["id"].get<int64_t>(); });
  }
  info.vocab_size = 256 + static_cast<int64_t>(added.size());
  if (tok.contains("post_processor")) {
    SLIME_RETURN_IF_ERROR(RemapPostProcessor(tok["post_processor"], added, tok_path));
  }

  if (cfg.contains("added_tokens_decoder")) {
    OrderedJson remapped = OrderedJson::object();
    std::vector<std::pair<int64_t, OrderedJson>> entries;
    for (auto& [key, value] : cfg["added_tokens_decoder"].items()) {
      int64_t old_id = -1;
      try {
        old_id = std::stoll(key);
      } catch (const std::exception&) {
      }
      auto it = added.find(old_id);
      if (it == added.end()) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: added_tokens_decoder id '{}' is not an added token of {}", cfg_path, key, tok_path));
      }
      entries.emplace_back(it->second, value);
    }
    std::sort(entries.begin(), entries.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    for (auto& [id, value] : entries) remapped[std::to_string(id)] = std::move(value);
    cfg["added_tokens_decoder"] = std::move(remapped);
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return absl::InternalError(fmt::format("{}: cannot create the directory: {}", out_dir, ec.message()));
  }
  SLIME_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/tokenizer.json", tok.dump(1) + "\n"));
  SLIME_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/tokenizer_config.json", cfg.dump(2) + "\n"));
  return info;
}

}  // namespace slime::tokenizer
