#!/usr/bin/env python3
"""One legacy MCP session moved between two `serve` replicas sharing a Redis,
driven by the official Python `mcp` SDK (pinned: mcp==1.30.0).

Usage: redis_sessions.py REPLICA1_BASE REPLICA2_BASE REPLICA1_PID

The client talks to a small TCP balancer (this script's fault injector: it
switches the backend and cuts open connections, as a load balancer moving a
client or a network break would). Checks: the session initialized on replica 1
continues on replica 2 without re-initializing (default sandbox intact); a
`get_task wait_seconds` SSE stream cut on replica 1 is resumed by the SDK with
Last-Event-ID on replica 2 and delivers the result; replica 1 SIGKILLed
mid-session and the session continues on replica 2; the final DELETE goes to
replica 2. Prints "SANDBOX <id>", one line per check, then "N passed, M failed".
"""

import asyncio
import os
import signal
import sys
import time
from urllib.parse import urlparse

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_checks import Checks, structured
from tcp_splice import splice


class Balancer:
    """Forwards TCP connections to the current backend; `move_to` switches it and cuts every open connection."""

    def __init__(self, backend):
        self.backend = backend
        self.conns = set()
        self.server = None

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def handle(self, reader, writer):
        host, port = self.backend
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self.conns.add(pair)

        await splice(reader, writer, up_reader, up_writer)
        self.conns.discard(pair)

    def move_to(self, backend):
        self.backend = backend
        for client, upstream in list(self.conns):
            upstream.close()
            client.close()
        self.conns.clear()


async def check_default_sandbox(session, checks, name):
    """The session's default sandbox still holds the file the first call wrote."""
    result = await session.call_tool("run_command", {"command": "cat /tmp/m"})
    out = structured(result) if not result.isError else {}
    checks.check(name, not result.isError and out.get("stdout", "").strip() == "moved", result.content)


def addr(base):
    url = urlparse(base)
    return (url.hostname, url.port)


async def main():
    r1, r2, r1_pid = addr(sys.argv[1]), addr(sys.argv[2]), int(sys.argv[3])
    checks = Checks()
    balancer = Balancer(r1)
    port = await balancer.start()
    url = f"http://127.0.0.1:{port}/mcp"
    async with streamable_http_client(url) as (read, write, get_session_id):
        async with ClientSession(read, write) as session:
            await session.initialize()
            session_id = get_session_id()
            created = structured(await session.call_tool("create_sandbox", {}))
            sandbox = created["sandbox_id"]
            print(f"SANDBOX {sandbox}", flush=True)
            wrote = await session.call_tool("run_command", {"command": "echo moved > /tmp/m"})
            checks.check("run_command on replica 1", not wrote.isError, wrote.content)

            balancer.move_to(r2)
            await check_default_sandbox(session, checks, "replica 2 continues the session with its default sandbox")
            checks.check("same session id (no re-initialize)", get_session_id() == session_id)
            # A second sandbox for the task (start_task retains its sandbox past the session); the
            # first one stays the default by connecting to it again.
            task_sandbox = structured(await session.call_tool("create_sandbox", {}))["sandbox_id"]
            print(f"TASK_SANDBOX {task_sandbox}", flush=True)
            await session.call_tool("connect_sandbox", {"sandbox_id": sandbox})

            task = structured(
                await session.call_tool(
                    "start_task", {"command": "sleep 3; exit 7", "sandbox_id": task_sandbox}
                )
            )
            balancer.move_to(r1)

            async def cut_later():
                await asyncio.sleep(1.0)
                balancer.move_to(r2)  # breaks get_task's SSE stream on replica 1

            started = time.monotonic()
            cutter = asyncio.create_task(cut_later())
            waited = await session.call_tool(
                "get_task",
                {"sandbox_id": task_sandbox, "task_id": task["task_id"], "wait_seconds": 15},
            )
            await cutter
            view = structured(waited) if not waited.isError else {}
            checks.check(
                "get_task stream cut on replica 1 resumes on replica 2 (Last-Event-ID) with the result",
                not waited.isError
                and view.get("state") == "failed"
                and view.get("exit_code") == 7
                and time.monotonic() - started > 1.0,
                waited.content,
            )

            balancer.move_to(r1)
            on_r1 = await session.call_tool("run_command", {"command": "echo before-kill"})
            checks.check("back on replica 1", not on_r1.isError, on_r1.content)
            os.kill(r1_pid, signal.SIGKILL)
            balancer.move_to(r2)
            await check_default_sandbox(session, checks, "replica 1 SIGKILLed mid-session: replica 2 continues it")
    # Leaving the context sent DELETE (to replica 2).
    return checks.summary()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
