"""One full MCP session against a running sandbox-mcp container, with the
official Python `mcp` client. Run by deploy/image-test.sh for each image target.

  python mcp_session.py http://127.0.0.1:PORT/mcp     (token in SANDBOX_MCP_TEST_TOKEN)

It initializes, lists the tools, creates a sandbox, runs a command in it,
imports a share of python3's standard library in it, starts a task and reads
it to its end (get_task with wait_seconds and offsets), then kills the
sandbox. Prints one line per check and "N passed, M failed". With
SANDBOX_MCP_TEST_HOLD_FILE set, it then creates one more sandbox, writes its id
to that file and keeps the session open until the server ends it (the
caller stops the container meanwhile: graceful shutdown must kill it); it
exits 1 on any failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

import mcp.client.streamable_http as mcp_http

# The checks and result helpers the repository's MCP test scripts share.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "interop"))
from mcp_checks import Checks, enter_legacy_session, follow_task, tool_payload  # noqa: E402

# mcp >= 2 uses the `httpx2` package, mcp 1.x `httpx`: use whichever the transport uses.
httpx = getattr(mcp_http, "httpx2", None) or getattr(mcp_http, "httpx")

EXPECTED_TOOLS = {"create_sandbox", "kill_sandbox", "run_command", "start_task", "get_task"}
STDLIB_CHECK = (
    "python3 -I -c 'import asyncio, ctypes, json, sqlite3, ssl, urllib.request, zoneinfo; "
    'zoneinfo.ZoneInfo("Europe/Paris"); print("stdlib-ok")\''
)


class SessionChecks(Checks):
    """The checks, and whether the session is being held open on purpose (then its end is no failure)."""

    holding = False


async def session(url: str, token: str, checks: SessionChecks) -> None:
    client = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(30.0, read=120.0))
    sandbox_id = None
    async with client, contextlib.AsyncExitStack() as stack:
        mcp = await enter_legacy_session(stack, url, client)
        init = await mcp.initialize()
        checks.check("initialize", bool(init.serverInfo.name), init)
        tools = {t.name for t in (await mcp.list_tools()).tools}
        checks.check("tools/list has the product's tools", EXPECTED_TOOLS <= tools, sorted(EXPECTED_TOOLS - tools))
        try:
            is_err, sc = tool_payload(await mcp.call_tool("create_sandbox", {"timeout": 300}))
            sandbox_id = sc.get("sandbox_id")
            if not checks.check("create_sandbox", not is_err and bool(sandbox_id), sc):
                return

            is_err, sc = tool_payload(
                await mcp.call_tool(
                    "run_command", {"sandbox_id": sandbox_id, "command": "echo hello-from-image; id -u; uname -n"}
                )
            )
            checks.check(
                "run_command in the sandbox",
                not is_err and sc.get("exit_code") == 0 and "hello-from-image" in str(sc.get("stdout")),
                sc,
            )

            # The local image prunes python (byte-code, tests): its standard library must still import.
            is_err, sc = tool_payload(
                await mcp.call_tool("run_command", {"sandbox_id": sandbox_id, "command": STDLIB_CHECK})
            )
            checks.check(
                "python3 with its standard library in the sandbox",
                not is_err and sc.get("exit_code") == 0 and "stdlib-ok" in str(sc.get("stdout")),
                sc,
            )

            is_err, sc = tool_payload(
                await mcp.call_tool(
                    "start_task",
                    {"sandbox_id": sandbox_id, "command": "for i in 1 2 3; do echo tick$i; sleep 0.3; done"},
                )
            )
            task_id = sc.get("task_id")
            if not checks.check("start_task", not is_err and bool(task_id), sc):
                return
            is_err, sc, stdout = await follow_task(mcp, sandbox_id, task_id)
            checks.check(
                "get_task reads the task to its end",
                not is_err and sc.get("state") == "succeeded" and stdout.split() == ["tick1", "tick2", "tick3"],
                {"stdout": stdout, "last": sc},
            )
        finally:
            if sandbox_id:
                is_err, sc = tool_payload(await mcp.call_tool("kill_sandbox", {"sandbox_id": sandbox_id}))
                checks.check("kill_sandbox", not is_err, sc)
        hold_file = os.environ.get("SANDBOX_MCP_TEST_HOLD_FILE")
        if hold_file and checks.failed == 0:
            is_err, sc = tool_payload(await mcp.call_tool("create_sandbox", {"timeout": 300}))
            held = sc.get("sandbox_id")
            if checks.check("create_sandbox (held open while the container is stopped)", not is_err and bool(held), sc):
                checks.holding = True
                with open(hold_file, "w", encoding="utf-8") as f:
                    f.write(f"{held}\n")
                # The server ends the session when it shuts down; then any request fails.
                with contextlib.suppress(Exception):
                    for _ in range(120):
                        await asyncio.sleep(0.5)
                        await mcp.send_ping()


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    token = os.environ.get("SANDBOX_MCP_TEST_TOKEN", "")
    checks = SessionChecks()
    try:
        asyncio.run(session(sys.argv[1], token, checks))
    except BaseException as exc:  # noqa: BLE001 - any failure of the session is a test failure
        if isinstance(exc, KeyboardInterrupt) or not checks.holding:
            checks.check("the session ran to its end", False, repr(exc))
        # While holding, the server's shutdown ending the session is the expected end.
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
