#include "slime/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace slime::model {
namespace {

using testing::TempDir;
using testing::WriteFile;

std::string Msg(const Status& s) { return std::string(s.message()); }

// 8-byte little-endian length + header + data.
std::string RawFile(const std::string& header, const std::string& data, uint64_t declared_len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((declared_len >> (8 * i)) & 0xff);
  return out + header + data;
}
std::string RawFile(const std::string& header, const std::string& data) {
  return RawFile(header, data, header.size());
}

TEST(SafetensorsTest, RoundTripKeepsDtypesShapesBytesAndMetadata) {
  TempDir dir;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<uint16_t> b = {0x3f80, 0x4000, 0xbf80};  // bf16 1, 2, -1
  std::vector<int64_t> c = {42, -7};
  std::vector<SafetensorsWriteEntry> entries = {
      {"a.weight", SafetensorsDType::kF32, {2, 3}, a.data(), a.size() * 4},
      {"b", SafetensorsDType::kBF16, {3}, b.data(), b.size() * 2},
      {"c", SafetensorsDType::kI64, {2}, c.data(), c.size() * 8},
      {"empty", SafetensorsDType::kF32, {0, 4}, nullptr, 0},
  };
  const std::string path = dir.Join("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, entries, {{"format", "pt"}}).ok());
  // Nothing but the final file is left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  ASSERT_EQ((*f)->tensors().size(), 4u);
  const SafetensorsTensorInfo* ia = (*f)->Find("a.weight");
  ASSERT_NE(ia, nullptr);
  EXPECT_EQ(ia->dtype, SafetensorsDType::kF32);
  EXPECT_EQ(ia->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp((*f)->Data(*ia), a.data(), 24), 0);
  const SafetensorsTensorInfo* ib = (*f)->Find("b");
  ASSERT_NE(ib, nullptr);
  EXPECT_EQ(ib->dtype, SafetensorsDType::kBF16);
  EXPECT_EQ(std::memcmp((*f)->Data(*ib), b.data(), 6), 0);
  const SafetensorsTensorInfo* ic = (*f)->Find("c");
  ASSERT_NE(ic, nullptr);
  EXPECT_EQ(std::memcmp((*f)->Data(*ic), c.data(), 16), 0);
  EXPECT_EQ((*f)->Find("empty")->numel(), 0);
  EXPECT_EQ((*f)->Find("missing"), nullptr);
  // Header is padded so the data section is 8-byte aligned.
  uint64_t header_len = 0;
  std::string raw = testing::ReadFile(path);
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
}

TEST(SafetensorsTest, DTypeNames) {
  EXPECT_STREQ(SafetensorsDTypeName(SafetensorsDType::kBF16), "BF16");
  EXPECT_EQ(SafetensorsDTypeSize(SafetensorsDType::kF64), 8u);
  auto d = ParseSafetensorsDType("F8_E4M3");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, SafetensorsDType::kF8E4M3);
  auto bad = ParseSafetensorsDType("F7");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(Msg(bad.status()).find("BF16"), std::string::npos);  // lists valid names
}

TEST(SafetensorsTest, WriterRejectsBadEntries) {
  TempDir dir;
  float x[2] = {1, 2};
  auto wrong_size = WriteSafetensors(dir.Join("w.safetensors"),
                                     {{"x", SafetensorsDType::kF32, {3}, x, sizeof(x)}});
  EXPECT_FALSE(wrong_size.ok());
  EXPECT_NE(Msg(wrong_size).find("'x'"), std::string::npos);
  auto dup = WriteSafetensors(dir.Join("w.safetensors"),
                              {{"x", SafetensorsDType::kF32, {2}, x, sizeof(x)},
                               {"x", SafetensorsDType::kF32, {2}, x, sizeof(x)}});
  EXPECT_FALSE(dup.ok());
  EXPECT_FALSE(std::filesystem::exists(dir.Join("w.safetensors")));
}

// The streamed writer asks for each tensor's bytes only when it reaches it, in order, and may
// be handed the same buffer every time; a failing fill leaves no file and names the tensor.
TEST(SafetensorsTest, StreamedWriterFillsOneTensorAtATime) {
  TempDir dir;
  std::vector<float> staged;  // one buffer, reused
  std::vector<std::string> filled;
  std::vector<SafetensorsStreamEntry> entries;
  for (int k = 0; k < 3; ++k) {
    const std::string name = "t" + std::to_string(k);
    entries.push_back({name, SafetensorsDType::kF32, {2, k + 1},
                       static_cast<size_t>(2 * (k + 1)) * sizeof(float),
                       [&, k, name]() -> StatusOr<const void*> {
                         filled.push_back(name);
                         staged.assign(2 * (k + 1), static_cast<float>(k) + 0.5f);
                         return static_cast<const void*>(staged.data());
                       }});
  }
  const std::string path = dir.Join("s.safetensors");
  ASSERT_TRUE(WriteSafetensorsStreamed(path, entries, {{"step", "7"}}).ok());
  EXPECT_EQ(filled, (std::vector<std::string>{"t0", "t1", "t2"}));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("step"), "7");
  for (int k = 0; k < 3; ++k) {
    const SafetensorsTensorInfo* info = (*f)->Find("t" + std::to_string(k));
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->shape, (std::vector<int64_t>{2, k + 1}));
    const float* v = reinterpret_cast<const float*>((*f)->Data(*info));
    for (int i = 0; i < 2 * (k + 1); ++i) EXPECT_EQ(v[i], static_cast<float>(k) + 0.5f);
  }

  entries[1].fill = []() -> StatusOr<const void*> { return absl::ResourceExhaustedError("no memory"); };
  const std::string failed = dir.Join("f.safetensors");
  Status s = WriteSafetensorsStreamed(failed, entries);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Msg(s), failed + ": tensor 't1': no memory");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1) << "the failed write left a file behind";
  entries[1].fill = nullptr;
  EXPECT_EQ(Msg(WriteSafetensorsStreamed(failed, entries)), failed + ": tensor 't1': no data");
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  auto f = SafetensorsFile::Open("/nonexistent/dir/model.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(f.status()).find("/nonexistent/dir/model.safetensors"), std::string::npos);
}

struct CorruptCase {
  const char* name;
  std::string bytes;
  const char* expect;  // substring of the message besides the path
};

std::vector<CorruptCase> CorruptCases() {
  const std::string data8(8, '\0');
  return {
      {"too_short", std::string("\x05\x00\x00", 3), "too short"},
      {"header_len_past_end", RawFile("{}", "", 1000), "header length 1000"},
      {"header_len_huge", RawFile("{}", "", ~uint64_t{0} >> 1), "exceeds"},
      {"header_not_json", RawFile("{\"a\": [1, 2", data8), "not valid JSON"},
      {"header_not_object", RawFile("[1,2,3]", data8), "not a JSON object"},
      {"unknown_dtype",
       RawFile(R"({"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}})", data8),
       "tensor 'w': unknown dtype \"F7\""},
      {"offsets_past_end",
       RawFile(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", data8),
       "tensor 'w': data_offsets [0, 16] out of range"},
      {"offsets_reversed",
       RawFile(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", data8),
       "tensor 'w'"},
      {"size_mismatch",
       RawFile(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", data8),
       "tensor 'w': 8 bytes for dtype F32"},
      {"negative_shape",
       RawFile(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data8),
       "tensor 'w': bad shape"},
      {"missing_offsets", RawFile(R"({"w": {"dtype": "F32", "shape": [2]}})", data8),
       "tensor 'w': 'data_offsets'"},
      {"overlap",
       RawFile(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
               data8),
       "overlaps"},
      {"metadata_not_strings", RawFile(R"({"__metadata__": {"k": 1}})", ""), "__metadata__"},
  };
}

TEST(SafetensorsTest, CorruptFilesGiveClearErrorsNamingFileAndTensor) {
  TempDir dir;
  for (const CorruptCase& tc : CorruptCases()) {
    const std::string path = dir.Join(std::string(tc.name) + ".safetensors");
    WriteFile(path, tc.bytes);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << tc.name;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << tc.name << ": " << f.status();
    EXPECT_NE(Msg(f.status()).find(path), std::string::npos) << tc.name << ": " << f.status();
    EXPECT_NE(Msg(f.status()).find(tc.expect), std::string::npos) << tc.name << ": " << f.status();
  }
}

TEST(SafetensorsTest, TruncatedValidFileIsDetected) {
  TempDir dir;
  std::vector<float> a(64, 1.0f);
  const std::string path = dir.Join("t.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, {{"layer.w", SafetensorsDType::kF32, {8, 8}, a.data(), 256}}).ok());
  std::string bytes = testing::ReadFile(path);
  WriteFile(path, bytes.substr(0, bytes.size() - 10));
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(Msg(f.status()).find("layer.w"), std::string::npos) << f.status();
  EXPECT_NE(Msg(f.status()).find("truncated"), std::string::npos) << f.status();
}

}  // namespace
}  // namespace slime::model
