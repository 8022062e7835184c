// Values of the Jinja interpreter with Python's semantics (truthiness, str/repr, equality,
// ordering) and Python's json.dumps (jinja.h, jinja_internal.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "slime/tokenizer/jinja.h"
#include "jinja_internal.h"

namespace slime::tokenizer::jinja {

using OJson = nlohmann::ordered_json;

void Fail(int line, std::string message) { throw Error{line, std::move(message)}; }

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string why) {
  Value v;
  v.s = std::move(why);
  return v;
}
Value Value::None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.b = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.i = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = f;
  return v;
}
Value Value::Str(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(s);
  return v;
}
Value Value::MakeList(List items) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::MakeTuple(List items) {
  Value v = MakeList(std::move(items));
  v.is_tuple = true;
  return v;
}
Value Value::MakeDict() {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::Callable(Function fn) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<const Function>(std::move(fn));
  return v;
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0;
    case Kind::kString: return !v.s.empty();
    case Kind::kList: return !v.list->empty();
    case Kind::kDict: return v.dict->is_namespace || !v.dict->items.empty();
    case Kind::kCallable: return true;
  }
  return false;
}

std::string TypeName(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return v.dict->is_namespace ? "Namespace" : "dict";
    case Kind::kCallable: return "function";
  }
  return "?";
}

// Python's repr(float): shortest round-trip digits; positional notation when the decimal
// exponent is in [-4, 16), scientific ("1e+16", "1.5e-05") otherwise.
std::string PyFloatRepr(double v) {
  if (v != v) return "nan";
  if (v == std::numeric_limits<double>::infinity()) return "inf";
  if (v == -std::numeric_limits<double>::infinity()) return "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return sign + out;
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  return fmt::format("{}{}e{}{:02d}", sign, mantissa, exp < 0 ? '-' : '+', std::abs(exp));
}

std::string ToStr(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return PyFloatRepr(v.f);
    case Kind::kString: return v.s;
    default: return Repr(v);
  }
}

namespace {

std::string PyStrRepr(std::string_view s) {
  const bool use_double = s.find('\'') != std::string_view::npos &&
                          s.find('"') == std::string_view::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == quote) {
          out += '\\';
          out += c;
        } else if (static_cast<uint8_t>(c) < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Repr(const Value& v) {
  switch (v.kind) {
    case Kind::kString: return PyStrRepr(v.s);
    case Kind::kList: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += ", ";
        out += Repr((*v.list)[k]);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, value] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += PyStrRepr(key) + ": " + Repr(value);
      }
      return out + (v.dict->is_namespace ? "}>" : "}");
    }
    case Kind::kCallable: return "<function>";
    default: return ToStr(v);
  }
}

double AsDouble(const Value& v) {
  switch (v.kind) {
    case Kind::kBool: return v.b ? 1 : 0;
    case Kind::kInt: return static_cast<double>(v.i);
    case Kind::kFloat: return v.f;
    default: return 0;
  }
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      return (a.kind == Kind::kBool ? a.b : a.i) == (b.kind == Kind::kBool ? b.b : b.i);
    }
    return AsDouble(a) == AsDouble(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.s == b.s;
    case Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict == b.dict) return true;
      if (a.dict->is_namespace || b.dict->is_namespace) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, value] : a.dict->items) {
        const Value* other = b.dict->Find(key);
        if (other == nullptr || !Equal(value, *other)) return false;
      }
      return true;
    }
    case Kind::kCallable: return a.fn == b.fn;
    default: return false;
  }
}

bool Less(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) return AsDouble(a) < AsDouble(b);
  if (a.kind == Kind::kString && b.kind == Kind::kString) return a.s < b.s;
  if (a.kind == Kind::kList && b.kind == Kind::kList) {
    const List& x = *a.list;
    const List& y = *b.list;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!Equal(x[k], y[k])) return Less(x[k], y[k], line);
    }
    return x.size() < y.size();
  }
  RequireDefined(a, line);
  RequireDefined(b, line);
  Fail(line, fmt::format("'<' not supported between instances of '{}' and '{}'", TypeName(a),
                         TypeName(b)));
}

void RequireDefined(const Value& v, int line) {
  if (v.is_undefined()) Fail(line, v.s.empty() ? "value is undefined" : v.s);
}

Value FromJson(const OJson& j) {
  switch (j.type()) {
    case OJson::value_t::null: return Value::None();
    case OJson::value_t::boolean: return Value::Bool(j.get<bool>());
    case OJson::value_t::number_integer: return Value::Int(j.get<int64_t>());
    case OJson::value_t::number_unsigned: return Value::Int(static_cast<int64_t>(j.get<uint64_t>()));
    case OJson::value_t::number_float: return Value::Float(j.get<double>());
    case OJson::value_t::string: return Value::Str(j.get<std::string>());
    case OJson::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const OJson& item : j) items.push_back(FromJson(item));
      return Value::MakeList(std::move(items));
    }
    case OJson::value_t::object: {
      Value d = Value::MakeDict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.dict->items.emplace_back(it.key(), FromJson(it.value()));
      }
      return d;
    }
    default: return Value::None();
  }
}

OJson ToJson(const Value& v, int line) {
  switch (v.kind) {
    case Kind::kNone: return nullptr;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i;
    case Kind::kFloat: return v.f;
    case Kind::kString: return v.s;
    case Kind::kList: {
      OJson out = OJson::array();
      for (const Value& item : *v.list) out.push_back(ToJson(item, line));
      return out;
    }
    case Kind::kDict: {
      if (v.dict->is_namespace) break;
      OJson out = OJson::object();
      for (const auto& [key, value] : v.dict->items) out[key] = ToJson(value, line);
      return out;
    }
    case Kind::kUndefined: RequireDefined(v, line); break;
    default: break;
  }
  Fail(line, fmt::format("Object of type {} is not JSON serializable", TypeName(v)));
}

std::string PercentFormat(const std::string& format, const List& args, int line) {
  std::string out;
  size_t next = 0;
  for (size_t k = 0; k < format.size(); ++k) {
    if (format[k] != '%') {
      out += format[k];
      continue;
    }
    if (++k >= format.size()) Fail(line, "incomplete format");
    const char spec = format[k];
    if (spec == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) Fail(line, "not enough arguments for format string");
    const Value& v = args[next++];
    switch (spec) {
      case 's': out += ToStr(v); break;
      case 'r': out += Repr(v); break;
      case 'd':
      case 'i':
        if (!v.is_number()) Fail(line, fmt::format("%{} format: a number is required, not {}", spec, TypeName(v)));
        out += std::to_string(v.kind == Kind::kFloat ? static_cast<int64_t>(v.f)
                                                     : (v.kind == Kind::kBool ? v.b : v.i));
        break;
      default: Fail(line, fmt::format("unsupported format character '{}'", spec));
    }
  }
  if (next < args.size()) Fail(line, "not all arguments converted during string formatting");
  return out;
}

std::vector<std::string> CodePoints(std::string_view s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const auto c = static_cast<uint8_t>(s[k]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
    n = std::min(n, s.size() - k);
    out.emplace_back(s.substr(k, n));
    k += n;
  }
  return out;
}

List Iterate(const Value& v, int line) {
  switch (v.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList: return *v.list;
    case Kind::kDict: {
      List keys;
      for (const auto& item : v.dict->items) keys.push_back(Value::Str(item.first));
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (std::string& c : CodePoints(v.s)) chars.push_back(Value::Str(std::move(c)));
      return chars;
    }
    default: Fail(line, fmt::format("'{}' object is not iterable", TypeName(v)));
  }
}

// ---- json.dumps ------------------------------------------------------------------------------

namespace {

void AppendCodeUnitEscape(uint32_t unit, std::string* out) {
  out->append(fmt::format("\\u{:04x}", unit));
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    switch (c) {
      case '"': out->append("\\\""); continue;
      case '\\': out->append("\\\\"); continue;
      case '\n': out->append("\\n"); continue;
      case '\r': out->append("\\r"); continue;
      case '\t': out->append("\\t"); continue;
      case '\b': out->append("\\b"); continue;
      case '\f': out->append("\\f"); continue;
      default: break;
    }
    const auto u = static_cast<uint8_t>(c);
    if (u < 0x20) {
      AppendCodeUnitEscape(u, out);
    } else if (u < 0x80 || !ensure_ascii) {
      out->push_back(c);
    } else {  // decode one UTF-8 sequence and escape it as UTF-16 code units
      const size_t n = (u >> 5) == 0x6 ? 2 : (u >> 4) == 0xe ? 3 : 4;
      uint32_t cp = u & (n == 2 ? 0x1f : n == 3 ? 0x0f : 0x07);
      for (size_t m = 1; m < n && k + m < s.size(); ++m) cp = (cp << 6) | (s[k + m] & 0x3f);
      k += n - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        AppendCodeUnitEscape(0xd800 + (cp >> 10), out);
        AppendCodeUnitEscape(0xdc00 + (cp & 0x3ff), out);
      } else {
        AppendCodeUnitEscape(cp, out);
      }
    }
  }
  out->push_back('"');
}

void Dump(const OJson& v, const JsonDumpsOptions& o, int level, std::string* out) {
  const std::string& item_sep =
      !o.item_separator.empty() ? o.item_separator : (o.indent < 0 ? ", " : ",");
  const std::string key_sep = !o.key_separator.empty() ? o.key_separator : ": ";
  auto newline = [&](int lvl) {
    if (o.indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(o.indent * lvl), ' ');
  };
  switch (v.type()) {
    case OJson::value_t::null: out->append("null"); return;
    case OJson::value_t::boolean: out->append(v.get<bool>() ? "true" : "false"); return;
    case OJson::value_t::number_integer: out->append(std::to_string(v.get<int64_t>())); return;
    case OJson::value_t::number_unsigned: out->append(std::to_string(v.get<uint64_t>())); return;
    case OJson::value_t::number_float: {
      const double d = v.get<double>();
      out->append(d != d ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                                                 : PyFloatRepr(d));
      return;
    }
    case OJson::value_t::string:
      AppendJsonString(v.get_ref<const std::string&>(), o.ensure_ascii, out);
      return;
    case OJson::value_t::array: {
      if (v.empty()) {
        out->append("[]");
        return;
      }
      out->push_back('[');
      for (size_t k = 0; k < v.size(); ++k) {
        if (k > 0) out->append(item_sep);
        newline(level + 1);
        Dump(v[k], o, level + 1, out);
      }
      newline(level);
      out->push_back(']');
      return;
    }
    case OJson::value_t::object: {
      if (v.empty()) {
        out->append("{}");
        return;
      }
      std::vector<std::string> keys;
      for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(it.key());
      if (o.sort_keys) std::sort(keys.begin(), keys.end());
      out->push_back('{');
      for (size_t k = 0; k < keys.size(); ++k) {
        if (k > 0) out->append(item_sep);
        newline(level + 1);
        AppendJsonString(keys[k], o.ensure_ascii, out);
        out->append(key_sep);
        Dump(v.at(keys[k]), o, level + 1, out);
      }
      newline(level);
      out->push_back('}');
      return;
    }
    default: out->append("null"); return;  // binary / discarded: not produced by parsing
  }
}

}  // namespace

std::string PyJsonDumps(const OJson& value, const JsonDumpsOptions& options) {
  std::string out;
  Dump(value, options, 0, &out);
  return out;
}

}  // namespace slime::tokenizer::jinja
