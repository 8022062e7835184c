// The parser of the Jinja interpreter (jinja_internal.h): tokens → syntax tree, by recursive
// descent. Expression precedence, loosest first, as Jinja's:
//   x if c else y  →  or  →  and  →  not  →  comparisons (== != < > <= >= in, not in)
//   →  + -  →  ~  →  * / // %  →  **  →  unary - +  →  primary with .attr [item] (call),
//   then | filters and `is` tests (which bind tighter than everything but the primary).
#include <set>

#include <fmt/format.h>

#include "jinja_internal.h"

namespace slime::tokenizer::jinja {
namespace {

using NodePtr = std::unique_ptr<Node>;

NodePtr MakeNode(NodeKind kind, int line) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  NodePtr Run() {
    NodePtr body = ParseBody({}, "");
    if (Peek().type != Tok::kEnd) Fail(Peek().line, "unexpected tag");
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& Next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kName && Peek(ahead).text == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    ++i_;
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    ++i_;
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Tok::kEnd: return "end of template";
      case Tok::kVarEnd: return "'}}'";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kText: return "text";
      case Tok::kString: return "a string";
      default: return fmt::format("'{}'", t.text);
    }
  }
  void ExpectOp(std::string_view op) {
    if (!SkipOp(op)) Fail(Peek().line, fmt::format("expected '{}', got {}", op, Describe(Peek())));
  }
  std::string ExpectName() {
    if (Peek().type != Tok::kName) Fail(Peek().line, fmt::format("expected a name, got {}", Describe(Peek())));
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Peek().type != Tok::kBlockEnd) {
      Fail(Peek().line, fmt::format("expected '%}}', got {}", Describe(Peek())));
    }
    ++i_;
  }

  // ---- Statements ----------------------------------------------------------------------------

  // Statements until a `{% name %}` with name in `ends` (left unconsumed) or the end.
  NodePtr ParseBody(const std::set<std::string>& ends, const std::string& opener, int open_line = 0) {
    NodePtr body = MakeNode(NodeKind::kBody, Peek().line);
    while (true) {
      const Token& t = Peek();
      if (t.type == Tok::kEnd) {
        if (!ends.empty()) Fail(open_line, fmt::format("'{}' is never closed (expected '{}')", opener, *ends.rbegin()));
        return body;
      }
      if (t.type == Tok::kText) {
        NodePtr text = MakeNode(NodeKind::kText, t.line);
        text->str = Next().text;
        body->kids.push_back(std::move(text));
      } else if (t.type == Tok::kVarBegin) {
        Next();
        NodePtr out = MakeNode(NodeKind::kOutput, t.line);
        out->kids.push_back(ParseTuple());
        if (Peek().type != Tok::kVarEnd) Fail(Peek().line, fmt::format("expected '}}}}', got {}", Describe(Peek())));
        Next();
        body->kids.push_back(std::move(out));
      } else if (t.type == Tok::kBlockBegin) {
        if (Peek(1).type == Tok::kName && ends.count(Peek(1).text) > 0) return body;
        Next();
        body->kids.push_back(ParseStatement(ends, opener));
      } else {
        Fail(t.line, fmt::format("unexpected {}", Describe(t)));
      }
    }
  }

  NodePtr ParseStatement(const std::set<std::string>& ends, const std::string& opener) {
    const Token& kw = Peek();
    if (kw.type != Tok::kName) Fail(kw.line, fmt::format("expected a statement, got {}", Describe(kw)));
    const std::string name = Next().text;
    if (name == "if") return ParseIf(kw.line);
    if (name == "for") return ParseFor(kw.line);
    if (name == "set") return ParseSet(kw.line);
    if (name == "macro") return ParseMacro(kw.line);
    if (name == "filter") return ParseFilterBlock(kw.line);
    if (name == "generation") {  // transformers' assistant-mask marker: renders its body
      ExpectBlockEnd();
      NodePtr body = ParseBody({"endgeneration"}, "generation", kw.line);
      EndTag();
      return body;
    }
    if (name == "break" || name == "continue") {
      ExpectBlockEnd();
      return MakeNode(name == "break" ? NodeKind::kBreak : NodeKind::kContinue, kw.line);
    }
    if (name.starts_with("end") || name == "elif" || name == "else") {
      Fail(kw.line, opener.empty() ? fmt::format("unexpected '{}'", name)
                                   : fmt::format("unexpected '{}' inside '{}'", name, opener));
    }
    Fail(kw.line, fmt::format("unknown statement '{}'", name));
  }

  void EndTag() {  // consumes `{% endxxx %}` (the parser stopped before it)
    Next();
    Next();
    ExpectBlockEnd();
  }

  NodePtr ParseIf(int line) {
    NodePtr node = MakeNode(NodeKind::kIf, line);
    node->kids.push_back(ParseTuple());
    ExpectBlockEnd();
    while (true) {
      node->kids.push_back(ParseBody({"elif", "else", "endif"}, "if", line));
      Next();  // {%
      const std::string tag = Next().text;
      if (tag == "elif") {
        node->kids.push_back(ParseTuple());
        ExpectBlockEnd();
        continue;
      }
      ExpectBlockEnd();
      if (tag == "else") {
        node->flag = true;
        node->kids.push_back(ParseBody({"endif"}, "if", line));
        EndTag();
      }
      return node;
    }
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = SkipOp("(");
    do {
      names.push_back(ExpectName());
    } while (SkipOp(","));
    if (paren) ExpectOp(")");
    return names;
  }

  NodePtr ParseFor(int line) {
    NodePtr node = MakeNode(NodeKind::kFor, line);
    node->names = ParseTargets();
    if (!SkipName("in")) Fail(Peek().line, fmt::format("expected 'in' in 'for', got {}", Describe(Peek())));
    node->kids.push_back(ParseTupleNoCond());
    NodePtr cond;
    if (SkipName("if")) cond = ParseExpression();
    if (IsName("recursive")) Fail(Peek().line, "recursive for loops are not supported");
    ExpectBlockEnd();
    node->kids.push_back(ParseBody({"else", "endfor"}, "for", line));
    NodePtr else_body;
    if (IsName("else", 1)) {
      Next();
      Next();
      ExpectBlockEnd();
      else_body = ParseBody({"endfor"}, "for", line);
    }
    EndTag();
    node->kids.push_back(std::move(else_body));
    node->kids.push_back(std::move(cond));
    return node;
  }

  NodePtr ParseSet(int line) {
    std::vector<std::string> names = ParseTargets();
    std::string attr;
    if (names.size() == 1 && SkipOp(".")) attr = ExpectName();
    if (SkipOp("=")) {
      NodePtr node = MakeNode(NodeKind::kSet, line);
      node->names = std::move(names);
      node->str = std::move(attr);
      node->kids.push_back(ParseTuple());
      ExpectBlockEnd();
      return node;
    }
    if (!attr.empty() || names.size() != 1) Fail(line, "expected '=' in 'set'");
    NodePtr node = MakeNode(NodeKind::kSetBlock, line);
    node->names = std::move(names);
    NodePtr filters;
    if (IsOp("|")) filters = ParseFilters(MakeNode(NodeKind::kLiteral, line));
    ExpectBlockEnd();
    node->kids.push_back(ParseBody({"endset"}, "set", line));
    EndTag();
    node->kids.push_back(std::move(filters));
    return node;
  }

  NodePtr ParseMacro(int line) {
    NodePtr node = MakeNode(NodeKind::kMacro, line);
    node->str = ExpectName();
    node->kids.emplace_back();  // the body, below
    ExpectOp("(");
    while (!SkipOp(")")) {
      if (!node->names.empty()) ExpectOp(",");
      if (SkipOp(")")) break;
      node->names.push_back(ExpectName());
      node->kids.push_back(SkipOp("=") ? ParseExpression() : nullptr);
    }
    ExpectBlockEnd();
    node->kids[0] = ParseBody({"endmacro"}, "macro", line);
    EndTag();
    return node;
  }

  NodePtr ParseFilterBlock(int line) {
    NodePtr node = MakeNode(NodeKind::kFilterBlock, line);
    NodePtr filters = ParseFilters(MakeNode(NodeKind::kLiteral, line), /*first_bar=*/false);
    ExpectBlockEnd();
    node->kids.push_back(ParseBody({"endfilter"}, "filter", line));
    EndTag();
    node->kids.push_back(std::move(filters));
    return node;
  }

  // ---- Expressions ---------------------------------------------------------------------------

  // An expression, or a tuple of them without parentheses ("a, b").
  NodePtr ParseTuple() {
    const int line = Peek().line;
    NodePtr first = ParseExpression();
    if (!IsOp(",")) return first;
    NodePtr tuple = MakeNode(NodeKind::kTuple, line);
    tuple->kids.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Peek().type == Tok::kVarEnd || Peek().type == Tok::kBlockEnd) break;
      tuple->kids.push_back(ParseExpression());
    }
    return tuple;
  }

  NodePtr ParseTupleNoCond() {  // a for loop's iterable: `if` starts its filter
    const int line = Peek().line;
    NodePtr first = ParseOr();
    if (!IsOp(",")) return first;
    NodePtr tuple = MakeNode(NodeKind::kTuple, line);
    tuple->kids.push_back(std::move(first));
    while (SkipOp(",")) tuple->kids.push_back(ParseOr());
    return tuple;
  }

  NodePtr ParseExpression() {
    NodePtr value = ParseOr();
    while (IsName("if")) {
      const int line = Next().line;
      NodePtr node = MakeNode(NodeKind::kTernary, line);
      node->kids.push_back(std::move(value));
      node->kids.push_back(ParseOr());
      node->kids.push_back(SkipName("else") ? ParseExpression() : nullptr);
      value = std::move(node);
    }
    return value;
  }

  NodePtr Binary(std::string op, NodePtr a, NodePtr b, int line) {
    NodePtr node = MakeNode(NodeKind::kBinary, line);
    node->str = std::move(op);
    node->kids.push_back(std::move(a));
    node->kids.push_back(std::move(b));
    return node;
  }

  NodePtr ParseOr() {
    NodePtr left = ParseAnd();
    while (IsName("or")) {
      const int line = Next().line;
      left = Binary("or", std::move(left), ParseAnd(), line);
    }
    return left;
  }

  NodePtr ParseAnd() {
    NodePtr left = ParseNot();
    while (IsName("and")) {
      const int line = Next().line;
      left = Binary("and", std::move(left), ParseNot(), line);
    }
    return left;
  }

  NodePtr ParseNot() {
    if (IsName("not")) {
      NodePtr node = MakeNode(NodeKind::kUnary, Next().line);
      node->str = "not";
      node->kids.push_back(ParseNot());
      return node;
    }
    return ParseCompare();
  }

  NodePtr ParseCompare() {
    NodePtr left = ParseMath1();
    while (true) {
      const int line = Peek().line;
      std::string op;
      if (Peek().type == Tok::kOp && (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") ||
                                      IsOp("<=") || IsOp(">="))) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        return left;
      }
      left = Binary(op, std::move(left), ParseMath1(), line);
    }
  }

  NodePtr ParseMath1() {
    NodePtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& op = Next();
      left = Binary(op.text, std::move(left), ParseConcat(), op.line);
    }
    return left;
  }

  NodePtr ParseConcat() {
    NodePtr left = ParseMath2();
    while (IsOp("~")) {
      const int line = Next().line;
      left = Binary("~", std::move(left), ParseMath2(), line);
    }
    return left;
  }

  NodePtr ParseMath2() {
    NodePtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& op = Next();
      left = Binary(op.text, std::move(left), ParsePow(), op.line);
    }
    return left;
  }

  NodePtr ParsePow() {
    NodePtr left = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Next().line;
      left = Binary("**", std::move(left), ParseUnary(true), line);
    }
    return left;
  }

  NodePtr ParseUnary(bool with_filters) {
    NodePtr node;
    if (IsOp("-") || IsOp("+")) {
      node = MakeNode(NodeKind::kUnary, Peek().line);
      node->str = Next().text;
      node->kids.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filters) node = ParseFilters(std::move(node));
    return node;
  }

  NodePtr ParsePrimary() {
    const Token& t = Next();
    NodePtr node = MakeNode(NodeKind::kLiteral, t.line);
    switch (t.type) {
      case Tok::kString: {
        std::string s = t.text;
        while (Peek().type == Tok::kString) s += Next().text;  // adjacent literals concatenate
        node->literal = Value::Str(std::move(s));
        return node;
      }
      case Tok::kInt: node->literal = Value::Int(t.int_value); return node;
      case Tok::kFloat: node->literal = Value::Float(t.float_value); return node;
      case Tok::kName:
        if (t.text == "true" || t.text == "True") {
          node->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          node->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          node->literal = Value::None();
        } else {
          node->kind = NodeKind::kName;
          node->str = t.text;
        }
        return node;
      case Tok::kOp:
        if (t.text == "(") return ParseParen(t.line);
        if (t.text == "[") return ParseSequence(NodeKind::kList, "]", t.line);
        if (t.text == "{") return ParseDict(t.line);
        break;
      default: break;
    }
    Fail(t.line, fmt::format("unexpected {} in expression", Describe(t)));
  }

  NodePtr ParseParen(int line) {
    if (SkipOp(")")) return MakeNode(NodeKind::kTuple, line);
    NodePtr first = ParseExpression();
    if (SkipOp(")")) return first;
    NodePtr tuple = MakeNode(NodeKind::kTuple, line);
    tuple->kids.push_back(std::move(first));
    while (SkipOp(",")) {
      if (IsOp(")")) break;
      tuple->kids.push_back(ParseExpression());
    }
    ExpectOp(")");
    return tuple;
  }

  NodePtr ParseSequence(NodeKind kind, std::string_view close, int line) {
    NodePtr node = MakeNode(kind, line);
    while (!SkipOp(close)) {
      if (!node->kids.empty()) ExpectOp(",");
      if (SkipOp(close)) break;
      node->kids.push_back(ParseExpression());
    }
    return node;
  }

  NodePtr ParseDict(int line) {
    NodePtr node = MakeNode(NodeKind::kDictLit, line);
    while (!SkipOp("}")) {
      if (!node->kids.empty()) ExpectOp(",");
      if (SkipOp("}")) break;
      node->kids.push_back(ParseExpression());
      ExpectOp(":");
      node->kids.push_back(ParseExpression());
    }
    return node;
  }

  NodePtr ParsePostfix(NodePtr node) {
    while (true) {
      const int line = Peek().line;
      if (SkipOp(".")) {
        NodePtr attr = MakeNode(NodeKind::kAttr, line);
        if (Peek().type == Tok::kInt) {  // foo.0 is foo[0]
          attr->kind = NodeKind::kItem;
          attr->kids.push_back(std::move(node));
          attr->kids.push_back(ParsePrimary());
        } else {
          attr->str = ExpectName();
          attr->kids.push_back(std::move(node));
        }
        node = std::move(attr);
      } else if (SkipOp("[")) {
        node = ParseSubscript(std::move(node), line);
      } else if (IsOp("(")) {
        Next();
        NodePtr call = MakeNode(NodeKind::kCall, line);
        call->kids.push_back(std::move(node));
        ParseArgs(call.get());
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  // After `[`: an index or a slice a:b:c with optional parts.
  NodePtr ParseSubscript(NodePtr obj, int line) {
    NodePtr parts[3];
    int colons = 0;
    while (!IsOp("]")) {
      if (SkipOp(":")) {
        if (++colons > 2) Fail(line, "too many ':' in a slice");
        continue;
      }
      if (parts[colons]) Fail(Peek().line, fmt::format("unexpected {} in subscript", Describe(Peek())));
      parts[colons] = ParseExpression();
    }
    ExpectOp("]");
    NodePtr node = MakeNode(colons == 0 ? NodeKind::kItem : NodeKind::kSlice, line);
    node->kids.push_back(std::move(obj));
    if (colons == 0) {
      if (!parts[0]) Fail(line, "empty subscript");
      node->kids.push_back(std::move(parts[0]));
    } else {
      for (NodePtr& p : parts) node->kids.push_back(std::move(p));
    }
    return node;
  }

  // After `(`: positional and keyword arguments up to `)`, appended to node->kids / names.
  void ParseArgs(Node* node) {
    while (!SkipOp(")")) {
      if (node->kids.size() > 1) ExpectOp(",");
      if (SkipOp(")")) break;
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        node->names.push_back(Next().text);
        Next();
      } else {
        node->names.emplace_back();
      }
      node->kids.push_back(ParseExpression());
    }
  }

  // `| name(args)` filters and `is [not] name args` tests after a value.
  NodePtr ParseFilters(NodePtr node, bool first_bar = true) {
    bool need_bar = first_bar;
    while (true) {
      if (!need_bar || IsOp("|")) {
        if (need_bar) Next();
        need_bar = true;
        NodePtr f = MakeNode(NodeKind::kFilter, Peek().line);
        f->str = ExpectName();
        while (SkipOp(".")) f->str += "." + ExpectName();
        if (!IsFilter(f->str)) Fail(f->line, fmt::format("unknown filter '{}'", f->str));
        f->kids.push_back(std::move(node));
        if (SkipOp("(")) ParseArgs(f.get());
        node = std::move(f);
      } else if (IsName("is")) {
        NodePtr test = MakeNode(NodeKind::kTest, Next().line);
        test->flag = SkipName("not");
        test->str = ExpectName();
        if (!IsTest(test->str)) Fail(test->line, fmt::format("unknown test '{}'", test->str));
        test->kids.push_back(std::move(node));
        if (SkipOp("(")) {
          ParseArgs(test.get());
        } else if (StartsTestArgument()) {
          test->names.emplace_back();
          test->kids.push_back(ParsePostfix(ParsePrimary()));
        }
        node = std::move(test);
      } else {
        return node;
      }
    }
  }

  bool StartsTestArgument() const {
    const Token& t = Peek();
    if (t.type == Tok::kString || t.type == Tok::kInt || t.type == Tok::kFloat) return true;
    if (t.type == Tok::kOp) return t.text == "[" || t.text == "{";
    if (t.type != Tok::kName) return false;
    static const std::set<std::string> kStop = {"and", "or", "not", "if", "else", "in", "is"};
    return kStop.count(t.text) == 0;
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
};

}  // namespace

std::unique_ptr<Node> ParseTemplate(const std::vector<Token>& tokens) {
  return Parser(tokens).Run();
}

}  // namespace slime::tokenizer::jinja
