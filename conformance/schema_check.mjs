// Strict-mode AJV (JSON Schema 2020-12, as the TypeScript MCP SDK validates
// tool schemas) over every tool schema a running sandbox-mcp lists, for both
// protocol generations: fails on any warning or error (non-standard formats,
// union type arrays, unknown keywords...). AJV comes with the pinned
// conformance suite's dependencies.
//   node conformance/schema_check.mjs http://127.0.0.1:PORT/mcp SUITE_NODE_MODULES
import { createRequire } from 'node:module';

const [url, modules] = process.argv.slice(2);
const require = createRequire(`${modules}/`);
const Ajv2020 = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats');

async function post(headers, body) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  const parse = (t) => { try { return JSON.parse(t); } catch { return undefined; } };
  const json = res.headers.get('content-type')?.startsWith('text/event-stream')
    ? text.split('\n').filter((l) => l.startsWith('data:')).map((l) => parse(l.slice(5))).find((m) => m?.id !== undefined)
    : parse(text);
  return { res, json };
}

async function legacyTools() {
  const init = await post({}, { jsonrpc: '2.0', id: 1, method: 'initialize', params: {
    protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'schema-check', version: '1' } } });
  const session = init.res.headers.get('mcp-session-id');
  const h = { 'mcp-session-id': session, 'MCP-Protocol-Version': '2025-11-25' };
  await post(h, { jsonrpc: '2.0', method: 'notifications/initialized' });
  return (await post(h, { jsonrpc: '2.0', id: 2, method: 'tools/list' })).json.result.tools;
}

async function modernTools() {
  const meta = { 'io.modelcontextprotocol/protocolVersion': '2026-07-28',
    'io.modelcontextprotocol/clientInfo': { name: 'schema-check', version: '1' },
    'io.modelcontextprotocol/clientCapabilities': {} };
  const h = { 'MCP-Protocol-Version': '2026-07-28', 'Mcp-Method': 'tools/list' };
  return (await post(h, { jsonrpc: '2.0', id: 1, method: 'tools/list', params: { _meta: meta } })).json.result.tools;
}

let problems = 0;
for (const [generation, tools] of [['2025-11-25', await legacyTools()], ['2026-07-28', await modernTools()]]) {
  const logger = { log() {}, warn: (...a) => { problems++; console.log(`${generation} AJV warning:`, ...a); },
    error: (...a) => { problems++; console.log(`${generation} AJV error:`, ...a); } };
  const ajv = new Ajv2020({ strict: true, logger });
  addFormats(ajv);
  let schemas = 0;
  for (const tool of tools) {
    for (const schema of [tool.inputSchema, tool.outputSchema].filter(Boolean)) {
      schemas++;
      try { ajv.compile(schema); } catch (e) { problems++; console.log(`${generation} ${tool.name}: ${e.message}`); }
    }
  }
  console.log(`schema check ${generation}: ${tools.length} tools, ${schemas} schemas compiled by strict AJV`);
}
if (problems) { console.log(`schema check: ${problems} AJV warnings/errors`); process.exit(1); }
console.log('schema check: no AJV warnings');
