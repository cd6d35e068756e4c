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
  assert.match(server.log(), /stopped \(0 requests cut off\)/);
});

test('the drain deadline cuts off what is left and still exits 0', async () => {
  const server = await startServer(['--drain-timeout', '0.5']);
  const running = streamCompletion(server.baseURL, { prompt: 'Forever', max_tokens: 2000, ignore_eos: true });
  await running.firstChunk;
  const t0 = Date.now();
  server.child.kill('SIGTERM');
  const { code } = await server.exited;
  assert.equal(code, 0, server.log());
  assert.ok(Date.now() - t0 < 10000);
  const result = await running.done;
  assert.ok(!result.text.includes('[DONE]'));
  assert.match(server.log(), /stopped \(1 requests cut off\)/);
});
