// The deployment specs the render and Helm tests share: deploy/basalt.yaml
// and variants of it, written to a scratch directory, each with the
// `basalt deploy render` flags it is rendered with.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const exampleSpec = join(repo, 'deploy', 'basalt.yaml');

export const scratch = mkdtempSync(join(tmpdir(), 'basalt-deploy-'));
process.on('exit', () => rmSync(scratch, { recursive: true, force: true }));

// deploy/basalt.yaml with `replacements` ([from, to]) applied to its text.
export function variant(name, replacements) {
  let text = readFileSync(exampleSpec, 'utf8');
  for (const [from, to] of replacements) {
    assert.ok(text.includes(from), `deploy/basalt.yaml has no '${from}'`);
    text = text.replace(from, to);
  }
  const path = join(scratch, `${name}.yaml`);
  writeFileSync(path, text);
  return path;
}

// name -> {spec, namespace, autoscaler}
export const variants = {
  example: { spec: exampleSpec, namespace: 'default', autoscaler: 'keda' },
  gpu_volume_tenants_regions: {
    spec: variant('gpu', [
      ['  # volume: {pvc: models}', '  volume: {pvc: models}'],
      ['  # gpu: {count: 1, product: NVIDIA-H200}', '  gpu: {count: 1, product: NVIDIA-H200}'],
      ['# regions: [eu-west]', 'regions: [eu-west, eu-north]'],
      ['# tenants: {secret: mini-tenants}', 'tenants: {secret: mini-tenants}'],
      ['args: ["--max-running", "64"]', 'args: ["--max-running", "64", "--drain-timeout", "90"]'],
      ['  # startup_timeout: 10m', '  startup_timeout: 2.5m'],
    ]),
    namespace: 'serving',
    autoscaler: 'keda',
  },
  hpa_queue_time: {
    spec: variant('hpa', [
      ['metric: concurrency', 'metric: queue_time'],
      ['target: 8', 'target: 0.25'],
    ]),
    namespace: 'default',
    autoscaler: 'hpa',
  },
  ttft: {
    spec: variant('ttft', [
      ['metric: concurrency', 'metric: ttft_p95'],
      ['target: 8', 'target: 1.5'],
      ['down_after: 5m', 'down_after: 45m'],
    ]),
    namespace: 'default',
    autoscaler: 'keda',
  },
  scale_to_zero: {
    spec: variant('zero', [['replicas: {min: 1, max: 4}', 'replicas: {min: 0, max: 4}']]),
    namespace: 'default',
    autoscaler: 'keda',
  },
  fixed_size: {
    spec: variant('fixed', [['replicas: {min: 1, max: 4}', 'replicas: {min: 2, max: 2}']]),
    namespace: 'default',
    autoscaler: 'keda',
  },
  // A replica over two nodes of 8 GPUs: a LeaderWorkerSet (docs/DEPLOY.md step 5).
  multi_node: {
    spec: variant('multinode', [
      ['  # gpu: {count: 1, product: NVIDIA-H200}', '  gpu: {count: 8, product: NVIDIA-H200}'],
      ['  # nodes: 2', '  nodes: 2'],
      ['args: ["--max-running", "64"]', 'args: ["--max-running", "64", "--tp", "16"]'],
      ['# regions: [eu-west]', 'regions: [eu-west]'],
    ]),
    namespace: 'serving',
    autoscaler: 'hpa',
  },
};

// Specs neither renderer may render, with what the error must say.
export const unrenderable = {
  multi_node_without_tp: {
    spec: variant('multinode-no-tp', [
      ['  # gpu: {count: 1, product: NVIDIA-H200}', '  gpu: {count: 1, product: NVIDIA-H200}'],
      ['  # nodes: 2', '  nodes: 2'],
    ]),
    autoscaler: 'keda',
    error: /engine\.args: a replica over 2 nodes of 1 GPUs runs its 2 GPUs as ranks: give --tp 2 \(no --tp given\)/,
  },
  multi_node_wrong_tp: {
    spec: variant('multinode-tp', [
      ['  # gpu: {count: 1, product: NVIDIA-H200}', '  gpu: {count: 4, product: NVIDIA-H200}'],
      ['  # nodes: 2', '  nodes: 2'],
      ['args: ["--max-running", "64"]', 'args: ["--max-running", "64", "--tp=4"]'],
    ]),
    autoscaler: 'keda',
    error: /engine\.args: a replica over 2 nodes of 4 GPUs runs its 8 GPUs as ranks: give --tp 8 \(--tp is 4\)/,
  },
  startup_over_a_day: {
    spec: variant('slowstart', [['  # startup_timeout: 10m', '  startup_timeout: 25h']]),
    autoscaler: 'keda',
    error: /engine\.startup_timeout: '25h' must be above 0 and at most a day/,
  },
  hpa_to_zero: {
    spec: variant('hpazero', [['replicas: {min: 1, max: 4}', 'replicas: {min: 0, max: 4}']]),
    autoscaler: 'hpa',
    error: /replicas\.min: 0 \(scale to zero\) needs (--)?autoscaler keda/,
  },
};
