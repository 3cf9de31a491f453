"""The worst-case results through the official MCP Python SDK v2 (`mcp.Client`), whose transport
refuses a message over 1 MiB, in legacy or 2026-07-28 mode:

    python large_results_v2.py URL TOKEN MODE      (MODE: 2026-07-28 | legacy)

run_command writing 64 KiB of \\x01 to stdout and to stderr (13 bytes each as sent: the gateway cuts
with the truncation flags); in 2026-07-28 mode also as an MCP task (resolved through tasks/get); a
task log of the same bytes read with get_task at the largest limit, paged to its end; and a 5 MiB
file of escape-heavy text read with read_file(length=5 MiB) page after page, checked against its
SHA-256; and list_files of a directory whose listing is over 1 MiB as sent. Prints one JSON line
with what it saw.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_v2_client import Tasks, structured

FIVE_MIB = 5 * 1024 * 1024
CONTROL = "head -c 65536 /dev/zero | tr '\\0' '\\1'"


async def main(url: str, token: str, mode: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"mode": mode}
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        sandbox_id = structured(await client.call_tool("create_sandbox", {}))["sandbox_id"]
        call = lambda tool, args: client.call_tool(tool, {"sandbox_id": sandbox_id, **args})  # noqa: E731

        run = structured(await call("run_command", {"command": f"{CONTROL}; {CONTROL} >&2"}))
        seen["run"] = summary(run)

        task = structured(await call("start_task", {"command": f"{CONTROL}; {CONTROL} >&2"}))
        deadline = time.monotonic() + 60
        while True:
            page = structured(await call("get_task", {"task_id": task["task_id"], "limit": 65536}))
            if page["state"] != "running" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        stdout, offset, pages = page["stdout"], page["stdout_next_offset"], 1
        while offset < page["stdout_size"] and pages < 20:
            more = structured(
                await call("get_task", {"task_id": task["task_id"], "limit": 65536, "stdout_offset": offset})
            )
            stdout, offset, pages = stdout + more["stdout"], more["stdout_next_offset"], pages + 1
        seen["task_log"] = {"state": page["state"], "pages": pages, "stdout_ok": stdout == "\x01" * 65536}

        # 5 MiB of text, a third of it control bytes, quotes and backslashes.
        make = r"""yes "$(printf 'ab"\\cd\001\002')" | head -c """ + f"{FIVE_MIB} > big.txt; sha256sum big.txt"
        made = structured(await call("run_command", {"command": make}))
        expected = made["stdout"].split()[0]
        data, offset, pages, biggest = b"", 0, 0, 0
        while pages < 200:
            part = structured(await call("read_file", {"path": "big.txt", "offset": offset, "length": FIVE_MIB}))
            data += part["content"].encode()
            biggest = max(biggest, part["length"])
            pages += 1
            if not part["truncated"]:
                break
            offset = part["next_offset"]
        seen["read_file"] = {
            "pages": pages,
            "size": len(data),
            "sha_ok": hashlib.sha256(data).hexdigest() == expected,
            "biggest_page": biggest,
        }
        # 3000 entries of 200-character names: over 1 MiB as sent, the listing is cut to fit.
        wide = "mkdir -p /home/user/wide && cd /home/user/wide && for i in $(seq 3000); do : > $(printf '%0200d' $i); done"
        await call("run_command", {"command": wide})
        listed = structured(await call("list_files", {"path": "/home/user/wide"}))
        seen["list_files"] = {"entries": len(listed["entries"]), "truncated": listed["truncated"]}
        await call("kill_sandbox", {})

    if mode != "legacy":
        # The same command as an MCP task: its completed result is bounded too.
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        tasks = Tasks()
        async with Client(streamable_http_client(url, http_client=http), mode=mode, extensions=[tasks]) as client:
            sandbox_id = structured(await client.call_tool("create_sandbox", {}))["sandbox_id"]
            args = {"sandbox_id": sandbox_id, "command": f"{CONTROL}; {CONTROL} >&2"}
            seen["task_run"] = summary(structured(await client.call_tool("run_command", args)))
            seen["tasks_created"] = len(tasks.created)
            await client.call_tool("kill_sandbox", {"sandbox_id": sandbox_id})
    return seen


def summary(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "stdout_len": len(run["stdout"]),
        "stderr_len": len(run["stderr"]),
        "only_control": set(run["stdout"] + run["stderr"]) <= {"\x01"},
        "stdout_truncated": run["stdout_truncated"],
        "stderr_truncated": run["stderr_truncated"],
        "stdout_bytes": run["stdout_bytes"],
        "stderr_bytes": run["stderr_bytes"],
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))), flush=True)
