// Internals of the Jinja interpreter (jinja.h): the Value type, the tokens, the syntax tree and
// the entry points of the lexer, parser, evaluator and built-ins. Private to src/tokenizer.
//
// Errors inside the interpreter are thrown as jinja::Error (line + message) and turned into a
// Status by Template::Parse / Template::Render; nothing throws across the module boundary.
#ifndef SLIME_TOKENIZER_JINJA_INTERNAL_H_
#define SLIME_TOKENIZER_JINJA_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace slime::tokenizer::jinja {

// A failure at a template line; the message has no line prefix.
struct Error {
  int line = 0;
  std::string message;
};
[[noreturn]] void Fail(int line, std::string message);

// ---- Values ----------------------------------------------------------------------------------

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

struct Value;
class Evaluator;
using List = std::vector<Value>;

// Positional and keyword arguments of a call, a filter or a test.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};
using Function = std::function<Value(Evaluator&, Args&, int line)>;

// A dict keeps insertion order (as Python's); keys are strings. A namespace() is a dict with
// `is_namespace` set: attributes may be assigned to it with `set ns.x = ...`.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
};

// Lists, dicts and callables are shared (as Python references are): list.append and namespace
// assignments are visible through every copy.
struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  bool is_tuple = false;  // a kList made by a tuple literal or items(): repr "(a, b)"
  int64_t i = 0;
  double f = 0;
  std::string s;  // the string; for kUndefined, why it is undefined ("'x' is undefined")
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<const Function> fn;

  static Value Undefined(std::string why);
  static Value None();
  static Value Bool(bool v);
  static Value Int(int64_t v);
  static Value Float(double v);
  static Value Str(std::string v);
  static Value MakeList(List items = {});
  static Value MakeTuple(List items);
  static Value MakeDict();
  static Value Callable(Function fn);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
};

// Python-like semantics.
bool Truthy(const Value& v);
std::string TypeName(const Value& v);    // Python's: 'str', 'int', 'NoneType', 'dict', ...
std::string ToStr(const Value& v);       // str(v); undefined → ""
std::string Repr(const Value& v);        // repr(v), used inside lists and dicts
bool Equal(const Value& a, const Value& b);
// a < b; error for types Python cannot order.
bool Less(const Value& a, const Value& b, int line);
double AsDouble(const Value& v);        // of a number
Value FromJson(const nlohmann::ordered_json& j);
nlohmann::ordered_json ToJson(const Value& v, int line);  // error for undefined / callables
// The elements a for loop visits: list items, dict keys, string characters; undefined → none.
List Iterate(const Value& v, int line);
// Error for an undefined value used where a value is needed.
void RequireDefined(const Value& v, int line);

// Python's `format % args` for %s, %r, %d, %i and %%.
std::string PercentFormat(const std::string& format, const List& args, int line);

// UTF-8 helpers: Python strings index code points.
std::vector<std::string> CodePoints(std::string_view s);
std::string PyFloatRepr(double v);

// ---- Tokens and syntax tree ------------------------------------------------------------------

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat,
                 kOp, kEnd };

struct Token {
  Tok type = Tok::kEnd;
  std::string text;  // text, name, operator, or the unescaped string literal
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

// Splits source into tokens, applying whitespace control (`-`, trim_blocks, lstrip_blocks) and
// dropping comments. Ends with a kEnd token.
std::vector<Token> Lex(std::string_view source);

enum class NodeKind {
  // Statements.
  kBody,       // kids: statements
  kText,       // str
  kOutput,     // kids[0]: expression
  kIf,         // kids: cond, body, cond, body, ... [, else body when flag]
  kFor,        // names: targets; kids: iter, body, else body|null, filter cond|null
  kSet,        // names: targets (or names[0] the namespace when str is an attribute); kids[0]
  kSetBlock,   // names[0]: target; kids[0]: body
  kMacro,      // str: name; names: parameters; kids[0]: body, kids[1+i]: default of names[i]|null
  kFilterBlock,  // kids[0]: body, kids[1]: filter expression applied to a kLiteral placeholder
  kBreak,
  kContinue,
  // Expressions.
  kLiteral,    // literal
  kName,       // str
  kAttr,       // kids[0].str
  kItem,       // kids[0][kids[1]]
  kSlice,      // kids[0][kids[1]:kids[2]:kids[3]] (null parts omitted)
  kCall,       // kids[0](kids[1..]); names[i]: keyword of kids[1+i] or ""
  kFilter,     // kids[0] | str(kids[1..]); names as kCall
  kTest,       // kids[0] is [not when flag] str(kids[1..])
  kUnary,      // str: "-", "+", "not"; kids[0]
  kBinary,     // str: operator; kids[0], kids[1]
  kTernary,    // kids: then, cond, else|null
  kList,       // kids
  kTuple,      // kids
  kDictLit,    // kids: key, value, key, value, ...
};

struct Node {
  NodeKind kind = NodeKind::kBody;
  int line = 1;
  std::string str;
  std::vector<std::string> names;
  Value literal;
  bool flag = false;
  std::vector<std::unique_ptr<Node>> kids;
};

// Parses the tokens of a template into a kBody. Throws Error.
std::unique_ptr<Node> ParseTemplate(const std::vector<Token>& tokens);

// ---- Evaluation -------------------------------------------------------------------------------

// One render: the scopes, the output and the built-ins. Lives on Render's stack.
class Evaluator {
 public:
  explicit Evaluator(const nlohmann::ordered_json& context);
  std::string Run(const Node& root);

  Value Eval(const Node& expr);
  // Calls a callable value (a macro or a global function).
  Value CallValue(const Value& callee, Args& args, int line);
  // Applies a filter / test by name (for map, select, selectattr).
  Value ApplyFilter(const std::string& name, const Value& input, Args& args, int line);
  bool ApplyTest(const std::string& name, const Value& input, Args& args, int line);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Frame = std::shared_ptr<Dict>;

  Flow Exec(const Node& stmt, std::string* out);
  Flow ExecBody(const Node& body, std::string* out);
  Flow ExecFor(const Node& stmt, std::string* out);
  void ExecSet(const Node& stmt, std::string* out);
  void DefineMacro(const Node& stmt);
  Value Lookup(const std::string& name) const;
  void Assign(const std::string& name, Value value);
  void AssignTargets(const std::vector<std::string>& names, const Value& value, int line);
  Value EvalCall(const Node& call);
  Value EvalBinary(const Node& node);
  Args EvalArgs(const Node& node, size_t first);

  std::vector<Frame> frames_;  // [0]: globals and context; back(): innermost
  int depth_ = 0;              // macro call depth
};

// Built-ins (jinja_builtins.cc). Each returns nullopt when `name` is not one.
std::optional<Value> RunFilter(Evaluator& ev, const std::string& name, const Value& input,
                               Args& args, int line);
std::optional<bool> RunTest(Evaluator& ev, const std::string& name, const Value& input,
                            Args& args, int line);
// obj.name(args) for strings, lists and dicts.
std::optional<Value> RunMethod(const Value& obj, const std::string& name, Args& args, int line);
bool IsFilter(const std::string& name);
bool IsTest(const std::string& name);
// The global functions: raise_exception, strftime_now, namespace, range, dict.
void AddGlobals(Dict* globals);

// Argument helpers: the argument at `pos` or named `name`, else `fallback` (or an error when
// fallback is nullopt, naming `what`).
Value Arg(Args& args, size_t pos, std::string_view name, std::optional<Value> fallback,
          std::string_view what, int line);

}  // namespace slime::tokenizer::jinja

#endif  // SLIME_TOKENIZER_JINJA_INTERNAL_H_
