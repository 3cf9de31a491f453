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

use ipnet::Ipv4Net;

use super::host_addrs::HostAddrs;
use super::{netlink, nftables};

/// The sandbox's own address on `eth0`.
pub const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 21);
/// The address of the other end of `eth0`: the sandbox's DNS server (`/etc/resolv.conf`).
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 22);
/// Port of the egress listener inside the sandbox's namespace (on its loopback).
pub const EGRESS_PORT: u16 = 1;
/// Name of the TUN device inside every sandbox.
const TUN_NAME: &[u8] = b"eth0";

/// The nftables table `sandbox_mcp` of every sandbox namespace (written by [`nftables`]):
/// - `guard` (output hook, before address translation) lets through loopback, packets of
///   connections already judged, and DNS to the sandbox's resolver; then jumps to `host`, which
///   refuses the host's own addresses (whatever the sandbox's rules say; see [`HostAddrs`]), and
///   to `rules`, where the sandbox's `allow` entries return and its `deny` entries are refused.
///   Refusals happen at once, in the kernel (a TCP reset, or ICMP port unreachable): `connect()`
///   fails the way it would against a firewall, instead of being accepted by the egress relay
///   and then reset, and a host address fails exactly like a blocked range. `allow` and `deny`
///   follow [`EgressPolicy::kernel_sets`](super::policy::EgressPolicy::kernel_sets).
/// - `egress` (nat, output) sends every remaining outbound TCP connection to the egress
///   listener, where the provider judges it again with the whole policy and relays it.
fn fixed() -> nftables::Fixed {
    nftables::Fixed { dns: GATEWAY_ADDR, egress_port: EGRESS_PORT }
}

/// CIDR blocks or bare addresses (as [`EgressPolicy::kernel_sets`](super::policy::EgressPolicy::kernel_sets)
/// and [`HostAddrs::kernel_set`] write them).
fn nets(list: &[String]) -> Vec<Ipv4Net> {
    list.iter()
        .filter_map(|s| s.parse::<Ipv4Net>().ok().or_else(|| s.parse::<Ipv4Addr>().ok().map(Ipv4Net::from)))
        .collect()
}

/// Writes the whole table into the current namespace: the host's addresses and the default rules.
fn write_table(host: &[String], opened: &[std::net::IpAddr]) -> io::Result<()> {
    let (allow, deny) = super::policy::EgressPolicy::default_kernel_sets(opened);
    nftables::replace_table(&fixed(), &nets(host), &nets(&allow), &nets(&deny))
}

/// Replaces the guard's `host` chain of `netns` in one nftables transaction.
pub fn set_host(netns: &OwnedFd, host: &[String]) -> io::Result<()> {
    let host = nets(host);
    in_netns(netns, || nftables::replace_host(&host))
}

/// Replaces the whole table of `netns` with this version's, in one nftables transaction: for a
/// namespace re-adopted after a provider restart, whose rules an older version may have
/// written. Its `rules` chain then holds the defaults.
pub fn reset_rules(netns: &OwnedFd, host: &[String], opened: &[std::net::IpAddr]) -> io::Result<()> {
    in_netns(netns, || write_table(host, opened))
}

/// Replaces the guard's `rules` chain of `netns` (the sandbox's `allow` and `deny`) in one
/// nftables transaction.
pub fn set_guard(netns: &OwnedFd, allow: &[String], deny: &[String]) -> io::Result<()> {
    let (allow, deny) = (nets(allow), nets(deny));
    in_netns(netns, || nftables::replace_policy(&allow, &deny))
}

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
    let host_set = host.kernel_set(&snapshot);
    let netns = create_netns()?;
    let (tun, listener) = in_netns(&netns, || {
        let tun = open_tun(true)?;
        let addr = Ipv4Net::new(SANDBOX_ADDR, 30).map_err(io::Error::other)?;
        netlink::configure_links(c"eth0", addr, GATEWAY_ADDR)?;
        write_table(&host_set, host.opened())?;
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

/// Network namespaces cannot be prepared on this host (the probe at provider start).
#[derive(Debug, thiserror::Error)]
#[error(
    "sandbox-mcp provider cannot give sandboxes their own network: {0}. It needs CAP_NET_ADMIN, \
     /dev/net/tun and a kernel with nf_tables (nat, reject); in a container also --device \
     /dev/net/tun --cap-add NET_ADMIN"
)]
pub struct ProbeError(io::Error);

/// Checks once, at provider start, that network namespaces can be prepared here (TUN, netlink,
/// nf_tables); the error names what is missing.
pub fn probe() -> Result<(), ProbeError> {
    match prepare(&HostAddrs::new(&[])) {
        Ok(_) => Ok(()),
        Err(err) => Err(ProbeError(err)),
    }
}
