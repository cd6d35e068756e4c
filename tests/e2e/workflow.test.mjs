// Workflow runs through `basalt route` over real replicas of two models
// (docs/WORKFLOWS.md): the triage example of examples/workflows (classify
// with a JSON schema on basalt-mini, summarize each note on basalt-draft,
// combine on basalt-mini) gives the same output with a basalt-draft replica
// SIGKILLed during the fan-out, and across a gateway SIGKILLed mid-run and
// started again on its state directory (finished steps are not re-run).
// A client that goes away cancels its run; a bad definition stops the
// gateway at start, naming the step and field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, readFileSync, readdirSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, startGateway, parseMetrics, metric, waitFor } from './server.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const examples = join(root, 'examples', 'workflows');
const draftModel = join(root, 'models', 'basalt-draft');
const stateDir = mkdtempSync(join(tmpdir(), 'basalt-workflow-state-'));

let mini;
let drafts = [];
let gateway;
let gatewayArgs;

const input = {
  ticket: 'The server crashes when the cache is full and the disk is slow',
  notes: ['it happens at night', 'the log shows an assertion', 'restarting helps', 'only on the big machine',
          'since the last upgrade', 'users see a timeout', 'memory grows first', 'a test reproduces it'],
};

before(async () => {
  [mini, ...drafts] = await Promise.all([
    startServer(['--threads', '1', '--no-request-log']),
    startServer(['--threads', '1', '--no-request-log', '--model', draftModel]),
    startServer(['--threads', '1', '--no-request-log', '--model', draftModel]),
  ]);
  gatewayArgs = ['--replica', `${mini.baseURL} model=basalt-mini`,
                 ...drafts.flatMap((d) => ['--replica', `${d.baseURL} model=basalt-draft`]),
                 '--workflows', examples, '--workflow-state-dir', stateDir, '--health-interval', '0.5'];
  gateway = await startGateway(gatewayArgs);
});

after(async () => {
  for (const r of [mini, ...drafts]) await r.stop();
  await gateway.stop();
});

// Posts a run and reads its events; `onEvent(event, data)` may act on each.
// Returns the events, in order, as { event, data }. With `cut`, the stream
// may end broken (the test kills the gateway).
async function runWorkflow(body, onEvent = () => {}, signal = undefined, cut = false) {
  const r = await fetch(`${gateway.baseURL}/v1/workflows/triage/runs`, {
    method: 'POST', body: JSON.stringify(body), headers: { 'Content-Type': 'application/json' }, signal,
  });
  assert.equal(r.status, 200, await (r.status === 200 ? '' : r.text()));
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const events = [];
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for await (const chunk of r.body) {
      buffer += decoder.decode(chunk, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const raw = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const name = raw.match(/^event: (.*)$/m)?.[1];
        const data = JSON.parse(raw.match(/^data: (.*)$/m)[1]);
        events.push({ event: name, data });
        await onEvent(name, data);
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError' && !(signal?.aborted) && !cut) throw e;
  }
  return events;
}

const final = (events) => events.find((e) => e.event === 'run_completed')?.data.output;
const itemResults = (events) => events.filter((e) => e.event === 'step_result' && e.data.item !== undefined);

let baseline;

test('the example runs: classify to the schema, one summary per note, combine', async () => {
  const events = await runWorkflow({ run_id: 'baseline', input });
  const failed = events.find((e) => e.event === 'run_failed');
  assert.equal(failed, undefined, JSON.stringify(failed));
  baseline = final(events);
  assert.ok(['bug', 'feature', 'question'].includes(baseline.category), JSON.stringify(baseline));
  assert.equal(baseline.summaries.length, input.notes.length);
  assert.equal(typeof baseline.summary, 'string');
  assert.ok(baseline.summary.length > 0);
  // Events: the run, each step started then its result; tokens streamed in between.
  assert.equal(events[0].event, 'run');
  const order = events.filter((e) => e.event === 'step_result' && e.data.item === undefined).map((e) => e.data.step);
  assert.deepEqual(order, ['classify', 'summaries', 'combine']);
  assert.ok(events.some((e) => e.event === 'token' && e.data.step === 'combine'));
  assert.equal(itemResults(events).length, input.notes.length);
  // The tokens of a step add up to its result.
  const combineText = events.filter((e) => e.event === 'token' && e.data.step === 'combine').map((e) => e.data.text).join('');
  assert.equal(combineText, baseline.summary);
  // GET: the state with per-step timings.
  const state = await (await fetch(`${gateway.baseURL}/v1/workflows/triage/runs/baseline`)).json();
  assert.equal(state.status, 'completed');
  assert.deepEqual(state.output, baseline);
  assert.deepEqual(state.steps.map((s) => [s.name, s.status]),
                   [['classify', 'completed'], ['summaries', 'completed'], ['combine', 'completed']]);
  for (const s of state.steps) assert.ok(s.seconds > 0 && s.start_s >= 0, JSON.stringify(s));
  assert.ok(state.steps[1].start_s >= state.steps[0].start_s + state.steps[0].seconds - 1e-6);
  // Step metrics.
  const m = parseMetrics(await (await fetch(`${gateway.baseURL}/metrics`)).text());
  assert.equal(m['basalt_route_workflow_runs_total{workflow="triage",status="completed"}'], 1);
  assert.equal(m['basalt_route_workflow_step_seconds_count{workflow="triage",step="summaries"}'], 1);
  assert.equal(m['basalt_route_workflow_step_attempts_total{workflow="triage",step="summaries",outcome="ok"}'],
               input.notes.length);
  // One log line per step.
  assert.equal(gateway.log().match(/workflow_step run=baseline /g).length, 3);
});

test('basalt bench drives the workflow at a rate and reports end-to-end percentiles', async () => {
  const out = join(mkdtempSync(join(tmpdir(), 'basalt-workflow-bench-')), 'bench.json');
  const { stdout } = await promisify(execFile)(process.env.BASALT_BINARY, [
    'bench', '--base-url', gateway.baseURL, '--workflow', 'triage', '--workflow-input', JSON.stringify(input),
    '--num-prompts', '4', '--request-rate', '20', '--max-concurrency', '2', '--output-json', out, '--no-progress']);
  assert.match(stdout, /runs 4 {2}completed 4 {2}failed 0/);
  const report = JSON.parse(readFileSync(out, 'utf8'));
  assert.equal(report.results.completed, 4);
  assert.equal(report.results.e2e_s.count, 4);
  assert.ok(report.results.e2e_s.p50 > 0 && report.results.e2e_s.p99 >= report.results.e2e_s.p50);
  assert.ok(report.results.first_result_s.p50 > 0);
});

test('a replica killed during the fan-out: the same output', async () => {
  let killedAt = -1;
  let victim;
  let victimBusy = false;
  const events = await runWorkflow({ run_id: 'killed', input }, async (name, data) => {
    if (victim || name !== 'step_result' || data.step !== 'summaries' || data.item === undefined) return;
    // The draft replica that has requests of this run in flight, if any.
    const m = parseMetrics(await (await fetch(`${gateway.baseURL}/metrics`)).text());
    victim = drafts.find((d) => (m[`basalt_route_replica_in_flight{replica="${d.baseURL}"}`] ?? 0) > 0);
    victimBusy = victim !== undefined;
    victim ??= drafts[0];
    victim.child.kill('SIGKILL');
    killedAt = Date.now();
  });
  assert.ok(victim, 'no item finished');
  const failed = events.find((e) => e.event === 'run_failed');
  assert.equal(failed, undefined, JSON.stringify(failed));
  // The kill came before the fan-out's end: items ran with a replica gone.
  const killIndex = events.findIndex((e) => e.event === 'step_result' && e.data.item !== undefined);
  const mapDone = events.findIndex((e) => e.event === 'step_result' && e.data.step === 'summaries' && e.data.item === undefined);
  assert.ok(killedAt > 0 && mapDone > killIndex + 1, 'the fan-out ended before the replica was killed');
  assert.deepEqual(final(events), baseline);
  // What the gateway did about it: streams resumed elsewhere (failover),
  // attempts retried, or the step retried.
  const m = parseMetrics(await (await fetch(`${gateway.baseURL}/metrics`)).text());
  const sum = (name) => Object.entries(m).filter(([k]) => k.split('{')[0] === name).reduce((a, [, v]) => a + v, 0);
  const recovered = sum('basalt_route_failovers_total') + sum('basalt_route_retries_total') +
                    events.filter((e) => e.event === 'step_retry').length;
  assert.ok(victimBusy, 'no draft replica had a request in flight when one was killed');
  assert.ok(recovered > 0, 'a request in flight on the killed replica was neither failed over nor retried');
  await victim.exited;
  drafts = drafts.filter((d) => d !== victim);
});

test('a gateway killed mid-run: the run resumes from its record, finished steps not re-run', async () => {
  // Killed once two map items have results: a result is recorded before
  // its event is sent, so both are in the record whichever items they are
  // (with concurrency 2 any item may finish first).
  let killed = false;
  let itemsDone = 0;
  await runWorkflow({ run_id: 'restarted', input }, async (name, data) => {
    if (killed || name !== 'step_result' || data.item === undefined || ++itemsDone < 2) return;
    gateway.child.kill('SIGKILL');
    killed = true;
  }, undefined, true);
  assert.ok(killed, 'the run ended before the gateway could be killed');
  await gateway.exited;
  gateway = await startGateway(gatewayArgs);
  const records = readdirSync(stateDir).filter((f) => f.endsWith('.jsonl')).length;
  assert.match(gateway.log(), new RegExp(`workflows loaded=\\S+ replayed_runs=${records}`));
  const before = await (await fetch(`${gateway.baseURL}/v1/workflows/triage/runs/restarted`)).json();
  assert.equal(before.status, 'interrupted');
  assert.equal(before.steps[0].status, 'completed');
  const events = await runWorkflow({ run_id: 'restarted', input });
  assert.deepEqual(events[0].data, { run_id: 'restarted', workflow: 'triage', resumed: true });
  const classify = events.filter((e) => e.data.step === 'classify');
  assert.deepEqual(classify.map((e) => [e.event, e.data.replayed]), [['step_result', true]]);
  const replayedItems = itemResults(events).filter((e) => e.data.replayed);
  assert.ok(replayedItems.length >= 2, `${replayedItems.length} items replayed`);
  // The replayed items did not start again.
  for (const r of replayedItems)
    assert.ok(!events.some((e) => e.event === 'step_started' && e.data.item === r.data.item));
  assert.deepEqual(final(events), baseline);
  // Posted again once completed: its record, nothing run.
  const again = await runWorkflow({ run_id: 'restarted', input });
  assert.deepEqual(final(again), baseline);
  assert.ok(!again.some((e) => e.event === 'step_started'));
  // Another input under the same id is refused.
  const conflict = await fetch(`${gateway.baseURL}/v1/workflows/triage/runs`, {
    method: 'POST', body: JSON.stringify({ run_id: 'restarted', input: { ...input, ticket: 'other' } }),
  });
  assert.equal(conflict.status, 409);
});

test('a client that goes away cancels its run', async () => {
  const controller = new AbortController();
  await runWorkflow({ run_id: 'left', input }, (name) => {
    if (name === 'token') controller.abort();
  }, controller.signal);
  assert.ok(await waitFor(async () => {
    const s = await (await fetch(`${gateway.baseURL}/v1/workflows/triage/runs/left`)).json();
    return s.status === 'cancelled';
  }, 10000), 'the run was not cancelled');
  const m = parseMetrics(await (await fetch(`${gateway.baseURL}/metrics`)).text());
  assert.equal(m['basalt_route_workflow_runs_total{workflow="triage",status="cancelled"}'], 1);
  assert.equal(metric(m, 'basalt_route_workflow_runs_in_progress'), 0);
});

test('bad requests are answered with the field at fault', async () => {
  const post = (path, body) => fetch(`${gateway.baseURL}${path}`, { method: 'POST', body });
  let r = await post('/v1/workflows/triage/runs', JSON.stringify({ input: { ticket: 'x' } }));
  assert.equal(r.status, 400);
  assert.match((await r.json()).error.message, /input\.notes: required/);
  r = await post('/v1/workflows/triage/runs', JSON.stringify({ input, run_id: 'a/b' }));
  assert.equal(r.status, 400);
  r = await post('/v1/workflows/triage/runs', '[1');
  assert.equal(r.status, 400);
  r = await post('/v1/workflows/nope/runs', '{}');
  assert.equal(r.status, 404);
  const list = await (await fetch(`${gateway.baseURL}/v1/workflows`)).json();
  assert.deepEqual(list.data.map((w) => w.name), ['triage']);
});

test('SIGHUP re-reads the definitions; a bad one is refused and the old kept', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'basalt-workflow-reload-'));
  const one = (prompt) => JSON.stringify({
    name: 'one', steps: [{ name: 's', type: 'model', model: 'basalt-mini', prompt, max_tokens: 4, temperature: 0 }],
  });
  writeFileSync(join(dir, 'one.json'), one('First'));
  const g = await startGateway(['--replica', `${mini.baseURL} model=basalt-mini`, '--workflows', dir]);
  try {
    const promptOf = async () => (await (await fetch(`${g.baseURL}/v1/workflows`)).json()).data[0].steps[0].prompt;
    assert.equal(await promptOf(), 'First');
    writeFileSync(join(dir, 'one.json'), one('Second'));
    g.child.kill('SIGHUP');
    assert.ok(await waitFor(() => /workflows reload=ok count=1/.test(g.log()), 10000), g.log());
    assert.equal(await promptOf(), 'Second');
    writeFileSync(join(dir, 'one.json'), one('{{ steps.nope.output }}'));
    g.child.kill('SIGHUP');
    assert.ok(await waitFor(() => /workflows reload=refused/.test(g.log()), 10000), g.log());
    assert.match(g.log(), /refers to undefined step 'nope'/);
    assert.equal(await promptOf(), 'Second');
    const r = await fetch(`${g.baseURL}/v1/workflows/one/runs`, { method: 'POST', body: '{"stream": false}' });
    assert.equal((await r.json()).status, 'completed');
  } finally {
    await g.stop();
  }
});

test('a definition with an undefined reference stops the gateway at start, naming step and field', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'basalt-workflow-bad-'));
  writeFileSync(join(dir, 'bad.json'), JSON.stringify({
    name: 'bad',
    steps: [{ name: 'a', type: 'model', model: 'basalt-mini', prompt: '{{ steps.b.output }}' }],
  }));
  await assert.rejects(startGateway(['--replica', `${mini.baseURL} model=basalt-mini`, '--workflows', dir]),
                       /steps\[0\] \(a\)\.prompt: refers to undefined step 'b'/);
});
