//! The provider host's own addresses, tried from inside real sandboxes of the
//! real `sandbox-mcp provider` (issue 23 §4): a TCP server and a UDP echo
//! server on the host's `0.0.0.0` answer nothing to a sandbox, whatever its
//! `allowOut` names (each host address in every spelling: plain, `/32`,
//! IPv4-mapped, IPv4-compatible, NAT64, and the widest blocks), and every
//! refusal looks exactly like the refusal of a blocked range with a live
//! server, so a sandbox cannot tell which addresses are the host's. Only the
//! operator's `--open-host-address` opens one, and then only to a sandbox whose
//! `allowOut` names it. Through `serve` (started with no `ip` or `nft` on its
//! `PATH`), the gateway refuses loopback and link-local in every spelling.
//! Needs root (skips loudly otherwise; SANDBOX_MCP_NO_SKIP turns that into a failure).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, harness};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::testnet::TestNet;
use harness::*;
use serde_json::{Value, json};

/// What the host's servers answer; seeing it inside a sandbox means the host was reached.
const SECRET: &str = "host-secret";

/// A UDP echo server answering every datagram with `SECRET` (python3, for the test namespace).
const UDP_ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
while True:
    _, peer = s.recvfrom(2048)
    s.sendto(b"host-secret", peer)
"#;

/// Probes run inside a sandbox, all at once: each line of stdin is `label proto family host port`;
/// prints a JSON object label → "OPEN <answer>" or "CLOSED <what the sandbox saw>".
const PROBES: &str = r#"
import json, socket, sys, threading
results = {}
def probe(label, proto, family, host, port):
    fam = socket.AF_INET6 if family == "6" else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    try:
        s = socket.socket(fam, kind)
        s.settimeout(3)
        s.connect((host, int(port)))
        s.send(b"GET / HTTP/1.0\r\n\r\n" if proto == "tcp" else b"ping")
        data = s.recv(4096)
        results[label] = ("OPEN " + data.decode("latin-1")) if data else "CLOSED eof"
    except socket.timeout:
        results[label] = "CLOSED timeout"
    except Exception as e:
        results[label] = "CLOSED %s %s" % (type(e).__name__, getattr(e, "errno", ""))
threads = [threading.Thread(target=probe, args=line.split()) for line in sys.stdin.read().splitlines() if line]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
"#;

/// TCP and UDP servers on the host's `0.0.0.0` (every host address) answering `SECRET`.
fn host_servers() -> (u16, u16) {
    let tcp = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let udp = std::net::UdpSocket::bind(("0.0.0.0", 0)).unwrap();
    let ports = (tcp.local_addr().unwrap().port(), udp.local_addr().unwrap().port());
    tcp.set_nonblocking(true).unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    std::thread::spawn(move || {
        while Instant::now() < deadline {
            match tcp.accept() {
                Ok((mut c, _)) => {
                    let _ = c.write_all(format!("HTTP/1.0 200 OK\r\n\r\n{SECRET}").as_bytes());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline {
            if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                let _ = udp.send_to(SECRET.as_bytes(), peer);
            }
        }
    });
    ports
}

/// The host's IPv4 addresses that stay for the whole test: loopback, the machine's own interfaces,
/// and this test's veth ends (other tests' `sm*` veths come and go).
fn host_addresses(net: &TestNet) -> Vec<Ipv4Addr> {
    let out = Command::new("ip").args(["-o", "-4", "addr", "show"]).output().unwrap();
    let mut addrs: Vec<Ipv4Addr> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (iface, addr) = (fields.get(1)?, fields.get(3)?);
            if iface.starts_with("sm") {
                return None;
            }
            addr.split('/').next()?.parse().ok()
        })
        .collect();
    let [a, b, c, _] = net.private_addr.octets();
    addrs.extend([net.host_addr, Ipv4Addr::new(a, b, c, 1)]);
    addrs.sort();
    addrs.dedup();
    assert!(addrs.len() >= 3, "{addrs:?}");
    addrs
}

/// The ways a destination address can be spelled from inside a sandbox: (name, socket family, host).
fn destinations(v4: Ipv4Addr) -> [(&'static str, &'static str, String); 4] {
    [
        ("v4", "4", v4.to_string()),
        ("mapped", "6", format!("::ffff:{v4}")),
        ("compatible", "6", format!("::{v4}")),
        ("nat64", "6", format!("64:ff9b::{v4}")),
    ]
}

/// Runs every probe of `targets` (label → v4 address, TCP port, UDP port) in `sbx`; label of each
/// result: `<target>/<proto>/<spelling>`.
async fn probe_all(p: &Provider, sbx: &Value, targets: &[(String, Ipv4Addr, u16, u16)]) -> BTreeMap<String, String> {
    let mut lines = String::new();
    for (label, addr, tcp, udp) in targets {
        for (spelling, family, host) in destinations(*addr) {
            lines.push_str(&format!("{label}/tcp/{spelling} tcp {family} {host} {tcp}\n"));
            lines.push_str(&format!("{label}/udp/{spelling} udp {family} {host} {udp}\n"));
        }
    }
    let script = format!("python3 -c '{PROBES}' <<'EOF'\n{lines}EOF");
    let (code, out) = p.run(sbx, &script, None).await;
    assert_eq!(code, 0, "{out}");
    serde_json::from_str(out.trim()).unwrap_or_else(|err| panic!("{err}: {out}"))
}

/// `result` with its target's name taken off: `<proto>/<spelling>`.
fn kind(label: &str) -> String {
    label.split_once('/').map(|(_, rest)| rest.to_owned()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn host_addresses_answer_no_byte_whatever_allow_out_says_and_refuse_like_blocked_ranges() {
    require_root!();
    let mut net = TestNet::new();
    // The reference: a blocked (private) range with live TCP and UDP servers.
    net.http(net.private_addr, 8080, "private-ok");
    net.spawn_python(UDP_ECHO, &[net.private_addr.to_string(), "5353".into()]);
    let (tcp, udp) = host_servers();
    let hosts = host_addresses(&net);
    let p = Provider::start(&[]);

    // What a sandbox without rules sees of the blocked range: that is what every refusal must be.
    let plain = p.create(json!({"templateID": "base"})).await;
    let reference = probe_all(&p, &plain, &[("ref".into(), net.private_addr, 8080, 5353)]).await;
    assert_eq!(reference["ref/tcp/v4"], "CLOSED ConnectionRefusedError 111", "{reference:?}");
    // The guard's reject on the output hook fails the send itself (EPERM).
    assert_eq!(reference["ref/udp/v4"], "CLOSED PermissionError 1", "{reference:?}");
    let expected: BTreeMap<String, String> = reference.iter().map(|(k, v)| (kind(k), v.clone())).collect();

    let spelled = |f: &dyn Fn(Ipv4Addr) -> String| -> Vec<String> { hosts.iter().map(|a| f(*a)).collect() };
    let allow_outs: Vec<(String, Value)> = vec![
        ("none".into(), json!({})),
        ("plain".into(), json!({"allowOut": spelled(&|a| a.to_string())})),
        ("cidr".into(), json!({"allowOut": spelled(&|a| format!("{a}/32"))})),
        ("mapped".into(), json!({"allowOut": spelled(&|a| format!("::ffff:{a}"))})),
        ("compatible".into(), json!({"allowOut": spelled(&|a| format!("::{a}"))})),
        ("nat64".into(), json!({"allowOut": spelled(&|a| format!("64:ff9b::{a}"))})),
        ("wide".into(), json!({"allowOut": ["0.0.0.0/0", "::/0", "::ffff:0:0/96", "64:ff9b::/96"]})),
        ("internet-off".into(), json!({"allowOut": spelled(&|a| a.to_string()), "denyOut": ["0.0.0.0/0"]})),
    ];
    let targets: Vec<(String, Ipv4Addr, u16, u16)> = hosts.iter().map(|a| (a.to_string(), *a, tcp, udp)).collect();
    let mut failures = Vec::new();
    for (name, network) in allow_outs {
        let sbx = if name == "none" {
            plain.clone()
        } else {
            p.create(json!({"templateID": "base", "network": network})).await
        };
        for (label, result) in probe_all(&p, &sbx, &targets).await {
            // No application byte, and a refusal identical to the blocked range's.
            // Loopback is the sandbox's own (nothing listens there), as on every machine: no byte
            // from the host, but not a refusal of the guard's.
            let own_loopback = label.starts_with("127.");
            let differs = !own_loopback && Some(&result) != expected.get(&kind(&label));
            if result.contains(SECRET) || result.starts_with("OPEN") || differs {
                failures.push(format!(
                    "allowOut {name}: {label}: {result} (a blocked range: {:?})",
                    expected.get(&kind(&label))
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{} host probes differ:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_operator_opens_a_host_address_and_only_to_sandboxes_naming_it() {
    require_root!();
    let net = TestNet::new();
    let (tcp, udp) = host_servers();
    let opened = net.host_addr;
    let p = Provider::start(&["--open-host-address", &opened.to_string()]);
    let targets = [("opened".to_owned(), opened, tcp, udp)];
    let named = p.create(json!({"templateID": "base", "network": {"allowOut": [format!("::ffff:{opened}")]}})).await;
    let seen = probe_all(&p, &named, &targets).await;
    for label in ["opened/tcp/v4", "opened/udp/v4", "opened/tcp/mapped"] {
        assert!(seen[label].starts_with("OPEN") && seen[label].contains(SECRET), "{label}: {seen:?}");
    }
    // Opened, but not named: refused in the kernel like a reserved range.
    let unnamed = p.create(json!({"templateID": "base"})).await;
    let seen = probe_all(&p, &unnamed, &targets).await;
    assert_eq!(seen["opened/tcp/v4"], "CLOSED ConnectionRefusedError 111", "{seen:?}");
    assert_eq!(seen["opened/udp/v4"], "CLOSED PermissionError 1", "{seen:?}");
}

/// The default deployment through its tools: `serve` with its embedded provider, started with a
/// `PATH` that has no `ip` or `nft` (issue 25 §5). The gateway refuses loopback and link-local in
/// every spelling; a host address it cannot know (in a public range) passes it in any spelling,
/// and the provider still answers no byte from it, refusing it like a blocked range.
#[tokio::test(flavor = "multi_thread")]
async fn serve_without_ip_or_nft_keeps_the_host_closed_through_the_tools() {
    require_root!();
    let mut net = TestNet::new();
    net.http(net.internet_addr, 8080, "internet-ok");
    let (tcp, _) = host_servers();
    let empty = std::path::PathBuf::from(format!("/var/tmp/smcp-empty-path-serve-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let gateway = common::Gateway::start("", &[("PATH", empty.to_str().unwrap())]);
    let client = common::connect(&gateway.mcp_url(), None).await;
    let stdout = |v: &Value| v["stdout"].as_str().unwrap_or_default().trim().to_owned();
    let probe = |host: &str, port: u16| json!({"command": common::testnet::probe_script(host, port)});

    for entry in ["::ffff:127.0.0.1", "::127.0.0.1", "64:ff9b::a9fe:4d01", "::ffff:169.254.169.254", "64:ff9b::/96"] {
        let message = common::err(&client, "create_sandbox", json!({"network": {"allow_out": [entry]}})).await;
        assert!(message.contains("loopback or link-local"), "{entry}: {message}");
    }
    let host = net.host_addr;
    let spellings = [host.to_string(), format!("{host}/32"), format!("::ffff:{host}"), format!("64:ff9b::{host}")];
    common::ok(&client, "create_sandbox", json!({"network": {"allow_out": spellings}})).await;
    let out = common::ok(&client, "run_command", probe(&net.internet_addr.to_string(), 8080)).await;
    assert_eq!(stdout(&out), "OPEN internet-ok", "egress through the relays: {out}");
    let out = common::ok(&client, "run_command", probe(&net.private_addr.to_string(), 8080)).await;
    let blocked = stdout(&out);
    assert_eq!(blocked, "CLOSED ConnectionRefusedError", "a blocked range: {out}");
    let out = common::ok(&client, "run_command", probe(&host.to_string(), tcp)).await;
    assert!(!out.to_string().contains(SECRET), "{out}");
    assert_eq!(stdout(&out), blocked, "the host's address is refused like a blocked range: {out}");
    common::close(client).await;
    let _ = std::fs::remove_dir(&empty);
}
