// The structured-output property test, second half (structured_walks.cpp makes the walks): every
// walk that ended with a stop token must be a JSON document that its schema accepts, as ajv judges
// it (a JSON Schema 2020-12 validator written apart from ours, with ajv-formats for `format`).
//
//   node tests/structured/validate.mjs walks.jsonl
//
// Exits 1 on any failure, each printed with its schema, output and ajv's errors, and when too few
// walks stopped for the check to mean much.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

// Stopped walks required, with room below what ctest's run (seeds 1 and 5, 120 schemas, 600
// walks) measured: 82-84% of all walks stopped, 89-95% of each dummy model's, 44-47% of
// stories260K's through the engine (the model's own choices, which nothing biases towards closing
// brackets: it wanders in whitespace and strings until max_tokens), about 500 in all. Fewer means
// the walks wander (or the masks changed), and ajv would be checking little.
const MIN_STOPPED = 300;
const MIN_STOPPED_FRACTION = 0.6;
const MIN_STOPPED_FRACTION_OF = (vocabulary) => (vocabulary.endsWith('-engine') ? 0.25 : 0.7);

// The npm packages of tests/server (`make npm-deps` installs them there with npm ci).
const require = createRequire(path.join(path.dirname(fileURLToPath(import.meta.url)), '../server/package.json'));
let Ajv2020, addFormats;
try {
  Ajv2020 = require('ajv/dist/2020.js').default;
  addFormats = require('ajv-formats').default;
} catch (e) {
  console.error(`ajv is missing (${e.message}): run \`npm ci --no-audit --no-fund\` in tests/server`);
  process.exit(1);
}

const file = process.argv[2];
if (!file) {
  console.error('usage: node validate.mjs WALKS.jsonl');
  process.exit(2);
}

// Strict schemas (an unknown keyword or format is an error), strict numbers (NaN and Infinity are
// not numbers); only the warnings about tuples without minItems and keywords without a type are
// off, as the schemas use both on purpose.
const ajv = new Ajv2020({ allErrors: true, strictTypes: false, strictTuples: false });
addFormats(ajv);
const compiled = new Map();  // schema text -> validate function, or the compile error

function validator(schema) {
  const key = JSON.stringify(schema);
  if (!compiled.has(key)) {
    try {
      compiled.set(key, ajv.compile(schema));
    } catch (e) {
      compiled.set(key, e);
    }
  }
  return compiled.get(key);
}

const counts = new Map();  // vocabulary -> {walks, stopped}
let walks = 0, stopped = 0, validated = 0;
const failures = [];
for (const line of readFileSync(file, 'utf8').split('\n')) {
  if (!line) continue;
  const walk = JSON.parse(line);
  const c = counts.get(walk.vocabulary) ?? { walks: 0, stopped: 0 };
  counts.set(walk.vocabulary, c);
  ++walks, ++c.walks;
  if (!walk.stopped) continue;  // (a walk cut off by its length limit is no document yet)
  ++stopped, ++c.stopped;
  const fail = (why) => failures.push({ why, walk });
  const validate = validator(walk.schema);
  if (validate instanceof Error) {
    fail(`ajv refused the schema: ${validate.message}`);
    continue;
  }
  let doc;
  try {
    doc = JSON.parse(walk.output);
  } catch (e) {
    fail(`not JSON: ${e.message}`);
    continue;
  }
  if (!validate(doc)) {
    fail('ajv: ' + JSON.stringify(validate.errors, null, 1).replace(/\n\s*/g, ' '));
    continue;
  }
  ++validated;
}

for (const { why, walk } of failures) {
  const where = `${walk.vocabulary}, seed ${walk.seed}, any_whitespace ${walk.any_whitespace}`;
  console.log(`FAIL schema ${walk.index} (${where}): ${why}`);
  console.log(`  schema: ${JSON.stringify(walk.schema)}`);
  console.log(`  output: ${JSON.stringify(walk.output)}`);
}
const each = [...counts].map(([v, c]) => `${v} ${c.stopped}/${c.walks}`).join(', ');
console.log(`walks ${walks}, stopped ${stopped} (${each}), validated ${validated}, failures ${failures.length}`);

let ok = failures.length === 0;
if (stopped < MIN_STOPPED || stopped < MIN_STOPPED_FRACTION * walks) {
  console.log(`FAIL too few walks stopped: ${stopped} of ${walks} (at least ${MIN_STOPPED} and ` +
              `${MIN_STOPPED_FRACTION * 100}% are needed)`);
  ok = false;
}
for (const [v, c] of counts) {
  const min = MIN_STOPPED_FRACTION_OF(v);
  if (c.stopped < min * c.walks) {
    console.log(`FAIL too few ${v} walks stopped: ${c.stopped} of ${c.walks} (at least ${min * 100}% are needed)`);
    ok = false;
  }
}
process.exit(ok ? 0 : 1);
