// `basalt deploy render` (docs/DEPLOY.md section 2): the real binary renders
// deploy/basalt.yaml and variants of it (GPUs, a volume, tenants, regions,
// scale to zero, the HPA, --out), and every object it writes must pass the
// Kubernetes API schema of its kind: the core kinds through the
// `kubernetes-models` validators, the KEDA ScaledObject through the models
// of its published CRD (`@kubernetes-models/keda`), in k8s_schemas.mjs.
// BASALT_BINARY names the binary (set by ctest).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { documents, validateObject } from './k8s_schemas.mjs';
import { exampleSpec, scratch, unrenderable, variant, variants } from './deploy_variants.mjs';
import { startGateway } from './server.mjs';

function binary() {
  const path = process.env.BASALT_BINARY;
  if (!path) throw new Error('BASALT_BINARY is not set');
  return path;
}

function render(specPath, args = []) {
  return spawnSync(binary(), ['deploy', 'render', specPath, ...args], { encoding: 'utf8' });
}

for (const [name, { spec, namespace, autoscaler }] of Object.entries(variants)) {
  test(`every object rendered from ${name} passes its Kubernetes schema`, () => {
    const r = render(spec, ['--namespace', namespace, '--autoscaler', autoscaler]);
    assert.equal(r.status, 0, r.stderr);
    const objects = documents(r.stdout);
    assert.ok(objects.length >= 6, `${objects.length} objects`);
    for (const object of objects) {
      assert.doesNotThrow(() => validateObject(object), `${object.kind} ${object.metadata?.name}`);
    }
    const kinds = objects.map((o) => o.kind);
    // The engine's Deployment, or over several nodes its LeaderWorkerSet.
    assert.equal(kinds.filter((k) => k === 'Deployment').length, name === 'multi_node' ? 1 : 2);
    assert.equal(kinds.includes('LeaderWorkerSet'), name === 'multi_node');
    if (name === 'fixed_size') assert.ok(!kinds.includes('ScaledObject') && !kinds.includes('HorizontalPodAutoscaler'));
    if (name === 'hpa_queue_time') assert.ok(kinds.includes('HorizontalPodAutoscaler'));
    if (name === 'example' || name === 'scale_to_zero') assert.ok(kinds.includes('ScaledObject'));
    for (const object of objects) assert.equal(object.metadata.namespace, namespace);
  });
}

// The gateway's --autoscale as rendered is a flag `basalt route` takes: it
// starts (and the autoscaler's count it exports is the one KEDA's query reads).
test('every rendered gateway autoscaler is one basalt route starts with', async () => {
  let checked = 0;
  for (const [name, { spec, namespace, autoscaler }] of Object.entries(variants)) {
    const r = render(spec, ['--namespace', namespace, '--autoscaler', autoscaler]);
    assert.equal(r.status, 0, r.stderr);
    const gateway = documents(r.stdout).find((o) => o.kind === 'Deployment' && o.metadata.name.endsWith('-gateway'));
    const args = gateway.spec.template.spec.containers[0].args;
    const at = args.indexOf('--autoscale');
    if (name === 'fixed_size') {
      assert.equal(at, -1, args.join(' '));
      continue;
    }
    assert.ok(at > 0, `${name}: ${args.join(' ')}`);
    const started = await startGateway(['--replica', 'http://127.0.0.1:9', '--autoscale', args[at + 1],
      '--no-request-log']);
    const pools = (await (await fetch(`${started.baseURL}/v1/autoscale`)).json()).pools;
    const metrics = await (await fetch(`${started.baseURL}/metrics`)).text();
    await started.stop();
    assert.equal(pools.length, 1, name);
    assert.match(args[at + 1], new RegExp(`metric=${pools[0].metric} target=${pools[0].target} ` +
      `min=${pools[0].min} max=${pools[0].max} `), name);
    assert.match(metrics, /^basalt_route_desired_replicas\{pool=""\} \d+$/m, name);
    checked += 1;
  }
  assert.equal(checked, Object.keys(variants).length - 1);
});

test('the rendered YAML keeps strings strings and numbers numbers', () => {
  const [engine] = documents(render(exampleSpec).stdout);
  const pod = engine.spec.template;
  assert.equal(pod.metadata.annotations['prometheus.io/scrape'], 'true');
  assert.equal(pod.metadata.annotations['prometheus.io/port'], '8000');
  assert.equal(pod.spec.containers[0].ports[0].containerPort, 8000);
  assert.deepEqual(pod.spec.containers[0].args.slice(0, 5), ['serve', '--host', '0.0.0.0', '--port', '8000']);
  assert.equal(pod.spec.containers[0].resources.requests.cpu, '4');
});

// Over several nodes: the leader serves and listens for its workers, which
// join it at the address LeaderWorkerSet gives them; the Service lists the
// leaders; the autoscaler scales the set.
test('a replica over several nodes is a LeaderWorkerSet of a leader and its workers', () => {
  const { spec, namespace, autoscaler } = variants.multi_node;
  const objects = documents(render(spec, ['--namespace', namespace, '--autoscaler', autoscaler]).stdout);
  const lws = objects.find((o) => o.kind === 'LeaderWorkerSet');
  assert.equal(lws.metadata.name, 'mini-group');
  const group = lws.spec.leaderWorkerTemplate;
  assert.equal(group.size, 2);
  const leader = group.leaderTemplate.spec.containers[0];
  const worker = group.workerTemplate.spec.containers[0];
  assert.deepEqual(leader.args.slice(-6), ['--nnodes', '2', '--node-rank', '0', '--dist-init-addr', '0.0.0.0:29500']);
  assert.deepEqual(worker.args.slice(-6),
    ['--nnodes', '2', '--node-rank', '$(LWS_WORKER_INDEX)', '--dist-init-addr', '$(LWS_LEADER_ADDRESS):29500']);
  assert.ok(leader.args.includes('--port') && !worker.args.includes('--port'));
  assert.equal(worker.resources.limits['nvidia.com/gpu'], '8');
  assert.equal(worker.readinessProbe, undefined);
  const service = objects.find((o) => o.kind === 'Service' && o.metadata.name === 'mini-engine');
  assert.equal(service.spec.selector['leaderworkerset.sigs.k8s.io/worker-index'], '0');
  const hpa = objects.find((o) => o.kind === 'HorizontalPodAutoscaler');
  assert.deepEqual(hpa.spec.scaleTargetRef,
    { apiVersion: 'leaderworkerset.x-k8s.io/v1', kind: 'LeaderWorkerSet', name: 'mini-group' });
  // The validator refuses what LeaderWorkerSet's API would.
  const broken = (mutate) => () => {
    const copy = structuredClone(lws);
    mutate(copy);
    validateObject(copy);
  };
  assert.doesNotThrow(broken(() => {}));
  assert.throws(broken((o) => { o.spec.leaderWorkerTemplate.size = '2'; }), /size/);
  assert.throws(broken((o) => { o.spec.leaderWorkerTemplate.restartPolicy = 'Always'; }), /restartPolicy/);
  assert.throws(broken((o) => { o.spec.startupPolicy = 'Eager'; }), /startupPolicy/);
  assert.throws(broken((o) => { o.spec.leaderWorkerTemplate.workerTemplate.spec.containers = 'engine'; }), /array/);
  assert.throws(broken((o) => { o.spec.leaderWorkerTemplate.leaderTemplate.spec.containers[0].ports[0].containerPort = 'x'; }),
    /integer/);
  assert.throws(broken((o) => { o.spec.groups = 2; }), /spec\.groups is not a field/);
});

test('the validators reject objects that break their schema', () => {
  const objects = documents(render(exampleSpec).stdout);
  const broken = (mutate) => {
    const copies = structuredClone(objects);
    mutate(copies);
    return () => copies.forEach(validateObject);
  };
  assert.doesNotThrow(broken(() => {}));
  assert.throws(broken((o) => { o[0].spec.template.spec.containers[0].ports[0].containerPort = '8000'; }), /integer/);
  assert.throws(broken((o) => { o[0].spec.template.spec.containers = 'engine'; }), /array/);
  assert.throws(broken((o) => { o[1].spec.ports[0].port = 'http'; }), /integer/);
  assert.throws(broken((o) => { o[2].spec.selector = []; }));
  const scaled = objects.findIndex((x) => x.kind === 'ScaledObject');
  assert.ok(scaled >= 0);
  assert.throws(broken((o) => { o[scaled].spec.minReplicaCount = 'one'; }), /integer/);
  assert.throws(broken((o) => { o[scaled].spec.triggers[0].metadata.threshold = 8; }), /string/);
  assert.throws(broken((o) => { delete o[scaled].spec.scaleTargetRef; }), /scaleTargetRef/);
  assert.throws(broken((o) => { o.push({ apiVersion: 'v1', kind: 'Pdb', metadata: { name: 'x' } }); }), /no schema/);
});

test('--out writes one file per object, the same objects as stdout', () => {
  const dir = join(scratch, 'out');
  const r = render(exampleSpec, ['--out', dir]);
  assert.equal(r.status, 0, r.stderr);
  const files = readdirSync(dir).sort();
  assert.deepEqual(files, [
    'deployment-mini-engine.yaml',
    'deployment-mini-gateway.yaml',
    'poddisruptionbudget-mini-engine.yaml',
    'poddisruptionbudget-mini-gateway.yaml',
    'scaledobject-mini-engine.yaml',
    'service-mini-engine.yaml',
    'service-mini-gateway.yaml',
  ]);
  assert.deepEqual(r.stdout.trim().split('\n').map((p) => p.slice(dir.length + 1)).sort(), files);
  const fromFiles = files.flatMap((f) => documents(readFileSync(join(dir, f), 'utf8')));
  const fromStdout = documents(execFileSync(binary(), ['deploy', 'render', exampleSpec], { encoding: 'utf8' }));
  const key = (o) => `${o.kind}/${o.metadata.name}`;
  assert.deepEqual(
    fromFiles.sort((a, b) => key(a).localeCompare(key(b))),
    fromStdout.sort((a, b) => key(a).localeCompare(key(b))),
  );
});

test('a spec that cannot be rendered fails with the field named and writes nothing', () => {
  for (const [name, { spec, autoscaler, error }] of Object.entries(unrenderable)) {
    const r = render(spec, ['--autoscaler', autoscaler]);
    assert.notEqual(r.status, 0, name);
    assert.equal(r.stdout, '', name);
    assert.match(r.stderr, error, name);
  }
  let r = render(variant('bad', [['name: mini', 'name: Mini']]));
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /:\d+: name: 'Mini' is not a lowercase DNS label/);
  r = render(exampleSpec, ['--autoscaler', 'vpa']);
  assert.notEqual(r.status, 0);
});
