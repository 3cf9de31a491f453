//! Network namespaces seen from the provider: making a fresh one, preparing it
//! for a sandbox (loopback, the TUN device `eth0` with its address and default
//! route, the nftables rules that refuse the host's own addresses and denied
//! destinations and send every other outbound TCP connection to the
//! provider's egress listener), and
//! running code inside one. The provider
//! never enters a namespace with its own threads: each operation runs on a
//! short-lived thread that `setns`es, works, and exits.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

use super::host_addrs::HostAddrs;

/// The sandbox's own address on `eth0`.
pub const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 21);
/// The address of the other end of `eth0`: the sandbox's DNS server (`/etc/resolv.conf`).
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 22);
/// Port of the egress listener inside the sandbox's namespace (on its loopback).
pub const EGRESS_PORT: u16 = 1;
/// Name of the TUN device inside every sandbox.
const TUN_NAME: &[u8] = b"eth0";

/// The nftables ruleset of every sandbox namespace, with the host's addresses and the default
/// rules in its sets:
/// - `guard` (before address translation) refuses at once, in the kernel, the host's own
///   addresses (set `host`, whatever the sandbox's rules say; see [`HostAddrs`]) and what the
///   sandbox's rules deny by address (a TCP reset, or ICMP port unreachable): `connect()` fails
///   the way it would against a firewall, instead of being accepted by the egress relay and then
///   reset, and a host address fails exactly like a blocked range. The `allow` and `deny` sets
///   follow [`EgressPolicy::kernel_sets`](super::policy::EgressPolicy::kernel_sets).
/// - `egress` sends every remaining outbound TCP connection to the egress listener, where the
///   provider judges it again with the whole policy and relays it.
fn ruleset(host: &[String], opened: &[std::net::IpAddr]) -> String {
    let (_, deny) = super::policy::EgressPolicy::default_kernel_sets(opened);
    let host = if host.is_empty() { String::new() } else { format!("elements = {{ {} }}", host.join(", ")) };
    format!(
        "table ip sandbox_mcp {{\n\
           set host {{ type ipv4_addr; flags interval; auto-merge; {host} }}\n\
           set allow {{ type ipv4_addr; flags interval; auto-merge; }}\n\
           set deny {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {} }} }}\n\
           chain guard {{\n\
             type filter hook output priority -150; policy accept;\n\
             oifname \"lo\" return\n\
             ip daddr {GATEWAY_ADDR} udp dport 53 return\n\
             ip daddr @host meta l4proto tcp reject with tcp reset\n\
             ip daddr @host reject\n\
             ip daddr @allow return\n\
             ip daddr @deny meta l4proto tcp reject with tcp reset\n\
             ip daddr @deny reject\n\
           }}\n\
           chain egress {{\n\
             type nat hook output priority -100; policy accept;\n\
             oifname \"lo\" return\n\
             meta l4proto tcp redirect to :{EGRESS_PORT}\n\
           }}\n\
         }}\n",
        deny.join(", ")
    )
}

/// Replaces the guard's `host` set of `netns` (see [`ruleset`]) in one nftables transaction.
pub fn set_host(netns: &OwnedFd, host: &[String]) -> io::Result<()> {
    let mut script = String::from("flush set ip sandbox_mcp host\n");
    if !host.is_empty() {
        script.push_str(&format!("add element ip sandbox_mcp host {{ {} }}\n", host.join(", ")));
    }
    in_netns(netns, || run_in_current_netns("nft", &["-f", "-"], &script))
}

/// Replaces the whole ruleset of `netns` with this version's (see [`ruleset`]), in one nftables
/// transaction: for a namespace re-adopted after a provider restart, whose rules an older
/// version may have written. Its `allow` and `deny` sets are then the defaults.
pub fn reset_rules(netns: &OwnedFd, host: &[String], opened: &[std::net::IpAddr]) -> io::Result<()> {
    let script = format!("table ip sandbox_mcp\ndelete table ip sandbox_mcp\n{}", ruleset(host, opened));
    in_netns(netns, || run_in_current_netns("nft", &["-f", "-"], &script))
}

/// Replaces the guard's sets of `netns` (see [`ruleset`]) in one nftables transaction.
pub fn set_guard(netns: &OwnedFd, allow: &[String], deny: &[String]) -> io::Result<()> {
    let mut script = String::from("flush set ip sandbox_mcp allow\nflush set ip sandbox_mcp deny\n");
    if !deny.is_empty() {
        script.push_str(&format!("add element ip sandbox_mcp deny {{ {} }}\n", deny.join(", ")));
    }
    if !allow.is_empty() {
        script.push_str(&format!("add element ip sandbox_mcp allow {{ {} }}\n", allow.join(", ")));
    }
    in_netns(netns, || run_in_current_netns("nft", &["-f", "-"], &script))
}

/// `ip -batch` commands that configure the namespace's links and routes.
const IP_BATCH: &str = "link set lo up\n\
link set eth0 up\n\
addr add 169.254.0.21/30 dev eth0\n\
route add default via 169.254.0.22 dev eth0\n";

/// A namespace ready for a sandbox: the namespace, its TUN device, and its egress listener.
pub struct PreparedNetns {
    pub netns: OwnedFd,
    pub tun: OwnedFd,
    pub listener: std::net::TcpListener,
    /// The [`Snapshot::generation`](super::host_addrs::Snapshot) of the host addresses in its
    /// guard.
    pub host_generation: u64,
}

/// Runs `f` on a new thread that has entered `netns`; sockets and devices it creates belong there.
pub fn in_netns<T: Send>(netns: &OwnedFd, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let fd = netns.as_fd();
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                f()
            })
            .join()
            .map_err(|_| io::Error::other("network namespace worker panicked"))?
    })
}

/// Creates a new, empty network namespace and returns a descriptor that keeps it alive.
pub fn create_netns() -> io::Result<OwnedFd> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                let file = std::fs::File::open("/proc/thread-self/ns/net")?;
                Ok(OwnedFd::from(file))
            })
            .join()
            .map_err(|_| io::Error::other("network namespace worker panicked"))?
    })
}

/// Opens the namespace of a running process (to re-adopt a sandbox after a provider restart).
pub fn open_netns_of(pid: i32) -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(std::fs::File::open(format!("/proc/{pid}/ns/net"))?))
}

/// Makes a new namespace with everything a sandbox needs, its guard holding the host's addresses
/// as `host` knows them now.
pub fn prepare(host: &HostAddrs) -> io::Result<PreparedNetns> {
    let snapshot = host.snapshot();
    let rules = ruleset(&host.kernel_set(&snapshot), host.opened());
    let netns = create_netns()?;
    let (tun, listener) = in_netns(&netns, || {
        let tun = open_tun(true)?;
        run_in_current_netns("ip", &["-batch", "-"], IP_BATCH)?;
        run_in_current_netns("nft", &["-f", "-"], &rules)?;
        let listener = bind_egress_listener()?;
        Ok((tun, listener))
    })?;
    Ok(PreparedNetns { netns, tun, listener, host_generation: snapshot.generation })
}

/// Re-attaches to the TUN device and re-opens the egress listener of a sandbox that survived a
/// provider restart (its routes and rules live in its namespace and are still there).
pub fn reattach(netns: &OwnedFd) -> io::Result<(OwnedFd, std::net::TcpListener)> {
    in_netns(netns, || Ok((open_tun(false)?, bind_egress_listener()?)))
}

fn bind_egress_listener() -> io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddrV4::new(Ipv4Addr::LOCALHOST, EGRESS_PORT).into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Creates a TCP socket inside `netns`, not yet connected (connect it from async code).
pub fn tcp_socket_in(netns: &OwnedFd) -> io::Result<std::net::TcpStream> {
    in_netns(netns, || {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        Ok(socket.into())
    })
}

fn run_in_current_netns(program: &str, args: &[&str], input: &str) -> io::Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run {program}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Opens `/dev/net/tun` and attaches to (or creates) the persistent device `eth0` of the current
/// namespace, non-blocking.
fn open_tun(create: bool) -> io::Result<OwnedFd> {
    // SAFETY: open(2) of a constant NUL-terminated path; the result is checked.
    let raw = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if raw < 0 {
        return Err(io::Error::new(
            io::Error::last_os_error().kind(),
            format!("cannot open /dev/net/tun: {}", io::Error::last_os_error()),
        ));
    }
    // SAFETY: raw is a descriptor we just opened and own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: a zeroed ifreq with a NUL-terminated name shorter than IFNAMSIZ and the flags union set.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(TUN_NAME) {
            *dst = *src as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        if libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &req) < 0 {
            return Err(io::Error::new(
                io::Error::last_os_error().kind(),
                format!("cannot attach the TUN device: {}", io::Error::last_os_error()),
            ));
        }
        if create && libc::ioctl(fd.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Checks once, at provider start, that network namespaces can be prepared here (TUN, `ip`,
/// `nft`); the error names what is missing.
pub fn probe() -> Result<(), String> {
    match prepare(&HostAddrs::new(&[])) {
        Ok(_) => Ok(()),
        Err(err) => Err(format!(
            "sandbox-mcp provider cannot give sandboxes their own network: {err}. It needs CAP_NET_ADMIN, \
             /dev/net/tun, and the `ip` (iproute2) and `nft` (nftables) programs (Debian: apt-get install \
             iproute2 nftables; in a container also --device /dev/net/tun --cap-add NET_ADMIN)"
        )),
    }
}
