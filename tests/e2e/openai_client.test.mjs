// `basalt serve` on the bundled model, driven by the official `openai` npm
// client: completions and chat, streamed and whole, n > 1, logprobs, stop,
// usage, errors, 500 concurrent streams, and clients killed mid-stream.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, parseMetrics, metric, waitFor } from './server.mjs';

const KEY = 'test-key-1';
let server;
let client;

before(async () => {
  server = await startServer(['--api-key', KEY, '--api-key', 'test-key-2', '--max-running', '64',
                              '--max-queue', '1024', '--no-request-log']);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: KEY, maxRetries: 0, timeout: 600000 });
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

async function metrics() {
  const r = await fetch(`${server.baseURL}/metrics`);
  assert.equal(r.status, 200);
  return parseMetrics(await r.text());
}

async function idle() {
  return waitFor(async () => {
    const m = await metrics();
    return metric(m, 'basalt_requests_in_flight') === 0 && metric(m, 'basalt_requests_running') === 0 &&
        metric(m, 'basalt_kv_cache_used_tokens') === 0;
  });
}

test('models lists the bundled model', async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].id, 'basalt-mini');
  assert.equal(models.data[0].object, 'model');
});

test('greedy completions are stable and streamed text equals whole text', async () => {
  const params = { model: 'basalt-mini', prompt: 'The Debian project is', max_tokens: 24, temperature: 0 };
  const a = await client.completions.create(params);
  const b = await client.completions.create(params);
  assert.equal(a.object, 'text_completion');
  assert.equal(a.choices.length, 1);
  assert.ok(a.choices[0].text.length > 0);
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.equal(a.choices[0].finish_reason, 'length');
  assert.equal(a.usage.completion_tokens, 24);
  assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + 24);

  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, a.choices[0].text);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 24);
  assert.equal(usage.prompt_tokens, a.usage.prompt_tokens);
});

test('chat completions render the chat template, stream a role first, and honour seeds', async () => {
  const messages = [
    { role: 'system', content: 'You answer briefly.' },
    { role: 'user', content: 'What is a package manager?' },
  ];
  const params = { model: 'basalt-mini', messages, max_tokens: 20, temperature: 0.8, seed: 1234 };
  const a = await client.chat.completions.create(params);
  const b = await client.chat.completions.create(params);
  assert.equal(a.object, 'chat.completion');
  assert.equal(a.choices[0].message.role, 'assistant');
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);

  const stream = await client.chat.completions.create({ ...params, stream: true });
  let first = true;
  let content = '';
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    const delta = chunk.choices[0]?.delta ?? {};
    if (first) {
      assert.equal(delta.role, 'assistant');
      first = false;
    }
    content += delta.content ?? '';
  }
  assert.equal(content, a.choices[0].message.content);
});

test('n > 1 gives n choices that differ, sharing the prompt KV', async () => {
  const prompt = 'A long shared system prompt about free software licenses. '.repeat(6);
  const cachedBefore = metric(await metrics(), 'basalt_prompt_tokens_cached_total');
  const r = await client.completions.create({ model: 'basalt-mini', prompt, n: 4, max_tokens: 12, temperature: 1.0,
                                               seed: 7 });
  assert.equal(r.choices.length, 4);
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1, 2, 3]);
  const texts = new Set(r.choices.map((c) => c.text));
  assert.ok(texts.size > 1, 'samples should differ');
  assert.equal(r.usage.completion_tokens, 48);
  // The three later samples took the prompt from the cache (whole 16-token
  // pages with --page-size 16); usage counts the prompt, and its cached
  // tokens, once.
  const cachedNow = metric(await metrics(), 'basalt_prompt_tokens_cached_total');
  assert.ok(cachedNow - cachedBefore >= 3 * (r.usage.prompt_tokens - 16), 'later samples reuse the prompt');
  assert.ok(r.usage.prompt_tokens_details.cached_tokens <= r.usage.prompt_tokens);
  // Sample 0 with seed 7 is what n = 1 with seed 7 draws.
  const single = await client.completions.create({ model: 'basalt-mini', prompt, max_tokens: 12, temperature: 1.0,
                                                    seed: 7 });
  assert.equal(single.choices[0].text, r.choices.find((c) => c.index === 0).text);
});

test('logprobs come with their alternatives', async () => {
  const r = await client.completions.create({ model: 'basalt-mini', prompt: 'Hello', max_tokens: 5, temperature: 0,
                                               logprobs: 3 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 5);
  assert.equal(lp.token_logprobs.length, 5);
  for (let i = 0; i < 5; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    assert.equal(Object.keys(lp.top_logprobs[i]).length <= 3, true);
    // Greedy: the chosen token is the most likely one.
    assert.ok(Math.abs(Math.max(...Object.values(lp.top_logprobs[i])) - lp.token_logprobs[i]) < 1e-4);
  }
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  // Sampled, with logprobs 0: the drawn tokens' own logprobs only.
  const sampled = await client.completions.create({ model: 'basalt-mini', prompt: 'Hello', max_tokens: 6,
                                                     temperature: 1.2, seed: 3, logprobs: 0 });
  for (const x of sampled.choices[0].logprobs.token_logprobs) assert.ok(typeof x === 'number' && x <= 0);
  for (const x of sampled.choices[0].logprobs.top_logprobs) assert.equal(x, null);

  const c = await client.chat.completions.create({ model: 'basalt-mini', messages: [{ role: 'user', content: 'Hi' }],
                                                   max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = c.choices[0].logprobs.content;
  assert.equal(content.length, c.usage.completion_tokens);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(Array.isArray(t.bytes));
  }
});

test('stop strings end the output and are left out', async () => {
  const base = await client.completions.create({ model: 'basalt-mini', prompt: 'The license says', max_tokens: 30,
                                                  temperature: 0 });
  const text = base.choices[0].text;
  const stop = text.trim().split(/\s+/)[2];
  assert.ok(stop, `need a few words in: ${text}`);
  const r = await client.completions.create({ model: 'basalt-mini', prompt: 'The license says', max_tokens: 30,
                                               temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].text, text.slice(0, text.indexOf(stop)));
  assert.equal(r.choices[0].stop_reason, stop);
});

test('errors are OpenAI errors with the right status', async () => {
  await assert.rejects(client.completions.create({ model: 'basalt-mini', prompt: 'x', temperature: -3 }),
                       (e) => e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(client.completions.create({ model: 'no-such-model', prompt: 'x' }),
                       (e) => e.status === 404 && /does not exist/.test(e.message));
  await assert.rejects(client.completions.create({ model: 'basalt-mini', prompt: 'word '.repeat(3000) }),
                       (e) => e.status === 400 && /maximum context length/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'basalt-mini', messages: [] }),
                       (e) => e.status === 400);
  const stranger = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(stranger.models.list(), (e) => e.status === 401);
  const second = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'test-key-2', maxRetries: 0 });
  assert.equal((await second.models.list()).data.length, 1);
});

test('500 concurrent streams finish without an error or a leaked slot', async () => {
  const N = 500;
  const jobs = [];
  for (let i = 0; i < N; i++) {
    jobs.push((async () => {
      const stream = await client.completions.create({ model: 'basalt-mini', prompt: `Request number ${i} says`,
                                                        max_tokens: 8, temperature: 0.7, seed: i, stream: true,
                                                        ignore_eos: true });
      let chunks = 0;
      let finish = null;
      for await (const chunk of stream) {
        chunks++;
        if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      }
      return { chunks, finish };
    })());
  }
  const results = await Promise.all(jobs);
  for (const r of results) {
    assert.equal(r.finish, 'length');
    assert.ok(r.chunks >= 2);
  }
  assert.ok(await idle(), 'the server returns to idle');
  const m = await metrics();
  assert.equal(metric(m, 'basalt_kv_cache_used_tokens'), 0);
});

test('clients killed mid-stream cancel their requests and free the KV', async () => {
  const before = metric(await metrics(), 'basalt_client_disconnects_total');
  const controllers = [];
  const jobs = [];
  for (let i = 0; i < 16; i++) {
    const controller = new AbortController();
    controllers.push(controller);
    jobs.push((async () => {
      const stream = await client.completions.create(
          { model: 'basalt-mini', prompt: `Stream ${i}`, max_tokens: 1500, ignore_eos: true, stream: true },
          { signal: controller.signal });
      let chunks = 0;
      try {
        for await (const chunk of stream) {
          chunks += chunk.choices.length;
          if (chunks >= 2) controller.abort();
        }
      } catch (e) {
        // An aborted read may end the loop quietly or with an AbortError.
      }
      return chunks;
    })());
  }
  const received = await Promise.all(jobs);
  for (const n of received) assert.ok(n < 1500, `a stream was not cut off (${n} chunks)`);
  assert.ok(await idle(), 'all cancelled requests released their KV');
  const m = await metrics();
  assert.equal(metric(m, 'basalt_client_disconnects_total') - before, 16);
});
