// TensorBoardWriter and its TFRecord framing, read back with the test reader of
// tests/support/tfevents_reader.h (written from the format, with its own CRC-32C): the CRC against
// RFC 3720's vectors, the file name, the first record, one Event per metrics record with the
// record's step axis, refused records, and what failures leave in the file (a write cut short by
// the file size limit, a writer killed mid-stream, every prefix of a file).
#include "slime/metrics/tensorboard_writer.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "remove_tree.h"
#include "slime/metrics/tfrecord.h"
#include "tfevents_reader.h"

namespace slime::metrics {
namespace {

namespace fs = std::filesystem;
using slime::testing::BitwiseCrc32c;
using slime::testing::EventFilesIn;
using slime::testing::ParseTfRecords;
using slime::testing::ReadBytes;
using slime::testing::ReadEventFile;
using Event = slime::v1::tensorboard::Event;

std::string Bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

// RFC 3720 appendix B.4 (the CRC is given there as the bytes stored little endian) and the
// customary check value of "123456789".
TEST(Crc32cTest, MatchesTheRfc3720VectorsAndTheBitwiseDefinition) {
  std::string increasing, decreasing;
  for (int i = 0; i < 32; ++i) {
    increasing.push_back(static_cast<char>(i));
    decreasing.push_back(static_cast<char>(31 - i));
  }
  const std::string read_pdu =
      Bytes({0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
             0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
             0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
             0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  const std::vector<std::pair<std::string, uint32_t>> vectors = {
      {std::string(32, '\0'), 0x8a9136aau},
      {std::string(32, '\xff'), 0x62a8ab43u},
      {increasing, 0x46dd794eu},
      {decreasing, 0x113fdb5cu},
      {read_pdu, 0xd9963a56u},
      {"123456789", 0xe3069283u},
      {"", 0x00000000u}};
  for (const auto& [data, crc] : vectors) {
    EXPECT_EQ(Crc32c(data), crc) << "library, " << data.size() << " bytes";
    EXPECT_EQ(BitwiseCrc32c(data), crc) << "test reader, " << data.size() << " bytes";
  }
  std::mt19937 rng(7);
  for (int n = 0; n < 300; n += 7) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    EXPECT_EQ(Crc32c(data), BitwiseCrc32c(data)) << n << " random bytes";
  }
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(0x00008000u), 0xa282ead9u);  // bit 15 rotates to bit 0
}

TEST(TfRecordTest, FramesLengthAndDataWithTheirMaskedCrcs) {
  std::string file;
  AppendTfRecord("hello", &file);
  AppendTfRecord("", &file);
  ASSERT_EQ(file.size(), (12 + 5 + 4) + (12 + 0 + 4));
  EXPECT_EQ(file.substr(0, 8), Bytes({5, 0, 0, 0, 0, 0, 0, 0}));
  slime::testing::TfRecords read = ParseTfRecords(file);
  EXPECT_EQ(read.error, "");
  EXPECT_EQ(read.records, (std::vector<std::string>{"hello", ""}));
  EXPECT_EQ(read.tail_bytes, 0u);
  // A flipped bit in the data or in the length is caught by its CRC.
  std::string bad = file;
  bad[14] ^= 1;
  EXPECT_NE(ParseTfRecords(bad).error.find("CRC of the data"), std::string::npos);
  bad = file;
  bad[0] ^= 2;
  EXPECT_NE(ParseTfRecords(bad).error.find("CRC of the length"), std::string::npos);
}

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("tensorboard_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    slime::testing::RemoveTree(dir_.string());
  }
  void TearDown() override { slime::testing::RemoveTree(dir_.string()); }

  std::unique_ptr<TensorBoardWriter> OpenOrDie(const fs::path& dir) {
    auto writer = TensorBoardWriter::Open(dir.string());
    EXPECT_TRUE(writer.ok()) << writer.status();
    return writer.ok() ? std::move(*writer) : nullptr;
  }

  fs::path dir_;
};

std::map<std::string, float> ValuesOf(const Event& event) {
  std::map<std::string, float> out;
  for (const auto& v : event.summary().value()) {
    EXPECT_EQ(v.value_case(), slime::v1::tensorboard::Summary::Value::kSimpleValue) << v.tag();
    out[v.tag()] = v.simple_value();
  }
  return out;
}

TEST_F(TensorBoardWriterTest, FileVersionFirstThenOneEventPerRecordReadableWhileOpen) {
  auto writer = OpenOrDie(dir_ / "a" / "b");  // directories created
  ASSERT_NE(writer, nullptr);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string name = fs::path(writer->path()).filename().string();
  // events.out.tfevents.<10-digit Unix time>.<hostname>.<pid>.<n>
  std::smatch m;
  ASSERT_TRUE(std::regex_match(
      name, m, std::regex(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+))")))
      << name;
  EXPECT_EQ(m[2].str(), host);
  EXPECT_EQ(m[3].str(), std::to_string(::getpid()));
  EXPECT_EQ(fs::path(writer->path()).parent_path(), dir_ / "a" / "b");

  // A rollout record (step axis: rollout_id), a train step record (axis: step), non-scalars.
  ASSERT_TRUE(writer
                  ->Write({{"time", 1700000000.25},
                           {"rollout_id", 3},
                           {"rollout/raw_reward", 0.25},
                           {"perf/step_time", 12}})
                  .ok());
  ASSERT_TRUE(writer
                  ->Write({{"time", 1700000001.5},
                           {"rollout_id", 3},
                           {"step", 7},
                           {"train/loss", -1.5},
                           {"train/skipped", true},
                           {"train/nan", std::numeric_limits<double>::quiet_NaN()},
                           {"train/huge", 1e300},
                           {"note", "text"},
                           {"list", {1, 2}},
                           {"none", nullptr}})
                  .ok());
  ASSERT_TRUE(writer->Write({{"rollout_id", 4}, {"note", "no scalars: nothing written"}}).ok());
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_TRUE(writer->Write({{"rollout_id", 5}, {"eval/x", 0.1}}).ok());  // no time: now

  // Read while the writer is still open: every record is already in the file.
  slime::testing::EventFile file = ReadEventFile(writer->path());
  ASSERT_EQ(file.error, "");
  EXPECT_EQ(file.tail_bytes, 0u);
  ASSERT_EQ(file.events.size(), 4u);
  EXPECT_EQ(file.events[0].file_version(), "brain.Event:2");
  EXPECT_GT(file.events[0].wall_time(), 1.6e9);

  EXPECT_EQ(file.events[1].step(), 3);
  EXPECT_EQ(file.events[1].wall_time(), 1700000000.25);
  EXPECT_EQ(
      ValuesOf(file.events[1]),
      (std::map<std::string, float>{{"perf/step_time", 12.0f}, {"rollout/raw_reward", 0.25f}}));

  EXPECT_EQ(file.events[2].step(), 7);
  EXPECT_EQ(file.events[2].wall_time(), 1700000001.5);
  std::map<std::string, float> train = ValuesOf(file.events[2]);
  ASSERT_EQ(train.size(), 4u);  // note, list, none: not scalars; rollout_id: the other axis
  EXPECT_EQ(train["train/loss"], -1.5f);
  EXPECT_EQ(train["train/skipped"], 1.0f);
  EXPECT_TRUE(std::isnan(train["train/nan"]));
  EXPECT_TRUE(std::isinf(train["train/huge"]));  // beyond float's range

  EXPECT_EQ(file.events[3].step(), 5);
  EXPECT_GE(file.events[3].wall_time(), before - 1);
  EXPECT_EQ(ValuesOf(file.events[3]), (std::map<std::string, float>{{"eval/x", 0.1f}}));
}

TEST_F(TensorBoardWriterTest, RecordsThatCannotBePlacedAreRefusedAndNothingIsWritten) {
  auto writer = OpenOrDie(dir_);
  ASSERT_NE(writer, nullptr);
  const auto size = fs::file_size(writer->path());
  Status s = writer->Write({{"time", 1.0}, {"train/loss", 1.0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("neither \"step\" nor \"rollout_id\""), std::string::npos) << s;
  s = writer->Write({{"step", 1.5}, {"train/loss", 1.0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"step\" must be an integer"), std::string::npos) << s;
  s = writer->Write(nlohmann::json::array({1, 2}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("must be a JSON object"), std::string::npos) << s;
  EXPECT_EQ(fs::file_size(writer->path()), size);
}

TEST_F(TensorBoardWriterTest, EveryWriterHasItsOwnFileAndTheDirectoryMustBeOne) {
  auto first = OpenOrDie(dir_);
  auto second = OpenOrDie(dir_);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(first->path(), second->path());
  ASSERT_TRUE(first->WriteScalars(1, 10.0, {{"a", 1.0}}).ok());
  ASSERT_TRUE(second->WriteScalars(1, 10.0, {{"a", 2.0}}).ok());
  const std::vector<fs::path> files = EventFilesIn(dir_);
  ASSERT_EQ(files.size(), 2u);
  for (const fs::path& f : files) {
    slime::testing::EventFile read = ReadEventFile(f);
    EXPECT_EQ(read.error, "") << f;
    EXPECT_EQ(read.events.size(), 2u) << f;
  }

  std::ofstream(dir_ / "plain_file") << "x";
  auto bad = TensorBoardWriter::Open((dir_ / "plain_file").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find((dir_ / "plain_file").string()), std::string::npos)
      << bad.status();
}

// A write cut short (here by RLIMIT_FSIZE: the kernel writes up to the limit, then refuses) is
// taken back, so the file still ends after a complete record and later records are readable.
TEST_F(TensorBoardWriterTest, AWriteCutShortIsTakenBackAndLaterRecordsStayReadable) {
  auto writer = OpenOrDie(dir_);
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->WriteScalars(0, 1.0, {{"a", 1.0}}).ok());
  const auto size = fs::file_size(writer->path());

  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = size + 20;  // room for part of the next record
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  Status cut = writer->WriteScalars(1, 2.0, {{std::string(100, 'x'), 2.0}});
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss) << cut;
  EXPECT_NE(cut.message().find(writer->path()), std::string::npos) << cut;
  EXPECT_EQ(fs::file_size(writer->path()), size);

  ASSERT_TRUE(writer->WriteScalars(2, 3.0, {{"a", 3.0}}).ok());
  slime::testing::EventFile file = ReadEventFile(writer->path());
  ASSERT_EQ(file.error, "");
  EXPECT_EQ(file.tail_bytes, 0u);
  ASSERT_EQ(file.events.size(), 3u);
  EXPECT_EQ(file.events[1].step(), 0);
  EXPECT_EQ(file.events[2].step(), 2);
}

// A writer process killed while it writes leaves complete, intact records and at most the start
// of one more, which a reader takes as not yet written.
TEST_F(TensorBoardWriterTest, AWriterKilledMidStreamLeavesItsEarlierRecordsIntact) {
  fs::create_directories(dir_);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto writer = TensorBoardWriter::Open(dir_.string());
    if (!writer.ok()) ::_exit(3);
    const std::string long_tag(2000, 't');  // records of ~2 KB: many write(2) calls per ms
    for (int64_t step = 0;; ++step) {
      if (!(*writer)->WriteScalars(step, 1.0, {{long_tag, static_cast<double>(step)}}).ok()) {
        ::_exit(4);
      }
    }
  }
  std::vector<fs::path> files;
  for (int i = 0; i < 500 && (files.empty() || fs::file_size(files[0]) < (1u << 20)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    files = EventFilesIn(dir_);
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself: " << WEXITSTATUS(status);
  files = EventFilesIn(dir_);
  ASSERT_EQ(files.size(), 1u);
  slime::testing::EventFile file = ReadEventFile(files[0]);
  ASSERT_EQ(file.error, "");
  ASSERT_GE(file.events.size(), 100u);
  EXPECT_LT(file.tail_bytes, 2100u);
  for (size_t i = 1; i < file.events.size(); ++i) {
    ASSERT_EQ(file.events[i].step(), static_cast<int64_t>(i - 1));
    ASSERT_EQ(file.events[i].summary().value(0).simple_value(), static_cast<float>(i - 1));
  }
}

// Whatever point a crash stops the file at, the records before it read back intact.
TEST_F(TensorBoardWriterTest, EveryPrefixOfAFileReadsAsItsCompleteRecords) {
  auto writer = OpenOrDie(dir_);
  ASSERT_NE(writer, nullptr);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(writer->WriteScalars(step, 1.0, {{"loss", step * 0.5}}).ok());
  }
  const std::string bytes = ReadBytes(writer->path());
  const slime::testing::TfRecords whole = ParseTfRecords(bytes);
  ASSERT_EQ(whole.error, "");
  ASSERT_EQ(whole.records.size(), 4u);
  std::vector<size_t> ends;  // where each record ends
  size_t at = 0;
  for (const std::string& r : whole.records) ends.push_back(at += 16 + r.size());
  ASSERT_EQ(ends.back(), bytes.size());
  for (size_t n = 0; n <= bytes.size(); ++n) {
    const slime::testing::TfRecords prefix = ParseTfRecords(std::string_view(bytes).substr(0, n));
    const size_t complete = std::upper_bound(ends.begin(), ends.end(), n) - ends.begin();
    ASSERT_EQ(prefix.error, "") << n << " bytes";
    ASSERT_EQ(prefix.records.size(), complete) << n << " bytes";
    ASSERT_EQ(prefix.tail_bytes, n - (complete == 0 ? 0 : ends[complete - 1])) << n << " bytes";
  }
}

}  // namespace
}  // namespace slime::metrics
