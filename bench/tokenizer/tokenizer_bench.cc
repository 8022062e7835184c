// Tokenizer throughput on the real Qwen3 and Llama-3 tokenizers: load time, encode MB/s (one
// thread with a cold and a warm BPE word cache, and N threads), decode MB/s, and streaming
// decode tokens/s. Prints one table.
//
//   build/bench/tokenizer/tokenizer_bench [--data DIR] [--threads N] [--mb MB]
//
// Input: tests/data/tokenizer/corpus.jsonl (English, code, CJK, emoji, numbers, whitespace,
// special tokens) concatenated and repeated up to --mb megabytes, encoded in chunks of about
// 4 KB (the size of a prompt or a response).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "slime/tokenizer/incremental_decoder.h"
#include "slime/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using slime::tokenizer::IncrementalDecoder;
using slime::tokenizer::Tokenizer;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::vector<std::string> MakeChunks(const std::string& source_dir, double megabytes) {
  std::ifstream in(source_dir + "/tests/data/tokenizer/corpus.jsonl");
  std::string all, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    all += nlohmann::json::parse(line)["text"].get<std::string>();
    all += "\n";
  }
  std::vector<std::string> chunks;
  if (all.empty()) return chunks;
  const size_t target = static_cast<size_t>(megabytes * 1e6);
  size_t total = 0;
  // Chunks start at shifting offsets so that repeats are not byte-identical prompts.
  for (size_t offset = 0; total < target; offset = (offset + 977) % all.size()) {
    std::string chunk = all.substr(offset) + all.substr(0, offset);
    chunk.resize(std::min<size_t>(chunk.size(), 4096));
    total += chunk.size();
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

}  // namespace

int main(int argc, char** argv) {
  std::string source_dir = SLIME_BENCH_SOURCE_DIR;
  const char* env_data = std::getenv("SLIME_TEST_DATA");
  std::string data_dir = env_data != nullptr ? env_data : source_dir + "/.cache/testdata";
  int threads = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  double megabytes = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--data") data_dir = argv[i + 1];
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--mb") megabytes = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--data DIR] [--threads N] [--mb MB]\n", argv[0]);
      return 2;
    }
  }
  const std::vector<std::string> chunks = MakeChunks(source_dir, megabytes);
  if (chunks.empty()) {
    std::fprintf(stderr, "cannot read %s/tests/data/tokenizer/corpus.jsonl\n", source_dir.c_str());
    return 1;
  }
  size_t bytes = 0;
  for (const auto& c : chunks) bytes += c.size();
  const double mb = bytes / 1e6;

  std::printf("tokenizer_bench: %.1f MB in %zu chunks, %d threads\n", mb, chunks.size(), threads);
  std::printf("| model    | load s | tokens/MB | encode MB/s cold | encode MB/s warm | "
              "encode MB/s x%-2d | decode MB/s | stream Mtok/s |\n",
              threads);
  std::printf("|----------|--------|-----------|------------------|------------------|"
              "-----------------|-------------|---------------|\n");
  int failures = 0;
  for (const std::string name : {"qwen3", "llama3"}) {
    auto start = Clock::now();
    auto tok = Tokenizer::FromDirectory(data_dir + "/" + name);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s (run scripts/fetch_test_data.sh)\n", name.c_str(),
                   std::string(tok.status().message()).c_str());
      ++failures;
      continue;
    }
    const double load_s = Seconds(start);
    const Tokenizer& t = **tok;

    size_t tokens = 0;
    std::vector<std::vector<int32_t>> encoded(chunks.size());
    start = Clock::now();
    for (size_t i = 0; i < chunks.size(); ++i) encoded[i] = t.Encode(chunks[i]);
    const double cold = mb / Seconds(start);  // first pass fills the word cache
    for (const auto& e : encoded) tokens += e.size();

    start = Clock::now();
    for (const auto& c : chunks) (void)t.Encode(c);
    const double warm = mb / Seconds(start);

    start = Clock::now();
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w) {
      pool.emplace_back([&, w] {
        for (size_t i = w; i < chunks.size(); i += threads) (void)t.Encode(chunks[i]);
      });
    }
    for (auto& th : pool) th.join();
    const double parallel = mb / Seconds(start);

    start = Clock::now();
    size_t decoded_bytes = 0;
    for (const auto& e : encoded) decoded_bytes += t.Decode(e).size();
    const double decode = decoded_bytes / 1e6 / Seconds(start);

    start = Clock::now();
    for (const auto& e : encoded) {
      IncrementalDecoder dec(&t);
      for (int32_t id : e) (void)dec.Feed(id);
      (void)dec.Flush();
    }
    const double stream = tokens / 1e6 / Seconds(start);

    std::printf("| %-8s | %6.2f | %9.0f | %16.1f | %16.1f | %15.1f | %11.1f | %13.2f |\n",
                name.c_str(), load_s, tokens / mb, cold, warm, parallel, decode, stream);
  }
  return failures == 0 ? 0 : 1;
}
