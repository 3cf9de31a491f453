#!/usr/bin/env python3
"""Benchmark for supervisor.py: drain rate, daemon memory, `status` latency.

    python3 supervisor/bench_drain.py [--size BYTES] [--runs N] [--python PATH]

1. Drain rate: starts a task `head -c SIZE /dev/zero` (default 1 GiB) with a
   secret-named variable in its env, so masking is active, waits for it to
   finish, and computes stdout_total_bytes / (finished_at - started_at) from
   the recorded status. Median of N runs (default 3).
2. Daemon peak RSS: `supervisor_max_rss_kb` from status.json, which the daemon
   fills from VmHWM in /proc/self/status just before it records the end.
3. `status` latency: median wall time of 20 runs of `status` on a finished
   task, measured with time.perf_counter around subprocess.run, for plain
   `python3 supervisor.py` and for `python3 -I -S supervisor.py`.
"""

import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SUPERVISOR = os.path.join(HERE, "supervisor.py")


def run(py, flags, base, *args, stdin=b""):
    p = subprocess.run([py] + flags + [SUPERVISOR] + list(args) + ["--base", base],
                       input=stdin, stdout=subprocess.PIPE, check=False)
    return json.loads(p.stdout)


def main():
    size, runs, py = 1 << 30, 3, sys.executable
    argv = sys.argv[1:]
    while argv:
        opt = argv.pop(0)
        if opt == "--size":
            size = int(argv.pop(0))
        elif opt == "--runs":
            runs = int(argv.pop(0))
        elif opt == "--python":
            py = argv.pop(0)
        else:
            sys.exit("unknown option %s" % opt)
    base = tempfile.mkdtemp(prefix="sup-bench-")
    try:
        rates, rss = [], []
        spec = {"command": "head -c %d /dev/zero" % size, "cwd": None,
                "envs": {"BENCH_API_KEY": "bench-secret-value-0123456789"}, "timeout": 600}
        b64 = base64.b64encode(json.dumps(spec).encode()).decode()
        tid = None
        for i in range(runs):
            tid = os.urandom(16).hex()
            run(py, [], base, "start", "--task-id", tid, stdin=b64.encode() + b"\n")
            while True:
                st = run(py, [], base, "status", "--task-id", tid, "--limit", "0", "--wait", "5",
                         "--stdout-offset", str(1 << 40), "--stderr-offset", str(1 << 40))
                if st["state"] != "running":
                    break
            if st["state"] != "succeeded" or st["stdout_total_bytes"] != size:
                sys.exit("run %d: unexpected result %r" % (i, st))
            with open(os.path.join(base, "tasks", tid, "status.json")) as f:
                rec = json.load(f)
            secs = rec["finished_at"] - rec["started_at"]
            rates.append(size / secs / 1e6)
            rss.append(rec.get("supervisor_max_rss_kb"))
            print("run %d: %d bytes in %.3f s = %.0f MB/s, daemon peak RSS %s KiB"
                  % (i + 1, size, secs, rates[-1], rss[-1]))
        print("drain rate median of %d: %.0f MB/s (%.0f MiB/s)"
              % (runs, statistics.median(rates), statistics.median(rates) * 1e6 / (1 << 20)))
        print("daemon peak RSS (VmHWM): max %s KiB" % max(r for r in rss if r is not None))

        for flags in ([], ["-I", "-S"]):
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                subprocess.run([py] + flags + [SUPERVISOR, "status", "--task-id", tid,
                                               "--base", base], stdout=subprocess.DEVNULL)
                times.append(time.perf_counter() - t0)
            print("status latency (%s supervisor.py): median %.1f ms, min %.1f ms"
                  % (" ".join([os.path.basename(py)] + flags), statistics.median(times) * 1000,
                     min(times) * 1000))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
