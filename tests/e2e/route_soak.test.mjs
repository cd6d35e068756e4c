// Soak of `basalt route` (label "soak": not in the default test run; run it
// with `ctest --test-dir build -L soak`): BASALT_SOAK_REQUESTS (default
// 100,000) short requests through the gateway to two `basalt serve`
// replicas of the bundled model, 32 at a time, half streamed, half greedy
// and half sampled, a fifth of them abandoned by their client after a
// random few milliseconds, and every 20 s one replica stopped (SIGSTOP) for
// 3 s, so that streams on it fail over and whole answers wait it out.
// Then: no request ended in anything but its answer or the client's own
// abort; the gateway's in-flight gauges are 0; each replica holds no KV
// and runs nothing; and the gateway's resident memory, sampled every 10 s,
// is flat over the second half of the run (its least-squares growth over
// that half under 1 % plus 1 MiB).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { startServer, startGateway, parseMetrics, metric, waitFor } from './server.mjs';

const total = Number(process.env.BASALT_SOAK_REQUESTS ?? 100000);
const concurrency = 32;

function rssBytes(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(status.match(/VmRSS:\s+(\d+) kB/)[1]) * 1024;
}

// Least-squares slope of (t, y) times the span of t: the growth a line
// fitted to the samples shows over them.
function fittedGrowth(samples) {
  const n = samples.length;
  const mt = samples.reduce((s, p) => s + p.t, 0) / n;
  const my = samples.reduce((s, p) => s + p.y, 0) / n;
  let num = 0, den = 0;
  for (const p of samples) {
    num += (p.t - mt) * (p.y - my);
    den += (p.t - mt) * (p.t - mt);
  }
  return den === 0 ? 0 : (num / den) * (samples[n - 1].t - samples[0].t);
}

async function one(baseURL, i) {
  const body = {
    model: 'basalt-mini',
    prompt: `Soak request ${i % 97}: the`,
    max_tokens: 2 + (i % 5),
    temperature: i % 2 === 0 ? 0 : 1,
    seed: i,
    stream: i % 4 < 2,
  };
  const abandon = i % 5 === 0;
  const controller = new AbortController();
  if (abandon) setTimeout(() => controller.abort(), i % 20);
  try {
    const r = await fetch(`${baseURL}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    const text = await r.text();
    if (r.status !== 200) return `status ${r.status}: ${text.slice(0, 200)}`;
    // An error event is a `data: {"error": ...}` line (the text of a token
    // may well be "error").
    if (body.stream && (!text.includes('data: [DONE]') || /^data: \{"error"/m.test(text)))
      return `stream: ${text.slice(-300)}`;
    return 'ok';
  } catch (e) {
    if (abandon && e.name === 'AbortError') return 'abandoned';
    return `${e.name}: ${e.message}`;
  }
}

test(`${total} requests with cancels and stalls leave nothing behind`, { timeout: 3 * 3600 * 1000 }, async () => {
  const replicas = await Promise.all([0, 1].map(() => startServer(['--threads', '1', '--no-request-log'])));
  const gateway = await startGateway([
    ...replicas.flatMap((r) => ['--replica', r.baseURL]),
    '--stall-timeout', '2', '--no-request-log',
  ]);
  const start = Date.now();
  const rss = [];
  const sampler = setInterval(() => rss.push({ t: (Date.now() - start) / 1000, y: rssBytes(gateway.child.pid) }), 10000);
  let stalled = 0;
  const staller = setInterval(() => {
    const r = replicas[stalled++ % 2];
    r.child.kill('SIGSTOP');
    setTimeout(() => r.child.kill('SIGCONT'), 3000);
  }, 20000);
  const outcomes = new Map();
  const unexpected = [];
  try {
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < total; i = next++) {
        const outcome = await one(gateway.baseURL, i);
        const key = outcome === 'ok' || outcome === 'abandoned' ? outcome : 'unexpected';
        outcomes.set(key, (outcomes.get(key) ?? 0) + 1);
        if (key === 'unexpected' && unexpected.length < 10) unexpected.push(`request ${i}: ${outcome}`);
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    clearInterval(staller);
    clearInterval(sampler);
    for (const r of replicas) r.child.kill('SIGCONT');
    const seconds = (Date.now() - start) / 1000;
    console.log(`soak: ${total} requests in ${seconds.toFixed(0)} s: ${JSON.stringify(Object.fromEntries(outcomes))}`);
    assert.deepEqual(unexpected, [], 'requests that ended otherwise than answered or abandoned');

    // Nothing in flight at the gateway, nothing held by the replicas.
    assert.ok(await waitFor(async () => {
      const m = parseMetrics(await (await fetch(`${gateway.baseURL}/metrics`)).text());
      const replicaInFlight = Object.entries(m).filter(([k]) => k.startsWith('basalt_route_replica_in_flight{'))
        .reduce((s, [, v]) => s + v, 0);
      return metric(m, 'basalt_route_requests_in_flight') === 0 && replicaInFlight === 0;
    }, 30000), 'the gateway still counts requests in flight');
    for (const r of replicas) {
      assert.ok(await waitFor(async () => {
        const m = parseMetrics(await (await fetch(`${r.baseURL}/metrics`)).text());
        return metric(m, 'basalt_kv_cache_used_tokens') === 0 && metric(m, 'basalt_requests_running') === 0;
      }, 30000), `replica ${r.baseURL} still holds KV or runs requests`);
    }

    // Resident memory: flat over the second half.
    rss.push({ t: (Date.now() - start) / 1000, y: rssBytes(gateway.child.pid) });
    const half = rss.slice(Math.floor(rss.length / 2));
    if (half.length >= 3) {
      const mean = half.reduce((s, p) => s + p.y, 0) / half.length;
      const growth = fittedGrowth(half);
      console.log(`soak: gateway RSS ${(rss[0].y / 2 ** 20).toFixed(1)} MiB at 10 s, ${(mean / 2 ** 20).toFixed(1)} MiB ` +
                  `mean over the second half, fitted growth there ${(growth / 2 ** 20).toFixed(2)} MiB`);
      assert.ok(growth < 0.01 * mean + 2 ** 20, `gateway RSS grew ${growth} bytes over the second half`);
    }
  } finally {
    clearInterval(staller);
    clearInterval(sampler);
    for (const r of replicas) r.child.kill('SIGCONT');
    const { code } = await gateway.stop();
    for (const r of replicas) await r.stop();
    assert.equal(code, 0, gateway.log().slice(-2000));
  }
});
