// Interop with the official TypeScript MCP client (@modelcontextprotocol/client,
// pinned in scripts/test.sh) against a running sandbox-mcp:
//   node ts_client.mjs URL TOKEN CLIENT_INSTALL_DIR
// create -> run -> kill with a bearer token; prints one JSON line, including how
// many warnings the SDK printed (AJV schema warnings among them: must be 0).
import { pathToFileURL } from 'node:url';

const [url, token, dir] = process.argv.slice(2);
const { Client, StreamableHTTPClientTransport } = await import(
  pathToFileURL(`${dir}/node_modules/@modelcontextprotocol/client/dist/index.mjs`).href
);
const warnings = [];
for (const level of ['warn', 'error']) {
  const original = console[level];
  console[level] = (...args) => { warnings.push(args.join(' ')); original(...args); };
}
const client = new Client({ name: 'ts-interop', version: '1.0.0' });
await client.connect(
  new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
);
const tools = await client.listTools();
const created = await client.callTool({ name: 'create_sandbox', arguments: {} });
const id = created.structuredContent.sandbox_id;
const run = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id, command: 'echo ts' } });
const killed = await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } });
await client.close();
console.log(JSON.stringify({
  tools: tools.tools.length,
  stdout: run.structuredContent?.stdout,
  exit_code: run.structuredContent?.exit_code,
  killed: killed.structuredContent?.killed,
  warnings,
}));
