"""Drives the local provider (control plane + envd data plane on one port) with the
official E2B Python SDK. Usage: python sdk_probe.py <provider base url> <api key>
Prints one line per passed step; exits non-zero at the first failure."""

import os
import sys

url, key = sys.argv[1], sys.argv[2]
os.environ["E2B_API_URL"] = url
os.environ["E2B_SANDBOX_URL"] = url
os.environ["E2B_API_KEY"] = key

from e2b import Sandbox, SandboxQuery  # noqa: E402
from e2b.exceptions import SandboxException  # noqa: E402

steps = 0


def step(name, ok, detail=""):
    global steps
    if not ok:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    steps += 1
    print(f"ok {name}", flush=True)


tag = f"a b/{os.getpid()}"
sbx = Sandbox.create(timeout=120, metadata={"probe": tag}, envs={"GREETING": "hello"})
step("create", len(sbx.sandbox_id) == 20, sbx.sandbox_id)
step("is_running", sbx.is_running())
r = sbx.commands.run("echo $GREETING; hostname; id -un")
step("run", r.stdout.split() == ["hello", sbx.sandbox_id, "user"], repr(r))
r = sbx.commands.run("id -u", user="root")
step("run as root", r.stdout.strip() == "0", repr(r))
sbx.files.write("/home/user/f.txt", "content")
step("files", sbx.files.read("/home/user/f.txt") == "content")
info = sbx.get_info()
step("get_info", info.metadata.get("probe") == tag and info.state.value == "running", repr(info))
sbx.set_timeout(300)
step("set_timeout", sbx.get_info().end_at > info.end_at)
paginator = Sandbox.list(query=SandboxQuery(metadata={"probe": tag}))
found = [s.sandbox_id for s in paginator.next_items()]
step("list by metadata", found == [sbx.sandbox_id], repr(found))
step("pause", sbx.pause() is not False)
step("paused state", Sandbox.get_info(sbx.sandbox_id).state.value == "paused")
sbx2 = Sandbox.connect(sbx.sandbox_id)
step("connect resumes", sbx2.commands.run("cat /home/user/f.txt").stdout == "content")
step("kill", sbx2.kill() is True)
step("is_running after kill", not sbx2.is_running())
try:
    Sandbox.connect(sbx.sandbox_id)
    step("connect to killed raises", False, "no exception")
except SandboxException as e:
    step("connect to killed raises", True, repr(e))
print(f"all {steps} steps passed", flush=True)
