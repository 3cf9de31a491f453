"""What the Python MCP test scripts share: a tally of checks printed one line
each, the structured result of a tool call across `mcp` SDK versions, and the
names of the product's tools.

Used by the scripts in tests/interop/, tests/deploy/mcp_over_tls.py and
deploy/image-test/mcp_session.py (those two put this folder on sys.path).
It imports only the standard library at load time (the `mcp` SDK where a helper needs it),
so any of their virtual environments can import it.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

# Every tool the gateway lists, in both protocol generations.
PRODUCT_TOOLS = frozenset(
    {
        "create_sandbox",
        "connect_sandbox",
        "kill_sandbox",
        "list_sandboxes",
        "snapshot_sandbox",
        "fork_sandbox",
        "list_snapshots",
        "delete_snapshot",
        "list_templates",
        "run_command",
        "read_file",
        "write_file",
        "list_files",
        "start_task",
        "get_task",
        "cancel_task",
        "list_tasks",
    }
)


class Checks:
    """Counts checks; prints `ok   NAME` or `FAIL NAME: DETAIL` for each one at once."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        if ok:
            self.passed += 1
            print(f"ok   {name}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}", flush=True)
        return ok

    def summary(self) -> int:
        """Prints `N passed, M failed`; the exit status: 0 only if something passed and nothing failed."""
        print(f"{self.passed} passed, {self.failed} failed", flush=True)
        return 0 if self.failed == 0 and self.passed > 0 else 1


def tool_payload(result: Any) -> tuple[bool, dict[str, Any]]:
    """(is_error, structured content) of a CallToolResult, an SDK object or a wire dict, across mcp versions.

    Falls back to the JSON of the first text block; anything else comes back as {"raw": <the result>}.
    """
    data = result if isinstance(result, dict) else result.model_dump(by_alias=True, exclude_none=True)
    structured = data.get("structuredContent")
    if structured is None:
        for item in data.get("content", []):
            if item.get("type") == "text":
                with contextlib.suppress(ValueError):
                    structured = json.loads(item["text"])
                    break
    return bool(data.get("isError")), structured if isinstance(structured, dict) else {"raw": data}


def structured(result: Any) -> dict[str, Any]:
    """The structured content of a tool call result (see tool_payload)."""
    return tool_payload(result)[1]


def text_of(result: Any) -> str:
    """The text blocks of a tool call result, joined by spaces."""
    return " ".join(b.text for b in result.content if getattr(b, "type", None) == "text")


async def follow_task(
    session: Any,
    sandbox_id: str,
    task_id: str,
    first: tuple[bool, dict[str, Any]] | None = None,
    *,
    wait_seconds: int = 5,
    max_calls: int = 20,
) -> tuple[bool, dict[str, Any], str]:
    """Pages a task's output with get_task (wait_seconds, stdout/stderr offsets) until it is no longer running.

    `first` is a get_task payload already read (its stdout counts). Returns (is_error, last view, all stdout).
    """
    is_err, view = first if first is not None else (False, {"state": "running"})
    stdout = str(view.get("stdout", ""))
    for _ in range(max_calls):
        if is_err or view.get("state") != "running":
            break
        is_err, view = tool_payload(
            await session.call_tool(
                "get_task",
                {
                    "sandbox_id": sandbox_id,
                    "task_id": task_id,
                    "wait_seconds": wait_seconds,
                    "stdout_offset": view.get("stdout_next_offset", 0),
                    "stderr_offset": view.get("stderr_next_offset", 0),
                },
            )
        )
        stdout += str(view.get("stdout", ""))
    return is_err, view, stdout


async def enter_legacy_session(stack: contextlib.AsyncExitStack, url: str, http_client: Any) -> Any:
    """A legacy (session) MCP `ClientSession` over streamable HTTP through `http_client`, entered on `stack`.

    Works with mcp 1.x (`streamablehttp_client`) and later (`streamable_http_client`).
    """
    import mcp.client.streamable_http as mcp_http
    from mcp import ClientSession

    if hasattr(mcp_http, "streamable_http_client"):
        streams = await stack.enter_async_context(mcp_http.streamable_http_client(url, http_client=http_client))
    else:  # mcp 1.x before streamable_http_client
        streams = await stack.enter_async_context(
            mcp_http.streamablehttp_client(url, httpx_client_factory=lambda **_: http_client)
        )
    return await stack.enter_async_context(ClientSession(streams[0], streams[1]))
