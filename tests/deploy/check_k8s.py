"""Consistency checks on the rendered Kubernetes manifests (deploy/k8s), beyond
what the API schemas can say: the properties issue 5 asks for, and that the
pieces refer to each other correctly (selectors, ports, names, config).

Usage: check_k8s.py RENDERED.yaml
  Prints one line per check and "N passed, M failed"; exits 1 on any failure.
  With --self-test, also breaks each property on purpose and requires the
  checks to notice (so none of them can silently always pass).
"""

from __future__ import annotations

import copy
import sys
import tomllib
from collections.abc import Callable
from typing import Any

import yaml

# The agreed config schema (notes/config.md, src/config.rs): every key the TOML may hold.
CONFIG_KEYS = {
    "server": {
        "listen", "allowed_hosts", "allowed_origins", "max_body_bytes", "session_idle_timeout_secs",
        "sse_keep_alive_secs", "shutdown_grace_secs", "insecure_no_auth", "log_format",
    },
    "auth": {"tokens"},
    "provider": {"kind", "api_url", "sandbox_url", "domain", "api_key_env", "request_timeout_secs", "deployment"},
    "local": {"state_dir", "max_sandboxes", "memory_limit_mb", "pids_limit"},
    "sandbox": {"default_template", "default_timeout_secs", "max_timeout_secs", "renew_on_use_secs"},
    "metrics": {"enabled", "listen"},
    "tasks": {"secrets"},
    "sessions": {"store", "password_env", "key_prefix", "timeout_ms", "pool_size", "cleanup_lease_secs",
                 "sweep_interval_secs"},
}
# "Keep the default sandbox timeout modest": a crashed replica's sandboxes live this long.
MAX_DEFAULT_SANDBOX_TIMEOUT_SECS = 3600

Docs = list[dict[str, Any]]
Result = tuple[str, bool, Any]


def one(docs: Docs, kind: str, name_prefix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"].startswith(name_prefix)]
    if len(found) != 1:
        raise LookupError(f"expected exactly one {kind} named {name_prefix}*, found {len(found)}")
    return found[0]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def checks(docs: Docs) -> list[Result]:
    out: list[Result] = []

    def check(name: str, ok: Any, detail: Any = "") -> None:
        out.append((name, bool(ok), detail))

    kinds = {d.get("kind") for d in docs}
    wanted = {"Deployment", "Service", "Ingress", "HorizontalPodAutoscaler", "PodDisruptionBudget",
              "NetworkPolicy", "ConfigMap", "Secret", "ServiceAccount"}
    check("all required kinds are rendered", wanted <= kinds, sorted(wanted - kinds))

    dep = one(docs, "Deployment")
    pod = dep["spec"]["template"]
    pod_spec = pod["spec"]
    pod_labels = pod["metadata"]["labels"]
    containers = pod_spec["containers"]
    check("one container", len(containers) == 1, len(containers))
    c = containers[0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}

    # Config (from the generated ConfigMap the Deployment mounts).
    cm_name = next((v["configMap"]["name"] for v in pod_spec.get("volumes", []) if "configMap" in v), None)
    cm = next((d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == cm_name), None)
    check("the Deployment mounts the rendered (hash-suffixed) ConfigMap", cm is not None, cm_name)
    config: dict[str, Any] = {}
    if cm is not None:
        config = tomllib.loads(cm["data"]["config.toml"])
    unknown = {f"{s}.{k}" for s, table in config.items() for k in (table if isinstance(table, dict) else {"?"})
               if s not in CONFIG_KEYS or k not in CONFIG_KEYS[s]}
    check("config.toml uses only keys of the agreed schema", config and not unknown, sorted(unknown))
    server = config.get("server", {})
    mount = next((m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] == next(
        (v["name"] for v in pod_spec.get("volumes", []) if "configMap" in v), None)), None)
    check("serve is started with --config pointing into the ConfigMap mount",
          c.get("args", [])[:1] == ["serve"] and f"{mount}/config.toml" in c.get("args", []), (c.get("args"), mount))
    check("the gateway listens on all interfaces at the container's http port",
          server.get("listen", "").startswith("0.0.0.0:") and port_of(server.get("listen", ":0")) == ports.get("http"),
          (server.get("listen"), ports))
    metrics_listen = config.get("metrics", {}).get("listen", "")
    check("a separate metrics listener matches the container's metrics port",
          not metrics_listen or port_of(metrics_listen) == ports.get("metrics"), (metrics_listen, ports))
    check("the provider is E2B (the embedded local provider needs privileges the pod does not have)",
          config.get("provider", {}).get("kind") == "e2b", config.get("provider"))
    check("the default sandbox timeout is modest (bounds what a crash leaves behind)",
          0 < config.get("sandbox", {}).get("default_timeout_secs", 0) <= MAX_DEFAULT_SANDBOX_TIMEOUT_SECS,
          config.get("sandbox"))
    check("no auth bypass in production config", not server.get("insecure_no_auth", False), server)

    # Secrets wired as environment.
    env = {e["name"]: e for e in c.get("env", [])}
    key_env = config.get("provider", {}).get("api_key_env", "E2B_API_KEY")
    secrets = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Secret"}
    for var in (key_env, "SANDBOX_MCP_TOKENS"):
        ref = env.get(var, {}).get("valueFrom", {}).get("secretKeyRef", {})
        secret = secrets.get(ref.get("name"))
        keys = set((secret or {}).get("stringData", {})) | set((secret or {}).get("data", {}))
        check(f"env {var} comes from an existing Secret key", secret is not None and ref.get("key") in keys, ref)

    # Deployment shape.
    check("2+ replicas", dep["spec"].get("replicas", 1) >= 2, dep["spec"].get("replicas"))
    check("the Deployment selector matches the pod labels", selects(dep["spec"]["selector"]["matchLabels"], pod_labels))
    rolling = dep["spec"].get("strategy", {}).get("rollingUpdate", {})
    check("rolling update never drops below the replica count", rolling.get("maxUnavailable") == 0, rolling)
    live, ready = c.get("livenessProbe", {}), c.get("readinessProbe", {})
    check("liveness probe GETs /healthz on the http port",
          live.get("httpGet", {}).get("path") == "/healthz" and live["httpGet"].get("port") in ("http", ports.get("http")),
          live)
    check("readiness probe GETs /readyz on the http port",
          ready.get("httpGet", {}).get("path") == "/readyz" and ready["httpGet"].get("port") in ("http", ports.get("http")),
          ready)
    res = c.get("resources", {})
    check("resource requests and limits are set",
          {"cpu", "memory"} <= set(res.get("requests", {})) and "memory" in res.get("limits", {}), res)
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod_spec.get("terminationGracePeriodSeconds", 30)
    shutdown = server.get("shutdown_grace_secs", 20)
    # The gateway waits up to shutdown_grace_secs for in-flight calls, then up to as long again
    # while ending sessions, then 5 s for connections to close (src/gateway/server.rs).
    check("terminationGracePeriodSeconds covers preStop + 2 x shutdown_grace_secs + 5 s",
          grace >= pre_stop + 2 * shutdown + 5, {"grace": grace, "preStop": pre_stop, "shutdown_grace_secs": shutdown})
    psc, csc = pod_spec.get("securityContext", {}), c.get("securityContext", {})
    check("runs as non-root (runAsNonRoot, non-zero uid)",
          (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")) and (csc.get("runAsUser") or psc.get("runAsUser", 0)) > 0,
          (psc, csc))
    check("read-only root filesystem", csc.get("readOnlyRootFilesystem") is True, csc)
    check("no privilege escalation", csc.get("allowPrivilegeEscalation") is False, csc)
    check("all capabilities dropped, not privileged",
          csc.get("capabilities", {}).get("drop") == ["ALL"] and not csc.get("privileged"), csc)
    check("seccomp RuntimeDefault",
          (psc.get("seccompProfile") or csc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", psc)
    check("no service-account token mounted", pod_spec.get("automountServiceAccountToken") is False)

    # Service.
    svc = next(d for d in docs if d.get("kind") == "Service" and d["metadata"]["name"] == "sandbox-mcp")
    check("the Service selects the pods", selects(svc["spec"].get("selector", {}), pod_labels))
    check("Service ports target named container ports",
          all(p.get("targetPort") in ports for p in svc["spec"]["ports"]), svc["spec"]["ports"])

    # Ingress.
    ing = one(docs, "Ingress")
    ann = ing["metadata"].get("annotations", {})
    tls_hosts = {h for t in ing["spec"].get("tls", []) for h in t.get("hosts", [])}
    rule_hosts = {r.get("host") for r in ing["spec"].get("rules", [])}
    check("Ingress has TLS for every host", rule_hosts and rule_hosts <= tls_hosts, (rule_hosts, tls_hosts))
    check("every Ingress host is in the gateway's allowed_hosts",
          rule_hosts <= set(server.get("allowed_hosts", [])), (rule_hosts, server.get("allowed_hosts")))
    paths = [p for r in ing["spec"]["rules"] for p in r["http"]["paths"]]
    check("Ingress routes /mcp to the Service's http port",
          any(p["path"] == "/mcp" and p["backend"]["service"]["name"] == svc["metadata"]["name"]
              and p["backend"]["service"]["port"].get("name") in {sp["name"] for sp in svc["spec"]["ports"]}
              for p in paths), paths)
    hash_by = ann.get("nginx.ingress.kubernetes.io/upstream-hash-by", "")
    shared_sessions = config.get("sessions", {}).get("store", "memory") != "memory"
    check("session affinity: none needed with sessions in Redis, else a key present on `initialize` too",
          (shared_sessions and not hash_by) or (hash_by and "$http_mcp_session_id" not in hash_by),
          (hash_by, config.get("sessions")))
    if shared_sessions:
        redis_url = config["sessions"]["store"]
        check("the sessions store is redis:// or rediss://", redis_url.startswith(("redis://", "rediss://")), redis_url)
        redis_env = config.get("sessions", {}).get("password_env", "SANDBOX_MCP_REDIS_PASSWORD")
        ref = env.get(redis_env, {}).get("valueFrom", {}).get("secretKeyRef", {})
        secret = secrets.get(ref.get("name"))
        keys = set((secret or {}).get("stringData", {})) | set((secret or {}).get("data", {}))
        check(f"env {redis_env} (Redis password) comes from an existing Secret key",
              secret is not None and ref.get("key") in keys, ref)
        redis_host = redis_url.split("://", 1)[1].split("@")[-1].split(":")[0].split("/")[0]
        services = {d["metadata"]["name"] for d in docs if d.get("kind") == "Service"}
        check("the Redis host is a Service of this kustomization (or an external host)",
              redis_host in services or "." in redis_host, (redis_host, sorted(services)))
    check("SSE unbuffered at the ingress", ann.get("nginx.ingress.kubernetes.io/proxy-buffering") == "off", ann)
    check("long read timeout at the ingress (>= 1 h)",
          int(ann.get("nginx.ingress.kubernetes.io/proxy-read-timeout", "0")) >= 3600, ann)

    # HPA, PDB, NetworkPolicy.
    hpa = one(docs, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    check("the HPA scales this Deployment",
          ref["kind"] == "Deployment" and ref["name"] == dep["metadata"]["name"], ref)
    check("the HPA keeps 2+ replicas", hpa["spec"].get("minReplicas", 1) >= 2, hpa["spec"].get("minReplicas"))
    pdb = one(docs, "PodDisruptionBudget")
    check("the PDB selects the pods", selects(pdb["spec"]["selector"]["matchLabels"], pod_labels))
    check("the PDB lets at most one replica go at a time",
          pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable", 0) >= 1, pdb["spec"])
    netpol = one(docs, "NetworkPolicy")
    check("the NetworkPolicy selects the pods", selects(netpol["spec"]["podSelector"]["matchLabels"], pod_labels))
    ingress_ports = {p.get("port") for rule in netpol["spec"].get("ingress", []) for p in rule.get("ports", [])}
    check("the NetworkPolicy admits the http port", ports.get("http") in ingress_ports, ingress_ports)
    check("the NetworkPolicy restricts egress", "Egress" in netpol["spec"].get("policyTypes", []))
    return out


def mutations() -> list[tuple[str, Callable[[Docs], None]]]:
    def dep(d: Docs) -> dict[str, Any]:
        return one(d, "Deployment")

    def container(d: Docs) -> dict[str, Any]:
        return dep(d)["spec"]["template"]["spec"]["containers"][0]

    def config_edit(old: str, new: str) -> Callable[[Docs], None]:
        def edit(d: Docs) -> None:
            cm = one(d, "ConfigMap", "sandbox-mcp-config")
            assert old in cm["data"]["config.toml"], old
            cm["data"]["config.toml"] = cm["data"]["config.toml"].replace(old, new)
        return edit

    return [
        ("one replica", lambda d: dep(d)["spec"].__setitem__("replicas", 1)),
        ("no readiness probe", lambda d: container(d).pop("readinessProbe")),
        ("liveness on /", lambda d: container(d)["livenessProbe"]["httpGet"].__setitem__("path", "/")),
        ("writable root fs", lambda d: container(d)["securityContext"].__setitem__("readOnlyRootFilesystem", False)),
        ("privilege escalation", lambda d: container(d)["securityContext"].pop("allowPrivilegeEscalation")),
        ("root user", lambda d: dep(d)["spec"]["template"]["spec"]["securityContext"].update(
            runAsNonRoot=False, runAsUser=0)),
        ("short grace period", lambda d: dep(d)["spec"]["template"]["spec"].__setitem__(
            "terminationGracePeriodSeconds", 40)),
        ("no TLS on the ingress", lambda d: one(d, "Ingress")["spec"].pop("tls")),
        ("hash on the session header alone", lambda d: one(d, "Ingress")["metadata"]["annotations"].__setitem__(
            "nginx.ingress.kubernetes.io/upstream-hash-by", "$http_mcp_session_id")),
        ("buffered SSE", lambda d: one(d, "Ingress")["metadata"]["annotations"].__setitem__(
            "nginx.ingress.kubernetes.io/proxy-buffering", "on")),
        ("HPA on another target", lambda d: one(d, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"].__setitem__(
            "name", "other")),
        ("PDB selects nothing", lambda d: one(d, "PodDisruptionBudget")["spec"]["selector"].__setitem__(
            "matchLabels", {"app.kubernetes.io/name": "other"})),
        ("ingress host not allowed", config_edit('allowed_hosts = ["mcp.example.com"]', 'allowed_hosts = ["x"]')),
        ("misspelled config key", config_edit("shutdown_grace_secs", "shutdown_grace_sec")),
        ("long default sandbox timeout", config_edit("default_timeout_secs = 600", "default_timeout_secs = 86400")),
        ("listen port differs from containerPort", config_edit('listen = "0.0.0.0:8080"', 'listen = "0.0.0.0:9999"')),
        ("token env from a missing Secret key", lambda d: next(
            e for e in container(d)["env"] if e["name"] == "SANDBOX_MCP_TOKENS"
        )["valueFrom"]["secretKeyRef"].__setitem__("key", "NOPE")),
    ]


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    results = list(checks(docs))
    if "--self-test" in sys.argv:
        for name, mutate in mutations():
            broken = copy.deepcopy(docs)
            mutate(broken)
            try:
                caught = [n for n, ok, _ in checks(broken) if not ok]
            except (LookupError, KeyError, TypeError, ValueError) as err:
                caught = [f"error: {err}"]
            by = f" ({caught[0]})" if caught else ""
            results.append((f"self-test: '{name}' is caught{by}", bool(caught), "no check failed"))
    return report(results)


def report(results: list[tuple[str, bool, object]]) -> int:
    """Prints `ok   NAME` or `FAIL NAME: DETAIL` per result, then the counts; the exit status."""
    passed = failed = 0
    for name, ok, detail in results:
        print(f"ok   {name}" if ok else f"FAIL {name}: {detail}")
        passed, failed = passed + ok, failed + (not ok)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
