// `basalt route --replica-dns`: a gateway given only a host name finds the
// replica behind it by resolving it (localhost: no name server needed),
// answers through it as the replica does, and refuses a malformed target
// at start naming the flag. How the list follows changing answers is
// tested with a stub resolver (src/router/dns_discovery_test.cc).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { startServer, startGateway, waitFor } from './server.mjs';

let replica;
let gateway;

before(async () => {
  replica = await startServer(['--threads', '1', '--no-request-log']);
  gateway = await startGateway(['--replica-dns', `localhost:${replica.port} pool=local`, '--dns-interval', '0.2']);
});

after(async () => {
  await replica.stop();
  const { code } = await gateway.stop();
  assert.equal(code, 0, gateway.log());
});

test('the gateway lists the addresses the name resolves to and answers through them', async () => {
  assert.match(gateway.log(), new RegExp(`replicas .*http://127\\.0\\.0\\.1:${replica.port}`), gateway.log());
  assert.ok(await waitFor(async () => (await fetch(`${gateway.baseURL}/ready`)).status === 200), gateway.log());
  const body = { model: 'basalt-mini', prompt: 'Discovery', max_tokens: 8, temperature: 0 };
  const ask = async (base) => {
    const r = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
    });
    assert.equal(r.status, 200);
    return (await r.json()).choices[0].text;
  };
  assert.equal(await ask(gateway.baseURL), await ask(replica.baseURL));
  // Five rounds of re-resolving the same answer publish no new list.
  const generations = () => new Set(gateway.log().match(/ replicas generation=\d+/g));
  const before = generations();
  await new Promise((r) => setTimeout(r, 1000));
  assert.deepEqual(generations(), before, gateway.log());
  assert.equal(before.size, 1, gateway.log());
});

test('a malformed --replica-dns or --dns-interval stops the gateway at start, naming the flag', () => {
  for (const [args, message] of [
    [['--replica-dns', 'http://localhost:8000'], /--replica-dns: 'http:\/\/localhost:8000' must be HOST:PORT/],
    [['--replica-dns', 'localhost'], /--replica-dns: 'localhost' must be HOST:PORT/],
    [['--replica-dns', 'localhost:8000', '--dns-interval', '0'], /--dns-interval must be in/],
  ]) {
    const r = spawnSync(process.env.BASALT_BINARY, ['route', '--port', '0', ...args], { encoding: 'utf8' });
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr, message);
  }
});
