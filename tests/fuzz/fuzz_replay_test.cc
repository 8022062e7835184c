// Replays every fuzz target (fuzz_targets.h) over its committed corpus, tests/fuzz/corpus/<target>/
// (seeds and the regression inputs of every crash found), then over a bounded deterministic
// mutation loop of those seeds (fixed seed: byte flips, truncation, insertion, splicing). The
// property: each input returns — no crash, no exception escaping, no hang. Runs with g++ in CI;
// the libFuzzer build of the same targets is bench/fuzz/run_fuzzers.sh (SLIME_FUZZ=ON, clang).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "slime/engine/protocol.h"
#include "spdlog/spdlog.h"
#include "test_paths.h"

namespace slime::fuzz {
namespace {

namespace fs = std::filesystem;
using Target = int (*)(const uint8_t*, size_t);

struct TargetCase {
  const char* name;  // corpus directory and test name
  Target fn;
  int mutations;     // bounded: the whole test stays well under 20 s on a 2-core machine
};

// gtest prints a parameter in test listings (and so in ctest's names): the name, not its bytes.
void PrintTo(const TargetCase& t, std::ostream* os) { *os << t.name; }

const TargetCase kTargets[] = {
    {"http_request", &FuzzHttpRequest, 20000},     {"generate_json", &FuzzGenerateJson, 20000},
    {"chat_json", &FuzzChatJson, 20000},           {"config", &FuzzConfig, 5000},
    {"safetensors", &FuzzSafetensors, 20000},      {"tokenizer_json", &FuzzTokenizerJson, 20000},
};

std::vector<std::pair<std::string, std::string>> ReadCorpus(const std::string& target) {
  std::vector<std::pair<std::string, std::string>> out;
  const fs::path dir = fs::path(slime::testing::SourceDir()) / "tests" / "fuzz" / "corpus" / target;
  if (!fs::is_directory(dir)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    out.emplace_back(entry.path().filename().string(),
                     std::string(std::istreambuf_iterator<char>(in), {}));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Runs one input; an exception escaping the target fails the test with the input's name.
void RunOne(const TargetCase& t, const std::string& input, const std::string& what) {
  try {
    t.fn(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  } catch (const std::exception& e) {
    ADD_FAILURE() << t.name << ": exception escaped on " << what << ": " << e.what();
  } catch (...) {
    ADD_FAILURE() << t.name << ": non-std exception escaped on " << what;
  }
}

std::string Mutate(const std::vector<std::pair<std::string, std::string>>& corpus,
                   std::mt19937_64& rng) {
  std::string s = corpus[rng() % corpus.size()].second;
  const int edits = 1 + static_cast<int>(rng() % 4);
  static const char* kTokens[] = {"{",  "}",    "[",      "]",     "\"",      ",",     ":",
                                  "-1", "1e999", "null", "true", "\xff\xfe", "\\u", "\r\n",
                                  "%",  "99999999999999999999", "[[[[[[[[", "\x00"};
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 6) {
      case 0:  // flip a byte
        if (!s.empty()) s[rng() % s.size()] ^= static_cast<char>(1 + rng() % 255);
        break;
      case 1:  // truncate
        if (!s.empty()) s.resize(rng() % s.size());
        break;
      case 2: {  // insert a random byte
        s.insert(s.begin() + static_cast<long>(rng() % (s.size() + 1)), static_cast<char>(rng()));
        break;
      }
      case 3: {  // insert a JSON/HTTP-ish token
        const char* tok = kTokens[rng() % std::size(kTokens)];
        s.insert(rng() % (s.size() + 1), std::string(tok, std::max<size_t>(1, std::strlen(tok))));
        break;
      }
      case 4: {  // erase a range
        if (s.empty()) break;
        size_t at = rng() % s.size();
        s.erase(at, 1 + rng() % std::min<size_t>(16, s.size() - at));
        break;
      }
      case 5: {  // splice the tail of another seed
        const std::string& other = corpus[rng() % corpus.size()].second;
        if (other.empty()) break;
        s = s.substr(0, rng() % (s.size() + 1)) + other.substr(rng() % other.size());
        break;
      }
    }
  }
  return s;
}

class FuzzReplayTest : public ::testing::TestWithParam<TargetCase> {
 protected:
  // The targets' inputs trip warnings (unknown request fields) by the thousand.
  static void SetUpTestSuite() { spdlog::set_level(spdlog::level::err); }
};

TEST_P(FuzzReplayTest, CorpusAndMutationsReturn) {
  const TargetCase& t = GetParam();
  const auto corpus = ReadCorpus(t.name);
  ASSERT_FALSE(corpus.empty()) << "no seeds in tests/fuzz/corpus/" << t.name;
  for (const auto& [name, input] : corpus) {
    RunOne(t, input, "corpus/" + std::string(t.name) + "/" + name);
  }

  std::mt19937_64 rng(0x5113e29u);  // fixed: the same inputs every run
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < t.mutations; ++i) {
    const std::string input = Mutate(corpus, rng);
    RunOne(t, input, "mutation " + std::to_string(i));
    if (HasFailure()) {
      // Print the input so it can be committed to the corpus as a regression.
      std::string hex;
      static const char kDigits[] = "0123456789abcdef";
      for (unsigned char c : input) {
        hex += kDigits[c >> 4];
        hex += kDigits[c & 15];
      }
      FAIL() << "mutation " << i << " input (hex): " << hex;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %zu corpus inputs, %d mutations in %.2f s\n", t.name, corpus.size(),
              t.mutations, seconds);
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplayTest, ::testing::ValuesIn(kTargets),
                         [](const ::testing::TestParamInfo<TargetCase>& info) {
                           return std::string(info.param.name);
                         });

// Regression (found by the http_request target, corpus/http_request/regress_number_overflow):
// nlohmann reports a number that overflows a double as out_of_range, not parse_error, so the
// engine server's body parsing let it escape its handler and answered 500 instead of 400.
TEST(FuzzRegressionTest, BodyNumberOverflowIsInvalidArgument) {
  for (const char* body : {"1e999", "{\"sampling_params\": {\"temperature\": -1e999}}",
                           "[1, 2e400]"}) {
    StatusOr<nlohmann::json> parsed = engine::ParseJsonBody(body);
    ASSERT_FALSE(parsed.ok()) << body;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_NE(parsed.status().message().find("not valid JSON"), std::string_view::npos);
  }
  EXPECT_TRUE(engine::ParseJsonBody("  \r\n").ok());
  EXPECT_TRUE(engine::ParseJsonBody("{\"a\": 99999999999999999999999}").ok());  // a double
}

}  // namespace
}  // namespace slime::fuzz
