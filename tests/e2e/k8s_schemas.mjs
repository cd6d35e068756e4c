// The Kubernetes API schemas the deployment tests check objects against:
// the core kinds through the `kubernetes-models` validators, the KEDA
// ScaledObject through the models of its published CRD
// (`@kubernetes-models/keda`). They check types, required fields and
// formats; like the API's OpenAPI schemas they do not refuse unknown fields.
// No npm package models LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): its
// two pod templates go through the core PodTemplateSpec schema, and its own
// fields are checked here as its API types define them (kubernetes-sigs/lws,
// api/leaderworkerset/v1), unknown ones refused.
import assert from 'node:assert/strict';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { Service } from 'kubernetes-models/v1/Service';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1/PodDisruptionBudget';
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler';
import { ScaledObject } from '@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject';
import { PodTemplate } from 'kubernetes-models/v1/PodTemplate';
import { parseAllDocuments } from 'yaml';

const models = {
  'apps/v1 Deployment': Deployment,
  'v1 Service': Service,
  'policy/v1 PodDisruptionBudget': PodDisruptionBudget,
  'autoscaling/v2 HorizontalPodAutoscaler': HorizontalPodAutoscaler,
  'keda.sh/v1alpha1 ScaledObject': ScaledObject,
};

const isInt32 = (v) => Number.isInteger(v) && v >= 0 && v <= 2 ** 31 - 1;
const intOrPercent = (v) => isInt32(v) || (typeof v === 'string' && /^\d+%$/.test(v));

function onlyKeys(object, keys, where) {
  assert.ok(object && typeof object === 'object' && !Array.isArray(object), `${where} must be an object`);
  for (const key of Object.keys(object)) assert.ok(keys.includes(key), `${where}.${key} is not a field`);
}

// A LeaderWorkerSet: its fields' types and enums, and each pod template
// through the core schema.
function validateLeaderWorkerSet(lws) {
  onlyKeys(lws, ['apiVersion', 'kind', 'metadata', 'spec', 'status'], 'LeaderWorkerSet');
  assert.equal(typeof lws.metadata?.name, 'string', 'metadata.name must be a string');
  const spec = lws.spec;
  onlyKeys(spec, ['replicas', 'leaderWorkerTemplate', 'rolloutStrategy', 'startupPolicy', 'networkConfig'], 'spec');
  if ('replicas' in spec) assert.ok(isInt32(spec.replicas), 'spec.replicas must be an integer');
  if ('startupPolicy' in spec) assert.ok(['LeaderCreated', 'LeaderReady'].includes(spec.startupPolicy), 'spec.startupPolicy');
  if ('rolloutStrategy' in spec) {
    const r = spec.rolloutStrategy;
    onlyKeys(r, ['type', 'rollingUpdateConfiguration'], 'spec.rolloutStrategy');
    assert.equal(r.type, 'RollingUpdate', 'spec.rolloutStrategy.type');
    const c = r.rollingUpdateConfiguration ?? {};
    onlyKeys(c, ['partition', 'maxUnavailable', 'maxSurge'], 'rollingUpdateConfiguration');
    for (const key of ['maxUnavailable', 'maxSurge'])
      if (key in c) assert.ok(intOrPercent(c[key]), `rollingUpdateConfiguration.${key} must be an integer or a percentage`);
    if (c.maxUnavailable === 0) assert.notEqual(c.maxSurge ?? 0, 0, 'maxUnavailable and maxSurge cannot both be 0');
  }
  const t = spec.leaderWorkerTemplate;
  onlyKeys(t, ['leaderTemplate', 'workerTemplate', 'size', 'restartPolicy', 'subGroupPolicy', 'volumeClaimTemplates',
    'persistentVolumeClaimRetentionPolicy'], 'spec.leaderWorkerTemplate');
  assert.ok(isInt32(t.size) && t.size >= 1, 'leaderWorkerTemplate.size must be an integer >= 1');
  if ('restartPolicy' in t)
    assert.ok(['Default', 'RecreateGroupOnPodRestart', 'RecreateGroupAfterStart', 'None'].includes(t.restartPolicy),
      'leaderWorkerTemplate.restartPolicy');
  assert.ok(t.workerTemplate, 'leaderWorkerTemplate.workerTemplate is required');
  for (const key of ['leaderTemplate', 'workerTemplate'])
    if (key in t) new PodTemplate({ metadata: { name: `${lws.metadata.name}-${key}` }, template: t[key] }).validate();
}

// Throws unless `object` is a kind we know and passes its schema.
export function validateObject(object) {
  if (`${object.apiVersion} ${object.kind}` === 'leaderworkerset.x-k8s.io/v1 LeaderWorkerSet') {
    validateLeaderWorkerSet(object);
    return;
  }
  const model = models[`${object.apiVersion} ${object.kind}`];
  assert.ok(model, `no schema for ${object.apiVersion} ${object.kind}`);
  new model(object).validate();
}

// The YAML documents of a stream, as plain objects (empty documents
// dropped); a YAML error fails.
export function documents(text) {
  return parseAllDocuments(text)
    .map((doc) => {
      assert.deepEqual(doc.errors, [], String(doc.errors));
      return doc.toJS();
    })
    .filter((object) => object !== null);
}
