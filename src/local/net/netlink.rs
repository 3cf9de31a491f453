//! Netlink spoken directly, so that preparing a sandbox's network runs no
//! `ip` or `nft` program: the message builder and the acknowledged exchange
//! shared with [`nftables`](super::nftables), and rtnetlink for the sandbox's
//! links, address and default route. Every function works in the network
//! namespace of the calling thread (its sockets are made there) and waits for
//! the kernel's acknowledgement of each message. The constants are those of
//! `linux/netlink.h` and `linux/rtnetlink.h` (kernel ABI, stable).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use ipnet::Ipv4Net;
pub(super) use nix::sys::socket::SockProtocol;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockType, bind, recv, sendto, setsockopt, socket, sockopt,
};

pub(super) const NLM_F_REQUEST: u16 = 0x1;
pub(super) const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
pub(super) const NLM_F_CREATE: u16 = 0x400;
pub(super) const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 2;
pub(super) const NLA_F_NESTED: u16 = 0x8000;

// rtnetlink
const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RTN_UNICAST: u8 = 1;

/// Netlink messages being built, back to back, with their nested attributes.
#[derive(Default)]
pub(super) struct Msgs {
    pub(super) buf: Vec<u8>,
    /// Start of the message being built, and of each open nested attribute.
    open: Vec<usize>,
    pub(super) count: u32,
}

impl Msgs {
    pub(super) fn begin(&mut self, kind: u16, flags: u16, header: &[u8]) {
        self.open.push(self.buf.len());
        self.count += 1;
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf.extend_from_slice(&self.count.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(header);
        self.pad();
    }

    /// Closes the message or nested attribute opened last, writing its length.
    pub(super) fn end(&mut self) {
        let Some(start) = self.open.pop() else { return };
        let len = self.buf.len() - start;
        if self.open.is_empty() {
            self.buf[start..start + 4].copy_from_slice(&(len as u32).to_ne_bytes());
        } else {
            self.buf[start..start + 2].copy_from_slice(&(len as u16).to_ne_bytes());
        }
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    pub(super) fn attr(&mut self, kind: u16, payload: &[u8]) {
        self.buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
    }

    pub(super) fn be32(&mut self, kind: u16, value: u32) {
        self.attr(kind, &value.to_be_bytes());
    }

    pub(super) fn string(&mut self, kind: u16, value: &str) {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.attr(kind, &bytes);
    }

    pub(super) fn nest(&mut self, kind: u16) {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }
}

pub(super) fn open(protocol: SockProtocol) -> io::Result<OwnedFd> {
    let fd = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, protocol)?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
    setsockopt(&fd, sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(5, 0))?;
    setsockopt(&fd, sockopt::RcvBuf, &(1 << 20))?;
    Ok(fd)
}

/// Sends `payload` (messages numbered 1..=`expected`, each asking for an acknowledgement, plus
/// any that do not) and waits for the `expected` acknowledgements; the first error is returned.
pub(super) fn exchange(fd: &OwnedFd, payload: &[u8], expected: u32) -> io::Result<()> {
    sendto(fd.as_raw_fd(), payload, &NetlinkAddr::new(0, 0), MsgFlags::empty())?;
    let mut acked = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while acked < expected {
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        let mut at = 0;
        while at + 20 <= n {
            let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if len < 16 || at + len > n {
                break;
            }
            if kind == NLMSG_ERROR {
                let code = i32::from_ne_bytes([buf[at + 16], buf[at + 17], buf[at + 18], buf[at + 19]]);
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
                acked += 1;
            }
            at += len.next_multiple_of(4);
        }
    }
    Ok(())
}

/// The index of interface `name` in the current namespace.
fn ifindex(name: &std::ffi::CStr) -> io::Result<u32> {
    Ok(nix::net::if_::if_nametoindex(name)?)
}

/// Brings up `lo` and `dev`, gives `dev` the address `addr`, and routes everything through
/// `gateway` on it (what `ip link set up`, `ip addr add` and `ip route add default` do).
pub fn configure_links(dev: &std::ffi::CStr, addr: Ipv4Net, gateway: Ipv4Addr) -> io::Result<()> {
    let (lo, dev) = (ifindex(c"lo")?, ifindex(dev)?);
    let mut m = Msgs::default();
    for index in [lo, dev] {
        // ifinfomsg: family, pad, type, index, flags, change.
        let mut header = vec![libc::AF_UNSPEC as u8, 0, 0, 0];
        header.extend_from_slice(&(index as i32).to_ne_bytes());
        header.extend_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
        header.extend_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
        m.begin(RTM_NEWLINK, NLM_F_ACK, &header);
        m.end();
    }
    // ifaddrmsg: family, prefix length, flags, scope (universe), index.
    let mut header = vec![libc::AF_INET as u8, addr.prefix_len(), 0, 0];
    header.extend_from_slice(&dev.to_ne_bytes());
    m.begin(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, &header);
    m.attr(IFA_LOCAL, &addr.addr().octets());
    m.attr(IFA_ADDRESS, &addr.addr().octets());
    m.end();
    // rtmsg: family, dst len, src len, tos, table, protocol, scope (universe), type, flags.
    let mut header = vec![libc::AF_INET as u8, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, 0, RTN_UNICAST];
    header.extend_from_slice(&0u32.to_ne_bytes());
    m.begin(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, &header);
    m.attr(RTA_GATEWAY, &gateway.octets());
    m.attr(RTA_OIF, &dev.to_ne_bytes());
    m.end();
    let fd = open(SockProtocol::NetlinkRoute)?;
    exchange(&fd, &m.buf, m.count)
        .map_err(|err| io::Error::new(err.kind(), format!("cannot configure the sandbox's links: {err}")))
}
