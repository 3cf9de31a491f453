"""Drives envd with the official E2B Python SDK (debug mode: no control plane).

Usage: python sdk_probe.py <envd base url> <scratch dir>
Prints one line per passed step; exits non-zero at the first failure.
"""

import io
import sys
import time

from e2b import Sandbox
from e2b.exceptions import NotFoundException, TimeoutException
from e2b.sandbox.commands.command_handle import CommandExitException

url, scratch = sys.argv[1], sys.argv[2]
sbx = Sandbox.create(debug=True, sandbox_url=url, api_key="e2b_" + "0" * 40)
steps = 0


def step(name, ok, detail=""):
    global steps
    if not ok:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    steps += 1
    print(f"ok {name}", flush=True)


step("is_running", sbx.is_running())

r = sbx.commands.run("echo hi; echo err >&2")
step("run echo", (r.stdout, r.stderr, r.exit_code) == ("hi\n", "err\n", 0), repr(r))

try:
    sbx.commands.run("echo partial; exit 3")
    step("exit 3 raises", False, "no exception")
except CommandExitException as e:
    step("exit 3 raises", e.exit_code == 3 and e.stdout == "partial\n", repr(e))

r = sbx.commands.run('echo "$FOO"; pwd; id -u', envs={"FOO": "bar"}, cwd="/tmp", user="nobody")
step("envs cwd user", r.stdout == "bar\n/tmp\n65534\n", repr(r.stdout))

out = []
r = sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=out.append)
step("on_stdout callback", "".join(out) == "1\n2\n3\n", repr(out))

h = sbx.commands.run("sleep 30", background=True)
listed = [p.pid for p in sbx.commands.list()]
step("list background", h.pid in listed, repr(listed))
step("kill background", h.kill())
try:
    h.wait()
    step("killed wait raises", False, "no exception")
except CommandExitException as e:
    step("killed wait raises", e.exit_code == -1 and "killed" in (e.error or ""), repr(e))
step("kill unknown pid", sbx.commands.kill(999999) is False)

h = sbx.commands.run("cat", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "abc\n")
sbx.commands.close_stdin(h.pid)
r = h.wait()
step("stdin", r.stdout == "abc\n", repr(r.stdout))

h = sbx.commands.run("sleep 0.5; for i in 1 2 3; do echo $i; sleep 0.2; done", background=True)
h.disconnect()
h2 = sbx.commands.connect(h.pid)
r = h2.wait()
step("connect after disconnect", r.exit_code == 0 and r.stdout.endswith("3\n"), repr(r.stdout))

started = time.time()
try:
    sbx.commands.run("sleep 20", timeout=1)
    step("command timeout", False, "no exception")
except (TimeoutException, CommandExitException) as e:
    step("command timeout", time.time() - started < 10, repr(e))

big = bytes(range(256)) * (10 * 4096)  # 10 MiB
path = f"{scratch}/sdk/dir/hello.txt"
info = sbx.files.write(path, "hello")
step("write text", info.path == path, repr(info))
step("read text", sbx.files.read(path) == "hello")
sbx.files.write(f"{scratch}/sdk/bin", bytes(range(256)))
step("read bytes", bytes(sbx.files.read(f"{scratch}/sdk/bin", format="bytes")) == bytes(range(256)))
sbx.files.write(f"{scratch}/sdk/big", io.BytesIO(big))
step("10 MiB octet-stream", bytes(sbx.files.read(f"{scratch}/sdk/big", format="bytes")) == big)
sbx.files.write(f"{scratch}/sdk/big2", big)
step("10 MiB multipart", bytes(sbx.files.read(f"{scratch}/sdk/big2", format="bytes")) == big)
infos = sbx.files.write_files([{"path": f"{scratch}/sdk/m1", "data": "1"}, {"path": f"{scratch}/sdk/m2", "data": "2"}])
step("write_files", len(infos) == 2 and sbx.files.read(f"{scratch}/sdk/m2") == "2")

info = sbx.files.write(f"{scratch}/sdk/meta.txt", "m", metadata={"Owner": "alice"})
step("write metadata", info.metadata == {"owner": "alice"}, repr(info))
gi = sbx.files.get_info(f"{scratch}/sdk/meta.txt")
step("get_info metadata", gi.metadata == {"owner": "alice"}, repr(gi))
sbx.files.remove(f"{scratch}/sdk/meta.txt")

names = sorted(e.name for e in sbx.files.list(f"{scratch}/sdk"))
step("list", names == ["big", "big2", "bin", "dir", "m1", "m2"], repr(names))
step("exists", sbx.files.exists(path) and not sbx.files.exists(f"{scratch}/nope"))
gi = sbx.files.get_info(path)
step("get_info", gi.size == 5 and gi.type.value == "file", repr(gi))
step("make_dir new", sbx.files.make_dir(f"{scratch}/sdk/new/deep") is True)
step("make_dir existing", sbx.files.make_dir(f"{scratch}/sdk/new/deep") is False)
moved = sbx.files.rename(path, f"{scratch}/sdk/moved.txt")
step("rename", moved.path == f"{scratch}/sdk/moved.txt" and sbx.files.read(moved.path) == "hello")
sbx.files.remove(f"{scratch}/sdk/dir")
step("remove", not sbx.files.exists(f"{scratch}/sdk/dir"))
try:
    sbx.files.read(f"{scratch}/nope")
    step("read missing raises", False, "no exception")
except NotFoundException as e:
    step("read missing raises", True, repr(e))

print(f"SDK-PROBE OK {steps}", flush=True)
