//! OAuth 2.1 resource server (`[auth.oauth]`) against a real authorization
//! server: `oidc-provider` (tests/oauth/idp.mjs, pinned in
//! tests/oauth/package.json) on the test venv's Node 24, a real `serve`, the
//! official Python MCP SDK's OAuth client, and tokens the server mints or the
//! test forges (with the server's own private key, another key, or none).
//! Needs `$SANDBOX_MCP_NODE_BIN` (the Node 24 bin dir; scripts/test.sh sets it
//! and runs `npm ci` in tests/oauth) and `$SANDBOX_MCP_PYTHON` for the SDK
//! flow; skipped loudly when missing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const OAUTH_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oauth");

/// A resource URI that is not the gateway's (tokens for it must be refused); nothing listens there.
const OTHER_RESOURCE: &str = "http://127.0.0.1:9/other";

/// Node 24 with the pinned oidc-provider installed, and root (the gateway's sandboxes).
fn prerequisites() -> Option<PathBuf> {
    let dir = require_env!("SANDBOX_MCP_NODE_BIN", "a Node >= 22 bin dir", None);
    let installed = PathBuf::from(OAUTH_DIR).join("node_modules/oidc-provider").is_dir();
    if !common::gate::or_skip(installed, "run `npm ci` in tests/oauth (scripts/test.sh does)") {
        return None;
    }
    require_root!(None);
    Some(PathBuf::from(dir).join("node"))
}

/// The test authorization server process.
struct Idp {
    node: PathBuf,
    port: u16,
    state: PathBuf,
    resources: (String, String),
    process: Option<ProcessGuard>,
    _tmp: tempfile::TempDir,
}

impl Idp {
    /// The IdP on `port`; the error holds its output (a port collision among others).
    fn start(node: &Path, port: u16, jwt_resources: &[&str], opaque_resources: &[&str]) -> Result<Self, String> {
        let tmp = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let mut idp = Self {
            node: node.to_path_buf(),
            port,
            state: tmp.path().join("idp-state.json"),
            resources: (jwt_resources.join(","), opaque_resources.join(",")),
            process: None,
            _tmp: tmp,
        };
        idp.launch(false)?;
        Ok(idp)
    }

    fn launch(&mut self, rotate: bool) -> Result<(), String> {
        let mut command = Command::new(&self.node);
        command
            .arg(format!("{OAUTH_DIR}/idp.mjs"))
            .current_dir(OAUTH_DIR)
            .env("IDP_PORT", self.port.to_string())
            .env("IDP_STATE", &self.state)
            .env("IDP_ROTATE", if rotate { "1" } else { "0" })
            .env("IDP_JWT_RESOURCES", &self.resources.0)
            .env("IDP_OPAQUE_RESOURCES", &self.resources.1)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let ready = |line: &str| line.starts_with("ready ").then_some(());
        let (process, ()) = common::process::spawn_until(
            &mut command,
            Duration::ZERO,
            &Log::default(),
            None,
            Duration::from_secs(60),
            ready,
        )?;
        self.process = Some(process);
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill9();
        }
    }

    fn issuer(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn forge_key(&self, which: &str) -> (String, EncodingKey) {
        let state: Value = serde_json::from_slice(&std::fs::read(&self.state).expect("idp state")).expect("json");
        let entry = &state["forge"][which];
        let der = base64::engine::general_purpose::STANDARD.decode(entry["der"].as_str().expect("der")).expect("b64");
        (entry["kid"].as_str().expect("kid").to_string(), EncodingKey::from_rsa_der(&der))
    }

    /// A token minted by the server (client credentials grant).
    async fn mint(&self, client: &str, resource: &str, scope: &str) -> String {
        let response = reqwest::Client::new()
            .post(format!("{}/token", self.issuer()))
            .basic_auth(client, Some(format!("{client}-secret-0123456789")))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&scope={scope}&resource={}",
                url::form_urlencoded::byte_serialize(resource.as_bytes()).collect::<String>()
            ))
            .send()
            .await
            .expect("token request");
        let status = response.status();
        let body: Value = response.json().await.expect("token json");
        assert!(status.is_success(), "token request failed: {body}");
        body["access_token"].as_str().expect("access_token").to_string()
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        self.stop();
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn forge(kid: &str, key: &EncodingKey, claims: Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(&header, &claims, key).expect("encode")
}

fn b64(value: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
}

struct Answer {
    status: u16,
    challenge: String,
    body: String,
    session: Option<String>,
}

/// POSTs an MCP `initialize` (or `tools/list` on a session) with a bearer token.
async fn post_mcp(gateway: &Gateway, token: Option<&str>, session: Option<&str>) -> Answer {
    let body = match session {
        None => json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "oauth-test", "version": "0"}}}),
        Some(_) => json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
    };
    let mut request = reqwest::Client::new()
        .post(gateway.mcp_url())
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(id) = session {
        request = request.header("mcp-session-id", id).header("mcp-protocol-version", "2025-11-25");
    }
    let response = request.send().await.expect("POST /mcp");
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let (challenge, session) = (header("www-authenticate").unwrap_or_default(), header("mcp-session-id"));
    let status = response.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(5), response.text()).await.ok().and_then(Result::ok);
    Answer { status, challenge, body: body.unwrap_or_default(), session }
}

fn oauth_config(idp: &Idp, audience: &str, extra: &str) -> String {
    let hash = sha256_hex("static-token-0123456789");
    format!(
        "[auth]\ntokens = [ {{ tenant = \"static\", sha256 = \"{hash}\" }} ]\n[auth.oauth]\nissuer = \"{issuer}\"\n\
         audience = \"{audience}\"\nrequired_scopes = [\"sandbox\"]\ntenant_claim = \"tenant\"\n\
         jwks_min_refresh_secs = 1\nleeway_secs = 5\n{extra}\n",
        issuer = idp.issuer()
    )
}

/// The IdP (on a free port) and a gateway on an address it knows as its audience (the two
/// started again on other ports after a port collision). `resources(audience)` gives the IdP's
/// JWT and opaque-token resources; `extra(idp)` more gateway config.
fn idp_and_gateway(
    node: &Path,
    resources: impl Fn(&str) -> (Vec<String>, Vec<String>),
    extra: impl Fn(&Idp) -> String,
    env: &[(&str, &str)],
) -> (Idp, Gateway, String) {
    with_free_port(|gateway_port| {
        let audience = format!("http://127.0.0.1:{gateway_port}/mcp");
        let (jwt, opaque) = resources(&audience);
        let (jwt, opaque): (Vec<&str>, Vec<&str>) =
            (jwt.iter().map(String::as_str).collect(), opaque.iter().map(String::as_str).collect());
        let idp = with_free_port(|port| Idp::start(node, port, &jwt, &opaque));
        let gateway = GatewayBuilder::new(&oauth_config(&idp, &audience, &extra(&idp)))
            .envs(env)
            .listen(([127, 0, 0, 1], gateway_port).into())
            .try_start()?;
        Ok((idp, gateway, audience))
    })
}

/// The whole MCP authorization flow with the official Python SDK's OAuth client.
#[test]
fn python_sdk_oauth_client_full_flow() {
    let Some(node) = prerequisites() else { return };
    let python = require_env!("SANDBOX_MCP_PYTHON", "a python with mcp==1.30.0");
    let (_idp, gateway, audience) =
        idp_and_gateway(&node, |audience| (vec![audience.to_string()], vec![]), |_| String::new(), &[]);
    let output = Command::new(python)
        .arg(format!("{OAUTH_DIR}/mcp_oauth_client.py"))
        .arg(&audience)
        .arg("alice")
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "SDK flow failed:\n{stdout}\n{stderr}\nserve log:\n{}", gateway.log_text());
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("report json");
    println!("{report}");
    assert_eq!(report["interaction"], json!(["login", "consent"]), "{report}");
    assert_eq!(report["client_registered"], json!(true), "dynamic client registration: {report}");
    assert_eq!(report["stdout"], json!("oauth-42\n"), "{report}");
    assert!(report["tools"].as_array().is_some_and(|t| t.contains(&json!("create_sandbox"))), "{report}");
    let sandbox = report["sandbox_id"].as_str().expect("sandbox id");
    assert!(report["listed"].as_array().is_some_and(|l| l.contains(&json!(sandbox))), "{report}");
    // The sandbox was created for the token's tenant claim (alice -> tenant-a).
    let log = gateway.log_text();
    assert!(
        log.lines().any(|l| l.contains("\"tool\":\"create_sandbox\"") && l.contains("\"tenant\":\"tenant-a\"")),
        "create_sandbox not logged for tenant-a:\n{log}"
    );
}

/// Metadata, challenges, minted and forged tokens, tenancy, session binding, key rotation, IdP outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minted_and_forged_tokens() {
    let Some(node) = prerequisites() else { return };
    let other = OTHER_RESOURCE.to_string();
    let (mut idp, gateway, audience) = idp_and_gateway(
        &node,
        |audience| (vec![audience.to_string(), OTHER_RESOURCE.to_string()], vec![]),
        |_| String::new(),
        &[],
    );
    let addr = gateway.addr;
    let http = reqwest::Client::new();

    // RFC 9728 metadata, bare and path-suffixed, outside auth, behind the Host check.
    let metadata_url = format!("http://{addr}/.well-known/oauth-protected-resource/mcp");
    for url in [metadata_url.clone(), format!("http://{addr}/.well-known/oauth-protected-resource")] {
        let doc: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
        assert_eq!(doc["resource"], json!(audience));
        assert_eq!(doc["authorization_servers"], json!([idp.issuer()]));
        assert_eq!(doc["scopes_supported"], json!(["sandbox"]));
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
    }
    let rebound = http.get(&metadata_url).header("host", "evil.example").send().await.unwrap();
    assert_eq!(rebound.status(), 403);

    // 401 without a token: where to sign in, and with which scope.
    let missing = post_mcp(&gateway, None, None).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.challenge, format!("Bearer resource_metadata=\"{metadata_url}\", scope=\"sandbox\""));

    // Minted tokens: two tenants, and a second principal of tenant A.
    let token_a = idp.mint("tester-a", &audience, "sandbox").await;
    let token_a2 = idp.mint("tester-a2", &audience, "sandbox").await;
    let token_b = idp.mint("tester-b", &audience, "sandbox").await;
    let client_a = connect(&gateway.mcp_url(), Some(&token_a)).await;
    let sandbox = ok(&client_a, "create_sandbox", json!({"timeout": 300})).await["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();
    let ran = ok(&client_a, "run_command", json!({"command": "echo tenant-a"})).await;
    assert_eq!(ran["stdout"], json!("tenant-a\n"));
    let client_b = connect(&gateway.mcp_url(), Some(&token_b)).await;
    let listed = ok(&client_b, "list_sandboxes", empty()).await;
    assert!(!listed.to_string().contains(&sandbox), "tenant B sees A's sandbox: {listed}");
    let refused = err(&client_b, "run_command", json!({"command": "true", "sandbox_id": sandbox})).await;
    assert!(refused.contains("not found"), "{refused}");

    // Session binding: A's session is refused to B and to another principal of tenant A.
    let session_a = post_mcp(&gateway, Some(&token_a), None).await.session.expect("session id");
    assert_eq!(post_mcp(&gateway, Some(&token_a), Some(&session_a)).await.status, 200);
    for (who, token) in [("tenant B", &token_b), ("another principal of tenant A", &token_a2)] {
        let hijack = post_mcp(&gateway, Some(token), Some(&session_a)).await;
        assert_eq!(hijack.status, 404, "{who} used A's session: {}", hijack.body);
    }

    // RFC 8707: a token the same server issued for another resource.
    let wrong_aud = post_mcp(&gateway, Some(&idp.mint("tester-a", &other, "sandbox").await), None).await;
    assert_eq!(wrong_aud.status, 401);
    assert!(wrong_aud.challenge.contains("error=\"invalid_token\""), "{}", wrong_aud.challenge);
    assert!(wrong_aud.challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")));
    assert!(wrong_aud.body.contains("another resource"), "{}", wrong_aud.body);

    // Missing scope: 403 insufficient_scope naming the scope.
    let no_scope = post_mcp(&gateway, Some(&idp.mint("tester-a", &audience, "other").await), None).await;
    assert_eq!(no_scope.status, 403, "{}", no_scope.body);
    assert!(no_scope.challenge.contains("error=\"insufficient_scope\", scope=\"sandbox\""), "{}", no_scope.challenge);

    // Forged with the server's own key: every claim check; then other keys and algorithms.
    let (kid, key) = idp.forge_key("current");
    let (spare_kid, spare_key) = idp.forge_key("spare");
    let t = now();
    let good = json!({"iss": idp.issuer(), "aud": audience, "sub": "forger", "tenant": "tenant-a",
        "scope": "sandbox", "iat": t, "exp": t + 300});
    let with = |patch: Value| {
        let mut claims = good.clone();
        for (k, v) in patch.as_object().unwrap() {
            claims[k] = v.clone();
        }
        claims
    };
    assert_eq!(post_mcp(&gateway, Some(&forge(&kid, &key, good.clone())), None).await.status, 200);
    let body = b64(&good);
    let cases = [
        ("wrong issuer", forge(&kid, &key, with(json!({"iss": "http://127.0.0.1:1"}))), "another issuer"),
        ("wrong audience", forge(&kid, &key, with(json!({"aud": other}))), "another resource"),
        ("expired", forge(&kid, &key, with(json!({"exp": t - 600, "iat": t - 900}))), "expired"),
        ("not yet valid", forge(&kid, &key, with(json!({"nbf": t + 600}))), "not valid yet"),
        ("no tenant claim", forge(&kid, &key, with(json!({"tenant": null}))), "tenant"),
        ("bad signature", forge(&kid, &spare_key, good.clone()), "bad signature"),
        ("alg none", format!("{}.{body}.", b64(&json!({"alg": "none", "typ": "JWT"}))), "never accepted"),
        (
            "HS256",
            {
                let mut header = Header::new(Algorithm::HS256);
                header.kid = Some(kid.clone());
                jsonwebtoken::encode(&header, &good, &EncodingKey::from_secret(b"public-key-as-secret")).unwrap()
            },
            "not accepted",
        ),
        ("unknown kid", forge(&spare_kid, &spare_key, good.clone()), "kid"),
        ("garbage", "not-a-token".to_string(), "not a JWT"),
    ];
    for (case, token, why) in &cases {
        let answer = post_mcp(&gateway, Some(token), None).await;
        assert_eq!(answer.status, 401, "{case}: {}", answer.body);
        assert!(answer.challenge.starts_with("Bearer error=\"invalid_token\""), "{case}: {}", answer.challenge);
        assert!(answer.body.contains(why), "{case}: {}", answer.body);
    }
    let log = gateway.log_text();
    for (case, token, _) in &cases {
        assert!(!log.contains(token.as_str()), "{case}: a token reached the log");
    }
    assert!(!log.contains(&token_a), "a token reached the log");

    // Static tokens keep working beside OAuth.
    let static_client = connect(&gateway.mcp_url(), Some("static-token-0123456789")).await;
    ok(&static_client, "list_sandboxes", empty()).await;

    // Rotation: the server publishes the spare key; the token signed with it is now accepted.
    let rotated = forge(&spare_kid, &spare_key, good.clone());
    idp.stop();
    idp.launch(true).expect("restart the IdP with rotated keys");
    // Refused (401) while the last key fetch is under 1 s old (jwks_min_refresh_secs), then picked up.
    let picked_up =
        eventually(Duration::from_secs(10), || async { post_mcp(&gateway, Some(&rotated), None).await.status == 200 });
    assert!(picked_up.await, "rotated key not picked up; log:\n{}", gateway.log_text());
    let minted_after = idp.mint("tester-b", &audience, "sandbox").await;
    assert_eq!(post_mcp(&gateway, Some(&minted_after), None).await.status, 200);

    // The identity provider goes down: /readyz stays ready, cached keys still verify, an
    // uncached key gets 503 with a sentence (not 401).
    idp.stop();
    // An uncached key makes the gateway fetch the keys again (once the last fetch is 1 s old): 503.
    let unknown = forge("key-9", &spare_key, good.clone());
    let unavailable =
        eventually(Duration::from_secs(10), || async { post_mcp(&gateway, Some(&unknown), None).await.status == 503 });
    assert!(unavailable.await, "an uncached key did not get 503 with the IdP down; log:\n{}", gateway.log_text());
    let down = post_mcp(&gateway, Some(&unknown), None).await;
    assert_eq!(down.status, 503, "{}", down.body);
    assert!(down.body.contains("identity provider is unreachable"), "{}", down.body);
    let ready = http.get(format!("http://{addr}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(post_mcp(&gateway, Some(&rotated), None).await.status, 200, "a cached key must still verify");

    close(client_a).await;
    close(client_b).await;
    close(static_client).await;
}

/// Opaque tokens through RFC 7662 introspection (with the gateway's client credentials).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_tokens_by_introspection() {
    let Some(node) = prerequisites() else { return };
    let other = OTHER_RESOURCE.to_string();
    let extra = |idp: &Idp| {
        format!(
            "introspection_endpoint = \"{}/token/introspection\"\nintrospection_client_id = \"gateway-introspector\"\n",
            idp.issuer()
        )
    };
    let secret = [("SANDBOX_MCP_OAUTH_CLIENT_SECRET", "gateway-introspector-secret-0123456789")];
    let (mut idp, gateway, audience) = idp_and_gateway(
        &node,
        |audience| (vec![], vec![audience.to_string(), OTHER_RESOURCE.to_string()]),
        extra,
        &secret,
    );

    let token_a = idp.mint("tester-a", &audience, "sandbox").await;
    assert!(!token_a.starts_with("eyJ"), "expected an opaque token");
    let client = connect(&gateway.mcp_url(), Some(&token_a)).await;
    let listed = ok(&client, "list_sandboxes", empty()).await;
    assert!(listed["sandboxes"].is_array(), "{listed}");

    let wrong_aud = post_mcp(&gateway, Some(&idp.mint("tester-a", &other, "sandbox").await), None).await;
    assert_eq!(wrong_aud.status, 401, "{}", wrong_aud.body);
    assert!(wrong_aud.body.contains("another resource"), "{}", wrong_aud.body);
    let no_scope = post_mcp(&gateway, Some(&idp.mint("tester-a", &audience, "other").await), None).await;
    assert_eq!(no_scope.status, 403, "{}", no_scope.body);
    let unknown = post_mcp(&gateway, Some("made-up-opaque-token-0123456789"), None).await;
    assert_eq!(unknown.status, 401, "{}", unknown.body);
    assert!(unknown.body.contains("not active"), "{}", unknown.body);

    // IdP down: the cached answer still serves, a new token gets 503.
    let token_b = idp.mint("tester-b", &audience, "sandbox").await;
    idp.stop();
    assert_eq!(post_mcp(&gateway, Some(&token_a), None).await.status, 200);
    let down = post_mcp(&gateway, Some(&token_b), None).await;
    assert_eq!(down.status, 503, "{}", down.body);
    assert!(!gateway.log_text().contains(&token_a), "a token reached the log");
    close(client).await;
}
