// What clients coming from OpenAI and vLLM rely on, through the official
// `openai` npm client and plain fetch: fields Basalt does not implement are
// refused by name (never silently ignored), agent-loop tool messages render,
// usage and sample limits are consistent, request ids are echoed, and the
// small endpoints, headers, metrics and logs that gateways and tools read.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, parseMetrics, metric } from './server.mjs';

let server;
let client;

before(async () => {
  // Small limits so the tests can reach them: 8 running (so --max-n is 4)
  // and 4 KiB bodies.
  server = await startServer(['--max-running', '8', '--max-body-bytes', '4096', '--served-model-name', 'basalt-mini']);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

const chat = (extra) => client.chat.completions.create({
  model: 'basalt-mini', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0, ...extra,
});

test('fields Basalt does not implement are 400s that name them', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }];
  const refused = [
    [{ guided_whitespace_pattern: ' ' }, 'guided_whitespace_pattern'],
    [{ use_beam_search: true }, 'use_beam_search'],
    [{ prompt_logprobs: 1, stream: true }, 'prompt_logprobs'],  // vLLM refuses it on streams too
    [{ max_token: 5 }, 'max_token'],  // a typo is not silently the default
  ];
  for (const [extra, param] of refused) {
    await assert.rejects(chat(extra), (e) => e.status === 400 && e.param === param && e.message.includes(param),
                         `${JSON.stringify(extra)} should be refused naming ${param}`);
  }
  await assert.rejects(client.completions.create({ model: 'basalt-mini', prompt: 'x', n: 1, best_of: 3 }),
                       (e) => e.status === 400 && e.param === 'best_of');
  // The values that ask for what Basalt does anyway are accepted.
  const ok = await chat({ tools, tool_choice: 'auto', use_beam_search: false, best_of: 1, guided_json: null,
                          parallel_tool_calls: true });
  assert.equal(ok.choices.length, 1);
});

test("vLLM's token-id fields, allowed_token_ids and bad_words through the OpenAI client", async () => {
  const base = { model: 'basalt-mini', prompt: 'The Debian project', max_tokens: 6, temperature: 0 };
  const plain = await client.completions.create({ ...base, return_token_ids: true });
  const ids = plain.choices[0].token_ids;
  assert.equal(ids.length, 6);
  assert.ok(plain.choices[0].prompt_token_ids.length > 0);
  const allowed = [ids[1], ids[2]];
  const masked = await client.completions.create({ ...base, return_token_ids: true, allowed_token_ids: allowed });
  assert.equal(masked.choices[0].token_ids.length, 6);
  for (const id of masked.choices[0].token_ids) assert.ok(allowed.includes(id), `${id} is not in ${allowed}`);
  const logprobs = await client.completions.create({ ...base, logprobs: 1, return_tokens_as_token_ids: true });
  assert.deepEqual(logprobs.choices[0].logprobs.tokens, ids.map((id) => `token_id:${id}`));
  // A word the model writes as one token of its own, banned (as the C++
  // server test picks it).
  const texts = (await client.completions.create({ ...base, logprobs: 1 })).choices[0].logprobs.tokens;
  const word = texts.map((t) => t.trim()).find((t) => t.length > 0 && !/\s/.test(t));
  assert.ok(word, JSON.stringify(texts));
  const banned = await client.completions.create({ ...base, bad_words: [word] });
  assert.notEqual(banned.choices[0].text, plain.choices[0].text, `banned "${word}"`);
});

test('an agent loop with tool calls and tool results renders through the chat template', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
                                                  parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null,
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '18 C and sunny' },
  ];
  const r = await client.chat.completions.create({ model: 'basalt-mini', messages, tools, max_tokens: 4,
                                                   temperature: 0 });
  assert.equal(r.choices[0].message.role, 'assistant');
  // What the template saw: the parsed arguments and the tool's answer.
  const rendered = await fetch(`${server.baseURL}/tokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ messages, tools }),
  }).then((x) => x.json());
  const text = await fetch(`${server.baseURL}/detokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ tokens: rendered.tokens }),
  }).then((x) => x.json());
  assert.ok(text.prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
            text.prompt);
  assert.ok(text.prompt.includes('<tool_result>18 C and sunny</tool_result>'), text.prompt);
  // A template that cannot take null content answers 400 with its error.
  await assert.rejects(
      client.chat.completions.create({ model: 'basalt-mini', messages, max_tokens: 4,
                                       chat_template: "{% for m in messages %}{{ 'x' + m['content'] }}{% endfor %}" }),
      (e) => e.status === 400 && /chat template error/.test(e.message));
});

test('usage counts a prompt once for all its samples, and n is capped by the server', async () => {
  const prompt = 'A shared prompt about the Debian package archive and its mirrors. '.repeat(4);
  const r = await client.completions.create({ model: 'basalt-mini', prompt, n: 4, max_tokens: 3, temperature: 1,
                                               seed: 5 });
  assert.equal(r.choices.length, 4);
  assert.ok(r.usage.prompt_tokens_details.cached_tokens <= r.usage.prompt_tokens);
  // Asked again, the prompt comes from the cache: cached is still per prompt.
  const again = await client.completions.create({ model: 'basalt-mini', prompt, n: 4, max_tokens: 3, seed: 6 });
  assert.equal(again.usage.prompt_tokens, r.usage.prompt_tokens);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 16);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens <= again.usage.prompt_tokens);
  // --max-running 8: one request may take at most 4 samples.
  await assert.rejects(client.completions.create({ model: 'basalt-mini', prompt: 'x', n: 5 }),
                       (e) => e.status === 400 && e.param === 'n' && /--max-n/.test(e.message));
  await assert.rejects(client.completions.create({ model: 'basalt-mini', prompt: ['a', 'b', 'c'], n: 2 }),
                       (e) => e.status === 400 && e.param === 'n');
});

test('a client X-Request-Id is echoed and names the response', async () => {
  const r = await fetch(`${server.baseURL}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'X-Request-Id': 'trace-42' },
    body: JSON.stringify({ prompt: 'Hello', max_tokens: 2 }),
  });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-request-id'), 'trace-42');
  assert.equal((await r.json()).id, 'cmpl-trace-42');
  const bad = await fetch(`${server.baseURL}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'X-Request-Id': 'trace-43' },
    body: JSON.stringify({ prompt: 'Hello', temperature: -1 }),
  });
  assert.equal(bad.status, 400);
  assert.equal(bad.headers.get('x-request-id'), 'trace-43');
  const body = await client.completions.create({ model: 'basalt-mini', prompt: 'Hi', max_tokens: 1,
                                                  request_id: 'from-body' });
  assert.equal(body.id, 'cmpl-from-body');
});

test('GET /v1/models/{id}, HEAD /health and /ready', async () => {
  const m = await client.models.retrieve('basalt-mini');
  assert.equal(m.id, 'basalt-mini');
  assert.equal(m.object, 'model');
  await assert.rejects(client.models.retrieve('gpt-4'), (e) => e.status === 404);
  for (const path of ['/health', '/ready']) {
    const r = await fetch(`${server.baseURL}${path}`, { method: 'HEAD' });
    assert.equal(r.status, 200, path);
    assert.equal(await r.text(), '');
    assert.ok(Number(r.headers.get('content-length')) > 0);
  }
  const version = await fetch(`${server.baseURL}/version`).then((x) => x.json());
  assert.match(version.version, /^\d+\.\d+\.\d+$/);
});

test('streamed completions carry logprobs.text_offset, as whole ones do', async () => {
  const params = { model: 'basalt-mini', prompt: 'The archive', max_tokens: 6, temperature: 0, logprobs: 1,
                   echo: true };
  const whole = await client.completions.create(params);
  const offsets = [];
  const tokens = [];
  for await (const chunk of await client.completions.create({ ...params, stream: true })) {
    const lp = chunk.choices[0]?.logprobs;
    if (lp) {
      offsets.push(...lp.text_offset);
      tokens.push(...lp.tokens);
    }
  }
  assert.deepEqual(tokens, whole.choices[0].logprobs.tokens);
  assert.deepEqual(offsets, whole.choices[0].logprobs.text_offset);
  // The echoed prompt's tokens first, from offset 0; the output's after it.
  assert.equal(offsets[0], 0);
  assert.ok(offsets.includes('The archive'.length), `${offsets}`);
});

test('loglikelihoods as lm-evaluation-harness asks for them: echo, logprobs and token-id prompts', async () => {
  const { choices: [tokenized] } = await client.completions.create({
    model: 'basalt-mini', prompt: 'The archive holds every package', max_tokens: 1, return_token_ids: true });
  const ids = tokenized.prompt_token_ids;
  // lm-eval's request: the context and continuation as ids, one token more.
  const r = await client.completions.create({ model: 'basalt-mini', prompt: [ids], max_tokens: 1, temperature: 0,
                                              logprobs: 1, echo: true, seed: 1234 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.token_logprobs.length, ids.length + 1);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < lp.token_logprobs.length; ++i) {
    assert.ok(lp.token_logprobs[i] <= 0, `token ${i}: ${lp.token_logprobs[i]}`);
    const best = Math.max(...Object.values(lp.top_logprobs[i]));
    assert.ok(lp.token_logprobs[i] <= best + 1e-6, `token ${i} above the best alternative`);
  }
  // vLLM's field says the same of the prompt tokens, with their ranks.
  const vllm = await client.completions.create({ model: 'basalt-mini', prompt: [ids], max_tokens: 1,
                                                 prompt_logprobs: 0 });
  const pl = vllm.choices[0].prompt_logprobs;
  assert.equal(pl.length, ids.length);
  assert.equal(pl[0], null);
  for (let i = 1; i < ids.length; ++i) {
    const own = pl[i][String(ids[i])];
    assert.ok(Math.abs(own.logprob - lp.token_logprobs[i]) < 1e-4, `token ${i}`);
    assert.ok(own.rank >= 1);
    assert.equal(typeof own.decoded_token, 'string');
  }
});

test('continuous usage stats put usage in every chunk', async () => {
  let chunks = 0;
  let last = null;
  for await (const chunk of await client.completions.create({
    model: 'basalt-mini', prompt: 'Usage', max_tokens: 4, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true },
  })) {
    assert.ok(chunk.usage, JSON.stringify(chunk));
    assert.ok(!last || chunk.usage.completion_tokens >= last.completion_tokens);
    last = chunk.usage;
    chunks++;
  }
  assert.ok(chunks >= 2);
  assert.equal(last.completion_tokens, 4);
});

test('early rejections are logged and counted; metrics carry vLLM counters and histograms', async () => {
  const big = await fetch(`${server.baseURL}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'x'.repeat(8000) }),
  });
  assert.equal(big.status, 413);
  const text = await fetch(`${server.baseURL}/metrics`).then((x) => x.text());
  const m = parseMetrics(text);
  assert.equal(m['basalt_http_requests_total{model_name="basalt-mini",route="/v1/completions",status="413"}'], 1);
  assert.match(server.log(), / warning request remote=\S+ method=POST path=\/v1\/completions status=413 outcome=rejected_by_transport/);
  for (const name of ['vllm:prompt_tokens_total', 'vllm:generation_tokens_total', 'vllm:num_preemptions_total',
                      'vllm:prefix_cache_queries_total', 'vllm:prefix_cache_hits_total',
                      'vllm:time_to_first_token_seconds_count', 'vllm:e2e_request_latency_seconds_count',
                      'vllm:inter_token_latency_seconds_count', 'vllm:time_per_output_token_seconds_count',
                      'vllm:request_queue_time_seconds_count']) {
    assert.ok(metric(m, name) !== undefined, `${name} missing`);
  }
  assert.ok(metric(m, 'vllm:generation_tokens_total') > 0);
  assert.ok(m['vllm:request_success_total{model_name="basalt-mini",finished_reason="length"}'] > 0, text);
  // No request line reports a time to first token it never had.
  assert.doesNotMatch(server.log(), /ttft_s=-/);
});

// splitmix64's finalizer and the block hash of runtime/kv_events.h, as a
// router would compute them (BigInt: the hashes are 64-bit).
const M64 = (1n << 64n) - 1n;
function mix64(x) {
  x = (x + 0x9E3779B97F4A7C15n) & M64;
  x = ((x ^ (x >> 30n)) * 0xBF58476D1CE4E5B9n) & M64;
  x = ((x ^ (x >> 27n)) * 0x94D049BB133111EBn) & M64;
  return x ^ (x >> 31n);
}
function blockHash(parent, ns, tokens) {
  let h = mix64(parent ^ mix64(ns));
  for (const t of tokens) h = mix64(h ^ BigInt(t >>> 0));
  return h;
}

test('GET /v1/kv_events streams what the cache stores, under hashes a router computes', async () => {
  const controller = new AbortController();
  const r = await fetch(`${server.baseURL}/v1/kv_events`, { signal: controller.signal });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  async function next() {
    for (;;) {
      const end = buffer.indexOf('\n\n');
      if (end >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        return JSON.parse(event.replace(/^data: /, ''));
      }
      const { value, done } = await reader.read();
      assert.ok(!done, 'the event stream ended');
      buffer += decoder.decode(value, { stream: true });
    }
  }
  const first = await next();
  assert.equal(first.seq, 1);
  assert.equal(first.snapshot, true);
  assert.equal(first.block_size, 16);
  const prompt = 'A router keeps an index of what each replica caches, block by block, from its events. ' +
                 'This prompt is long enough for two blocks.';
  const ids = await fetch(`${server.baseURL}/tokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt }),
  }).then((x) => x.json()).then((x) => x.tokens);
  assert.ok(ids.length > 32);
  await client.completions.create({ model: 'basalt-mini', prompt, max_tokens: 2, temperature: 0 });
  const h0 = blockHash(0n, 0n, ids.slice(0, 16));
  const h1 = blockHash(h0, 0n, ids.slice(16, 32));
  const want = [h0, h1].map((h) => h.toString(16).padStart(16, '0'));
  const seen = new Set();
  let seq = 1;
  while (!want.every((h) => seen.has(h))) {
    const batch = await next();
    assert.equal(batch.seq, ++seq, 'batches are numbered without gaps');
    for (const e of batch.events) {
      if (e.type !== 'stored') continue;
      assert.equal(e.token_ids.length, 16 * e.block_hashes.length);
      for (const h of e.block_hashes) seen.add(h);
    }
  }
  controller.abort();
});
