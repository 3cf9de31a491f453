"""What the official MCP Python SDK v2 (`mcp.Client`, legacy mode) shows a user when
sandbox-mcp refuses a request at the HTTP level.

    python refusals_v2.py URL TOKEN CASE...   (CASE: 401 403 404 413 415 429)

Prints one JSON line mapping each case to the message of the error the client raised
(or "no error"). A case that hangs past 30 s fails the script.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def client(url: str, token: str, headers: dict[str, str] | None = None, hooks: Any = None) -> Client:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}", **(headers or {})},
        timeout=30,
        event_hooks={"request": hooks or []},
    )
    return Client(streamable_http_client(url, http_client=http), mode="legacy")


async def refused(url: str, token: str, case: str) -> str:
    try:
        if case == "401":
            async with client(url, "wrong-token-0123456789") as c:
                await c.list_tools()
        elif case in ("403", "404"):
            headers = {"Mcp-Session-Id": "no-such-session"} if case == "404" else {}
            async with client(url, token, headers) as c:
                await c.list_tools()
        elif case == "413":
            async with client(url, token) as c:
                await c.call_tool("run_command", {"sandbox_id": "x", "command": "echo " + "a" * 8192})
        elif case == "415":

            async def text_plain(request: httpx2.Request) -> None:
                if request.method == "POST":
                    request.headers["Content-Type"] = "text/plain"

            async with client(url, token, hooks=[text_plain]) as c:
                await c.list_tools()
        elif case == "429":
            async with client(url, token) as first:
                await first.list_tools()
                async with client(url, token) as second:
                    await second.list_tools()
        return "no error"
    except BaseException as err:  # noqa: BLE001 - what the user sees, whatever it is
        return describe(err)


def describe(err: BaseException) -> str:
    if isinstance(err, BaseExceptionGroup):
        return " | ".join(describe(e) for e in err.exceptions)
    return f"{type(err).__name__}: {err}"


async def main(url: str, token: str, cases: list[str]) -> dict[str, str]:
    return {case: await asyncio.wait_for(refused(url, token, case), 30) for case in cases}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))), flush=True)
