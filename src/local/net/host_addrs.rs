//! The host's own addresses, as the egress checks see them: read from every
//! interface when the provider starts, and kept current by a thread that
//! listens to the kernel's address notifications (rtnetlink `IFADDR` groups)
//! and re-reads them on each change. Each change is pushed, as the `host` set
//! of the kernel guard, into every live sandbox namespace (see
//! [`NetPool`](super::NetPool)), so that a connection to a host address is
//! refused in the kernel exactly like one to a blocked range. The egress
//! relays also re-read the interfaces at each decision, which covers the
//! moment between a change and its notification.
//!
//! Addresses the operator opened (`--open-host-address`) are left out of the
//! kernel's `host` set and judged like a reserved range instead.

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use super::policy::{HostAddress, normalise};

/// The addresses of the host's interfaces at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Bumped at every change, so a namespace prepared earlier knows its set is stale.
    pub generation: u64,
    addrs: BTreeSet<IpAddr>,
}

/// The host's addresses, kept current (see the module doc).
pub struct HostAddrs {
    current: RwLock<Arc<Snapshot>>,
    /// Host addresses the operator opened, normalised.
    opened: Vec<IpAddr>,
}

/// Every address configured on an interface of the host's network namespace, normalised.
pub fn read_addresses() -> io::Result<BTreeSet<IpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    Ok(addrs
        .filter_map(|ifa| {
            let sockaddr = ifa.address?;
            if let Some(v4) = sockaddr.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            sockaddr.as_sockaddr_in6().map(|v6| normalise(IpAddr::V6(v6.ip())))
        })
        .collect())
}

impl HostAddrs {
    /// Reads the host's addresses now. `opened`: the operator's `--open-host-address` list.
    pub fn new(opened: &[IpAddr]) -> Arc<HostAddrs> {
        let addrs = read_addresses().unwrap_or_else(|err| {
            tracing::warn!(%err, "cannot read the host's addresses; every destination is refused until they are");
            BTreeSet::new()
        });
        Arc::new(HostAddrs {
            current: RwLock::new(Arc::new(Snapshot { generation: 0, addrs })),
            opened: opened.iter().map(|ip| normalise(*ip)).collect(),
        })
    }

    /// The addresses as last read.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        crate::sync::read(&self.current).clone()
    }

    /// The host addresses the operator opened.
    pub fn opened(&self) -> &[IpAddr] {
        &self.opened
    }

    /// Re-reads the interfaces; true if the addresses changed.
    pub fn refresh(&self) -> bool {
        let Ok(addrs) = read_addresses() else { return false };
        let mut current = crate::sync::write(&self.current);
        if current.addrs == addrs {
            return false;
        }
        *current = Arc::new(Snapshot { generation: current.generation + 1, addrs });
        true
    }

    /// The kernel guard's `host` set of `snapshot`: its IPv4 addresses (sandboxes have no IPv6
    /// route) except the opened ones and loopback (which, inside a sandbox, is its own).
    pub fn kernel_set(&self, snapshot: &Snapshot) -> Vec<String> {
        snapshot
            .addrs
            .iter()
            .filter(|ip| ip.is_ipv4() && !ip.is_loopback() && !self.opened.contains(ip))
            .map(|ip| ip.to_string())
            .collect()
    }

    /// What `addr` (normalised) is to the egress check. The interfaces are read again, so an
    /// address the host gained a moment ago is covered; when they cannot be read, every address
    /// counts as the host's (fail closed).
    pub fn classify(&self, addr: IpAddr) -> HostAddress {
        if self.opened.contains(&addr) {
            return HostAddress::Opened;
        }
        let host = match read_addresses() {
            Ok(now) => now.contains(&addr) || self.snapshot().addrs.contains(&addr),
            Err(_) => true,
        };
        if host { HostAddress::Closed } else { HostAddress::No }
    }
}

/// Starts the thread that keeps `host` current: on each address notification of the kernel it
/// re-reads the interfaces and, when they changed, calls `on_change` with the new snapshot. The
/// thread ends when `host` is dropped (it wakes every second to check).
pub fn watch(host: &Arc<HostAddrs>, on_change: impl Fn(&HostAddrs, &Snapshot) + Send + 'static) -> io::Result<()> {
    use nix::sys::socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, setsockopt, socket, sockopt,
    };
    let socket = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkRoute)?;
    let groups = (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
    bind(std::os::fd::AsRawFd::as_raw_fd(&socket), &NetlinkAddr::new(0, groups))?;
    setsockopt(&socket, sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(1, 0))?;
    let weak: Weak<HostAddrs> = Arc::downgrade(host);
    std::thread::Builder::new().name("host-addrs".into()).spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let event = recv(std::os::fd::AsRawFd::as_raw_fd(&socket), &mut buf, MsgFlags::empty());
            let Some(host) = weak.upgrade() else { return };
            match event {
                // A notification, or ENOBUFS (some were lost): read the interfaces again.
                Ok(_) | Err(nix::errno::Errno::ENOBUFS) => {}
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
                Err(err) => {
                    tracing::warn!(%err, "the host address watch failed; relays still check every connection");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            if host.refresh() {
                let snapshot = host.snapshot();
                tracing::debug!(generation = snapshot.generation, "the host's addresses changed");
                on_change(&host, &snapshot);
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_addresses_include_loopback_and_leave_out_opened_ones() {
        let now = read_addresses().unwrap();
        assert!(now.contains(&"127.0.0.1".parse::<IpAddr>().unwrap()), "{now:?}");
        let some_v4 = now.iter().find(|ip| ip.is_ipv4() && !ip.is_loopback()).copied();
        let host = HostAddrs::new(&some_v4.into_iter().collect::<Vec<_>>());
        let set = host.kernel_set(&host.snapshot());
        assert!(!set.iter().any(|s| s.starts_with("127.")), "{set:?}");
        if let Some(opened) = some_v4 {
            assert!(!set.contains(&opened.to_string()));
            assert_eq!(host.classify(opened), HostAddress::Opened);
        }
        assert_eq!(host.classify("127.0.0.1".parse().unwrap()), HostAddress::Closed);
        assert_eq!(host.classify("198.51.100.77".parse().unwrap()), HostAddress::No);
    }
}
