// The built-ins of the Jinja interpreter (jinja_internal.h): filters, tests, the methods of
// strings / lists / dicts that chat templates call, and the global functions. Each is a row of
// a table (name → function); adding one is a function and a row.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <map>

#include <fmt/format.h>

#include "slime/tokenizer/jinja.h"
#include "jinja_internal.h"

namespace slime::tokenizer::jinja {
namespace {

using FilterFn = Value (*)(Evaluator&, const Value&, Args&, int);
using TestFn = bool (*)(Evaluator&, const Value&, Args&, int);
using MethodFn = Value (*)(const Value&, Args&, int);

bool IsIntLike(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }

std::string StrArg(Args& args, size_t pos, std::string_view name, std::optional<std::string> fallback,
                   std::string_view what, int line) {
  Value v = Arg(args, pos, name, fallback ? std::optional<Value>(Value::Str(*fallback)) : std::nullopt,
                what, line);
  if (v.kind != Kind::kString) {
    RequireDefined(v, line);
    Fail(line, fmt::format("{}: argument '{}' must be a string, got {}", what, name, TypeName(v)));
  }
  return v.s;
}

int64_t IntArg(Args& args, size_t pos, std::string_view name, std::optional<int64_t> fallback,
               std::string_view what, int line) {
  Value v = Arg(args, pos, name, fallback ? std::optional<Value>(Value::Int(*fallback)) : std::nullopt,
                what, line);
  if (!IsIntLike(v)) Fail(line, fmt::format("{}: argument '{}' must be an integer", what, name));
  return v.kind == Kind::kBool ? v.b : v.i;
}

std::string Require(const Value& v, Kind kind, std::string_view what, int line) {
  if (v.kind != kind) {
    RequireDefined(v, line);
    Fail(line, fmt::format("{} needs a {}, got {}", what,
                           kind == Kind::kString ? "string" : kind == Kind::kList ? "list" : "dict",
                           TypeName(v)));
  }
  return v.s;
}

// ---- string helpers --------------------------------------------------------------------------

bool IsPySpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// str.strip / lstrip / rstrip with Python's semantics: `chars` (code points) or whitespace.
std::string Strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<std::string> cps = CodePoints(s);
  std::vector<std::string> set = chars ? CodePoints(*chars) : std::vector<std::string>{};
  auto strip_me = [&](const std::string& cp) {
    if (!chars) return cp.size() == 1 && IsPySpace(cp[0]);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t a = 0;
  size_t b = cps.size();
  if (left) {
    while (a < b && strip_me(cps[a])) ++a;
  }
  if (right) {
    while (b > a && strip_me(cps[b - 1])) --b;
  }
  std::string out;
  for (size_t k = a; k < b; ++k) out += cps[k];
  return out;
}

std::optional<std::string> OptionalChars(Args& args, std::string_view what, int line) {
  Value v = Arg(args, 0, "chars", Value::None(), what, line);
  if (v.kind == Kind::kNone) return std::nullopt;
  return Require(v, Kind::kString, what, line);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string Capitalize(const std::string& s) {
  std::string out = Lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}
// Jinja's title: the first letter of each word upper, the rest lower.
std::string Title(const std::string& s) {
  std::string out;
  bool start = true;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    out += static_cast<char>(start ? std::toupper(u) : std::tolower(u));
    start = !std::isalnum(u) && u < 0x80;
  }
  return out;
}

std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (from.empty()) {  // Python inserts `to` between every code point
    std::vector<std::string> cps = CodePoints(s);
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < cps.size()) out += cps[k];
    }
    return out;
  }
  while (count < 0 || done < count) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out += s.substr(pos, at - pos) + to;
    pos = at + from.size();
    ++done;
  }
  return out + s.substr(pos);
}

// str.split / rsplit: on `sep`, or on runs of whitespace when sep is None.
List Split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit, bool from_right,
           int line) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) Fail(line, "split: empty separator");
    if (!from_right) {
      size_t pos = 0;
      for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        const size_t at = s.find(*sep, pos);
        if (at == std::string::npos) break;
        parts.push_back(s.substr(pos, at - pos));
        pos = at + sep->size();
      }
      parts.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        if (end < sep->size()) break;
        const size_t at = s.rfind(*sep, end - sep->size());
        if (at == std::string::npos) break;
        parts.insert(parts.begin(), s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
      }
      parts.insert(parts.begin(), s.substr(0, end));
    }
  } else {
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t k = 0; k < s.size();) {
      while (k < s.size() && IsPySpace(s[k])) ++k;
      if (k >= s.size()) break;
      size_t e = k;
      while (e < s.size() && !IsPySpace(s[e])) ++e;
      words.emplace_back(k, e);
      k = e;
    }
    const size_t n = words.size();
    const size_t limit = maxsplit < 0 ? n : std::min<size_t>(n, static_cast<size_t>(maxsplit) + 1);
    if (limit == 0) return {};
    if (!from_right) {
      for (size_t k = 0; k + 1 < limit; ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      const size_t last = words[limit - 1].first;
      parts.push_back(Strip(s.substr(last), std::nullopt, false, true));
    } else {
      const size_t first_kept = n - limit + 1;
      parts.push_back(Strip(s.substr(0, words[first_kept - 1].second), std::nullopt, true, false));
      for (size_t k = first_kept; k < n; ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
  }
  List out;
  for (std::string& p : parts) out.push_back(Value::Str(std::move(p)));
  return out;
}

// ---- methods ---------------------------------------------------------------------------------

Value MStrip(const Value& o, Args& a, int l) { return Value::Str(Strip(o.s, OptionalChars(a, "strip", l), true, true)); }
Value MLstrip(const Value& o, Args& a, int l) { return Value::Str(Strip(o.s, OptionalChars(a, "lstrip", l), true, false)); }
Value MRstrip(const Value& o, Args& a, int l) { return Value::Str(Strip(o.s, OptionalChars(a, "rstrip", l), false, true)); }
Value MLower(const Value& o, Args&, int) { return Value::Str(Lower(o.s)); }
Value MUpper(const Value& o, Args&, int) { return Value::Str(Upper(o.s)); }
Value MTitle(const Value& o, Args&, int) { return Value::Str(Title(o.s)); }
Value MCapitalize(const Value& o, Args&, int) { return Value::Str(Capitalize(o.s)); }
Value MStartswith(const Value& o, Args& a, int l) {
  Value p = Arg(a, 0, "prefix", std::nullopt, "startswith", l);
  if (p.kind == Kind::kList) {
    for (const Value& x : *p.list) {
      if (x.kind == Kind::kString && o.s.starts_with(x.s)) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  return Value::Bool(o.s.starts_with(Require(p, Kind::kString, "startswith", l)));
}
Value MEndswith(const Value& o, Args& a, int l) {
  Value p = Arg(a, 0, "suffix", std::nullopt, "endswith", l);
  if (p.kind == Kind::kList) {
    for (const Value& x : *p.list) {
      if (x.kind == Kind::kString && o.s.ends_with(x.s)) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  return Value::Bool(o.s.ends_with(Require(p, Kind::kString, "endswith", l)));
}
Value SplitMethod(const Value& o, Args& a, int l, bool right) {
  Value sep = Arg(a, 0, "sep", Value::None(), "split", l);
  const int64_t maxsplit = IntArg(a, 1, "maxsplit", -1, "split", l);
  std::optional<std::string> s;
  if (sep.kind != Kind::kNone) s = Require(sep, Kind::kString, "split", l);
  return Value::MakeList(Split(o.s, s, maxsplit, right, l));
}
Value MSplit(const Value& o, Args& a, int l) { return SplitMethod(o, a, l, false); }
Value MRsplit(const Value& o, Args& a, int l) { return SplitMethod(o, a, l, true); }
Value MReplace(const Value& o, Args& a, int l) {
  return Value::Str(ReplaceAll(o.s, StrArg(a, 0, "old", std::nullopt, "replace", l),
                               StrArg(a, 1, "new", std::nullopt, "replace", l),
                               IntArg(a, 2, "count", -1, "replace", l)));
}
Value MFind(const Value& o, Args& a, int l) {
  const size_t at = o.s.find(StrArg(a, 0, "sub", std::nullopt, "find", l));
  if (at == std::string::npos) return Value::Int(-1);
  return Value::Int(static_cast<int64_t>(CodePoints(o.s.substr(0, at)).size()));
}
Value MCount(const Value& o, Args& a, int l) {
  const std::string sub = StrArg(a, 0, "sub", std::nullopt, "count", l);
  if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePoints(o.s).size()) + 1);
  int64_t n = 0;
  for (size_t at = o.s.find(sub); at != std::string::npos; at = o.s.find(sub, at + sub.size())) ++n;
  return Value::Int(n);
}
Value MJoin(const Value& o, Args& a, int l) {
  Value items = Arg(a, 0, "iterable", std::nullopt, "join", l);
  std::string out;
  bool first = true;
  for (const Value& v : Iterate(items, l)) {
    if (!first) out += o.s;
    first = false;
    out += Require(v, Kind::kString, "str.join", l);
  }
  return Value::Str(std::move(out));
}
// str.format with "{}" and "{0}" fields (no format specs).
Value MFormat(const Value& o, Args& a, int l) {
  std::string out;
  size_t next = 0;
  for (size_t k = 0; k < o.s.size(); ++k) {
    const char c = o.s[k];
    if ((c == '{' || c == '}') && k + 1 < o.s.size() && o.s[k + 1] == c) {
      out += c;
      ++k;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = o.s.find('}', k);
    if (close == std::string::npos) Fail(l, "format: unmatched '{'");
    const std::string field = o.s.substr(k + 1, close - k - 1);
    Value v;
    if (field.empty()) {
      v = Arg(a, next++, "", std::nullopt, "format", l);
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      v = Arg(a, std::stoul(field), "", std::nullopt, "format", l);
    } else {
      v = Arg(a, SIZE_MAX, field, std::nullopt, "format", l);
    }
    out += ToStr(v);
    k = close;
  }
  return Value::Str(std::move(out));
}

Value MItems(const Value& o, Args&, int) {
  List out;
  for (const auto& [k, v] : o.dict->items) out.push_back(Value::MakeTuple({Value::Str(k), v}));
  return Value::MakeList(std::move(out));
}
Value MKeys(const Value& o, Args&, int) {
  List out;
  for (const auto& kv : o.dict->items) out.push_back(Value::Str(kv.first));
  return Value::MakeList(std::move(out));
}
Value MValues(const Value& o, Args&, int) {
  List out;
  for (const auto& kv : o.dict->items) out.push_back(kv.second);
  return Value::MakeList(std::move(out));
}
Value MGet(const Value& o, Args& a, int l) {
  const std::string key = StrArg(a, 0, "key", std::nullopt, "get", l);
  const Value* v = o.dict->Find(key);
  return v != nullptr ? *v : Arg(a, 1, "default", Value::None(), "get", l);
}
Value MIndex(const Value& o, Args& a, int l) {
  Value x = Arg(a, 0, "value", std::nullopt, "index", l);
  for (size_t k = 0; k < o.list->size(); ++k) {
    if (Equal((*o.list)[k], x)) return Value::Int(static_cast<int64_t>(k));
  }
  Fail(l, fmt::format("{} is not in list", Repr(x)));
}

const std::map<std::string, MethodFn, std::less<>>& StringMethods() {
  static const auto* m = new std::map<std::string, MethodFn, std::less<>>{
      {"strip", MStrip}, {"lstrip", MLstrip}, {"rstrip", MRstrip}, {"lower", MLower},
      {"upper", MUpper}, {"title", MTitle}, {"capitalize", MCapitalize},
      {"startswith", MStartswith}, {"endswith", MEndswith}, {"split", MSplit},
      {"rsplit", MRsplit}, {"replace", MReplace}, {"find", MFind}, {"count", MCount},
      {"join", MJoin}, {"format", MFormat}};
  return *m;
}
const std::map<std::string, MethodFn, std::less<>>& DictMethods() {
  static const auto* m = new std::map<std::string, MethodFn, std::less<>>{
      {"items", MItems}, {"keys", MKeys}, {"values", MValues}, {"get", MGet}};
  return *m;
}
const std::map<std::string, MethodFn, std::less<>>& ListMethods() {
  static const auto* m = new std::map<std::string, MethodFn, std::less<>>{
      {"index", MIndex}};
  return *m;
}

}  // namespace

Value Arg(Args& args, size_t pos, std::string_view name, std::optional<Value> fallback,
          std::string_view what, int line) {
  if (pos < args.positional.size()) return args.positional[pos];
  for (const auto& [key, value] : args.named) {
    if (key == name) return value;
  }
  if (!fallback) Fail(line, fmt::format("{}: missing argument '{}'", what, name));
  return *fallback;
}

std::optional<Value> RunMethod(const Value& obj, const std::string& name, Args& args, int line) {
  const std::map<std::string, MethodFn, std::less<>>* table = nullptr;
  if (obj.kind == Kind::kString) table = &StringMethods();
  if (obj.kind == Kind::kDict && !obj.dict->is_namespace) table = &DictMethods();
  if (obj.kind == Kind::kList) table = &ListMethods();
  if (table == nullptr) return std::nullopt;
  // transformers renders in Jinja's immutable sandbox: methods that modify lists and dicts fail.
  static constexpr std::string_view kMutating[] = {"append", "extend", "insert", "pop", "remove",
                                                   "clear", "update", "setdefault", "popitem",
                                                   "sort", "reverse"};
  if (obj.kind != Kind::kString &&
      std::find(std::begin(kMutating), std::end(kMutating), name) != std::end(kMutating)) {
    Fail(line, fmt::format("access to attribute '{}' of '{}' object is unsafe", name,
                           TypeName(obj)));
  }
  auto it = table->find(name);
  if (it == table->end()) return std::nullopt;
  return it->second(obj, args, line);
}

// ---- globals ---------------------------------------------------------------------------------

void AddGlobals(Dict* globals) {
  globals->Set("raise_exception", Value::Callable([](Evaluator&, Args& args, int line) -> Value {
                 Fail(line, ToStr(Arg(args, 0, "message", Value::Str(""), "raise_exception", line)));
               }));
  globals->Set("strftime_now", Value::Callable([](Evaluator&, Args& args, int line) {
                 const std::string format = StrArg(args, 0, "format", std::nullopt, "strftime_now", line);
                 const std::time_t now = std::time(nullptr);
                 std::tm local{};
                 localtime_r(&now, &local);
                 char buf[256];
                 const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &local);
                 return Value::Str(std::string(buf, n));
               }));
  globals->Set("namespace", Value::Callable([](Evaluator&, Args& args, int line) {
                 Value ns = Value::MakeDict();
                 ns.dict->is_namespace = true;
                 for (const Value& init : args.positional) {  // namespace(some_dict)
                   if (init.kind != Kind::kDict) Fail(line, "namespace() takes a dict or keywords");
                   for (const auto& [k, v] : init.dict->items) ns.dict->Set(k, v);
                 }
                 for (const auto& [k, v] : args.named) ns.dict->Set(k, v);
                 return ns;
               }));
  globals->Set("dict", Value::Callable([](Evaluator&, Args& args, int) {
                 Value d = Value::MakeDict();
                 for (const auto& [k, v] : args.named) d.dict->Set(k, v);
                 return d;
               }));
  globals->Set("range", Value::Callable([](Evaluator&, Args& args, int line) {
                 for (const Value& v : args.positional) {
                   if (!IsIntLike(v)) Fail(line, "range() takes integers");
                 }
                 const size_t n = args.positional.size();
                 if (n == 0 || n > 3) Fail(line, "range() takes 1 to 3 arguments");
                 const int64_t start = n == 1 ? 0 : args.positional[0].i;
                 const int64_t stop = n == 1 ? args.positional[0].i : args.positional[1].i;
                 const int64_t step = n == 3 ? args.positional[2].i : 1;
                 if (step == 0) Fail(line, "range() step must not be zero");
                 List out;
                 for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
                   out.push_back(Value::Int(k));
                   if (out.size() > 1000000) Fail(line, "range() too long");
                 }
                 return Value::MakeList(std::move(out));
               }));
}

}  // namespace slime::tokenizer::jinja
