#!/usr/bin/env python3
"""Scripted MCP session against `sandbox-mcp serve` with the official Python
`mcp` SDK (pinned: mcp==1.30.0, see tests/interop/requirements.txt).

Usage: mcp_client_session.py SERVER_URL [BEARER_TOKEN]
  SERVER_URL   e.g. http://127.0.0.1:8080/mcp
  BEARER_TOKEN optional; also read from $SANDBOX_MCP_TOKEN

Runs: initialize, list tools, create_sandbox, run_command (exit 0 and
non-zero), write_file / read_file (text and base64), list_files,
list_sandboxes, an unknown-field call (must be a tool error), kill_sandbox,
then DELETE of the session. Prints one line per check and finally
"N passed, M failed"; exits non-zero if anything failed.
"""

import asyncio
import base64
import json
import os
import sys

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_checks import PRODUCT_TOOLS, Checks, structured, text_of


async def run(url, token):
    checks = Checks()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(120, read=300)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, get_session_id):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                checks.check("initialize", init.serverInfo.name == "sandbox-mcp", init.serverInfo)
                checks.check("protocol version", init.protocolVersion in ("2025-11-25", "2025-06-18"), init.protocolVersion)
                checks.check("session id", bool(get_session_id()))

                tools = await session.list_tools()
                names = {t.name for t in tools.tools}
                checks.check("list tools", PRODUCT_TOOLS == names, sorted(names))
                run_tool = next((t for t in tools.tools if t.name == "run_command"), None)
                checks.check(
                    "run_command schema rejects unknown fields",
                    run_tool is not None and run_tool.inputSchema.get("additionalProperties") is False,
                    run_tool.inputSchema if run_tool else None,
                )

                no_default = await session.call_tool("run_command", {"command": "true"})
                checks.check(
                    "no default sandbox is a tool error naming create_sandbox",
                    no_default.isError and "create_sandbox" in text_of(no_default),
                    text_of(no_default),
                )

                created = await session.call_tool("create_sandbox", {"timeout": 300, "metadata": {"suite": "interop"}})
                data = structured(created)
                sandbox_id = data.get("sandbox_id")
                if not checks.check("create_sandbox", not created.isError and bool(sandbox_id), text_of(created)):
                    return checks

                ran = await session.call_tool("run_command", {"command": "echo hello; echo oops >&2"})
                data = structured(ran)
                checks.check(
                    "run_command output",
                    not ran.isError and data.get("exit_code") == 0 and data.get("stdout") == "hello\n"
                    and data.get("stderr") == "oops\n",
                    data,
                )
                failed = await session.call_tool("run_command", {"command": "exit 7", "sandbox_id": sandbox_id})
                data = structured(failed)
                checks.check("non-zero exit is data", not failed.isError and data.get("exit_code") == 7, data)

                text = "line one\nline two ü\n"
                wrote = await session.call_tool("write_file", {"path": "/home/user/notes/a.txt", "content": text})
                checks.check("write_file text", not wrote.isError, text_of(wrote))
                read_back = await session.call_tool("read_file", {"path": "/home/user/notes/a.txt"})
                data = structured(read_back)
                checks.check(
                    "read_file text", data.get("encoding") == "text" and data.get("content") == text, data
                )

                blob = bytes(range(256))
                wrote = await session.call_tool(
                    "write_file",
                    {"path": "notes/b.bin", "content": base64.b64encode(blob).decode(), "encoding": "base64"},
                )
                checks.check("write_file base64", not wrote.isError, text_of(wrote))
                read_back = await session.call_tool("read_file", {"path": "/home/user/notes/b.bin"})
                data = structured(read_back)
                checks.check(
                    "read_file binary comes back as base64",
                    data.get("encoding") == "base64" and base64.b64decode(data.get("content", "")) == blob,
                    {k: v for k, v in data.items() if k != "content"},
                )

                listed = await session.call_tool("list_files", {"path": "/home/user/notes"})
                data = structured(listed)
                names = sorted(e.get("name") for e in data.get("entries", []))
                checks.check("list_files", names == ["a.txt", "b.bin"], data)

                sandboxes = await session.call_tool("list_sandboxes", {})
                data = structured(sandboxes)
                mine = [s for s in data.get("sandboxes", []) if s.get("sandbox_id") == sandbox_id]
                checks.check(
                    "list_sandboxes shows it as default and owned",
                    len(mine) == 1 and {"default", "owned"} <= set(mine[0].get("session_roles", []))
                    and mine[0].get("metadata", {}).get("suite") == "interop",
                    data,
                )

                unknown = await session.call_tool("run_command", {"command": "true", "bogus": 1})
                checks.check("unknown field is a tool error", unknown.isError, text_of(unknown))

                killed = await session.call_tool("kill_sandbox", {"sandbox_id": sandbox_id})
                data = structured(killed)
                checks.check("kill_sandbox", not killed.isError and data.get("killed") is True, data)
                after = await session.call_tool("run_command", {"command": "true", "sandbox_id": sandbox_id})
                checks.check("killed sandbox is not found", after.isError and "not found" in text_of(after), text_of(after))

            session_id = get_session_id()
        # Leaving the transport context sent DELETE; the session must be gone now.
        probe = await http.post(
            url,
            headers={
                "Mcp-Session-Id": session_id or "",
                "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json",
                "MCP-Protocol-Version": "2025-11-25",
            },
            content=json.dumps({"jsonrpc": "2.0", "id": 99, "method": "tools/list"}),
        )
        checks.check("session ended after DELETE (404)", probe.status_code == 404, probe.status_code)
    return checks


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    url = sys.argv[1]
    token = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("SANDBOX_MCP_TOKEN")
    try:
        checks = asyncio.run(run(url, token))
    except Exception as exc:  # a crash is a failure, reported like one
        print(f"FAIL session crashed: {exc!r}")
        print("0 passed, 1 failed")
        return 1
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
