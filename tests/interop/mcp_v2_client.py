"""Interop with the official MCP Python SDK v2 (mcp 2.x, `mcp.Client`), in
2026-07-28 mode or legacy (session) mode, against a running sandbox-mcp.

    python mcp_v2_client.py URL TOKEN MODE      (MODE: 2026-07-28 | legacy)

Runs create -> run -> task-augmented run_command (through a client
extension for io.modelcontextprotocol/tasks that polls tasks/get until the
task is terminal) -> tasks/cancel on a second task -> kill, and prints one
JSON line with what it saw. Exits non-zero on any unexpected answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, Literal

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Result
from mcp_types._types import Request, RequestParams

TASKS = "io.modelcontextprotocol/tasks"


class CreatedTask(Result):
    """The extension's CreateTaskResult (`resultType: "task"`)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskIdParams(RequestParams):
    task_id: str


class DetailedTask(Result):
    result_type: str | None = None
    task_id: str
    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class Ack(Result):
    result_type: str | None = None


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


async def get_task(session: Any, task_id: str) -> DetailedTask:
    return await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), DetailedTask)


async def wait_terminal(session: Any, task_id: str, timeout: float = 60.0) -> DetailedTask:
    deadline = time.monotonic() + timeout
    while True:
        task = await get_task(session, task_id)
        if task.status in ("completed", "failed", "cancelled"):
            return task
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} not terminal: {task}")
        await asyncio.sleep(0.2)


class Tasks(ClientExtension):
    """Declares the tasks extension; a task result is resolved by polling tasks/get."""

    identifier = TASKS

    def __init__(self) -> None:
        self.created: list[CreatedTask] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, created: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
        self.created.append(created)
        task = await wait_terminal(ctx.session, created.task_id)
        if task.status != "completed" or task.result is None:
            raise AssertionError(f"task ended {task.status}: {task}")
        return types.CallToolResult.model_validate(task.result)


def structured(result: types.CallToolResult) -> dict[str, Any]:
    if result.is_error:
        raise AssertionError(f"tool error: {result.content}")
    return result.structured_content or {}


async def main(url: str, token: str, mode: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"mode": mode}
    tasks = Tasks()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    extensions = [tasks] if mode != "legacy" else []
    async with Client(streamable_http_client(url, http_client=http), mode=mode, extensions=extensions) as client:
        tools = await client.list_tools()
        seen["tools"] = len(tools.tools)
        created = structured(await client.call_tool("create_sandbox", {}))
        sandbox_id = created["sandbox_id"]
        seen["owned"] = created["owned"]
        run = structured(await client.call_tool("run_command", {"sandbox_id": sandbox_id, "command": "echo hi"}))
        seen["run_stdout"] = run["stdout"]
        if mode == "legacy":
            # Legacy sessions: the sandbox task tools.
            started = structured(
                await client.call_tool("start_task", {"sandbox_id": sandbox_id, "command": "sleep 60"})
            )
            cancelled = structured(
                await client.call_tool("cancel_task", {"sandbox_id": sandbox_id, "task_id": started["task_id"]})
            )
            seen["cancelled_state"] = cancelled["state"]
        else:
            # Task-augmented run_command: resolved transparently by the extension through tasks/get.
            task_run = structured(
                await client.call_tool("run_command", {"sandbox_id": sandbox_id, "command": "echo task; exit 2"})
            )
            seen["task_stdout"] = task_run["stdout"]
            seen["task_exit_code"] = task_run["exit_code"]
            # A task-augmented start_task, kept unresolved (sent through the session, the result not claimed).
            long = await client.session.send_request(
                types.CallToolRequest(
                    params=types.CallToolRequestParams(
                        name="start_task", arguments={"sandbox_id": sandbox_id, "command": "sleep 60"}
                    )
                ),
                CreatedTask,
            )
            long_id = long.task_id
            ack = await client.session.send_request(CancelTask(params=TaskIdParams(task_id=long_id)), Ack)
            seen["cancel_ack"] = ack.result_type
            final = await wait_terminal(client.session, long_id, timeout=10)
            seen["cancelled_state"] = final.status
            seen["tasks_created"] = len(tasks.created)
        killed = structured(await client.call_tool("kill_sandbox", {"sandbox_id": sandbox_id}))
        seen["killed"] = killed["killed"]
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))), flush=True)
