// Unit tests for the Unicode helpers: UTF-8 decoding and repair, streaming prefixes, NFC,
// the byte-level alphabet, Python-style stripping, and the PCRE2 wrapper.
#include "slime/tokenizer/unicode.h"

#include <gtest/gtest.h>

#include "slime/tokenizer/regex.h"

namespace slime::tokenizer {
namespace {

TEST(Utf8Test, DecodesAllLengths) {
  const std::string s = "a\u00e9\u4e2d\U0001F600";
  Utf8Step a = DecodeUtf8(s, 0);
  EXPECT_TRUE(a.valid);
  EXPECT_EQ(a.code_point, U'a');
  EXPECT_EQ(DecodeUtf8(s, 1).code_point, 0xE9u);
  EXPECT_EQ(DecodeUtf8(s, 1).length, 2);
  EXPECT_EQ(DecodeUtf8(s, 3).code_point, 0x4E2Du);
  EXPECT_EQ(DecodeUtf8(s, 6).code_point, 0x1F600u);
  EXPECT_EQ(DecodeUtf8(s, 6).length, 4);
}

TEST(Utf8Test, MaximalSubpartsAndTruncation) {
  // Overlong, surrogate, out of range, stray continuation: invalid, one byte or the subpart.
  EXPECT_FALSE(DecodeUtf8("\xC0\x80", 0).valid);
  EXPECT_EQ(DecodeUtf8("\xC0\x80", 0).length, 1);
  EXPECT_EQ(DecodeUtf8("\xED\xA0\x80", 0).length, 1);  // surrogate: second byte out of range
  EXPECT_EQ(DecodeUtf8("\xF4\x90\x80\x80", 0).length, 1);
  EXPECT_EQ(DecodeUtf8("\x80", 0).length, 1);
  // A valid prefix followed by a non-continuation: the prefix is one subpart.
  Utf8Step cut = DecodeUtf8("\xE2\x82" "A", 0);
  EXPECT_FALSE(cut.valid);
  EXPECT_FALSE(cut.truncated);
  EXPECT_EQ(cut.length, 2);
  // The same prefix at the end of input is truncated (could still complete).
  Utf8Step truncated = DecodeUtf8("\xE2\x82", 0);
  EXPECT_FALSE(truncated.valid);
  EXPECT_TRUE(truncated.truncated);
}

TEST(Utf8Test, LossyRepairMatchesRustRule) {
  EXPECT_EQ(Utf8Lossy("plain"), "plain");
  EXPECT_EQ(Utf8Lossy("a\xE2\x82" "b"), "a\uFFFD" "b");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), "\uFFFD");
  EXPECT_EQ(Utf8Lossy("\x80\x80"), "\uFFFD\uFFFD");
  EXPECT_EQ(Utf8Lossy("\xC3\xA9\xFF"), "\u00e9\uFFFD");
  EXPECT_TRUE(IsValidUtf8("\u00e9\U0001F600"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
}

TEST(Utf8Test, EmittablePrefixHoldsOnlyIncompleteTail) {
  EXPECT_EQ(EmittableUtf8Prefix("abc"), 3u);
  EXPECT_EQ(EmittableUtf8Prefix("ab\xF0\x9F\x98"), 2u);  // 3 of 4 bytes of an emoji
  EXPECT_EQ(EmittableUtf8Prefix("ab\xE4"), 2u);
  EXPECT_EQ(EmittableUtf8Prefix("ab\xF0\x9F\x98\x80"), 6u);
  // Bytes that can never complete are emitted (they become U+FFFD), not held.
  EXPECT_EQ(EmittableUtf8Prefix("ab\xFF"), 3u);
  EXPECT_EQ(EmittableUtf8Prefix("ab\xE2" "A"), 4u);
}

TEST(NfcTest, ComposesDecomposedText) {
  EXPECT_EQ(NormalizeNfc("cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(NormalizeNfc("A\u030a"), "\u00c5");
  // Hangul jamo compose algorithmically: 한글.
  EXPECT_EQ(NormalizeNfc("\u1112\u1161\u11ab\u1100\u1173\u11af"), "\ud55c\uae00");
  // Canonical ordering: dot below (220) before dot above (230), then composition.
  EXPECT_EQ(NormalizeNfc("d\u0307\u0323"), "\u1e0d\u0307");
  EXPECT_EQ(NormalizeNfc("q\u0307\u0323"), "q\u0323\u0307");
}

TEST(NfcTest, SingletonsAndExclusions) {
  EXPECT_EQ(NormalizeNfc("\u212b"), "\u00c5");       // ANGSTROM SIGN
  EXPECT_EQ(NormalizeNfc("\u2126"), "\u03a9");       // OHM SIGN
  EXPECT_EQ(NormalizeNfc("\u212a"), "K");            // KELVIN SIGN
  EXPECT_EQ(NormalizeNfc("\u0958"), "\u0915\u093c");  // composition exclusion stays decomposed
  EXPECT_EQ(NormalizeNfc("\u0344"), "\u0308\u0301");  // non-starter decomposition
}

TEST(NfcTest, AlreadyNormalTextIsUnchanged) {
  const std::string text = "Hello 世界 😀 café 한국어 Ελληνικά";
  EXPECT_TRUE(IsNfcQuick(text));
  EXPECT_EQ(NormalizeNfc(text), text);
  EXPECT_FALSE(IsNfcQuick("e\u0301"));
  EXPECT_EQ(CanonicalCombiningClass(0x0301), 230);
  EXPECT_EQ(CanonicalCombiningClass('a'), 0);
  EXPECT_STRNE(NfcUnicodeVersion(), "");
}

TEST(NfcTest, OnlyTheAffectedSegmentIsRewritten) {
  const std::string prefix(1000, 'x');
  EXPECT_EQ(NormalizeNfc(prefix + "e\u0301" + prefix), prefix + "\u00e9" + prefix);
}

TEST(ByteLevelTest, AlphabetIsABijection) {
  EXPECT_EQ(ByteToUnicode('A'), U'A');
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);   // Ġ
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);  // Ċ
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(UnicodeToByte(ByteToUnicode(static_cast<uint8_t>(b))), b);
  }
  EXPECT_EQ(UnicodeToByte(0x4E2D), -1);
  EXPECT_EQ(BytesToByteLevel(" hi\n"), "\u0120hi\u010a");
}

TEST(PyStripTest, MatchesPython) {
  EXPECT_EQ(PyStrip("  \t hi \n\u3000"), "hi");
  EXPECT_EQ(PyStrip("\x1c x \x1f"), "x");  // Python counts U+001C..U+001F as whitespace
  EXPECT_EQ(PyLStrip("  a  "), "a  ");
  EXPECT_EQ(PyRStrip("  a  "), "  a");
  EXPECT_EQ(PyStrip("   "), "");
  EXPECT_EQ(PyStripChars("\n\nx\n", "\n"), "x");
  EXPECT_EQ(PyLStripChars("\n\n", "\n"), "");
  EXPECT_EQ(PyRStripChars("a\n \n", "\n"), "a\n ");
  EXPECT_TRUE(IsUnicodeWhitespace(0x3000));
  EXPECT_FALSE(IsUnicodeWhitespace(0x1C));
  EXPECT_FALSE(IsUnicodeWhitespace(0x200B));
}

TEST(RegexTest, FindsUnicodeClassesAndHandlesEmptyMatches) {
  auto re = Regex::Compile(R"(\p{L}+|\p{N})");
  ASSERT_TRUE(re.ok()) << re.status();
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)->FindAll("ab 12 中文", &m).ok());
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{0, 2}));
  EXPECT_EQ(m[3], (std::pair<size_t, size_t>{6, 12}));

  auto empty = Regex::Compile("x*");
  ASSERT_TRUE(empty.ok());
  m.clear();
  ASSERT_TRUE((*empty)->FindAll("axxb\u00e9x", &m).ok());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{1, 3}));
  EXPECT_EQ(m[1], (std::pair<size_t, size_t>{6, 7}));

  auto literal = Regex::Compile("a.b", /*literal=*/true);
  ASSERT_TRUE(literal.ok());
  EXPECT_TRUE((*literal)->Search("xa.by"));
  EXPECT_FALSE((*literal)->Search("axb"));
}

TEST(RegexTest, WhitespaceIsUnicodeWhiteSpaceLikeOniguruma) {
  EXPECT_EQ(TranslateWhitespaceClasses(R"([^\s\p{L}]+|\s+(?!\S)|\\s)"),
            R"([^\p{White_Space}\p{L}]+|\p{White_Space}+(?!\P{White_Space})|\\s)");
  auto re = Regex::Compile(R"(\s)");
  ASSERT_TRUE(re.ok());
  EXPECT_TRUE((*re)->Search("\u0085"));   // NEL is White_Space
  EXPECT_TRUE((*re)->Search("\u3000"));
  EXPECT_FALSE((*re)->Search("\u180e"));  // Mongolian vowel separator: not since Unicode 6.3
  EXPECT_FALSE((*re)->Search("\ufeff"));
  EXPECT_FALSE((*re)->Search("\u200b"));
}

TEST(RegexTest, BadPatternIsAnError) {
  auto re = Regex::Compile("(unclosed");
  ASSERT_FALSE(re.ok());
  EXPECT_NE(std::string(re.status().message()).find("(unclosed"), std::string::npos);
}

TEST(RegexTest, HugeWhitespaceRunDoesNotFail) {
  auto re = Regex::Compile(R"(\s+(?!\S)|\s+)");
  ASSERT_TRUE(re.ok());
  std::string text(1 << 20, ' ');
  text += "x";
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)->FindAll(text, &m).ok());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].second, text.size() - 2);  // \s+(?!\S) leaves the last space...
  EXPECT_EQ(m[1], (std::pair<size_t, size_t>{text.size() - 2, text.size() - 1}));  // ...to \s+
}

}  // namespace
}  // namespace slime::tokenizer
