// `basalt route` over `basalt serve` replicas of the bundled model, driven
// by the official `openai` npm client: answers through the gateway equal
// the replicas' own, requests spread over them, a replica killed with
// SIGKILL is retried around before the first byte, SIGHUP reloads the
// replica file, tenants are limited and namespaced, a burst at ten times
// the replicas' rate is queued by class (the excess 429 with Retry-After,
// interactive requests first), and 40 streams live through one replica
// SIGKILLed and another SIGSTOPped mid-stream with the texts they would
// have had.
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
  // The gateway weighs each replica by its last scrape: start once neither
  // shows work (the test before sent a request straight to a replica, which
  // a slow machine's scrape may still see), then send the four together,
  // so that the gateway's own count of what it sent decides. Long enough
  // answers that the four overlap; still, on a loaded machine the client may
  // send one after another has finished (a fresh-clone run saw 3 and 1), so
  // what is required is that both replicas answered some and all were answered.
  const idle = (m) => replicas.every((r) => {
    const id = `http://127.0.0.1:${r.port}`;
    return m[`basalt_route_replica_running{replica="${id}"}`] === 0 && m[`basalt_route_replica_waiting{replica="${id}"}`] === 0;
  });
  assert.ok(await waitFor(async () => idle(await gatewayMetrics()), 20000), 'the replicas never scraped idle');
  const before = await gatewayMetrics();
  await Promise.all([0, 1, 2, 3].map((i) =>
    through.completions.create({ model: 'basalt-mini', prompt: `spread ${i}`, max_tokens: 24, ignore_eos: true })));
  const now = await gatewayMetrics();
  let total = 0;
  for (const r of replicas) {
    const id = `http://127.0.0.1:${r.port}`;
    const answered = attempts(now, id, 'answered') - attempts(before, id, 'answered');
    assert.ok(answered >= 1, `${id} answered none of the four: ${JSON.stringify(now)}`);
    total += answered;
  }
  assert.equal(total, 4);
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
  let m = await gatewayMetrics();
  // Tried once (or by a probe-free half-open trial), then ejected; or, where
  // the machine is slow (a sanitizer build), found down by a /ready probe or
  // a metrics scrape before any request went to it. When no request went to
  // it, the next probe (every 2 s) or scrape (every 1 s) must find it down.
  const dead = `http://127.0.0.1:${replicas[1].port}`;
  const tried = attempts(m, dead, 'unreachable');
  assert.ok(tried <= 2, JSON.stringify(m));
  if (tried >= 1) {
    assert.equal(m[`basalt_route_replica_breaker_state{replica="${dead}"}`], 2, JSON.stringify(m));
  } else {
    const isDown = (metrics) => metrics[`basalt_route_replica_healthy{replica="${dead}"}`] === 0 ||
      (metrics[`basalt_route_replica_scrape_failures_total{replica="${dead}"}`] ?? 0) >= 1;
    await waitFor(async () => isDown(m) || isDown((m = await gatewayMetrics())), 6000);
    assert.ok(isDown(m), JSON.stringify(m));
  }
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

test('a bad tenants file, policy, pool or breaker flag at start is an error naming it, not a crash', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'basalt-bad-'));
  const file = join(dir, 'tenants.json');
  writeFileSync(file, JSON.stringify({ tenants: { a: { keys: ['k'], weight: -2 } } }));
  const regions = join(dir, 'regions.json');
  writeFileSync(regions, JSON.stringify({ tenants: { a: { keys: ['k'], regions: ['eu', 'eu'] } } }));
  for (const [args, says] of [[['--tenants-file', file], /tenants\.a\.weight must be a positive number/],
                              [['--tenants-file', regions], /tenants\.a\.regions\[1\] is given twice/],
                              [['--policy', 'bogus'], /--policy bogus: expected/],
                              [['--home-pool', 'eu-a'], /--home-pool eu-a: no replica is labelled pool=eu-a/],
                              [['--home-pool', 'e u'], /--home-pool must be a pool name/],
                              [['--assumed-prefill-rate', '0'], /--assumed-prefill-rate must be in/],
                              [['--breaker-failures', '0'], /--breaker-failures must be in \[1, 1000\]/],
                              [['--breaker-open-seconds', '0'], /--breaker-open-seconds must be in \[0\.01, 3600\]/],
                              [['--breaker-half-open-successes', '1001'],
                               /--breaker-half-open-successes must be in \[1, 1000\]/]]) {
    await assert.rejects(startGateway(['--replica', replicas[0].baseURL, ...args], { timeoutMs: 20000 }),
                         (e) => /route exited with 1:/.test(e.message) && says.test(e.message));
  }
  // In range, they are taken.
  const gw = await startGateway(['--replica', replicas[0].baseURL, '--breaker-failures', '1',
                                 '--breaker-open-seconds', '0.5', '--breaker-half-open-successes', '1']);
  const { code } = await gw.stop();
  assert.equal(code, 0, gw.log());
});

test('tenants: keys, 429 past a rate, and a cache namespace each', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'basalt-tenants-'));
  const file = join(dir, 'tenants.json');
  writeFileSync(file, JSON.stringify({ tenants: {
    // A refill of one request in 20 s: the four below never see one, however
    // slowly a sanitizer build runs them.
    a: { keys: ['sk-a'], limits: { rps: 0.05, burst: 3 } },
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

// One streamed completion through the gateway as `key`: its status, its
// Retry-After, and the seconds to its first event (a 200's).
async function timedStream(baseURL, key, body) {
  const start = performance.now();
  const r = await fetch(`${baseURL}/v1/completions`, { method: 'POST', body: JSON.stringify({ ...body, stream: true }),
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` } });
  const out = { status: r.status, retryAfter: r.headers.get('retry-after'), ttft: null, error: null };
  if (r.status !== 200) {
    await r.text();
    return out;
  }
  const decoder = new TextDecoder();
  let text = '';
  for await (const chunk of r.body) {
    text += decoder.decode(chunk, { stream: true });
    if (out.ttft === null && text.includes('data: ')) out.ttft = (performance.now() - start) / 1000;
  }
  if (!text.includes('data: [DONE]') || text.includes('"error"')) out.error = text.slice(-300);
  return out;
}

test('a burst: interactive goes first, the excess is 429 with Retry-After, nothing is 5xx', async () => {
  // Replicas that run 2 requests at a time, so a burst queues: in them up
  // to the gateway's saturation gate (5 waiting), then in the gateway.
  const fleet = await Promise.all([0, 1].map(() => startServer(['--threads', '1', '--max-running', '2',
                                                                '--no-request-log'])));
  const dir = mkdtempSync(join(tmpdir(), 'basalt-burst-'));
  const file = join(dir, 'tenants.json');
  writeFileSync(file, JSON.stringify({
    classes: { interactive: { priority: 2, queue_deadline_ms: 30000, ttft_slo_ms: 3000 },
               batch: { priority: 1, queue_deadline_ms: 1500 },
               spare: { priority: 0, sheddable: true, queue_deadline_ms: 1000 } },
    tenants: { live: { keys: ['sk-live'], class: 'interactive' },
               bulk: { keys: ['sk-bulk'], class: 'batch', weight: 2, limits: { max_queued: 16 } },
               spare: { keys: ['sk-spare'], class: 'spare' } } }));
  const gw = await startGateway([...fleet.flatMap((r) => ['--replica', r.baseURL]), '--tenants-file', file,
                                 '--policy', 'least-load', '--metrics-interval', '0.1', '--no-request-log']);
  try {
    // Requests of about half a second of decoding each, whatever this
    // machine's speed (calibrated on one request alone): two replicas of two
    // slots serve some 8 a second, so R is well within them and 10·R well
    // past them.
    const calibration = { model: 'basalt-mini', max_tokens: 200, temperature: 0, ignore_eos: true };
    assert.equal((await timedStream(fleet[0].baseURL, 'none', { ...calibration, prompt: 'Warm:' })).status, 200);
    let start = performance.now();
    await timedStream(fleet[0].baseURL, 'none', { ...calibration, prompt: 'Alone:' });
    const perToken = (performance.now() - start) / 1000 / 200;
    const maxTokens = Math.max(50, Math.min(1000, Math.round(0.5 / perToken)));
    const body = { model: 'basalt-mini', max_tokens: maxTokens, temperature: 0, ignore_eos: true };
    // One such request alone, timed: TTFT is bounded in multiples of it.
    start = performance.now();
    assert.equal((await timedStream(fleet[0].baseURL, 'none', { ...body, prompt: 'Alone again:' })).status, 200);
    const single = (performance.now() - start) / 1000;
    const sent = [];
    const send = (tenant, i) => {
      sent.push({ tenant, result: timedStream(gw.baseURL, `sk-${tenant}`, { ...body, prompt: `Burst ${i}:` }) });
    };
    const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
    // Rate R = 2/s for 3 s (one tenant after another), then 10·R for 4 s:
    // the interactive tenant sends 2/s, batch and sheddable the rest.
    let i = 0;
    for (let t = 0; t < 6; ++t, ++i) {
      send(['live', 'bulk', 'spare'][t % 3], i);
      await sleep(500);
    }
    for (let t = 0; t < 80; ++t, ++i) {
      send(t % 10 === 0 ? 'live' : t % 2 ? 'bulk' : 'spare', i);
      await sleep(50);
    }
    const results = await Promise.all(sent.map(async (s) => ({ tenant: s.tenant, ...(await s.result) })));
    const by = (tenant) => results.filter((r) => r.tenant === tenant);
    const summary = JSON.stringify(['live', 'bulk', 'spare'].map((t) => [t, by(t).map((r) => r.status)])) +
                    ` live TTFTs ${by('live').map((r) => r.ttft?.toFixed(2))}`;
    for (const r of results) {
      assert.ok(r.status === 200 || r.status === 429, summary);
      if (r.status === 429) {
        const after = Number(r.retryAfter);
        assert.ok(Number.isInteger(after) && after >= 1 && after <= 60, JSON.stringify(r));
      }
      assert.equal(r.error, null, JSON.stringify(r));
    }
    // The excess was refused, the interactive tenant's requests were not,
    // and each got its first token within a few single-request times
    // (first come, first served behind the burst would take ten times
    // longer: some 80 requests at 8 a second).
    assert.ok(results.filter((r) => r.status === 429).length >= 20, summary);
    assert.ok(by('live').every((r) => r.status === 200), summary);
    const bound = Math.max(3, 6 * single);
    assert.ok(Math.max(...by('live').map((r) => r.ttft)) <= bound,
              `bound ${bound.toFixed(2)} s, ${maxTokens} tokens a request: ${summary}`);
    const m = parseMetrics(await (await fetch(`${gw.baseURL}/metrics`, { headers: { Authorization: 'Bearer sk-live' } })).text());
    const rejected = (tenant, reason) => m[`basalt_route_rejections_total{tenant="${tenant}",reason="${reason}"}`] ?? 0;
    assert.ok(rejected('spare', 'saturated') + rejected('spare', 'deadline') >= 1, JSON.stringify(m));
    assert.ok(rejected('bulk', 'deadline') + rejected('bulk', 'queue_full') >= 1, JSON.stringify(m));
    assert.equal(m['basalt_route_queue_depth{class="interactive",tenant="live"}'], 0);
  } finally {
    await gw.stop();
    for (const r of fleet) await r.stop();
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
