// Starts `basalt serve` (or `basalt route`) on a free port for a test file
// and stops it after.
// BASALT_BINARY names the binary (set by ctest); the bundled model is used
// unless BASALT_MODEL says otherwise.
import { spawn } from 'node:child_process';

export async function startServer(args = [], options = {}) {
  // BASALT_SERVE_EXTRA adds flags to every server (ctest runs the client
  // tests again with --overlap).
  const extra = (process.env.BASALT_SERVE_EXTRA ?? '').split(' ').filter((a) => a);
  return startBasalt('serve', [...args, ...extra], options);
}

// `basalt route` (the gateway) on a free port, over `args`' replicas.
export async function startGateway(args = [], options = {}) {
  return startBasalt('route', args, options);
}

async function startBasalt(command, args, { timeoutMs = 120000 } = {}) {
  const binary = process.env.BASALT_BINARY;
  if (!binary) throw new Error('BASALT_BINARY is not set');
  const child = spawn(binary, [command, '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${command} not ready in time:\n${log}`)), timeoutMs);
    let port = null;
    child.stderr.on('data', (chunk) => {
      log += chunk.toString();
      // Lines are text (`... info listening url=http://h:p`) or JSON
      // (`{"ts":...,"event":"listening","url":"http://h:p"}`).
      const listening = log.match(/listening"?[ ,]"?url"?[=:]"?https?:\/\/[^:]+:(\d+)/);
      if (listening) port = Number(listening[1]);
      if (port && /( info ready |"event":"ready")/.test(log)) {
        clearTimeout(timer);
        resolve(port);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${command} exited with ${code}:\n${log}`));
    });
  });
  const port = await ready;
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return {
    port,
    baseURL: `http://127.0.0.1:${port}`,
    child,
    exited,
    log: () => log,
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      return exited;
    },
  };
}

// Reads a Prometheus text body into { 'name{labels}': number }.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    out[line.slice(0, space)] = Number(line.slice(space + 1));
  }
  return out;
}

// The first sample whose name (before '{') is `name`.
export function metric(samples, name) {
  for (const [key, value] of Object.entries(samples)) if (key.split('{')[0] === name) return value;
  return undefined;
}

export async function waitFor(predicate, timeoutMs = 30000) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await predicate()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}
