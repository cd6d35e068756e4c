// Structured output through the official `openai` client and plain fetch:
// response_format (json_object, json_schema), vLLM's structured_outputs and
// guided_* fields, SGLang's regex / ebnf / json_schema, on chat and
// completions, whole and streamed, with n > 1, logprobs and stop strings.
// Every returned document is checked by Ajv, an independent JSON Schema
// validator, not by Basalt's own grammar; bad specs are 400s naming the field
// and what is wrong.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { startServer } from './server.mjs';

let server;
let client;
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

before(async () => {
  server = await startServer(['--served-model-name', 'basalt-mini']);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

// Schemas whose every instance is short, so the bundled model finishes them
// well inside max_tokens.
const person = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    role: { enum: ['admin', 'user', 'guest'] },
    tags: { type: 'array', items: { type: 'string', pattern: '^[a-z]{1,6}$' }, maxItems: 3, uniqueItems: true },
    // Distinct items of a finite domain: every instance is a permutation.
    levels: { type: 'array', items: { enum: [1, 2, 3] }, minItems: 3, uniqueItems: true },
    active: { type: 'boolean' },
  },
  required: ['name', 'age', 'role', 'levels'],
  if: { properties: { role: { const: 'admin' } } },
  then: { required: ['active'] },
  else: { properties: { active: false } },
  additionalProperties: false,
};
const event = {
  type: 'object',
  properties: {
    id: { type: 'string', format: 'uuid' },
    day: { type: 'string', format: 'date' },
    score: { anyOf: [{ type: 'integer', minimum: -5, maximum: 5 }, { type: 'null' }] },
    where: { $ref: '#/$defs/place' },
    // An email's automaton times a counter to 24 is past what one grammar
    // holds: the bound is kept at run time (a bounded rule).
    contact: { type: 'string', format: 'email', maxLength: 24 },
    // A lookahead: no "--" anywhere after the start.
    code: { type: 'string', pattern: '^(?!.*--)[a-z-]{1,10}$' },
  },
  required: ['id', 'day', 'score', 'where', 'contact', 'code'],
  additionalProperties: false,
  $defs: { place: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'],
                    additionalProperties: false } },
};

const messages = [{ role: 'user', content: 'Describe a person as JSON.' }];

function validates(schema, text) {
  const value = JSON.parse(text);  // throws on anything but JSON
  const validate = ajv.compile(schema);
  assert.ok(validate(value), `${text} does not validate: ${JSON.stringify(validate.errors)}`);
  return value;
}

test('response_format json_schema: every sample is a valid instance, whole and streamed', async () => {
  for (const schema of [person, event]) {
    const response_format = { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } };
    const whole = await client.chat.completions.create({
      model: 'basalt-mini', messages, response_format, max_tokens: 300, temperature: 1, seed: 7, n: 3,
    });
    assert.equal(whole.choices.length, 3);
    for (const c of whole.choices) {
      assert.equal(c.finish_reason, 'stop', c.message.content);
      validates(schema, c.message.content);
    }
    const stream = await client.chat.completions.create({
      model: 'basalt-mini', messages, response_format, max_tokens: 300, temperature: 0, stream: true,
    });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'stop');
    validates(schema, text);
  }
});

test('response_format json_object and the vLLM and SGLang spellings', async () => {
  const object = await client.chat.completions.create({
    model: 'basalt-mini', messages, response_format: { type: 'json_object' }, max_tokens: 400, temperature: 0,
  });
  const text = object.choices[0].message.content;
  assert.ok(text.startsWith('{'), text);
  if (object.choices[0].finish_reason === 'stop') {
    assert.equal(typeof JSON.parse(text), 'object');
  }
  const completion = (extra) => client.completions.create({
    model: 'basalt-mini', prompt: 'The answer is', max_tokens: 80, temperature: 1, seed: 3, ...extra,
  });
  for (const extra of [{ guided_json: person }, { structured_outputs: { json: person } }, { json_schema: JSON.stringify(person) }]) {
    const r = await completion(extra);
    assert.equal(r.choices[0].finish_reason, 'stop', JSON.stringify(extra));
    validates(person, r.choices[0].text);
  }
  for (const extra of [{ guided_regex: '[a-z]{2,4}-[0-9]{2}' }, { structured_outputs: { regex: '[a-z]{2,4}-[0-9]{2}' } },
    { regex: '[a-z]{2,4}-[0-9]{2}' }]) {
    const r = await completion({ ...extra, n: 2 });
    for (const c of r.choices) assert.match(c.text, /^[a-z]{2,4}-[0-9]{2}$/);
  }
  for (const extra of [{ guided_choice: ['red', 'green', 'blue'] }, { structured_outputs: { choice: ['red', 'green', 'blue'] } }]) {
    const r = await completion(extra);
    assert.ok(['red', 'green', 'blue'].includes(r.choices[0].text), r.choices[0].text);
  }
  const grammar = 'root ::= "(" num ("," num)* ")"\nnum ::= [1-9] [0-9]?';
  for (const extra of [{ guided_grammar: grammar }, { structured_outputs: { grammar } }, { ebnf: grammar }]) {
    const r = await completion({ ...extra, max_tokens: 60 });
    if (r.choices[0].finish_reason === 'stop') assert.match(r.choices[0].text, /^\([1-9][0-9]?(,[1-9][0-9]?)*\)$/);
    else assert.match(r.choices[0].text, /^\([1-9][0-9]?(,[1-9][0-9]?)*,?[1-9]?[0-9]?$/);
  }
});

test('structured output with logprobs, stop strings and the prefix cache', async () => {
  const r = await client.chat.completions.create({
    model: 'basalt-mini', messages, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: person } },
    max_tokens: 300, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const c = r.choices[0];
  validates(person, c.message.content);
  assert.ok(c.logprobs.content.length > 0);
  // One entry per token, the end-of-sequence token's last.
  assert.ok(c.logprobs.content.map((t) => t.token).join('').startsWith(c.message.content));
  // The same request again: the same text, its prompt from the cache.
  const again = await client.chat.completions.create({
    model: 'basalt-mini', messages, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: person } },
    max_tokens: 300, temperature: 0,
  });
  assert.equal(again.choices[0].message.content, c.message.content);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0);
  // A stop string cuts the document where it appears.
  const stopped = await client.chat.completions.create({
    model: 'basalt-mini', messages, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: person } },
    max_tokens: 300, temperature: 0, stop: ['"age"'],
  });
  assert.equal(stopped.choices[0].finish_reason, 'stop');
  assert.ok(c.message.content.startsWith(stopped.choices[0].message.content), stopped.choices[0].message.content);
  assert.ok(!stopped.choices[0].message.content.includes('"age"'));
});

test('bad specs are 400s that name the field and the problem', async () => {
  const chat = (extra) => client.chat.completions.create({ model: 'basalt-mini', messages, max_tokens: 4, ...extra });
  const refused = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: { minProperties: 2 } } } } },
      'response_format.json_schema.schema', '"not"'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'number', multipleOf: 2 } } } } } },
      'response_format.json_schema.schema', '#/properties/a'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 'response_format.json_schema.schema', 'schema'],
    [{ response_format: { type: 'xml' } }, 'response_format.type', 'xml'],
    [{ guided_regex: 'a(?<=b)' }, 'guided_regex', 'lookbehind'],
    [{ guided_grammar: 'root ::= "a" missing' }, 'guided_grammar', 'missing'],
    [{ guided_grammar: 'root ::= root "a" | "b"' }, 'guided_grammar', 'left-recursive'],
    [{ guided_choice: [] }, 'guided_choice', 'non-empty'],
    [{ guided_json: person, guided_regex: 'a' }, 'guided_regex', 'only one'],
    [{ structured_outputs: { regex: 'a', whitespace_pattern: 'x' } }, 'structured_outputs.whitespace_pattern', 'not supported'],
    [{ structured_outputs: { structural_tag: 'x' } }, 'structured_outputs.structural_tag', 'JSON text'],
    [{ structural_tag: '{}' }, 'structural_tag', 'structures'],
    [{ response_format: { type: 'structural_tag', structures: [{ begin: '<x>', schema: {}, end: '</x>' }], triggers: ['<y'] } },
      'response_format', 'must start with one of the triggers'],
    [{ response_format: { type: 'structural_tag', structures: [{ begin: 'aba', schema: {}, end: '' }], triggers: ['aba'] } },
      'response_format', 'triggers[0]'],
    [{ guided_json: person, min_tokens: 3 }, 'min_tokens', 'min_tokens'],
  ];
  for (const [extra, param, words] of refused) {
    await assert.rejects(chat(extra), (e) => e.status === 400 && e.param === param && e.message.includes(words),
                         `${JSON.stringify(extra)} should be refused naming ${param} and ${words}`);
  }
});
