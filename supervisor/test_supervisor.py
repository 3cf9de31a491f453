"""Tests for supervisor.py: real processes, temporary base directories, no mocks.

Run from the repository root with
    python3 -m unittest discover -s supervisor -v
or with pytest. Linux only.
"""

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUPERVISOR = os.path.join(HERE, "supervisor.py")
MIB = 1 << 20


def new_id():
    return os.urandom(16).hex()


def spec_line(b64):
    """What the gateway writes on the stdin of `start`: the base64 spec and a newline."""
    return b64.encode("ascii") + b"\n"


def read_text(path):
    with open(path) as f:
        return f.read()


def proc_gone(pid):
    """True if `pid` no longer runs (missing or a zombie)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return True
    return raw[raw.rfind(b")") + 2:].split()[0] in (b"Z", b"X")


def wait_gone(pid, seconds=3.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc_gone(pid):
            return True
        time.sleep(0.02)
    return proc_gone(pid)


class SupervisorTestCase(unittest.TestCase):
    def setUp(self):
        self.base = tempfile.mkdtemp(prefix="sup-test-")
        self.work = tempfile.mkdtemp(prefix="sup-work-")
        self.env = dict(os.environ)
        self.cleanup_pids = []

    def tearDown(self):
        # Cancel anything still running, then remove the directories.
        root = os.path.join(self.base, "tasks")
        for tid in os.listdir(root) if os.path.isdir(root) else []:
            try:
                with open(os.path.join(root, tid, "status.json")) as f:
                    running = json.load(f).get("state") == "running"
            except (OSError, ValueError):
                running = False
            if running:
                self.cli("cancel", "--task-id", tid, "--wait", "3", check=False)
        for pid in self.cleanup_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------

    def cli(self, *args, check=True, env=None, base=True, timeout=40, cwd=None, stdin=None):
        argv = [sys.executable, SUPERVISOR] + list(args)
        if base:
            argv += ["--base", self.base]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env or self.env, timeout=timeout, cwd=cwd,
                           input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)
        lines = p.stdout.decode().splitlines()
        self.assertEqual(len(lines), 1, "expected exactly one JSON line, got %r (stderr %r)"
                         % (p.stdout, p.stderr))
        obj = json.loads(lines[0])
        if check:
            self.assertEqual(p.returncode, 0, obj)
        obj["_rc"] = p.returncode
        return obj

    def start(self, command, envs=None, cwd=None, timeout=30, tid=None, env=None, check=True):
        tid = tid or new_id()
        spec = {"command": command, "cwd": cwd, "envs": envs or {}, "timeout": timeout}
        b64 = base64.b64encode(json.dumps(spec).encode()).decode()
        obj = self.cli("start", "--task-id", tid, env=env, check=check, stdin=spec_line(b64))
        return tid, obj

    def status(self, tid, *extra, check=True):
        return self.cli("status", "--task-id", tid, *extra, check=check)

    def wait_terminal(self, tid, seconds=15.0):
        end = time.monotonic() + seconds
        while True:
            st = self.status(tid, "--wait", "1", "--limit", "0", "--stdout-offset", str(1 << 40),
                             "--stderr-offset", str(1 << 40))
            if st["state"] != "running" or time.monotonic() > end:
                return st
            # A running task whose state we saw: loop (wait returns on change).

    def read_all(self, tid, stream="stdout", limit=65536):
        data = b""
        off = 0
        while True:
            st = self.status(tid, "--%s-offset" % stream, str(off), "--limit", str(limit))
            page = base64.b64decode(st[stream + "_b64"])
            self.assertEqual(st[stream + "_next_offset"], off + len(page))
            if not page:
                return data, st
            data += page
            off += len(page)

    def wait_output(self, tid, needle, seconds=10.0):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            data, st = self.read_all(tid)
            if needle in data:
                return st
            time.sleep(0.05)
        self.fail("output %r did not appear" % needle)

    # -- tests -------------------------------------------------------------------

    def test_version(self):
        obj = self.cli("version", base=False)
        self.assertEqual(obj["version"], "9")

    def test_default_base_is_the_script_directory(self):
        # The gateway reads task files beside the installed script, so without
        # --base the tasks must land there, not under $HOME.
        installed = os.path.join(self.base, "installed")
        os.makedirs(installed)
        shutil.copy(SUPERVISOR, installed)
        env = dict(self.env, HOME=self.work)
        tid = new_id()
        b64 = base64.b64encode(json.dumps({"command": "true"}).encode()).decode()
        p = subprocess.run([sys.executable, os.path.join(installed, "supervisor.py"), "start",
                            "--task-id", tid], input=spec_line(b64),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.isdir(os.path.join(installed, "tasks", tid)))
        self.assertFalse(os.path.exists(os.path.join(self.work, ".sandbox-mcp")))

    def test_happy_path_stdout_stderr_separate(self):
        tid, first = self.start("echo hello; echo oops >&2; echo $FOO; pwd",
                                envs={"FOO": "bar"}, cwd=self.work)
        self.assertEqual(first["task_id"], tid)
        self.assertIn(first["state"], ("running", "succeeded"))
        self.assertEqual(first["stdout_b64"], "")  # start prints empty pages
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "succeeded")
        self.assertEqual(st["exit_code"], 0)
        self.assertIsNone(st["signal"])
        self.assertIsNone(st["error"])
        out, st = self.read_all(tid)
        err, _ = self.read_all(tid, "stderr")
        self.assertEqual(out, ("hello\nbar\n%s\n" % self.work).encode())
        self.assertEqual(err, b"oops\n")
        self.assertEqual(st["stdout_size"], len(out))
        self.assertEqual(st["stdout_total_bytes"], len(out))
        self.assertEqual(st["stderr_size"], 5)
        self.assertFalse(st["stdout_truncated"])
        self.assertLessEqual(st["started_at"], st["finished_at"])
        self.assertEqual(st["command"], "echo hello; echo oops >&2; echo $FOO; pwd")
        self.assertEqual(st["timeout"], 30)
        self.assertIsInstance(st["pid"], int)
        self.assertEqual(st["pid"], st["pgid"])
        # Private directories and files.
        tdir = os.path.join(self.base, "tasks", tid)
        for path in (self.base, os.path.join(self.base, "tasks"), tdir):
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o700, path)
        self.assertEqual(os.stat(os.path.join(tdir, "status.json")).st_mode & 0o777, 0o600)
        # The task's env values are not persisted, only names.
        spec = json.loads(read_text(os.path.join(tdir, "spec.json")))
        self.assertEqual(spec["env_names"], ["FOO"])
        self.assertNotIn("bar", json.dumps(spec))

    def test_relative_cwd_is_resolved_by_start(self):
        os.mkdir(os.path.join(self.work, "sub"))
        spec = {"command": "pwd", "cwd": "sub", "envs": {}, "timeout": 10}
        b64 = base64.b64encode(json.dumps(spec).encode()).decode()
        tid = new_id()
        self.cli("start", "--task-id", tid, cwd=self.work, stdin=spec_line(b64))
        self.assertEqual(self.wait_terminal(tid)["state"], "succeeded")
        self.assertEqual(self.read_all(tid)[0], (os.path.join(self.work, "sub") + "\n").encode())

    def test_import_invocation(self):
        # The form recommended to the gateway: import the module (cached
        # bytecode) instead of running the file as a script.
        code = ("import sys; sys.path.insert(0, %r); import supervisor; "
                "sys.exit(supervisor.main(sys.argv[1:]))" % HERE)
        spec = {"command": "echo via-import", "cwd": None, "envs": {}, "timeout": 10}
        b64 = base64.b64encode(json.dumps(spec).encode()).decode()
        tid = new_id()
        for args, stdin in ((["start", "--task-id", tid], spec_line(b64)),
                            (["status", "--task-id", tid, "--wait", "5", "--stdout-offset", "0"], b"")):
            p = subprocess.run([sys.executable, "-I", "-S", "-c", code] + args + ["--base", self.base],
                               input=stdin, stdout=subprocess.PIPE, timeout=30)
            self.assertEqual(p.returncode, 0, p.stdout)
            self.assertEqual(len(p.stdout.splitlines()), 1)
        self.assertEqual(self.wait_terminal(tid)["state"], "succeeded")
        self.assertEqual(self.read_all(tid)[0], b"via-import\n")
        p = subprocess.run([sys.executable, "-I", "-S", "-c", code, "status", "--task-id", "x"],
                           stdout=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertEqual(json.loads(p.stdout)["code"], "invalid")

    def test_base_dir_permissions_tightened(self):
        os.chmod(self.base, 0o755)
        self.cli("list")
        self.assertEqual(os.stat(self.base).st_mode & 0o777, 0o700)

    def test_nonzero_exit_is_failed(self):
        tid, _ = self.start("echo partial; exit 3")
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "failed")
        self.assertEqual(st["exit_code"], 3)
        self.assertIsNone(st["signal"])

    def test_death_by_signal(self):
        tid, _ = self.start("kill -KILL $$")
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "failed")
        self.assertEqual(st["signal"], 9)
        self.assertEqual(st["exit_code"], 128 + 9)

    def test_resubmitted_start_never_runs_twice(self):
        marker = os.path.join(self.work, "ran")
        tid, _ = self.start("echo run >> %s" % marker)
        self.assertEqual(self.wait_terminal(tid)["state"], "succeeded")
        again = self.start("echo run >> %s" % marker, tid=tid, check=False)[1]
        self.assertEqual(again["_rc"], 2)
        self.assertEqual(again["code"], "exists")
        time.sleep(0.2)
        self.assertEqual(read_text(marker), "run\n")
        # The original record is untouched.
        self.assertEqual(self.status(tid)["state"], "succeeded")

    def test_task_limit(self):
        root = os.path.join(self.base, "tasks")
        os.makedirs(root)
        for _ in range(128):
            os.mkdir(os.path.join(root, new_id()))
        tid = new_id()
        obj = self.start("echo no", tid=tid, check=False)[1]
        self.assertEqual(obj["_rc"], 2)
        self.assertEqual(obj["code"], "limit")
        self.assertIn("delete", obj["error"])
        self.assertFalse(os.path.exists(os.path.join(root, tid)))
        # An existing id is still reported as `exists`, not `limit`.
        some = sorted(os.listdir(root))[0]
        self.assertEqual(self.start("echo no", tid=some, check=False)[1]["code"], "exists")
        # Freeing one slot allows the next start.
        os.rmdir(os.path.join(root, some))
        tid2, _ = self.start("echo yes")
        self.assertEqual(self.wait_terminal(tid2)["state"], "succeeded")

    def test_big_output_truncated_and_counted(self):
        blob = os.urandom(3 * MIB + 123)
        path = os.path.join(self.work, "blob")
        with open(path, "wb") as f:
            f.write(blob)
        tid, _ = self.start("cat %s; head -c 2000 %s >&2" % (path, path),
                            envs={"API_TOKEN": "not-in-the-random-data-xyzzy"})
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "succeeded")
        out, st = self.read_all(tid, limit=MIB)
        self.assertEqual(out, blob[:MIB])
        self.assertEqual(st["stdout_size"], MIB)
        self.assertEqual(st["stdout_total_bytes"], len(blob))
        self.assertTrue(st["stdout_truncated"])
        err, st = self.read_all(tid, "stderr")
        self.assertEqual(err, blob[:2000])
        self.assertEqual(st["stderr_total_bytes"], 2000)
        self.assertFalse(st["stderr_truncated"])

    def test_exactly_one_mib_not_truncated(self):
        tid, _ = self.start("head -c %d /dev/zero" % MIB)
        st = self.wait_terminal(tid)
        self.assertEqual(st["stdout_size"], MIB)
        self.assertEqual(st["stdout_total_bytes"], MIB)
        self.assertFalse(st["stdout_truncated"])
        tid, _ = self.start("head -c %d /dev/zero" % (MIB + 1))
        st = self.wait_terminal(tid)
        self.assertEqual(st["stdout_size"], MIB)
        self.assertEqual(st["stdout_total_bytes"], MIB + 1)
        self.assertTrue(st["stdout_truncated"])

    def test_paging_odd_limits_and_replay(self):
        script = "import sys\nfor i in range(3000): sys.stdout.write('line %d\\n' % i)\n"
        path = os.path.join(self.work, "gen.py")
        with open(path, "w") as f:
            f.write(script)
        tid, _ = self.start("%s %s" % (sys.executable, path))
        self.wait_terminal(tid)
        expected = "".join("line %d\n" % i for i in range(3000)).encode()
        for limit in (1, 7777, 65536):
            if limit == 1:
                # Only the first pages one byte at a time (keeps the test fast).
                st = self.status(tid, "--stdout-offset", "5", "--limit", "1")
                self.assertEqual(base64.b64decode(st["stdout_b64"]), expected[5:6])
                self.assertEqual(st["stdout_next_offset"], 6)
                continue
            data, _ = self.read_all(tid, limit=limit)
            self.assertEqual(data, expected)
        a = self.status(tid, "--stdout-offset", "12345", "--limit", "999")
        b = self.status(tid, "--stdout-offset", "12345", "--limit", "999")
        self.assertEqual(a["stdout_b64"], b["stdout_b64"])
        self.assertEqual(base64.b64decode(a["stdout_b64"]), expected[12345:12345 + 999])
        self.assertEqual(a["stdout_next_offset"], 12345 + 999)
        beyond = self.status(tid, "--stdout-offset", str(len(expected) + 50))
        self.assertEqual(beyond["stdout_b64"], "")
        self.assertEqual(beyond["stdout_next_offset"], len(expected) + 50)
        self.assertEqual(beyond["stdout_size"], len(expected))

    def test_masking(self):
        secret = "Sup3rSecretValue-0123456789"
        sandbox_secret = "sandbox-level-password"
        env = dict(self.env, DB_PASSWORD=sandbox_secret)
        half = len(secret) // 2
        script = (
            "import os, sys, time\n"
            "s = os.environ['MY_API_KEY']\n"
            "w = sys.stdout.buffer\n"
            "w.write(b'A:' + s.encode() + b'\\n'); w.flush()\n"
            # the secret split across two pipe reads
            "w.write(b'B:' + s[:%d].encode()); w.flush(); time.sleep(0.4)\n"
            "w.write(s[%d:].encode() + b'\\n'); w.flush()\n"
            "w.write(b'C:' + os.environ['GREETING'].encode() + b'\\n')\n"
            "w.write(b'D:' + os.environ['SHORT_TOKEN'].encode() + b'\\n')\n"
            "w.write(b'E:' + os.environ['DB_PASSWORD'].encode() + b'\\n')\n"
            "w.write(b'F:' + os.environ['lower_secret_name'].encode() + b'\\n')\n"
            "w.write(b'G:' + s[:-1].encode())\n"  # look-alike prefix at EOF
            "w.flush()\n"
            "sys.stderr.write('err ' + s + '\\n')\n"
        ) % (half, half)
        path = os.path.join(self.work, "leak.py")
        with open(path, "w") as f:
            f.write(script)
        envs = {"MY_API_KEY": secret, "GREETING": secret[:10], "SHORT_TOKEN": "abc",
                "lower_secret_name": "lowercase-name-secret"}
        tid, _ = self.start("%s %s" % (sys.executable, path), envs=envs, env=env)
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "succeeded", st)
        out, st = self.read_all(tid)
        err, _ = self.read_all(tid, "stderr")
        expected = ("A:***\nB:***\nC:%s\nD:abc\nE:***\nF:***\nG:%s"
                    % (secret[:10], secret[:-1])).encode()
        self.assertEqual(out, expected)
        self.assertEqual(err, b"err ***\n")
        # Totals count the raw stream.
        raw_len = len(expected) + 2 * (len(secret) - 3) + (len(sandbox_secret) - 3) + \
            (len("lowercase-name-secret") - 3)
        self.assertEqual(st["stdout_total_bytes"], raw_len)
        self.assertEqual(st["stdout_size"], len(expected))
        tdir = os.path.join(self.base, "tasks", tid)
        for name in os.listdir(tdir):
            with open(os.path.join(tdir, name), "rb") as f:
                self.assertNotIn(secret.encode(), f.read(), name)

    def test_masking_split_exactly_at_read_boundary_large(self):
        # The secret straddles the point where the stored prefix is cut, and
        # appears many times: nothing of it may be stored in clear.
        secret = "K" * 5 + "tokenvalue"
        script = ("import sys\nw = sys.stdout.buffer\n"
                  "w.write(b'x' * (%d - 7) + %r * 200000)\n") % (MIB, secret.encode())
        path = os.path.join(self.work, "many.py")
        with open(path, "w") as f:
            f.write(script)
        tid, _ = self.start("%s %s" % (sys.executable, path), envs={"SECRET_X": secret})
        st = self.wait_terminal(tid)
        out, st = self.read_all(tid, limit=MIB)
        self.assertEqual(len(out), MIB)
        self.assertTrue(st["stdout_truncated"])
        self.assertEqual(out[:MIB - 7], b"x" * (MIB - 7))
        self.assertEqual(out[MIB - 7:], b"***" * 2 + b"*")
        self.assertNotIn(b"tokenvalue", out)
        self.assertEqual(st["stdout_total_bytes"], MIB - 7 + len(secret) * 200000)

    def test_timeout_kills_group(self):
        pidfile = os.path.join(self.work, "bg")
        tid, _ = self.start("sleep 60 & echo $! > %s; sleep 60" % pidfile, timeout=1)
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "timed_out")
        self.assertGreaterEqual(st["finished_at"] - st["started_at"], 0.9)
        self.assertLess(st["finished_at"] - st["started_at"], 10)
        bg = int(read_text(pidfile))
        self.assertTrue(wait_gone(bg), "background child survived the timeout")
        self.assertTrue(wait_gone(st["pid"]))

    def test_timeout_term_ignored_then_killed(self):
        tid, _ = self.start("trap '' TERM; echo ready; sleep 60", timeout=1)
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "timed_out")
        self.assertEqual(st["signal"], 9)
        self.assertGreaterEqual(st["finished_at"] - st["started_at"], 2.5)  # 1 s + 2 s grace

    def test_daemon_lives_in_its_task_dir_so_its_cwd_names_the_task(self):
        # The gateway's liveness probe without a process: /proc/PID/cwd/status.json
        # resolves while the daemon exists, and names this task and this daemon.
        tid, _ = self.start("echo ready; sleep 60")
        self.wait_output(tid, b"ready")
        with open(os.path.join(self.base, "tasks", tid, "status.json")) as f:
            record = json.load(f)
        self.assertTrue(record["supervisor_in_task_dir"])
        pid = record["supervisor_pid"]
        with open("/proc/%d/cwd/status.json" % pid) as f:
            probed = json.load(f)
        self.assertEqual((probed["task_id"], probed["supervisor_pid"]), (tid, pid))
        self.assertEqual(probed["supervisor_start_time"], record["supervisor_start_time"])
        st = self.cli("cancel", "--task-id", tid)
        self.assertEqual(st["state"], "cancelled")
        self.assertTrue(wait_gone(pid))
        self.assertFalse(os.path.exists("/proc/%d/cwd/status.json" % pid))

    def test_cancel_running(self):
        tid, _ = self.start("echo ready; sleep 60")
        self.wait_output(tid, b"ready")
        t0 = time.monotonic()
        st = self.cli("cancel", "--task-id", tid)
        self.assertEqual(st["state"], "cancelled")
        self.assertTrue(st["cancel_confirmed"])
        self.assertTrue(st["signalled"])
        self.assertEqual(st["signal"], 15)
        self.assertLess(time.monotonic() - t0, 8.0)
        self.assertEqual(base64.b64decode(st["stdout_b64"]), b"ready\n")
        self.assertTrue(wait_gone(st["pid"]))
        # Idempotent: a second cancel reports the same saved outcome.
        again = self.cli("cancel", "--task-id", tid)
        self.assertEqual(again["state"], "cancelled")
        self.assertEqual(again["finished_at"], st["finished_at"])
        self.assertFalse(again["signalled"])

    def test_cancel_term_ignoring_task_is_killed(self):
        script = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                  "print('ready', flush=True)\ntime.sleep(60)\n")
        path = os.path.join(self.work, "stubborn.py")
        with open(path, "w") as f:
            f.write(script)
        tid, _ = self.start("%s %s" % (sys.executable, path))
        self.wait_output(tid, b"ready")
        t0 = time.monotonic()
        st = self.cli("cancel", "--task-id", tid, "--wait", "5")
        elapsed = time.monotonic() - t0
        self.assertEqual(st["state"], "cancelled")
        self.assertTrue(st["cancel_confirmed"])
        self.assertEqual(st["signal"], 9)
        self.assertGreaterEqual(elapsed, 1.5)  # waited the TERM grace before KILL
        self.assertTrue(wait_gone(st["pid"]))

    def test_cancel_finished_task_signals_nothing(self):
        tid, _ = self.start("exit 4")
        done = self.wait_terminal(tid)
        tdir = os.path.join(self.base, "tasks", tid)
        before = os.stat(os.path.join(tdir, "status.json")).st_mtime_ns
        st = self.cli("cancel", "--task-id", tid)
        self.assertEqual(st["state"], "failed")
        self.assertEqual(st["exit_code"], 4)
        self.assertEqual(st["finished_at"], done["finished_at"])
        self.assertFalse(st["cancel_confirmed"])
        self.assertFalse(st["signalled"])
        self.assertFalse(os.path.exists(os.path.join(tdir, "cancel_requested")))
        self.assertEqual(os.stat(os.path.join(tdir, "status.json")).st_mtime_ns, before)

    def test_group_members_killed_at_completion(self):
        pidfile = os.path.join(self.work, "bg")
        tid, _ = self.start("sleep 60 > /dev/null 2>&1 & echo $! > %s; echo done" % pidfile)
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "succeeded")
        self.assertTrue(wait_gone(int(read_text(pidfile))))

    def test_setsid_child_escapes_cleanup(self):
        # Documented limitation: a process in its own session survives the
        # group cleanup. It also keeps stdout open; the task must still finish.
        pidfile = os.path.join(self.work, "esc")
        # The loop waits until the child runs in its own session (field 6 of
        # /proc/PID/stat) before the task ends and its group is killed.
        tid, _ = self.start(
            "setsid sleep 30 & p=$!; echo $p > %s; i=0; "
            "until [ \"$(cut -d' ' -f6 /proc/$p/stat)\" = \"$p\" ] || [ $i -ge 500 ]; "
            "do sleep 0.02; i=$((i+1)); done; echo done" % pidfile)
        t0 = time.monotonic()
        st = self.wait_terminal(tid)
        self.assertLess(time.monotonic() - t0, 8)
        pid = int(read_text(pidfile))
        self.cleanup_pids.append(pid)
        self.assertEqual(st["state"], "succeeded")
        self.assertFalse(proc_gone(pid), "setsid child was expected to escape")
        out, _ = self.read_all(tid)
        self.assertEqual(out, b"done\n")

    def test_killed_supervisor_reports_unknown(self):
        tid, first = self.start("echo ready; sleep 60")
        self.wait_output(tid, b"ready")
        record = json.loads(read_text(os.path.join(self.base, "tasks", tid, "status.json")))
        os.kill(record["supervisor_pid"], signal.SIGKILL)
        self.assertTrue(wait_gone(record["supervisor_pid"]))
        st = self.status(tid)
        self.assertEqual(st["state"], "unknown")
        self.assertIsNotNone(st["error"])
        self.assertIsNone(st["exit_code"])
        listed = self.cli("list")["tasks"]
        self.assertEqual([t["state"] for t in listed if t["task_id"] == tid], ["unknown"])
        # Waiting on an unknown task with a dead supervisor returns at once.
        t0 = time.monotonic()
        self.status(tid, "--wait", "5", "--stdout-offset", "6")
        self.assertLess(time.monotonic() - t0, 3)
        # Cancel kills the verified group itself but never claims success.
        st = self.cli("cancel", "--task-id", tid)
        self.assertEqual(st["state"], "unknown")
        self.assertFalse(st["cancel_confirmed"])
        self.assertTrue(st["signalled"])
        self.assertTrue(wait_gone(record["pid"]))

    def test_supervisor_sigterm_records_failed(self):
        tid, _ = self.start("echo ready; sleep 60")
        self.wait_output(tid, b"ready")
        record = json.loads(read_text(os.path.join(self.base, "tasks", tid, "status.json")))
        os.kill(record["supervisor_pid"], signal.SIGTERM)
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "failed")
        self.assertIn("SIGTERM", st["error"])
        self.assertTrue(wait_gone(record["pid"]))

    def test_wait_returns_early_on_output(self):
        tid, _ = self.start("sleep 0.5; echo late; sleep 60")
        t0 = time.monotonic()
        st = self.status(tid, "--wait", "20")
        elapsed = time.monotonic() - t0
        self.assertEqual(base64.b64decode(st["stdout_b64"]), b"late\n")
        self.assertLess(elapsed, 10)
        # Nothing new past the offset: waits (roughly) the whole time.
        t0 = time.monotonic()
        st = self.status(tid, "--wait", "0.6", "--stdout-offset", "5")
        self.assertGreaterEqual(time.monotonic() - t0, 0.5)
        self.assertEqual(st["state"], "running")
        self.assertEqual(st["stdout_b64"], "")

    def test_wait_offsets_are_independent_of_the_page(self):
        # A page from offset 0 that waits past offset 5: output before 5 does not end the wait.
        tid, _ = self.start("echo early; sleep 60")
        self.status(tid, "--wait", "10")  # "early\n" is stored
        t0 = time.monotonic()
        st = self.status(tid, "--wait", "0.6", "--stdout-offset", "0", "--wait-stdout-offset", "6")
        self.assertGreaterEqual(time.monotonic() - t0, 0.5)
        self.assertEqual(base64.b64decode(st["stdout_b64"]), b"early\n")
        obj = self.cli("status", "--task-id", tid, "--wait", "1", "--wait-stdout-offset", "-1", check=False)
        self.assertEqual(obj["code"], "invalid")

    def test_wait_returns_on_state_change(self):
        tid, _ = self.start("sleep 0.5")
        t0 = time.monotonic()
        st = self.status(tid, "--wait", "20")
        self.assertEqual(st["state"], "succeeded")
        self.assertLess(time.monotonic() - t0, 10)

    def test_invalid_ids_and_not_found(self):
        for bad in ("abc", "A" * 32, "0" * 31, "0" * 33, "../../../../etc/passwd", "g" * 32):
            obj = self.cli("status", "--task-id", bad, check=False)
            self.assertEqual((obj["_rc"], obj["code"]), (2, "invalid"), bad)
            obj = self.start("echo x", tid=bad, check=False)[1]
            self.assertEqual(obj["code"], "invalid", bad)
        obj = self.cli("status", "--task-id", new_id(), check=False)
        self.assertEqual((obj["_rc"], obj["code"]), (2, "not_found"))
        self.assertIn("not found in this sandbox", obj["error"])
        obj = self.cli("cancel", "--task-id", new_id(), check=False)
        self.assertEqual(obj["code"], "not_found")
        obj = self.cli("status", "--task-id", new_id(), "--bogus", "1", check=False)
        self.assertEqual(obj["code"], "invalid")
        obj = self.cli("frobnicate", check=False)
        self.assertEqual(obj["code"], "invalid")

    def test_invalid_spec_creates_nothing(self):
        tid = new_id()
        valid = base64.b64encode(b'{"command": "true"}').decode()
        self.assertTrue(valid.endswith("="))
        cases = [
            "not base64!",
            valid[:8] + "\n" + valid[8:],   # lenient decoders skip these
            valid[:8] + "*" + valid[8:],
            valid + "!",
            valid.rstrip("="),               # unpadded
            base64.b64encode(b"[1, 2]").decode(),
            base64.b64encode(b'{"command": 5}').decode(),
            base64.b64encode(json.dumps({"command": "true", "cwd": "/no/such/dir"}).encode()).decode(),
            base64.b64encode(json.dumps({"command": "true", "timeout": -1}).encode()).decode(),
            base64.b64encode(json.dumps({"command": "true", "envs": {"A=B": "x"}}).encode()).decode(),
        ]
        for b64 in cases:
            obj = self.cli("start", "--task-id", tid, check=False, stdin=spec_line(b64))
            self.assertEqual((obj["_rc"], obj["code"]), (2, "invalid"), b64)
            self.assertFalse(os.path.exists(os.path.join(self.base, "tasks", tid)))

    def test_spec_comes_on_stdin_and_never_in_argv(self):
        secret = "s3cret-" + new_id()
        tid, _ = self.start("sleep 30", envs={"API_TOKEN": secret}, timeout=60)
        st = self.status(tid)
        self.assertEqual(st["state"], "running", st)
        # No process of the task (daemon, bash) has the spec or the secret in its argv.
        record = json.loads(read_text(os.path.join(self.base, "tasks", tid, "status.json")))
        for pid in (record["supervisor_pid"], st["pid"]):
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmdline = f.read()
            self.assertTrue(cmdline)
            self.assertNotIn(secret.encode(), cmdline)
        # The old argv form is refused before anything is created.
        b64 = base64.b64encode(json.dumps({"command": "true"}).encode()).decode()
        other = new_id()
        obj = self.cli("start", "--task-id", other, "--spec-b64", b64, check=False)
        self.assertEqual((obj["_rc"], obj["code"]), (2, "invalid"), obj)
        # No spec on stdin (EOF at once), or one that is too long: refused, nothing created.
        obj = self.cli("start", "--task-id", other, check=False)
        self.assertEqual((obj["_rc"], obj["code"]), (2, "invalid"), obj)
        self.assertIn("stdin", obj["error"])
        long_spec = {"command": "true", "envs": {"A": "x" * (1 << 18)}}
        obj = self.cli("start", "--task-id", other, check=False,
                       stdin=spec_line(base64.b64encode(json.dumps(long_spec).encode()).decode()))
        self.assertEqual((obj["_rc"], obj["code"]), (2, "invalid"), obj)
        self.assertIn("longer than", obj["error"])
        self.assertFalse(os.path.exists(os.path.join(self.base, "tasks", other)))

    def test_spec_that_never_arrives_times_out_and_creates_nothing(self):
        code = ("import sys; sys.path.insert(0, %r); import supervisor; supervisor.SPEC_WAIT = 0.5; "
                "sys.exit(supervisor.main(sys.argv[1:]))" % HERE)
        tid = new_id()
        r, w = os.pipe()  # the write end stays open: no EOF, no data
        try:
            t0 = time.monotonic()
            p = subprocess.run([sys.executable, "-I", "-S", "-c", code, "start", "--task-id", tid,
                                "--base", self.base], stdin=r, stdout=subprocess.PIPE, timeout=30)
        finally:
            os.close(r)
            os.close(w)
        self.assertLess(time.monotonic() - t0, 10)
        obj = json.loads(p.stdout)
        self.assertEqual((p.returncode, obj["code"]), (2, "invalid"), obj)
        self.assertIn("no task spec arrived", obj["error"])
        self.assertFalse(os.path.exists(os.path.join(self.base, "tasks", tid)))

    def test_launch_failure_records_failed(self):
        # With RLIMIT_NOFILE = 8 the start CLI still works, but the daemon
        # cannot create its pipes: the task must be recorded `failed` with an
        # error, and the command must not have run.
        import resource
        marker = os.path.join(self.work, "ran")
        tid = new_id()
        spec = {"command": "touch %s" % marker, "cwd": None, "envs": {}, "timeout": 10}
        b64 = base64.b64encode(json.dumps(spec).encode()).decode()
        p = subprocess.run(
            [sys.executable, SUPERVISOR, "start", "--task-id", tid, "--base", self.base],
            input=spec_line(b64), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (8, 8)))
        self.assertEqual(p.returncode, 0, p.stderr)
        st = self.wait_terminal(tid)
        self.assertEqual(st["state"], "failed")
        self.assertIn("could not start the command", st["error"])
        self.assertIsNone(st["exit_code"])
        self.assertFalse(os.path.exists(marker))

    def test_unknown_without_status(self):
        tid = new_id()
        tdir = os.path.join(self.base, "tasks", tid)
        os.makedirs(tdir)
        with open(os.path.join(tdir, "spec.json"), "w") as f:
            json.dump({"command": "echo x", "timeout": 5, "created_at": 1.0}, f)
        st = self.status(tid)
        self.assertEqual(st["state"], "unknown")
        self.assertIsNone(st["exit_code"])
        self.assertEqual(st["command"], "echo x")
        # A corrupt status file is not success either.
        with open(os.path.join(tdir, "status.json"), "w") as f:
            f.write('{"state": "succ')
        self.assertEqual(self.status(tid)["state"], "unknown")

    def test_list_sorted(self):
        a, _ = self.start("echo first\necho second line")
        time.sleep(0.05)
        b, _ = self.start("exit 1")
        self.wait_terminal(a)
        self.wait_terminal(b)
        tasks = self.cli("list")["tasks"]
        self.assertEqual([t["task_id"] for t in tasks], [a, b])
        self.assertEqual(tasks[0]["command_first_line"], "echo first")
        self.assertEqual(tasks[0]["state"], "succeeded")
        self.assertEqual((tasks[1]["state"], tasks[1]["exit_code"]), ("failed", 1))

    def test_start_returns_while_task_runs(self):
        # The launching call must not wait for the task: the daemon releases
        # the caller's stdout/stderr pipes.
        t0 = time.monotonic()
        tid, first = self.start("sleep 30")
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(first["state"], "running")
        self.assertIsNotNone(first["started_at"])
        # The first record is saved before the command starts; the next one
        # names its process. The daemon is in another session than the caller
        # and the task has its own group, distinct from the daemon's.
        end = time.monotonic() + 5
        while True:
            record = json.loads(read_text(os.path.join(self.base, "tasks", tid, "status.json")))
            if record["pid"] is not None or time.monotonic() > end:
                break
            time.sleep(0.01)
        self.assertNotEqual(os.getsid(record["supervisor_pid"]), os.getsid(0))
        self.assertNotEqual(os.getpgid(record["supervisor_pid"]), record["pgid"])
        self.assertEqual(os.getpgid(record["pid"]), record["pgid"])

    # -- copies of a task in another sandbox (snapshots, forks) ------------------
    #
    # A copy is simulated by copying the task's files into a second base
    # directory (the "new sandbox"). Its pids still name the ORIGINAL live
    # processes here, exactly what a recycled pid could do in a real copy: only
    # the recorded origin keeps the copy from reading `running` and cancel from
    # signalling the original. The copy is told apart either by rewriting its
    # recorded origin, or by faking this side's identity through the module's
    # /proc paths (supervisor.PID_NS_PATH, INIT_STAT_PATH, BOOT_ID_PATH).

    COPIED = "copied from another sandbox (a snapshot or fork) without its process"

    def record_of(self, tid, base=None, name="status.json"):
        return json.loads(read_text(os.path.join(base or self.base, "tasks", tid, name)))

    def copy_task(self, tid, origin=None, drop_origin=False):
        """Copies task `tid`'s files into a new base directory; `origin`
        updates the copy's recorded origin (spec.json and status.json),
        `drop_origin` removes it (a task of an older supervisor)."""
        base2 = tempfile.mkdtemp(prefix="copy-", dir=self.work)
        src = os.path.join(self.base, "tasks", tid)
        dst = os.path.join(base2, "tasks", tid)
        os.makedirs(dst)
        for name in ("spec.json", "status.json", "stdout", "stderr"):
            if os.path.exists(os.path.join(src, name)):
                shutil.copy(os.path.join(src, name), os.path.join(dst, name))
        for name in ("spec.json", "status.json"):
            path = os.path.join(dst, name)
            if not os.path.exists(path):
                continue
            record = json.loads(read_text(path))
            if drop_origin:
                record.pop("origin", None)
            elif origin:
                self.assertIsInstance(record["origin"], dict)
                record["origin"] = dict(record["origin"], **origin)
            with open(path, "w") as f:
                json.dump(record, f)
        return base2

    def cli_in(self, base, *args, identity=None, check=True):
        """The supervisor on `base`; `identity` maps PID_NS_PATH, INIT_STAT_PATH,
        BOOT_ID_PATH to paths of the test's choosing (a faked sandbox identity)."""
        sets = "".join("supervisor.%s = %r; " % kv for kv in sorted((identity or {}).items()))
        code = ("import sys; sys.path.insert(0, %r); import supervisor; %s"
                "sys.exit(supervisor.main(sys.argv[1:]))" % (HERE, sets))
        p = subprocess.run([sys.executable, "-I", "-S", "-c", code] + list(args) + ["--base", base],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                           timeout=40)
        lines = p.stdout.decode().splitlines()
        self.assertEqual(len(lines), 1, (p.stdout, p.stderr))
        obj = json.loads(lines[0])
        if check:
            self.assertEqual(p.returncode, 0, obj)
        return obj

    def start_running(self):
        tid, _ = self.start("echo ready; sleep 60", timeout=120)
        self.wait_output(tid, b"ready")
        record = self.record_of(tid)
        self.assertEqual(record["state"], "running")
        return tid, record

    def assert_copied_view(self, st):
        self.assertEqual(st["state"], "unknown", st)
        self.assertIn(self.COPIED, st["error"])
        for key in ("exit_code", "signal", "finished_at"):
            self.assertIsNone(st[key], key)

    def test_origin_is_recorded_at_start(self):
        tid, record = self.start_running()
        spec = self.record_of(tid, name="spec.json")
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        expected = {"pid_ns": os.stat("/proc/self/ns/pid").st_ino,
                    "init_start": int(read_text("/proc/1/stat").rsplit(")", 1)[1].split()[19]),
                    "boot_id": boot_id}
        self.assertEqual(record["origin"], expected)
        self.assertEqual(spec["origin"], expected)
        # The same sandbox: a running task is running.
        self.assertEqual(self.status(tid)["state"], "running")

    def test_copied_running_task_is_unknown_and_cancel_signals_nothing(self):
        tid, record = self.start_running()
        # Each component alone tells the copy apart.
        for origin in ({"pid_ns": record["origin"]["pid_ns"] + 1},
                       {"init_start": record["origin"]["init_start"] + 1},
                       {"boot_id": "00000000-0000-4000-8000-000000000000"}):
            base2 = self.copy_task(tid, origin=origin)
            st = self.cli_in(base2, "status", "--task-id", tid, "--stdout-offset", "0")
            self.assert_copied_view(st)
            self.assertEqual(base64.b64decode(st["stdout_b64"]), b"ready\n")  # files are readable
            # A wait returns at once: nothing will ever change here.
            t0 = time.monotonic()
            st = self.cli_in(base2, "status", "--task-id", tid, "--wait", "5", "--stdout-offset", "6")
            self.assertLess(time.monotonic() - t0, 3)
            self.assert_copied_view(st)
            listed = self.cli_in(base2, "list")["tasks"]
            self.assertEqual([(t["task_id"], t["state"], t["exit_code"]) for t in listed],
                             [(tid, "unknown", None)], origin)
            self.assertIn(self.COPIED, listed[0]["error"])
            copy_dir = os.path.join(base2, "tasks", tid)
            before = read_text(os.path.join(copy_dir, "status.json"))
            st = self.cli_in(base2, "cancel", "--task-id", tid, "--wait", "2")
            self.assert_copied_view(st)
            self.assertFalse(st["signalled"])
            self.assertFalse(st["cancel_confirmed"])
            # Nothing written in the copy, nothing signalled: the original runs on.
            self.assertFalse(os.path.exists(os.path.join(copy_dir, "cancel_requested")))
            self.assertEqual(read_text(os.path.join(copy_dir, "status.json")), before)
            time.sleep(0.3)
            self.assertFalse(proc_gone(record["supervisor_pid"]))
            self.assertFalse(proc_gone(record["pid"]))
            self.assertEqual(self.status(tid)["state"], "running")
        self.assertFalse(os.path.exists(os.path.join(self.base, "tasks", tid, "cancel_requested")))

    def test_copy_detected_through_this_sandboxs_identity(self):
        # The copy's records are untouched; this side's identity differs (the
        # production path reads /proc; here it is pointed at the test's files).
        tid, record = self.start_running()
        base2 = self.copy_task(tid)
        fake_boot = os.path.join(self.work, "boot_id")
        with open(fake_boot, "w") as f:
            f.write("11111111-2222-4333-8444-555555555555\n")
        fake_ns = os.path.join(self.work, "ns")  # a file: another inode than the namespace's
        open(fake_ns, "w").close()
        fake_init = os.path.join(self.work, "init_stat")
        with open(fake_init, "w") as f:
            f.write("1 (init) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n"
                    % (record["origin"]["init_start"] + 7))
        for identity in ({"BOOT_ID_PATH": fake_boot}, {"PID_NS_PATH": fake_ns},
                         {"INIT_STAT_PATH": fake_init}):
            self.assert_copied_view(self.cli_in(base2, "status", "--task-id", tid, identity=identity))
            st = self.cli_in(base2, "cancel", "--task-id", tid, identity=identity)
            self.assert_copied_view(st)
            self.assertFalse(st["signalled"])
        self.assertFalse(proc_gone(record["supervisor_pid"]))
        # Nothing of the identity readable: compared on nothing, as before origins existed.
        nothing = {k: os.path.join(self.work, "missing") for k in
                   ("BOOT_ID_PATH", "PID_NS_PATH", "INIT_STAT_PATH")}
        self.assertEqual(self.cli_in(base2, "status", "--task-id", tid, identity=nothing)["state"],
                         "running")
        # Only the boot id unreadable: the other components still match, so running.
        self.assertEqual(self.cli_in(base2, "status", "--task-id", tid,
                                     identity={"BOOT_ID_PATH": nothing["BOOT_ID_PATH"]})["state"],
                         "running")

    def test_copy_while_starting_is_unknown_with_the_copy_reason(self):
        # Copied after spec.json, before the first status.json.
        tid, record = self.start_running()
        base2 = self.copy_task(tid, origin={"boot_id": "copy"})
        os.remove(os.path.join(base2, "tasks", tid, "status.json"))
        t0 = time.monotonic()
        st = self.cli_in(base2, "status", "--task-id", tid, "--wait", "5", "--stdout-offset", "6")
        self.assertLess(time.monotonic() - t0, 3)
        self.assert_copied_view(st)
        self.assertEqual(st["command"], "echo ready; sleep 60")
        st = self.cli_in(base2, "cancel", "--task-id", tid)
        self.assert_copied_view(st)
        self.assertFalse(st["signalled"])
        self.assertFalse(os.path.exists(os.path.join(base2, "tasks", tid, "cancel_requested")))

    def test_copied_finished_task_keeps_its_outcome(self):
        tid, _ = self.start("echo done; exit 7")
        done = self.wait_terminal(tid)
        self.assertEqual((done["state"], done["exit_code"]), ("failed", 7))
        base2 = self.copy_task(tid, origin={"pid_ns": 1, "boot_id": "another-boot"})
        st = self.cli_in(base2, "status", "--task-id", tid, "--stdout-offset", "0")
        self.assertEqual((st["state"], st["exit_code"], st["error"]), ("failed", 7, None))
        self.assertEqual(st["finished_at"], done["finished_at"])
        self.assertEqual(base64.b64decode(st["stdout_b64"]), b"done\n")
        listed = self.cli_in(base2, "list")["tasks"]
        self.assertEqual([(t["state"], t["exit_code"], t["error"]) for t in listed], [("failed", 7, None)])
        st = self.cli_in(base2, "cancel", "--task-id", tid)
        self.assertEqual((st["state"], st["exit_code"], st["signalled"]), ("failed", 7, False))
        tid, _ = self.start("true")
        self.assertEqual(self.wait_terminal(tid)["state"], "succeeded")
        base3 = self.copy_task(tid, origin={"boot_id": "another-boot"})
        st = self.cli_in(base3, "status", "--task-id", tid)
        self.assertEqual((st["state"], st["exit_code"]), ("succeeded", 0))

    def test_task_without_origin_behaves_as_before(self):
        # A task recorded by an older supervisor (no origin): only the pid and
        # its start time decide, as before (here they name the original live
        # daemon, so it reads running).
        tid, record = self.start_running()
        base2 = self.copy_task(tid, drop_origin=True)
        self.assertNotIn("origin", self.record_of(tid, base2))
        fake_boot = os.path.join(self.work, "boot_id")
        with open(fake_boot, "w") as f:
            f.write("11111111-2222-4333-8444-555555555555\n")
        st = self.cli_in(base2, "status", "--task-id", tid, identity={"BOOT_ID_PATH": fake_boot})
        self.assertEqual((st["state"], st["error"]), ("running", None))
        self.assertEqual(self.cli_in(base2, "list")["tasks"][0]["state"], "running")
        # An origin that is not an object is no origin either.
        path = os.path.join(base2, "tasks", tid, "status.json")
        copied = self.record_of(tid, base2)
        with open(path, "w") as f:
            json.dump(dict(copied, origin="elsewhere"), f)
        self.assertEqual(self.cli_in(base2, "status", "--task-id", tid)["state"], "running")
        # With its supervisor gone: unknown with the usual reason, not the copy's.
        with open(path, "w") as f:
            json.dump(dict(copied, supervisor_pid=2 ** 22 + 1), f)
        st = self.cli_in(base2, "status", "--task-id", tid)
        self.assertEqual(st["state"], "unknown")
        self.assertIn("supervisor process is gone", st["error"])
        self.assertNotIn(self.COPIED, st["error"])


def load_module():
    """Import supervisor.py itself (for the pure functions tested in-process)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sandbox_supervisor", SUPERVISOR)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fast_client():
    """The gateway's bash client of the fast path, as src/tasks/fast.rs embeds it."""
    with open(os.path.join(HERE, "..", "src", "tasks", "fast.rs")) as f:
        text = f.read()
    return text[text.index('r#"') + 3:text.index('"#;')]


class TaskHelpers:
    """The CLI helpers of SupervisorTestCase, for test classes of their own."""

    cli = SupervisorTestCase.cli
    status = SupervisorTestCase.status
    wait_terminal = SupervisorTestCase.wait_terminal
    read_all = SupervisorTestCase.read_all


class ForkServerTests(TaskHelpers, unittest.TestCase):
    """The fork server (`start --serve 1`, then `serve`) and the bash client."""

    def setUp(self):
        SupervisorTestCase.setUp(self)
        self.client = fast_client()
        self.program = ("import os, sys; sys.path.insert(0, %r); import supervisor; "
                        "rc = supervisor.main(sys.argv[1:]); sys.stdout.flush(); os._exit(rc)") % HERE

    def tearDown(self):
        pid = self.server_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        SupervisorTestCase.tearDown(self)

    def server_pid(self):
        try:
            with open(os.path.join(self.base, "server-%s.pid" % self.version())) as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def version(self):
        return self.cli("version", base=False)["version"]

    def via_client(self, *args, spec=None, served=False):
        """Runs the bash client as the gateway does; `served`: its python3
        fallback is a missing program, so only the task server can answer."""
        env = dict(self.env)
        env.pop("SANDBOX_MCP_TASK_SPEC", None)
        if spec is not None:
            env["SANDBOX_MCP_TASK_SPEC"] = base64.b64encode(json.dumps(spec).encode()).decode()
        argv = ["/bin/bash"] + (["-x"] if os.environ.get("CLIENT_TRACE") else []) + ["-c", self.client, "t", self.base, self.version(),
                "/nonexistent/python3" if served else sys.executable, "-I", "-S", "-c", self.program] \
            + list(args) + ["--base", self.base]
        # As envd starts it: stdin and stdout are pipes, stdin left open.
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env)
        out = p.stdout.read()
        err = p.stderr.read()
        rc = p.wait(timeout=30)
        p.stdin.close()
        p.stdout.close()
        p.stderr.close()
        lines = out.decode().splitlines()
        self.assertEqual(len(lines), 1, (out, err))
        return rc, json.loads(lines[0])

    def spec(self, command):
        return {"command": command, "cwd": None, "envs": {"MY_TOKEN": "tok-value-1"}, "timeout": 30}

    def wait_server(self):
        end = time.monotonic() + 5
        while time.monotonic() < end:
            pid = self.server_pid()
            if pid and not proc_gone(pid):
                return pid
            time.sleep(0.02)
        self.fail("no task server")

    def test_the_server_answers_as_the_supervisor_does(self):
        rc, first = self.via_client("start", "--task-id", new_id(), "--serve", "1",
                                    spec=self.spec("echo one $MY_TOKEN"))
        self.assertEqual((rc, first["state"]), (0, "running"))
        server = self.wait_server()
        tid = new_id()
        rc, second = self.via_client("start", "--task-id", tid, "--serve", "1",
                                     served=True, spec=self.spec("echo two $MY_TOKEN; env | grep -c SANDBOX_MCP_ || true"))
        self.assertEqual(rc, 0, second)
        self.assertEqual(set(second), set(first))
        self.assertEqual(self.server_pid(), server)
        st = self.wait_terminal(tid)
        data, _ = self.read_all(tid)
        self.assertEqual((st["state"], data), ("succeeded", b"two ***\n0\n"))
        # Refusals come back with their code and exit status.
        rc, again = self.via_client("start", "--task-id", tid, "--serve", "1", served=True, spec=self.spec("true"))
        self.assertEqual((rc, again["code"]), (2, "exists"))
        rc, bad = self.via_client("start", "--task-id", new_id(), "--serve", "1", served=True, spec={"command": 1})
        self.assertEqual((rc, bad["code"]), (2, "invalid"))
        # A cancel through the server (in a forked child).
        tid = new_id()
        self.via_client("start", "--task-id", tid, "--serve", "1", served=True, spec=self.spec("sleep 30"))
        rc, view = self.via_client("cancel", "--task-id", tid, "--wait", "3", served=True)
        self.assertEqual((rc, view["state"], view["cancel_confirmed"]), (0, "cancelled", True))
        # Nothing is left in the queue.
        self.assertEqual(os.listdir(os.path.join(self.base, "queue")), [])

    def test_the_server_serves_only_start_and_cancel_and_ignores_garbage(self):
        self.via_client("start", "--task-id", new_id(), "--serve", "1", spec=self.spec("true"))
        server = self.wait_server()
        fifo = os.path.join(self.base, "server-%s.fifo" % self.version())
        fd = os.open(fifo, os.O_WRONLY)
        # Not a pid; a pid that is not a waiting client (this test: its start time differs);
        # a path for a request file; an over-long line.
        os.write(fd, b"not-a-pid\n%d 1 9 start --task-id %s\n1 1 9 @\n../../x 1 9 @\n" % (os.getpid(), new_id().encode())
                 + b"x" * 5000 + b"\n")
        os.close(fd)
        rc, answer = self.via_client("list", served=True)
        self.assertEqual((rc, answer["code"]), (2, "invalid"))
        self.assertIn("only start and cancel", answer["error"])
        self.assertFalse(proc_gone(server), "garbage did not stop the server")
        # The start in the garbage (no spec, and a pid that is not its client) claimed nothing.
        self.assertEqual(len(self.cli("list")["tasks"]), 1)

    def test_a_long_request_goes_through_a_file(self):
        self.via_client("start", "--task-id", new_id(), "--serve", "1", spec=self.spec("true"))
        server = self.wait_server()
        tid = new_id()
        rc, view = self.via_client("start", "--task-id", tid, "--serve", "1", served=True,
                                   spec=self.spec("echo %s | wc -c" % ("y" * 20000)))
        self.assertEqual((rc, view["state"]), (0, "running"), view)
        self.assertEqual(self.server_pid(), server)
        st = self.wait_terminal(tid)
        data, _ = self.read_all(tid)
        self.assertEqual((st["state"], data), ("succeeded", b"20001\n"))
        self.assertEqual(os.listdir(os.path.join(self.base, "queue")), [])

    def children(self, parent):
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    stat = read_text("/proc/%s/stat" % name)
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[1]) == parent and fields[0] not in "ZXx":
                    found.append(int(name))
        return found

    def wait_spare(self, server, other_than=()):
        end = time.monotonic() + 5
        while time.monotonic() < end:
            spares = [pid for pid in self.children(server) if pid not in other_than]
            if spares:
                return spares
            time.sleep(0.02)
        self.fail("the server forked no spare daemon")

    def test_a_start_is_handed_to_the_spare_forked_before_it(self):
        self.via_client("start", "--task-id", new_id(), "--serve", "1", spec=self.spec("true"))
        server = self.wait_server()
        [spare] = self.wait_spare(server)
        self.assertNotEqual(os.getsid(spare), os.getsid(server))  # already in a session of its own
        # Forked from the first start, which had the spec in its environment: not in theirs.
        for pid in (server, spare):
            with open("/proc/%d/environ" % pid, "rb") as f:
                environ = f.read()
            self.assertIn(b"SANDBOX_MCP_TASK_SPEC=*", environ)
            self.assertNotIn(b"SANDBOX_MCP_TASK_SPEC=eyJ", environ)
        tid = new_id()
        rc, view = self.via_client("start", "--task-id", tid, "--serve", "1", served=True,
                                   spec=self.spec("echo $MY_TOKEN"))
        self.assertEqual((rc, view["state"]), (0, "running"), view)
        # Answered with the first record, before the command started.
        self.assertIsNone(view["pid"], view)
        self.assertIsNotNone(view["started_at"], view)
        record = json.loads(read_text(os.path.join(self.base, "tasks", tid, "status.json")))
        self.assertEqual(record["supervisor_pid"], spare)
        # The used spare is the task's daemon now; a new one waits for the next start.
        self.assertEqual(len(self.wait_spare(server, other_than=(spare,))), 1)
        st = self.wait_terminal(tid)
        data, _ = self.read_all(tid)
        self.assertEqual((st["state"], data), ("succeeded", b"***\n"))

    def test_the_task_limit_holds_through_the_server(self):
        self.via_client("start", "--task-id", new_id(), "--serve", "1", spec=self.spec("true"))
        server = self.wait_server()
        self.wait_spare(server)
        root = os.path.join(self.base, "tasks")
        while len(os.listdir(root)) < 127:
            os.mkdir(os.path.join(root, new_id()))
        last = new_id()
        rc, view = self.via_client("start", "--task-id", last, "--serve", "1", served=True,
                                   spec=self.spec("echo last"))
        self.assertEqual((rc, view["state"]), (0, "running"), view)  # the 128th, served
        tid = new_id()
        rc, refused = self.via_client("start", "--task-id", tid, "--serve", "1", served=True,
                                      spec=self.spec("echo no"))
        self.assertEqual((rc, refused["code"]), (2, "limit"), refused)
        self.assertFalse(os.path.exists(os.path.join(root, tid)))
        self.assertEqual(self.server_pid(), server)
        self.assertEqual(self.wait_terminal(last)["state"], "succeeded")

    def test_a_dead_spare_costs_a_fork_and_the_start_still_runs_once(self):
        self.via_client("start", "--task-id", new_id(), "--serve", "1", spec=self.spec("true"))
        server = self.wait_server()
        [spare] = self.wait_spare(server)
        os.kill(spare, signal.SIGKILL)
        self.assertTrue(wait_gone(spare))
        tid = new_id()
        marker = os.path.join(self.work, "runs")
        rc, view = self.via_client("start", "--task-id", tid, "--serve", "1", served=True,
                                   spec=self.spec("echo x >> %s" % marker))
        self.assertEqual((rc, view["state"]), (0, "running"), view)
        self.assertEqual(self.wait_terminal(tid)["state"], "succeeded")
        self.assertEqual(read_text(marker), "x\n")
        self.assertEqual(self.server_pid(), server)
        self.wait_spare(server)  # replaced

    def test_the_spare_ends_with_its_server(self):
        self.via_client("start", "--task-id", new_id(), "--serve", "1", spec=self.spec("true"))
        server = self.wait_server()
        [spare] = self.wait_spare(server)
        os.kill(server, signal.SIGKILL)
        self.assertTrue(wait_gone(spare), "the spare outlived its server")

    def test_an_idle_server_exits_and_so_does_one_whose_directory_is_gone(self):
        import importlib.util
        spec = importlib.util.spec_from_file_location("sup_for_idle", SUPERVISOR)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        t0 = time.monotonic()
        mod.serve(self.base, idle=0.3)
        self.assertLess(time.monotonic() - t0, 3.0)
        self.assertFalse(os.path.exists(os.path.join(self.base, "server-%s.pid" % mod.SUPERVISOR_VERSION)))
        # A started server exits when its pid file is no longer its own (checked when idle).
        self.via_client("start", "--task-id", new_id(), "--serve", "1", spec=self.spec("true"))
        server = self.wait_server()
        os.unlink(os.path.join(self.base, "server-%s.pid" % mod.SUPERVISOR_VERSION))
        self.assertTrue(wait_gone(server, mod.SERVER_CHECK + 3))


class ChannelTests(TaskHelpers, unittest.TestCase):
    """`channel`: the gateway's line channel (stdin requests, stdout answers)."""

    def setUp(self):
        SupervisorTestCase.setUp(self)
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", SUPERVISOR, "channel", "--base", self.base],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.cleanup_pids.append(self.proc.pid)
        self.hello = self.answer()

    def tearDown(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.stdout.close()
        self.proc.wait(timeout=10)
        SupervisorTestCase.tearDown(self)

    def answer(self):
        line = self.proc.stdout.readline()
        self.assertTrue(line.endswith(b"\n"), line)
        rid, rc, obj = line.decode().split(" ", 2)
        return int(rid), int(rc), json.loads(obj)

    def send(self, data):
        self.proc.stdin.write(data)

    def request(self, rid, tid, command, envs=None):
        spec = {"command": command, "cwd": None, "envs": envs or {}, "timeout": 30}
        b64 = base64.b64encode(json.dumps(spec).encode()).decode()
        self.send(b"%d start --task-id %s --serve 1 -- %s\n" % (rid, tid.encode(), b64.encode()))

    def spare_pid(self):
        """The channel's spare: its one child in its own session."""
        end = time.monotonic() + 5
        while time.monotonic() < end:
            with open("/proc/%d/task/%d/children" % (self.proc.pid, self.proc.pid)) as f:
                children = [int(c) for c in f.read().split()]
            if children:
                return children[0]
            time.sleep(0.01)
        self.fail("no spare")

    def test_it_greets_then_answers_starts_run_by_its_spare(self):
        self.assertEqual(self.hello, (0, 0, {"version": SupervisorTestCase.cli(self, "version", base=False)["version"],
                                             "pid": self.proc.pid}))
        spare = self.spare_pid()
        tid = new_id()
        self.request(7, tid, "echo hi $MY_TOKEN", {"MY_TOKEN": "tok-value-9"})
        rid, rc, obj = self.answer()
        self.assertEqual((rid, rc, obj["task_id"], obj["state"], obj["pid"]), (7, 0, tid, "running", None))
        with open(os.path.join(self.base, "tasks", tid, "status.json")) as f:
            self.assertEqual(json.load(f)["supervisor_pid"], spare)
        st = self.wait_terminal(tid)
        data, _ = self.read_all(tid)
        self.assertEqual((st["state"], data), ("succeeded", b"hi ***\n"))
        # A refusal keeps its code; the next spare takes the next start.
        self.request(8, tid, "echo again")
        self.assertEqual(self.answer()[:2], (8, 2))
        second = new_id()
        self.request(9, second, "echo two")
        rid, rc, obj = self.answer()
        self.assertEqual((rid, rc, obj["state"]), (9, 0, "running"))
        self.assertEqual(self.wait_terminal(second)["state"], "succeeded")
        self.assertEqual(self.read_all(second)[0], b"two\n")

    def test_other_lines_are_refused_or_ignored_and_long_ones_dropped(self):
        self.send(b"no id here\n\n5 status --task-id x\n")
        self.assertEqual(self.answer(), (5, 2, {"error": "the channel serves only start", "code": "invalid"}))
        self.send(b"6 start --task-id " + b"x" * (1 << 19) + b"\n")  # over the line limit: dropped
        tid = new_id()
        self.request(10, tid, "true")
        rid, rc, obj = self.answer()
        self.assertEqual((rid, rc, obj["task_id"]), (10, 0, tid))
        self.send(b"11 start --task-id %s --serve 1\n" % new_id().encode())
        self.assertEqual(self.answer()[:3], (11, 2, {"error": "the task server got a start without its spec",
                                                    "code": "invalid"}))

    def test_without_a_live_spare_a_start_still_runs_once(self):
        spare = self.spare_pid()
        os.kill(spare, signal.SIGKILL)
        wait_gone(spare)
        tid = new_id()
        self.request(1, tid, "echo once >> %s/ran" % self.work)
        rid, rc, obj = self.answer()
        self.assertEqual((rid, rc, obj["state"]), (1, 0, "running"), obj)
        self.assertEqual(self.wait_terminal(tid)["state"], "succeeded")
        self.assertEqual(read_text(os.path.join(self.work, "ran")), "once\n")

    def test_it_ends_with_its_stdin_and_so_does_its_spare(self):
        spare = self.spare_pid()
        self.proc.stdin.close()
        self.assertEqual(self.proc.wait(timeout=10), 0)
        self.assertTrue(wait_gone(spare), "the spare outlived its channel")


class PureFunctionTests(unittest.TestCase):
    """In-process checks of the JSON codec and the streaming masker."""

    @classmethod
    def setUpClass(cls):
        cls.sup = load_module()

    def test_json_codec_matches_json_module(self):
        objs = [
            {"a": None, "b": True, "c": False, "d": 0, "e": -12345678901234567890,
             "f": 1.5, "g": 1796044027.7744076, "h": 1e16, "i": "tab\t\"q\" \u00e9 \U0001f600 \x00",
             "j": [1, "x", {"k": []}], "k": {}, "l": [], "\u2603": "snow"},
            [], "plain", 3, 0.1,
        ]
        for obj in objs:
            text = self.sup.json_dumps(obj)
            self.assertEqual(text, json.dumps(obj, separators=(",", ":")))
            self.assertEqual(self.sup.json_loads(text), obj)
            self.assertEqual(self.sup.json_loads("  \n" + json.dumps(obj, indent=2) + "\n "), obj)
        for bad in ('{"state": "succ', "", "[1,]", '{"a":1} x', "{'a': 1}"):
            with self.assertRaises(ValueError, msg=bad):
                self.sup.json_loads(bad)
        with self.assertRaises(ValueError):
            self.sup.json_dumps(float("nan"))

    def test_masker_every_split_equals_whole_stream(self):
        import re
        secrets = [b"abcdef", b"abc123", b"cdefgh", b"zzzz"]
        masker = self.sup.Masker(secrets)
        pattern = re.compile(b"|".join(re.escape(v) for v in sorted(secrets, key=len, reverse=True)))
        streams = [
            b"xxabcdefyyabc123abcdefgh--zzzzzabcdeabc12cdefg",
            b"abcdef" * 5 + b"abcde",
            b"cdefghabcdefgh" + b"zz" + b"zz",
            b"no secrets here at all",
        ]
        for data in streams:
            expected = pattern.sub(b"***", data)
            for i in range(len(data) + 1):
                for j in range(i, len(data) + 1):
                    out, carry = b"", b""
                    for part in (data[:i], data[i:j], data[j:]):
                        o, carry = masker.feed(carry + part)
                        out += o
                    out += masker.flush(carry)
                    self.assertEqual(out, expected, (data, i, j))

    def test_shared_mask_vectors(self):
        """The vectors src/masking.rs also runs: whole stream and every two-way split agree."""
        with open(os.path.join(HERE, "testdata", "mask_vectors.json"), encoding="utf-8") as f:
            spec = json.load(f)
        self.assertEqual(spec["mask"].encode(), self.sup.MASK)
        self.assertEqual(spec["min_secret_len"], self.sup.MIN_SECRET_LEN)
        self.assertGreaterEqual(len(spec["vectors"]), 10)
        for v in spec["vectors"]:
            masker = self.sup.Masker([s.encode("utf-8") for s in v["secrets"]])
            data = v["input"].encode("utf-8")
            expected = v["output"].encode("utf-8")
            self.assertEqual(masker.flush(data), expected, v["name"])
            for i in range(len(data) + 1):
                out, carry = masker.feed(data[:i])
                out2, carry = masker.feed(carry + data[i:])
                self.assertEqual(out + out2 + masker.flush(carry), expected, (v["name"], i))

    def test_origin_comparison(self):
        sup = self.sup
        here = {"pid_ns": 10, "init_start": 20, "boot_id": "b"}
        saved = list(sup._identity)
        try:
            sup._identity[:] = [here]
            self.assertFalse(sup.origin_differs(dict(here)))
            for key, other in (("pid_ns", 11), ("init_start", 21), ("boot_id", "c")):
                self.assertTrue(sup.origin_differs(dict(here, **{key: other})), key)
                # A component missing, null or of another type on the record is not compared.
                self.assertFalse(sup.origin_differs({k: v for k, v in here.items() if k != key}), key)
                self.assertFalse(sup.origin_differs(dict(here, **{key: None})), key)
            self.assertFalse(sup.origin_differs(dict(here, pid_ns=True, boot_id=5)))
            for no_origin in (None, "elsewhere", [1], {}):
                self.assertFalse(sup.origin_differs(no_origin), no_origin)
            # Running or never recorded: copied; finished: its files are the truth.
            other = dict(here, boot_id="c")
            self.assertTrue(sup.copied_task({"state": "running", "origin": other}))
            self.assertTrue(sup.copied_task({"origin": other}))  # spec.json
            for state in sup.TERMINAL:
                self.assertFalse(sup.copied_task({"state": state, "origin": other}), state)
            # A component unreadable here is not compared.
            sup._identity[:] = [{"pid_ns": None, "init_start": None, "boot_id": "b"}]
            self.assertFalse(sup.origin_differs(dict(here, pid_ns=11, init_start=21)))
            self.assertTrue(sup.origin_differs(dict(here, boot_id="c")))
            sup._identity[:] = [None]  # nothing readable here: as before origins existed
            self.assertFalse(sup.origin_differs(dict(here, boot_id="c")))
        finally:
            sup._identity[:] = saved

    def test_secret_selection(self):
        old = dict(os.environ)
        try:
            os.environ["SANDBOX_API_KEY"] = "sandbox-value"
            os.environ["PLAIN"] = "plain-value"
            values = self.sup.secret_values({
                "my_token": "tok-value", "GH_PASSWORD": "pw-value", "SECRET": "abc",
                "TOKENIZERS_PARALLELISM": "false", "GREETING": "hello-value",
                "MONKEY": "banana-value"})
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.assertIn(b"sandbox-value", values)
        self.assertIn(b"tok-value", values)
        self.assertIn(b"pw-value", values)
        self.assertIn(b"banana-value", values)   # MONKEY contains KEY: masked (documented)
        self.assertNotIn(b"abc", values)         # shorter than 4 bytes
        self.assertNotIn(b"false", values)       # boolean flag value
        self.assertNotIn(b"hello-value", values)
        self.assertNotIn(b"plain-value", values)


if __name__ == "__main__":
    unittest.main()
