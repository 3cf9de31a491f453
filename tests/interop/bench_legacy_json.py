"""Client cost of legacy answers as application/json vs SSE, with the official
MCP Python SDK v2 in legacy (session) mode.

    python bench_legacy_json.py TOKEN CALLS ROUNDS URL_JSON URL_SSE

URL_JSON is a gateway with the JSON layer on, URL_SSE one with
`legacy_json_window_ms = 0`. Each round runs one session per gateway
(alternating which goes first) doing CALLS `run_command "true"` calls, and
records this process's CPU time per call (resource.getrusage) and each call's
latency. Prints one JSON line: per gateway, CPU ms per call of each round and
the median latency in ms over all calls.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import sys
import time

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def session(url: str, token: str, calls: int) -> tuple[float, list[float]]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        created = await client.call_tool("create_sandbox", {})
        sandbox_id = created.structured_content["sandbox_id"]
        args = {"sandbox_id": sandbox_id, "command": "true"}
        await client.call_tool("run_command", args)  # warm-up
        latencies = []
        start = cpu()
        for _ in range(calls):
            t0 = time.perf_counter()
            result = await client.call_tool("run_command", args)
            latencies.append((time.perf_counter() - t0) * 1000)
            if result.structured_content["exit_code"] != 0:
                raise AssertionError(f"run_command failed: {result}")
        spent = cpu() - start
        await client.call_tool("kill_sandbox", {"sandbox_id": sandbox_id})
    return spent * 1000 / calls, latencies


async def main() -> None:
    token, calls, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    urls = {"json": sys.argv[4], "sse": sys.argv[5]}
    cpu_ms = {name: [] for name in urls}
    latencies = {name: [] for name in urls}
    for r in range(rounds):
        order = ["json", "sse"] if r % 2 == 0 else ["sse", "json"]
        for name in order:
            per_call, lat = await session(urls[name], token, calls)
            cpu_ms[name].append(round(per_call, 3))
            latencies[name].extend(lat)
    summary = {
        name: {
            "cpu_ms_per_call": cpu_ms[name],
            "cpu_ms_median": round(statistics.median(cpu_ms[name]), 3),
            "latency_ms_median": round(statistics.median(latencies[name]), 3),
        }
        for name in urls
    }
    print(json.dumps(summary))


asyncio.run(main())
