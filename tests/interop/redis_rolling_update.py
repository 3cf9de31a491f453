#!/usr/bin/env python3
"""A legacy MCP session through a rolling update of `serve` replicas sharing a
Redis, driven by the official Python `mcp` SDK (pinned: mcp==1.30.0).

Usage: redis_rolling_update.py CONTROL_FILE

CONTROL_FILE (JSON, rewritten by the test as it replaces replicas):
{"backends": ["http://127.0.0.1:PORT", ...], "done": false}

The client talks to a small TCP balancer standing in for a Kubernetes Service:
it probes each backend's /readyz every 100 ms, each on its own, and sends each
new connection to the first ready backend in the list (so the client sits on
the replica being replaced until it turns unready). The client keeps calling `run_command`
until "done": every call must succeed, in the same session, on the same
default sandbox. Prints "SANDBOX <id>", "READY" once calling, one line per
check, then "N passed, M failed"; balancer events (a backend turning ready or
unready, where new connections go, a refused connection) on lines that start
with a timestamp.
"""

import asyncio
import json
import sys
import time
import urllib.request
from urllib.parse import urlparse

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_checks import Checks, structured
from tcp_splice import splice


def read_control(path):
    with open(path) as f:
        return json.load(f)


PROBE_INTERVAL = 0.1
PROBE_TIMEOUT = 2.0


def probe(base):
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=PROBE_TIMEOUT) as r:
            return r.status == 200
    except Exception:
        return False


def event(text):
    """A timestamped balancer event on stdout (the test shows it when the client fails)."""
    print(f"{time.monotonic():.3f} {text}", flush=True)


class Balancer:
    """New connections go to the first ready backend; open ones stay where they are.

    Each backend is probed on its own, so a slow `/readyz` of one (a busy
    machine) never holds back the news that another turned unready. A backend
    that refuses the connection fails the client's request: the replica being
    replaced must stay reachable until the balancer has seen it unready."""

    def __init__(self, control):
        self.control = control
        self.backends = []
        self.status = {}
        self.picked = []

    def ready(self):
        return [b for b in self.backends if self.status.get(b)]

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        asyncio.create_task(self.watch_backends())
        return self.server.sockets[0].getsockname()[1]

    async def watch_backends(self):
        while True:
            self.backends = read_control(self.control)["backends"]
            for backend in self.backends:
                if backend not in self.status:
                    self.status[backend] = False
                    asyncio.create_task(self.probe_loop(backend))
            await asyncio.sleep(PROBE_INTERVAL)

    async def probe_loop(self, backend):
        while True:
            ok = await asyncio.to_thread(probe, backend)
            if ok != self.status[backend]:
                event(f"{backend} {'ready' if ok else 'unready'}")
            self.status[backend] = ok
            await asyncio.sleep(PROBE_INTERVAL)

    async def handle(self, reader, writer):
        ready = self.ready()
        if not ready:
            event("no backend ready: connection closed")
            writer.close()
            return
        backend = ready[0]
        if not self.picked or self.picked[-1] != backend:
            self.picked.append(backend)
            event(f"new connections go to {backend}")
        url = urlparse(backend)
        try:
            up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port)
        except OSError as err:
            event(f"{backend} refused the connection: {err}")
            writer.close()
            return
        await splice(reader, writer, up_reader, up_writer)


async def main():
    control = sys.argv[1]
    balancer = Balancer(control)
    port = await balancer.start()
    while not balancer.ready():
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{port}/mcp"
    checks = Checks()
    calls, errors = 0, []
    async with streamable_http_client(url) as (read, write, get_session_id):
        async with ClientSession(read, write) as session:
            await session.initialize()
            session_id = get_session_id()
            sandbox = structured(await session.call_tool("create_sandbox", {}))["sandbox_id"]
            print(f"SANDBOX {sandbox}", flush=True)
            await session.call_tool("run_command", {"command": "echo rolled > /tmp/r"})
            print("READY", flush=True)
            started = time.monotonic()
            while not read_control(control).get("done") and time.monotonic() - started < 120:
                try:
                    result = await session.call_tool("run_command", {"command": "cat /tmp/r"})
                    out = structured(result) if not result.isError else {}
                    if result.isError or out.get("stdout", "").strip() != "rolled" or out.get("sandbox_id") != sandbox:
                        errors.append(f"call {calls}: {result.content}")
                except Exception as err:  # noqa: BLE001 - every failure the client sees counts
                    errors.append(f"call {calls}: {type(err).__name__}: {err}")
                calls += 1
                await asyncio.sleep(0.01)
            checks.check(f"{calls} calls through the rolling update, none failed", calls > 0 and not errors, errors[:5])
            checks.check("same session id throughout (no re-initialize)", get_session_id() == session_id)
            checks.check(
                "the client was moved off the replaced replica",
                len(balancer.picked) >= 2,
                balancer.picked,
            )
    # Leaving the context sent DELETE.
    print(f"BACKENDS {' '.join(balancer.picked)}", flush=True)
    return checks.summary()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
