//! Inbound traffic to a sandbox's ports (issue 23 §3), attacked as an
//! unprivileged host user: the provider's `{port}-{sandboxID}.{domain}` route
//! is on a port every local user can reach, so a sandbox that is not public
//! must answer only requests carrying its traffic access token
//! (`e2b-traffic-access-token`, E2B's 403 otherwise). Through `serve`
//! (sandboxes are private unless `create_sandbox` asks for public traffic,
//! and the tool returns the host and the token) and through the standalone
//! provider (E2B's default, the token kept across a provider restart).
//! Needs root (skips loudly otherwise; SANDBOX_MCP_NO_SKIP turns that into a failure).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, harness};
use std::process::{Command, Stdio};

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const TOKEN_A: &str = "inbound-tenant-a-token-0123456789";
const TOKEN_B: &str = "inbound-tenant-b-token-0123456789";
const NOBODY: &str = "--reuid=65534";

/// `setpriv` arguments that drop to `nobody` (uid and gid 65534, no supplementary groups).
fn as_nobody() -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([NOBODY, "--regid=65534", "--clear-groups", "--"]);
    cmd
}

/// What any local user can do: `curl` the provider's port as `nobody` with this `Host` (and no
/// token). Returns the status and the body.
fn curl_as_nobody(provider: &str, host: &str, path: &str) -> (u16, String) {
    let out = as_nobody()
        .args(["curl", "-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}", "-H"])
        .arg(format!("Host: {host}"))
        .arg(format!("{}{path}", provider.trim_end_matches('/')))
        .output()
        .expect("setpriv curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_owned())
}

/// A request from the test itself with the token in the header (as the E2B SDK's users send it).
async fn get_with_token(http: &reqwest::Client, provider: &str, host: &str, token: &str) -> (StatusCode, String) {
    let resp = http
        .get(format!("{}/index.html", provider.trim_end_matches('/')))
        .header("Host", host)
        .header("e2b-traffic-access-token", token)
        .send()
        .await
        .expect("request with the token");
    (resp.status(), resp.text().await.unwrap_or_default())
}

/// Shell that serves `page` at `/index.html` on `port` inside a sandbox and returns once it listens.
fn serve_page_script(port: u16, page: &str) -> String {
    format!(
        "mkdir -p /tmp/www && echo {page} > /tmp/www/index.html && \
         (setsid python3 -m http.server {port} --directory /tmp/www >/dev/null 2>&1 < /dev/null &) && \
         for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 1)' \
         2>/dev/null && echo listening && exit 0; sleep 0.1; done; echo 'not listening'; exit 1"
    )
}

/// Checks a refusal is E2B's: 403, `{sandboxId, message, code: 403}` naming the header, and no byte
/// of the page.
fn assert_e2b_refusal(status: u16, body: &str, sandbox_id: &str, why: &str, page: &str) {
    assert_eq!(status, 403, "the route answered without the sandbox's token: {body}");
    assert!(!body.contains(page), "{body}");
    let value: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("refusal body {body:?}: {e}"));
    assert_eq!(value["code"], 403, "{body}");
    assert_eq!(value["sandboxId"], sandbox_id, "{body}");
    let message = value["message"].as_str().unwrap_or_default();
    assert!(message.contains("'e2b-traffic-access-token'") && message.contains(why), "{body}");
}

/// As `nobody`, every readable file under `dir` (not descending into other filesystems, files up
/// to 1 MiB) that contains `secret`; the secret goes through stdin, never an argument.
fn readable_files_containing(dir: &std::path::Path, secret: &str) -> Vec<String> {
    const SCAN: &str = r#"
import os, sys
secret = sys.stdin.read().encode()
root = sys.argv[1]
try:
    dev = os.stat(root).st_dev
except OSError:
    sys.exit(0)  # not even reachable
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if os.lstat(os.path.join(d, x)).st_dev == dev]
    for f in files:
        p = os.path.join(d, f)
        try:
            st = os.lstat(p)
            if st.st_size <= 1 << 20 and os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as fh:
                    if secret in fh.read():
                        print(p)
        except OSError:
            pass
"#;
    let mut child = as_nobody()
        .args(["/usr/bin/python3", "-c", SCAN])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv python3");
    {
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(secret.as_bytes()).expect("write the secret");
    }
    let out = child.wait_with_output().expect("scan");
    assert!(out.status.success(), "the scan failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// Every process whose command line holds `secret` (what `ps` shows every user).
fn processes_with_in_argv(secret: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && cmdline.windows(secret.len()).any(|w| w == secret.as_bytes())
        {
            found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    found
}

fn port_host(created: &Value, port: u16) -> String {
    created["inbound"]["host"]
        .as_str()
        .unwrap_or_else(|| panic!("no inbound host: {created}"))
        .replace("{port}", &port.to_string())
}

#[test]
fn nobody_is_really_nobody() {
    require_root!();
    require_command!("setpriv");
    let out = as_nobody().args(["id", "-u"]).output().expect("setpriv id");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "65534");
    let out = as_nobody().args(["id", "-G"]).output().expect("setpriv id -G");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "65534");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_a_sandbox_port_closed_to_host_users_without_its_token() {
    require_root!();
    require_command!("setpriv");
    require_command!("curl");
    let config = format!("{}[local]\ndomain = \"sandbox.test\"\n", tokens_config(&[("a", TOKEN_A), ("b", TOKEN_B)]));
    let gateway = Gateway::start(&config, &[]);
    let provider = format!("http://{}", gateway.logged_addr("embedded local provider started").expect("provider addr"));
    let a = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let b = connect(&gateway.mcp_url(), Some(TOKEN_B)).await;
    let http = reqwest::Client::new();
    let page = "tenant-a-private-page-4c1e";

    // Tenant A's sandbox, created the default way, runs a private web server.
    let created = ok(&a, "create_sandbox", json!({})).await;
    let id = created["sandbox_id"].as_str().expect("sandbox_id").to_owned();
    let out = ok(&a, "run_command", json!({"command": serve_page_script(8000, page)})).await;
    assert_eq!(out["stdout"].as_str().unwrap_or_default().trim(), "listening", "{out}");

    // The attack of the issue: any host user, any domain, no credential.
    let (status, body) = curl_as_nobody(&provider, &format!("8000-{id}.x"), "/index.html");
    assert_e2b_refusal(status, &body, &id, "is missing", page);

    // What create_sandbox gave the agent opens it: the host of its port and the token.
    assert_eq!(created["inbound"]["public"], false, "{created}");
    assert_eq!(created["inbound"]["token_header"], "e2b-traffic-access-token", "{created}");
    let token = created["inbound"]["traffic_access_token"].as_str().expect("a traffic token").to_owned();
    assert!(token.len() >= 32, "{created}");
    let host = port_host(&created, 8000);
    assert_eq!(host, format!("8000-{id}.sandbox.test"));
    let (status, body) = curl_as_nobody(&provider, &host, "/index.html");
    assert_e2b_refusal(status, &body, &id, "is missing", page);
    let (status, body) = get_with_token(&http, &provider, &host, &token).await;
    assert_eq!((status, body.trim()), (StatusCode::OK, page));

    // Another tenant's sandbox token does not open it; a wrong one neither.
    let other = ok(&b, "create_sandbox", json!({})).await;
    let other_token = other["inbound"]["traffic_access_token"].as_str().expect("B's traffic token").to_owned();
    assert_ne!(other_token, token);
    for wrong in [other_token.as_str(), &token[..token.len() - 1], "", "x"] {
        let (status, body) = get_with_token(&http, &provider, &host, wrong).await;
        assert_e2b_refusal(status.as_u16(), &body, &id, "is invalid", page);
    }

    // connect_sandbox (another session of A) hands out the same access.
    let a2 = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let connected = ok(&a2, "connect_sandbox", json!({"sandbox_id": id})).await;
    assert_eq!(connected["inbound"]["traffic_access_token"], token.as_str(), "{connected}");
    assert_eq!(port_host(&connected, 8000), host);

    // Asked for, public traffic answers anyone, without a token.
    let public = ok(&a, "create_sandbox", json!({"network": {"allow_public_traffic": true}})).await;
    let public_id = public["sandbox_id"].as_str().expect("sandbox_id").to_owned();
    assert_eq!(public["inbound"]["public"], true, "{public}");
    assert!(public["inbound"].get("traffic_access_token").is_none(), "{public}");
    let out = ok(&a, "run_command", json!({"command": serve_page_script(8000, "public-page")})).await;
    assert_eq!(out["stdout"].as_str().unwrap_or_default().trim(), "listening", "{out}");
    let (status, body) = curl_as_nobody(&provider, &format!("8000-{public_id}.sandbox.test"), "/index.html");
    assert_eq!((status, body.trim()), (200, "public-page"));
    // ... and only it: the private sandbox is still closed.
    let (status, body) = curl_as_nobody(&provider, &host, "/index.html");
    assert_e2b_refusal(status, &body, &id, "is missing", page);

    // The token is nowhere a host user can see it: argv, the log, readable files.
    assert_eq!(processes_with_in_argv(&token), Vec::<String>::new());
    assert!(!gateway.log_text().contains(&token), "the gateway's log holds the traffic token");
    assert_eq!(readable_files_containing(&gateway.state_dir, &token), Vec::<String>::new());
    close(a2).await;
    close(b).await;
    close(a).await;
}

/// A private sandbox (serving `page` on 9000) and a public one of a standalone provider.
struct Standalone {
    id: String,
    token: String,
    other_token: String,
    public_id: String,
    page: &'static str,
}

impl Standalone {
    fn host(&self) -> String {
        format!("9000-{}.sandbox.test", self.id)
    }

    /// The whole rule, checked against the provider as it runs now.
    async fn check(&self, p: &harness::Provider, label: &str) {
        let (base, host, id) = (p.base(), self.host(), self.id.as_str());
        let (status, body) = curl_as_nobody(&base, &host, "/index.html");
        assert_e2b_refusal(status, &body, id, "is missing", self.page);
        let (status, body) = get_with_token(&p.http, &base, &host, &self.other_token).await;
        assert_e2b_refusal(status.as_u16(), &body, id, "is invalid", self.page);
        let (status, body) = get_with_token(&p.http, &base, &host, &self.token).await;
        assert_eq!((status, body.trim()), (StatusCode::OK, self.page), "{label}");
        let public_host = format!("9000-{}.sandbox.test", self.public_id);
        let (status, body) = curl_as_nobody(&base, &public_host, "/index.html");
        assert_eq!((status, body.trim()), (200, "standalone-public-page"), "{label}");
        // connect hands out the token again (as E2B's does); get_info reports the setting.
        let (status, connected) =
            p.call(reqwest::Method::POST, &format!("/sandboxes/{id}/connect"), Some(json!({}))).await;
        assert!(status.is_success(), "{label}: {connected}");
        assert_eq!(connected["trafficAccessToken"], self.token.as_str(), "{label}");
        let (_, info) = p.call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None).await;
        assert_eq!(info["network"]["allowPublicTraffic"], false, "{label}: {info}");
        let (_, info) = p.call(reqwest::Method::GET, &format!("/sandboxes/{}", self.public_id), None).await;
        assert_eq!(info["network"]["allowPublicTraffic"], true, "{label}: {info}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_requires_the_token_of_a_private_sandbox_across_a_restart() {
    require_root!();
    require_command!("setpriv");
    require_command!("curl");
    let mut p = harness::Provider::start(&["--domain", "sandbox.test"]);
    let page = "standalone-private-page-93ab";
    let private = p.create(json!({"templateID": "base", "network": {"allowPublicTraffic": false}})).await;
    let other = p.create(json!({"templateID": "base", "network": {"allowPublicTraffic": false}})).await;
    // E2B's default is public traffic (`SandboxNetworkConfig.allowPublicTraffic: default true`).
    let public = p.create(json!({"templateID": "base"})).await;
    assert!(public["trafficAccessToken"].is_null(), "{public}");
    let sandboxes = Standalone {
        id: harness::id_of(&private),
        token: private["trafficAccessToken"].as_str().expect("a private sandbox gets a token").to_owned(),
        other_token: other["trafficAccessToken"].as_str().expect("token").to_owned(),
        public_id: harness::id_of(&public),
        page,
    };
    assert_ne!(sandboxes.token, sandboxes.other_token);
    for (sbx, text) in [(&private, page), (&public, "standalone-public-page")] {
        let (code, out) = p.run(sbx, &serve_page_script(9000, text), None).await;
        assert_eq!((code, out.trim()), (0, "listening"));
    }
    sandboxes.check(&p, "before the restart").await;
    let (id, token) = (sandboxes.id.as_str(), sandboxes.token.as_str());

    // A network update keeps the inbound setting (E2B: allowPublicTraffic is not part of it).
    let (status, _) = p.call(reqwest::Method::PUT, &format!("/sandboxes/{id}/network"), Some(json!({}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = curl_as_nobody(&p.base(), &sandboxes.host(), "/index.html");
    assert_e2b_refusal(status, &body, id, "is missing", page);

    // The record keeps the token, readable by root only; no argv holds it.
    let record_path = p.state.join("sandboxes").join(id).join("record.json");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&record_path).expect("record").permissions());
    assert_eq!(mode & 0o077, 0, "record.json is mode {mode:o}");
    assert_eq!(p.record(id)["traffic_access_token"], token);
    assert_eq!(readable_files_containing(&p.state, token), Vec::<String>::new());
    assert_eq!(processes_with_in_argv(token), Vec::<String>::new());

    // The provider is killed and started again: it re-adopts the sandbox, same token, same rule.
    p.crash();
    p.launch();
    sandboxes.check(&p, "after the restart").await;
}
