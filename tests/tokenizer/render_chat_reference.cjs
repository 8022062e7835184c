// Renders chat-template cases with @huggingface/jinja, the independent renderer that
// chat_template_reference_test.cc compares slime-cpp's interpreter against.
//
//   node render_chat_reference.cjs <@huggingface/jinja package dir> <cases.json>
//
// cases.json: [{"template": "...", "context": {...}}, ...]. Prints a JSON array with one
// {"output": text} or {"error": message} per case, in order.
"use strict";
const fs = require("fs");
const path = require("path");

const { Template } = require(path.join(process.argv[2], "dist", "index.cjs"));
const cases = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const results = cases.map((c) => {
  try {
    return { output: new Template(c.template).render(c.context) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(results));
