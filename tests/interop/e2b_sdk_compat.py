#!/usr/bin/env python3
"""The official E2B Python SDK (e2b==2.63.0) against the local provider.

Usage: PROVIDER_URL=http://127.0.0.1:PORT [E2B_API_KEY=e2b_<40 hex>] python3 e2b_sdk_compat.py

PROVIDER_URL is the provider's origin (control plane and envd on one port);
the script points E2B_API_URL and E2B_SANDBOX_URL at it. Every step uses the
SDK's own calls and expectations; the first failure exits non-zero with the
step name and the error. On success it prints "N passed, 0 failed".
"""

import os
import sys
import time
import traceback
import uuid

EXPECTED_SDK = "2.63.0"


def main() -> int:
    url = os.environ.get("PROVIDER_URL", "").rstrip("/")
    if not url:
        print("PROVIDER_URL is not set (e.g. http://127.0.0.1:3000)", file=sys.stderr)
        return 2
    os.environ["E2B_API_URL"] = url
    os.environ["E2B_SANDBOX_URL"] = url
    os.environ.setdefault("E2B_API_KEY", "e2b_" + "0" * 38 + "aa")
    os.environ.pop("E2B_DEBUG", None)
    os.environ.pop("E2B_DOMAIN", None)

    try:
        from importlib.metadata import version

        import e2b
        from e2b import CommandExitException, NotFoundException, Sandbox, SandboxQuery, TimeoutException
    except ImportError as err:
        print(f"the e2b SDK is not installed in {sys.executable}: {err}", file=sys.stderr)
        return 2
    sdk_version = version("e2b")
    if sdk_version != EXPECTED_SDK:
        print(f"warning: e2b {sdk_version} installed, this script targets {EXPECTED_SDK}", file=sys.stderr)

    passed = 0
    tag = uuid.uuid4().hex[:12]
    state: dict = {}

    def step(name, fn):
        nonlocal passed
        started = time.monotonic()
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - report any failure with its step
            print(f"FAIL {name}: {type(err).__name__}: {err}", file=sys.stderr)
            traceback.print_exc()
            print(f"{passed} passed, 1 failed", file=sys.stderr)
            cleanup()
            sys.exit(1)
        passed += 1
        print(f"ok   {name} ({(time.monotonic() - started) * 1000:.0f} ms)")

    def check(condition, message):
        if not condition:
            raise AssertionError(message)

    def cleanup():
        for key in ("sbx", "other", "net", "net2", "net3"):
            sbx = state.get(key)
            if sbx is not None:
                try:
                    sbx.kill()
                except Exception:  # noqa: BLE001 - best effort
                    pass

    def create():
        sbx = Sandbox.create(
            template="base",
            timeout=120,
            metadata={"suite": tag, "kind": "sdk compat"},
            envs={"FROM_CREATE": "sandbox-level"},
        )
        check(sbx.sandbox_id, "no sandbox id")
        state["sbx"] = sbx

    def run_foreground():
        sbx = state["sbx"]
        result = sbx.commands.run("echo hello; echo oops >&2; echo $FROM_CREATE $LOCAL", envs={"LOCAL": "cmd-level"})
        check(result.exit_code == 0, f"exit code {result.exit_code}")
        check(result.stdout == "hello\nsandbox-level cmd-level\n", f"stdout {result.stdout!r}")
        check(result.stderr == "oops\n", f"stderr {result.stderr!r}")
        result = sbx.commands.run("pwd; id -un", cwd="/tmp", user="root")
        check(result.stdout == "/tmp\nroot\n", f"cwd/user stdout {result.stdout!r}")

    def run_failing():
        sbx = state["sbx"]
        try:
            sbx.commands.run("echo partial; exit 7")
        except CommandExitException as err:
            check(err.exit_code == 7, f"exit code {err.exit_code}")
            check(err.stdout == "partial\n", f"stdout {err.stdout!r}")
            return
        raise AssertionError("a failing command did not raise CommandExitException")

    def background():
        sbx = state["sbx"]
        handle = sbx.commands.run("echo started; touch /tmp/bg-ready; sleep 300", background=True)
        check(handle.pid > 0, f"pid {handle.pid}")
        pids = [p.pid for p in sbx.commands.list()]
        check(handle.pid in pids, f"background pid {handle.pid} not listed: {pids}")
        deadline = time.monotonic() + 10
        while not sbx.files.exists("/tmp/bg-ready"):
            check(time.monotonic() < deadline, "the background command did not start within 10 s")
            time.sleep(0.05)
        check(sbx.commands.kill(handle.pid) is True, "kill returned False")
        try:
            result = handle.wait()
            raise AssertionError(f"wait after kill returned {result!r}")
        except CommandExitException as err:
            check(err.exit_code != 0, f"killed command exit code {err.exit_code}")
            check("started" in err.stdout, f"stdout {err.stdout!r}")
        check(sbx.commands.kill(handle.pid) is False, "killing a dead pid returned True")
        check(handle.pid not in [p.pid for p in sbx.commands.list()], "killed pid still listed")

    def stdin():
        sbx = state["sbx"]
        handle = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(handle.pid, "hello ")
        sbx.commands.send_stdin(handle.pid, b"stdin\n")
        sbx.commands.close_stdin(handle.pid)
        result = handle.wait()
        check(result.stdout == "hello stdin\n", f"stdout {result.stdout!r}")

    def files_text_bytes():
        sbx = state["sbx"]
        info = sbx.files.write("/tmp/sdk/hello.txt", "héllo world\n")
        check(info.path == "/tmp/sdk/hello.txt", f"write info {info}")
        check(sbx.files.read("/tmp/sdk/hello.txt") == "héllo world\n", "text round trip")
        blob = bytes(range(256)) * 64
        sbx.files.write("/tmp/sdk/blob.bin", blob)
        back = sbx.files.read("/tmp/sdk/blob.bin", format="bytes")
        check(bytes(back) == blob, "bytes round trip")
        check(sbx.commands.run("wc -c < /tmp/sdk/blob.bin").stdout.strip() == str(len(blob)), "size in sandbox")

    def files_manage():
        sbx = state["sbx"]
        check(sbx.files.make_dir("/tmp/sdk/dir") is True, "make_dir new")
        check(sbx.files.make_dir("/tmp/sdk/dir") is False, "make_dir existing")
        names = sorted(e.name for e in sbx.files.list("/tmp/sdk"))
        check(names == ["blob.bin", "dir", "hello.txt"], f"list {names}")
        check(sbx.files.exists("/tmp/sdk/hello.txt"), "exists")
        check(not sbx.files.exists("/tmp/sdk/nope"), "exists on a missing file")
        entry = sbx.files.rename("/tmp/sdk/hello.txt", "/tmp/sdk/dir/renamed.txt")
        check(entry.path == "/tmp/sdk/dir/renamed.txt", f"rename {entry}")
        check(sbx.files.read("/tmp/sdk/dir/renamed.txt") == "héllo world\n", "renamed content")
        sbx.files.remove("/tmp/sdk/dir")
        check(not sbx.files.exists("/tmp/sdk/dir/renamed.txt"), "removed")
        try:
            sbx.files.read("/tmp/sdk/dir/renamed.txt")
            raise AssertionError("reading a removed file succeeded")
        except NotFoundException:
            pass

    def more_sdk_paths():
        sbx = state["sbx"]
        check(sbx.is_running(), "is_running is False")
        again = Sandbox.connect(sbx.sandbox_id)
        check(again.commands.run("echo via-connect").stdout == "via-connect\n", "connect to a running sandbox")
        handle = sbx.commands.run("sleep 0.5; echo one; sleep 0.3; echo two", background=True)
        attached = sbx.commands.connect(handle.pid)
        check(attached.wait().stdout == "one\ntwo\n", "commands.connect output")
        written = sbx.files.write_files([{"path": "/tmp/multi/a.txt", "data": "A"}, {"path": "/tmp/multi/b.bin", "data": b"B"}])
        check(sorted(w.path for w in written) == ["/tmp/multi/a.txt", "/tmp/multi/b.bin"], f"write_files {written}")
        check(sbx.files.read("/tmp/multi/b.bin") == "B", "write_files content")
        import io

        sbx.files.write("/tmp/multi/stream.bin", io.BytesIO(b"s" * 100_000))  # octet-stream upload
        check(len(sbx.files.read("/tmp/multi/stream.bin", format="bytes")) == 100_000, "octet-stream upload")
        check(sum(len(c) for c in sbx.files.read("/tmp/multi/stream.bin", format="stream")) == 100_000, "stream read")
        text = "gzip round trip " * 5000
        sbx.files.write("/tmp/multi/gz.txt", text, gzip=True)  # Content-Encoding: gzip upload
        check(sbx.files.read("/tmp/multi/gz.txt", gzip=True) == text, "gzip write + read")
        try:
            sbx.commands.run("sleep 30", timeout=1)
            raise AssertionError("a command past its timeout did not raise")
        except TimeoutException:
            pass
        import urllib.request

        signed = urllib.request.Request(sbx.download_url("/tmp/multi/a.txt"), headers={"E2b-Sandbox-Id": sbx.sandbox_id})
        check(urllib.request.urlopen(signed, timeout=10).read() == b"A", "signed download_url")

    def pause_and_resume():
        sbx = state["sbx"]
        check(sbx.pause() is True, "pause returned False")
        resumed = Sandbox.connect(sbx.sandbox_id)
        check(resumed.files.read("/tmp/multi/a.txt") == "A", "file after resume")
        check(resumed.commands.run("echo resumed").stdout == "resumed\n", "command after resume")

    def timeout_and_info():
        sbx = state["sbx"]
        sbx.set_timeout(200)
        info = sbx.get_info()
        check(info.sandbox_id == sbx.sandbox_id, f"info id {info.sandbox_id}")
        check(info.metadata.get("suite") == tag, f"metadata {info.metadata}")
        left = (info.end_at - info.started_at).total_seconds()
        check(left > 150, f"deadline only {left}s after start")
        check(str(info.state).lower().endswith("running"), f"state {info.state}")
        metrics = sbx.get_metrics()
        check(len(metrics) >= 1, f"metrics {metrics}")
        m = metrics[-1]
        check(m.cpu_count >= 1 and m.mem_total > 0 and m.mem_used > 0, f"metrics {m}")
        check(0 <= m.mem_cache <= m.mem_total, f"metrics {m}")

    def list_with_metadata():
        sbx = state["sbx"]
        other = Sandbox.create(template="base", timeout=60, metadata={"suite": "someone-else"})
        state["other"] = other
        paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": tag, "kind": "sdk compat"}))
        ids = []
        while paginator.has_next:
            ids += [s.sandbox_id for s in paginator.next_items()]
        check(ids == [sbx.sandbox_id], f"listed {ids}, expected only {sbx.sandbox_id}")

    probe_src = (
        "import socket, sys\n"
        "try:\n"
        "    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
        "    s.settimeout(5)\n"
        "    s.sendall(b'GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n')\n"
        "    data = s.recv(4096)\n"
        "    print('OPEN' if data.startswith(b'HTTP/') else 'CLOSED')\n"
        "except Exception:\n"
        "    print('CLOSED')\n"
    )

    def probe(sbx, host, port):
        sbx.files.write("/tmp/probe.py", probe_src)
        return sbx.commands.run(f"python3 /tmp/probe.py {host} {port}").stdout.strip()

    def network_rules():
        # NETWORK_TEST_HOST is a test host of the Rust test in 198.18.0.0/15, serving HTTP.
        host, port = os.environ["NETWORK_TEST_HOST"].rsplit(":", 1)
        sbx = Sandbox.create(template="base", timeout=120, metadata={"suite": tag}, network={"deny_out": [host]})
        state["net"] = sbx
        check(probe(sbx, host, port) == "CLOSED", "deny_out did not block the test host")
        sbx.update_network({"allow_out": [host], "deny_out": ["0.0.0.0/0"]})
        check(probe(sbx, host, port) == "OPEN", "allow_out did not win over deny_out after update_network")
        sbx.update_network({})
        check(probe(sbx, host, port) == "OPEN", "an empty update did not clear the rules")
        sbx.update_network({"deny_out": ["0.0.0.0/0"]})
        check(probe(sbx, host, port) == "CLOSED", "deny_out 0.0.0.0/0 did not block")
        check(probe(sbx, "127.0.0.1", url.rsplit(":", 1)[1]) == "CLOSED", "the provider is reachable")
        sbx.kill()
        state.pop("net")
        offline = Sandbox.create(template="base", timeout=120, metadata={"suite": tag}, allow_internet_access=False)
        state["net"] = offline
        check(probe(offline, host, port) == "CLOSED", "allow_internet_access=False did not block")
        offline.kill()
        state.pop("net")

    def inbound_get_host():
        import httpx

        def serve(sbx, text):
            sbx.files.write("/tmp/www/index.html", text)
            sbx.commands.run("cd /tmp/www && python3 -m http.server 8000", background=True)

        def get(sbx, token=None, expect=200):
            # get_host(port) and, when not public, the token in the e2b-traffic-access-token
            # header: what E2B's docs tell SDK users to send.
            headers = {"Host": sbx.get_host(8000)}
            if token is not None:
                headers["e2b-traffic-access-token"] = token
            deadline = time.monotonic() + 10
            while True:
                resp = httpx.get(url + "/index.html", headers=headers)
                if resp.status_code == expect or time.monotonic() > deadline:
                    return resp
                time.sleep(0.1)

        sbx = Sandbox.create(template="base", timeout=120, metadata={"suite": tag}, network={"allow_public_traffic": False})
        state["net"] = sbx
        other = Sandbox.create(template="base", timeout=120, metadata={"suite": tag}, network={"allow_public_traffic": False})
        state["net2"] = other
        public = Sandbox.create(template="base", timeout=120, metadata={"suite": tag})
        state["net3"] = public
        token = sbx.traffic_access_token
        check(isinstance(token, str) and len(token) > 10, f"traffic_access_token {token!r}")
        check(other.traffic_access_token not in (None, token), "the second sandbox has no token of its own")
        check(public.traffic_access_token is None, f"default (public) sandbox token {public.traffic_access_token!r}")
        serve(sbx, "served from the sandbox\n")
        serve(public, "served publicly\n")
        host = sbx.get_host(8000)
        check(host.startswith(f"8000-{sbx.sandbox_id}."), f"get_host {host!r}")
        resp = get(sbx, token)
        check(resp.status_code == 200 and resp.text == "served from the sandbox\n", f"{resp.status_code} {resp.text!r}")
        denied = get(sbx, expect=403)
        check(denied.status_code == 403, f"without the traffic token: {denied.status_code}")
        body = denied.json()
        check(body.get("code") == 403 and body.get("sandboxId") == sbx.sandbox_id, f"refusal body {body}")
        check("e2b-traffic-access-token" in body.get("message", ""), f"refusal message {body}")
        wrong = get(sbx, other.traffic_access_token, expect=403)
        check(wrong.status_code == 403, f"with another sandbox's token: {wrong.status_code}")
        resp = get(public)
        check(resp.status_code == 200 and resp.text == "served publicly\n", f"public: {resp.status_code} {resp.text!r}")
        again = Sandbox.connect(sbx.sandbox_id)
        check(again.traffic_access_token == token, "connect returned another traffic token")
        network = sbx.get_info().network or {}
        check(network.get("allow_public_traffic") is False, f"get_info network {network}")
        for s in (sbx, other, public):
            s.kill()
        for key in ("net", "net2", "net3"):
            state.pop(key)

    def kill_and_connect():
        sbx = state["sbx"]
        sandbox_id = sbx.sandbox_id
        check(sbx.kill() is True, "kill returned False")
        state["other"].kill()
        state.clear()
        check(Sandbox.kill(sandbox_id) is False, "second kill returned True")
        try:
            Sandbox.connect(sandbox_id)
            raise AssertionError("connect to a killed sandbox succeeded")
        except NotFoundException:
            pass

    step("create with metadata and envs", create)
    step("commands.run foreground (stdout, stderr, envs, cwd, user)", run_foreground)
    step("commands.run failing raises CommandExitException", run_failing)
    step("background command: list, kill, wait", background)
    step("stdin: send_stdin / close_stdin", stdin)
    step("files.write / read (text and bytes)", files_text_bytes)
    step("files.list / make_dir / exists / rename / remove", files_manage)
    step("is_running, connect, commands.connect, write_files, octet-stream, gzip, timeout, signed URL", more_sdk_paths)
    step("pause, then connect resumes", pause_and_resume)
    step("set_timeout, get_info and get_metrics", timeout_and_info)
    step("Sandbox.list with a metadata filter", list_with_metadata)
    step("network: create with deny_out, update_network (allow_out wins, empty clears), no internet", network_rules)
    step("inbound: get_host(port) with and without the traffic token, another's, public, connect", inbound_get_host)
    step("kill, then connect raises not found", kill_and_connect)
    print(f"{passed} passed, 0 failed (e2b {sdk_version}, {getattr(e2b, '__name__', 'e2b')} at {url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
