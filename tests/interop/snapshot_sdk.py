"""The official E2B Python SDK's snapshot, fork and lifecycle calls against the local provider.

    python snapshot_sdk.py

Environment: PROVIDER_URL, E2B_API_KEY. Every check prints a line; the last line is
`RESULT {json}` (figures and ids) and the exit status is non-zero on the first failed check.
Covers: a full (memory) snapshot refused with a message naming mode="filesystem"; a filesystem
snapshot, a sandbox from it, writes independent both ways, list (by source, by name), a named
snapshot, delete and a create from the deleted one; a fork of 3 (each its own files, the parent's
id and deadline unchanged, the fork's metadata); lifecycle on_timeout "pause" then connect with a
file and a process intact; auto_resume; the source's kill leaving its snapshot usable.
"""

import json
import os
import sys
import time

os.environ["E2B_API_URL"] = os.environ["PROVIDER_URL"]
os.environ["E2B_SANDBOX_URL"] = os.environ["PROVIDER_URL"]
os.environ.pop("E2B_DOMAIN", None)
os.environ.pop("E2B_DEBUG", None)

from e2b import Sandbox  # noqa: E402
from e2b.exceptions import SandboxException  # noqa: E402

result = {}
created = []


def check(condition, message):
    if not condition:
        raise AssertionError(message)
    print("ok:", message)


def new(*args, **kwargs):
    sandbox = Sandbox.create(*args, **kwargs)
    created.append(sandbox.sandbox_id)
    return sandbox


def main():
    source = new(timeout=300)
    source.files.write("/home/user/notes.txt", "from the source\n")
    source.commands.run("mkdir -p /opt/app && echo built > /opt/app/state", user="root")
    source.commands.run("echo usr-write > /usr/local/share/snapshot-marker", user="root")
    source.commands.run("sleep 900", background=True)
    alive = "pgrep -x sleep >/dev/null && echo alive || echo gone"

    # The SDK's default, a memory snapshot: refused, naming the mode that works.
    try:
        source.create_snapshot()
        check(False, "a full snapshot was refused")
    except SandboxException as err:
        check('mode="filesystem"' in str(err) and "400" in str(err), f"full snapshot refused clearly: {err}")

    started = time.monotonic()
    snap = source.create_snapshot(mode="filesystem")
    result["snapshot_s"] = round(time.monotonic() - started, 3)
    check(snap.snapshot_id.endswith(":default") and snap.names == [snap.snapshot_id], f"snapshot info {snap}")
    check(source.commands.run(alive).stdout == "alive\n", "the source's process runs on after its snapshot")

    child = new(snap.snapshot_id, timeout=120)
    check(child.commands.run(alive).stdout == "gone\n", "a snapshot carries no process")
    check(child.files.read("/home/user/notes.txt") == "from the source\n", "the child has the source's home file")
    check(child.commands.run("cat /opt/app/state").stdout == "built\n", "the child has the source's root file")
    check(
        child.commands.run("cat /usr/local/share/snapshot-marker").stdout == "usr-write\n",
        "the child has what the source wrote below /usr",
    )
    check(child.commands.run("id -un").stdout.strip() == "user", "the child's commands run as user")
    child.files.write("/home/user/notes.txt", "child wrote\n")
    source.files.write("/home/user/after.txt", "later\n")
    check(source.files.read("/home/user/notes.txt") == "from the source\n", "the child's write stays in the child")
    check(not child.files.exists("/home/user/after.txt"), "the source's later write stays in the source")

    listed = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()]
    check(listed == [snap.snapshot_id], f"list by source sandbox: {listed}")
    named = source.create_snapshot(name="py-named-snap", mode="filesystem")
    check(named.snapshot_id == "py-named-snap:default", f"a named snapshot's id: {named.snapshot_id}")
    by_name = [s.snapshot_id for s in Sandbox.list_snapshots(name="py-named-snap").next_items()]
    check(by_name == [named.snapshot_id], f"list by name: {by_name}")
    again = source.create_snapshot(name="py-named-snap", mode="filesystem")
    check(again.snapshot_id == named.snapshot_id, "the same name again replaces that snapshot")

    # Fork: three sandboxes from one snapshot; the parent keeps its id and deadline.
    before = source.get_info()
    started = time.monotonic()
    forks = source.fork(count=3, timeout=120)
    result["fork3_s"] = round(time.monotonic() - started, 3)
    check(len(forks) == 3 and all(isinstance(f, Sandbox) for f in forks), f"three forks: {forks}")
    created.extend(f.sandbox_id for f in forks)
    for i, fork in enumerate(forks):
        check(fork.files.read("/home/user/after.txt") == "later\n", f"fork {i} has the parent's files")
        fork.files.write("/home/user/mine.txt", f"fork {i}\n")
        meta = fork.get_info().metadata
        check(meta.get("fork.parent") == source.sandbox_id and "processes" in meta.get("fork.carries", ""),
              f"fork {i}'s metadata names its parent and what it does not carry")
    check([f.files.read("/home/user/mine.txt") for f in forks] == ["fork 0\n", "fork 1\n", "fork 2\n"],
          "the forks' writes are their own")
    check(not source.files.exists("/home/user/mine.txt"), "the forks' writes do not reach the parent")
    after = source.get_info()
    check(after.sandbox_id == before.sandbox_id and after.end_at == before.end_at,
          "the parent's id and deadline are unchanged by the fork")

    # The source killed: its snapshot still makes sandboxes.
    source.kill()
    orphan = new(snap.snapshot_id, timeout=60)
    check(orphan.files.read("/home/user/notes.txt") == "from the source\n", "a snapshot outlives its source")

    check(Sandbox.delete_snapshot(snap.snapshot_id) is True, "delete_snapshot")
    check(Sandbox.delete_snapshot(snap.snapshot_id) is False, "a second delete finds nothing")
    try:
        new(snap.snapshot_id, timeout=30)
        check(False, "a create from a deleted snapshot fails")
    except SandboxException as err:
        check("404" in str(err) and snap.snapshot_id in str(err), f"a create from a deleted snapshot: {err}")
    check(orphan.files.read("/home/user/notes.txt") == "from the source\n",
          "a sandbox of a deleted snapshot keeps working")
    Sandbox.delete_snapshot(named.snapshot_id)

    # lifecycle on_timeout "pause": paused at the deadline, connect resumes it with its files and
    # processes.
    paused = new(timeout=3, lifecycle={"on_timeout": "pause"})
    info = paused.get_info()
    check(info.lifecycle["on_timeout"] == "pause", f"lifecycle in the info: {info.lifecycle}")
    paused.files.write("/home/user/kept.txt", "kept\n")
    paused.commands.run("sleep 600", background=True)
    deadline = time.monotonic() + 20
    while Sandbox.get_info(paused.sandbox_id).state != "paused" and time.monotonic() < deadline:
        time.sleep(0.25)
    check(Sandbox.get_info(paused.sandbox_id).state == "paused", "paused at its deadline, not killed")
    resumed = Sandbox.connect(paused.sandbox_id, timeout=60)
    check(resumed.get_info().state == "running", "connect resumes it")
    check(resumed.files.read("/home/user/kept.txt") == "kept\n", "its file is intact")
    check(resumed.commands.run("pgrep -x sleep >/dev/null && echo alive").stdout == "alive\n",
          "its process survived the pause")

    # An explicit pause, then connect.
    check(resumed.pause() is True, "pause")
    check(Sandbox.get_info(paused.sandbox_id).state == "paused", "paused by the SDK")
    again = Sandbox.connect(paused.sandbox_id)
    check(again.commands.run("pgrep -x sleep >/dev/null && echo alive").stdout == "alive\n",
          "connect after pause: its process is intact")

    # The object form with mode "filesystem": accepted, paused at the deadline, resumed by connect.
    fs_pause = new(timeout=3, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    check(fs_pause.get_info().lifecycle["on_timeout"] == "pause", "the object form is a pause")
    fs_pause.files.write("/home/user/fs.txt", "fs\n")
    deadline = time.monotonic() + 20
    while Sandbox.get_info(fs_pause.sandbox_id).state != "paused" and time.monotonic() < deadline:
        time.sleep(0.25)
    check(Sandbox.get_info(fs_pause.sandbox_id).state == "paused", "mode filesystem: paused at its deadline")
    check(Sandbox.connect(fs_pause.sandbox_id).files.read("/home/user/fs.txt") == "fs\n",
          "mode filesystem: connect resumes it with its files")

    auto = new(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    deadline = time.monotonic() + 20
    while Sandbox.get_info(auto.sandbox_id).state != "paused" and time.monotonic() < deadline:
        time.sleep(0.25)
    check(Sandbox.get_info(auto.sandbox_id).state == "paused", "auto_resume: paused at its deadline")
    check(auto.commands.run("echo woke").stdout == "woke\n", "auto_resume: a command resumes it")
    check(Sandbox.get_info(auto.sandbox_id).state == "running", "auto_resume: running again")


try:
    main()
finally:
    for sandbox_id in created:
        try:
            Sandbox.kill(sandbox_id)
        except Exception:  # noqa: BLE001 - cleanup of what may already be gone
            pass
    for snap in Sandbox.list_snapshots().next_items():
        Sandbox.delete_snapshot(snap.snapshot_id)
print("RESULT " + json.dumps(result))
sys.stdout.flush()
