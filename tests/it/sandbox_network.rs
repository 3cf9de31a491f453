//! Sandbox network isolation, tried from inside real sandboxes of the real
//! `sandbox-mcp provider`: the host's loopback, the provider, a host interface
//! address (one gained later too) and a sibling are unreachable; a test "internet" host in
//! 198.18.0.0/15 (a namespace of the test's own) is reachable and obeys
//! `denyOut`/`allowOut`/`PUT .../network`; DNS resolves through the provider;
//! inbound goes through `{port}-{id}.{domain}` with the traffic token; the
//! network survives a provider SIGKILL; a killed sandbox leaves nothing; the
//! provider needs no `ip` or `nft` program (it speaks netlink itself).
//! Needs root (skips loudly otherwise; SANDBOX_MCP_NO_SKIP turns that into a failure).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, harness};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::testnet::{self, TestNet, probe_script};
use harness::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn probe(p: &Provider, sbx: &Value, host: &str, port: u16) -> String {
    let (_, out) = p.run(sbx, &probe_script(host, port), None).await;
    out.trim().to_owned()
}

/// A server on the host's side answering every connection, for "must not be reachable" checks.
fn host_server(addr: &str) -> (u16, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind((addr, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let handle = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((mut c, _)) => {
                    let _ = c.write_all(b"HTTP/1.0 200 OK\r\n\r\nhost-secret");
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    (port, handle)
}

/// Sends a DNS query for `internet.test` straight to `server:53` over UDP from inside the sandbox;
/// returns the answered address, or "TIMEOUT".
async fn udp_query(p: &Provider, sbx: &Value, server: &str) -> String {
    let script = format!(
        "python3 - <<'EOF'\nimport socket, struct\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)\n\
         q = struct.pack('!HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b'\\x08internet\\x04test\\x00' + struct.pack('!HH', 1, 1)\n\
         try:\n    s.sendto(q, ('{server}', 53))\n    r = s.recv(512)\n    print(socket.inet_ntoa(r[-4:]))\n\
         except Exception:\n    print('TIMEOUT')\nEOF"
    );
    let (_, out) = p.run(sbx, &script, None).await;
    out.trim().to_owned()
}

fn provider_port(p: &Provider) -> u16 {
    p.base().rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn default_egress_reaches_the_internet_and_dns_but_nothing_of_the_host() {
    require_root!();
    let mut net = TestNet::new();
    net.http(net.internet_addr, 8080, "internet-ok");
    net.dns(net.internet_addr);
    let dns = net.internet_addr.to_string();
    let p = Provider::start(&["--dns-server", &dns]);
    let sbx = p.create(json!({"templateID": "base"})).await;

    let internet = net.internet_addr.to_string();
    assert_eq!(probe(&p, &sbx, &internet, 8080).await, "OPEN internet-ok");
    // DNS over UDP through the provider's forwarder to the test's resolver, then TCP to the answer.
    let (code, out) = p.run(&sbx, "getent hosts internet.test", None).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with(&internet), "{out}");
    assert_eq!(probe(&p, &sbx, "internet.test", 8080).await, "OPEN internet-ok");
    let (code, _) = p.run(&sbx, "getent hosts elsewhere.example", None).await;
    assert_ne!(code, 0, "NXDOMAIN is passed through");
    // Plain UDP to a public address (the test resolver, asked directly).
    assert_eq!(udp_query(&p, &sbx, &internet).await, internet);

    // The host: its loopback (a server of the test, the provider), and an interface address.
    let (lo_port, _lo) = host_server("127.0.0.1");
    let host_if = net.host_addr.to_string();
    let (if_port, _if) = host_server(&host_if);
    assert!(probe(&p, &sbx, "127.0.0.1", lo_port).await.starts_with("CLOSED"));
    assert!(probe(&p, &sbx, "127.0.0.1", provider_port(&p)).await.starts_with("CLOSED"));
    assert!(probe(&p, &sbx, &host_if, if_port).await.starts_with("CLOSED"), "host interface address");
    assert!(probe(&p, &sbx, &host_if, provider_port(&p)).await.starts_with("CLOSED"));
    // Private, link-local (cloud metadata) and the sandbox's own gateway address.
    for (host, port) in
        [(net.private_addr.to_string(), 8080), ("169.254.169.254".into(), 80), ("169.254.0.22".into(), 80)]
    {
        // Refused by the namespace's kernel guard at connect(), as by a firewall.
        assert_eq!(probe(&p, &sbx, &host, port).await, "CLOSED ConnectionRefusedError", "{host}");
    }
    // An address the host gains after the sandbox started, in a range allowed by default, is
    // covered too: judged when the connection is made.
    let late = format!("198.18.{}.9", net.host_addr.octets()[2]);
    let hostif = format!("smh{}", net.name.trim_start_matches("smcp-net-"));
    let out =
        std::process::Command::new("ip").args(["addr", "add", &format!("{late}/32"), "dev", &hostif]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (late_port, _late) = host_server(&late);
    assert!(probe(&p, &sbx, &late, late_port).await.starts_with("CLOSED"), "address gained later");
    // Once the provider has seen the kernel's notification, the new address is refused in the
    // sandbox's kernel guard, like a blocked range.
    let mut seen = Vec::new();
    for _ in 0..30 {
        seen.push(probe(&p, &sbx, &late, late_port).await);
        if seen.last().is_some_and(|s| s == "CLOSED ConnectionRefusedError") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen.iter().all(|s| s.starts_with("CLOSED")), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("CLOSED ConnectionRefusedError"), "{seen:?}");

    // Raw sockets see only the sandbox's own namespace; root cannot change its rules.
    let (code, _) = p.run(&sbx, "nft flush ruleset || ip link set eth0 down", Some("root")).await;
    assert_ne!(code, 0, "root in a sandbox must not change its network");
    assert_eq!(probe(&p, &sbx, &internet, 8080).await, "OPEN internet-ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn siblings_are_unreachable_and_share_no_ports() {
    require_root!();
    let p = Provider::start(&[]);
    let a = p.create(json!({"templateID": "base"})).await;
    let b = p.create(json!({"templateID": "base"})).await;
    for (sbx, name) in [(&a, "a"), (&b, "b")] {
        let cmd = format!(
            "mkdir -p /tmp/www && echo from-{name} > /tmp/www/index.html && cd /tmp/www && \
             (setsid python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 &) && sleep 1 && echo started"
        );
        let (code, out) = p.run(sbx, &cmd, None).await;
        assert_eq!((code, out.trim()), (0, "started"), "both sandboxes listen on port 8000");
    }
    let probe_get = |host: &str| {
        format!(
            "python3 -c \"import urllib.request as u; print(u.urlopen('http://{host}:8000/', timeout=5).read().decode().strip())\" \
             2>/dev/null || echo CLOSED"
        )
    };
    let (_, out) = p.run(&a, &probe_get("127.0.0.1"), None).await;
    assert_eq!(out.trim(), "from-a", "a reaches its own server");
    for host in ["169.254.0.22", "169.254.0.21"] {
        let (_, out) = p.run(&a, &probe_get(host), None).await;
        assert_ne!(out.trim(), "from-b", "a must not reach b through {host}");
    }
    // b's server is reachable from outside only through the provider, which a cannot reach.
    let b_host = format!("8000-{}.sandbox.test", id_of(&b));
    let resp = p.http.get(p.url("/")).header("Host", &b_host).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.unwrap().trim(), "from-b");
    let resp = p.http.get(p.url("/")).header("Host", format!("8000-{}.sandbox.test", id_of(&a))).send().await.unwrap();
    assert_eq!(resp.text().await.unwrap().trim(), "from-a");
    let (_, out) = p.run(&a, &probe_script("127.0.0.1", provider_port(&p)), None).await;
    assert!(out.trim().starts_with("CLOSED"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_allow_and_update_rules_take_effect() {
    require_root!();
    let mut net = TestNet::new();
    net.http(net.internet_addr, 8080, "internet-ok");
    net.http(net.private_addr, 8080, "private-ok");
    net.dns(net.internet_addr);
    let (internet, private) = (net.internet_addr.to_string(), net.private_addr.to_string());
    let p = Provider::start(&[]);

    let denied = p.create(json!({"templateID": "base", "network": {"denyOut": [internet]}})).await;
    assert_eq!(probe(&p, &denied, &internet, 8080).await, "CLOSED ConnectionRefusedError", "denyOut names it");
    assert_eq!(udp_query(&p, &denied, &internet).await, "TIMEOUT", "denyOut applies to UDP");
    let id = id_of(&denied);
    let (_, info) = p.call(Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(info["network"]["denyOut"], json!([internet]));
    // PUT replaces the rules; an omitted field is cleared (here through the project's own client).
    let client = sandbox_mcp::e2b::E2bClient::new(sandbox_mcp::e2b::ProviderEndpoint {
        api_url: p.base().parse().unwrap(),
        sandbox_url: Some(p.base().parse().unwrap()),
        domain: "localhost".into(),
        api_key: Some(API_KEY.into()),
        request_timeout: Duration::from_secs(10),
    })
    .unwrap();
    client.update_network(&id, &Default::default()).await.unwrap();
    assert_eq!(probe(&p, &denied, &internet, 8080).await, "OPEN internet-ok");
    assert_eq!(udp_query(&p, &denied, &internet).await, internet);
    let (status, _) =
        p.call(Method::PUT, &format!("/sandboxes/{id}/network"), Some(json!({"denyOut": ["0.0.0.0/0"]}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(probe(&p, &denied, &internet, 8080).await, "CLOSED ConnectionRefusedError", "updated rules");
    let (status, _) = p
        .call(
            Method::PUT,
            &format!("/sandboxes/{id}/network"),
            Some(json!({"denyOut": ["0.0.0.0/0"], "allowOut": [internet]})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(probe(&p, &denied, &internet, 8080).await, "OPEN internet-ok", "allowOut wins over denyOut");

    // A private host: unreachable by default, reachable when allowOut names it.
    assert!(probe(&p, &denied, &private, 8080).await.starts_with("CLOSED"));
    let allowed = p.create(json!({"templateID": "base", "network": {"allowOut": [format!("{private}/32")]}})).await;
    assert_eq!(probe(&p, &allowed, &private, 8080).await, "OPEN private-ok");
    assert_eq!(probe(&p, &allowed, &internet, 8080).await, "OPEN internet-ok");

    // No internet: nothing but what allowOut names, and no DNS.
    let offline = p
        .create(json!({"templateID": "base", "allow_internet_access": false, "network": {"allowOut": [private]}}))
        .await;
    assert_eq!(probe(&p, &offline, &internet, 8080).await, "CLOSED ConnectionRefusedError", "internet off");
    assert_eq!(probe(&p, &offline, &private, 8080).await, "OPEN private-ok");
    let (status, _) = p
        .call(
            Method::PUT,
            &format!("/sandboxes/{}/network", id_of(&offline)),
            Some(json!({"allow_internet_access": true})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(probe(&p, &offline, &internet, 8080).await, "OPEN internet-ok");

    // Refusals are 400s with a sentence, and create nothing.
    for (network, needle) in [
        (json!({"allowOut": ["example.com"]}), "domain name"),
        (json!({"denyOut": ["10.0.0.0/33"]}), "not a CIDR"),
        (json!({"rules": {"example.com": [{"transform": {"headers": {"a": "b"}}}]}}), "network.rules"),
    ] {
        let (status, body) =
            p.call(Method::POST, "/sandboxes", Some(json!({"templateID": "base", "network": network}))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["message"].as_str().unwrap().contains(needle), "{body}");
    }
    let (status, _) = p.call(Method::PUT, "/sandboxes/doesnotexist0000000/network", Some(json!({}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, list) = p.call(Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(list.as_array().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn inbound_through_the_provider_with_and_without_the_traffic_token() {
    require_root!();
    let p = Provider::start(&["--domain", "sandbox.test"]);
    let public = p.create(json!({"templateID": "base"})).await;
    let private = p.create(json!({"templateID": "base", "network": {"allowPublicTraffic": false}})).await;
    assert_eq!(public["domain"], "sandbox.test");
    assert!(public["trafficAccessToken"].is_null());
    let token = private["trafficAccessToken"].as_str().expect("a private sandbox gets a traffic token").to_owned();
    for sbx in [&public, &private] {
        let (code, _) = p
            .run(sbx, "cd /tmp && echo hello > index.html && (setsid python3 -m http.server 9000 >/dev/null 2>&1 &) && sleep 1", None)
            .await;
        assert_eq!(code, 0);
    }
    let get = |id: &str, token: Option<&str>| {
        let mut req = p.http.get(p.url("/index.html")).header("Host", format!("9000-{id}.sandbox.test"));
        if let Some(token) = token {
            req = req.header("e2b-traffic-access-token", token);
        }
        req.send()
    };
    let resp = get(&id_of(&public), None).await.unwrap();
    assert_eq!((resp.status(), resp.text().await.unwrap().trim().to_owned()), (StatusCode::OK, "hello".into()));
    let resp = get(&id_of(&private), None).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = get(&id_of(&private), Some("wrong")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = get(&id_of(&private), Some(&token)).await.unwrap();
    assert_eq!((resp.status(), resp.text().await.unwrap().trim().to_owned()), (StatusCode::OK, "hello".into()));
    // A closed port answers 502 with a sentence; envd's port reaches the agent.
    let resp =
        p.http.get(p.url("/")).header("Host", format!("9001-{}.sandbox.test", id_of(&public))).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert!(resp.text().await.unwrap().contains("port 9001 is not open"));
    let resp = p
        .http
        .get(p.url("/health"))
        .header("Host", format!("49983-{}.sandbox.test", id_of(&public)))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    // A raw TCP upgrade (WebSocket-style) is spliced both ways.
    let upgrade = "python3 - <<'EOF' >/dev/null 2>&1 &\nimport socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0', 9100)); s.listen(1)\nc,_=s.accept(); c.recv(4096)\nc.sendall(b'HTTP/1.1 101 Switching Protocols\\r\\nConnection: Upgrade\\r\\nUpgrade: echo\\r\\n\\r\\n')\nwhile True:\n    d=c.recv(4096)\n    if not d: break\n    c.sendall(d.upper())\nEOF\nsleep 1";
    let (code, _) = p.run(&public, upgrade, None).await;
    assert_eq!(code, 0);
    let addr = p.base().trim_start_matches("http://").to_owned();
    let id = id_of(&public);
    let echoed = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET / HTTP/1.1\r\nHost: 9100-{id}.sandbox.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        s.write_all(b"ping").unwrap();
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .unwrap();
    assert_eq!(echoed, "PING");
}

#[tokio::test(flavor = "multi_thread")]
async fn network_survives_a_provider_sigkill_and_kill_leaves_nothing() {
    require_root!();
    let mut net = TestNet::new();
    net.http(net.internet_addr, 8080, "internet-ok");
    let internet = net.internet_addr.to_string();
    let host_links = || {
        let out = std::process::Command::new("ip").args(["-o", "link"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut names: Vec<String> =
            text.lines().filter_map(|l| l.split(':').nth(1)).map(|n| n.trim().to_owned()).collect();
        names.sort();
        names
    };
    let host_rules = || {
        // Stateless (`-s`): counters of other software's rules (podman's netavark) keep counting.
        String::from_utf8_lossy(
            &std::process::Command::new("nft").args(["-s", "list", "ruleset"]).output().unwrap().stdout,
        )
        .into_owned()
    };
    let (links_before, rules_before) = (host_links(), host_rules());

    let mut p = Provider::start(&[]);
    let sbx = p.create(json!({"templateID": "base", "network": {"denyOut": ["198.19.0.0/16"]}})).await;
    assert_eq!(probe(&p, &sbx, &internet, 8080).await, "OPEN internet-ok");
    p.crash();
    p.launch();
    // The re-adopted sandbox keeps its rules and regains its way out at once.
    let started = Instant::now();
    let retry = format!(
        "cat > /tmp/probe.py <<'EOF'\n{}EOF\nfor i in $(seq 20); do out=$(python3 /tmp/probe.py); echo \"$out\"; \
         case \"$out\" in OPEN*) break;; esac; sleep 0.1; done",
        testnet::probe_source(&internet, 8080)
    );
    let (_, out) = p.run(&sbx, &retry, None).await;
    assert!(out.contains("OPEN internet-ok"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert!(probe(&p, &sbx, "198.19.1.1", 80).await.starts_with("CLOSED"));

    let id = id_of(&sbx);
    let rec = p.record(&id);
    let pid = rec["envd_pid"].as_i64().unwrap() as i32;
    let netns = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let provider_pid = p.inner.pid();
    let (status, _) = p.call(Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_nothing_left(&p, &id, pid, &cgroups_of(&rec));
    // No process is left in the sandbox's namespace, the provider holds no descriptor of it.
    let holders = || {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(link) = std::fs::read_link(entry.path().join("ns/net"))
                && link == netns
            {
                found.push(entry.path());
            }
        }
        for fd in std::fs::read_dir(format!("/proc/{provider_pid}/fd")).unwrap().flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l == netns) {
                found.push(fd.path());
            }
        }
        found
    };
    assert!(wait_until(Duration::from_secs(5), || holders().is_empty()), "{:?}", holders());
    drop(p);
    // Nothing of the provider's in the host's own network namespace.
    assert_eq!(host_links().into_iter().filter(|l| !links_before.contains(l) && !l.starts_with("sm")).count(), 0);
    assert_eq!(host_rules(), rules_before, "the host's nftables ruleset is unchanged");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_provider_runs_no_ip_or_nft_program() {
    require_root!();
    let mut net = TestNet::new();
    net.http(net.internet_addr, 8080, "internet-ok");
    net.dns(net.internet_addr);
    let internet = net.internet_addr.to_string();
    // A PATH with neither program (with nothing at all): on a fresh machine without iproute2 and
    // nftables the provider prepares, updates and re-adopts sandbox networks all the same.
    let empty = std::path::PathBuf::from(format!("/var/tmp/smcp-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    assert!(!empty.join("nft").exists() && !empty.join("ip").exists());
    let inner =
        common::Provider::builder().env("PATH", &empty).args(["--dns-server", &internet]).temp_in("/var/tmp").start();
    let environ = std::fs::read(format!("/proc/{}/environ", inner.pid())).unwrap();
    let path = environ.split(|b| *b == 0).find(|v| v.starts_with(b"PATH=")).map(|v| v[5..].to_vec());
    assert_eq!(path.as_deref(), Some(empty.as_os_str().as_encoded_bytes()), "the provider's PATH");
    let mut p = Provider { state: inner.state_dir.clone(), inner, http: reqwest::Client::new() };

    let sbx = p.create(json!({"templateID": "base", "network": {"denyOut": ["198.19.0.0/16"]}})).await;
    let (code, out) = p.run(&sbx, "getent hosts internet.test", None).await;
    assert_eq!(code, 0, "DNS through the provider's forwarder: {out}");
    assert_eq!(probe(&p, &sbx, "internet.test", 8080).await, "OPEN internet-ok", "TCP through the relay");
    assert_eq!(udp_query(&p, &sbx, &internet).await, internet, "UDP through the relay");
    assert_eq!(probe(&p, &sbx, "198.19.1.1", 80).await, "CLOSED ConnectionRefusedError", "denyOut in the kernel");
    let (status, _) =
        p.call(Method::PUT, &format!("/sandboxes/{}/network", id_of(&sbx)), Some(json!({"denyOut": [internet]}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "rules updated over netlink");
    assert_eq!(probe(&p, &sbx, &internet, 8080).await, "CLOSED ConnectionRefusedError");
    // Re-adopted after a crash: its rules are rewritten over netlink too.
    p.crash();
    p.launch();
    assert_eq!(probe(&p, &sbx, &internet, 8080).await, "CLOSED ConnectionRefusedError", "rules kept");
    let (status, _) = p.call(Method::PUT, &format!("/sandboxes/{}/network", id_of(&sbx)), Some(json!({}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(probe(&p, &sbx, &internet, 8080).await, "OPEN internet-ok");
    drop(p);
    let _ = std::fs::remove_dir(&empty);
}
