// Provisional tokenizer reference from the JavaScript port of HF tokenizers (@lenml/tokenizers,
// a fork of transformers.js). Same output format as scripts/device/make_tokenizer_reference.py,
// which produces the authoritative reference with the Python `tokenizers`/`transformers` on the
// GPU machine; this one lets a developer without that machine check ids locally.
//
// Chat templates are rendered with @huggingface/jinja (the bundled one cannot parse Qwen3's).
//
//   npm install --prefix /tmp/tokref @lenml/tokenizers@3.7.2 @huggingface/jinja@0.5.1
//   NODE_PATH=/tmp/tokref/node_modules node scripts/dev/tokenizer_reference_node.mjs \
//       [testdata_dir] [out_dir]
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const require = createRequire(import.meta.url);
const { TokenizerLoader } = require("@lenml/tokenizers");
const { Template } = require("@huggingface/jinja");

// JavaScript's \s also matches U+FEFF and misses U+0085; Oniguruma's (Hugging Face's regex
// engine) is exactly Unicode White_Space. Rewrite \s / \S in Split patterns to that set so this
// provisional reference follows Hugging Face rather than the JS engine.
const WS = "\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
function onigWhitespace(p) {
  let out = "", inClass = false;
  for (let i = 0; i < p.length; i++) {
    const c = p[i];
    if (c === "\\" && i + 1 < p.length) {
      const n = p[++i];
      if (n === "s") out += inClass ? WS : `[${WS}]`;
      else if (n === "S" && !inClass) out += `[^${WS}]`;
      else out += c + n;
      continue;
    }
    if (c === "[") inClass = true;
    else if (c === "]") inClass = false;
    out += c;
  }
  return out;
}
function patchPatterns(node) {
  if (Array.isArray(node)) node.forEach(patchPatterns);
  else if (node && typeof node === "object") {
    if (node.type === "Split" && node.pattern && node.pattern.Regex) {
      node.pattern.Regex = onigWhitespace(node.pattern.Regex);
    }
    Object.values(node).forEach(patchPatterns);
  }
}

const repo = path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
const dataDir = process.argv[2] || process.env.SLIME_TEST_DATA || path.join(repo, ".cache/testdata");
const outDir = process.argv[3] || path.join(repo, "tests/data/tokenizer");
const readJsonl = (p) =>
  fs.readFileSync(p, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
const corpus = readJsonl(path.join(repo, "tests/data/tokenizer/corpus.jsonl"));
const chats = readJsonl(path.join(repo, "tests/data/tokenizer/chat_cases.jsonl"));

for (const name of ["qwen3", "llama3", "llama3_1"]) {
  const dir = path.join(dataDir, name);
  if (!fs.existsSync(path.join(dir, "tokenizer.json"))) {
    console.error(`skip ${name}: no ${dir}/tokenizer.json (run scripts/fetch_test_data.sh)`);
    continue;
  }
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  patchPatterns(tokenizerJSON.pre_tokenizer);
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON,
    tokenizerConfig: config,
  });
  const template = new Template(config.chat_template);
  const tokenText = (t) => (t && typeof t === "object" ? t.content : t);
  const lines = [JSON.stringify({ meta: { generator: "node @lenml/tokenizers 3.7.2 (provisional)", model: name } })];
  for (const c of corpus) {
    const ids = tok.encode(c.text, { add_special_tokens: false });
    const idsSpecial = tok.encode(c.text, { add_special_tokens: true });
    const dec = (skip, clean) =>
      ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: clean });
    lines.push(JSON.stringify({
      id: c.id, ids, ids_special: idsSpecial,
      decoded: dec(false, false),
      decoded_skip: dec(true, false),
      decoded_hf: dec(false, undefined),
    }));
  }
  for (const c of chats) {
    if (!c.models.includes(name)) continue;
    try {
      const text = template.render({
        messages: c.messages, tools: c.tools, add_generation_prompt: c.add_generation_prompt,
        bos_token: tokenText(config.bos_token), eos_token: tokenText(config.eos_token), ...c.kwargs,
      });
      lines.push(JSON.stringify({ chat: c.name, text, ids: tok.encode(text, { add_special_tokens: false }) }));
    } catch (e) {
      lines.push(JSON.stringify({ chat: c.name, error: String(e) }));
    }
  }
  fs.writeFileSync(path.join(outDir, `${name}_reference.jsonl`), lines.join("\n") + "\n");
  console.log(`${name}: ${lines.length - 1} records`);
}
