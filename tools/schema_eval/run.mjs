// Real-world JSON schemas against a running `basalt serve`: how many it
// refuses, and whether every document it writes for the others is valid.
// Each schema goes out as a chat request with response_format json_schema
// (strict); the answer is parsed and checked by Ajv with ajv-formats, an
// independent validator, never by Basalt's own grammar.
//
// The schemas are public data and stay out of the repository: use, for
// example, JSONSchemaBench (github.com/guidance-ai/jsonschemabench), whose
// data/<subset>/*.json files each hold one schema.
//
//   npm ci --prefix tests/e2e          # once: openai, ajv, ajv-formats
//   build/bin/basalt serve --port 18431 --served-model-name basalt-mini &
//   node tools/schema_eval/run.mjs --base-url http://127.0.0.1:18431 \
//       --schemas jsonschemabench/data/Glaiveai2K --schemas jsonschemabench/data/Kubernetes \
//       [--limit 100] [--max-tokens 512] [--seed 1] [--concurrency 4] [--timeout-s 300] [--out report.json]
//
// Each --schemas names one directory (a subset, reported by its name); the
// sample is deterministic: the first --limit files of it in sorted order.
// Counts per subset:
//   refused    HTTP 400 (the reason is the keyword the message names, or
//              its first clause);
//   generated  answered; of these
//     valid    finish_reason "stop" and the content validates,
//     invalid  finish_reason "stop" and it does not parse or validate (a bug
//              in the grammar translation: schema path and Ajv errors kept),
//     cut      finish_reason "length": max_tokens ended it before the
//              document did, neither valid nor invalid;
//   unverified Ajv itself cannot compile the schema;
//   errors     anything else (other HTTP statuses, timeouts, no answer).
// Finished documents that write a member name twice in one object are
// listed too (JSON.parse, and so Ajv, sees only the last).
// The validator follows the schema's $schema: Ajv2020 for 2020-12 and for
// schemas that name no draft, Ajv2019 for 2019-09, Ajv's draft-07 class for
// drafts 4 to 7 (whose array-form `items` 2020-12 reads differently), with
// draft 4's boolean exclusiveMinimum / exclusiveMaximum rewritten to
// draft 6's numbers, as Basalt reads them, and draft 4's `id` as `$id`
// (Ajv refuses `id`; Basalt reads either). Each schema gets its own Ajv
// instance, unknown keywords and formats are ignored by Ajv (strict: false).
// Exit status 0 unless the run itself fails.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(new URL('../../tests/e2e/package.json', import.meta.url));
const Ajv07 = require('ajv').default;
const Ajv2019 = require('ajv/dist/2019').default;
const Ajv2020 = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats').default;

function parseArgs(argv) {
  const a = { baseURL: null, schemas: [], limit: 100, maxTokens: 512, seed: 1, concurrency: 4, timeoutS: 300,
              out: null, model: 'basalt-mini' };
  for (let i = 2; i < argv.length; i += 2) {
    const [flag, v] = [argv[i], argv[i + 1]];
    if (v === undefined) throw new Error(`${flag} needs a value`);
    if (flag === '--base-url') a.baseURL = v.replace(/\/+$/, '');
    else if (flag === '--schemas') a.schemas.push(v);
    else if (flag === '--limit') a.limit = Number(v);
    else if (flag === '--max-tokens') a.maxTokens = Number(v);
    else if (flag === '--seed') a.seed = Number(v);
    else if (flag === '--concurrency') a.concurrency = Math.max(1, Number(v));
    else if (flag === '--timeout-s') a.timeoutS = Number(v);
    else if (flag === '--out') a.out = v;
    else if (flag === '--model') a.model = v;
    else throw new Error(`unknown flag ${flag}`);
  }
  if (!a.baseURL || a.schemas.length === 0) {
    throw new Error('usage: node tools/schema_eval/run.mjs --base-url URL --schemas DIR [--schemas DIR ...] '
                    + '[--limit N] [--max-tokens N] [--seed S] [--concurrency N] [--timeout-s S] [--out FILE]');
  }
  return a;
}

// Draft 4's boolean exclusive bounds as draft 6's numbers, recursively.
function draft4Bounds(s) {
  if (Array.isArray(s)) return s.map(draft4Bounds);
  if (s === null || typeof s !== 'object') return s;
  const o = Object.fromEntries(Object.entries(s).map(([k, v]) => [k, draft4Bounds(v)]));
  for (const [ex, bound] of [['exclusiveMinimum', 'minimum'], ['exclusiveMaximum', 'maximum']]) {
    if (o[ex] === true && typeof o[bound] === 'number') { o[ex] = o[bound]; delete o[bound]; }
    else if (typeof o[ex] === 'boolean') delete o[ex];
  }
  return o;
}

// Draft 4's `id` (a schema's identifier, a string) as `$id`, which Ajv
// reads (it refuses `id`); values that are instances (enum, const, default,
// examples) are left as they are.
function draft4Ids(s) {
  if (Array.isArray(s)) return s.map(draft4Ids);
  if (s === null || typeof s !== 'object') return s;
  const o = {};
  for (const [k, v] of Object.entries(s)) {
    if (k === 'id' && typeof v === 'string' && !('$id' in s)) o.$id = v;
    else o[k] = ['enum', 'const', 'default', 'examples'].includes(k) ? v : draft4Ids(v);
  }
  return o;
}

function validator(schema) {
  const draft = typeof schema === 'object' && schema !== null ? String(schema.$schema ?? '') : '';
  const options = { strict: false, allErrors: true, validateSchema: false };
  let Cls = Ajv2020;
  let copy = draft4Ids(schema);
  if (/draft-0[3-7]/.test(draft)) { Cls = Ajv07; copy = draft4Bounds(copy); }
  else if (/2019-09/.test(draft)) Cls = Ajv2019;
  if (typeof copy === 'object' && copy !== null) { copy = { ...copy }; delete copy.$schema; }
  const ajv = new Cls(options);
  addFormats(ajv);
  return { validate: ajv.compile(copy), name: Cls === Ajv07 ? 'ajv-draft-07' : Cls === Ajv2019 ? 'ajv-2019' : 'ajv-2020' };
}

// The keyword a 400 names and what its message says after the schema path
// (quoted names, refs and formats kept: they say which case it is), or the
// message's first clause.
function refusalReason(message) {
  const m = /unsupported keyword "([^"]+)" at #\S*(?:: |\s*)?(.*)$/.exec(message);
  if (m) {
    const clause = m[2].replace(/\s*\(remote references.*$/, '').replace(/"[^"]*" (is not within|names an anchor)/, '"…" $1');
    return `unsupported keyword "${m[1]}"${clause ? `: ${clause.slice(0, 90)}` : ''}`;
  }
  // The first clause after the field name: "'param': json schema: <clause> at #..."
  const text = message.replace(/^'[^']*': /, '').replace(/^json schema: /, '');
  return text.split(/ at #|[:;(]/)[0].trim().slice(0, 100);
}

// The first member name written twice in one object of a JSON text, or
// null. JSON.parse keeps the last silently; RFC 8259 says names SHOULD be
// unique, and a strict consumer refuses them, so they are counted apart.
function duplicateKey(text) {
  let i = 0;
  const ws = () => { while (' \t\n\r'.includes(text[i]) && i < text.length) ++i; };
  const string = () => {
    const start = i++;
    while (text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
    return JSON.parse(text.slice(start, ++i));
  };
  const value = () => {
    ws();
    if (text[i] === '{') {
      const seen = new Set();
      ++i; ws();
      if (text[i] === '}') { ++i; return null; }
      for (;;) {
        ws();
        const key = string();
        if (seen.has(key)) return key;
        seen.add(key);
        ws(); ++i;  // ':'
        const inner = value();
        if (inner !== null) return inner;
        ws();
        if (text[i++] === '}') return null;
      }
    }
    if (text[i] === '[') {
      ++i; ws();
      if (text[i] === ']') { ++i; return null; }
      for (;;) {
        const inner = value();
        if (inner !== null) return inner;
        ws();
        if (text[i++] === ']') return null;
      }
    }
    if (text[i] === '"') { string(); return null; }
    while (i < text.length && !',]} \t\n\r'.includes(text[i])) ++i;
    return null;
  };
  return value();
}

async function runOne(args, subset, file) {
  const path = join(subset.dir, file);
  const record = { subset: subset.name, file, path };
  let schema;
  try {
    schema = JSON.parse(readFileSync(path, 'utf8'));
  } catch (e) {
    return { ...record, outcome: 'error', error: `schema file: ${e.message}` };
  }
  const body = {
    model: args.model,
    messages: [{ role: 'user', content: 'Write a JSON document that follows the given schema.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'document', schema, strict: true } },
    temperature: 0.7,
    seed: args.seed,
    max_tokens: args.maxTokens,
  };
  const started = Date.now();
  let response, payload;
  try {
    response = await fetch(`${args.baseURL}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
      signal: AbortSignal.timeout(args.timeoutS * 1000),
    });
    payload = await response.json();
  } catch (e) {
    return { ...record, outcome: 'error', error: `request: ${e.name}: ${e.message}` };
  }
  record.seconds = (Date.now() - started) / 1000;
  if (response.status === 400) {
    const message = payload?.error?.message ?? JSON.stringify(payload);
    return { ...record, outcome: 'refused', reason: refusalReason(message), message };
  }
  if (response.status !== 200) {
    return { ...record, outcome: 'error', error: `HTTP ${response.status}: ${JSON.stringify(payload).slice(0, 300)}` };
  }
  const choice = payload.choices?.[0];
  const content = choice?.message?.content ?? '';
  record.completion_tokens = payload.usage?.completion_tokens;
  if (choice?.finish_reason === 'length') return { ...record, outcome: 'cut', content };
  if (choice?.finish_reason !== 'stop') {
    return { ...record, outcome: 'error', error: `finish_reason ${choice?.finish_reason}`, content };
  }
  let value;
  try {
    value = JSON.parse(content);
  } catch (e) {
    return { ...record, outcome: 'invalid', error: `not JSON: ${e.message}`, content };
  }
  let v;
  try {
    v = validator(schema);
  } catch (e) {
    return { ...record, outcome: 'unverified', error: `ajv cannot compile the schema: ${e.message}`, content };
  }
  record.validator = v.name;
  const duplicate = duplicateKey(content);
  if (duplicate !== null) record.duplicate_key = duplicate;
  if (v.validate(value)) return { ...record, outcome: 'valid', content };
  return { ...record, outcome: 'invalid', error: JSON.stringify(v.validate.errors.slice(0, 3)), content };
}

async function main() {
  const args = parseArgs(process.argv);
  const subsets = args.schemas.map((dir) => ({
    dir, name: basename(dir.replace(/\/+$/, '')),
    files: readdirSync(dir).filter((f) => f.endsWith('.json')).sort().slice(0, args.limit),
  }));
  const jobs = subsets.flatMap((s) => s.files.map((f) => [s, f]));
  const results = new Array(jobs.length);
  let next = 0;
  const t0 = Date.now();
  async function worker() {
    while (next < jobs.length) {
      const i = next++;
      results[i] = await runOne(args, ...jobs[i]);
      const r = results[i];
      process.stderr.write(`[${i + 1}/${jobs.length} ${((Date.now() - t0) / 1000).toFixed(0)}s] `
                           + `${r.subset}/${r.file}: ${r.outcome}${r.reason ? ` (${r.reason})` : ''}\n`);
    }
  }
  await Promise.all(Array.from({ length: args.concurrency }, worker));

  const summary = {};
  for (const s of subsets) {
    const rs = results.filter((r) => r.subset === s.name);
    const count = (o) => rs.filter((r) => r.outcome === o).length;
    const reasons = {};
    for (const r of rs.filter((r) => r.outcome === 'refused')) reasons[r.reason] = (reasons[r.reason] ?? 0) + 1;
    const row = { schemas: rs.length, refused: count('refused'), valid: count('valid'), invalid: count('invalid'),
                  cut: count('cut'), unverified: count('unverified'), errors: count('error'),
                  duplicate_keys: rs.filter((r) => r.duplicate_key !== undefined).length };
    row.generated = row.valid + row.invalid + row.cut + row.unverified;
    row.refused_pct = (100 * row.refused) / Math.max(1, row.schemas);
    row.valid_pct_of_finished = (100 * row.valid) / Math.max(1, row.valid + row.invalid);
    row.refusal_reasons = Object.fromEntries(Object.entries(reasons).sort((a, b) => b[1] - a[1]));
    summary[s.name] = row;
  }
  const all = Object.values(summary).reduce((t, r) => {
    for (const k of Object.keys(t)) t[k] += r[k];
    return t;
  }, { schemas: 0, refused: 0, generated: 0, valid: 0, invalid: 0, cut: 0, unverified: 0, errors: 0,
       duplicate_keys: 0 });

  const pct = (x) => `${x.toFixed(1)}%`;
  console.log(`${'subset'.padEnd(16)} schemas refused generated  valid invalid   cut unverif errors  refused%  valid/(valid+invalid)`);
  for (const [name, r] of [...Object.entries(summary), ['total', all]]) {
    console.log(`${name.padEnd(16)} ${String(r.schemas).padStart(7)} ${String(r.refused).padStart(7)} `
                + `${String(r.generated).padStart(9)} ${String(r.valid).padStart(6)} ${String(r.invalid).padStart(7)} `
                + `${String(r.cut).padStart(5)} ${String(r.unverified).padStart(7)} ${String(r.errors).padStart(6)}  `
                + `${pct((100 * r.refused) / Math.max(1, r.schemas)).padStart(8)}  `
                + `${pct((100 * r.valid) / Math.max(1, r.valid + r.invalid))}`);
  }
  for (const [name, r] of Object.entries(summary)) {
    if (r.refused === 0) continue;
    console.log(`\nrefusals, ${name}:`);
    for (const [reason, n] of Object.entries(r.refusal_reasons)) console.log(`  ${String(n).padStart(4)}  ${reason}`);
  }
  for (const kind of ['invalid', 'unverified', 'error']) {
    const rs = results.filter((r) => r.outcome === kind);
    if (rs.length === 0) continue;
    console.log(`\n${kind}:`);
    for (const r of rs) {
      console.log(`  ${r.path}: ${r.error}`);
      if (r.content !== undefined) console.log(`    content: ${r.content.slice(0, 400)}`);
    }
  }
  const dups = results.filter((r) => r.duplicate_key !== undefined);
  if (dups.length > 0) {
    console.log(`\nfinished documents with a member name twice in one object (JSON.parse keeps the last): ${dups.length}`);
    for (const r of dups) console.log(`  ${r.path} (${r.outcome}): "${r.duplicate_key}"`);
  }
  const seconds = (Date.now() - t0) / 1000;
  console.log(`\n${jobs.length} requests in ${seconds.toFixed(0)} s`);
  if (args.out) {
    writeFileSync(args.out, JSON.stringify({ options: { ...args, out: undefined }, seconds, summary, total: all,
                                             results }, null, 2));
  }
}

main().catch((e) => {
  console.error(`run.mjs: ${e.message}`);
  process.exit(1);
});
