// A Jinja interpreter for the subset of Jinja that Hugging Face chat templates use.
//
// Template::Parse turns template source into an immutable syntax tree (lexer → parser, once);
// Template::Render evaluates it over a JSON context (per call). The environment matches
// transformers' chat-template environment: trim_blocks and lstrip_blocks on, the loopcontrols
// extension (break/continue), `{% generation %}` accepted as a plain block, a `tojson` filter
// that is Python's json.dumps(ensure_ascii=False) (not Jinja's HTML-escaping one), and the
// globals raise_exception(msg), strftime_now(fmt), namespace(...), range(...) and dict(...).
// Undefined values behave as jinja2's default Undefined: they print as "", are falsy, iterate
// as empty and have length 0; any other use (attribute, item, call, arithmetic, tojson) is an
// error naming the variable.
//
// The supported statements, expressions, filters, tests and methods are listed in
// docs/data.md ("Chat templates"). Anything outside the subset is an error naming the template
// line and the construct ("chat template line 12: unknown filter 'foo'"), at parse time where
// possible, at render time otherwise.
//
// Ownership: value type; copies share the immutable tree. Thread-safety: Render is const and
// keeps all state on its own stack, so one Template may render on many threads at once.
#ifndef SLIME_TOKENIZER_JINJA_H_
#define SLIME_TOKENIZER_JINJA_H_

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "slime/common/status.h"

namespace slime::tokenizer::jinja {

struct Node;  // the syntax tree (src/tokenizer/jinja_internal.h)

class Template {
 public:
  Template() = default;  // renders nothing
  // Parses `source`. `name` starts every error message ("chat template line 3: ...").
  // Error (InvalidArgument): a syntax error or an unsupported statement, naming the line.
  static StatusOr<Template> Parse(std::string_view source, std::string name = "template");

  // Renders with the variables of `context` (an object; JSON objects become dicts that keep
  // their key order). Error (InvalidArgument): the template failed — an undefined value used,
  // a type error, an unknown filter, or raise_exception(msg) — naming the line.
  StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const Node> root_;
  std::string name_;
};

// Options of Python's json.dumps as transformers' `tojson` filter passes them.
struct JsonDumpsOptions {
  int indent = -1;              // < 0: one line
  bool ensure_ascii = false;    // escape non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
  bool sort_keys = false;       // else insertion order
  std::string item_separator;   // "" means the default: ", " without indent, "," with it
  std::string key_separator;    // "" means ": "
};

// Python's json.dumps(value, ...) of a JSON value: Python's float repr, escapes as Python.
std::string PyJsonDumps(const nlohmann::ordered_json& value, const JsonDumpsOptions& options = {});

}  // namespace slime::tokenizer::jinja

#endif  // SLIME_TOKENIZER_JINJA_H_
