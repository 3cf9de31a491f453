//! Test hosts for the network tests: a network namespace of the test's own,
//! joined to the host by a veth pair, standing in for "the internet"
//! (`198.18.0.0/15`, RFC 2544) and for a private network (`10.213.0.0/16`).
//! Each instance takes fresh subnets and names, runs its servers with
//! `ip netns exec`, and removes everything (namespace, veths, servers) on drop.
//! No traffic ever leaves this machine.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::process::ProcessGuard;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A tiny DNS server (standard library only): answers A queries for names ending in `.test` with
/// the address given on the command line, NXDOMAIN for the rest.
pub const DNS_SERVER: &str = r#"
import socket, struct, sys
addr, answer = sys.argv[1], socket.inet_aton(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, 53))
while True:
    q, peer = s.recvfrom(512)
    if len(q) < 12:
        continue
    i = 12
    labels = []
    while i < len(q) and q[i] != 0:
        labels.append(q[i + 1:i + 1 + q[i]].decode("ascii", "replace"))
        i += 1 + q[i]
    qtype = struct.unpack("!H", q[i + 1:i + 3])[0] if i + 3 <= len(q) else 0
    question = q[12:i + 5]
    name = ".".join(labels).lower()
    ok = name.endswith(".test") and qtype == 1
    flags = 0x8180 if ok else 0x8183
    head = q[:2] + struct.pack("!HHHHH", flags, 1, 1 if ok else 0, 0, 0)
    body = question + (b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + answer if ok else b"")
    s.sendto(head + body, peer)
"#;

/// A one-line HTTP server: answers every connection with `200` and `BODY`.
pub const HTTP_SERVER: &str = r#"
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64)
body = sys.argv[3].encode()
def serve(c):
    try:
        c.recv(65536)
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    finally:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// A test namespace with an "internet" address and a private one.
pub struct TestNet {
    pub name: String,
    /// The host's end of the internet link (a host interface address).
    pub host_addr: Ipv4Addr,
    /// The test host's internet address.
    pub internet_addr: Ipv4Addr,
    /// The test host's private address (10.213.x.2).
    pub private_addr: Ipv4Addr,
    servers: Vec<ProcessGuard>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl TestNet {
    pub fn new() -> TestNet {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let slot = (std::process::id().wrapping_mul(7).wrapping_add(n * 31) % 250 + 1) as u8;
        let tag = format!("{}{}", std::process::id() % 100_000, n);
        let name = format!("smcp-net-{tag}");
        let (h1, t1, h2, t2) = (format!("smh{tag}"), format!("smt{tag}"), format!("smp{tag}"), format!("smq{tag}"));
        let host_addr = Ipv4Addr::new(198, 18, slot, 1);
        let internet_addr = Ipv4Addr::new(198, 18, slot, 2);
        let private_host = Ipv4Addr::new(10, 213, slot, 1);
        let private_addr = Ipv4Addr::new(10, 213, slot, 2);
        ip(&["netns", "add", &name]);
        let net = TestNet { name: name.clone(), host_addr, internet_addr, private_addr, servers: Vec::new() };
        for (host_end, test_end, host_ip, test_ip) in
            [(&h1, &t1, host_addr, internet_addr), (&h2, &t2, private_host, private_addr)]
        {
            ip(&["link", "add", host_end, "type", "veth", "peer", "name", test_end]);
            ip(&["link", "set", test_end, "netns", &name]);
            ip(&["addr", "add", &format!("{host_ip}/30"), "dev", host_end]);
            ip(&["link", "set", host_end, "up"]);
            ip(&["-n", &name, "addr", "add", &format!("{test_ip}/30"), "dev", test_end]);
            ip(&["-n", &name, "link", "set", test_end, "up"]);
        }
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        net
    }

    /// Runs a python3 server inside the test namespace.
    pub fn spawn_python(&mut self, script: &str, args: &[String]) {
        let server = ProcessGuard::spawn(
            Command::new("ip")
                .args(["netns", "exec", &self.name, "python3", "-c", script])
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
            Duration::ZERO,
        )
        .expect("python3 server");
        self.servers.push(server);
    }

    /// An HTTP server on `addr:port` answering `body`; waits until it accepts.
    pub fn http(&mut self, addr: Ipv4Addr, port: u16, body: &str) {
        self.spawn_python(HTTP_SERVER, &[addr.to_string(), port.to_string(), body.to_owned()]);
        let target = std::net::SocketAddr::from((addr, port));
        let up = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            std::net::TcpStream::connect_timeout(&target, Duration::from_millis(200)).is_ok()
        });
        assert!(up, "test server {target} did not start");
    }

    /// The DNS server on the internet address, answering `*.test` with `answer`.
    pub fn dns(&mut self, answer: Ipv4Addr) {
        self.spawn_python(DNS_SERVER, &[self.internet_addr.to_string(), answer.to_string()]);
        // Up once it answers a query for `probe.test` from the host.
        let server = std::net::SocketAddr::from((self.internet_addr, 53));
        let query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05probe\x04test\x00\x00\x01\x00\x01";
        let answers = || -> bool {
            let Ok(socket) = std::net::UdpSocket::bind("0.0.0.0:0") else { return false };
            let _ = socket.set_read_timeout(Some(Duration::from_millis(100)));
            let mut reply = [0u8; 512];
            socket.send_to(query, server).is_ok() && socket.recv(&mut reply).is_ok_and(|n| n >= 12)
        };
        assert!(super::process::wait_until(Duration::from_secs(10), answers), "the test DNS server never answered");
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        self.servers.clear();
        // Deleting the namespace destroys the test ends of the veths, and so their host ends.
        let _ = Command::new("ip").args(["netns", "delete", &self.name]).status();
    }
}

/// Python source run inside a sandbox: connects to HOST:PORT, sends a request, prints what the
/// server answered ("OPEN <body>") or "CLOSED <reason>" (a reset, EOF or timeout).
pub fn probe_source(host: &str, port: u16) -> String {
    format!(
        "import socket\ntry:\n    s = socket.create_connection(('{host}', {port}), timeout=5)\n    s.settimeout(5)\n    \
         s.sendall(b'GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n')\n    data = s.recv(4096)\n    \
         print('OPEN ' + data.decode('latin-1').split('\\r\\n\\r\\n')[-1] if data.startswith(b'HTTP/') else 'CLOSED eof')\n\
         except Exception as e:\n    print('CLOSED ' + type(e).__name__)\n"
    )
}

/// A shell command that runs [`probe_source`].
pub fn probe_script(host: &str, port: u16) -> String {
    format!("python3 - <<'EOF'\n{}EOF", probe_source(host, port))
}
