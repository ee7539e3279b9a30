// Renders every case of cases.json with @huggingface/jinja, an independent Jinja
// implementation (the one transformers.js uses), and prints {"<case name>": {"output": "..."}
// or {"error": "..."}} as JSON. expected.json is this script's output, committed; the C++ test
// (src/tokenizer/chat_template_test.cpp) renders the same cases and compares exactly.
//
// Regenerate (from this folder; the second argument is the shared/models folder):
//   npm install && node render.mjs cases.json ../../../shared/models > expected.json
//
// A case: {name, template: "file:<tokenizers/ subfolder>" | "inline:<key of templates>",
// messages, add_generation_prompt, [tokens_from: <tokenizers/ subfolder>], [bos_token],
// [eos_token], [kwargs]}. bos/eos come from the tokenizer_config.json of the template file or
// of tokens_from unless given; a missing token is "". raise_exception and strftime_now are
// built into @huggingface/jinja, as into Hugging Face's Python renderer.
import fs from "node:fs";
import path from "node:path";
import { Template } from "@huggingface/jinja";

const [casesPath, modelsDir] = process.argv.slice(2);
if (!casesPath || !modelsDir) {
  console.error("usage: node render.mjs cases.json <shared/models folder>");
  process.exit(2);
}
const { templates, cases } = JSON.parse(fs.readFileSync(casesPath, "utf8"));

function tokenText(t) {
  if (typeof t === "string") return t;
  if (t && typeof t === "object" && typeof t.content === "string") return t.content;
  return "";
}
function readConfig(name) {
  const file = path.join(modelsDir, "tokenizers", name, "tokenizer_config.json");
  return JSON.parse(fs.readFileSync(file, "utf8"));
}
function chatTemplateOf(config) {
  const t = config.chat_template;
  if (typeof t === "string") return t;
  if (Array.isArray(t)) return t.find((e) => e.name === "default").template;
  throw new Error("no chat_template");
}

const out = {};
for (const c of cases) {
  let source;
  let tokenConfig = null;
  if (c.template.startsWith("file:")) {
    tokenConfig = readConfig(c.template.slice(5));
    source = chatTemplateOf(tokenConfig);
  } else {
    source = templates[c.template.slice(7)];
  }
  if (c.tokens_from) tokenConfig = readConfig(c.tokens_from);
  const context = {
    messages: c.messages,
    add_generation_prompt: c.add_generation_prompt,
    bos_token: c.bos_token ?? tokenText(tokenConfig?.bos_token),
    eos_token: c.eos_token ?? tokenText(tokenConfig?.eos_token),
    ...(c.kwargs ?? {}),
  };
  try {
    out[c.name] = { output: new Template(source).render(context) };
  } catch (e) {
    out[c.name] = { error: String(e.message ?? e) };
  }
}
process.stdout.write(JSON.stringify(out, null, 1) + "\n");
