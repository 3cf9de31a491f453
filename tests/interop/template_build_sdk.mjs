// The official E2B JavaScript SDK's Template API (the npm package e2b, pinned in scripts/test.sh)
// against the local provider: a build from a private-registry image with COPY, ENV and RUN (logs
// collected), Sandbox.create of it and commands inside, Template.exists, and a failing step that
// rejects with BuildError.
//   node template_build_sdk.mjs E2B_JS_INSTALL_DIR
// Environment: PROVIDER_URL, E2B_API_KEY, REGISTRY, REGISTRY_USER, REGISTRY_PASSWORD, RUN_TAG.
// Prints `RESULT {json}` last; exits non-zero on any unexpected answer.
import { mkdtempSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [dir] = process.argv.slice(2);
const env = process.env;
env.E2B_API_URL = env.PROVIDER_URL;
env.E2B_SANDBOX_URL = env.PROVIDER_URL;
delete env.E2B_DOMAIN;
delete env.E2B_DEBUG;
const { Template, Sandbox, BuildError } = await import(pathToFileURL(join(dir, 'node_modules/e2b/dist/index.mjs')).href);

const check = (condition, message) => { if (!condition) throw new Error(message); };
const image = `${env.REGISTRY}/team/debian:bookworm`;
const credentials = { username: env.REGISTRY_USER, password: env.REGISTRY_PASSWORD };
const name = `js-img-${env.RUN_TAG}`;

const logs = [];

async function main() {
  const ctx = mkdtempSync(join(tmpdir(), 'js-ctx-'));
  writeFileSync(join(ctx, 'js.txt'), 'from the js sdk\n');
  writeFileSync(join(ctx, 'tool.sh'), '#!/bin/sh\necho tool-ran\n');
  chmodSync(join(ctx, 'tool.sh'), 0o755);

  const template = Template({ fileContextPath: ctx })
    .fromImage(image, credentials)
    .copy('js.txt', '/home/user/js.txt')
    .copy('tool.sh', '/usr/local/bin/tool', { user: 'root', mode: 0o755 })
    .setEnvs({ JS_VAR: 'js-env' })
    .runCmd('tr a-z A-Z < /home/user/js.txt > /home/user/js-upper.txt && echo "js-step-$JS_VAR"');
  check(!(await Template.exists(name)), `${name} exists before its build`);
  const started = Date.now();
  const info = await Template.build(template, name, { onBuildLogs: (entry) => logs.push(entry.message) });
  const seconds = (Date.now() - started) / 1000;
  check(info.templateId && info.buildId, `build info ${JSON.stringify(info)}`);
  check(logs.some((m) => m.includes('js-step-js-env')), `the RUN's output is not in the logs: ${logs.join('\n')}`);
  check(await Template.exists(name), `${name} does not exist after its build`);

  const sbx = await Sandbox.create(name, { timeoutMs: 120_000 });
  let inside;
  try {
    const run = await sbx.commands.run(
      'cat /home/user/js-upper.txt; stat -c "%U %a" /home/user/js.txt /usr/local/bin/tool; tool; ' +
        "dpkg -s apt | grep '^Status:'; id -un",
    );
    inside = run.stdout;
    const want = 'FROM THE JS SDK\nuser 644\nroot 755\ntool-ran\nStatus: install ok installed\nuser\n';
    check(run.exitCode === 0 && inside === want, `inside: ${JSON.stringify(inside)} (want ${JSON.stringify(want)})`);
  } finally {
    await sbx.kill();
  }

  // A failing step rejects with BuildError naming the exit code; nothing is registered.
  const failing = `js-failing-${env.RUN_TAG}`;
  let message = null;
  try {
    await Template.build(Template().fromTemplate(name).runCmd('echo js-out-line; exit 4'), failing);
  } catch (err) {
    check(err instanceof BuildError, `a ${err?.constructor?.name} instead of BuildError: ${err}`);
    message = err.message;
  }
  check(message !== null, 'the failing build did not reject');
  check(message.includes('4') && /exit/i.test(message), `BuildError message: ${message}`);
  check(!(await Template.exists(failing)), `${failing} exists after a failed build`);

  return { name, seconds, inside, failing: message, logLines: logs.length };
}

let result;
try {
  result = await main();
} catch (err) {
  // The SDK's errors carry the build's stack trace; print the message itself.
  console.error(`${err?.name}: ${err?.message}\nbuild logs:\n${logs.join('\n')}`);
  process.exit(1);
}
console.log(`RESULT ${JSON.stringify(result)}`);
