#!/usr/bin/env python3
"""A peer MCP server for the side-by-side benchmark: a stand-in, never a test dependency.

What a Python developer would write to give an agent sandboxed commands: the official
MCP Python SDK (mcp 1.30, FastMCP, streamable HTTP, stateful sessions) with one tool,
`run_command(sandbox_id, command)`, that runs the command with the official E2B SDK
(e2b 2.63: `AsyncSandbox.connect` once per sandbox, cached, then `commands.run`, which
is `bash -l -c COMMAND` as user `user`, like sandbox-mcp's `run_command`) and answers
its exit code, stdout and stderr as text.

Usage (`examples/bench_gateway.rs` starts it; see docs/benchmarks.md):

    E2B_API_KEY=... python3 peer_server.py --provider-url http://127.0.0.1:PORT [--port 0]

The provider's control plane and envd share one origin (like sandbox-mcp's local
provider), so the E2B SDK is pointed at it through `api_url` and `sandbox_url`, as
tests/interop/e2b_sdk_compat.py does with E2B_API_URL and E2B_SANDBOX_URL. It listens
on 127.0.0.1 (port 0: a free one) and prints `peer listening on http://ADDR/mcp` once
it accepts connections. Needs a python with mcp==1.30.0 and e2b==2.63.0, such as the
.venv-test that scripts/test.sh makes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

try:
    import uvicorn
    from e2b import AsyncSandbox, CommandExitException
    from mcp.server.fastmcp import FastMCP
except ImportError as err:
    sys.exit(f"peer_server.py needs mcp==1.30.0 and e2b==2.63.0 in {sys.executable}: {err}")

log = logging.getLogger("peer")


class Sandboxes:
    """Connected sandboxes by id: one `AsyncSandbox.connect` per sandbox, then reused."""

    def __init__(self, provider_url: str, api_key: str) -> None:
        self._params = {"api_url": provider_url, "sandbox_url": provider_url, "api_key": api_key}
        self._connected: dict[str, AsyncSandbox] = {}
        self._lock = asyncio.Lock()

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        sandbox = self._connected.get(sandbox_id)
        if sandbox is not None:
            return sandbox
        async with self._lock:
            sandbox = self._connected.get(sandbox_id)
            if sandbox is None:
                sandbox = await AsyncSandbox.connect(sandbox_id, **self._params)
                self._connected[sandbox_id] = sandbox
            return sandbox


def build_server(sandboxes: Sandboxes) -> FastMCP:
    # Logs at WARNING, like the gateway under the bench (`warn`): no line per request.
    mcp = FastMCP("peer-sandbox", log_level="WARNING")

    @mcp.tool()
    async def run_command(sandbox_id: str, command: str) -> str:
        """Run a shell command in a sandbox (bash -l -c, as user 'user') and wait for it.

        Returns the exit code, stdout and stderr as text; a non-zero exit code is a normal result.
        """
        sandbox = await sandboxes.get(sandbox_id)
        try:
            result = await sandbox.commands.run(command, user="user")
        except CommandExitException as exited:
            result = exited
        return f"exit_code: {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"

    return mcp


async def serve(mcp: FastMCP, port: int) -> None:
    # The socket is bound here so that port 0 gives a free port with no race, and the line below
    # tells the bench where to connect.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    host, bound = sock.getsockname()
    server = uvicorn.Server(uvicorn.Config(mcp.streamable_http_app(), log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving  # raises what stopped it
            return
        await asyncio.sleep(0.01)
    print(f"peer listening on http://{host}:{bound}/mcp", flush=True)
    await serving


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider-url", default=os.environ.get("PROVIDER_URL"), help="the provider's origin")
    parser.add_argument("--port", type=int, default=0, help="loopback port (0: a free one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.provider_url:
        parser.error("--provider-url (or PROVIDER_URL) is required")
    api_key = os.environ.get("E2B_API_KEY")
    if not api_key:
        parser.error("E2B_API_KEY must be set (the provider's API key)")
    sandboxes = Sandboxes(args.provider_url.rstrip("/"), api_key)
    try:
        asyncio.run(serve(build_server(sandboxes), args.port))
    except KeyboardInterrupt:
        pass
    except OSError as err:
        log.error("cannot listen on 127.0.0.1:%d: %s", args.port, err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
