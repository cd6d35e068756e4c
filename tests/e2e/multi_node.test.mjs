// `basalt serve` over two nodes: two processes linked over the loopback
// interface, as two machines would be (--nnodes 2; docs/SERVER.md). Node 1
// runs its ranks and node 0 serves; a completion is one process's; SIGTERM
// does not end node 1 while its leader serves (a group's pods get it
// together, and the leader drains first); SIGTERM to node 0 drains it, and
// node 1 stops with it. BASALT_BINARY names the binary (set by ctest).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { startServer } from './server.mjs';

async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function complete(baseURL) {
  const r = await fetch(`${baseURL}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'basalt-mini', prompt: 'The Debian project', max_tokens: 12, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).choices[0].text;
}

test('two nodes serve what one process serves, and stop together from node 0', async () => {
  const one = await startServer(['--tp', '2']);
  const expected = await complete(one.baseURL);
  await one.stop();

  const nodes = ['--tp', '2', '--nnodes', '2', '--dist-init-addr', `127.0.0.1:${await freePort()}`];
  const worker = spawn(process.env.BASALT_BINARY, ['serve', ...nodes, '--node-rank', '1'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let workerLog = '';
  worker.stderr.on('data', (chunk) => { workerLog += chunk.toString(); });
  const workerExit = new Promise((resolve) => worker.on('exit', (code, signal) => resolve({ code, signal })));
  const leader = await startServer([...nodes, '--node-rank', '0']);
  assert.equal(await complete(leader.baseURL), expected);

  worker.kill('SIGTERM');
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.ok(worker.exitCode === null && worker.signalCode === null, `node 1 ended on SIGTERM:\n${workerLog}`);
  assert.equal(await complete(leader.baseURL), expected);

  assert.deepEqual(await leader.stop(), { code: 0, signal: null });
  assert.deepEqual(await workerExit, { code: 0, signal: null }, workerLog);
  assert.match(workerLog, /the leader stopped/);
});
