// What the official TypeScript MCP client (@modelcontextprotocol/client, legacy session) shows a
// user when sandbox-mcp refuses a request at the HTTP level:
//   node refusals_ts.mjs URL TOKEN CLIENT_INSTALL_DIR CASE...   (CASE: 401 403 404 413 415 429)
// Prints one JSON line mapping each case to the message of the error the client threw (or
// "no error").
import { pathToFileURL } from 'node:url';

const [url, token, dir, ...cases] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(`${dir}/node_modules/@modelcontextprotocol/${path}`).href);
const { Client, StreamableHTTPClientTransport } = await load('client/dist/index.mjs');

const connect = async (bearer, options = {}) => {
  const client = new Client({ name: 'ts-refusals', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
    ...options,
  });
  // Ended with DELETE afterwards, so the next case starts under the session limit.
  client.end = async () => {
    await transport.terminateSession().catch(() => {});
    await client.close().catch(() => {});
  };
  await client.connect(transport);
  return client;
};

const refused = async (c) => {
  const open = [];
  try {
    if (c === '401') open.push(await connect('wrong-token-0123456789'));
    else if (c === '403') open.push(await connect(token));
    else if (c === '404') {
      // The session ends under the client (as when it expires), then the client uses it.
      const client = await connect(token);
      open.push(client);
      const headers = { Authorization: `Bearer ${token}`, 'mcp-session-id': client.transport.sessionId };
      await fetch(url, { method: 'DELETE', headers });
      await client.listTools();
    } else if (c === '413') {
      const client = await connect(token);
      open.push(client);
      await client.callTool({ name: 'run_command', arguments: { sandbox_id: 'x', command: `echo ${'a'.repeat(8192)}` } });
    } else if (c === '415') {
      const textPlain = (input, init = {}) => {
        const headers = new Headers(init.headers);
        if ((init.method ?? 'GET') === 'POST') headers.set('content-type', 'text/plain');
        return fetch(input, { ...init, headers });
      };
      open.push(await connect(token, { fetch: textPlain }));
    } else if (c === '429') {
      open.push(await connect(token));
      open.push(await connect(token));
    }
    return 'no error';
  } catch (err) {
    return `${err?.name ?? 'Error'}: ${err?.message ?? err}`;
  } finally {
    for (const client of open) await client.end();
  }
};

const seen = {};
for (const c of cases) seen[c] = await refused(c);
console.log(JSON.stringify(seen));
