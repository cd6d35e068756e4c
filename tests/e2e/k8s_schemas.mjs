// The Kubernetes API schemas the deployment tests check objects against:
// the core kinds through the `kubernetes-models` validators, the KEDA
// ScaledObject through the models of its published CRD
// (`@kubernetes-models/keda`). They check types, required fields and
// formats; like the API's OpenAPI schemas they do not refuse unknown fields.
import assert from 'node:assert/strict';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { Service } from 'kubernetes-models/v1/Service';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1/PodDisruptionBudget';
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler';
import { ScaledObject } from '@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject';
import { parseAllDocuments } from 'yaml';

const models = {
  'apps/v1 Deployment': Deployment,
  'v1 Service': Service,
  'policy/v1 PodDisruptionBudget': PodDisruptionBudget,
  'autoscaling/v2 HorizontalPodAutoscaler': HorizontalPodAutoscaler,
  'keda.sh/v1alpha1 ScaledObject': ScaledObject,
};

// Throws unless `object` is a kind we know and passes its schema.
export function validateObject(object) {
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
