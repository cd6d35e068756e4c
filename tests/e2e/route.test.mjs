// `basalt route` over `basalt serve` replicas of the bundled model, driven
// by the official `openai` npm client: answers through the gateway equal
// the replicas' own, requests spread over them, a replica killed with
// SIGKILL is retried around before the first byte, SIGHUP reloads the
// replica file, and 40 streams live through one replica SIGKILLed and
// another SIGSTOPped mid-stream with the texts they would have had.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { startServer, startGateway, parseMetrics, metric, waitFor } from './server.mjs';

let replicas = [];
let gateway;

before(async () => {
  replicas = await Promise.all([0, 1].map(() => startServer(['--threads', '1', '--no-request-log'])));
  gateway = await startGateway([...replicas.flatMap((r) => ['--replica', r.baseURL]), '--api-key', 'gw-key']);
});

after(async () => {
  for (const r of replicas) await r.stop();
  const { code } = await gateway.stop();
  assert.equal(code, 0, gateway.log());
});

const openai = (baseURL, apiKey = 'none') => new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0 });

async function gatewayMetrics() {
  const r = await fetch(`${gateway.baseURL}/metrics`, { headers: { Authorization: 'Bearer gw-key' } });
  assert.equal(r.status, 200);
  return parseMetrics(await r.text());
}

// The attempts on replica `id` (its canonical URL) that ended as `outcome`.
function attempts(samples, id, outcome) {
  return samples[`basalt_route_replica_attempts_total{replica="${id}",outcome="${outcome}"}`] ?? 0;
}

async function streamedText(client, body) {
  let text = '';
  const stream = await client.chat.completions.create({ ...body, stream: true });
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  return text;
}

test('answers through the gateway equal the replicas\' own, whole and streamed', async () => {
  const through = openai(gateway.baseURL, 'gw-key');
  const direct = openai(replicas[0].baseURL);
  const completion = { model: 'basalt-mini', prompt: 'The gateway', max_tokens: 16, temperature: 0 };
  const a = await through.completions.create(completion);
  const b = await direct.completions.create(completion);
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
  const chat = { model: 'basalt-mini', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 24, seed: 7,
                 temperature: 1 };
  assert.equal(await streamedText(through, chat), await streamedText(direct, chat));
  // Without the gateway's key: 401, from the gateway.
  await assert.rejects(openai(gateway.baseURL, 'wrong').completions.create(completion), (e) => e.status === 401);
});

test('requests spread over both replicas', async () => {
  const through = openai(gateway.baseURL, 'gw-key');
  const before = await gatewayMetrics();
  for (let i = 0; i < 4; ++i)
    await through.completions.create({ model: 'basalt-mini', prompt: `spread ${i}`, max_tokens: 2 });
  const now = await gatewayMetrics();
  for (const r of replicas) {
    const id = `http://127.0.0.1:${r.port}`;
    assert.equal(attempts(now, id, 'answered') - attempts(before, id, 'answered'), 2, JSON.stringify(now));
  }
});

test('a killed replica is retried around before the first byte', async () => {
  const through = openai(gateway.baseURL, 'gw-key');
  const body = { model: 'basalt-mini', prompt: 'Still here', max_tokens: 8, temperature: 0 };
  const expected = (await openai(replicas[0].baseURL).completions.create(body)).choices[0].text;
  replicas[1].child.kill('SIGKILL');
  await replicas[1].exited;
  for (let i = 0; i < 4; ++i) {
    assert.equal((await through.completions.create(body)).choices[0].text, expected);
    let text = '';
    const stream = await through.completions.create({ ...body, stream: true });
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    assert.equal(text, expected);
  }
  const m = await gatewayMetrics();
  // Tried once (or by a probe-free half-open trial), then ejected.
  const dead = `http://127.0.0.1:${replicas[1].port}`;
  assert.ok(attempts(m, dead, 'unreachable') >= 1 && attempts(m, dead, 'unreachable') <= 2, JSON.stringify(m));
  assert.equal(m[`basalt_route_replica_breaker_state{replica="${dead}"}`], 2, JSON.stringify(m));
});

test('SIGHUP re-reads the replica file', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'basalt-route-'));
  const file = join(dir, 'replicas.txt');
  writeFileSync(file, `# labelled with a model it does not serve, first\n${replicas[0].baseURL} model=elsewhere\n`);
  const second = await startGateway(['--replica-file', file, '--no-request-log']);
  try {
    const client = openai(second.baseURL);
    const body = { model: 'basalt-mini', prompt: 'x', max_tokens: 1 };
    // The gateway knows no replica for the model: its own 404.
    await assert.rejects(client.completions.create(body),
                         (e) => e.status === 404 && /not served here/.test(e.message));
    writeFileSync(file, `${replicas[0].baseURL} model=basalt-mini\n`);
    second.child.kill('SIGHUP');
    assert.ok(await waitFor(() => /replicas generation=2 /.test(second.log())), second.log());
    assert.equal((await client.completions.create(body)).object, 'text_completion');
    // A bad file is refused and the list kept.
    writeFileSync(file, 'not-a-url\n');
    second.child.kill('SIGHUP');
    assert.ok(await waitFor(() => /reload=refused/.test(second.log())), second.log());
    assert.equal((await client.completions.create(body)).object, 'text_completion');
  } finally {
    const { code } = await second.stop();
    assert.equal(code, 0, second.log());
  }
});

test('tenants: keys, 429 past a rate, and a cache namespace each', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'basalt-tenants-'));
  const file = join(dir, 'tenants.json');
  writeFileSync(file, JSON.stringify({ tenants: {
    a: { keys: ['sk-a'], limits: { rps: 0.5, burst: 3 } },
    b: { keys: ['sk-b'] } } }));
  const gw = await startGateway(['--replica', replicas[0].baseURL, '--tenants-file', file, '--no-request-log']);
  try {
    const prompt = 'A long shared system prompt for tenants. '.repeat(12);
    const body = { model: 'basalt-mini', prompt, max_tokens: 1 };
    const a = openai(gw.baseURL, 'sk-a');
    const b = openai(gw.baseURL, 'sk-b');
    await a.completions.create(body);
    const again = await a.completions.create(body);
    assert.ok(again.usage.prompt_tokens_details?.cached_tokens > 0, JSON.stringify(again.usage));
    // The same prompt from another tenant finds nothing of a's in the cache.
    const other = await b.completions.create(body);
    assert.equal(other.usage.prompt_tokens_details?.cached_tokens ?? 0, 0, JSON.stringify(other.usage));
    // a's bucket (3) is spent: 429 with Retry-After.
    await a.completions.create(body);
    const r = await fetch(`${gw.baseURL}/v1/completions`, { method: 'POST', body: JSON.stringify(body),
      headers: { 'Content-Type': 'application/json', Authorization: 'Bearer sk-a' } });
    assert.equal(r.status, 429);
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
    await assert.rejects(openai(gw.baseURL, 'sk-nobody').completions.create(body), (e) => e.status === 401);
  } finally {
    const { code } = await gw.stop();
    assert.equal(code, 0, gw.log());
  }
});

test('40 streams survive a replica SIGKILLed and another SIGSTOPped mid-stream, text for text', async () => {
  const fleet = await Promise.all([0, 1, 2, 3].map(() => startServer(['--threads', '1', '--no-request-log'])));
  const gw = await startGateway([...fleet.flatMap((r) => ['--replica', r.baseURL]), '--stall-timeout', '1',
                                 '--no-request-log']);
  try {
    // Greedy, seeded sampling, penalties and a JSON schema; some with n = 2.
    const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 },
                     tags: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 3 } },
                     required: ['name', 'tags'], additionalProperties: false };
    const bodies = [];
    for (let i = 0; i < 40; ++i) {
      const kind = i % 4;
      const b = { model: 'basalt-mini', prompt: `Failover ${i}:`, max_tokens: 120, n: i % 5 === 0 ? 2 : 1 };
      if (kind === 0) Object.assign(b, { temperature: 0, ignore_eos: true });
      if (kind === 1) Object.assign(b, { temperature: 1, top_p: 0.9, seed: 100 + i, ignore_eos: true });
      if (kind === 2) Object.assign(b, { temperature: 0, frequency_penalty: 0.5, presence_penalty: 0.3,
                                         ignore_eos: true });
      if (kind === 3) {
        Object.assign(b, { temperature: 1, seed: 200 + i, max_tokens: 400,
                           response_format: { type: 'json_schema', json_schema: { name: 'item', schema } } });
      }
      bodies.push(b);
    }
    const texts = (choices) => choices.sort((a, b) => a.index - b.index).map((c) => c.text);
    // The texts without a fault, from one replica directly.
    const direct = openai(fleet[0].baseURL);
    const expected = [];
    for (const b of bodies) expected.push(texts((await direct.completions.create(b)).choices));
    const through = openai(gw.baseURL);
    let started = 0;
    let markAll;
    const allStarted = new Promise((r) => { markAll = r; });
    const runs = bodies.map(async (b) => {
      const got = Array.from({ length: b.n }, (_, index) => ({ index, text: '' }));
      let first = true;
      const stream = await through.completions.create({ ...b, stream: true });
      for await (const chunk of stream) {
        if (chunk.error) throw new Error(JSON.stringify(chunk.error));
        for (const c of chunk.choices) got[c.index].text += c.text ?? '';
        if (first) {
          first = false;
          if (++started === bodies.length) markAll();
        }
      }
      return texts(got);
    });
    await allStarted;
    fleet[1].child.kill('SIGKILL');
    fleet[2].child.kill('SIGSTOP');
    const results = await Promise.all(runs);
    for (let i = 0; i < bodies.length; ++i) assert.deepEqual(results[i], expected[i], `stream ${i}`);
    for (let i = 3; i < bodies.length; i += 4)
      for (const text of results[i]) JSON.parse(text);  // the schema's documents
    const m = parseMetrics(await (await fetch(`${gw.baseURL}/metrics`)).text());
    const failovers = Object.entries(m).filter(([k]) => k.startsWith('basalt_route_failovers_total'))
      .reduce((sum, [, v]) => sum + v, 0);
    assert.ok(failovers >= 2, JSON.stringify(m));
    // The stopped replica, woken, sees its clients gone and frees their KV.
    fleet[2].child.kill('SIGCONT');
    assert.ok(await waitFor(async () => {
      const r = parseMetrics(await (await fetch(`${fleet[2].baseURL}/metrics`)).text());
      return metric(r, 'basalt_kv_cache_used_tokens') === 0 && metric(r, 'basalt_requests_running') === 0;
    }, 20000));
  } finally {
    fleet[2].child.kill('SIGCONT');
    await gw.stop();
    for (const r of [fleet[0], fleet[2], fleet[3]]) await r.stop();
  }
});
