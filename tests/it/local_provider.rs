//! Integration tests of `sandbox-mcp provider`: the real binary, real
//! namespaces and mounts, raw HTTP. Needs root (skips loudly otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::harness;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_create_get_connect_timeout_pause_resume_kill() {
    require_root!();
    let p = Provider::start(&[]);
    let (status, v1) =
        p.call(reqwest::Method::POST, "/sandboxes", Some(json!({"templateID": "base", "secure": true}))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(v1["templateID"], "base");
    assert_eq!(v1["envdVersion"], sandbox_mcp::e2b::wire::ENVD_VERSION);
    assert_eq!(v1["sandboxID"].as_str().unwrap().len(), 20);
    let sbx = p
        .create(json!({"templateID": "base", "timeout": 60, "metadata": {"k": "v"}, "envVars": {"GREETING": "hi"}}))
        .await;
    let id = id_of(&sbx);

    let (status, info) = p.call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["state"], "running");
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&p.state.join("sandboxes")), 0o700, "records hold tokens");
    assert_eq!(mode(&p.state.join("sandboxes").join(&id).join("record.json")), 0o600);
    assert_eq!(info["metadata"]["k"], "v");
    assert_eq!(info["envdAccessToken"], sbx["envdAccessToken"]);
    let end1 = chrono::DateTime::parse_from_rfc3339(info["endAt"].as_str().unwrap()).unwrap();

    let (code, out) = p.run(&sbx, "echo $GREETING", None).await;
    assert_eq!((code, out.trim()), (0, "hi"));

    // Connect to a running sandbox: 200, deadline extended to at least now + timeout.
    let (status, _) =
        p.call(reqwest::Method::POST, &format!("/v2/sandboxes/{id}/connect"), Some(json!({"timeout": 600}))).await;
    assert_eq!(status, StatusCode::OK);
    let (_, info) = p.call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None).await;
    let end2 = chrono::DateTime::parse_from_rfc3339(info["endAt"].as_str().unwrap()).unwrap();
    assert!(end2 - end1 > chrono::Duration::seconds(500));

    // set_timeout overwrites the deadline.
    let (status, _) =
        p.call(reqwest::Method::POST, &format!("/sandboxes/{id}/timeout"), Some(json!({"timeout": 30}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, info) = p.call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None).await;
    let end3 = chrono::DateTime::parse_from_rfc3339(info["endAt"].as_str().unwrap()).unwrap();
    assert!(end3 < end2);

    // Pause: 204, again 409, data plane 502, listed as paused; connect resumes with 201.
    let (code, _) = p.run(&sbx, "sleep 1000 >/dev/null 2>&1 &", None).await;
    assert_eq!(code, 0);
    let (status, _) = p.call(reqwest::Method::POST, &format!("/sandboxes/{id}/pause"), Some(json!({}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = p.call(reqwest::Method::POST, &format!("/sandboxes/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["code"], 409);
    let health = p.http.get(p.url("/health")).header("E2b-Sandbox-Id", &id).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::BAD_GATEWAY);
    let (_, paused) = p.call(reqwest::Method::GET, "/v2/sandboxes?state=paused", None).await;
    assert_eq!(paused.as_array().unwrap().len(), 1);
    assert_eq!(paused[0]["sandboxID"], id.as_str());
    let (status, resumed) =
        p.call(reqwest::Method::POST, &format!("/v2/sandboxes/{id}/connect"), Some(json!({}))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(resumed["sandboxID"], id.as_str());
    let (code, out) = p.run(&sbx, "pgrep -c -x sleep", None).await;
    assert_eq!((code, out.trim()), (0, "1"), "work inside survived pause/resume");

    // Kill: 204 then 404; nothing left.
    let rec = p.record(&id);
    let pid = rec["envd_pid"].as_i64().unwrap() as i32;
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["code"].is_i64() && body["message"].is_string());
    assert_nothing_left(&p, &id, pid, &cgroups_of(&rec));
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{}", id_of(&v1)), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread")]
async fn list_filters_by_metadata_and_state_and_pages() {
    require_root!();
    let p = Provider::start(&[]);
    let mut ids = Vec::new();
    for i in 0..3 {
        let sbx = p.create(json!({"templateID": "base", "metadata": {"team": "a b", "n": i.to_string()}})).await;
        ids.push(id_of(&sbx));
    }
    let other = id_of(&p.create(json!({"templateID": "base", "metadata": {"team": "z"}})).await);

    // The SDK's double encoding of {team: "a b"}.
    let (status, listed) = p.call(reqwest::Method::GET, "/v2/sandboxes?metadata=team%3Da%252520b", None).await;
    assert_eq!(status, StatusCode::OK);
    let got: Vec<&str> = listed.as_array().unwrap().iter().map(|s| s["sandboxID"].as_str().unwrap()).collect();
    assert_eq!(got.len(), 3);
    assert!(!got.contains(&other.as_str()));
    assert!(listed[0].get("envdAccessToken").is_none(), "lists do not leak access tokens");
    let (_, listed) = p.call(reqwest::Method::GET, "/v2/sandboxes?metadata=team%3Dz%26n%3D1", None).await;
    assert_eq!(listed.as_array().unwrap().len(), 0);

    // Paging: 2 + 2, stable order, X-Next-Token only while more remain.
    let first =
        p.http.get(p.url("/v2/sandboxes?limit=2&state=running")).header("X-API-Key", API_KEY).send().await.unwrap();
    let token = first.headers().get("x-next-token").expect("next token").to_str().unwrap().to_owned();
    let page1: Vec<Value> = first.json().await.unwrap();
    let second = p
        .http
        .get(p.url(&format!("/v2/sandboxes?limit=2&nextToken={token}")))
        .header("X-API-Key", API_KEY)
        .send()
        .await
        .unwrap();
    assert!(second.headers().get("x-next-token").is_none());
    let page2: Vec<Value> = second.json().await.unwrap();
    let mut all: Vec<String> =
        page1.iter().chain(page2.iter()).map(|s| s["sandboxID"].as_str().unwrap().to_owned()).collect();
    assert_eq!(all.len(), 4);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 4);

    // State filter and the v1 list (running only).
    let (status, _) = p.call(reqwest::Method::POST, &format!("/sandboxes/{}/pause", ids[0]), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, running) = p.call(reqwest::Method::GET, "/v2/sandboxes?state=running", None).await;
    assert_eq!(running.as_array().unwrap().len(), 3);
    let (_, paused) = p.call(reqwest::Method::GET, "/v2/sandboxes?state=paused", None).await;
    assert_eq!(paused.as_array().unwrap().len(), 1);
    let (_, v1) = p.call(reqwest::Method::GET, "/sandboxes", None).await;
    assert_eq!(v1.as_array().unwrap().len(), 3);
    let (status, err) = p.call(reqwest::Method::GET, "/v2/sandboxes?state=dead", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(err["code"], 400);
    for id in ids.iter().chain([&other]) {
        let rec = p.record(id);
        let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        // ids[0] is frozen: killing it must still leave nothing.
        assert_nothing_left(&p, id, rec["envd_pid"].as_i64().unwrap() as i32, &cgroups_of(&rec));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_contract_errors_and_provider_keeps_serving() {
    require_root!();
    // A template root that vanishes after the provider started: its sandboxes cannot start.
    let vanishing = tempfile::Builder::new().prefix("sbx-template-test").tempdir_in("/var/tmp").unwrap();
    std::fs::create_dir(vanishing.path().join("etc")).unwrap();
    let p = Provider::start(&["--template", &format!("broken={}", vanishing.path().display())]);
    std::fs::remove_dir_all(vanishing.path()).unwrap();
    let post = |path: &str, key: Option<&str>, body: &'static str| {
        let mut req = p.http.post(p.url(path)).header("Content-Type", "application/json").body(body);
        if let Some(key) = key {
            req = req.header("X-API-Key", key);
        }
        req.send()
    };
    async fn check(resp: reqwest::Response, status: u16) -> Value {
        assert_eq!(resp.status().as_u16(), status);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["code"].as_i64(), Some(i64::from(status)), "{v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        v
    }
    check(post("/v2/sandboxes", Some("wrong"), r#"{"templateID":"base"}"#).await.unwrap(), 401).await;
    check(post("/v2/sandboxes", None, r#"{"templateID":"base"}"#).await.unwrap(), 401).await;
    check(post("/v2/sandboxes", Some(API_KEY), r#"{"templateID":"#).await.unwrap(), 400).await;
    check(post("/v2/sandboxes", Some(API_KEY), r#"{"timeout":5}"#).await.unwrap(), 400).await;
    check(post("/v2/sandboxes", Some(API_KEY), r#"{"templateID":"nope"}"#).await.unwrap(), 404).await;
    check(post("/v2/sandboxes", Some(API_KEY), r#"{"templateID":"base","timeout":99999999}"#).await.unwrap(), 400)
        .await;
    check(post("/sandboxes/doesnotexist0000000/timeout", Some(API_KEY), r#"{"timeout":5}"#).await.unwrap(), 404).await;
    check(post("/sandboxes/..%2F..%2Fetc/connect", Some(API_KEY), "{}").await.unwrap(), 404).await;
    let (status, v) = p.call(reqwest::Method::GET, "/sandboxes/doesnotexist0000000", None).await;
    assert_eq!((status, v["code"].as_i64()), (StatusCode::NOT_FOUND, Some(404)));
    let (status, v) = p.call(reqwest::Method::GET, "/no/such/route", None).await;
    assert_eq!((status, v["code"].as_i64()), (StatusCode::NOT_FOUND, Some(404)));
    // A sandbox that fails to start reports why and leaves nothing behind.
    let v = check(post("/v2/sandboxes", Some(API_KEY), r#"{"templateID":"broken"}"#).await.unwrap(), 500).await;
    assert!(v["message"].as_str().unwrap().contains("open_tree"), "{v}");
    assert_eq!(std::fs::read_dir(p.state.join("sandboxes")).unwrap().count(), 0);
    // Oversized control-plane body.
    let big = format!(r#"{{"templateID":"base","metadata":{{"x":"{}"}}}}"#, "a".repeat(2 * 1024 * 1024));
    let resp = p.http.post(p.url("/v2/sandboxes")).header("X-API-Key", API_KEY).body(big).send().await.unwrap();
    check(resp, 413).await;
    // Unknown sandbox on the envd route.
    let resp = p.http.get(p.url("/health")).header("E2b-Sandbox-Id", "doesnotexist0000000").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let v: Value = resp.json().await.unwrap();
    assert!(v["message"].as_str().unwrap().contains("was not found"));
    assert_eq!(v["code"], 502);
    assert_eq!(v["sandboxId"], "doesnotexist0000000");
    // Wrong access token on a real sandbox; /health is exempt as in envd.
    let sbx = p.create(json!({"templateID": "base"})).await;
    let id = id_of(&sbx);
    let resp = p
        .http
        .post(p.url("/process.Process/List"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", "wrong")
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    check(resp, 401).await;
    let resp = p.http.get(p.url("/health")).header("E2b-Sandbox-Id", &id).send().await.unwrap();
    assert!(resp.status().is_success());
    // Still serving.
    let (code, out) = p.run(&sbx, "echo alive", None).await;
    assert_eq!((code, out.trim()), (0, "alive"));
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

/// The agent, and every command it starts, is in each of the sandbox's cgroups once the create
/// answers. On cgroup v1 the agent moved itself there before it ran (the provider found it there
/// and logged no fallback move); the commands follow it.
#[tokio::test(flavor = "multi_thread")]
async fn agent_and_commands_are_in_the_sandbox_cgroups_when_the_create_answers() {
    require_root!();
    let p = Provider::start(&[]);
    for _ in 0..3 {
        let sbx = p.create(json!({"templateID": "base", "timeout": 60})).await;
        let id = id_of(&sbx);
        let rec = p.record(&id);
        let cgs = cgroups_of(&rec);
        if cgs.is_empty() {
            eprintln!("SKIP-ish: this host gives sandboxes no cgroups");
            return;
        }
        let pid = rec["envd_pid"].as_i64().unwrap();
        for cg in &cgs {
            let procs = std::fs::read_to_string(Path::new(cg).join("cgroup.procs")).unwrap();
            assert!(procs.lines().any(|l| l.trim() == pid.to_string()), "agent {pid} not in {cg}: {procs:?}");
        }
        // A command's own view: one line per hierarchy, each the sandbox's.
        let (code, out) = p.run(&sbx, "cat /proc/self/cgroup", None).await;
        assert_eq!(code, 0, "{out}");
        let ours = out.lines().filter(|l| l.ends_with(&format!("/{id}"))).count();
        assert_eq!(ours, cgs.len(), "a command is in each of {cgs:?}: {out}");
        let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    let v1 = std::path::Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists()
        && !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    if v1 {
        assert!(
            !p.inner.log.contains("is not in its cgroups"),
            "on cgroup v1 the agent moves itself: {}",
            p.inner.log.text()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn deadline_expiry_and_kill_while_busy_leave_nothing_behind() {
    require_root!();
    let p = Provider::start(&["--memory-limit-mb", "256", "--pids-limit", "200"]);
    let short = p.create(json!({"templateID": "base", "timeout": 2})).await;
    let busy = p.create(json!({"templateID": "base", "timeout": 300})).await;
    let (short_id, busy_id) = (id_of(&short), id_of(&busy));
    let (short_rec, busy_rec) = (p.record(&short_id), p.record(&busy_id));

    // Limits are in the sandbox's cgroups.
    let cgs = cgroups_of(&busy_rec);
    let limit_files: HashMap<&str, &str> =
        [("memory.limit_in_bytes", "268435456"), ("memory.max", "268435456"), ("pids.max", "200")]
            .into_iter()
            .collect();
    let mut checked = 0;
    for cg in &cgs {
        for (file, want) in &limit_files {
            if let Ok(got) = std::fs::read_to_string(Path::new(cg).join(file)) {
                assert_eq!(got.trim(), *want, "{cg}/{file}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 2, "memory and pids limits applied: {cgs:?}");

    let (code, _) = p
        .run(
            &busy,
            "for i in $(seq 20); do setsid sleep 1000 >/dev/null 2>&1 & done; sleep 1000 >/dev/null 2>&1 &",
            None,
        )
        .await;
    assert_eq!(code, 0);
    let busy_pid = busy_rec["envd_pid"].as_i64().unwrap() as i32;
    let ns = std::fs::read_link(format!("/proc/{busy_pid}/ns/pid")).unwrap();
    let members = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|n| n == ns))
            .count()
    };
    assert!(members() >= 22, "the sleepers run");
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{busy_id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_nothing_left(&p, &busy_id, busy_pid, &cgs);
    assert!(wait_until(Duration::from_secs(5), || members() == 0), "processes of the killed sandbox remain");

    // The 2 s deadline.
    let short_pid = short_rec["envd_pid"].as_i64().unwrap() as i32;
    assert_nothing_left(&p, &short_id, short_pid, &cgroups_of(&short_rec));
    let (status, _) = p.call(reqwest::Method::GET, &format!("/sandboxes/{short_id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_are_isolated_from_each_other_and_the_host() {
    require_root!();
    let p = Provider::start(&[]);
    let a = p.create(json!({"templateID": "base"})).await;
    let b = p.create(json!({"templateID": "base", "allow_internet_access": false})).await;
    let (a_id, b_id) = (id_of(&a), id_of(&b));

    let (_, out) =
        p.run(&a, "sleep 1000 >/dev/null 2>&1 & ls /proc | grep -E '^[0-9]+$' | wc -l; pgrep -c sleep", None).await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].trim().parse::<u32>().unwrap() < 15, "sandbox sees few processes: {out}");
    let (_, out) = p.run(&b, "pgrep -c sleep; ps -e -o pid= | wc -l", None).await;
    assert_eq!(out.lines().next().unwrap().trim(), "0", "b cannot see a's sleep");
    let (_, out) = p.run(&a, "hostname; id -u; id -un; echo $HOME; cat /etc/hostname", None).await;
    assert_eq!(out.lines().collect::<Vec<_>>(), vec![a_id.as_str(), "1000", "user", "/home/user", a_id.as_str()]);
    let (_, out) = p.run(&a, "id -u", Some("root")).await;
    assert_eq!(out.trim(), "0");

    // Files: root-owned writes stay in the sandbox; the other sandbox and the host see nothing.
    let marker = format!("/marker-{a_id}");
    let (code, _) = p
        .run(&a, &format!("echo x > {marker} && echo changed > /etc/hostname && touch /tmp/t-{a_id}"), Some("root"))
        .await;
    assert_eq!(code, 0);
    assert!(!Path::new(&marker).exists());
    assert_ne!(std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim(), "changed");
    let (code, _) = p.run(&b, &format!("test -e {marker} || test -e /tmp/t-{a_id}"), Some("root")).await;
    assert_eq!(code, 1, "b sees a's files");
    // Root in a sandbox cannot mount, touch host sysctls or read kernel memory.
    let (code, _) = p.run(&a, "mount -t tmpfs none /mnt", Some("root")).await;
    assert_ne!(code, 0, "root in a sandbox must not mount");
    let (code, _) = p.run(&a, "echo x > /proc/sys/kernel/domainname", Some("root")).await;
    assert_ne!(code, 0, "host sysctls are read-only");
    let (_, out) = p.run(&a, "grep CapBnd /proc/self/status", Some("root")).await;
    assert!(out.trim().ends_with("00000000a00425fb"), "bounding set: {out}");
    // The state directory (every sandbox's layers) is not there.
    let (_, out) = p.run(&a, &format!("ls -A {} 2>/dev/null | wc -l", p.state.display()), Some("root")).await;
    assert_eq!(out.trim(), "0");
    // Network: each sandbox has a namespace of its own (lo and the provider's eth0), whatever its
    // internet setting (tests/it/sandbox_network.rs tests what crosses it).
    let (_, out) = p.run(&b, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | sort", None).await;
    assert_eq!(out.trim(), "eth0\nlo");
    let b_pid = p.record(&b_id)["envd_pid"].as_i64().unwrap();
    let a_pid = p.record(&a_id)["envd_pid"].as_i64().unwrap();
    let host_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    let b_net = std::fs::read_link(format!("/proc/{b_pid}/ns/net")).unwrap();
    let a_net = std::fs::read_link(format!("/proc/{a_pid}/ns/net")).unwrap();
    assert_ne!(b_net, host_net);
    assert_ne!(a_net, host_net);
    assert_ne!(a_net, b_net);
    let (_, out) = p
        .run(
            &b,
            "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen(); print(\"ok\")'",
            None,
        )
        .await;
    assert_eq!(out.trim(), "ok", "loopback works without internet");
    for id in [&a_id, &b_id] {
        let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_restart_readopts_running_and_cleans_dead_sandboxes() {
    require_root!();
    let mut p = Provider::start(&[]);
    let keep = p.create(json!({"templateID": "base", "metadata": {"role": "keep"}})).await;
    let dead = p.create(json!({"templateID": "base"})).await;
    let (keep_id, dead_id) = (id_of(&keep), id_of(&dead));
    let (code, _) = p.run(&keep, "echo work > /home/user/file; sleep 1000 >/dev/null 2>&1 &", None).await;
    assert_eq!(code, 0);
    let dead_rec = p.record(&dead_id);
    let dead_pid = dead_rec["envd_pid"].as_i64().unwrap() as i32;

    p.crash();
    let keep_pid = p.record(&keep_id)["envd_pid"].as_i64().unwrap() as i32;
    let keep_dir = p.state.join("sandboxes").join(&keep_id);
    assert!(agent_alive(keep_pid, &keep_dir), "the sandbox outlives its provider");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(dead_pid), nix::sys::signal::Signal::SIGKILL).unwrap();

    p.launch();
    let (status, info) = p.call(reqwest::Method::GET, &format!("/sandboxes/{keep_id}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["metadata"]["role"], "keep");
    let (code, out) = p.run(&keep, "cat /home/user/file; pgrep -c -x sleep", None).await;
    assert_eq!((code, out.split_whitespace().collect::<Vec<_>>()), (0, vec!["work", "1"]));
    let (status, _) = p.call(reqwest::Method::GET, &format!("/sandboxes/{dead_id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_nothing_left(&p, &dead_id, dead_pid, &cgroups_of(&dead_rec));
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{keep_id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread")]
async fn max_sandboxes_is_enforced_with_429() {
    require_root!();
    let p = Provider::start(&["--max-sandboxes", "2"]);
    let a = p.create(json!({"templateID": "base"})).await;
    let _b = p.create(json!({"templateID": "base"})).await;
    let (status, err) = p.call(reqwest::Method::POST, "/v2/sandboxes", Some(json!({"templateID": "base"}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(err["code"], 429);
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{}", id_of(&a)), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    p.create(json!({"templateID": "base"})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_sandboxes_alive_at_once_then_all_killed_cleanly() {
    require_root!();
    let p = Provider::start(&[]);
    let mut sandboxes = Vec::new();
    for _ in 0..5 {
        let batch = futures_util::future::join_all((0..10).map(|_| p.create(json!({"templateID": "base"})))).await;
        sandboxes.extend(batch);
    }
    let (_, listed) = p.call(reqwest::Method::GET, "/v2/sandboxes?limit=100", None).await;
    assert_eq!(listed.as_array().unwrap().len(), 50);
    for sbx in sandboxes.iter().step_by(7) {
        let (code, out) = p.run(sbx, "hostname", None).await;
        assert_eq!((code, out.trim()), (0, sbx["sandboxID"].as_str().unwrap()));
    }
    let recs: Vec<(String, Value)> = sandboxes.iter().map(|s| (id_of(s), p.record(&id_of(s)))).collect();
    let paths: Vec<String> = recs.iter().map(|(id, _)| format!("/sandboxes/{id}")).collect();
    let kills =
        futures_util::future::join_all(paths.iter().map(|path| p.call(reqwest::Method::DELETE, path, None))).await;
    assert!(kills.iter().all(|(s, _)| *s == StatusCode::NO_CONTENT));
    for (id, rec) in &recs {
        assert_nothing_left(&p, id, rec["envd_pid"].as_i64().unwrap() as i32, &cgroups_of(rec));
    }
    assert!(host_mounts_under(&p.state).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_the_provider_but_not_its_sandboxes() {
    require_root!();
    let mut p = Provider::start(&[]);
    let sbx = p.create(json!({"templateID": "base"})).await;
    let id = id_of(&sbx);
    let pid = p.record(&id)["envd_pid"].as_i64().unwrap() as i32;
    let mut process = p.take_process();
    process.signal(nix::sys::signal::Signal::SIGTERM);
    let status = process.wait_timeout(Duration::from_secs(30)).expect("the provider exits on SIGTERM");
    assert!(status.success(), "graceful exit: {status:?}");
    // The agent leads its own session, so the provider's terminal signals never reach it.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let session: i32 = stat.rsplit(')').next().unwrap().split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(session, pid);
    assert!(agent_alive(pid, &p.state.join("sandboxes").join(&id)));
    p.launch();
    let (code, out) = p.run(&sbx, "echo still here", None).await;
    assert_eq!((code, out.trim()), (0, "still here"));
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[test]
fn without_namespace_permission_it_exits_with_one_clear_sentence() {
    require_root!();
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::Builder::new().prefix("sbx-provider-test").tempdir_in("/var/tmp").unwrap();
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    nix::unistd::chown(&state, Some(65534.into()), Some(65534.into())).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox-mcp"))
        .args(["provider", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&state)
        .env_remove("E2B_API_KEY")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs permission to create PID/mount/UTS/IPC namespaces"), "{stderr}");
    assert!(stderr.contains("EPERM"), "{stderr}");
    assert!(out.stdout.is_empty(), "it never listened");
}

#[tokio::test(flavor = "multi_thread")]
async fn library_entry_point_serves_and_kills_all_on_request() {
    require_root!();
    let tmp = tempfile::Builder::new().prefix("sbx-provider-test").tempdir_in("/var/tmp").unwrap();
    let cfg = sandbox_mcp::local::LocalProviderConfig {
        state_dir: tmp.path().join("state"),
        api_key: Some(API_KEY.into()),
        agent_binary: env!("CARGO_BIN_EXE_sandbox-mcp").into(),
        max_data_body_bytes: 1024,
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = sandbox_mcp::local::start_provider(cfg, listener).await.unwrap();
    let base = format!("http://{}", running.addr);
    let resp = reqwest::Client::new()
        .post(format!("{base}/v2/sandboxes"))
        .header("X-API-Key", API_KEY)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let sbx = resp.json::<Value>().await.unwrap();
    let id = id_of(&sbx);
    let dir = tmp.path().join("state/sandboxes").join(&id);
    // The data-plane body limit.
    let resp = reqwest::Client::new()
        .post(format!("{base}/files?path=/tmp/big"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", sbx["envdAccessToken"].as_str().unwrap())
        .header("Content-Type", "application/octet-stream")
        .body(vec![b'x'; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let small = reqwest::Client::new()
        .post(format!("{base}/files?path=/tmp/small"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", sbx["envdAccessToken"].as_str().unwrap())
        .header("Content-Type", "application/octet-stream")
        .body(vec![b'x'; 100])
        .send()
        .await
        .unwrap();
    assert_eq!(small.status(), StatusCode::OK, "{:?}", small.text().await);
    let rec: Value = serde_json::from_slice(&std::fs::read(dir.join("record.json")).unwrap()).unwrap();
    let pid = rec["envd_pid"].as_i64().unwrap() as i32;
    assert!(agent_alive(pid, &dir));
    running.kill_all_and_shutdown().await;
    assert!(!agent_alive(pid, &dir) && !dir.exists(), "kill_all_and_shutdown leaves nothing");
    for cg in cgroups_of(&rec) {
        assert!(!Path::new(&cg).exists(), "{cg}");
    }
}

/// Chunked multipart uploads whose closing CRLF comes in a chunk of its own, 0-2 ms later (as the
/// JavaScript SDK's fetch sends its last bytes): the agent reads the body to its end before it
/// answers, so every upload succeeds. An agent that answers at the closing boundary closes with
/// those bytes unread, and the provider's forward then fails with a 502 now and then (one in
/// some tens here, hence a hundred uploads).
#[tokio::test]
async fn chunked_multipart_uploads_whose_last_bytes_come_late_all_succeed() {
    require_root!();
    let p = Provider::start(&[]);
    let sbx = p.create(json!({"templateID": "base"})).await;
    let token = sbx["envdAccessToken"].as_str().unwrap().to_owned();
    let boundary = "----late-crlf-0123456789";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"late.txt\"\r\n\
         Content-Type: application/octet-stream\r\n\r\nwritten late\r\n--{boundary}--"
    );
    for attempt in 0..100 {
        let mut stream = tokio::net::TcpStream::connect(p.inner.addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let request = format!(
            "POST /files?path=/home/user/late{attempt}.txt&username=user HTTP/1.1\r\nHost: localhost\r\n\
             E2b-Sandbox-Id: {}\r\nX-Access-Token: {token}\r\n\
             Content-Type: multipart/form-data; boundary={boundary}\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n{:x}\r\n{head}\r\n",
            id_of(&sbx),
            head.len()
        );
        tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(attempt % 3)).await;
        tokio::io::AsyncWriteExt::write_all(&mut stream, b"2\r\n\r\n\r\n0\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "attempt {attempt}: {answer}");
        let (code, out) = p.run(&sbx, &format!("cat /home/user/late{attempt}.txt"), None).await;
        assert_eq!((code, out.as_str()), (0, "written late"));
    }
}
