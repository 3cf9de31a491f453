// The official E2B JavaScript SDK (the npm package e2b, pinned in scripts/test.sh) against the local
// provider started with `--default-snapshot-mode filesystem` (the SDK's createSnapshot cannot name
// a mode): createSnapshot, Sandbox.create of it, independent writes, listSnapshots, fork with count
// 3, deleteSnapshot and a create from the deleted one, and lifecycle onTimeout "pause" with connect.
//   node snapshot_sdk.mjs E2B_JS_INSTALL_DIR
// Environment: PROVIDER_URL, E2B_API_KEY. Prints `RESULT {json}` last; exits non-zero on any
// unexpected answer.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [dir] = process.argv.slice(2);
const env = process.env;
env.E2B_API_URL = env.PROVIDER_URL;
env.E2B_SANDBOX_URL = env.PROVIDER_URL;
delete env.E2B_DOMAIN;
delete env.E2B_DEBUG;
const { Sandbox } = await import(pathToFileURL(join(dir, 'node_modules/e2b/dist/index.mjs')).href);

const check = (condition, message) => {
  if (!condition) throw new Error(message);
  console.log(`ok: ${message}`);
};
const created = [];
const create = async (...args) => {
  const sandbox = await Sandbox.create(...args);
  created.push(sandbox.sandboxId);
  return sandbox;
};
const result = {};

async function main() {
  const source = await create({ timeoutMs: 300_000 });
  await source.files.write('/home/user/js.txt', 'from js\n');

  const started = Date.now();
  const snap = await source.createSnapshot();
  result.snapshot_s = (Date.now() - started) / 1000;
  check(snap.snapshotId && snap.names.includes(snap.snapshotId), `snapshot info ${JSON.stringify(snap)}`);

  const child = await create(snap.snapshotId, { timeoutMs: 120_000 });
  check((await child.files.read('/home/user/js.txt')) === 'from js\n', 'the child has the source file');
  await child.files.write('/home/user/js.txt', 'child\n');
  check((await source.files.read('/home/user/js.txt')) === 'from js\n', 'the child writes its own copy');

  const listed = (await Sandbox.listSnapshots({ sandboxId: source.sandboxId }).nextItems()).map((s) => s.snapshotId);
  check(listed.length === 1 && listed[0] === snap.snapshotId, `listSnapshots by source: ${listed}`);

  const forks = await source.fork({ count: 3, timeoutMs: 120_000 });
  check(forks.length === 3 && forks.every((f) => !(f instanceof Error)), `three forks: ${forks}`);
  created.push(...forks.map((f) => f.sandboxId));
  for (const [i, fork] of forks.entries()) {
    check((await fork.files.read('/home/user/js.txt')) === 'from js\n', `fork ${i} has the parent's file`);
    await fork.files.write('/home/user/own.txt', `fork ${i}\n`);
  }
  check(!(await source.files.exists('/home/user/own.txt')), "the forks' writes stay theirs");

  check((await Sandbox.deleteSnapshot(snap.snapshotId)) === true, 'deleteSnapshot');
  let refused = '';
  try {
    await create(snap.snapshotId);
  } catch (err) {
    refused = String(err);
  }
  check(refused.includes('404') && refused.includes(snap.snapshotId), `create from a deleted snapshot: ${refused}`);

  const paused = await create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } });
  await paused.files.write('/home/user/kept.txt', 'kept\n');
  const until = Date.now() + 20_000;
  while ((await Sandbox.getInfo(paused.sandboxId)).state !== 'paused' && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 250));
  }
  check((await Sandbox.getInfo(paused.sandboxId)).state === 'paused', 'onTimeout pause: paused at its deadline');
  const resumed = await Sandbox.connect(paused.sandboxId, { timeoutMs: 60_000 });
  check((await resumed.files.read('/home/user/kept.txt')) === 'kept\n', 'connect resumes it with its file');
}

try {
  await main();
} finally {
  for (const id of created) {
    await Sandbox.kill(id).catch(() => {});
  }
  for (const snap of await Sandbox.listSnapshots().nextItems()) {
    await Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {});
  }
}
console.log(`RESULT ${JSON.stringify(result)}`);
