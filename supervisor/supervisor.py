#!/usr/bin/env python3
"""sandbox-mcp task supervisor: the in-sandbox half of reconnectable tasks.

The gateway installs this single file in the sandbox (as the sandbox user) and
runs it once per tool call, e.g. ``python3 -I -S supervisor.py status ...``.
Every invocation prints exactly ONE JSON object on one line of stdout and
exits (0 on success, 2 on a refusal or error, which is printed as
``{"error": "<sentence>", "code": "<code>"}``).

This file owns, for every task, the directory ``BASE/tasks/<task_id>/``:

  spec.json        written once by ``start``: command, cwd, timeout, the NAMES
                   of the task's environment variables (never their values),
                   creation time.
  status.json      written only by the task's supervisor daemon, atomically
                   (temp file, fsync, rename): state, pids, process group,
                   times, exit code / signal, byte counts, truncation flags,
                   and the identity of the sandbox instance it runs in (so a
                   copy of the directory in another sandbox reads `unknown`).
  stdout, stderr   the first 1 MiB of each stream AFTER masking; append-only,
                   so a page read at the same offsets always returns the same
                   bytes.
  cancel_requested marker created by ``cancel`` (the daemon checks it).

Subcommands (details in supervisor/README.md):

  version
  start  --task-id ID          (the spec, base64 JSON, on one line of stdin)
  status --task-id ID [--stdout-offset N] [--stderr-offset N] [--limit L] [--wait S]
         [--wait-stdout-offset N] [--wait-stderr-offset N]
  cancel --task-id ID [same paging args] [--wait S (default 3)]
  list
  channel                      (the gateway's long-lived line channel for starts)
  (all accept --base DIR, default: the directory of this script)

``start`` claims the directory with mkdir (so a resubmitted start never runs
the command twice), then double-forks a daemon in a new session. The daemon
runs ``/bin/bash -c COMMAND`` in a new process group (not a new session),
drains both pipes continuously, masks secrets in the stored prefix, enforces
the timeout (TERM the group, 2 s grace, KILL), handles cancel requests
(SIGUSR1), and when the command ends SIGKILLs whatever is left of the task's
process group. A process that moves itself to another session or process
group (setsid, setpgid) escapes that cleanup; only killing the sandbox is
complete cleanup.

Python standard library only; runs on python3 >= 3.8; Linux only (/proc).
Imports are kept minimal because the gateway runs ``status`` on every
get_task call and interpreter start-up dominates its latency.
"""

SUPERVISOR_VERSION = "9"

import os
import sys
import time

try:
    # The C accelerator behind the json module, without json's own imports
    # (json pulls in re, enum, functools, collections: a large share of the
    # start-up time of `status`). Falls back to json if it is unavailable.
    import _json
except ImportError:  # pragma: no cover
    _json = None

# --- constants --------------------------------------------------------------

STREAM_LIMIT = 1 << 20       # bytes of each (masked) stream kept on disk
MAX_TASKS = 128              # task directories per base directory
GRACE_SECONDS = 2.0          # TERM -> KILL grace (timeout, cancel)
# After the command ended and its group was killed, the pipes are read to
# EOF. Only a process that escaped the group (setsid) can keep them open: stop
# reading once they have been idle this long, or at the latest after
# DRAIN_MAX seconds.
DRAIN_IDLE = 0.5
DRAIN_MAX = 5.0
PROGRESS_INTERVAL = 1.0      # running status.json refresh (byte totals)
START_WAIT = 5.0             # how long `start` waits for status.json
# The spec of `start` arrives on stdin, never in argv (a process's argv is
# readable by every user of the machine, the sandbox's host included):
# at most SPEC_MAX_BYTES, within SPEC_WAIT seconds.
SPEC_MAX_BYTES = 1 << 18
SPEC_WAIT = 10.0
READ_CHUNK = 1 << 20         # pipe read size once the stored prefix is full
STORE_CHUNK = 1 << 18        # read size while storing (bounds masking buffers)
PIPE_SIZE = 1 << 20          # requested pipe capacity (F_SETPIPE_SZ)
DEFAULT_LIMIT = 16384
MAX_LIMIT = 1 << 20
MAX_WAIT = 30.0
DEFAULT_TIMEOUT = 300

# Secret masking: env var NAMES containing one of these (case-insensitive)
# mark their VALUES as secret.
SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
# Values shorter than this are not masked: masking "1", "ab" or "yes" would
# mangle ordinary output while protecting nothing worth protecting.
MIN_SECRET_LEN = 4
# Obvious non-secret flag values (compared case-insensitively) that a
# secret-looking name may carry, e.g. TOKENIZERS_PARALLELISM=false; masking
# them would replace every "false"/"true" in the output.
NON_SECRET_VALUES = (b"true", b"false", b"none", b"null")
MASK = b"***"

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")

# The identity of the sandbox instance a task was started in (its "origin",
# recorded in spec.json and status.json). A sandbox made from a copy of another
# one's files (a filesystem snapshot or fork) has the task's directory but not
# its processes, and a pid recorded there may name an unrelated process here.
# Each component is compared only when it is known on both sides:
#   pid_ns      inode of the PID namespace (the local provider gives every
#               sandbox, forks included, its own; E2B runs all in the init one)
#   init_start  start time of PID 1 of that namespace (tells a new namespace
#               apart even when the kernel reuses a freed namespace's inode)
#   boot_id     the kernel's boot id (E2B: a cold-booted copy has a new one;
#               the local provider's sandboxes share the host's)
# Module-level so tests can point them at files of their own.
PID_NS_PATH = "/proc/self/ns/pid"
INIT_STAT_PATH = "/proc/1/stat"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

COPIED_ERROR = ("this task was copied from another sandbox (a snapshot or fork) without its "
                "process; its outcome is unknown here (the sandbox it was started in has it, "
                "if that sandbox still exists)")


CLI_OPTIONS = {
    "version": ("base",),
    "start": ("task-id", "base", "serve"),
    "status": ("task-id", "stdout-offset", "stderr-offset", "limit", "wait",
               "wait-stdout-offset", "wait-stderr-offset", "base"),
    "cancel": ("task-id", "stdout-offset", "stderr-offset", "limit", "wait", "base"),
    "list": ("base",),
    "channel": ("base",),
}


class CliError(Exception):
    """A refusal or error reported as {"error", "code"} with exit status 2."""

    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code
        self.message = message


# --- minimal JSON codec -----------------------------------------------------

def _encode(obj, out):
    if obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, str):
        out.append(_json.encode_basestring_ascii(obj))
    elif isinstance(obj, int):
        out.append(int.__repr__(obj))
    elif isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            raise ValueError("non-finite float")
        out.append(float.__repr__(obj))
    elif isinstance(obj, dict):
        out.append("{")
        first = True
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError("JSON object keys must be strings")
            if not first:
                out.append(",")
            first = False
            out.append(_json.encode_basestring_ascii(k))
            out.append(":")
            _encode(v, out)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _encode(v, out)
        out.append("]")
    else:
        raise TypeError("cannot encode %s as JSON" % type(obj).__name__)


def json_dumps(obj):
    """Compact, ASCII-only JSON (same output as json.dumps(obj, separators=(",", ":")))."""
    if _json is None:
        import json
        return json.dumps(obj, separators=(",", ":"))
    out = []
    _encode(obj, out)
    return "".join(out)


class _ScanContext:
    # The attributes _json.make_scanner reads (those of json.JSONDecoder).
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity, -Infinity, as json accepts them
    memo = None


_scanner = None


def json_loads(text):
    """Parse one JSON value; raises ValueError on malformed input."""
    global _scanner
    if _json is None:
        import json
        return json.loads(text)
    if _scanner is None:
        _scanner = _json.make_scanner(_ScanContext())
    ws = " \t\n\r"
    start = len(text) - len(text.lstrip(ws))
    try:
        obj, end = _scanner(text, start)
    except Exception:
        # Malformed input. (On some versions the C scanner cannot build its
        # error without json.decoder loaded.) Let json produce the ValueError.
        import json
        return json.loads(text)
    if text[end:].strip(ws):
        raise ValueError("extra data after JSON value")
    return obj


def emit(obj):
    sys.stdout.write(json_dumps(obj) + "\n")
    sys.stdout.flush()


def parse_args(argv):
    """Parse ``SUBCOMMAND [--opt VALUE | --opt=VALUE]...`` (no argparse: start-up cost)."""
    if not argv:
        raise CliError("invalid", "missing subcommand (version, start, status, cancel, list)")
    cmd = argv[0]
    if cmd not in CLI_OPTIONS:
        raise CliError("invalid", "unknown subcommand %r (version, start, status, cancel, list)" % cmd)
    allowed = CLI_OPTIONS[cmd]
    opts = {}
    i = 1
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise CliError("invalid", "unexpected argument %r" % arg)
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise CliError("invalid", "option --%s needs a value" % name)
            i += 1
            value = argv[i]
        if name not in allowed:
            raise CliError("invalid", "unknown option --%s for %s" % (name, cmd))
        if name in opts:
            raise CliError("invalid", "option --%s given twice" % name)
        opts[name] = value
        i += 1
    return cmd, opts


def opt_int(opts, name, default, lo, hi):
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise CliError("invalid", "--%s must be an integer" % name)
    if v < lo or v > hi:
        raise CliError("invalid", "--%s must be between %d and %d" % (name, lo, hi))
    return v


def opt_float(opts, name, default, lo, hi):
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise CliError("invalid", "--%s must be a number" % name)
    if not (lo <= v <= hi):  # also rejects NaN
        raise CliError("invalid", "--%s must be between %g and %g" % (name, lo, hi))
    return v


def check_task_id(opts):
    tid = opts.get("task-id")
    if tid is None:
        raise CliError("invalid", "--task-id is required")
    if not is_task_id(tid):
        raise CliError("invalid", "task id must be 32 lowercase hex characters")
    return tid


def is_task_id(name):
    return len(name) == 32 and not name.strip("0123456789abcdef")


def ensure_private_dir(path):
    """Create `path` with mode 0700, or tighten it to 0700 if it is wider."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.stat(path)
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, 0o700)


def tasks_root(opts):
    base = opts.get("base")
    if not base:
        # The directory this script is installed in: the gateway reads task
        # files beside its supervisor.py directly, whatever HOME says.
        base = os.path.dirname(os.path.abspath(__file__))
    base = os.path.abspath(base)
    try:
        ensure_private_dir(base)
        root = os.path.join(base, "tasks")
        ensure_private_dir(root)
    except OSError as e:
        raise CliError("io", "cannot use base directory %s: %s" % (base, e.strerror or e))
    return root


def read_json(path):
    """Parsed JSON object at `path`, or None if missing/unreadable/unparseable."""
    try:
        with open(path, "rb") as f:
            obj = json_loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def write_json_atomic(path, obj, sync=True):
    """Write temp file in the same directory, fsync, rename over `path`."""
    tmp = "%s.tmp%d" % (path, os.getpid())
    data = json_dumps(obj).encode("ascii")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if sync:
        try:
            dfd = os.open(os.path.dirname(path), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def proc_stat(pid):
    """(state, pgrp, session, starttime) from /proc/PID/stat, or None if no such process."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    return read_stat("/proc/%d/stat" % pid)


def read_stat(path):
    """(state, pgrp, session, starttime) from a /proc/PID/stat file, or None."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and ')': split after the LAST ')'.
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        # rest[0] is field 3 (state); field N is rest[N - 3].
        return (rest[0].decode("ascii", "replace"), int(rest[2]), int(rest[3]), int(rest[19]))
    except (IndexError, ValueError):
        return None


def proc_start_time(pid):
    st = proc_stat(pid)
    return st[3] if st else None


def process_alive(pid, start_time):
    """True if `pid` runs, is not a zombie, and started at `start_time` (same process)."""
    st = proc_stat(pid)
    return bool(st) and st[3] == start_time and st[0] not in ("Z", "X", "x")


_identity = []  # this invocation's sandbox_identity(), computed once


def sandbox_identity():
    """This sandbox instance's identity {"pid_ns", "init_start", "boot_id"}, a
    component None where unreadable; None if no component is readable."""
    if not _identity:
        try:
            pid_ns = os.stat(PID_NS_PATH).st_ino
        except OSError:
            pid_ns = None
        init = read_stat(INIT_STAT_PATH)
        boot_id = None
        try:
            with open(BOOT_ID_PATH, "rb") as f:
                raw = f.read(128).strip().decode("ascii")
            if 0 < len(raw) <= 64:
                boot_id = raw
        except (OSError, UnicodeDecodeError):
            pass
        ident = {"pid_ns": pid_ns, "init_start": init[3] if init else None, "boot_id": boot_id}
        _identity.append(ident if any(v is not None for v in ident.values()) else None)
    return _identity[0]


def origin_differs(origin):
    """True if a recorded origin names another sandbox instance than this one:
    some component known on both sides differs. No origin (a task started by
    an older supervisor, or nothing was readable) never differs."""
    if not isinstance(origin, dict):
        return False
    here = sandbox_identity()
    if here is None:
        return False
    for key, kind in (("pid_ns", int), ("init_start", int), ("boot_id", str)):
        theirs, ours = origin.get(key), here[key]
        if (ours is not None and isinstance(theirs, kind) and not isinstance(theirs, bool)
                and theirs != ours):
            return True
    return False


def copied_task(record):
    """True for a task not recorded as finished whose record (status.json, or
    spec.json before that) comes from another sandbox instance: its processes
    are not here, and its pids may name unrelated processes of this sandbox."""
    return record.get("state") not in TERMINAL and origin_differs(record.get("origin"))


# --- reading a task's state (status, cancel, list) ---------------------------

def load_task(tdir, tid):
    """Return (record, state, error) for the task directory `tdir`.

    record is status.json (or spec.json if there is no status yet, or {}).
    The `unknown` rule: no parseable status.json, or a status that says
    running while its supervisor process is gone (pid missing, zombie, or a
    different /proc start time), or a task not recorded as finished that was
    copied from another sandbox instance (its recorded origin differs: its
    pids are never looked up here). Success is only ever what the daemon wrote.
    """
    path = os.path.join(tdir, "status.json")
    status = read_json(path)
    if status is None or status.get("state") not in TERMINAL + ("running",):
        spec = read_json(os.path.join(tdir, "spec.json")) or {}
        if copied_task(spec):
            err = COPIED_ERROR
        elif os.path.exists(path):
            err = "the task's status file is unreadable; its outcome is not recorded"
        else:
            err = ("no status recorded yet: the task may still be starting, or its "
                   "supervisor failed before recording anything")
        return spec, "unknown", err
    state = status["state"]
    if state == "running" and copied_task(status):
        return status, "unknown", COPIED_ERROR
    if state == "running" and not process_alive(status.get("supervisor_pid"),
                                                status.get("supervisor_start_time")):
        # The daemon may have written its final status and exited between our
        # read and the /proc check: read again before declaring it unknown.
        again = read_json(path)
        if again is not None and again.get("state") in TERMINAL:
            return again, again["state"], again.get("error")
        return status, "unknown", ("the task's supervisor process is gone; the task's "
                                   "outcome was not recorded (the sandbox may have been "
                                   "restarted, or the supervisor was killed)")
    return status, state, status.get("error")


def read_page(tdir, name, offset, limit):
    """(bytes [offset, offset+limit) of the stored stream, stored size)."""
    try:
        fd = os.open(os.path.join(tdir, name), os.O_RDONLY)
    except OSError:
        return b"", 0
    try:
        size = os.fstat(fd).st_size
        if offset >= size or limit <= 0:
            return b"", size
        data = os.pread(fd, min(limit, size - offset), offset)
        return data, max(size, offset + len(data))
    finally:
        os.close(fd)


def b64(data):
    import binascii
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def status_view(tdir, tid, record, state, error, out_off=0, err_off=0, limit=0):
    """The JSON object printed by status/start/cancel (`tdir` None: a task
    whose command has not started, so its streams are empty and not read)."""
    if tdir is None:
        (out_page, out_size), (err_page, err_size) = (b"", 0), (b"", 0)
    else:
        out_page, out_size = read_page(tdir, "stdout", out_off, limit)
        err_page, err_size = read_page(tdir, "stderr", err_off, limit)
    r = record
    out_total = r.get("stdout_total_bytes")
    err_total = r.get("stderr_total_bytes")
    # While running, totals in status.json are refreshed about once a second:
    # they are lower bounds (masking never lengthens, so total >= stored).
    out_total = max(out_total if isinstance(out_total, int) else 0, out_size)
    err_total = max(err_total if isinstance(err_total, int) else 0, err_size)
    return {
        "task_id": tid,
        "state": state,
        "exit_code": r.get("exit_code") if state in TERMINAL else None,
        "signal": r.get("signal") if state in TERMINAL else None,
        "started_at": r.get("started_at"),
        "finished_at": r.get("finished_at") if state in TERMINAL else None,
        "error": error,
        "stdout_b64": b64(out_page),
        "stderr_b64": b64(err_page),
        "stdout_next_offset": out_off + len(out_page),
        "stderr_next_offset": err_off + len(err_page),
        "stdout_size": out_size,
        "stderr_size": err_size,
        "stdout_total_bytes": out_total,
        "stderr_total_bytes": err_total,
        "stdout_truncated": bool(r.get("stdout_truncated")),
        "stderr_truncated": bool(r.get("stderr_truncated")),
        "command": r.get("command"),
        "timeout": r.get("timeout"),
        "cwd": r.get("cwd"),
        "created_at": r.get("created_at"),
        "pid": r.get("pid"),
        "pgid": r.get("pgid"),
    }


def existing_task_dir(opts):
    tid = check_task_id(opts)
    tdir = os.path.join(tasks_root(opts), tid)
    if not os.path.isdir(tdir):
        raise CliError("not_found", "task %s not found in this sandbox" % tid)
    return tid, tdir


def paging(opts):
    return (opt_int(opts, "stdout-offset", 0, 0, 1 << 62),
            opt_int(opts, "stderr-offset", 0, 0, 1 << 62),
            opt_int(opts, "limit", DEFAULT_LIMIT, 0, MAX_LIMIT))


def file_size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def file_key(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def wait_for_change(tdir, tid, state, record, out_off, err_off, seconds):
    """Block until stored output exists past an offset, the state changes, or timeout."""
    if seconds <= 0 or state in TERMINAL:
        return
    status_path = os.path.join(tdir, "status.json")
    if state == "unknown" and (os.path.exists(status_path) or copied_task(record)):
        return  # supervisor gone, or copied from another sandbox: nothing will change
    out_path = os.path.join(tdir, "stdout")
    err_path = os.path.join(tdir, "stderr")
    key = file_key(status_path)
    deadline = time.monotonic() + seconds
    n = 0
    while True:
        if file_size(out_path) > out_off or file_size(err_path) > err_off:
            return
        k = file_key(status_path)
        if k != key:
            key = k
            if load_task(tdir, tid)[1] != state:
                return
        n += 1
        if state == "running" and n % 8 == 0 and not process_alive(
                record.get("supervisor_pid"), record.get("supervisor_start_time")):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.025, left))


# --- subcommands: status, list ----------------------------------------------

def cmd_status(opts):
    tid, tdir = existing_task_dir(opts)
    out_off, err_off, limit = paging(opts)
    wait = opt_float(opts, "wait", 0.0, 0.0, MAX_WAIT)
    record, state, error = load_task(tdir, tid)
    if wait > 0:
        # The wait watches for output past the caller's own offsets, which may
        # differ from the page's (the gateway reads a wider page to mask
        # secrets that straddle its edges).
        wait_out = opt_int(opts, "wait-stdout-offset", out_off, 0, 1 << 62)
        wait_err = opt_int(opts, "wait-stderr-offset", err_off, 0, 1 << 62)
        wait_for_change(tdir, tid, state, record, wait_out, wait_err, wait)
        record, state, error = load_task(tdir, tid)
    return status_view(tdir, tid, record, state, error, out_off, err_off, limit)


def cmd_list(opts):
    root = tasks_root(opts)
    tasks = []
    with os.scandir(root) as it:
        for entry in it:
            if not (is_task_id(entry.name) and entry.is_dir(follow_symlinks=False)):
                continue
            record, state, error = load_task(entry.path, entry.name)
            command = record.get("command")
            first = command.split("\n", 1)[0][:200] if isinstance(command, str) else None
            tasks.append({
                "task_id": entry.name,
                "state": state,
                "started_at": record.get("started_at"),
                "finished_at": record.get("finished_at") if state in TERMINAL else None,
                "exit_code": record.get("exit_code") if state in TERMINAL else None,
                "created_at": record.get("created_at"),
                "command_first_line": first,
                "error": error,
            })

    def key(t):
        s = t["started_at"]
        if not isinstance(s, (int, float)):
            s = t["created_at"] if isinstance(t["created_at"], (int, float)) else 0.0
        return (s, t["task_id"])

    tasks.sort(key=key)
    return {"tasks": tasks}


# --- cancel -----------------------------------------------------------------

def signal_verified_process(pid, start_time, sig):
    """Send `sig` to `pid` only if it is still the process that started at `start_time`.

    Uses a pidfd when available (no pid-reuse race between check and kill).
    Returns True if the signal was sent.
    """
    if hasattr(os, "pidfd_open"):
        try:
            pfd = os.pidfd_open(pid)
        except OSError:
            pfd = None
        if pfd is not None:
            try:
                if not process_alive(pid, start_time):
                    return False
                signal = signal_module()
                signal.pidfd_send_signal(pfd, sig)
                return True
            except OSError:
                return False
            finally:
                os.close(pfd)
    if not process_alive(pid, start_time):
        return False
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def group_verified(record):
    """True if the task's process group still exists and is provably the task's.

    Either its leader (the recorded pid == pgid) is alive with the recorded
    start time, or (leader gone) some process is in that group AND in the
    supervisor's session and started no earlier than the leader. The kernel
    never reuses a pid number while it names a live process group or session,
    so this cannot match an unrelated group.
    """
    pgid, start, sid = record.get("pgid"), record.get("pid_start_time"), record.get("sid")
    if not isinstance(pgid, int) or pgid <= 1 or not isinstance(start, int):
        return False
    leader = proc_stat(pgid)
    if leader and leader[3] == start and leader[1] == pgid:
        return True
    if not isinstance(sid, int):
        return False
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st and st[1] == pgid and st[2] == sid and st[3] >= start:
                return True
    return False


def kill_group_if_verified(record, sig):
    if not group_verified(record):
        return False
    try:
        os.killpg(record["pgid"], sig)
        return True
    except OSError:
        return False


def cmd_cancel(opts):
    signal = signal_module()
    tid, tdir = existing_task_dir(opts)
    out_off, err_off, limit = paging(opts)
    wait = opt_float(opts, "wait", 3.0, 0.0, MAX_WAIT)
    record, state, error = load_task(tdir, tid)
    signalled = False
    # A task copied from another sandbox is left alone: its recorded pids are
    # another PID namespace's (here they may name unrelated processes), and no
    # daemon here would ever read a marker.
    if state not in TERMINAL and not copied_task(record):
        # The marker also covers a daemon that has not recorded its start yet:
        # it checks for the marker right after recording `running`.
        try:
            fd = os.open(os.path.join(tdir, "cancel_requested"), os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, ("%.6f\n" % time.time()).encode())
            os.close(fd)
        except OSError:
            pass
        deadline = time.monotonic() + wait
        if state == "running":
            signalled = signal_verified_process(record.get("supervisor_pid"),
                                                record.get("supervisor_start_time"), signal.SIGUSR1)
        elif state == "unknown" and record.get("state") == "running":
            # The daemon is gone but the task may not be: TERM, grace, KILL its
            # verified group ourselves. Nothing is recorded: we cannot observe
            # the exit status, so the state stays `unknown`.
            if kill_group_if_verified(record, signal.SIGTERM):
                signalled = True
                end = time.monotonic() + GRACE_SECONDS
                while time.monotonic() < end and group_verified(record):
                    time.sleep(0.05)
                kill_group_if_verified(record, signal.SIGKILL)
        # Wait for the daemon to record a terminal state.
        while True:
            record, state, error = load_task(tdir, tid)
            if state in TERMINAL or time.monotonic() >= deadline:
                break
            if state == "unknown" and record.get("state") == "running":
                break  # no daemon left to record anything
            time.sleep(0.002)  # a task obeying TERM ends within a few ms
        if state == "unknown" and signalled and record.get("state") == "running":
            error = ("the task's supervisor is gone, so no outcome can be recorded; its "
                     "process group was sent TERM then KILL. The task is not confirmed "
                     "cancelled.")
    view = status_view(tdir, tid, record, state, error, out_off, err_off, limit)
    view["cancel_confirmed"] = state == "cancelled"
    view["signalled"] = signalled
    return view


# --- start --------------------------------------------------------------------

def read_spec_stdin():
    """The spec line of `start` from stdin (ended by a newline or EOF), as text."""
    import select
    deadline = time.monotonic() + SPEC_WAIT
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CliError("invalid", "no task spec arrived on stdin within %g s" % SPEC_WAIT)
        try:
            if not select.select([0], [], [], left)[0]:
                continue
            chunk = os.read(0, 65536)
        except (OSError, ValueError) as e:
            raise CliError("invalid", "cannot read the task spec from stdin: %s"
                                      % (getattr(e, "strerror", None) or e))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if b"\n" in chunk:
            break
        if size > SPEC_MAX_BYTES:
            break
    data = b"".join(chunks).split(b"\n", 1)[0]
    if len(data) > SPEC_MAX_BYTES:
        raise CliError("invalid", "the task spec on stdin is longer than %d bytes" % SPEC_MAX_BYTES)
    if not data.strip():
        raise CliError("invalid", "start needs the task spec on stdin (one line of base64 JSON)")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise CliError("invalid", "the task spec on stdin is not standard base64")


def decode_spec(raw):
    import binascii
    raw = raw.strip()
    # Canonical standard base64 only: decoding is lenient (it skips foreign
    # characters), so re-encode and compare. (No `re`: importing it costs
    # about a quarter of this call's start-up.)
    try:
        data = binascii.a2b_base64(raw)
        canonical = binascii.b2a_base64(data, newline=False).decode("ascii") == raw
    except (ValueError, binascii.Error):
        canonical = False
    if not canonical:
        raise CliError("invalid", "the task spec is not standard base64")
    try:
        spec = json_loads(data.decode("utf-8"))
    except ValueError:
        raise CliError("invalid", "the task spec does not decode to UTF-8 JSON")
    if not isinstance(spec, dict):
        raise CliError("invalid", "the task spec must be a JSON object")
    command = spec.get("command")
    if not isinstance(command, str):
        raise CliError("invalid", "spec.command must be a string")
    if "\0" in command:
        raise CliError("invalid", "spec.command must not contain NUL characters")
    cwd = spec.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd or "\0" in cwd):
        raise CliError("invalid", "spec.cwd must be a non-empty string or null")
    envs = spec.get("envs")
    if envs is None:
        envs = {}
    if not isinstance(envs, dict):
        raise CliError("invalid", "spec.envs must be an object of strings")
    for k, v in envs.items():
        if not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v:
            raise CliError("invalid", "spec.envs: invalid variable %r (names must be non-empty "
                                      "without '=' or NUL; values strings without NUL)" % k)
    timeout = spec.get("timeout", DEFAULT_TIMEOUT)
    if timeout is None:
        timeout = DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (0 < timeout <= 1e7):
        raise CliError("invalid", "spec.timeout must be a positive number of seconds")
    return command, cwd, envs, timeout


def prepare_start(opts, raw_spec=None, files=True):
    """Checks a start and claims its task directory, with its files (spec.json,
    empty streams) unless `files` is false (the task server's spare writes them
    once its first record is saved). Returns what the daemon needs: (tid,
    tdir, spec_record, cwd, envs, umask)."""
    tid = check_task_id(opts)
    if raw_spec is None:
        if opts.get("server"):
            raise CliError("invalid", "the task server got a start without its spec")
        raw_spec = _spec_from_env[0] if _spec_from_env else read_spec_stdin()
    command, cwd, envs, timeout = decode_spec(raw_spec)
    root = tasks_root(opts)
    tdir = os.path.join(root, tid)
    if os.path.lexists(tdir):
        raise CliError("exists", "task %s already exists in this sandbox; it was not started "
                                 "again (use get_task to read it)" % tid)
    count = 0
    with os.scandir(root) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                count += 1
    if count >= MAX_TASKS:
        raise CliError("limit", "this sandbox already has %d task directories (the maximum); "
                                "delete old tasks under %s or use a new sandbox" % (count, root))
    if cwd is None:
        home = os.environ.get("HOME") or "/"
        cwd_run = home if os.path.isdir(home) else "/"
    else:
        if not os.path.isdir(cwd):
            raise CliError("invalid", "cwd %s is not a directory" % cwd)
        cwd_run = os.path.abspath(cwd)  # the daemon itself runs in /
    try:
        os.mkdir(tdir, 0o700)  # the atomic claim
    except FileExistsError:
        raise CliError("exists", "task %s already exists in this sandbox; it was not started "
                                 "again (use get_task to read it)" % tid)
    except OSError as e:
        raise CliError("io", "cannot create task directory: %s" % (e.strerror or e))
    created_at = time.time()
    spec_record = {
        "task_id": tid, "command": command, "cwd": cwd, "timeout": timeout,
        "env_names": sorted(envs), "created_at": created_at,
        "origin": sandbox_identity(),
        "supervisor_version": SUPERVISOR_VERSION,
    }
    old_umask = os.umask(0o077)
    try:
        if files:
            write_task_files(tdir, spec_record)
    finally:
        os.umask(old_umask)
    return tid, tdir, spec_record, cwd_run, envs, old_umask


def write_task_files(tdir, spec_record):
    """spec.json and the two empty streams of a claimed task (CliError "io")."""
    try:
        # Atomic but not fsynced: spec.json only describes a task whose
        # status.json is missing; the record that decides outcomes is
        # status.json, whose outcomes are always fsynced.
        write_json_atomic(os.path.join(tdir, "spec.json"), spec_record, sync=False)
        for name in ("stdout", "stderr"):
            os.close(os.open(os.path.join(tdir, name), os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as e:
        raise CliError("io", "cannot write task files: %s" % (e.strerror or e))


def cmd_start(opts, raw_spec=None):
    """Claims, launches and reports a task. `raw_spec`: the base64 spec line
    (else it comes from the environment or stdin)."""
    return launch_and_wait(*prepare_start(opts, raw_spec))


def launch_and_wait(tid, tdir, spec_record, cwd_run, envs, old_umask):
    """Forks a claimed task's detached daemon (what `prepare_start` returned,
    its files written) and reports the task once its first record is saved."""
    status_path = os.path.join(tdir, "status.json")
    sys.stdout.flush()
    sys.stderr.flush()
    launch_error = None
    # The daemon closes its end of this pipe once status.json exists (or it
    # dies): waiting for EOF replaces polling for the file.
    try:
        ready_r, ready_w = os.pipe()
        if ready_w <= 2:  # the caller closed stdio: keep it simple, poll instead
            os.close(ready_r)
            os.close(ready_w)
            ready_r = ready_w = None
    except OSError:
        ready_r = ready_w = None
    try:
        if not fork_detached(lambda: daemon_main(tdir, tid, spec_record, cwd_run, envs, old_umask, ready_w)):
            launch_error = "the supervisor daemon could not be forked"
    except OSError as e:
        launch_error = e.strerror or str(e)
    if ready_w is not None:
        os.close(ready_w)
    if launch_error is not None:
        # No daemon was ever created, so this process is the only possible
        # writer of status.json: record the failure (the command never ran).
        write_json_atomic(status_path, dict(
            spec_record, state="failed", started_at=None, finished_at=time.time(),
            exit_code=None, signal=None, pid=None, pgid=None,
            error="could not launch the task supervisor: %s" % launch_error))
    deadline = time.monotonic() + START_WAIT
    if ready_r is not None:
        import select
        try:
            while launch_error is None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([ready_r], [], [], left)[0]:
                    break
                if not os.read(ready_r, 64):
                    break  # EOF: status.json is written, or the daemon is gone
        except OSError:
            pass
        os.close(ready_r)
    else:
        while not os.path.exists(status_path) and time.monotonic() < deadline:
            time.sleep(0.005)
    record, state, error = load_task(tdir, tid)
    if state == "unknown" and record.get("state") is None:
        error = ("the supervisor did not record the task's start within %g s; inspect it "
                 "with get_task instead of starting it again" % START_WAIT)
    return status_view(tdir, tid, record, state, error)


# --- the daemon ---------------------------------------------------------------

def fork_detached(child):
    """Runs `child` (which never returns) in a grandchild in a new session: the
    intermediate child exits at once, so the grandchild is re-parented away
    from this process. True if it was forked; OSError if no fork was possible."""
    pid = os.fork()
    if pid == 0:
        code = 1  # tells the parent that no grandchild exists
        try:
            os.setsid()
            if os.fork() == 0:
                child()
            code = 0
        finally:
            os._exit(code)
    _, wst = os.waitpid(pid, 0)
    return wst == 0


def detach_descriptors(keep=None):
    """Closes every inherited descriptor but 0-2 and `keep`, so the launching
    call's pipes (and anything else the caller passed) are released, then
    points 0-2 at /dev/null."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)


def secret_values(envs):
    """Byte values to mask: from the sandbox env and the task's envs."""
    names = SECRET_NAME_PARTS
    values = set()
    pairs = list(os.environb.items()) + [(k.encode("utf-8", "surrogateescape"),
                                          v.encode("utf-8", "surrogateescape"))
                                         for k, v in envs.items()]
    for k, v in pairs:
        upper = k.decode("latin-1").upper()
        if any(p in upper for p in names) and len(v) >= MIN_SECRET_LEN \
                and v.lower() not in NON_SECRET_VALUES:
            values.add(v)
    return values


class Masker:
    """Streaming exact-value masking with a carry-over for values split across reads."""

    def __init__(self, values):
        import re
        # The gateway's masker (src/masking.rs) follows the same rule: values
        # under MIN_SECRET_LEN bytes are ignored, leftmost match, the longest
        # value winning at a position (supervisor/testdata/mask_vectors.json).
        ordered = sorted(set(v for v in values if len(v) >= MIN_SECRET_LEN),
                         key=lambda v: (-len(v), v))  # longest first
        self.regex = re.compile(b"|".join(re.escape(v) for v in ordered)) if ordered else None
        self.hold = len(ordered[0]) - 1 if ordered else 0

    def feed(self, buf):
        """Mask `buf` (= carry + new data). Returns (masked output, new carry).

        Every match that STARTS before `cut` is final: the longest secret
        starting there fits in `buf`. Bytes from max(cut, end of last final
        match) on are held back, since they may begin a secret that the next
        read completes. The result is identical to masking the whole stream
        at once.
        """
        if self.regex is None:
            return buf, b""
        cut = len(buf) - self.hold
        if cut <= 0:
            return b"", buf
        pieces = []
        pos = 0
        for m in self.regex.finditer(buf):
            s = m.start()
            if s >= cut:
                break
            pieces.append(buf[pos:s])
            pieces.append(MASK)
            pos = m.end()
        end = max(pos, cut)
        pieces.append(buf[pos:end])
        return b"".join(pieces), buf[end:]

    def flush(self, buf):
        return self.regex.sub(MASK, buf) if self.regex is not None else buf


class Stream:
    """One task pipe: drained continuously, first STREAM_LIMIT masked bytes stored."""

    def __init__(self, owner, fd, path, masker, scratch):
        self.owner = owner              # the Daemon: owns and closes descriptors
        self.fd = fd
        self.out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        owner.fds.append(self.out)
        self.masker = masker
        self.scratch = scratch          # shared bytearray for count-only reads
        self.carry = b""
        self.stored = 0
        self.total = 0                  # raw bytes the task wrote
        self.truncated = False          # masked stream longer than STREAM_LIMIT
        self.storing = True
        self.open = True
        self.store_error = None

    def read(self):
        """One read; returns False at EOF."""
        if self.storing:
            try:
                data = os.read(self.fd, STORE_CHUNK)
            except BlockingIOError:
                return True
            if not data:
                return False
            self.total += len(data)
            self._take(data)
            return True
        try:
            n = os.readv(self.fd, [self.scratch])
        except BlockingIOError:
            return True
        if n == 0:
            return False
        self.total += n
        self.truncated = True  # storage is full and the stream goes on
        return True

    def _take(self, data):
        if self.masker is None:
            self._store(data)
            return
        out, self.carry = self.masker.feed(self.carry + data)
        if out:
            self._store(out)

    def _store(self, out):
        room = STREAM_LIMIT - self.stored
        if len(out) > room:
            out = out[:room]
            self.truncated = True
        if out:
            try:
                write_all(self.out, out)
            except OSError as e:
                self.store_error = "could not store output: %s" % (e.strerror or e)
                self.storing = False
                return
            self.stored += len(out)
        if self.stored >= STREAM_LIMIT:
            self.storing = False
            if self.carry:
                self.truncated = True
            self.carry = b""

    def close(self):
        if not self.open:
            return
        self.open = False
        if self.storing and self.carry:
            carry, self.carry = self.carry, b""
            self._store(self.masker.flush(carry))
        self.owner.close_fd(self.fd)
        self.owner.close_fd(self.out)


def set_pipe_size(fd):
    try:
        import fcntl
        fcntl.fcntl(fd, 1031, PIPE_SIZE)  # F_SETPIPE_SZ (constant only in 3.10+)
    except (OSError, ImportError):
        pass


def daemon_main(tdir, tid, spec_record, cwd, envs, child_umask, ready_fd, on_ready=None,
                detached=False, record=None):
    """Entry of the detached daemon: the grandchild of `start`; a child of the
    task server, which passes `on_ready` (called with the first record once it
    is saved, to answer the client); or the server's spare, which passes
    `detached` (its descriptors are already released) and the first `record`,
    which the server saved (naming this process) and answers with; then the
    spare writes the task's other files (see `prepare_start`). Never
    returns."""
    try:
        if not detached:
            detach_descriptors(keep=ready_fd)  # `start`'s wait pipe stays
        # The daemon lives in its task's directory, so /proc/PID/cwd/status.json
        # names the task while (and only while) this process exists and is not a
        # zombie: the gateway's liveness check through the files API alone.
        try:
            os.chdir(tdir)
            in_task_dir = True
        except OSError:
            os.chdir("/")
            in_task_dir = False
        os.umask(0o077)
        daemon = Daemon(tdir, tid, spec_record, cwd, envs, child_umask, ready_fd, record)
        if record is not None:
            try:
                write_task_files(tdir, spec_record)
            except CliError as e:
                daemon.fail(e.message)
                os._exit(0)
        daemon.on_ready = on_ready
        daemon.record["supervisor_in_task_dir"] = in_task_dir
        daemon.run()
    except BaseException:
        pass
    os._exit(0)


def first_record(tid, spec_record, supervisor_pid, supervisor_start_time, sid, in_task_dir):
    """A task's first status.json: running, its daemon named, its command not
    started yet (no pid)."""
    return {
        "task_id": tid, "state": "running", "command": spec_record["command"],
        "cwd": spec_record["cwd"], "timeout": spec_record["timeout"],
        "created_at": spec_record["created_at"],
        "origin": spec_record.get("origin"),
        "supervisor_pid": supervisor_pid,
        "supervisor_start_time": supervisor_start_time,
        "sid": sid,
        "pid": None, "pgid": None, "pid_start_time": None,
        "started_at": None, "finished_at": None,
        "exit_code": None, "signal": None, "error": None,
        "stdout_total_bytes": 0, "stderr_total_bytes": 0,
        "stdout_size": 0, "stderr_size": 0,
        "stdout_truncated": False, "stderr_truncated": False,
        "supervisor_version": SUPERVISOR_VERSION,
        "supervisor_in_task_dir": in_task_dir,
    }


class Daemon:
    def __init__(self, tdir, tid, spec_record, cwd, envs, child_umask, ready_fd, record=None):
        self.tdir = tdir
        self.ready_fd = ready_fd  # write end of `start`'s wait pipe, or None
        self.on_ready = None      # the fork server's answer to its client, or None
        self.tid = tid
        self.spec = spec_record
        self.cwd = cwd
        self.envs = envs
        self.child_umask = child_umask
        self.status_path = os.path.join(tdir, "status.json")
        self.pid = None
        self.fds = []            # descriptors to free before recording a failure
        self.first_saved = record is not None  # by the task server, which answered with it
        if record is None:
            record = first_record(tid, spec_record, os.getpid(), proc_start_time(os.getpid()),
                                  os.getsid(0), False)
        self.record = record

    def save(self, sync=True):
        write_json_atomic(self.status_path, self.record, sync)
        if self.on_ready is not None:
            on_ready, self.on_ready = self.on_ready, None
            try:
                on_ready(dict(self.record))
            except Exception:
                pass
        if self.ready_fd is not None:
            # The first status.json exists: EOF tells `start` to read it.
            fd, self.ready_fd = self.ready_fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def fail(self, message):
        self.record.update(state="failed", error=message, finished_at=time.time())
        self.save()

    def pipe(self):
        r, w = os.pipe()
        self.fds += [r, w]
        return r, w

    def close_fd(self, fd):
        if fd in self.fds:
            self.fds.remove(fd)
            try:
                os.close(fd)
            except OSError:
                pass

    def run(self):
        try:
            self._run()
        except BaseException as e:
            # Supervisor failure: kill the task's group (child not yet reaped,
            # so the pgid is still ours), free our descriptors (the failure
            # may be EMFILE) and record `failed`.
            if self.pid is not None and self.record["state"] == "running":
                try:
                    signal = signal_module()
                    os.killpg(self.pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                signal = signal_module()
                signal.set_wakeup_fd(-1)
            except BaseException:
                pass
            for fd in list(self.fds):
                self.close_fd(fd)
            if self.record["state"] == "running":
                if isinstance(e, SpawnError):
                    self.fail("could not start the command: %s" % e)
                elif isinstance(e, OSError) and self.pid is None:
                    self.fail("could not start the command: %s" % (e.strerror or e))
                else:
                    self.fail("supervisor error: %s: %s" % (type(e).__name__, e))

    def _spawn(self, signal):
        """fork + exec /bin/bash -c COMMAND in a new process group. Returns (pid, out_r, err_r)."""
        envb = dict(os.environb)
        for k, v in self.envs.items():
            envb[k.encode("utf-8", "surrogateescape")] = v.encode("utf-8", "surrogateescape")
        argv = [b"bash", b"-c", self.spec["command"].encode("utf-8", "surrogateescape")]
        cwd = self.cwd.encode("utf-8", "surrogateescape")
        out_r, out_w = self.pipe()
        err_r, err_w = self.pipe()
        set_pipe_size(out_r)
        set_pipe_size(err_r)
        devnull = os.open(os.devnull, os.O_RDONLY)
        self.fds.append(devnull)
        if hasattr(os, "posix_spawn"):
            return self._posix_spawn(signal, argv, envb, cwd, devnull, out_r, out_w, err_r, err_w)
        report_r, report_w = self.pipe()  # CLOEXEC: EOF on successful exec
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                signal.set_wakeup_fd(-1)
                for s in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT,
                          signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(s, signal.SIG_DFL)  # Python ignores SIGPIPE/SIGXFSZ
                os.umask(self.child_umask)
                os.dup2(devnull, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.chdir(cwd)
                os.execve(b"/bin/bash", argv, envb)
            except BaseException as e:
                try:
                    msg = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                    os.write(report_w, ("%s (%s)" % (msg, type(e).__name__)).encode("utf-8", "replace")[:2000])
                except BaseException:
                    pass
            os._exit(127)
        self.pid = pid
        try:
            os.setpgid(pid, pid)  # also done by the child; whichever runs first wins
        except OSError:
            pass
        for fd in (out_w, err_w, report_w, devnull):
            self.close_fd(fd)
        report = b""
        while True:
            chunk = os.read(report_r, 4096)
            if not chunk:
                break
            report += chunk
        self.close_fd(report_r)
        if report:
            os.waitpid(pid, 0)
            self.pid = None
            raise SpawnError(report.decode("utf-8", "replace"))
        return pid, out_r, err_r

    def _posix_spawn(self, signal, argv, envb, cwd, devnull, out_r, out_w, err_r, err_w):
        """`_spawn` through posix_spawn (a vfork in libc: no copy of this
        process, and exec errors come back as OSError). The child's umask and
        cwd are set here around the call (this process has one thread) and
        restored: the daemon lives in its task's directory."""
        old_umask = os.umask(self.child_umask)
        home = self.record.get("supervisor_in_task_dir") and self.tdir or "/"
        try:
            os.chdir(cwd)
            pid = os.posix_spawn(
                b"/bin/bash", argv, envb,
                file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                              (os.POSIX_SPAWN_DUP2, err_w, 2)],
                setpgroup=0,
                setsigdef=(signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT,
                           signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ),
                setsigmask=())
        except OSError as e:
            raise SpawnError("%s (%s)" % (e.strerror or e, type(e).__name__))
        finally:
            os.umask(old_umask)
            try:
                os.chdir(home)
            except OSError:
                os.chdir("/")
        self.pid = pid
        for fd in (out_w, err_w, devnull):
            self.close_fd(fd)
        return pid, out_r, err_r

    def _run(self):
        import select
        signal = signal_module()

        wake_r, wake_w = self.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

        def noop(signum, frame):
            pass

        # Handlers (not SIG_IGN) so the exec'd command gets default dispositions.
        for s in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, noop)

        # The first record, saved before the command starts, releases the
        # waiting `start` (or answers the task server's client; a spare's was
        # saved by the server): from here the task exists, a cancel reaches
        # this process (its handlers are set; a spare ignores SIGUSR1 from its
        # fork, and the marker is checked below) and a command that cannot
        # start is recorded `failed`. Not fsynced, like the progress refreshes:
        # a `running` record lost to a crash took its processes with it, and
        # no record reads `unknown`, which is then the truth. Every outcome (a
        # terminal record) is fsynced.
        if not self.first_saved:
            self.record["started_at"] = time.time()
            self.save(sync=False)
        pid, out_r, err_r = self._spawn(signal)
        pgid = pid
        self.record.update(pid=pid, pgid=pgid, pid_start_time=proc_start_time(pid))
        self.save(sync=False)

        # Built after the start is recorded (compiling the pattern imports
        # `re`); meanwhile the command's output waits in the pipes.
        masker = None
        secrets = secret_values(self.envs)
        if secrets:
            masker = Masker(secrets)

        scratch = bytearray(READ_CHUNK)
        streams = {
            out_r: Stream(self, out_r, os.path.join(self.tdir, "stdout"), masker, scratch),
            err_r: Stream(self, err_r, os.path.join(self.tdir, "stderr"), masker, scratch),
        }
        names = {out_r: "stdout", err_r: "stderr"}
        poller = select.poll()
        for fd in (out_r, err_r, wake_r):
            poller.register(fd, select.POLLIN)

        cancel_path = os.path.join(self.tdir, "cancel_requested")
        cancel = os.path.exists(cancel_path)
        term = False
        reason = None            # "cancelled" | "timed_out" | "supervisor_signal"
        term_sent = None
        kill_sent = False
        wstatus = None
        drain_deadline = drain_hard = None
        start_mono = time.monotonic()
        timeout = self.spec["timeout"]
        deadline = start_mono + timeout if timeout else None
        next_tick = start_mono + PROGRESS_INTERVAL
        last_totals = None

        def killpg(sig):
            try:
                os.killpg(pgid, sig)
            except OSError:
                pass  # ESRCH: nothing left; EPERM: member we may not signal

        while True:
            now = time.monotonic()
            wake_at = next_tick
            if wstatus is None:
                if reason is None and deadline is not None:
                    wake_at = min(wake_at, deadline)
                if term_sent is not None and not kill_sent:
                    wake_at = min(wake_at, term_sent + GRACE_SECONDS)
            if drain_deadline is not None:
                wake_at = min(wake_at, drain_deadline)
            ms = max(0, int((wake_at - now) * 1000) + 1)
            for fd, _ev in poller.poll(ms):
                if fd == wake_r:
                    try:
                        sigs = os.read(wake_r, 4096)
                    except BlockingIOError:
                        sigs = b""
                    if signal.SIGUSR1 in sigs:
                        cancel = True
                    if signal.SIGTERM in sigs or signal.SIGINT in sigs:
                        term = True
                    continue
                st = streams[fd]
                if not st.read():
                    poller.unregister(fd)
                    st.close()
                elif drain_deadline is not None:
                    drain_deadline = min(time.monotonic() + DRAIN_IDLE, drain_hard)

            if wstatus is None:
                # Detect the exit WITHOUT reaping, kill the rest of the group
                # while the zombie leader still pins the pgid, then reap.
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if info is not None:
                    self.record["finished_at"] = time.time()
                    killpg(signal.SIGKILL)
                    _, wstatus = os.waitpid(pid, 0)
                    drain_deadline = time.monotonic() + DRAIN_IDLE
                    drain_hard = time.monotonic() + DRAIN_MAX

            now = time.monotonic()
            if wstatus is None:
                if reason is None:
                    if cancel:
                        reason = "cancelled"
                    elif term:
                        reason = "supervisor_signal"
                    elif deadline is not None and now >= deadline:
                        reason = "timed_out"
                    if reason is not None:
                        killpg(signal.SIGTERM)
                        term_sent = now
                elif not kill_sent and now >= term_sent + GRACE_SECONDS:
                    killpg(signal.SIGKILL)
                    kill_sent = True

            if now >= next_tick:
                next_tick = now + PROGRESS_INTERVAL
                if wstatus is None:
                    if not cancel and os.path.exists(cancel_path):
                        cancel = True
                    totals = tuple((s.total, s.truncated) for s in streams.values())
                    if totals != last_totals:
                        last_totals = totals
                        self._record_streams(streams, names)
                        self.save(sync=False)

            if wstatus is not None and (not any(s.open for s in streams.values())
                                        or time.monotonic() >= drain_deadline):
                break

        for st in streams.values():
            st.close()
        self._record_streams(streams, names)
        if os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            exit_code = 128 + sig
        else:
            sig = None
            exit_code = os.WEXITSTATUS(wstatus)
        if reason == "cancelled":
            state = "cancelled"
        elif reason == "timed_out":
            state = "timed_out"
        elif reason == "supervisor_signal":
            state = "failed"
            self.record["error"] = "the supervisor was asked to stop (SIGTERM) and ended the task"
        else:
            state = "succeeded" if exit_code == 0 and sig is None else "failed"
        errors = [s.store_error for s in streams.values() if s.store_error]
        if errors:
            self.record["storage_error"] = "; ".join(errors)
        self.record["supervisor_max_rss_kb"] = max_rss_kb()
        self.record.update(state=state, exit_code=exit_code, signal=sig)
        self.save()

    def _record_streams(self, streams, names):
        for fd, st in streams.items():
            n = names[fd]
            self.record[n + "_total_bytes"] = st.total
            self.record[n + "_size"] = st.stored
            self.record[n + "_truncated"] = st.truncated


class SpawnError(Exception):
    pass


def signal_module():
    """The C module `_signal` (same functions and numbers as `signal`, whose
    import pulls in enum: a large share of a call's start-up), else `signal`."""
    try:
        import _signal
        return _signal
    except ImportError:  # pragma: no cover
        import signal
        return signal


def max_rss_kb():
    """Peak resident set size of this process (VmHWM), in KiB, or None."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


# --- the fork server ------------------------------------------------------------
#
# A python3 start costs 15-20 ms before any work, so `start` and `cancel` are
# also served by one long-lived process per sandbox and base directory, forked
# from the first `start --serve 1` after it answered (so it costs no start of
# its own). A client that costs nothing to start (CLIENT in src/tasks/fast.rs:
# bash builtins only) reaches it:
#
#   server-V.pid   "PID STARTTIME": written once the server reads its FIFO; the
#                  client checks /proc/PID/stat's state and start time first.
#   server-V.fifo  requests, one line each, atomic (< PIPE_BUF), written through
#                  an O_RDWR open (never blocks, even if the server just died):
#                  "CLIENTPID CLIENTSTART FD SUBCOMMAND OPTIONS... [-- SPEC]",
#                  or "CLIENTPID CLIENTSTART FD @" with the words, a line each,
#                  in queue/CLIENTPID.req when the line would be too long.
#   server-V.lock  flock'd by the live server (one per version and directory).
#
# The client holds its reply pipe FD open read-write (a here-string's pipe,
# reopened through /proc/self/fd: no process is started to make it) and makes
# queue/PID.out; the answer's JSON goes into PID.out, then its exit code into
# /proc/PID/fd/FD, only while that pid is still the client (its start time) and
# FD a pipe. The server removes PID.out; what a client that gave up left is
# removed when the server is idle. The server holds no task state (all of it is
# in the task directories), so a crash of it touches no running task: the next
# client finds no live server, runs python3 itself, and that start forks a new
# server. A start is checked and claimed by the server, which saves its first
# record naming its spare daemon (class Spare: forked in advance, in its own
# session), hands the task to the spare and answers, before the command
# starts; a cancel, which may wait up to 3 s, is served by a forked child.
# Idle for SERVER_IDLE seconds, or finding its pid file gone or another's, the
# server exits (and its spare with it).

SPEC_ENV = "SANDBOX_MCP_TASK_SPEC"   # the spec line, passed in the client's env
SERVER_IDLE = 600.0
SERVER_CHECK = 5.0                   # how often an idle server checks its pid file
QUEUE_STALE = 120.0                  # queue files older than this are removed
SERVER_OPS = ("start", "cancel")
SPARE_DELAY = 0.003                  # quiet seconds before the next spare is forked
_spec_from_env = []                   # the spec taken (and removed) from the env


def server_paths(base):
    stem = os.path.join(base, "server-%s" % SUPERVISOR_VERSION)
    return stem + ".pid", stem + ".fifo", stem + ".lock", os.path.join(base, "queue")


def spawn_server(base):
    """Forks a detached fork server (a copy of this process: no new python3
    start). Returns at once; errors are ignored (the next start tries again)."""
    def server():
        try:
            detach_descriptors()
            os.chdir("/")
            serve(base)
        except BaseException:
            pass
        os._exit(0)

    try:
        fork_detached(server)
    except OSError:
        pass


def serve(base, idle=SERVER_IDLE):
    """The fork server's loop (returns when idle, or at once if another runs)."""
    import fcntl
    signal = signal_module()
    pid_path, fifo_path, lock_path, queue = server_paths(base)
    _spec_from_env[:] = []  # the start this server was forked from had its own spec
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        return
    ensure_private_dir(queue)
    try:
        os.unlink(fifo_path)  # a copy's (snapshot) or a crashed server's
    except FileNotFoundError:
        pass
    os.mkfifo(fifo_path, 0o600)
    fifo = os.open(fifo_path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    # Daemons and cancel handlers are reaped by the kernel (each resets this).
    old_sigchld = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    me = os.getpid()
    clean_queue(queue, 0.0)
    spare = Spare()
    spare.ensure()  # before clients can find this server
    my_line = "%d %d\n" % (me, proc_start_time(me))
    with open(pid_path + ".tmp", "w") as f:
        f.write(my_line)
    os.rename(pid_path + ".tmp", pid_path)
    pending = b""
    last = time.monotonic()
    try:
        while True:
            ready = spare.wait(fifo, min(SERVER_CHECK, max(0.05, last + idle - time.monotonic())))
            if ready is None:
                continue
            if not ready:
                if time.monotonic() - last >= idle:
                    break
                if read_text_file(pid_path) != my_line:
                    break  # the directory was removed, or another server took over
                clean_queue(queue, QUEUE_STALE)
                continue
            try:
                pending += os.read(fifo, 65536)
            except BlockingIOError:
                continue
            lines = pending.split(b"\n")
            pending = lines.pop()
            if len(pending) > 8192:
                pending = b""  # longer than any request line: garbage
            for line in lines:
                handle_request(base, queue, line, (fifo, lock_fd), spare)
            last = time.monotonic()
    finally:
        # Leave no live-looking pid file, then answer what arrived meanwhile:
        # a client that read the pid file just before still gets its answer.
        if read_text_file(pid_path) == my_line:
            try:
                os.unlink(pid_path)
            except OSError:
                pass
        time.sleep(0.2)
        try:
            pending += os.read(fifo, 65536)
        except OSError:
            pass
        for line in pending.split(b"\n"):
            handle_request(base, queue, line, (fifo, lock_fd), spare)
        spare.close()  # its pipe's EOF ends it
        os.close(fifo)
        os.close(lock_fd)
        signal.signal(signal.SIGCHLD, old_sigchld)


def read_text_file(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, ValueError):
        return None


def clean_queue(queue, older_than):
    now = time.time()
    try:
        with os.scandir(queue) as it:
            for entry in it:
                try:
                    if now - entry.stat(follow_symlinks=False).st_mtime >= older_than:
                        os.unlink(entry.path)
                except OSError:
                    pass
    except OSError:
        pass


def handle_request(base, queue, line, server_fds, spare):
    """Serves one request line "PID START FD ARGV... [-- SPEC]", or "PID START
    FD @" with the request in queue/PID.req (a line per word). PID and START
    name the client, FD its reply pipe. The server itself (a start taken by
    its spare), a start's daemon or a cancel's child answers it."""
    words = line.strip().decode("ascii", "replace").split(" ")
    if len(words) < 4 or not all(w.isdigit() and len(w) <= 12 for w in words[:3]):
        return
    client = (int(words[0]), int(words[1]), int(words[2]))
    words = words[3:]
    if words == ["@"]:
        req_path = os.path.join(queue, "%d.req" % client[0])
        try:
            with open(req_path, "rb") as f:
                raw = f.read(SPEC_MAX_BYTES + 8192)
            os.unlink(req_path)  # the claim: a request is served once
        except OSError:
            return
        words = raw.decode("utf-8", "replace").split("\n")
    argv, spec = split_spec(words)
    if argv and argv[0] == "start":
        server_start(base, queue, client, argv, spec, spare)
        return
    if argv and argv[0] == "cancel":
        try:
            pid = os.fork()
        except OSError:
            pid = None
        if pid == 0:
            code = 0
            try:
                for fd in list(server_fds) + spare.fds():
                    os.close(fd)
                answer(queue, client, run_subcommand(argv, base))
            except BaseException:
                code = 1
            os._exit(code)
        if pid is not None:
            return
    answer(queue, client, run_subcommand(argv, base, spec))


def split_spec(words):
    """A request's words as (the subcommand's argv, the spec after "--" or None)."""
    spec = None
    if "--" in words:
        cut = words.index("--")
        spec = words[cut + 1] if cut + 1 < len(words) else ""
        words = words[:cut]
    return [w for w in words if w], spec


class Spare:
    """The task server's next daemon, forked ahead of the start that will use
    it: a detached process in its own session, waiting on a pipe for one task
    (pickled: what `prepare_start` returned, and the first record). The server
    saves that record, naming the spare, hands the task over and answers the
    client itself, so a start costs the server a write, not a fork, and its
    answer waits for no other process; the spare then enters the task's
    directory and starts the command. The next spare is forked once the FIFO
    has been quiet for SPARE_DELAY (a fork at once would compete with the
    launch). Closing the pipe unused (the server exits, or dies) ends it."""

    def __init__(self):
        self.pid = None
        self.start_time = None
        self.job_w = None
        self.wanted = False  # a task took the last one

    def fds(self):
        return [self.job_w] if self.job_w is not None else []

    def wait(self, fd, timeout):
        """Waits up to `timeout` for `fd` to be readable (True). While a spare
        is wanted, waits only SPARE_DELAY and, if that stays quiet, forks it
        (None: call again); False when `timeout` passed."""
        import select
        if select.select([fd], [], [], SPARE_DELAY if self.wanted else timeout)[0]:
            return True
        if self.wanted:
            self.ensure()  # one try: a failed fork leaves starts forking their daemons
            return None
        return False

    def ensure(self):
        """Forks the spare if there is none (an error leaves none: a start
        then forks its daemon itself)."""
        self.wanted = False
        if self.pid is not None:
            return
        try:
            job_r, job_w = os.pipe()
        except OSError:
            return
        try:
            pid = os.fork()
        except OSError:
            os.close(job_r)
            os.close(job_w)
            return
        if pid == 0:
            self._wait_for_task(job_r)  # never returns
        os.close(job_r)
        start_time = proc_start_time(pid)
        if start_time is None:  # already gone
            os.close(job_w)
            return
        self.pid, self.start_time, self.job_w = pid, start_time, job_w

    def hand(self, job):
        """Gives `job` to the spare; False if it is gone (the caller forks a
        daemon itself)."""
        import pickle
        fd, self.pid, self.job_w = self.job_w, None, None
        self.wanted = True
        try:
            write_all(fd, pickle.dumps(job, pickle.HIGHEST_PROTOCOL))
            return True
        except OSError:  # EPIPE: the spare died before its task
            return False
        finally:
            os.close(fd)

    def close(self):
        for fd in self.fds():
            os.close(fd)
        self.pid = self.job_w = None

    def _wait_for_task(self, job_r):
        try:
            signal = signal_module()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            # A cancel may signal this process as soon as its record is saved,
            # before the daemon sets its own handlers: ignored here, the
            # daemon sees the cancel's marker file.
            signal.signal(signal.SIGUSR1, lambda signum, frame: None)
            os.setsid()
            detach_descriptors(keep=job_r)  # the server's FIFO, lock and pipes
            chunks = []
            while True:
                chunk = os.read(job_r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
            os.close(job_r)
            if chunks:
                import pickle
                tid, tdir, spec_record, cwd_run, envs, old_umask, record = pickle.loads(b"".join(chunks))
                daemon_main(tdir, tid, spec_record, cwd_run, envs, old_umask, None,
                            detached=True, record=record)
        except BaseException:
            pass
        os._exit(0)


def claim_served_start(base, argv, spec, spare):
    """A start served by the task server or the channel: checked and claimed
    here; with a spare, its first record (naming the spare) is saved and the
    task handed over. Returns (result, None) when the start is answered (taken
    by the spare, or refused), or (None, claimed) when the caller launches it
    itself (no spare, or it died): what `prepare_start` returned, its files
    written."""
    try:
        _, opts = parse_served(argv, base)
        claimed = prepare_start(opts, spec, files=spare.pid is None)
        tid, tdir, spec_record, cwd_run, envs, old_umask = claimed
        if spare.pid is not None:
            record = first_record(tid, spec_record, spare.pid, spare.start_time, spare.pid, True)
            record["started_at"] = time.time()
            try:
                write_json_atomic(os.path.join(tdir, "status.json"), record, sync=False)
                handed = spare.hand(claimed + (record,))
            except OSError:
                handed = False  # a daemon launched by the caller saves its own record over it
            if handed:
                # Its streams are empty (and made by the spare): not read.
                return (0, status_view(None, tid, record, "running", None)), None
            write_task_files(tdir, spec_record)
        return None, claimed
    except CliError as e:
        return (2, {"error": e.message, "code": e.code}), None
    except Exception as e:
        return (2, {"error": "supervisor error: %s: %s" % (type(e).__name__, e), "code": "internal"}), None


def server_start(base, queue, client, argv, spec, spare):
    """A start served by the task server (`claim_served_start`); without a
    spare, a daemon forked now answers once its own first record is saved.
    Either way the server goes back to its FIFO at once."""
    result, claimed = claim_served_start(base, argv, spec, spare)
    if result is not None:
        answer(queue, client, result)
        return
    tid, tdir, spec_record, cwd_run, envs, old_umask = claimed
    status_path = os.path.join(tdir, "status.json")
    spare.wanted = True
    try:
        pid = os.fork()
    except OSError as e:
        # No daemon: this process is the only possible writer of status.json.
        record = dict(spec_record, state="failed", started_at=None, finished_at=time.time(),
                      exit_code=None, signal=None, pid=None, pgid=None,
                      error="could not launch the task supervisor: %s" % (e.strerror or e))
        try:
            write_json_atomic(status_path, record)
        except OSError:
            pass
        record, state, error = load_task(tdir, tid)
        answer(queue, client, (0, status_view(tdir, tid, record, state, error)))
        return
    if pid == 0:
        try:
            signal = signal_module()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()
        except BaseException:
            pass

        def on_ready(record):
            answer(queue, client, (0, status_view(tdir, tid, record, record["state"], record.get("error"))))

        daemon_main(tdir, tid, spec_record, cwd_run, envs, old_umask, None, on_ready)  # never returns


def answer(queue, client, result):
    """Answers the waiting client (pid, start time, reply descriptor): the
    JSON into its queue/PID.out (which it made and holds open), then the exit
    code into its reply pipe, reached as /proc/PID/fd/FD. Nothing is written
    unless the pid is still that client (start time) and the descriptor is a
    pipe; the server cleans up what a client that gave up left."""
    rc, obj = result
    pid, start, reply_fd = client
    if not process_alive(pid, start):
        return
    out_path = os.path.join(queue, "%d.out" % pid)
    try:
        fd = os.open(out_path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        try:
            write_all(fd, (json_dumps(obj) + "\n").encode("ascii"))
        finally:
            os.close(fd)
        os.unlink(out_path)
        fd = os.open("/proc/%d/fd/%d" % (pid, reply_fd), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        if os.fstat(fd).st_mode & 0o170000 == 0o010000:  # S_ISFIFO, without importing stat
            write_all(fd, b"%d\n" % rc)
    except OSError:
        pass
    finally:
        os.close(fd)


def parse_served(argv, base):
    """`parse_args` of a request to the task server in `base`: only start and
    cancel, only in its own directory; `server` marks the options as served."""
    cmd, opts = parse_args(argv)
    if cmd not in SERVER_OPS or os.path.abspath(opts.get("base", base)) != base:
        raise CliError("invalid", "the task server serves only start and cancel, in its own directory")
    opts["base"], opts["server"] = base, "1"
    return cmd, opts


def run_subcommand(argv, base=None, spec=None):
    """(exit code, the one JSON object) of a subcommand, as `main` prints them;
    with `base`, as the task server in that directory serves it."""
    try:
        cmd, opts = parse_args(argv) if base is None else parse_served(argv, base)
        if cmd == "version":
            return 0, {"version": SUPERVISOR_VERSION}
        if cmd == "start":
            return 0, cmd_start(opts, spec)
        if cmd == "status":
            return 0, cmd_status(opts)
        if cmd == "cancel":
            return 0, cmd_cancel(opts)
        return 0, cmd_list(opts)
    except CliError as e:
        return 2, {"error": e.message, "code": e.code}
    except Exception as e:  # never leave the gateway without one JSON object
        return 2, {"error": "supervisor error: %s: %s" % (type(e).__name__, e), "code": "internal"}


# --- the gateway's channel ------------------------------------------------------
#
# `channel [--base DIR]`: a long-lived process the gateway starts through envd's
# process API with stdin open, and keeps: a start then costs one SendInput and
# one line of the process's streamed stdout, with no process started per call
# (not even the fork server's bash client). Lines, each ended by "\n":
#
#   stdout, first  "0 0 {"version": V, "pid": P}" once it reads its stdin
#   stdin          "ID start OPTIONS... -- SPEC"  (ID: 1-20 digits, chosen by
#                  the gateway; SPEC: the base64 spec line)
#   stdout         "ID RC JSON": the exit code and the one JSON object that
#                  `start` would print
#
# A start is served as the fork server serves it (`claim_served_start`, with
# this process's own spare); without a spare, as `start` itself (a daemon
# double-forked, answered at its first record). Anything else on stdin is
# answered with an "invalid" refusal if it has an ID, else ignored. Like the
# fork server, it holds no task state: if it dies, the gateway's next start
# takes the bash client's path and no task is touched. It exits at its stdin's
# end (its spare with it) or after CHANNEL_IDLE seconds without a request.

CHANNEL_IDLE = 300.0
CHANNEL_LINE_MAX = SPEC_MAX_BYTES + 8192


def channel_main(argv, in_fd=0, out_fd=1, idle=CHANNEL_IDLE):
    """Entry of `channel`: serves lines from `in_fd` until it ends."""
    try:
        _, opts = parse_args(argv)
        base = os.path.dirname(tasks_root(opts))
    except CliError as e:
        emit({"error": e.message, "code": e.code})
        return 2
    except OSError as e:
        emit({"error": "cannot prepare the task directory: %s" % (e.strerror or e), "code": "io"})
        return 2
    channel(base, in_fd, out_fd, idle)
    return 0


def channel(base, in_fd, out_fd, idle):
    signal = signal_module()
    old_sigchld = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # spares and daemons: reaped by the kernel
    spare = Spare()
    spare.ensure()
    pending, discarding = b"", False
    try:
        write_all(out_fd, ("0 0 %s\n" % json_dumps({"version": SUPERVISOR_VERSION,
                                                     "pid": os.getpid()})).encode("ascii"))
        last = time.monotonic()
        while True:
            ready = spare.wait(in_fd, max(0.05, last + idle - time.monotonic()))
            if ready is None:
                continue
            if not ready:
                if time.monotonic() - last >= idle:
                    break
                continue
            chunk = os.read(in_fd, 65536)
            if not chunk:
                break
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if discarding and lines:
                lines.pop(0)  # the rest of an over-long line
                discarding = False
            if len(pending) > CHANNEL_LINE_MAX:
                pending, discarding = b"", True
            for line in lines:
                reply = channel_request(base, line, spare)
                if reply is not None:
                    write_all(out_fd, reply)
            last = time.monotonic()
    except OSError:
        pass  # stdout gone (EPIPE): nobody reads the answers any more
    finally:
        spare.close()
        signal.signal(signal.SIGCHLD, old_sigchld)


def channel_request(base, line, spare):
    """The answer line (bytes) to one request line of the channel, or None."""
    words = line.strip().decode("ascii", "replace").split(" ")
    rid = words[0]
    if not (rid.isdigit() and len(rid) <= 20):
        return None
    argv, spec = split_spec(words[1:])
    if argv[:1] != ["start"]:
        result = (2, {"error": "the channel serves only start", "code": "invalid"})
    else:
        result = channel_start(base, argv, spec, spare)
    rc, obj = result
    return ("%s %d %s\n" % (rid, rc, json_dumps(obj))).encode("ascii")


def channel_start(base, argv, spec, spare):
    """(exit code, JSON object) of a start through the channel."""
    if spare.pid is None:
        spare.ensure()
    result, claimed = claim_served_start(base, argv, spec, spare)
    if result is not None:
        return result
    signal = signal_module()
    old = signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # fork_detached waits for its child
    try:
        return 0, launch_and_wait(*claimed)
    except Exception as e:
        return 2, {"error": "supervisor error: %s: %s" % (type(e).__name__, e), "code": "internal"}
    finally:
        signal.signal(signal.SIGCHLD, old)


# --- entry point --------------------------------------------------------------

def scrub_initial_environ(name):
    """Overwrites the value of `name` in this process's initial environment
    block with `*`: removing a variable (unsetenv) leaves it there, and that
    block is what /proc/PID/environ shows, for this process and every process
    forked from it (the task server, its spares, daemons). Best effort: the
    block is found through /proc/self/stat (env_start, env_end) and written
    through /proc/self/mem."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[47]), int(fields[48])  # fields 50 and 51
        fd = os.open("/proc/self/mem", os.O_RDWR)
        try:
            block = os.pread(fd, end - start, start)
            key = name.encode("ascii") + b"="
            at = (b"\0" + block).find(b"\0" + key)  # where the entry starts in `block`
            if at >= 0:
                value = at + len(key)
                value_end = block.find(b"\0", value)
                if value_end < 0:
                    value_end = len(block)
                os.pwrite(fd, b"*" * (value_end - value), start + value)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        pass


def main(argv):
    # The spec passed in the environment never reaches the task's environment,
    # nor stays readable in this process's (and its forks') /proc/PID/environ.
    spec = os.environ.pop(SPEC_ENV, None)
    if spec is not None:
        _spec_from_env[:] = [spec]
        scrub_initial_environ(SPEC_ENV)
    if argv[:1] == ["channel"]:
        return channel_main(argv)
    rc, obj = run_subcommand(argv)
    emit(obj)
    if argv and argv[0] == "start" and "--serve" in argv:
        try:
            _, opts = parse_args(argv)
            spawn_server(os.path.dirname(tasks_root(opts)))
        except BaseException:
            pass
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
