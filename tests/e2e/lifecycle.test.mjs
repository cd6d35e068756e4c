// Process lifecycle: /health and /ready, SIGTERM draining (running requests
// finish, new connections are refused, exit 0), and the drain deadline.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './server.mjs';

// Starts a streamed completion and resolves `firstChunk` when data arrives.
function streamCompletion(baseURL, body) {
  let markFirst;
  const firstChunk = new Promise((r) => { markFirst = r; });
  const done = (async () => {
    const response = await fetch(`${baseURL}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...body, stream: true }),
    });
    let text = '';
    const decoder = new TextDecoder();
    try {
      for await (const piece of response.body) {
        text += decoder.decode(piece, { stream: true });
        markFirst();
      }
    } catch (e) {
      return { status: response.status, text, error: e.name };
    }
    return { status: response.status, text };
  })();
  return { firstChunk, done };
}

test('SIGTERM lets running requests finish, refuses new ones, and exits 0', async () => {
  const server = await startServer(['--drain-timeout', '60']);
  const health = await fetch(`${server.baseURL}/health`);
  assert.equal(health.status, 200);
  assert.equal((await fetch(`${server.baseURL}/ready`)).status, 200);

  const running = streamCompletion(server.baseURL, { prompt: 'Draining', max_tokens: 1200, ignore_eos: true });
  await running.firstChunk;
  server.child.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 100));
  // New connections are refused; an idle kept-alive one answers 503.
  const ready = await fetch(`${server.baseURL}/ready`).catch(() => null);
  assert.ok(ready === null || ready.status === 503, `ready answered ${ready?.status}`);
  const late = await fetch(`${server.baseURL}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'late' }),
  }).catch(() => null);
  assert.ok(late === null || late.status === 503, `a late request got ${late?.status}`);
  const result = await running.done;
  assert.equal(result.status, 200);
  assert.ok(result.text.includes('"finish_reason":"length"'), result.text.slice(-400));
  assert.ok(result.text.trimEnd().endsWith('data: [DONE]'));
  const { code } = await server.exited;
  assert.equal(code, 0, server.log());
  assert.match(server.log(), / info stopped requests_cut=0\n/);
  // Every line carries a UTC timestamp.
  for (const line of server.log().trim().split('\n'))
    assert.match(line, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (info|warning|error) /, line);
});

test('the drain deadline cuts off what is left, tells the clients, and still exits 0', async () => {
  const server = await startServer(['--drain-timeout', '0.5', '--log-format', 'json']);
  const running = streamCompletion(server.baseURL, { prompt: 'Forever', max_tokens: 2000, ignore_eos: true });
  await running.firstChunk;
  // A whole (non-streamed) request cut at the deadline gets a 503 body.
  const whole = fetch(`${server.baseURL}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'X-Request-Id': 'whole-1' },
    body: JSON.stringify({ prompt: 'Also forever', max_tokens: 2000, ignore_eos: true }),
  });
  await new Promise((r) => setTimeout(r, 300));
  const t0 = Date.now();
  server.child.kill('SIGTERM');
  const { code } = await server.exited;
  assert.equal(code, 0, server.log());
  assert.ok(Date.now() - t0 < 10000);
  const result = await running.done;
  // The stream ends with an error event, then [DONE].
  assert.match(result.text, /data: \{"error":\{[^\n]*"code":"cut_by_server"/);
  assert.ok(result.text.trimEnd().endsWith('data: [DONE]'), result.text.slice(-300));
  const cut = await whole;
  assert.equal(cut.status, 503);
  assert.equal(cut.headers.get('x-request-id'), 'whole-1');
  assert.match((await cut.json()).error.message, /shutting down/);
  // JSON log lines: both requests logged as cut by the server (503), not as
  // client disconnects (499), and the final count.
  const lines = server.log().trim().split('\n').map((l) => JSON.parse(l));
  const requests = lines.filter((l) => l.event === 'request' && l.endpoint === 'completions');
  assert.equal(requests.length, 2, server.log());
  for (const r of requests) {
    assert.equal(r.status, 503);
    assert.equal(r.outcome, 'cut_by_server');
    assert.match(r.ts, /^\d{4}-\d\d-\d\dT/);
  }
  assert.equal(requests.find((r) => r.client_request_id === 'whole-1')?.id, 'cmpl-whole-1');
  assert.equal(lines.find((l) => l.event === 'stopped').requests_cut, 2);
});

test('--warmup on runs its requests before /ready and leaves the cache empty', async () => {
  const server = await startServer(['--threads', '1', '--warmup', 'on', '--no-request-log']);
  try {
    const log = server.log();
    const warm = log.match(/warmup requests=(\d+) prompt_tokens=(\d+) longest_prompt=(\d+)/);
    assert.ok(warm, log);
    assert.ok(log.indexOf(' warmup ') < log.indexOf(' ready '), log);
    assert.equal(Number(warm[3]), 1024);  // twice the step budget (512), at least 1,024
    const metrics = await (await fetch(`${server.baseURL}/metrics`)).text();
    assert.match(metrics, /\nbasalt_kv_cache_used_tokens{model_name="basalt-mini"} 0\n/);
    assert.match(metrics, /\nbasalt_radix_cache_tokens{model_name="basalt-mini"} 0\n/);
    const r = await fetch(`${server.baseURL}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'After the warm-up', max_tokens: 4, temperature: 0 }),
    });
    assert.equal(r.status, 200);
    assert.equal((await r.json()).usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
  } finally {
    await server.stop();
  }
});
