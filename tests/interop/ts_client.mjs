// Interop with the official TypeScript MCP client (@modelcontextprotocol/client) and its
// Tasks extension package (@modelcontextprotocol/ext-tasks), both pinned in scripts/test.sh,
// against a running sandbox-mcp:
//   node ts_client.mjs URL TOKEN CLIENT_INSTALL_DIR MODE      (MODE: 2026-07-28 | legacy)
//
// 2026-07-28 (the client pinned to it with versionNegotiation): create -> run ->
// task-augmented run_command through an ext-tasks session (it polls tasks/get until the task
// is terminal) -> a task-augmented start_task cancelled with tasks/cancel -> kill.
// legacy (initialize + session): create -> run -> start_task / get_task / cancel_task -> kill.
// Prints one JSON line with what it saw, including every warning the SDK printed (AJV schema
// warnings among them: there must be none). Exits non-zero on any unexpected answer.
import { pathToFileURL } from 'node:url';

const [url, token, dir, mode = '2026-07-28'] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(`${dir}/node_modules/@modelcontextprotocol/${path}`).href);
const { Client, StreamableHTTPClientTransport } = await load('client/dist/index.mjs');
const { createTaskSessionFromClient, resultFromTaskOutcome } = await load('ext-tasks/dist/client/index.js');

const warnings = [];
for (const level of ['warn', 'error']) {
  const original = console[level];
  console[level] = (...args) => { warnings.push(args.join(' ')); original(...args); };
}
const fail = (message) => { throw new Error(message); };
const structured = (result) => (result.isError ? fail(`tool error: ${JSON.stringify(result.content)}`) : result.structuredContent);

const modern = mode !== 'legacy';
const clientInfo = { name: 'ts-interop', version: '1.0.0' };
// The plain client does not declare the tasks extension (a server may then answer any tools/call of
// run_command with a task, which only the ext-tasks session below decodes); the session's requests do.
const client = new Client(clientInfo, {
  ...(modern ? { versionNegotiation: { mode: { pin: '2026-07-28' } } } : {}),
});
await client.connect(
  new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
);
const seen = { mode, era: client.getProtocolEra() };
seen.tools = (await client.listTools()).tools.length;
const created = structured(await client.callTool({ name: 'create_sandbox', arguments: {} }));
const sandbox_id = created.sandbox_id;
seen.owned = created.owned;
const run = structured(await client.callTool({ name: 'run_command', arguments: { sandbox_id, command: 'echo ts' } }));
seen.stdout = run.stdout;
seen.exit_code = run.exit_code;

if (modern) {
  // ext-tasks needs a host-owned raw request path for task wire shapes on 2026-07-28: one
  // stateless POST per request, with the standard headers (no session exists to share).
  const methods = [];
  let nextId = 1;
  const rawDispatch = async (request, options = {}) => {
    methods.push(request.method);
    const name = request.method === 'tools/call' ? request.params?.name : request.params?.taskId;
    const response = await fetch(url, {
      method: 'POST',
      signal: options.signal,
      headers: {
        'Content-Type': 'application/json',
        Accept: 'application/json, text/event-stream',
        Authorization: `Bearer ${token}`,
        'MCP-Protocol-Version': '2026-07-28',
        'Mcp-Method': request.method,
        ...(name ? { 'Mcp-Name': name } : {}),
        ...(options.context?.headers ?? {}),
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: `raw-${nextId++}`, ...request }),
    });
    const text = await response.text();
    // A JSON answer, or an SSE stream whose last data line is the JSON-RPC response.
    const body = (response.headers.get('content-type') ?? '').includes('text/event-stream')
      ? text.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).filter(Boolean).pop()
      : text;
    const message = JSON.parse(body ?? fail(`${request.method}: HTTP ${response.status} with no body`));
    return message.error ? { kind: 'error', error: message.error } : { kind: 'result', result: message.result };
  };
  const session = createTaskSessionFromClient(client, {
    endpointId: `sandbox-mcp-interop:${url}`,
    rawDispatch,
    v2RequestFraming: { protocolVersion: '2026-07-28', clientInfo, clientCapabilities: {} },
  });
  seen.task_execution = session.capabilities.execution;
  seen.task_cancellation = session.capabilities.cancellation;

  // A task-augmented run_command: a real sandbox task, polled with tasks/get until terminal.
  const execution = await session.callTool('run_command', { sandbox_id, command: 'sleep 2; echo task; exit 2' });
  seen.task_kind = execution.kind;
  seen.task_id_given = typeof execution.handle?.taskId === 'string' && execution.handle.taskId.length > 0;
  const statuses = [];
  const { outcome } = await execution.settle({
    onEvent: (event) => { if (event.type === 'task') statuses.push(event.task.status); },
  });
  seen.task_statuses = [...new Set(statuses)];
  seen.task_outcome = outcome.status;
  const taskResult = resultFromTaskOutcome(outcome);
  seen.task_stdout = taskResult.structuredContent?.stdout;
  seen.task_exit_code = taskResult.structuredContent?.exit_code;
  seen.task_gets = methods.filter((m) => m === 'tasks/get').length;

  // A second task (task-augmented start_task), cancelled with tasks/cancel while it runs.
  const long = await session.callTool('start_task', { sandbox_id, command: 'sleep 60' });
  seen.second_kind = long.kind;
  const cancelsBefore = methods.filter((m) => m === 'tasks/cancel').length;
  await long.cancel();
  seen.cancel_sent = methods.filter((m) => m === 'tasks/cancel').length - cancelsBefore;
  const cancelled = await long.result();
  seen.cancelled_outcome = cancelled.status;
  // What the server says about it now (a fresh tasks/get through a task controller).
  seen.cancelled_state = (await session.task(long.handle.taskId).snapshot()).status;
  await session.close();
} else {
  // Legacy sessions: the sandbox task tools.
  const started = structured(await client.callTool({ name: 'start_task', arguments: { sandbox_id, command: 'sleep 60' } }));
  const got = structured(await client.callTool({ name: 'get_task', arguments: { sandbox_id, task_id: started.task_id } }));
  seen.task_state = got.state;
  const cancelled = structured(
    await client.callTool({ name: 'cancel_task', arguments: { sandbox_id, task_id: started.task_id } }),
  );
  seen.cancelled_state = cancelled.state;
}

const killed = structured(await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id } }));
seen.killed = killed.killed;
await client.close();
seen.warnings = warnings;
console.log(JSON.stringify(seen));
