// The evaluator of the Jinja interpreter (jinja_internal.h) and Template (jinja.h).
//
// Scopes follow Jinja: the globals and the render context share the outermost frame, which
// top-level `set` writes; every for-loop iteration gets a fresh frame (a `set` inside a loop is
// not seen after it — hence namespace()); a macro call sees the outermost frame and its own.
#include <cmath>

#include <fmt/format.h>

#include "slime/tokenizer/jinja.h"
#include "jinja_internal.h"

namespace slime::tokenizer::jinja {
namespace {

using OJson = nlohmann::ordered_json;

constexpr int kMaxMacroDepth = 100;

bool IsIntLike(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }
int64_t IntOf(const Value& v) { return v.kind == Kind::kBool ? (v.b ? 1 : 0) : v.i; }

[[noreturn]] void FailOperands(const std::string& op, const Value& a, const Value& b, int line) {
  RequireDefined(a, line);
  RequireDefined(b, line);
  Fail(line, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, TypeName(a),
                         TypeName(b)));
}

Value Arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    const bool ints = IsIntLike(a) && IsIntLike(b);
    const int64_t x = IntOf(a);
    const int64_t y = IntOf(b);
    const double dx = AsDouble(a);
    const double dy = AsDouble(b);
    if (op == "+") return ints ? Value::Int(x + y) : Value::Float(dx + dy);
    if (op == "-") return ints ? Value::Int(x - y) : Value::Float(dx - dy);
    if (op == "*") return ints ? Value::Int(x * y) : Value::Float(dx * dy);
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < y; ++k) r *= x;
        return Value::Int(r);
      }
      return Value::Float(std::pow(dx, dy));
    }
    if (dy == 0) Fail(line, op == "/" ? "division by zero" : "integer division or modulo by zero");
    if (op == "/") return Value::Float(dx / dy);
    if (op == "//") {
      if (!ints) return Value::Float(std::floor(dx / dy));
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::Int(q);
    }
    if (op == "%") {
      if (!ints) {
        double r = std::fmod(dx, dy);
        if (r != 0 && ((r < 0) != (dy < 0))) r += dy;
        return Value::Float(r);
      }
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::Int(r);
    }
  }
  if (op == "+" && a.kind == b.kind && a.kind == Kind::kString) return Value::Str(a.s + b.s);
  if (op == "+" && a.kind == b.kind && a.kind == Kind::kList) {
    List items = *a.list;
    items.insert(items.end(), b.list->begin(), b.list->end());
    return Value::MakeList(std::move(items));
  }
  if (op == "*" && (IsIntLike(a) || IsIntLike(b))) {
    const Value& seq = IsIntLike(a) ? b : a;
    const int64_t n = IsIntLike(a) ? IntOf(a) : IntOf(b);
    if (seq.kind == Kind::kString) {
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += seq.s;
      return Value::Str(std::move(out));
    }
    if (seq.kind == Kind::kList) {
      List out;
      for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
      return Value::MakeList(std::move(out));
    }
  }
  FailOperands(op, a, b, line);
}

bool Contains(const Value& container, const Value& item, int line) {
  switch (container.kind) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (item.kind != Kind::kString) {
        RequireDefined(item, line);
        Fail(line, fmt::format("'in <string>' requires string as left operand, not {}",
                               TypeName(item)));
      }
      return container.s.find(item.s) != std::string::npos;
    case Kind::kList:
      for (const Value& v : *container.list) {
        if (Equal(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      return item.kind == Kind::kString && container.dict->Find(item.s) != nullptr;
    default:
      Fail(line, fmt::format("argument of type '{}' is not iterable", TypeName(container)));
  }
}

Value GetAttr(const Value& obj, const std::string& name, int line) {
  RequireDefined(obj, line);
  if (obj.kind == Kind::kDict) {
    if (const Value* v = obj.dict->Find(name)) return *v;
    return Value::Undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  if (obj.kind == Kind::kNone) {
    return Value::Undefined(fmt::format("'None' has no attribute '{}'", name));
  }
  return Value::Undefined(fmt::format("'{} object' has no attribute '{}'", TypeName(obj), name));
}

// Python's index normalisation: negative counts from the end; nullopt when out of range.
std::optional<size_t> Index(int64_t k, size_t size) {
  if (k < 0) k += static_cast<int64_t>(size);
  if (k < 0 || k >= static_cast<int64_t>(size)) return std::nullopt;
  return static_cast<size_t>(k);
}

Value GetItem(const Value& obj, const Value& key, int line) {
  RequireDefined(obj, line);
  if (obj.kind == Kind::kDict) {
    if (key.kind == Kind::kString) {
      if (const Value* v = obj.dict->Find(key.s)) return *v;
    }
    return Value::Undefined(fmt::format("'dict object' has no attribute {}", Repr(key)));
  }
  if (IsIntLike(key) && (obj.kind == Kind::kList || obj.kind == Kind::kString)) {
    if (obj.kind == Kind::kList) {
      if (auto k = Index(IntOf(key), obj.list->size())) return (*obj.list)[*k];
    } else {
      std::vector<std::string> chars = CodePoints(obj.s);
      if (auto k = Index(IntOf(key), chars.size())) return Value::Str(chars[*k]);
    }
    return Value::Undefined(fmt::format("{} object has no element {}", TypeName(obj), IntOf(key)));
  }
  if (key.kind == Kind::kString) return GetAttr(obj, key.s, line);
  return Value::Undefined(fmt::format("'{} object' has no element {}", TypeName(obj), Repr(key)));
}

// Python's slice semantics on lists and strings (code points).
Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  RequireDefined(obj, line);
  auto bound = [&](const Value& v) -> std::optional<int64_t> {
    if (v.kind == Kind::kNone || v.is_undefined()) return std::nullopt;
    if (!IsIntLike(v)) Fail(line, "slice indices must be integers or None");
    return IntOf(v);
  };
  const int64_t st = bound(step).value_or(1);
  if (st == 0) Fail(line, "slice step cannot be zero");
  List items;
  std::vector<std::string> chars;
  if (obj.kind == Kind::kList) {
    items = *obj.list;
  } else if (obj.kind == Kind::kString) {
    chars = CodePoints(obj.s);
  } else {
    Fail(line, fmt::format("'{}' object is not subscriptable", TypeName(obj)));
  }
  const auto n = static_cast<int64_t>(obj.kind == Kind::kList ? items.size() : chars.size());
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t k = *v < 0 ? *v + n : *v;
    if (st > 0) return std::clamp<int64_t>(k, 0, n);
    return std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t a = clamp(bound(start), st > 0 ? 0 : n - 1);
  const int64_t b = clamp(bound(stop), st > 0 ? n : -1);
  List out_items;
  std::string out_str;
  for (int64_t k = a; st > 0 ? k < b : k > b; k += st) {
    if (obj.kind == Kind::kList) {
      out_items.push_back(items[static_cast<size_t>(k)]);
    } else {
      out_str += chars[static_cast<size_t>(k)];
    }
  }
  return obj.kind == Kind::kList ? Value::MakeList(std::move(out_items))
                                 : Value::Str(std::move(out_str));
}

}  // namespace

Evaluator::Evaluator(const OJson& context) {
  frames_.push_back(std::make_shared<Dict>());
  AddGlobals(frames_[0].get());
  for (auto it = context.begin(); it != context.end(); ++it) {
    frames_[0]->Set(it.key(), FromJson(it.value()));
  }
}

std::string Evaluator::Run(const Node& root) {
  std::string out;
  ExecBody(root, &out);
  return out;
}

Evaluator::Flow Evaluator::ExecBody(const Node& body, std::string* out) {
  for (const auto& stmt : body.kids) {
    const Flow flow = Exec(*stmt, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::Exec(const Node& stmt, std::string* out) {
  switch (stmt.kind) {
    case NodeKind::kBody: return ExecBody(stmt, out);
    case NodeKind::kText: out->append(stmt.str); return Flow::kNormal;
    case NodeKind::kOutput: out->append(ToStr(Eval(*stmt.kids[0]))); return Flow::kNormal;
    case NodeKind::kIf: {
      const size_t branches = (stmt.kids.size() - (stmt.flag ? 1 : 0)) / 2;
      for (size_t k = 0; k < branches; ++k) {
        if (Truthy(Eval(*stmt.kids[2 * k]))) return ExecBody(*stmt.kids[2 * k + 1], out);
      }
      return stmt.flag ? ExecBody(*stmt.kids.back(), out) : Flow::kNormal;
    }
    case NodeKind::kFor: return ExecFor(stmt, out);
    case NodeKind::kSet:
    case NodeKind::kSetBlock: ExecSet(stmt, out); return Flow::kNormal;
    case NodeKind::kMacro: DefineMacro(stmt); return Flow::kNormal;
    case NodeKind::kFilterBlock: {
      std::string inner;
      ExecBody(*stmt.kids[0], &inner);
      Value v = Value::Str(std::move(inner));
      // The filter chain was parsed over a placeholder literal: apply it from the inside out.
      std::vector<const Node*> chain;
      for (const Node* f = stmt.kids[1].get(); f->kind == NodeKind::kFilter; f = f->kids[0].get()) {
        chain.push_back(f);
      }
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        Args args = EvalArgs(**it, 1);
        v = ApplyFilter((*it)->str, v, args, (*it)->line);
      }
      out->append(ToStr(v));
      return Flow::kNormal;
    }
    case NodeKind::kBreak: return Flow::kBreak;
    case NodeKind::kContinue: return Flow::kContinue;
    default: Fail(stmt.line, "expression used as a statement");
  }
}

Evaluator::Flow Evaluator::ExecFor(const Node& stmt, std::string* out) {
  const int line = stmt.line;
  List items = Iterate(Eval(*stmt.kids[0]), line);
  const Node* cond = stmt.kids[3].get();
  if (cond != nullptr) {  // `for x in xs if cond`: filter first, so loop.* counts the kept ones
    List kept;
    frames_.push_back(std::make_shared<Dict>());
    for (const Value& item : items) {
      AssignTargets(stmt.names, item, line);
      if (Truthy(Eval(*cond))) kept.push_back(item);
    }
    frames_.pop_back();
    items = std::move(kept);
  }
  if (items.empty()) {
    return stmt.kids[2] != nullptr ? ExecBody(*stmt.kids[2], out) : Flow::kNormal;
  }
  const auto n = static_cast<int64_t>(items.size());
  frames_.push_back(nullptr);
  for (int64_t k = 0; k < n; ++k) {
    frames_.back() = std::make_shared<Dict>();
    Value loop = Value::MakeDict();
    Dict& d = *loop.dict;
    d.Set("index", Value::Int(k + 1));
    d.Set("index0", Value::Int(k));
    d.Set("revindex", Value::Int(n - k));
    d.Set("revindex0", Value::Int(n - k - 1));
    d.Set("first", Value::Bool(k == 0));
    d.Set("last", Value::Bool(k == n - 1));
    d.Set("length", Value::Int(n));
    d.Set("previtem", k > 0 ? items[k - 1] : Value::Undefined("there is no previous item"));
    d.Set("nextitem", k + 1 < n ? items[k + 1] : Value::Undefined("there is no next item"));
    d.Set("cycle", Value::Callable([k](Evaluator&, Args& args, int l) {
            if (args.positional.empty()) Fail(l, "loop.cycle() needs at least one argument");
            return args.positional[static_cast<size_t>(k) % args.positional.size()];
          }));
    frames_.back()->Set("loop", std::move(loop));
    AssignTargets(stmt.names, items[k], line);
    if (ExecBody(*stmt.kids[1], out) == Flow::kBreak) break;
  }
  frames_.pop_back();
  return Flow::kNormal;
}

void Evaluator::ExecSet(const Node& stmt, std::string* out) {
  (void)out;
  Value value;
  if (stmt.kind == NodeKind::kSetBlock) {
    std::string inner;
    ExecBody(*stmt.kids[0], &inner);
    value = Value::Str(std::move(inner));
    std::vector<const Node*> chain;
    for (const Node* f = stmt.kids[1].get(); f != nullptr && f->kind == NodeKind::kFilter;
         f = f->kids[0].get()) {
      chain.push_back(f);
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      Args args = EvalArgs(**it, 1);
      value = ApplyFilter((*it)->str, value, args, (*it)->line);
    }
  } else {
    value = Eval(*stmt.kids[0]);
  }
  if (!stmt.str.empty()) {  // set ns.attr = value
    Value ns = Lookup(stmt.names[0]);
    if (ns.kind != Kind::kDict || !ns.dict->is_namespace) {
      RequireDefined(ns, stmt.line);
      Fail(stmt.line, fmt::format("cannot assign attribute '{}' on '{}': not a namespace()",
                                  stmt.str, stmt.names[0]));
    }
    ns.dict->Set(stmt.str, std::move(value));
    return;
  }
  AssignTargets(stmt.names, value, stmt.line);
}

void Evaluator::AssignTargets(const std::vector<std::string>& names, const Value& value, int line) {
  if (names.size() == 1) {
    Assign(names[0], value);
    return;
  }
  List parts = Iterate(value, line);
  if (parts.size() != names.size()) {
    Fail(line, fmt::format("cannot unpack {} values into {} names", parts.size(), names.size()));
  }
  for (size_t k = 0; k < names.size(); ++k) Assign(names[k], parts[k]);
}

void Evaluator::Assign(const std::string& name, Value value) {
  frames_.back()->Set(name, std::move(value));
}

Value Evaluator::Lookup(const std::string& name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    if (const Value* v = (*it)->Find(name)) return *v;
  }
  return Value::Undefined(fmt::format("'{}' is undefined", name));
}

void Evaluator::DefineMacro(const Node& stmt) {
  const Node* node = &stmt;
  Assign(stmt.str, Value::Callable([node](Evaluator& ev, Args& args, int line) {
           if (ev.depth_ >= kMaxMacroDepth) {
             Fail(line, fmt::format("macro '{}' nests deeper than {} calls", node->str,
                                    kMaxMacroDepth));
           }
           const size_t n = node->names.size();
           if (args.positional.size() > n) {
             Fail(line, fmt::format("macro '{}' takes not more than {} argument(s)", node->str, n));
           }
           std::vector<Frame> saved = {ev.frames_[0], std::make_shared<Dict>()};
           std::swap(saved, ev.frames_);
           ++ev.depth_;
           for (size_t k = 0; k < n; ++k) {
             const std::string& param = node->names[k];
             Value v;
             if (k < args.positional.size()) {
               v = args.positional[k];
             } else if (auto it = std::find_if(args.named.begin(), args.named.end(),
                                               [&](const auto& kv) { return kv.first == param; });
                        it != args.named.end()) {
               v = it->second;
             } else if (node->kids[1 + k] != nullptr) {
               v = ev.Eval(*node->kids[1 + k]);
             } else {
               v = Value::Undefined(fmt::format("parameter '{}' was not provided", param));
             }
             ev.Assign(param, std::move(v));
           }
           for (const auto& [key, value] : args.named) {
             if (std::find(node->names.begin(), node->names.end(), key) == node->names.end()) {
               Fail(line, fmt::format("macro '{}' takes no keyword argument '{}'", node->str, key));
             }
           }
           std::string out;
           ev.ExecBody(*node->kids[0], &out);
           --ev.depth_;
           std::swap(saved, ev.frames_);
           return Value::Str(std::move(out));
         }));
}

Args Evaluator::EvalArgs(const Node& node, size_t first) {
  Args args;
  for (size_t k = first; k < node.kids.size(); ++k) {
    const std::string& name = node.names[k - first];
    Value v = Eval(*node.kids[k]);
    if (name.empty()) {
      args.positional.push_back(std::move(v));
    } else {
      args.named.emplace_back(name, std::move(v));
    }
  }
  return args;
}

Value Evaluator::CallValue(const Value& callee, Args& args, int line) {
  RequireDefined(callee, line);
  if (callee.kind != Kind::kCallable) {
    Fail(line, fmt::format("'{}' object is not callable", TypeName(callee)));
  }
  return (*callee.fn)(*this, args, line);
}

Value Evaluator::EvalCall(const Node& call) {
  const Node& callee = *call.kids[0];
  if (callee.kind == NodeKind::kAttr) {  // a method, or a callable stored in a dict
    Value obj = Eval(*callee.kids[0]);
    RequireDefined(obj, call.line);
    Args args = EvalArgs(call, 1);
    if (obj.kind == Kind::kDict) {
      const Value* member = obj.dict->Find(callee.str);
      if (member != nullptr && member->kind == Kind::kCallable) {
        return CallValue(*member, args, call.line);
      }
    }
    if (std::optional<Value> r = RunMethod(obj, callee.str, args, call.line)) return *r;
    Value member = GetAttr(obj, callee.str, call.line);
    return CallValue(member, args, call.line);
  }
  Value fn = Eval(callee);
  Args args = EvalArgs(call, 1);
  return CallValue(fn, args, call.line);
}

Value Evaluator::ApplyFilter(const std::string& name, const Value& input, Args& args, int line) {
  std::optional<Value> r = RunFilter(*this, name, input, args, line);
  if (!r) Fail(line, fmt::format("unknown filter '{}'", name));
  return *r;
}

bool Evaluator::ApplyTest(const std::string& name, const Value& input, Args& args, int line) {
  std::optional<bool> r = RunTest(*this, name, input, args, line);
  if (!r) Fail(line, fmt::format("unknown test '{}'", name));
  return *r;
}

Value Evaluator::EvalBinary(const Node& node) {
  const std::string& op = node.str;
  const int line = node.line;
  Value a = Eval(*node.kids[0]);
  if (op == "and") return Truthy(a) ? Eval(*node.kids[1]) : a;
  if (op == "or") return Truthy(a) ? a : Eval(*node.kids[1]);
  Value b = Eval(*node.kids[1]);
  if (op == "==") return Value::Bool(Equal(a, b));
  if (op == "!=") return Value::Bool(!Equal(a, b));
  if (op == "<") return Value::Bool(Less(a, b, line));
  if (op == ">") return Value::Bool(Less(b, a, line));
  if (op == "<=") return Value::Bool(!Less(b, a, line));
  if (op == ">=") return Value::Bool(!Less(a, b, line));
  if (op == "in") return Value::Bool(Contains(b, a, line));
  if (op == "not in") return Value::Bool(!Contains(b, a, line));
  if (op == "~") return Value::Str(ToStr(a) + ToStr(b));
  if (a.kind == Kind::kString && op == "%") {
    return Value::Str(PercentFormat(a.s, b.kind == Kind::kList && b.is_tuple ? *b.list : List{b}, line));
  }
  return Arithmetic(op, a, b, line);
}

Value Evaluator::Eval(const Node& expr) {
  const int line = expr.line;
  switch (expr.kind) {
    case NodeKind::kLiteral: return expr.literal;
    case NodeKind::kName: return Lookup(expr.str);
    case NodeKind::kAttr: return GetAttr(Eval(*expr.kids[0]), expr.str, line);
    case NodeKind::kItem: return GetItem(Eval(*expr.kids[0]), Eval(*expr.kids[1]), line);
    case NodeKind::kSlice: {
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        if (expr.kids[1 + k] != nullptr) parts[k] = Eval(*expr.kids[1 + k]);
      }
      return Slice(Eval(*expr.kids[0]), parts[0], parts[1], parts[2], line);
    }
    case NodeKind::kCall: return EvalCall(expr);
    case NodeKind::kFilter: {
      Value input = Eval(*expr.kids[0]);
      Args args = EvalArgs(expr, 1);
      return ApplyFilter(expr.str, input, args, line);
    }
    case NodeKind::kTest: {
      Value input = Eval(*expr.kids[0]);
      Args args = EvalArgs(expr, 1);
      return Value::Bool(ApplyTest(expr.str, input, args, line) != expr.flag);
    }
    case NodeKind::kUnary: {
      Value v = Eval(*expr.kids[0]);
      if (expr.str == "not") return Value::Bool(!Truthy(v));
      if (!v.is_number()) {
        RequireDefined(v, line);
        Fail(line, fmt::format("bad operand type for unary {}: '{}'", expr.str, TypeName(v)));
      }
      if (expr.str == "+") return IsIntLike(v) ? Value::Int(IntOf(v)) : v;
      return IsIntLike(v) ? Value::Int(-IntOf(v)) : Value::Float(-v.f);
    }
    case NodeKind::kBinary: return EvalBinary(expr);
    case NodeKind::kTernary:
      if (Truthy(Eval(*expr.kids[1]))) return Eval(*expr.kids[0]);
      return expr.kids[2] != nullptr ? Eval(*expr.kids[2])
                                     : Value::Undefined("the inline if had no else");
    case NodeKind::kList:
    case NodeKind::kTuple: {
      List items;
      for (const auto& kid : expr.kids) items.push_back(Eval(*kid));
      return expr.kind == NodeKind::kTuple ? Value::MakeTuple(std::move(items))
                                           : Value::MakeList(std::move(items));
    }
    case NodeKind::kDictLit: {
      Value d = Value::MakeDict();
      for (size_t k = 0; k + 1 < expr.kids.size(); k += 2) {
        Value key = Eval(*expr.kids[k]);
        if (key.kind != Kind::kString) Fail(line, "dict keys must be strings");
        d.dict->Set(key.s, Eval(*expr.kids[k + 1]));
      }
      return d;
    }
    default: Fail(line, "statement used as an expression");
  }
}

// ---- Template --------------------------------------------------------------------------------

StatusOr<Template> Template::Parse(std::string_view source, std::string name) {
  Template t;
  t.name_ = std::move(name);
  try {
    t.root_ = ParseTemplate(Lex(source));
  } catch (const Error& e) {
    return absl::InvalidArgumentError(fmt::format("{} line {}: {}", t.name_, e.line, e.message));
  }
  return t;
}

StatusOr<std::string> Template::Render(const OJson& context) const {
  if (!context.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: the render context must be an object, "
                                                  "got {}", name_, context.type_name()));
  }
  try {
    Evaluator ev(context);
    return root_ == nullptr ? std::string() : ev.Run(*root_);
  } catch (const Error& e) {
    return absl::InvalidArgumentError(fmt::format("{} line {}: {}", name_, e.line, e.message));
  }
}

}  // namespace slime::tokenizer::jinja
