// The Jinja interpreter (slime/tokenizer/jinja.h) against Python jinja2: every case of
// tests/data/tokenizer/jinja_cases.json (one construct each: whitespace control, loops, set /
// namespace, macros, filters, tests, operators, literals, slices, methods, undefined values) is
// rendered with the file's context and compared byte for byte with what jinja2 3.1.6 rendered
// in transformers' chat-template environment (tests/tokenizer/jinja2_oracle.py regenerates it).
// Error cases check our message (line + construct). Plus parse errors, PyJsonDumps and
// concurrent rendering of one template.
#include "slime/tokenizer/jinja.h"

#include <thread>

#include <gtest/gtest.h>

#include "test_util.h"

namespace slime::tokenizer::jinja {
namespace {

using OJson = nlohmann::ordered_json;
using ::slime::tokenizer::testing::ReadText;
using ::slime::tokenizer::testing::SourceDir;

std::string Render(std::string_view source, const OJson& context = OJson::object()) {
  auto t = Template::Parse(source, "chat template");
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  auto out = t->Render(context);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

TEST(JinjaTest, MatchesJinja2OnEveryConstructCase) {
  const OJson doc =
      OJson::parse(ReadText(SourceDir() + "/tests/data/tokenizer/jinja_cases.json"));
  const OJson& context = doc["context"];
  int checked = 0;
  for (const OJson& c : doc["cases"]) {
    const std::string name = c["name"];
    const std::string got = Render(c["template"].get<std::string>(), context);
    if (c.contains("output")) {
      EXPECT_EQ(got, c["output"].get<std::string>())
          << name << "\n  template: " << c["template"].dump();
    } else {
      EXPECT_NE(got.find(c["error"].get<std::string>()), std::string::npos)
          << name << ": got " << got;
    }
    ++checked;
  }
  EXPECT_GE(checked, 50);
}

TEST(JinjaTest, ParseErrorsNameTheLineAndTheConstruct) {
  EXPECT_EQ(Render("a\n{% for x in y %}"),
            "PARSE ERROR: chat template line 2: 'for' is never closed (expected 'endfor')");
  EXPECT_EQ(Render("{% foo %}"), "PARSE ERROR: chat template line 1: unknown statement 'foo'");
  EXPECT_EQ(Render("{% if x %}\n{% endfor %}"),
            "PARSE ERROR: chat template line 2: unexpected 'endfor' inside 'if'");
  EXPECT_EQ(Render("\n\n{{ x | nosuchfilter }}"),
            "PARSE ERROR: chat template line 3: unknown filter 'nosuchfilter'");
  EXPECT_EQ(Render("{{ x is nosuchtest }}"),
            "PARSE ERROR: chat template line 1: unknown test 'nosuchtest'");
  EXPECT_EQ(Render("{{ 'abc }}"), "PARSE ERROR: chat template line 1: unterminated string literal");
  EXPECT_EQ(Render("{{ 1 + }}"), "PARSE ERROR: chat template line 1: unexpected '}}' in expression");
  EXPECT_EQ(Render("{% for x in y recursive %}{% endfor %}"),
            "PARSE ERROR: chat template line 1: recursive for loops are not supported");
}

TEST(JinjaTest, RenderErrorsNameTheLine) {
  EXPECT_EQ(Render("ok\n{{ raise_exception('Conversation roles must alternate') }}"),
            "ERROR: chat template line 2: Conversation roles must alternate");
  EXPECT_EQ(Render("{{ nope.attr }}"), "ERROR: chat template line 1: 'nope' is undefined");
  EXPECT_EQ(Render("{{ 'a' + 1 }}"),
            "ERROR: chat template line 1: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(Render("{% set n = 1 %}{% set n.a = 2 %}"),
            "ERROR: chat template line 1: cannot assign attribute 'a' on 'n': not a namespace()");
  EXPECT_EQ(Render("{{ undefined_thing | tojson }}"),
            "ERROR: chat template line 1: 'undefined_thing' is undefined");
  EXPECT_EQ(Render("{{ nothing() }}"), "ERROR: chat template line 1: 'nothing' is undefined");
  EXPECT_EQ(Render("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"),
            "ERROR: chat template line 1: macro 'm' nests deeper than 100 calls");
}

TEST(JinjaTest, GenerationBlockAndStrftime) {
  EXPECT_EQ(Render("a{% generation %}b{% endgeneration %}c"), "abc");
  EXPECT_EQ(Render("{{ strftime_now('%Y-%m-%d') | length }}"), "10");
}

TEST(JinjaTest, PyJsonDumpsMatchesPythonJsonDumps) {
  OJson v = OJson::parse(
      R"({"a": 1, "b": [true, null, 1.5, 1e-06, 1e16, 100.0, 0.0001, 123456789.123, -0.0,
          1e22, 5e-324], "c": "\u00e9\n\"\u0001\u007f"})");
  EXPECT_EQ(PyJsonDumps(v), "{\"a\": 1, \"b\": [true, null, 1.5, 1e-06, 1e+16, 100.0, 0.0001, "
                            "123456789.123, -0.0, 1e+22, 5e-324], \"c\": \"\u00e9\\n\\\"\\u0001"
                            "\x7f\"}");
  OJson nested = OJson::parse(R"({"a": [], "b": {}, "c": [1, {"d": 2}]})");
  JsonDumpsOptions indent4;
  indent4.indent = 4;
  EXPECT_EQ(PyJsonDumps(nested, indent4),
            "{\n    \"a\": [],\n    \"b\": {},\n    \"c\": [\n        1,\n        {\n"
            "            \"d\": 2\n        }\n    ]\n}");
  // Key order is insertion order, as for Python dicts; sort_keys and ensure_ascii as Python's.
  EXPECT_EQ(PyJsonDumps(OJson::parse(R"({"z": 1, "a": 2})")), "{\"z\": 1, \"a\": 2}");
  JsonDumpsOptions ascii_sorted;
  ascii_sorted.ensure_ascii = true;
  ascii_sorted.sort_keys = true;
  EXPECT_EQ(PyJsonDumps(OJson::parse(R"({"z": "\u00e9\ud83d\ude00", "a": 2})"), ascii_sorted),
            "{\"a\": 2, \"z\": \"\\u00e9\\ud83d\\ude00\"}");
}

TEST(JinjaTest, OneTemplateRendersConcurrently) {
  auto t = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m %}{% endfor %}"
      "{{ ns.n }}");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k] {
      OJson messages = OJson::array();
      for (int i = 0; i <= k; ++i) messages.push_back(i);
      for (int rep = 0; rep < 200; ++rep) {
        auto out = t->Render(OJson{{"messages", messages}});
        results[k] = out.ok() ? *out : "error";
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) EXPECT_EQ(results[k], std::to_string(k * (k + 1) / 2));
}

}  // namespace
}  // namespace slime::tokenizer::jinja
