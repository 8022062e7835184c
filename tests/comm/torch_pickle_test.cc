// The restricted pickle reader and SGLang's flattened-bucket decoder (comm/torch_pickle.h):
// plain values as CPython pickles them at protocols 2-5, the buckets torch 1.13 pickles
// (fixtures in tests/data/comm/, written by tests/comm/make_bucket_fixtures.py: a CPU bucket in
// shared memory, CUDA buckets with a GPU UUID or an index, an empty one, SGLang's older
// one-dtype form), malformed input at every truncation and under random byte mutations (an
// error, never a crash), and errors that name what is wrong.
#include "slime/comm/torch_pickle.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/escaping.h"
#include "test_paths.h"

namespace slime::comm {
namespace {

using Kind = PickleValue::Kind;

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string Fixture(const std::string& name) {
  std::ifstream f(slime::testing::SourceDir() + "/tests/data/comm/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  EXPECT_FALSE(s.empty()) << name << " missing";
  return s;
}

const PickleValue& Get(const PickleValue& dict, const std::string& key) {
  for (const auto& [k, v] : dict.entries) {
    if (k->kind == Kind::kString && k->text == key) return *v;
  }
  ADD_FAILURE() << "no key " << key;
  static PickleValue none;
  return none;
}

// {'a': [1, -2, 3.5, True, False, None, b'xy', 'zé', (1, 2), 2**40, -2**63, shared, shared],
//  's': {3}, 'f': frozenset()} with shared = [7, 8], by CPython 3.11 at protocols 4 and 5.
const char* kProtocol4 =
    "8004955e000000000000007d94288c0161945d94284b014afeffffff47400c00000000000088894e4302787994"
    "8c037ac3a9944b014b0286948a060000000000018a0800000000000000805d94284b074b08656806658c017394"
    "8f94284b03908c016694289194752e";
const char* kProtocol2 =
    "80027d71002858010000006171015d7102284b014afeffffff47400c00000000000088894e635f636f64656373"
    "0a656e636f64650a710358020000007879710458060000006c6174696e31710586710652710758030000007ac3"
    "a971084b014b028671098a060000000000018a0800000000000000805d710a284b074b0865680a655801000000"
    "73710b635f5f6275696c74696e5f5f0a7365740a710c5d710d4b036185710e52710f5801000000667110635f5f"
    "6275696c74696e5f5f0a66726f7a656e7365740a71115d7112857113527114752e";

TEST(PickleTest, ReadsPlainValuesAsCPythonWritesThem) {
  for (std::string hex : {std::string(kProtocol4), "8005" + std::string(kProtocol4).substr(4)}) {
    auto root = ParsePickle(Unhex(hex));
    ASSERT_TRUE(root.ok()) << root.status();
    ASSERT_EQ((*root)->kind, Kind::kDict);
    const PickleValue& a = Get(**root, "a");
    ASSERT_EQ(a.kind, Kind::kList);
    ASSERT_EQ(a.items.size(), 13u);
    EXPECT_EQ(a.items[0]->integer, 1);
    EXPECT_EQ(a.items[1]->integer, -2);
    EXPECT_EQ(a.items[2]->real, 3.5);
    EXPECT_TRUE(a.items[3]->boolean);
    EXPECT_EQ(a.items[4]->kind, Kind::kBool);
    EXPECT_FALSE(a.items[4]->boolean);
    EXPECT_EQ(a.items[5]->kind, Kind::kNone);
    EXPECT_EQ(a.items[6]->kind, Kind::kBytes);
    EXPECT_EQ(a.items[6]->text, "xy");
    EXPECT_EQ(a.items[7]->text, "z\xc3\xa9");
    EXPECT_EQ(a.items[8]->kind, Kind::kTuple);
    EXPECT_EQ(a.items[9]->integer, int64_t{1} << 40);
    EXPECT_EQ(a.items[10]->integer, INT64_MIN);
    EXPECT_EQ(a.items[11].get(), a.items[12].get()) << "the memo shares one object";
    EXPECT_EQ(Get(**root, "s").kind, Kind::kSet);
    EXPECT_EQ(Get(**root, "s").items.at(0)->integer, 3);
    EXPECT_EQ(PickleSummary(*a.items[8]), "(1, 2)");
  }
  // Protocol 2 spells bytes and sets as calls of globals; they stay calls (nothing runs).
  auto root = ParsePickle(Unhex(kProtocol2));
  ASSERT_TRUE(root.ok()) << root.status();
  const PickleValue& a = Get(**root, "a");
  EXPECT_EQ(PickleSummary(*a.items[6]), "_codecs.encode('xy', 'latin1')");
  EXPECT_EQ(PickleSummary(Get(**root, "s")), "__builtin__.set([3])");
}

TEST(PickleTest, MalformedInputIsAnErrorNamingTheOpcodeNeverACrash) {
  const std::string good = Unhex(kProtocol4);
  for (size_t n = 0; n < good.size(); ++n) {
    auto r = ParsePickle(good.substr(0, n));
    EXPECT_FALSE(r.ok()) << "a pickle cut at byte " << n << " parsed";
  }
  auto bad_memo = ParsePickle(Unhex("800468082e"));  // BINGET 8, never stored
  ASSERT_FALSE(bad_memo.ok());
  EXPECT_NE(bad_memo.status().message().find("memo key 8"), std::string::npos) << bad_memo.status();
  auto persid = ParsePickle(Unhex("8004") + "P1\n.");
  ASSERT_FALSE(persid.ok());
  EXPECT_NE(persid.status().message().find("opcode 0x50 at byte 2"), std::string::npos)
      << persid.status();
  auto too_long = ParsePickle(Unhex("80048a09000000000000000001") + ".");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("does not fit 64 bits"), std::string::npos);
  EXPECT_FALSE(ParsePickle(Unhex("5661620a70300a2e")).ok()) << "protocol 0 text strings";
  EXPECT_FALSE(ParsePickle(Unhex("80044b014b012e")).ok()) << "STOP with two values";
  EXPECT_FALSE(ParsePickle(Unhex("8004612e")).ok()) << "APPEND on an empty stack";
}

TEST(PickleTest, RandomMutationsOfARealBucketNeverCrash) {
  std::string raw;
  ASSERT_TRUE(absl::Base64Unescape(Fixture("cuda_uuid.b64"), &raw));
  std::mt19937 rng(5);
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string m = raw;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) m[rng() % m.size()] = static_cast<char>(rng() & 0xff);
    auto b = DecodeSglangBucket(m);
    parsed += b.ok();
    if (b.ok()) {  // whatever decodes keeps the invariants the engine relies on
      for (const SglangTensorMeta& t : b->tensors) {
        EXPECT_LE(0, t.start);
        EXPECT_LE(t.start, t.end);
        EXPECT_LE(t.end, b->numel);
      }
    }
  }
  EXPECT_LT(parsed, 20000);
}

TEST(SglangBucketTest, DecodesACpuBucketInSharedMemory) {
  auto b = DecodeSglangBucket(Fixture("cpu_shm.b64"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->where, SglangBucket::Where::kSharedMemory);
  EXPECT_EQ(b->dtype, "uint8");
  EXPECT_EQ(b->shm.shm_name.rfind("/torch_", 0), 0u) << b->shm.shm_name;
  EXPECT_EQ(b->numel, 4 * 6 * 2 + 6 * 4 + 6 * 2);
  EXPECT_EQ(b->shm.bytes, b->numel);
  EXPECT_EQ(b->storage_offset, 0);
  ASSERT_EQ(b->tensors.size(), 3u);
  EXPECT_EQ(b->tensors[0].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(b->tensors[0].shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(b->tensors[0].dtype, "bfloat16");
  EXPECT_EQ(b->tensors[0].start, 0);
  EXPECT_EQ(b->tensors[0].end, 48);
  EXPECT_EQ(b->tensors[1].dtype, "float32");
  EXPECT_EQ(b->tensors[1].start, 48);
  EXPECT_EQ(b->tensors[1].end, 72);
  EXPECT_EQ(b->tensors[2].end, 84);
}

TEST(SglangBucketTest, DecodesCudaBucketsWithAUuidOrAnIndex) {
  auto b = DecodeSglangBucket(Fixture("cuda_uuid.b64"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->where, SglangBucket::Where::kCuda);
  EXPECT_EQ(b->cuda.device_uuid, "7f1c1f2e-3d4c-5b6a-7988-a1b2c3d4e5f6");
  EXPECT_EQ(b->cuda.device_index, -1);
  ASSERT_EQ(b->cuda.mem_handle.size(), 64u);
  EXPECT_EQ(static_cast<unsigned char>(b->cuda.mem_handle[63]), 63);
  EXPECT_EQ(b->cuda.storage_bytes, 1 << 20);
  EXPECT_EQ(b->cuda.storage_offset_bytes, 4096);
  EXPECT_EQ(b->storage_offset, 256);
  EXPECT_EQ(b->cuda.ref_counter_file, "/torch_123_456_0");
  EXPECT_EQ(b->cuda.ref_counter_offset, 7);
  EXPECT_TRUE(b->cuda.event_sync_required);
  EXPECT_EQ(static_cast<unsigned char>(b->cuda.event_handle[0]), 64);
  EXPECT_EQ(b->tensors.size(), 3u);

  auto i = DecodeSglangBucket(Fixture("cuda_index.b64"));
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_EQ(i->cuda.device_index, 0);
  EXPECT_TRUE(i->cuda.device_uuid.empty());
  EXPECT_FALSE(i->cuda.event_sync_required);

  // torch 2.x's storage handle: [version]['c'][cudaIpcMemHandle_t]; an expandable segment's is
  // refused with what to change.
  auto v2 = DecodeSglangBucket(Fixture("cuda_torch2.b64"));
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->cuda.mem_handle, b->cuda.mem_handle);
  auto expandable = DecodeSglangBucket(Fixture("cuda_expandable.b64"));
  ASSERT_FALSE(expandable.ok());
  EXPECT_NE(expandable.status().message().find("expandable_segments:False"), std::string::npos)
      << expandable.status();

  auto e = DecodeSglangBucket(Fixture("cuda_empty.b64"));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->where, SglangBucket::Where::kEmpty);
  EXPECT_TRUE(e->tensors.empty());
}

TEST(SglangBucketTest, DecodesTheOlderOneDtypeForm) {
  auto b = DecodeSglangBucket(Fixture("cpu_same_dtype.b64"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype, "float32");
  EXPECT_EQ(b->numel, 30);
  EXPECT_EQ(b->shm.bytes, 120);
  ASSERT_EQ(b->tensors.size(), 2u);
  EXPECT_EQ(b->tensors[1].start, 24);
  EXPECT_EQ(b->tensors[1].end, 30);
}

TEST(SglangBucketTest, ErrorsNameWhatIsWrong) {
  auto not_b64 = DecodeSglangBucket("not base64 at all!");
  ASSERT_FALSE(not_b64.ok());
  EXPECT_NE(not_b64.status().message().find("base64"), std::string::npos);
  auto list = DecodeSglangBucket(absl::Base64Escape(Unhex("80045d942e")));  // []
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.status().message().find("expected a dict"), std::string::npos) << list.status();

  // The CPU fixture with the first tensor's numel (48, a BININT1 after 'numel') changed to 50:
  // its run no longer matches its shape.
  std::string raw;
  ASSERT_TRUE(absl::Base64Unescape(Fixture("cpu_shm.b64"), &raw));
  const size_t at = raw.find("numel");
  ASSERT_NE(at, std::string::npos);
  const size_t value = raw.find('\x30', at);  // BININT1 48 is "K0"
  ASSERT_NE(value, std::string::npos);
  raw[value] = '\x32';
  auto bad = DecodeSglangBucket(raw);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("metadata[0] ('model.layers.0.self_attn.q_proj.weight')"),
            std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace slime::comm
