"""A full MCP session over HTTPS through the TLS reverse proxy, with the official
Python `mcp` client. Run by tests/deploy/tls_proxy_test.sh, which starts the
gateway and nginx and passes, by environment:

  SANDBOX_MCP_TEST_TOKEN           bearer token (the gateway knows its SHA-256)
  SANDBOX_MCP_TEST_CA              PEM of the CA that signed the proxy's certificate
  SANDBOX_MCP_TEST_ALLOWED_ORIGIN  the one Origin the gateway allows (the public one)
  SANDBOX_MCP_TEST_ACCESS_LOG      nginx's access log
  SANDBOX_MCP_TEST_LOGS            ':'-separated logs that must not contain the token
  SANDBOX_MCP_TEST_BIN             the sandbox-mcp binary (for `healthcheck`)
  SANDBOX_MCP_TEST_GATEWAY_PORT    the gateway's loopback port (for `healthcheck`)

Usage: mcp_over_tls.py https://localhost:PORT/mcp
Prints one line per check and "N passed, M failed"; exits 1 on any failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mcp.client.streamable_http as mcp_http

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "interop"))
from mcp_checks import PRODUCT_TOOLS, Checks, enter_legacy_session, follow_task, tool_payload  # noqa: E402

# mcp >= 2 uses the `httpx2` package, mcp 1.x `httpx`: use whichever the transport uses.
httpx = getattr(mcp_http, "httpx2", None) or getattr(mcp_http, "httpx")

PROTOCOL_VERSION = "2025-06-18"


def sse_messages(body: str) -> list[dict[str, Any]]:
    """JSON-RPC messages in an SSE body (or a plain JSON body)."""
    body = body.strip()
    if body.startswith("{"):
        return [json.loads(body)]
    messages = []
    for event in body.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
        if data.strip():
            with contextlib.suppress(ValueError):
                messages.append(json.loads(data))
    return messages


class RawClient:
    """Plain HTTP requests through the proxy, for what the SDK hides (headers, statuses, timing)."""

    def __init__(self, url: str, token: str, ca: str) -> None:
        self.url = url
        self.token = token
        self.client = httpx.AsyncClient(verify=ssl.create_default_context(cafile=ca), timeout=60.0)
        self.session_id: str | None = None
        self.protocol_version = PROTOCOL_VERSION

    def headers(self, extra: dict[str, str] | None = None, auth: bool = True) -> dict[str, str]:
        h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if auth:
            h["Authorization"] = f"Bearer {self.token}"
        if self.session_id:
            h["Mcp-Session-Id"] = self.session_id
            h["MCP-Protocol-Version"] = self.protocol_version
        h.update(extra or {})
        return h

    @staticmethod
    def initialize_body() -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "deploy-raw-check", "version": "0"},
            },
        }

    async def post(self, body: dict[str, Any], **kw: Any) -> Any:
        return await self.client.post(self.url, json=body, **kw)

    async def close(self) -> None:
        await self.client.aclose()


async def timed_sse_call(raw: RawClient, body: dict[str, Any]) -> tuple[int, list[float], list[dict[str, Any]]]:
    """POSTs a request and records when each SSE event arrives (seconds since the request)."""
    start = time.monotonic()
    event_times: list[float] = []
    text = ""
    async with raw.client.stream("POST", raw.url, json=body, headers=raw.headers()) as response:
        pending = ""
        async for chunk in response.aiter_text():
            text += chunk
            pending += chunk.replace("\r\n", "\n")
            while "\n\n" in pending:
                event, pending = pending.split("\n\n", 1)
                if event.strip():
                    event_times.append(time.monotonic() - start)
        status = response.status_code
    return status, event_times, sse_messages(text)


async def run(url: str, checks: Checks) -> None:
    token = os.environ["SANDBOX_MCP_TEST_TOKEN"]
    ca = os.environ["SANDBOX_MCP_TEST_CA"]
    allowed_origin = os.environ["SANDBOX_MCP_TEST_ALLOWED_ORIGIN"]
    tls = ssl.create_default_context(cafile=ca)
    raw = RawClient(url, token, ca)

    # --- TLS, auth and Host/Origin handling through the proxy.
    try:
        async with httpx.AsyncClient(timeout=10.0) as untrusting:  # the default trust store only
            await untrusting.get(url.replace("/mcp", "/healthz"))
        checks.check("the proxy's certificate is not trusted without the test CA", False, "handshake succeeded")
    except Exception as err:  # noqa: BLE001 - a certificate failure is the expected outcome
        checks.check(
            "the proxy's certificate is not trusted without the test CA", "certificate" in str(err).lower(), repr(err)
        )

    r = await raw.client.get(url.replace("/mcp", "/healthz"))
    checks.check("GET /healthz through the proxy is 200", r.status_code == 200, r.status_code)

    r = await raw.post(raw.initialize_body(), headers=raw.headers(auth=False))
    checks.check("initialize without a bearer token is 401", r.status_code == 401, r.status_code)
    checks.check(
        "401 carries WWW-Authenticate through the proxy",
        r.headers.get("www-authenticate", "").lower().startswith("bearer"),
        dict(r.headers),
    )
    r = await raw.post(raw.initialize_body(), headers=raw.headers({"Authorization": "Bearer wrong-token"}))
    checks.check("initialize with a wrong bearer token is 401", r.status_code == 401, r.status_code)

    # nginx forwards the client's Host: the gateway's allow-list must still see (and refuse) it.
    r = await raw.post(raw.initialize_body(), headers=raw.headers({"Host": "evil.example"}))
    checks.check(
        "a foreign Host header is refused (403/421) behind the proxy", r.status_code in (403, 421), r.status_code
    )
    r = await raw.post(raw.initialize_body(), headers=raw.headers({"Origin": "https://evil.example"}))
    checks.check("a foreign Origin is refused (403) behind the proxy", r.status_code == 403, r.status_code)

    # --- the session, with the official client.
    exchanges: list[tuple[str, int, str | None]] = []

    async def record(response: Any) -> None:
        exchanges.append((response.request.method, response.status_code, response.headers.get("mcp-session-id")))

    sdk_client = httpx.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        verify=tls,
        timeout=httpx.Timeout(30.0, read=300.0),
        event_hooks={"response": [record]},
    )
    session_a: str | None = None
    s1 = s2 = None
    async with sdk_client:
        async with contextlib.AsyncExitStack() as stack:
            session = await enter_legacy_session(stack, url, sdk_client)
            init = await session.initialize()
            server_name = init.model_dump(by_alias=True).get("serverInfo", {}).get("name")
            checks.check("initialize over HTTPS through nginx", bool(server_name), init)
            session_a = next((sid for _, _, sid in exchanges if sid), None)
            checks.check("the server issued an Mcp-Session-Id through the proxy", bool(session_a), exchanges)

            tools = {t.name for t in (await session.list_tools()).tools}
            checks.check("tools/list has the product's tools", PRODUCT_TOOLS <= tools, sorted(PRODUCT_TOOLS - tools))

            is_err, sc = tool_payload(await session.call_tool("create_sandbox", {"timeout": 300}))
            s1 = sc.get("sandbox_id")
            if not checks.check("create_sandbox", not is_err and bool(s1), sc):
                raise RuntimeError("no sandbox: the rest of the session cannot run")

            is_err, sc = tool_payload(
                await session.call_tool("run_command", {"command": "echo hello-through-tls", "sandbox_id": s1})
            )
            checks.check(
                "run_command output comes back through the proxy",
                not is_err and sc.get("exit_code") == 0 and "hello-through-tls" in str(sc.get("stdout")),
                sc,
            )

            is_err, sc = tool_payload(
                await session.call_tool("start_task", {"command": "sleep 3; echo done", "sandbox_id": s1})
            )
            task1 = sc.get("task_id")
            if not checks.check(
                "start_task", not is_err and bool(task1) and sc.get("state") in ("running", "succeeded"), sc
            ):
                raise RuntimeError("no task: the rest of the session cannot run")

            # get_task wait_seconds returns on new output or a state change: the first long call
            # returns at ~3 s (the echo and the exit come together); read on until the end.
            started = time.monotonic()
            is_err, sc = tool_payload(
                await session.call_tool("get_task", {"sandbox_id": s1, "task_id": task1, "wait_seconds": 10})
            )
            waited = time.monotonic() - started
            checks.check(
                "a long get_task (wait_seconds=10) is held through the proxy until the task acts (~3 s)",
                not is_err and sc.get("state") in ("running", "succeeded") and 1.5 <= waited <= 9.5,
                {"waited_s": round(waited, 2), "result": sc},
            )
            is_err, sc, stdout = await follow_task(session, s1, task1, (is_err, sc), wait_seconds=10, max_calls=5)
            total = time.monotonic() - started
            checks.check(
                "the task ends succeeded with output 'done' within ~3 s of waiting",
                not is_err and sc.get("state") == "succeeded" and stdout.strip() == "done" and total <= 9.5,
                {"total_s": round(total, 2), "stdout": stdout, "last": sc},
            )

            # --- a second session (raw HTTP): Origin allowed, SSE unbuffered, cross-session task access, DELETE.
            r = await raw.post(raw.initialize_body(), headers=raw.headers({"Origin": allowed_origin}))
            raw.session_id = r.headers.get("mcp-session-id")
            negotiated = next((m.get("result", {}).get("protocolVersion") for m in sse_messages(r.text)), None)
            if negotiated:
                raw.protocol_version = negotiated
            checks.check(
                "initialize with the allowed public Origin succeeds through the proxy",
                r.status_code == 200 and bool(raw.session_id),
                (r.status_code, r.text[:300]),
            )
            r = await raw.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=raw.headers())
            checks.check("notifications/initialized is accepted (202)", r.status_code == 202, r.status_code)

            is_err, sc = tool_payload(
                await session.call_tool("start_task", {"command": "sleep 3; echo second", "sandbox_id": s1})
            )
            task2 = sc.get("task_id")
            if not checks.check("start_task (second task)", not is_err and bool(task2), sc):
                raise RuntimeError("no second task: the rest of the session cannot run")
            status, times, messages = await timed_sse_call(
                raw,
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {
                        "name": "get_task",
                        "arguments": {"sandbox_id": s1, "task_id": task2, "wait_seconds": 10},
                    },
                },
            )
            result = next((m.get("result") for m in messages if m.get("id") == 2), None) or {}
            is_err, sc = tool_payload(result)
            checks.check(
                "another session reads the task by (sandbox_id, task_id) with a long wait",
                status == 200 and not is_err and sc.get("state") in ("running", "succeeded") and sc.get("task_id") == task2,
                (status, result),
            )
            checks.check(
                "SSE is unbuffered: an event reaches the client well before the ~3 s result",
                len(times) >= 2 and times[0] < 1.5 and times[-1] >= 2.0,
                {"event_times_s": [round(t, 2) for t in times]},
            )

            r = await raw.client.delete(url, headers=raw.headers())
            checks.check("DELETE of the raw session is accepted", r.status_code in (200, 202, 204), r.status_code)
            r = await raw.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, headers=raw.headers())
            checks.check("the deleted raw session is gone (404)", r.status_code == 404, r.status_code)

            is_err, sc = tool_payload(await session.call_tool("create_sandbox", {"timeout": 300}))
            s2 = sc.get("sandbox_id")
            if not checks.check("create_sandbox (an owned sandbox the session's end must kill)", not is_err and bool(s2), sc):
                raise RuntimeError("no second sandbox: the rest of the session cannot run")
            is_err, sc = tool_payload(await session.call_tool("list_sandboxes", {}))
            listing = json.dumps(sc)
            checks.check("list_sandboxes shows both sandboxes", not is_err and s1 in listing and s2 in listing, sc)

            is_err, sc = tool_payload(await session.call_tool("kill_sandbox", {"sandbox_id": s1}))
            checks.check("kill_sandbox", not is_err, sc)
        # Leaving the context ends the session: the client sends DELETE.

    deletes = [status for method, status, _ in exchanges if method == "DELETE"]
    checks.check("the client's session DELETE went through the proxy", deletes[-1:] in ([200], [202], [204]), exchanges)
    raw.session_id = session_a
    r = await raw.post({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, headers=raw.headers())
    checks.check("the deleted session is gone (404)", r.status_code == 404, r.status_code)

    # --- a fresh session: the ended session's owned, unretained sandbox was killed.
    async with httpx.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, verify=tls, timeout=httpx.Timeout(30.0, read=300.0)
    ) as client_b:
        async with contextlib.AsyncExitStack() as stack:
            session = await enter_legacy_session(stack, url, client_b)
            await session.initialize()
            deadline = time.monotonic() + 20
            while True:
                is_err, sc = tool_payload(await session.call_tool("list_sandboxes", {}))
                listing = json.dumps(sc)
                gone = not is_err and s1 not in listing and s2 not in listing
                if gone or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            checks.check("after DELETE, the session's sandboxes are gone (owned one killed at session end)", gone, sc)

    # --- logs and the container health check.
    access_log = os.environ.get("SANDBOX_MCP_TEST_ACCESS_LOG")
    if access_log:
        with open(access_log, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        checks.check(
            "nginx's access log shows the session DELETE",
            any('"DELETE /mcp HTTP/1.1" 20' in line for line in lines),
            lines[-5:],
        )
    leaked = []
    for path in filter(None, os.environ.get("SANDBOX_MCP_TEST_LOGS", "").split(":")):
        with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8", errors="replace") as f:
            if token in f.read():
                leaked.append(path)
    checks.check("the bearer token appears in no proxy or gateway log", not leaked, leaked)

    binary = os.environ.get("SANDBOX_MCP_TEST_BIN")
    port = os.environ.get("SANDBOX_MCP_TEST_GATEWAY_PORT")
    if binary and port:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_MCP_")}
        ok = subprocess.run(
            [binary, "healthcheck"],
            env={**env, "SANDBOX_MCP_HEALTHCHECK_URL": f"http://127.0.0.1:{port}/healthz"},
            capture_output=True,
            timeout=20,
        )
        checks.check("`sandbox-mcp healthcheck` (the image's HEALTHCHECK) exits 0 against the gateway", ok.returncode == 0,
                     (ok.returncode, ok.stderr[-300:]))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead_port = s.getsockname()[1]
        bad = subprocess.run(
            [binary, "healthcheck"],
            env={**env, "SANDBOX_MCP_HEALTHCHECK_URL": f"http://127.0.0.1:{dead_port}/healthz"},
            capture_output=True,
            timeout=20,
        )
        checks.check("`sandbox-mcp healthcheck` fails when nothing listens", bad.returncode != 0, bad.returncode)

    await raw.close()


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    checks = Checks()
    try:
        asyncio.run(asyncio.wait_for(run(sys.argv[1], checks), timeout=240))
    except Exception as err:  # noqa: BLE001 - report any crash as a failure with its cause
        import traceback

        traceback.print_exc()
        checks.check("the session ran to its end", False, repr(err))
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
