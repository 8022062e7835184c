// The filters and tests of the Jinja interpreter (jinja_internal.h), as tables of name →
// function. Semantics follow jinja2's built-ins; `tojson` is transformers' override (Python's
// json.dumps with ensure_ascii=False, not Jinja's HTML-escaping one).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "slime/tokenizer/jinja.h"
#include "jinja_internal.h"

namespace slime::tokenizer::jinja {
namespace {

using FilterFn = Value (*)(Evaluator&, const Value&, Args&, int);
using TestFn = bool (*)(Evaluator&, const Value&, Args&, int);

bool IsIntLike(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }

bool BoolArg(Args& a, size_t pos, std::string_view name, bool fallback, std::string_view what, int l) {
  return Truthy(Arg(a, pos, name, Value::Bool(fallback), what, l));
}

std::string LowerAscii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// `attribute` of map/selectattr/sort/...: a dotted path of keys or indices ("function.name").
Value AttributePath(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.kind == Kind::kDict) {
      const Value* found = v.dict->Find(part);
      v = found != nullptr ? *found
                           : Value::Undefined(fmt::format("'dict object' has no attribute '{}'", part));
    } else if (v.kind == Kind::kList && !part.empty() &&
               std::all_of(part.begin(), part.end(), ::isdigit) && std::stoul(part) < v.list->size()) {
      v = (*v.list)[std::stoul(part)];
    } else {
      return Value::Undefined(fmt::format("'{} object' has no attribute '{}'", TypeName(v), part));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

// The rest of the positional arguments from `from` on, with the keyword ones.
Args Rest(const Args& a, size_t from) {
  Args rest;
  for (size_t k = from; k < a.positional.size(); ++k) rest.positional.push_back(a.positional[k]);
  rest.named = a.named;
  return rest;
}

// ---- filters ---------------------------------------------------------------------------------

Value FTrim(Evaluator&, const Value& v, Args& a, int l) {
  Args method_args;
  method_args.positional.push_back(Arg(a, 0, "chars", Value::None(), "trim", l));
  return *RunMethod(Value::Str(ToStr(v)), "strip", method_args, l);
}

Value FToJson(Evaluator&, const Value& v, Args& a, int l) {
  JsonDumpsOptions o;
  Value indent = Arg(a, 0, "indent", Value::None(), "tojson", l);
  if (IsIntLike(indent)) {
    o.indent = static_cast<int>(indent.i);
  } else if (indent.kind != Kind::kNone) {
    Fail(l, "tojson: indent must be an integer");
  }
  o.ensure_ascii = BoolArg(a, SIZE_MAX, "ensure_ascii", false, "tojson", l);
  o.sort_keys = BoolArg(a, SIZE_MAX, "sort_keys", false, "tojson", l);
  Value seps = Arg(a, SIZE_MAX, "separators", Value::None(), "tojson", l);
  if (seps.kind == Kind::kList && seps.list->size() == 2) {
    o.item_separator = ToStr((*seps.list)[0]);
    o.key_separator = ToStr((*seps.list)[1]);
  }
  return Value::Str(PyJsonDumps(ToJson(v, l), o));
}

Value FLength(Evaluator&, const Value& v, Args&, int l) {
  switch (v.kind) {
    case Kind::kUndefined: return Value::Int(0);
    case Kind::kString: return Value::Int(static_cast<int64_t>(CodePoints(v.s).size()));
    case Kind::kList: return Value::Int(static_cast<int64_t>(v.list->size()));
    case Kind::kDict: return Value::Int(static_cast<int64_t>(v.dict->items.size()));
    default: Fail(l, fmt::format("object of type '{}' has no len()", TypeName(v)));
  }
}

Value FItems(Evaluator&, const Value& v, Args& a, int l) {
  if (v.is_undefined()) return Value::MakeList();
  if (v.kind != Kind::kDict) Fail(l, fmt::format("items: expected a mapping, got {}", TypeName(v)));
  return *RunMethod(v, "items", a, l);
}

Value SelectAttr(Evaluator& ev, const Value& v, Args& a, int l, bool by_attr, bool keep) {
  List out;
  const std::string what = by_attr ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject");
  std::string attr;
  size_t first = 0;
  if (by_attr) {
    attr = ToStr(Arg(a, 0, "attribute", std::nullopt, what, l));
    first = 1;
  }
  for (const Value& item : Iterate(v, l)) {
    Value x = by_attr ? AttributePath(item, attr) : item;
    bool pass;
    if (a.positional.size() <= first) {
      pass = Truthy(x);
    } else {
      const std::string test = ToStr(a.positional[first]);
      Args test_args = Rest(a, first + 1);
      pass = ev.ApplyTest(test, x, test_args, l);
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}
Value FSelectAttr(Evaluator& e, const Value& v, Args& a, int l) { return SelectAttr(e, v, a, l, true, true); }
Value FRejectAttr(Evaluator& e, const Value& v, Args& a, int l) { return SelectAttr(e, v, a, l, true, false); }
Value FSelect(Evaluator& e, const Value& v, Args& a, int l) { return SelectAttr(e, v, a, l, false, true); }
Value FReject(Evaluator& e, const Value& v, Args& a, int l) { return SelectAttr(e, v, a, l, false, false); }

Value FMap(Evaluator& ev, const Value& v, Args& a, int l) {
  List out;
  const Value attr = Arg(a, SIZE_MAX, "attribute", Value::None(), "map", l);
  for (const Value& item : Iterate(v, l)) {
    if (attr.kind != Kind::kNone) {
      Value x = AttributePath(item, ToStr(attr));
      if (x.is_undefined()) x = Arg(a, SIZE_MAX, "default", x, "map", l);
      out.push_back(std::move(x));
    } else {
      const std::string filter = ToStr(Arg(a, 0, "filter", std::nullopt, "map", l));
      Args filter_args = Rest(a, 1);
      out.push_back(ev.ApplyFilter(filter, item, filter_args, l));
    }
  }
  return Value::MakeList(std::move(out));
}

Value FJoin(Evaluator&, const Value& v, Args& a, int l) {
  const std::string sep = ToStr(Arg(a, 0, "d", Value::Str(""), "join", l));
  const Value attr = Arg(a, 1, "attribute", Value::None(), "join", l);
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(v, l)) {
    if (!first) out += sep;
    first = false;
    out += ToStr(attr.kind == Kind::kNone ? item : AttributePath(item, ToStr(attr)));
  }
  return Value::Str(std::move(out));
}

Value FFirst(Evaluator&, const Value& v, Args&, int l) {
  List items = Iterate(v, l);
  return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items.front();
}
Value FLast(Evaluator&, const Value& v, Args&, int l) {
  List items = Iterate(v, l);
  return items.empty() ? Value::Undefined("No last item, sequence was empty.") : items.back();
}

Value StrMethod(const char* method, const Value& v, Args& a, int l) {
  return *RunMethod(Value::Str(ToStr(v)), method, a, l);
}
Value FLower(Evaluator&, const Value& v, Args& a, int l) { return StrMethod("lower", v, a, l); }
Value FUpper(Evaluator&, const Value& v, Args& a, int l) { return StrMethod("upper", v, a, l); }
Value FCapitalize(Evaluator&, const Value& v, Args& a, int l) { return StrMethod("capitalize", v, a, l); }
Value FTitle(Evaluator&, const Value& v, Args& a, int l) { return StrMethod("title", v, a, l); }
Value FReplace(Evaluator&, const Value& v, Args& a, int l) {
  Args m;
  m.positional = {Arg(a, 0, "old", std::nullopt, "replace", l), Arg(a, 1, "new", std::nullopt, "replace", l)};
  Value count = Arg(a, 2, "count", Value::None(), "replace", l);
  if (count.kind != Kind::kNone) m.positional.push_back(count);
  return StrMethod("replace", v, m, l);
}

Value FDefault(Evaluator&, const Value& v, Args& a, int l) {
  const Value fallback = Arg(a, 0, "default_value", Value::Str(""), "default", l);
  const bool boolean = BoolArg(a, 1, "boolean", false, "default", l);
  if (v.is_undefined() || (boolean && !Truthy(v))) return fallback;
  return v;
}

Value FString(Evaluator&, const Value& v, Args&, int) { return Value::Str(ToStr(v)); }
Value FSafe(Evaluator&, const Value& v, Args&, int) { return v; }

Value FInt(Evaluator&, const Value& v, Args& a, int l) {
  const Value fallback = Arg(a, 0, "default", Value::Int(0), "int", l);
  if (IsIntLike(v)) return Value::Int(v.kind == Kind::kBool ? v.b : v.i);
  if (v.kind == Kind::kFloat) return Value::Int(static_cast<int64_t>(v.f));
  if (v.kind == Kind::kString) {
    std::string s = v.s;
    s.erase(std::remove_if(s.begin(), s.end(), ::isspace), s.end());
    try {
      size_t used = 0;
      const int64_t i = std::stoll(s, &used, 10);
      if (used == s.size()) return Value::Int(i);
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value::Int(static_cast<int64_t>(d));
    } catch (...) {
    }
  }
  return fallback;
}

Value FFloat(Evaluator&, const Value& v, Args& a, int l) {
  const Value fallback = Arg(a, 0, "default", Value::Float(0), "float", l);
  if (v.is_number()) return Value::Float(AsDouble(v));
  if (v.kind == Kind::kString) {
    try {
      size_t used = 0;
      const double d = std::stod(v.s, &used);
      if (used == v.s.size()) return Value::Float(d);
    } catch (...) {
    }
  }
  return fallback;
}

Value FList(Evaluator&, const Value& v, Args&, int l) { return Value::MakeList(Iterate(v, l)); }

Value FUnique(Evaluator&, const Value& v, Args& a, int l) {
  const bool case_sensitive = BoolArg(a, 0, "case_sensitive", false, "unique", l);
  const Value attr = Arg(a, 1, "attribute", Value::None(), "unique", l);
  List out;
  List seen;
  for (const Value& item : Iterate(v, l)) {
    Value key = attr.kind == Kind::kNone ? item : AttributePath(item, ToStr(attr));
    if (!case_sensitive && key.kind == Kind::kString) key = Value::Str(LowerAscii(key.s));
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeList(std::move(out));
}

Value FDictSort(Evaluator&, const Value& v, Args& a, int l) {
  if (v.kind != Kind::kDict) Fail(l, fmt::format("dictsort: expected a mapping, got {}", TypeName(v)));
  const bool case_sensitive = BoolArg(a, 0, "case_sensitive", false, "dictsort", l);
  const std::string by = ToStr(Arg(a, 1, "by", Value::Str("key"), "dictsort", l));
  const bool reverse = BoolArg(a, 2, "reverse", false, "dictsort", l);
  if (by != "key" && by != "value") Fail(l, "dictsort: 'by' must be \"key\" or \"value\"");
  auto pairs = v.dict->items;
  auto key_of = [&](const std::pair<std::string, Value>& p) {
    Value k = by == "key" ? Value::Str(p.first) : p.second;
    if (!case_sensitive && k.kind == Kind::kString) k = Value::Str(LowerAscii(k.s));
    return k;
  };
  std::stable_sort(pairs.begin(), pairs.end(), [&](const auto& x, const auto& y) {
    return reverse ? Less(key_of(y), key_of(x), l) : Less(key_of(x), key_of(y), l);
  });
  List out;
  for (auto& [k, val] : pairs) out.push_back(Value::MakeTuple({Value::Str(k), val}));
  return Value::MakeList(std::move(out));
}

Value FSort(Evaluator&, const Value& v, Args& a, int l) {
  const bool reverse = BoolArg(a, 0, "reverse", false, "sort", l);
  const bool case_sensitive = BoolArg(a, 1, "case_sensitive", false, "sort", l);
  const Value attr = Arg(a, 2, "attribute", Value::None(), "sort", l);
  List items = Iterate(v, l);
  auto key_of = [&](const Value& item) {
    Value k = attr.kind == Kind::kNone ? item : AttributePath(item, ToStr(attr));
    if (!case_sensitive && k.kind == Kind::kString) k = Value::Str(LowerAscii(k.s));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? Less(key_of(y), key_of(x), l) : Less(key_of(x), key_of(y), l);
  });
  return Value::MakeList(std::move(items));
}

Value FReverse(Evaluator&, const Value& v, Args&, int l) {
  if (v.kind == Kind::kString) {
    std::vector<std::string> cps = CodePoints(v.s);
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return Value::Str(std::move(out));
  }
  List items = Iterate(v, l);
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

// Python's str.splitlines on \n, \r\n and \r.
std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> lines;
  std::string cur;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\n' || s[k] == '\r') {
      lines.push_back(cur);
      cur.clear();
      if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
    } else {
      cur += s[k];
    }
  }
  if (!cur.empty()) lines.push_back(cur);
  return lines;
}

Value FIndent(Evaluator&, const Value& v, Args& a, int l) {
  const Value width = Arg(a, 0, "width", Value::Int(4), "indent", l);
  const bool first = BoolArg(a, 1, "first", false, "indent", l);
  const bool blank = BoolArg(a, 2, "blank", false, "indent", l);
  const std::string pad = width.kind == Kind::kString ? width.s
                          : std::string(static_cast<size_t>(std::max<int64_t>(0, width.i)), ' ');
  std::vector<std::string> lines = SplitLines(ToStr(v) + "\n");
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k > 0) out += "\n";
    if (k > 0 && (blank || !lines[k].empty())) out += pad;
    out += lines[k];
  }
  if (first) out = pad + out;
  return Value::Str(std::move(out));
}

Value FAbs(Evaluator&, const Value& v, Args&, int l) {
  if (IsIntLike(v)) return Value::Int(std::abs(v.kind == Kind::kBool ? int64_t{v.b} : v.i));
  if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.f));
  RequireDefined(v, l);
  Fail(l, fmt::format("bad operand type for abs(): '{}'", TypeName(v)));
}

Value FRound(Evaluator&, const Value& v, Args& a, int l) {
  if (!v.is_number()) {
    RequireDefined(v, l);
    Fail(l, fmt::format("round: expected a number, got {}", TypeName(v)));
  }
  const int64_t precision = Arg(a, 0, "precision", Value::Int(0), "round", l).i;
  const std::string method = ToStr(Arg(a, 1, "method", Value::Str("common"), "round", l));
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = AsDouble(v) * scale;
  double r;
  if (method == "common") {
    r = std::nearbyint(x);  // Python's round: halves to even
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    Fail(l, "round: method must be 'common', 'ceil' or 'floor'");
  }
  return Value::Float(r / scale);
}

Value FSum(Evaluator&, const Value& v, Args& a, int l) {
  const Value attr = Arg(a, 0, "attribute", Value::None(), "sum", l);
  Value total = Arg(a, 1, "start", Value::Int(0), "sum", l);
  for (const Value& item : Iterate(v, l)) {
    const Value x = attr.kind == Kind::kNone ? item : AttributePath(item, ToStr(attr));
    if (!x.is_number() || !total.is_number()) Fail(l, "sum: the items must be numbers");
    total = IsIntLike(total) && IsIntLike(x) ? Value::Int(total.i + (x.kind == Kind::kBool ? x.b : x.i))
                                             : Value::Float(AsDouble(total) + AsDouble(x));
  }
  return total;
}

Value MinMax(const Value& v, Args& a, int l, bool max) {
  const bool case_sensitive = BoolArg(a, 0, "case_sensitive", false, max ? "max" : "min", l);
  const Value attr = Arg(a, 1, "attribute", Value::None(), max ? "max" : "min", l);
  List items = Iterate(v, l);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  auto key_of = [&](const Value& item) {
    Value k = attr.kind == Kind::kNone ? item : AttributePath(item, ToStr(attr));
    if (!case_sensitive && k.kind == Kind::kString) k = Value::Str(LowerAscii(k.s));
    return k;
  };
  Value best = items[0];
  for (const Value& item : items) {
    if (max ? Less(key_of(best), key_of(item), l) : Less(key_of(item), key_of(best), l)) best = item;
  }
  return best;
}
Value FMin(Evaluator&, const Value& v, Args& a, int l) { return MinMax(v, a, l, false); }
Value FMax(Evaluator&, const Value& v, Args& a, int l) { return MinMax(v, a, l, true); }

Value FEscape(Evaluator&, const Value& v, Args&, int) {
  std::string out;
  for (char c : ToStr(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::Str(std::move(out));
}

// attr looks up attributes only: a dict's items are not attributes (a namespace's are).
// "%s and %s"|format(a, b): Python's % formatting.
Value FFormat(Evaluator&, const Value& v, Args& a, int l) {
  return Value::Str(PercentFormat(ToStr(v), a.positional, l));
}

Value FAttr(Evaluator&, const Value& v, Args& a, int l) {
  const std::string name = ToStr(Arg(a, 0, "name", std::nullopt, "attr", l));
  if (v.kind == Kind::kDict && v.dict->is_namespace) {
    if (const Value* found = v.dict->Find(name)) return *found;
  }
  return Value::Undefined(fmt::format("'{} object' has no attribute '{}'", TypeName(v), name));
}

const std::map<std::string, FilterFn, std::less<>>& Filters() {
  static const auto* m = new std::map<std::string, FilterFn, std::less<>>{
      {"abs", FAbs},         {"attr", FAttr},           {"capitalize", FCapitalize},
      {"count", FLength},    {"d", FDefault},           {"default", FDefault},
      {"dictsort", FDictSort}, {"e", FEscape},          {"escape", FEscape},
      {"first", FFirst},     {"float", FFloat},         {"format", FFormat},         {"indent", FIndent},
      {"int", FInt},         {"items", FItems},         {"join", FJoin},
      {"last", FLast},       {"length", FLength},       {"list", FList},
      {"lower", FLower},     {"map", FMap},             {"max", FMax},
      {"min", FMin},         {"reject", FReject},       {"rejectattr", FRejectAttr},
      {"replace", FReplace}, {"reverse", FReverse},     {"round", FRound},
      {"safe", FSafe},       {"select", FSelect},       {"selectattr", FSelectAttr},
      {"sort", FSort},       {"string", FString},       {"sum", FSum},
      {"title", FTitle},     {"tojson", FToJson},       {"trim", FTrim},
      {"unique", FUnique},   {"upper", FUpper}};
  return *m;
}

// ---- tests -----------------------------------------------------------------------------------

Value Other(Args& a, const char* what, int l) { return Arg(a, 0, "other", std::nullopt, what, l); }
int64_t IntOf(const Value& v, const char* what, int l) {
  if (!IsIntLike(v)) {
    RequireDefined(v, l);
    Fail(l, fmt::format("test '{}' needs an integer, got {}", what, TypeName(v)));
  }
  return v.kind == Kind::kBool ? v.b : v.i;
}

bool TDefined(Evaluator&, const Value& v, Args&, int) { return !v.is_undefined(); }
bool TUndefined(Evaluator&, const Value& v, Args&, int) { return v.is_undefined(); }
bool TNone(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kNone; }
bool TString(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kString; }
bool TNumber(Evaluator&, const Value& v, Args&, int) { return v.is_number(); }
bool TInteger(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kInt; }
bool TFloat(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kFloat; }
bool TBoolean(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kBool; }
bool TTrue(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kBool && v.b; }
bool TFalse(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kBool && !v.b; }
bool TMapping(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kDict && !v.dict->is_namespace; }
// jinja2's Undefined is iterable and a sequence (it defines __iter__, __len__, __getitem__).
bool TIterable(Evaluator&, const Value& v, Args&, int) {
  return v.is_undefined() || v.kind == Kind::kString || v.kind == Kind::kList ||
         (v.kind == Kind::kDict && !v.dict->is_namespace);
}
bool TCallable(Evaluator&, const Value& v, Args&, int) { return v.kind == Kind::kCallable; }
bool TEq(Evaluator&, const Value& v, Args& a, int l) { return Equal(v, Other(a, "eq", l)); }
bool TNe(Evaluator&, const Value& v, Args& a, int l) { return !Equal(v, Other(a, "ne", l)); }
bool TLt(Evaluator&, const Value& v, Args& a, int l) { return Less(v, Other(a, "lt", l), l); }
bool TGt(Evaluator&, const Value& v, Args& a, int l) { return Less(Other(a, "gt", l), v, l); }
bool TLe(Evaluator&, const Value& v, Args& a, int l) { return !Less(Other(a, "le", l), v, l); }
bool TGe(Evaluator&, const Value& v, Args& a, int l) { return !Less(v, Other(a, "ge", l), l); }
bool TIn(Evaluator&, const Value& v, Args& a, int l) {
  const Value seq = Arg(a, 0, "seq", std::nullopt, "in", l);
  if (seq.kind == Kind::kString) return v.kind == Kind::kString && seq.s.find(v.s) != std::string::npos;
  if (seq.kind == Kind::kDict) return v.kind == Kind::kString && seq.dict->Find(v.s) != nullptr;
  for (const Value& x : Iterate(seq, l)) {
    if (Equal(x, v)) return true;
  }
  return false;
}
bool TOdd(Evaluator&, const Value& v, Args&, int l) { return IntOf(v, "odd", l) % 2 != 0; }
bool TEven(Evaluator&, const Value& v, Args&, int l) { return IntOf(v, "even", l) % 2 == 0; }
bool TDivisibleBy(Evaluator&, const Value& v, Args& a, int l) {
  const int64_t n = IntOf(Arg(a, 0, "num", std::nullopt, "divisibleby", l), "divisibleby", l);
  if (n == 0) Fail(l, "divisibleby 0");
  return IntOf(v, "divisibleby", l) % n == 0;
}
bool TLower(Evaluator&, const Value& v, Args&, int) {
  const std::string s = ToStr(v);
  return LowerAscii(s) == s;
}
bool TUpper(Evaluator&, const Value& v, Args&, int) {
  std::string s = ToStr(v);
  std::string up = s;
  for (char& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return up == s;
}
bool TSameAs(Evaluator&, const Value& v, Args& a, int l) {
  const Value o = Other(a, "sameas", l);
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::kList: return v.list == o.list;
    case Kind::kDict: return v.dict == o.dict;
    case Kind::kCallable: return v.fn == o.fn;
    default: return Equal(v, o);
  }
}

const std::map<std::string, TestFn, std::less<>>& Tests() {
  static const auto* m = new std::map<std::string, TestFn, std::less<>>{
      {"defined", TDefined}, {"undefined", TUndefined}, {"none", TNone},
      {"string", TString},   {"number", TNumber},       {"integer", TInteger},
      {"float", TFloat},     {"boolean", TBoolean},     {"true", TTrue},
      {"false", TFalse},     {"mapping", TMapping},     {"iterable", TIterable},
      {"sequence", TIterable}, {"callable", TCallable}, {"eq", TEq},
      {"equalto", TEq},      {"==", TEq},               {"ne", TNe},
      {"!=", TNe},           {"lt", TLt},               {"lessthan", TLt},
      {"<", TLt},            {"gt", TGt},               {"greaterthan", TGt},
      {">", TGt},            {"le", TLe},               {"<=", TLe},
      {"ge", TGe},           {">=", TGe},               {"in", TIn},
      {"odd", TOdd},         {"even", TEven},           {"divisibleby", TDivisibleBy},
      {"lower", TLower},     {"upper", TUpper},         {"sameas", TSameAs}};
  return *m;
}

}  // namespace

bool IsFilter(const std::string& name) { return Filters().count(name) > 0; }
bool IsTest(const std::string& name) { return Tests().count(name) > 0; }

std::optional<Value> RunFilter(Evaluator& ev, const std::string& name, const Value& input,
                               Args& args, int line) {
  auto it = Filters().find(name);
  if (it == Filters().end()) return std::nullopt;
  return it->second(ev, input, args, line);
}

std::optional<bool> RunTest(Evaluator& ev, const std::string& name, const Value& input,
                            Args& args, int line) {
  auto it = Tests().find(name);
  if (it == Tests().end()) return std::nullopt;
  return it->second(ev, input, args, line);
}

}  // namespace slime::tokenizer::jinja
