"""Static checks of deploy/compose (no Docker engine needed): the compose file
parses, every file it mounts exists (except ./tls, which the user generates),
the proxy gets a value for every ${VAR} in the nginx template, the gateway
config uses only keys of the agreed schema, and the services are wired as the
README says (TLS only at the proxy, gateway not published, privileges for the
embedded provider). Prints "N passed, M failed"; exits 1 on any failure.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_k8s import CONFIG_KEYS, report  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPOSE_DIR = os.path.join(ROOT, "deploy", "compose")


def main() -> int:
    results: list[tuple[str, bool, object]] = []

    def check(name: str, ok: object, detail: object = "") -> None:
        results.append((name, bool(ok), detail))

    with open(os.path.join(COMPOSE_DIR, "compose.yaml"), encoding="utf-8") as f:
        compose = yaml.safe_load(f)
    services = compose.get("services", {})
    check("services gateway and proxy", {"gateway", "proxy"} <= set(services), sorted(services))
    gateway, proxy = services.get("gateway", {}), services.get("proxy", {})

    missing = []
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")) and source != "./tls":
                if not os.path.exists(os.path.normpath(os.path.join(COMPOSE_DIR, source))):
                    missing.append(source)
    check("every bind-mounted file exists", not missing, missing)
    build = gateway.get("build", {})
    context = os.path.normpath(os.path.join(COMPOSE_DIR, build.get("context", ".")))
    check("the gateway builds the repository's Dockerfile, target local",
          os.path.isfile(os.path.join(context, "Dockerfile")) and build.get("target") == "local", build)

    template_mount = next((v for v in proxy.get("volumes", []) if ".template" in v), "")
    template_path = os.path.normpath(os.path.join(COMPOSE_DIR, template_mount.split(":", 1)[0]))
    placeholders = set()
    if os.path.isfile(template_path):
        with open(template_path, encoding="utf-8") as f:
            body = "\n".join(line for line in f.read().splitlines() if not line.lstrip().startswith("#"))
        placeholders = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)\}", body))
    env = proxy.get("environment", {})
    check("the nginx template is mounted where the nginx image renders templates",
          ":/etc/nginx/templates/" in template_mount and placeholders, template_mount)
    check("the proxy sets every template placeholder", placeholders <= set(env), sorted(placeholders - set(env)))
    upstream = env.get("SANDBOX_MCP_UPSTREAM", "")
    check("the proxy's upstream is the gateway service", upstream.split(":")[0] == "gateway", upstream)

    config_mount = next((v for v in gateway.get("volumes", []) if v.endswith("config.toml:ro")), "")
    config_path = os.path.normpath(os.path.join(COMPOSE_DIR, config_mount.split(":", 1)[0]))
    with open(config_path, "rb") as f:
        config = tomllib.load(f)
    unknown = {f"{s}.{k}" for s, table in config.items() for k in table
               if s not in CONFIG_KEYS or k not in CONFIG_KEYS[s]}
    check("the gateway config uses only keys of the agreed schema", not unknown, sorted(unknown))
    target = config_mount.split(":")[1] if config_mount else ""
    check("serve reads the mounted config", target in gateway.get("command", []), (gateway.get("command"), target))
    listen_port = config.get("server", {}).get("listen", ":0").rsplit(":", 1)[1]
    check("the upstream port is the gateway's listen port", upstream.endswith(f":{listen_port}"), (upstream, listen_port))
    check("the gateway is not published (only the proxy is)", "ports" not in gateway, gateway.get("ports"))
    check("the proxy publishes on loopback only", all(str(p).startswith("127.0.0.1:") for p in proxy.get("ports", [])),
          proxy.get("ports"))
    check("the embedded provider gets CAP_SYS_ADMIN and unconfined seccomp/AppArmor",
          "SYS_ADMIN" in gateway.get("cap_add", [])
          and {"seccomp=unconfined", "apparmor=unconfined"} <= set(gateway.get("security_opt", [])), gateway)
    state_dir = config.get("local", {}).get("state_dir", "")
    check("the provider's state directory is a volume (not the container's overlay root)",
          any(v.split(":")[1] == state_dir and not v.startswith((".", "/")) for v in gateway.get("volumes", [])),
          (state_dir, gateway.get("volumes")))
    check("the proxy's server name is an allowed host",
          env.get("PROXY_SERVER_NAME") in config.get("server", {}).get("allowed_hosts", []), env)

    return report(results)


if __name__ == "__main__":
    sys.exit(main())
