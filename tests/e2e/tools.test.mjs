// Tool calling and reasoning text through the official `openai` client:
// tool_choice "required" and a named function force calls in the model's
// own format (the bundled model's template is Hermes'), with arguments Ajv
// checks against each function's parameters; streamed tool_calls deltas add
// up to the whole response's calls; "auto" parses calls the model writes;
// --reasoning-parser moves <think> text to reasoning_content (and a forced
// call may follow reasoning). Bad choices are 400s that name the field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer } from './server.mjs';

let server;
let client;
const ajv = new Ajv({ strict: false, allErrors: true });

before(async () => {
  server = await startServer(['--served-model-name', 'basalt-mini']);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 10 },
                                                unit: { enum: ['c', 'f'] } },
                  required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'add', description: 'Adds two integers',
    parameters: { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 99 },
                                                b: { type: 'integer', minimum: 0, maximum: 99 } },
                  required: ['a', 'b'], additionalProperties: false } } },
];
const schemaOf = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));
const messages = [{ role: 'user', content: 'What is the weather in Paris, and what is 2 plus 3?' }];

function checkCall(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
  assert.ok(call.function.name in schemaOf, `unknown function ${call.function.name}`);
  const args = JSON.parse(call.function.arguments);
  const validate = ajv.compile(schemaOf[call.function.name]);
  assert.ok(validate(args), `${call.function.arguments}: ${ajv.errorsText(validate.errors)}`);
}

// The tool calls of a stream, put together from their deltas as OpenAI's
// clients do (by index; id and name on a call's first delta).
async function collectStream(stream) {
  const calls = [];
  let content = '';
  let reasoning = '';
  let finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    const d = choice.delta ?? {};
    if (d.content) content += d.content;
    if (d.reasoning_content) reasoning += d.reasoning_content;
    for (const piece of d.tool_calls ?? []) {
      if (!calls[piece.index]) calls[piece.index] = { id: piece.id, type: piece.type, function: { name: '', arguments: '' } };
      const call = calls[piece.index];
      if (piece.function?.name) call.function.name += piece.function.name;
      if (piece.function?.arguments) call.function.arguments += piece.function.arguments;
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return { calls, content, reasoning, finish };
}

test('tool_choice "required" returns valid calls, whole and streamed alike', async () => {
  for (const seed of [1, 2, 3]) {
    const params = { model: 'basalt-mini', messages, tools, tool_choice: 'required', parallel_tool_calls: false,
                     temperature: 1, seed, max_tokens: 200 };
    const whole = await client.chat.completions.create(params);
    const choice = whole.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assert.equal(choice.message.content, null);
    assert.equal(choice.message.tool_calls.length, 1);
    choice.message.tool_calls.forEach(checkCall);

    const streamed = await collectStream(await client.chat.completions.create({ ...params, stream: true }));
    assert.equal(streamed.finish, 'tool_calls');
    assert.equal(streamed.content, '');
    assert.deepEqual(streamed.calls.map((c) => c.function), choice.message.tool_calls.map((c) => c.function));
    streamed.calls.forEach(checkCall);
  }
});

test('parallel calls: every call returned is valid, the last may be cut by max_tokens', async () => {
  // The grammar lets the model end after any call or write another; the
  // bundled model at temperature 1 often goes on until max_tokens, and then
  // the unfinished call is content.
  let calls = 0;
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({ model: 'basalt-mini', messages, tools, tool_choice: 'required',
                                                      temperature: 1, seed, max_tokens: 120 });
    const choice = r.choices[0];
    assert.ok(['tool_calls', 'length'].includes(choice.finish_reason), choice.finish_reason);
    if (choice.finish_reason === 'tool_calls') assert.equal(choice.message.content, null);
    else assert.ok(choice.message.content === null || choice.message.content.startsWith('<tool_call>'));
    (choice.message.tool_calls ?? []).forEach(checkCall);
    calls += (choice.message.tool_calls ?? []).length;
  }
  assert.ok(calls >= 4, `${calls} calls in 4 forced outputs`);
});

test('a named function is the one call, and parallel_tool_calls false allows one', async () => {
  for (const seed of [4, 5]) {
    const named = await client.chat.completions.create({
      model: 'basalt-mini', messages, tools, tool_choice: { type: 'function', function: { name: 'add' } },
      temperature: 1, seed, max_tokens: 200 });
    const calls = named.choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'add');
    checkCall(calls[0]);

    const single = await client.chat.completions.create({
      model: 'basalt-mini', messages, tools, tool_choice: 'required', parallel_tool_calls: false,
      temperature: 1, seed, max_tokens: 200 });
    assert.equal(single.choices[0].message.tool_calls.length, 1);
    checkCall(single.choices[0].message.tool_calls[0]);
  }
});

test('a request\'s own chat template brings its own tool-call format', async () => {
  // Llama 3.2's way of asking for calls: {"name": ..., "parameters": ...}.
  const template = '{% for m in messages %}{{ m.content }}{% endfor %} Tools: {{ tools | tojson }}. ' +
    'Respond with {"name": function name, "parameters": dictionary of argument name and its value}.';
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.create({
      model: 'basalt-mini', messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
      temperature: 1, seed, max_tokens: 200, chat_template: template, logprobs: true });
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assert.equal(choice.message.tool_calls.length, 1);
    assert.equal(choice.message.tool_calls[0].function.name, 'get_weather');
    checkCall(choice.message.tool_calls[0]);
    // The text the model wrote (its tokens) is Llama's JSON, not the
    // server's default Hermes tags.
    const raw = choice.logprobs.content.map((t) => t.token).join('');
    assert.match(raw, /^\s*\{"name": ?"get_weather", ?"parameters": ?\{/, raw);
  }
});

test('"auto" parses the calls the model writes and keeps the text around them', async () => {
  // The output is pinned by a regex, so the model "writes" text and a call
  // in Hermes' format; the parser must split them.
  const written = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>';
  const regex = written.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const params = { model: 'basalt-mini', messages, tools, tool_choice: 'auto', temperature: 0, max_tokens: 200,
                   structured_outputs: { regex } };
  const whole = await client.chat.completions.create(params);
  const message = whole.choices[0].message;
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  assert.equal(message.content, 'Let me check. ');
  assert.equal(message.tool_calls.length, 1);
  assert.equal(message.tool_calls[0].function.name, 'get_weather');
  assert.equal(message.tool_calls[0].function.arguments, '{"city":"Paris","unit":"c"}');

  const streamed = await collectStream(await client.chat.completions.create({ ...params, stream: true }));
  assert.equal(streamed.content, 'Let me check. ');
  assert.deepEqual(streamed.calls.map((c) => c.function), message.tool_calls.map((c) => c.function));

  // With tool_choice "none" the same text is content.
  const none = await client.chat.completions.create({ ...params, tool_choice: 'none' });
  assert.equal(none.choices[0].message.content, written);
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal(none.choices[0].finish_reason, 'stop');
});

test('bad tool choices are 400s naming the field', async () => {
  const cases = [
    [{ tool_choice: 'required' }, 'tool_choice'],  // no tools
    [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tools, tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tools, tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', not: {} } } }],
       tool_choice: 'required' }, 'tools'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(
      client.chat.completions.create({ model: 'basalt-mini', messages, max_tokens: 8, ...extra }),
      (e) => e.status === 400 && e.param === param, `${JSON.stringify(extra)} should be refused naming ${param}`);
  }
});

test('--reasoning-parser puts the <think> text in reasoning_content', async () => {
  const reasoner = await startServer(['--served-model-name', 'basalt-mini', '--reasoning-parser', 'qwen3']);
  try {
    const c = new OpenAI({ baseURL: `${reasoner.baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
    const params = { model: 'basalt-mini', messages, temperature: 0, max_tokens: 100,
                     structured_outputs: { regex: '<think>Paris is in France\\.</think>It is sunny\\.' } };
    const whole = await c.chat.completions.create(params);
    assert.equal(whole.choices[0].message.reasoning_content, 'Paris is in France.');
    assert.equal(whole.choices[0].message.content, 'It is sunny.');
    const streamed = await collectStream(await c.chat.completions.create({ ...params, stream: true }));
    assert.equal(streamed.reasoning, 'Paris is in France.');
    assert.equal(streamed.content, 'It is sunny.');
    // Without an opening <think>, a qwen3 output is all content.
    const plain = await c.chat.completions.create({ ...params, structured_outputs: undefined, max_tokens: 8 });
    assert.equal(plain.choices[0].message.reasoning_content, null);
    // A forced call may come after reasoning: the grammar starts the call
    // where the parser ends the reasoning, so it parses either way.
    let forcedCalls = 0;
    for (const seed of [1, 2, 3]) {
      const forced = await c.chat.completions.create({
        model: 'basalt-mini', messages, tools, tool_choice: { type: 'function', function: { name: 'add' } },
        temperature: 1, seed, max_tokens: 200 });
      const choice = forced.choices[0];
      if (choice.finish_reason === 'length') continue;  // still reasoning
      assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
      assert.equal(choice.message.tool_calls.length, 1);
      checkCall(choice.message.tool_calls[0]);
      forcedCalls += 1;
    }
    assert.ok(forcedCalls >= 1, 'no forced call finished');
  } finally {
    const { code } = await reasoner.stop();
    assert.equal(code, 0, reasoner.log());
  }
});
