//! Outbound UDP of one sandbox, read as IPv4 packets from its TUN device:
//! each flow (source and destination address and port) is judged once by the
//! sandbox's policy, relayed through a connected UDP socket on the host, and
//! its replies are written back as packets. Datagrams to the sandbox's DNS
//! address go to the provider's upstream resolvers. Anything that is not
//! unfragmented IPv4 UDP is dropped (TCP never reaches the device: the
//! namespace's nftables rule redirects it).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::net::UdpSocket;

use super::SandboxNetShared;
use super::policy::Verdict;

/// Most UDP flows open at once per sandbox.
pub const MAX_FLOWS: usize = 256;
/// A flow with no datagram either way for this long is closed.
const FLOW_IDLE: Duration = Duration::from_secs(60);

/// One UDP flow as the sandbox sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FlowKey {
    src: SocketAddrV4,
    dst: SocketAddrV4,
}

/// A parsed outbound datagram.
#[derive(Debug, PartialEq, Eq)]
struct Datagram<'a> {
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &'a [u8],
}

/// Parses an unfragmented IPv4 UDP packet; anything else is `None`.
fn parse(packet: &[u8]) -> Option<Datagram<'_>> {
    if packet.len() < 28 || packet[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    let fragment = u16::from_be_bytes([packet[6], packet[7]]);
    if ihl < 20 || total > packet.len() || total < ihl + 8 || packet[9] != 17 || fragment & 0x3fff != 0 {
        return None;
    }
    let src_ip = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let dst_ip = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    let udp = &packet[ihl..total];
    let src_port = u16::from_be_bytes([udp[0], udp[1]]);
    let dst_port = u16::from_be_bytes([udp[2], udp[3]]);
    let len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if len < 8 || len > udp.len() {
        return None;
    }
    Some(Datagram {
        src: SocketAddrV4::new(src_ip, src_port),
        dst: SocketAddrV4::new(dst_ip, dst_port),
        payload: &udp[8..len],
    })
}

fn checksum_add(mut sum: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    for pair in &mut chunks {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

fn checksum_fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Builds the IPv4 UDP packet that carries `payload` from `src` to `dst`.
fn build(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Option<Vec<u8>> {
    let udp_len = u16::try_from(8 + payload.len()).ok()?;
    let total = u16::try_from(20 + 8 + payload.len()).ok()?;
    let mut packet = Vec::with_capacity(usize::from(total));
    packet.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    packet[2..4].copy_from_slice(&total.to_be_bytes());
    packet.extend_from_slice(&src.ip().octets());
    packet.extend_from_slice(&dst.ip().octets());
    let header_sum = checksum_fold(checksum_add(0, &packet[..20]));
    packet[10..12].copy_from_slice(&header_sum.to_be_bytes());
    packet.extend_from_slice(&src.port().to_be_bytes());
    packet.extend_from_slice(&dst.port().to_be_bytes());
    packet.extend_from_slice(&udp_len.to_be_bytes());
    packet.extend_from_slice(&[0, 0]);
    packet.extend_from_slice(payload);
    let mut sum = checksum_add(0, &src.ip().octets());
    sum = checksum_add(sum, &dst.ip().octets());
    sum += 17 + u32::from(udp_len);
    sum = checksum_add(sum, &packet[20..]);
    let udp_sum = match checksum_fold(sum) {
        0 => 0xffff,
        other => other,
    };
    packet[26..28].copy_from_slice(&udp_sum.to_be_bytes());
    Some(packet)
}

/// The sandbox's TUN device, shared by the reader and the reply tasks.
struct Tun(AsyncFd<OwnedFd>);

impl Tun {
    async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.0.readable().await?;
            match guard.try_io(|fd| {
                // SAFETY: read(2) into a buffer we own, at most its length.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
            }) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    fn write(&self, packet: &[u8]) {
        // SAFETY: write(2) of a buffer we own; a full queue just drops the packet, as a link would.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
    }
}

/// Reads the sandbox's TUN device until its network is torn down.
pub async fn serve(tun: OwnedFd, shared: Arc<SandboxNetShared>) {
    // SAFETY: an OwnedFd always returns the descriptor it owns, which stays open until dropped
    // together with the AsyncFd.
    let registered = unsafe { AsyncFd::register_with_interest(tun, tokio::io::Interest::READABLE) };
    let tun = match registered {
        Ok(fd) => Arc::new(Tun(fd)),
        Err(err) => {
            let err = std::io::Error::from(err);
            tracing::warn!(sandbox = %shared.sandbox_id, %err, "cannot watch the TUN device; no UDP for this sandbox");
            return;
        }
    };
    let flows: Arc<Mutex<HashMap<FlowKey, Arc<UdpSocket>>>> = Arc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let n = tokio::select! {
            _ = shared.stop.cancelled() => return,
            read = tun.read(&mut buf) => match read {
                Ok(n) => n,
                Err(err) => {
                    tracing::debug!(sandbox = %shared.sandbox_id, %err, "TUN read failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(datagram) = parse(&buf[..n]) else { continue };
        let key = FlowKey { src: datagram.src, dst: datagram.dst };
        let existing = crate::sync::lock(&flows).get(&key).cloned();
        let socket = match existing {
            Some(socket) => socket,
            None => match open_flow(key, &shared, &flows, &tun).await {
                Some(socket) => socket,
                None => continue,
            },
        };
        // A direct non-blocking send (tokio's try_send would wait for a readiness event the new
        // socket has not had yet); a full buffer drops the datagram, as a link would.
        let _ = socket2::SockRef::from(&*socket).send(datagram.payload);
    }
}

/// Judges a new flow and, if allowed, opens its host socket and the task relaying its replies.
async fn open_flow(
    key: FlowKey,
    shared: &Arc<SandboxNetShared>,
    flows: &Arc<Mutex<HashMap<FlowKey, Arc<UdpSocket>>>>,
    tun: &Arc<Tun>,
) -> Option<Arc<UdpSocket>> {
    let target = match shared.dns_upstream(SocketAddr::V4(key.dst)) {
        Some(upstream) => upstream?,
        None => match shared.decide(std::net::IpAddr::V4(*key.dst.ip())) {
            Verdict::Allow => SocketAddr::V4(key.dst),
            Verdict::Deny(reason) => {
                tracing::debug!(sandbox = %shared.sandbox_id, dst = %key.dst, ?reason, "udp egress denied");
                return None;
            }
        },
    };
    if crate::sync::lock(flows).len() >= MAX_FLOWS {
        return None;
    }
    let budget_permit = shared.budget.try_acquire()?;
    let bind: SocketAddr = if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().ok()?;
    let socket = UdpSocket::bind(bind).await.ok()?;
    socket.connect(target).await.ok()?;
    let socket = Arc::new(socket);
    crate::sync::lock(flows).insert(key, socket.clone());
    let (reader, flows, tun, stop) = (socket.clone(), flows.clone(), tun.clone(), shared.stop.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65507];
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => break,
                r = tokio::time::timeout(FLOW_IDLE, reader.recv(&mut buf)) => r,
            };
            match received {
                Ok(Ok(n)) => {
                    if let Some(packet) = build(key.dst, key.src, &buf[..n]) {
                        tun.write(&packet);
                    }
                }
                Ok(Err(_)) => continue,
                Err(_idle) => break,
            }
        }
        crate::sync::lock(&flows).remove(&key);
        drop(budget_permit);
    });
    Some(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_packets_parse_back_and_carry_valid_checksums() {
        let src = SocketAddrV4::new(Ipv4Addr::new(169, 254, 0, 22), 53);
        let dst = SocketAddrV4::new(Ipv4Addr::new(169, 254, 0, 21), 40000);
        for payload in [&b""[..], b"x", b"hello, odd length", &[0xffu8; 1400][..]] {
            let packet = build(src, dst, payload).unwrap();
            assert_eq!(checksum_fold(checksum_add(0, &packet[..20])), 0, "IPv4 header checksum");
            let mut sum = checksum_add(0, &src.ip().octets());
            sum = checksum_add(sum, &dst.ip().octets());
            sum += 17 + (8 + payload.len()) as u32;
            assert_eq!(checksum_fold(checksum_add(sum, &packet[20..])), 0, "UDP checksum");
            assert_eq!(parse(&packet), Some(Datagram { src, dst, payload }));
        }
    }

    #[test]
    fn non_udp_fragments_and_truncated_packets_are_dropped() {
        let src = SocketAddrV4::new(Ipv4Addr::new(169, 254, 0, 21), 1234);
        let dst = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 53);
        let good = build(src, dst, b"query").unwrap();
        let mut tcp = good.clone();
        tcp[9] = 6;
        assert_eq!(parse(&tcp), None);
        let mut fragment = good.clone();
        fragment[6] = 0x20; // more fragments
        assert_eq!(parse(&fragment), None);
        assert_eq!(parse(&good[..good.len() - 1]), None);
        let mut v6 = good.clone();
        v6[0] = 0x60;
        assert_eq!(parse(&v6), None);
        assert_eq!(parse(&[]), None);
    }
}
