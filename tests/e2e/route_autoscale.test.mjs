// `basalt route --autoscale` (docs/DEPLOY.md section 4): the gateway's
// autoscaler steps an idle pool down to zero, a request sent while no
// replica is ready waits in the gateway (desired 1 on /v1/autoscale and
// /metrics meanwhile) and is served once the replica turns ready; without
// --autoscale the same request fails at once, and past --cold-start-timeout
// it gets 503. The replica is a fake in this process whose /ready answers
// 503 until the test lets it be ready. The policy's own arithmetic is tested
// with recorded sequences in src/router/autoscaler_test.cc.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { spawnSync } from 'node:child_process';
import { startGateway, parseMetrics, waitFor } from './server.mjs';

// A replica that answers completions with a fixed text, and /ready with
// 503 until `ready` is set.
async function startFakeReplica() {
  const state = { ready: false, completions: 0 };
  const server = http.createServer((req, res) => {
    const send = (status, body, type = 'application/json') => {
      res.writeHead(status, { 'Content-Type': type });
      res.end(typeof body === 'string' ? body : JSON.stringify(body));
    };
    if (req.url === '/ready') return send(state.ready ? 200 : 503, { status: state.ready ? 'ready' : 'loading' });
    if (req.url === '/health') return send(200, { status: 'ok' });
    if (req.url === '/metrics')
      return send(200, 'basalt_requests_waiting 0\nbasalt_requests_running 0\nbasalt_kv_cache_usage_ratio 0\n',
        'text/plain');
    if (req.url === '/v1/completions' && req.method === 'POST') {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        if (!state.ready) return send(503, { error: { message: 'loading', type: 'server_error', code: 503 } });
        state.completions += 1;
        const { model } = JSON.parse(body);
        send(200, {
          id: 'cmpl-late', object: 'text_completion', created: 0, model,
          choices: [{ index: 0, text: 'from the replica that woke up', finish_reason: 'stop', logprobs: null }],
          usage: { prompt_tokens: 2, completion_tokens: 5, total_tokens: 7 },
        });
      });
      return;
    }
    send(404, { error: { message: 'no such endpoint', type: 'invalid_request_error', code: 404 } });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { state, url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() };
}

const autoscale = async (gateway) => (await (await fetch(`${gateway.baseURL}/v1/autoscale`)).json()).pools;
const metrics = async (gateway) => parseMetrics(await (await fetch(`${gateway.baseURL}/metrics`)).text());
const complete = (gateway) =>
  fetch(`${gateway.baseURL}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'basalt-mini', prompt: 'wake up', max_tokens: 4 }),
  });
// Probes every 0.1 s: two failed ones take a replica that is not ready out.
const fast = ['--health-interval', '0.1', '--metrics-interval', '0.1', '--no-request-log'];

let replica;
let gateway;

before(async () => {
  replica = await startFakeReplica();
  gateway = await startGateway([
    '--replica', replica.url, ...fast,
    '--autoscale', 'min=0 max=3 up_after=1s down_after=1s', '--cold-start-timeout', '60',
  ]);
});

after(async () => {
  const { code } = await gateway.stop();
  replica.close();
  assert.equal(code, 0, gateway.log());
});

test('an idle pool goes to zero, a request at zero waits in the gateway and is served when a replica is ready',
  async () => {
    // The replica's probes fail: nothing ready, and idle, so desired steps down to min 0.
    assert.ok(await waitFor(async () => {
      const [pool] = await autoscale(gateway);
      return pool.current === 0 && pool.desired === 0;
    }, 20000), JSON.stringify(await autoscale(gateway)));
    const [idle] = await autoscale(gateway);
    assert.equal(idle.pool, '');
    assert.equal(idle.metric, 'concurrency');
    assert.equal(idle.min, 0);
    assert.equal(idle.max, 3);
    assert.equal(idle.target, 8);
    assert.equal((await metrics(gateway))['basalt_route_desired_replicas{pool=""}'], 0);

    const sent = Date.now();
    const answer = complete(gateway);
    // It waits, and the pool wants a replica for it.
    assert.ok(await waitFor(async () => {
      const [pool] = await autoscale(gateway);
      return pool.waiting === 1 && pool.desired === 1;
    }, 10000), JSON.stringify(await autoscale(gateway)));
    const [waking] = await autoscale(gateway);
    assert.match(waking.reason, /1 request\(s\) wait with no replica ready: scaling from zero/);
    const m = await metrics(gateway);
    assert.equal(m['basalt_route_desired_replicas{pool=""}'], 1);
    assert.equal(m['basalt_route_ready_replicas{pool=""}'], 0);
    assert.equal(m['basalt_route_queue_depth{class="",tenant=""}'], 1);
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(replica.state.completions, 0, 'nothing reached the replica while it was not ready');

    const readyAt = Date.now();
    replica.state.ready = true;
    const r = await answer;
    assert.equal(r.status, 200, await r.clone().text());
    assert.equal((await r.json()).choices[0].text, 'from the replica that woke up');
    assert.ok(Date.now() - sent >= readyAt - sent, 'answered after the replica turned ready');
    assert.equal(replica.state.completions, 1);
    assert.ok(await waitFor(async () => (await autoscale(gateway))[0].current === 1, 10000));
    const after = await metrics(gateway);
    assert.equal(after['basalt_route_ready_replicas{pool=""}'], 1);
    assert.equal(after['basalt_route_requests_total{route="/v1/completions",status="200"}'], 1);
  });

test('without --autoscale the request fails at once; past --cold-start-timeout it gets 503', async () => {
  const asleep = await startFakeReplica();
  const plain = await startGateway(['--replica', asleep.url, ...fast]);
  const held = await startGateway(['--replica', asleep.url, ...fast, '--autoscale', 'min=0 max=2',
    '--cold-start-timeout', '0.5']);
  try {
    for (const g of [plain, held])
      assert.ok(await waitFor(async () => (await fetch(`${g.baseURL}/ready`)).status === 503, 10000), g.log());
    let started = Date.now();
    const failed = await complete(plain);
    assert.equal(failed.status, 503);
    assert.ok(Date.now() - started < 400, `${Date.now() - started} ms`);
    assert.deepEqual(await (await fetch(`${plain.baseURL}/v1/autoscale`)).json(), { pools: [] });

    started = Date.now();
    const timedOut = await complete(held);
    const waited = Date.now() - started;
    assert.equal(timedOut.status, 503);
    assert.ok(timedOut.headers.get('retry-after'), 'a Retry-After');
    assert.match((await timedOut.json()).error.message, /no replica of the replicas became ready within 0.5 s/);
    assert.ok(waited >= 450 && waited < 5000, `${waited} ms`);
    assert.equal(asleep.state.completions, 0);
  } finally {
    await plain.stop();
    await held.stop();
    asleep.close();
  }
});

test('a malformed --autoscale or --cold-start-timeout stops the gateway at start, naming it', () => {
  for (const [args, message] of [
    [['--autoscale', 'metric=latency'], /--autoscale 'metric=latency': metric 'latency' is not concurrency/],
    [['--autoscale', 'min=4 max=2'], /min \(4\) is above max \(2\)/],
    [['--autoscale', 'pool=gpu'], /--autoscale pool=gpu: no replica .* is labelled pool=gpu/],
    [['--autoscale', 'max=2', '--autoscale', 'max=3'], /--autoscale: the pool of every replica is autoscaled twice/],
    [['--autoscale', 'max=2', '--cold-start-timeout', '0'], /--cold-start-timeout must be in/],
  ]) {
    const r = spawnSync(process.env.BASALT_BINARY, ['route', '--port', '0', '--replica', 'http://127.0.0.1:9', ...args],
      { encoding: 'utf8' });
    assert.equal(r.status, 1, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, message);
  }
});
