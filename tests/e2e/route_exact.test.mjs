// `basalt route --tokenizer`: cache-aware routing that knows what each
// replica's cache holds from the replicas' KV events rather than from
// where the gateway sent prompts. Prompts cached on a replica by requests
// that never went through the gateway are still routed to it, completion
// and chat alike, a cache_salt is a namespace of its own, and a replica
// whose event stream ends is no longer counted as holding anything.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { startServer, startGateway, parseMetrics, waitFor } from './server.mjs';

const modelDir = process.env.BASALT_MODEL ?? fileURLToPath(new URL('../../models/basalt-mini', import.meta.url));
let replicas = [];
let gateway;

before(async () => {
  replicas = await Promise.all([0, 1].map(() => startServer(['--threads', '1', '--no-request-log'])));
  gateway = await startGateway([...replicas.flatMap((r) => ['--replica', r.baseURL]), '--tokenizer', modelDir,
                                '--metrics-interval', '0.1']);
});

after(async () => {
  for (const r of replicas) await r.stop();
  const { code } = await gateway.stop();
  assert.equal(code, 0, gateway.log());
});

const openai = (baseURL) => new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'none', maxRetries: 0 });
const id = (r) => `http://127.0.0.1:${r.port}`;

async function gatewayMetrics() {
  const r = await fetch(`${gateway.baseURL}/metrics`);
  assert.equal(r.status, 200);
  return parseMetrics(await r.text());
}
const answered = (m, r) => m[`basalt_route_replica_attempts_total{replica="${id(r)}",outcome="answered"}`] ?? 0;
const blocks = (m, r) => m[`basalt_route_kv_index_blocks{replica="${id(r)}"}`] ?? 0;

// A prompt of a few hundred tokens, different for each `n`.
const longPrompt = (n) => `Ticket ${n}: ` +
  Array.from({ length: 40 }, (_, i) => `line ${i} of report ${n} lists part ${(i * 7 + n) % 13}.`).join(' ');

// Caches `body` on replica `r` by asking it directly, then waits until the
// gateway's index of `r` has grown (its KV events arrived).
async function warm(r, kind, body) {
  const before = blocks(await gatewayMetrics(), r);
  const client = openai(r.baseURL);
  await (kind === 'chat' ? client.chat.completions.create(body) : client.completions.create(body));
  assert.ok(await waitFor(async () => blocks(await gatewayMetrics(), r) > before, 20000), 'no KV events came');
}

test('both replicas\' KV events are read', async () => {
  assert.ok(await waitFor(async () => {
    const m = await gatewayMetrics();
    return replicas.every((r) => m[`basalt_route_kv_events_live{replica="${id(r)}"}`] === 1);
  }, 20000), gateway.log());
});

test('a prompt cached on a replica behind the gateway\'s back goes to that replica', async () => {
  const through = openai(gateway.baseURL);
  for (let n = 0; n < 4; ++n) {
    const owner = replicas[n % 2];
    const body = { model: 'basalt-mini', prompt: longPrompt(n), max_tokens: 2, temperature: 0 };
    await warm(owner, 'completion', body);
    const before = await gatewayMetrics();
    const answer = await through.completions.create(body);
    const after = await gatewayMetrics();
    assert.equal(answered(after, owner) - answered(before, owner), 1, `prompt ${n}: ${JSON.stringify(after)}`);
    const cached = answer.usage.prompt_tokens_details?.cached_tokens ?? 0;
    assert.ok(cached >= answer.usage.prompt_tokens / 2, JSON.stringify(answer.usage));
  }
  const m = await gatewayMetrics();
  assert.ok(m['basalt_route_prefix_cached_ratio_count{mode="exact"}'] >= 4, JSON.stringify(m));
  // Each of the four found (nearly) all of its prompt: the ratio's sum is close to the count.
  assert.ok(m['basalt_route_prefix_cached_ratio_sum{mode="exact"}'] >= 3.6, JSON.stringify(m));
});

test('chats are tokenized through the chat template as the replica does', async () => {
  const through = openai(gateway.baseURL);
  const owner = replicas[1];
  const body = { model: 'basalt-mini', max_tokens: 2, temperature: 0,
                 messages: [{ role: 'system', content: longPrompt(10) }, { role: 'user', content: 'Summarize.' }] };
  await warm(owner, 'chat', body);
  const before = await gatewayMetrics();
  const answer = await through.chat.completions.create(body);
  const after = await gatewayMetrics();
  assert.equal(answered(after, owner) - answered(before, owner), 1, JSON.stringify(after));
  assert.ok((answer.usage.prompt_tokens_details?.cached_tokens ?? 0) >= answer.usage.prompt_tokens / 2,
            JSON.stringify(answer.usage));
});

test('a cache_salt is a namespace of its own', async () => {
  const through = openai(gateway.baseURL);
  const owner = replicas[0];
  const body = { model: 'basalt-mini', prompt: longPrompt(20), max_tokens: 2, temperature: 0, cache_salt: 'team-a' };
  await warm(owner, 'completion', body);
  const before = await gatewayMetrics();
  const salted = await through.completions.create(body);
  const after = await gatewayMetrics();
  assert.equal(answered(after, owner) - answered(before, owner), 1, JSON.stringify(after));
  assert.ok((salted.usage.prompt_tokens_details?.cached_tokens ?? 0) > 0, JSON.stringify(salted.usage));
  // The same text under another salt matched nothing exactly on either replica.
  const exactBefore = after['basalt_route_prefix_cached_ratio_sum{mode="exact"}'];
  await through.completions.create({ ...body, cache_salt: 'team-b', prompt: longPrompt(20) });
  const m = await gatewayMetrics();
  assert.equal(m['basalt_route_prefix_cached_ratio_sum{mode="exact"}'], exactBefore, JSON.stringify(m));
});

test('a replica whose event stream ends holds nothing for the gateway', async () => {
  replicas[1].child.kill('SIGKILL');
  await replicas[1].exited;
  assert.ok(await waitFor(async () => {
    const m = await gatewayMetrics();
    return m[`basalt_route_kv_events_live{replica="${id(replicas[1])}"}`] === 0 &&
           m[`basalt_route_kv_index_blocks{replica="${id(replicas[1])}"}`] === 0 &&
           m[`basalt_route_kv_events_resyncs_total{replica="${id(replicas[1])}"}`] === 1;
  }, 20000), gateway.log());
  // What it held is not sent to it (it is gone), and the survivor answers.
  const answer = await openai(gateway.baseURL).completions.create(
    { model: 'basalt-mini', prompt: longPrompt(1), max_tokens: 2, temperature: 0 });
  assert.equal(answer.choices.length, 1);
});
