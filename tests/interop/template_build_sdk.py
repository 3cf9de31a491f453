#!/usr/bin/env python3
"""The official E2B Python SDK's Template API (e2b==2.63.0) against the local provider.

Usage: template_build_sdk.py SCENARIO   (run by tests/it/template_builds.rs)

Environment: PROVIDER_URL (the provider's origin: control plane and envd), E2B_API_KEY,
REGISTRY (a private loopback registry, host:port) with REGISTRY_USER / REGISTRY_PASSWORD,
PUBLIC_REGISTRY (an anonymous one), RUN_TAG (a suffix that makes template names unique), and
SCENARIO_ARGS (JSON, what a scenario needs beyond that). Every check fails loudly (a traceback
and a non-zero exit); on success the last line is `RESULT {json}` with what the Rust side checks.
"""

import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
import time
import uuid

import httpx
from e2b import BuildException, Sandbox, Template, wait_for_file
from e2b.api.client.api.templates import delete_templates_template_id, get_templates
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig

URL = os.environ["PROVIDER_URL"].rstrip("/")
os.environ["E2B_API_URL"] = URL
os.environ["E2B_SANDBOX_URL"] = URL
os.environ.pop("E2B_DOMAIN", None)
os.environ.pop("E2B_DEBUG", None)
API_KEY = os.environ["E2B_API_KEY"]
REGISTRY = os.environ.get("REGISTRY", "")
USER = os.environ.get("REGISTRY_USER", "")
PASSWORD = os.environ.get("REGISTRY_PASSWORD", "")
PUBLIC = os.environ.get("PUBLIC_REGISTRY", "")
TAG = os.environ.get("RUN_TAG", uuid.uuid4().hex[:8])
ARGS = json.loads(os.environ.get("SCENARIO_ARGS", "{}"))
DEBIAN = f"{REGISTRY}/team/debian:bookworm"
PYTHON = f"{REGISTRY}/team/debian-python:bookworm"


def check(condition, message):
    if not condition:
        raise AssertionError(message)


class Logs:
    """An on_build_logs callback that keeps every entry; `server` is what the provider sent."""

    def __init__(self):
        self.entries = []

    def __call__(self, entry):
        self.entries.append(entry)

    def server(self):
        # The SDK logs its own steps first; the provider's entries follow "Waiting for logs...".
        out, seen = [], False
        for entry in self.entries:
            if seen and entry.message != "Build finished":
                out.append(entry.message)
            if entry.message == "Waiting for logs...":
                seen = True
        return out

    def text(self):
        return "\n".join(self.server())


def build(template, name, **kwargs):
    """Template.build with a log collector; returns (BuildInfo, Logs, seconds)."""
    logs = Logs()
    started = time.monotonic()
    info = Template.build(template, name, on_build_logs=logs, **kwargs)
    return info, logs, time.monotonic() - started


def build_fails(template, name):
    """Template.build that must raise BuildException; returns (message, Logs)."""
    logs = Logs()
    try:
        Template.build(template, name, on_build_logs=logs)
    except BuildException as err:
        return str(err), logs
    raise AssertionError(f"building {name} did not fail; logs:\n{logs.text()}")


def sh(sbx, cmd, user=None):
    """stdout of `cmd` in the sandbox (CommandExitException when it fails)."""
    return sbx.commands.run(cmd, user=user, timeout=60).stdout


def create_fails(name):
    try:
        sbx = Sandbox.create(name, timeout=60)
    except Exception as err:  # noqa: BLE001 - any SDK error; its message is checked
        return f"{type(err).__name__}: {err}"
    sbx.kill()
    raise AssertionError(f"Sandbox.create({name!r}) succeeded")


def context_dir():
    """A build context: a file, a directory with a subdirectory and an executable script."""
    ctx = tempfile.mkdtemp(prefix="sdk-ctx-")
    with open(os.path.join(ctx, "hello.txt"), "w") as f:
        f.write("hello from the context\n")
    os.makedirs(os.path.join(ctx, "assets", "sub"))
    with open(os.path.join(ctx, "assets", "a.txt"), "w") as f:
        f.write("asset a\n")
    with open(os.path.join(ctx, "assets", "sub", "b.txt"), "w") as f:
        f.write("asset b\n")
    script = os.path.join(ctx, "assets", "run.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\necho script-ran\n")
    os.chmod(script, 0o755)
    return ctx


def image_template(ctx, last_step="echo last-v1 > last.txt; echo ran-$((40+1))-last-v1"):
    """Scenario a's template; `last_step` is its final RUN (scenario d changes it)."""
    return (
        Template(file_context_path=ctx)
        .from_image(DEBIAN, username=USER, password=PASSWORD)
        .copy("hello.txt", "/opt/app/hello.txt", user="root", mode=0o640)
        .copy("assets", "/home/user/assets")
        .set_envs({"GREETING": "hi-from-env", "SECOND": "two"})
        .run_cmd('echo "$GREETING $SECOND $(id -un) $(pwd)" > /home/user/greeting.txt; echo "ran-step1-${GREETING}"')
        .set_user("root")
        .run_cmd("mkdir -p /srv/data && id -un > /srv/data/whoami && apt-get --version | head -n1 > /srv/data/apt")
        .set_user("user")
        .run_cmd("mkdir -p /home/user/work")
        .set_workdir("/home/user/work")
        .run_cmd(last_step)
    )


def scenario_image():
    """(a) A private-registry image with COPY, ENV, RUN, USER and WORKDIR, built; its logs and exists."""
    name = f"sdk-img-{TAG}"
    ctx = context_dir()
    check(not Template.exists(name), f"{name} exists before its build")
    info, logs, seconds = build(image_template(ctx), name)
    text = logs.text()
    check(info.template_id and info.build_id, f"build info {info}")
    check("ran-step1-hi-from-env" in text, f"the first RUN's output is not in the build logs:\n{text}")
    check("ran-41-last-v1" in text, f"the last RUN's output is not in the build logs:\n{text}")
    check(Template.exists(name), f"Template.exists({name!r}) is False after the build")
    return {"name": name, "template_id": info.template_id, "seconds": seconds, "log_lines": len(logs.server())}


def scenario_image_inside():
    """(a) In a sandbox of scenario a's template: the copies, the RUNs' files, the image's dpkg and apt."""
    name = ARGS["name"]
    sbx = Sandbox.create(name, timeout=120)
    try:
        stat = sh(sbx, "stat -c '%U:%G %a' /opt/app/hello.txt; cat /opt/app/hello.txt", user="root")
        check(stat == "root:root 640\nhello from the context\n", f"/opt/app/hello.txt: {stat!r}")
        owners = sh(sbx, "cd /home/user/assets && stat -c '%n %U:%G' a.txt sub/b.txt run.sh && cat a.txt sub/b.txt")
        check(sh(sbx, "/home/user/assets/run.sh") == "script-ran\n", "the copied script keeps its mode")
        greeting = sh(sbx, "cat /home/user/greeting.txt")
        check(greeting == "hi-from-env two user /home/user\n", f"RUN with the ENV, default user/dir: {greeting!r}")
        out = sh(sbx, "stat -c %U /srv/data/whoami; cat /srv/data/whoami /srv/data/apt")
        check(out.startswith("root\nroot\napt 2."), f"the RUN as root: {out!r}")
        where = sh(sbx, "cat /home/user/work/last.txt; stat -c %U /home/user/work/last.txt")
        check(where == "last-v1\nuser\n", f"the RUN after WORKDIR and USER user: {where!r}")
        status = sh(sbx, "dpkg -s apt | grep '^Status:'; apt-get --version | head -n1")
        check(status.startswith("Status: install ok installed\napt 2."), f"dpkg/apt-get: {status!r}")
        verify = sbx.commands.run("dpkg --verify apt dpkg bash coreutils && echo verified", user="root")
        check(verify.stdout == "verified\n", f"dpkg --verify: {verify.stdout!r} {verify.stderr!r}")
        count = int(sh(sbx, "dpkg-query -W -f='${Package}\\n' | wc -l").strip())
        check(count > 50, f"only {count} packages in the image's database")
        defaults = sh(sbx, "id -un; pwd")
    finally:
        sbx.kill()
    # Last, so that a wrong owner does not hide the checks above: as on E2B, a COPY without a user
    # gives the files to the step's user and that user's group.
    want = "a.txt user:user\nsub/b.txt user:user\nrun.sh user:user\nasset a\nasset b\n"
    check(owners == want, f"the copied directory: {owners!r} (want {want!r})")
    return {"packages": count, "defaults": defaults}


def scenario_cache():
    """(d) Scenario a's template again: unchanged (every step cached), then only the last RUN changed."""
    name = ARGS["name"]
    ctx = context_dir()
    _, logs, seconds = build(image_template(ctx), name)
    text = logs.text()
    check("ran-step1-hi-from-env" not in text and "ran-41-last-v1" not in text,
          f"an unchanged rebuild ran a step again:\n{text}")
    check("cache" in text.lower(), f"the unchanged rebuild's logs do not say the steps were cached:\n{text}")
    changed = "echo last-v2 > last.txt; echo ran-$((40+2))-last-v2"
    _, logs2, seconds2 = build(image_template(ctx, last_step=changed), name)
    text2 = logs2.text()
    check("ran-42-last-v2" in text2, f"the changed last RUN did not run:\n{text2}")
    check("ran-step1-hi-from-env" not in text2, f"an unchanged earlier step ran again:\n{text2}")
    sbx = Sandbox.create(name, timeout=60)
    try:
        out = sh(sbx, "cat /home/user/work/last.txt /home/user/greeting.txt")
        check(out == "last-v2\nhi-from-env two user /home/user\n", f"after the changed rebuild: {out!r}")
    finally:
        sbx.kill()
    return {"unchanged_seconds": seconds, "changed_last_seconds": seconds2,
            "unchanged_logs": logs.server(), "changed_logs": logs2.server()}


def scenario_derived():
    """(b) from_template of scenario a's template, built under a second name, used."""
    base = ARGS["name"]
    name = f"sdk-derived-{TAG}"
    template = Template().from_template(base).run_cmd(
        "echo derived > /home/user/derived.txt && cp /home/user/greeting.txt /home/user/derived-greeting.txt")
    build(template, name)
    sbx = Sandbox.create(name, timeout=60)
    try:
        out = sh(sbx, "cat /home/user/derived.txt /home/user/derived-greeting.txt /opt/app/hello.txt", user="root")
        check(out == "derived\nhi-from-env two user /home/user\nhello from the context\n", f"derived: {out!r}")
        check(sh(sbx, "dpkg -s apt | grep -c '^Status: install ok installed'") == "1\n", "dpkg in the derived one")
    finally:
        sbx.kill()
    return {"name": name}


def scenario_repeated_layer():
    """A step that leaves exactly what an earlier one left (a file set back, times pinned) builds, as on E2B."""
    base = ARGS["name"]
    name = f"sdk-repeat-{TAG}"
    # Every path the step's layer holds gets the same time, so that layers 1 and 3 are equal.
    pin = "touch -h -d @1 /home/user/state /home/user /home /etc/passwd /etc/group /etc /"
    template = (
        Template().from_template(base).set_user("root").set_workdir("/")
        .run_cmd(f"echo one > /home/user/state && {pin}")
        .run_cmd(f"echo two > /home/user/state && {pin}")
        .run_cmd(f"echo one > /home/user/state && {pin}")
    )
    build(template, name)
    sbx = Sandbox.create(name, timeout=60)
    try:
        check(sh(sbx, "cat /home/user/state") == "one\n", "the last step's content")
    finally:
        sbx.kill()
    return {"name": name}


def scenario_dockerfile():
    """(c) from_dockerfile with FROM (an anonymous registry), RUN, WORKDIR, COPY, ENV."""
    name = f"sdk-dockerfile-{TAG}"
    ctx = tempfile.mkdtemp(prefix="sdk-df-")
    with open(os.path.join(ctx, "df-file.txt"), "w") as f:
        f.write("copied by the Dockerfile\n")
    dockerfile = (
        f"FROM {PUBLIC}/library/debian:bookworm\n"
        "RUN echo from-dockerfile > /root-made.txt && id -un >> /root-made.txt\n"
        "WORKDIR /app\n"
        "COPY df-file.txt /app/df-file.txt\n"
        "ENV DF_VAR=dockerfile-env\n"
        'RUN echo "$DF_VAR $(pwd)" > /app/env.txt\n'
    )
    build(Template(file_context_path=ctx).from_dockerfile(dockerfile), name)
    sbx = Sandbox.create(name, timeout=60)
    try:
        out = sh(sbx, "cat /root-made.txt /app/df-file.txt /app/env.txt; stat -c %U /app/df-file.txt")
        want = "from-dockerfile\nroot\ncopied by the Dockerfile\ndockerfile-env /app\nroot\n"
        check(out == want, f"the Dockerfile's steps: {out!r}")
        check("apt 2." in sh(sbx, "apt-get --version | head -n1"), "apt-get in the Dockerfile's image")
    finally:
        sbx.kill()
    return {"name": name}


def scenario_failing():
    """(e) A failing RUN: BuildException naming the step, its exit code and its last output."""
    base = ARGS["name"]
    name = f"sdk-failing-{TAG}"
    failing = "echo before-fail; echo out-line-1; echo out-line-2 >&2; exit 3"

    def template():
        return Template().from_template(base).run_cmd("echo first-ok").run_cmd(failing).run_cmd("echo never-runs")

    message, logs = build_fails(template(), name)
    check("3" in message and "exit" in message.lower(), f"the message does not give the exit code: {message!r}")
    check("never-runs" not in logs.text(), f"a step after the failing one ran:\n{logs.text()}")
    check(not Template.exists(name), f"{name} exists after a failed build")
    refused = create_fails(name)
    # The same through build_in_background: the status says error, with the failing step's number.
    info = Template.build_in_background(template(), name)
    status = wait_status(info, {"error"})
    reason = status.reason
    check(reason is not None and reason.step == "2", f"reason {reason!r} (want step '2': the second step)")
    check("3" in reason.message, f"reason message {reason.message!r}")
    tail = [e.message for e in reason.log_entries]
    check(any("out-line-2" in m for m in tail), f"the reason's log entries lack the step's last output: {tail}")
    check(not Template.exists(name), f"{name} exists after a second failed build")
    # Last: the exception itself shows the step's last output (what a user sees first).
    check("out-line-2" in message or "out-line-1" in message, f"the message lacks the step's last output: {message!r}")
    return {"message": message, "create_error": refused, "reason_step": reason.step, "reason_tail": tail}


def wait_status(info, final, seconds=180):
    """Polls Template.get_build_status until a status in `final`; returns the last response."""
    deadline = time.monotonic() + seconds
    while True:
        status = Template.get_build_status(info, logs_offset=0)
        if status.status.value in final:
            return status
        check(status.status.value in ("building", "waiting"), f"unexpected status {status}")
        check(time.monotonic() < deadline, f"build {info.build_id} still {status.status.value} after {seconds} s")
        time.sleep(0.2)


def scenario_credentials():
    """(f) The private registry without credentials, and with wrong ones: clear BuildExceptions."""
    wrong = ARGS["wrong_password"]
    missing, _ = build_fails(Template().from_image(DEBIAN).run_cmd("true"), f"sdk-nocreds-{TAG}")
    low = missing.lower()
    check("credential" in low or "401" in low or "unauthorized" in low, f"no credentials: {missing!r}")
    refused, _ = build_fails(
        Template().from_image(DEBIAN, username=USER, password=wrong).run_cmd("true"), f"sdk-badcreds-{TAG}")
    low = refused.lower()
    check(any(w in low for w in ("credential", "401", "unauthorized", "refused", "denied")), f"wrong: {refused!r}")
    check(wrong not in refused and PASSWORD not in refused, "a password in the error message")
    check(not Template.exists(f"sdk-nocreds-{TAG}") and not Template.exists(f"sdk-badcreds-{TAG}"), "registered")
    return {"missing": missing, "wrong": refused}


def scenario_hostile_images():
    """(g) Hostile images: each refused, or built with its entries neutralised (the host is checked in Rust)."""
    out = {}
    for kind, ref in ARGS["images"].items():
        name = f"sdk-hostile-{kind}-{TAG}"
        template = Template().from_image(ref, username=USER, password=PASSWORD).run_cmd("echo hostile-built")
        try:
            build(template, name)
        except BuildException as err:
            check(not Template.exists(name), f"{name} registered after a refusal")
            out[kind] = {"outcome": "refused", "message": str(err)}
            continue
        sbx = Sandbox.create(name, timeout=60)
        try:
            inside = sbx.commands.run(
                "ls -la / /etc/shadow-link /etc/canary-link /escape 2>&1; cat /etc/canary-link 2>&1;"
                "cmp /etc/shadow /etc/shadow-link && echo shadow-link-is-the-sandbox-shadow",
                user="root").stdout
        finally:
            sbx.kill()
        out[kind] = {"outcome": "built", "inside": inside}
    return out


def scenario_hostile_build():
    """(g) A RUN plants symlinks to host paths; COPY steps then write through them; raw uploads of hostile tars."""
    base, canary = ARGS["name"], ARGS["canary"]
    ctx = tempfile.mkdtemp(prefix="sdk-hostile-")
    with open(os.path.join(ctx, "payload.txt"), "w") as f:
        f.write("payload\n")
    name = f"sdk-linkcopy-{TAG}"
    template = (
        Template(file_context_path=ctx).from_template(base).set_user("root")
        .run_cmd(f"mkdir -p {canary} && echo in-the-sandbox > {canary}/canary.txt && ln -s {canary} /home/user/escape"
                 f" && ln -s {canary}/canary.txt /home/user/canary-file")
        .copy("payload.txt", "/home/user/escape/")
        .copy("payload.txt", "/home/user/canary-file")
    )
    result = {}
    try:
        build(template, name)
        sbx = Sandbox.create(name, timeout=60)
        try:
            result["link_copy"] = sbx.commands.run(
                f"cat /home/user/escape/payload.txt; cat /home/user/canary-file; ls -A {canary} 2>&1; true", user="root"
            ).stdout
        finally:
            sbx.kill()
    except BuildException as err:
        result["link_copy"] = f"refused: {err}"
    result["uploads"] = hostile_uploads(base, canary)
    return result


def hostile_tar(kind, canary):
    """A gzip tar as a client could upload it for a COPY step, hostile in one way (or `benign`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        def add(name, data=b"", **attrs):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for key, value in attrs.items():
                setattr(info, key, value)
            tar.addfile(info, io.BytesIO(data) if data else None)

        add("evil/ok.txt", b"ok\n")
        if kind == "traversal":
            add(f"evil/../../../../../../../..{canary}/escaped-upload", b"pwned\n")
        elif kind == "symlink":
            add("evil/lnk", type=tarfile.SYMTYPE, linkname=canary)
            add("evil/lnk/through-upload", b"pwned\n")
        elif kind == "hardlink":
            add("evil/hl", type=tarfile.LNKTYPE, linkname=f"{canary}/canary.txt")
    return buf.getvalue()


def hostile_uploads(base, canary):
    """The upload link's token is required; a benign tar builds, each hostile one is refused or kept inside."""
    http = httpx.Client(base_url=URL, headers={"X-API-Key": API_KEY}, timeout=60)
    out = {}
    for kind in ("benign", "traversal", "symlink", "hardlink"):
        name = f"sdk-upload-{kind}-{TAG}"
        created = http.post("/v3/templates", json={"name": name})
        check(created.status_code == 202, f"POST /v3/templates: {created.status_code} {created.text}")
        template_id, build_id = created.json()["templateID"], created.json()["buildID"]
        files_hash = hashlib.sha256(f"{kind}-{TAG}".encode()).hexdigest()
        link = http.get(f"/templates/{template_id}/files/{files_hash}")
        check(link.status_code == 201 and not link.json()["present"], f"upload link: {link.status_code} {link.text}")
        url = link.json()["url"]
        body = hostile_tar(kind, canary)
        tokenless = httpx.put(url.split("?", 1)[0], content=body, timeout=60)
        check(tokenless.status_code in (401, 403, 404), f"an upload without its token: {tokenless.status_code}")
        put = httpx.put(url, content=body, timeout=60)
        entry = {"upload": put.status_code}
        if put.status_code < 300:
            start = http.post(f"/v2/templates/{template_id}/builds/{build_id}", json={
                "fromTemplate": base, "force": False,
                "steps": [{"type": "COPY", "args": ["evil", "/home/user/evil", "", ""], "filesHash": files_hash,
                           "force": False}]})
            entry["start"] = start.status_code
            if start.status_code == 202:
                status = poll_raw(http, template_id, build_id)
                entry["status"] = status["status"]
                entry["reason"] = (status.get("reason") or {}).get("message", "")
                if status["status"] == "ready":
                    sbx = Sandbox.create(name, timeout=60)
                    try:
                        entry["inside"] = sbx.commands.run(
                            f"find /home/user/evil -ls 2>&1; ls -A {canary} 2>&1; true", user="root").stdout
                    finally:
                        sbx.kill()
        out[kind] = entry
    return out


def poll_raw(http, template_id, build_id, seconds=120):
    deadline = time.monotonic() + seconds
    while True:
        status = http.get(f"/templates/{template_id}/builds/{build_id}/status").json()
        if status["status"] in ("ready", "error"):
            return status
        check(time.monotonic() < deadline, f"raw build {build_id}: {status}")
        time.sleep(0.2)


def api_client():
    return get_api_client(ConnectionConfig(api_key=API_KEY, api_url=URL))


def scenario_background():
    """(h) build_in_background + get_build_status polling, exists, GET /templates, DELETE /templates/{id}."""
    base = ARGS["name"]
    name = f"sdk-bg-{TAG}"
    template = Template().from_template(base).run_cmd("sleep 2; echo bg-step-$((6*7)); echo bg > /home/user/bg.txt")
    info = Template.build_in_background(template, name)
    check(info.template_id and info.build_id and info.name == name, f"build info {info}")
    seen, offset, messages = set(), 0, []
    deadline = time.monotonic() + 180
    while True:
        status = Template.get_build_status(info, logs_offset=offset)
        seen.add(status.status.value)
        messages += [e.message for e in status.log_entries]
        offset += len(status.log_entries)
        if status.status.value in ("ready", "error"):
            break
        check(time.monotonic() < deadline, f"still {status.status.value} after 180 s")
        time.sleep(0.2)
    check(status.status.value == "ready", f"background build ended {status}")
    check("building" in seen, f"never saw 'building' while a 2 s step ran: {seen}")
    check(any("bg-step-42" in m for m in messages), f"the step's output is not in the polled logs: {messages}")
    again = Template.get_build_status(info, logs_offset=offset)
    check(again.log_entries == [], f"entries past the offset after the end: {again.log_entries}")
    full = [e.message for e in Template.get_build_status(info, logs_offset=0).log_entries]
    check(full == messages, f"the entries polled by offset differ from the whole log:\n{messages}\n{full}")
    check(Template.exists(name), "exists after the background build")
    listed = get_templates.sync_detailed(client=api_client())
    check(listed.status_code == 200, f"GET /templates: {listed.status_code}")
    ids = [t.template_id for t in listed.parsed]
    check(info.template_id in ids, f"{info.template_id} not in GET /templates: {ids}")
    sbx = Sandbox.create(name, timeout=60)
    try:
        check(sh(sbx, "cat /home/user/bg.txt") == "bg\n", "the background build's file")
    finally:
        sbx.kill()
    deleted = delete_templates_template_id.sync_detailed(template_id=info.template_id, client=api_client())
    check(deleted.status_code == 204, f"DELETE /templates/{info.template_id}: {deleted.status_code} {deleted.content}")
    check(not Template.exists(name), "exists after the delete")
    refused = create_fails(name)
    check(name in refused or "not found" in refused.lower(), f"create after the delete: {refused}")
    ids = [t.template_id for t in get_templates.sync_detailed(client=api_client()).parsed]
    check(info.template_id not in ids, "still listed after the delete")
    return {"seen": sorted(seen), "log_entries": len(messages), "create_error": refused}


def scenario_tags():
    """Tags: a build as name:v1 with tags, get_tags, assign_tags, remove_tags, create by name:tag."""
    base = ARGS["name"]
    name = f"sdk-tags-{TAG}"
    build(Template().from_template(base).run_cmd("echo v1 > /home/user/version"), f"{name}:v1", tags=["stable"])
    tags = sorted(t.tag for t in Template.get_tags(name))
    check("v1" in tags and "stable" in tags, f"get_tags: {tags}")
    assigned = Template.assign_tags(f"{name}:v1", "prod")
    check("prod" in assigned.tags, f"assign_tags: {assigned}")
    Template.remove_tags(name, "stable")
    tags = sorted(t.tag for t in Template.get_tags(name))
    check("prod" in tags and "stable" not in tags, f"after remove_tags: {tags}")
    sbx = Sandbox.create(f"{name}:prod", timeout=60)
    try:
        check(sh(sbx, "cat /home/user/version") == "v1\n", "create by name:tag")
    finally:
        sbx.kill()
    return {"tags": tags}


def scenario_start_cmd():
    """(i) set_start_cmd with wait_for_file: create returns once the start command is ready."""
    name = f"sdk-start-{TAG}"
    start = (
        "id -un > /tmp/start-user; pwd > /tmp/start-cwd; echo \"$START_ENV\" > /tmp/start-env; "
        "python3 -m http.server 8000 --bind 127.0.0.1 >/tmp/http.log 2>&1 & sleep 1.5; "
        "until python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8000/\")' 2>/dev/null; "
        "do sleep 0.1; done; touch /tmp/ready; wait"
    )
    template = (
        Template().from_image(PYTHON, username=USER, password=PASSWORD)
        .set_envs({"START_ENV": "env-at-start"})
        .run_cmd("echo built")
        .set_start_cmd(start, wait_for_file("/tmp/ready"))
    )
    build(template, name)
    started = time.monotonic()
    sbx = Sandbox.create(name, timeout=120)
    create_seconds = time.monotonic() - started
    try:
        check(sbx.files.exists("/tmp/ready"), "create returned before the ready command passed")
        code = sh(sbx, "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8000/\").status)'")
        check(code == "200\n", f"the start command's server: {code!r}")
        facts = sh(sbx, "cat /tmp/start-user /tmp/start-cwd /tmp/start-env")
        check(facts == "user\n/home/user\nenv-at-start\n", f"start command user/cwd/env: {facts!r}")
    finally:
        sbx.kill()
    check(create_seconds >= 1.4, f"create took {create_seconds:.2f} s: it did not wait for the ready command")
    return {"name": name, "create_seconds": create_seconds}


def scenario_gateway_template():
    """A python3 template for the gateway's create_sandbox and start_task."""
    name = f"sdk-gw-{TAG}"
    build(Template().from_image(PYTHON, username=USER, password=PASSWORD)
          .run_cmd("echo gateway-file > /home/user/gw.txt"), name)
    return {"name": name}


SCENARIOS = {
    "image": scenario_image,
    "image_inside": scenario_image_inside,
    "cache": scenario_cache,
    "derived": scenario_derived,
    "repeated_layer": scenario_repeated_layer,
    "dockerfile": scenario_dockerfile,
    "failing": scenario_failing,
    "credentials": scenario_credentials,
    "hostile_images": scenario_hostile_images,
    "hostile_build": scenario_hostile_build,
    "background": scenario_background,
    "tags": scenario_tags,
    "start_cmd": scenario_start_cmd,
    "gateway_template": scenario_gateway_template,
}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        print(f"usage: {sys.argv[0]} {'|'.join(SCENARIOS)}", file=sys.stderr)
        return 2
    result = SCENARIOS[sys.argv[1]]()
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
