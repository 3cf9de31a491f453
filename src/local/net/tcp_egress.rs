//! Outbound TCP of one sandbox: its connections arrive, redirected by the
//! namespace's nftables rule, on the egress listener; for each one the
//! original destination is read from conntrack (`SO_ORIGINAL_DST`), judged by
//! the sandbox's [`EgressPolicy`](super::policy::EgressPolicy), and, if
//! allowed, connected from the host's network and spliced both ways.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use super::SandboxNetShared;
use super::policy::Verdict;

/// How long the provider tries to reach a destination before resetting the sandbox's connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Most egress connections open at once per sandbox.
pub const MAX_CONNECTIONS: usize = 1024;

/// Accepts redirected connections until the sandbox's network is torn down.
pub async fn serve(listener: TcpListener, shared: Arc<SandboxNetShared>) {
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, _) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                tracing::debug!(sandbox = %shared.sandbox_id, %err, "egress accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Per sandbox, then provider-wide (see `EgressBudget`): over either, the sandbox's
        // connection is reset at once and holds nothing.
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            reset(stream);
            continue;
        };
        let Some(budget_permit) = shared.budget.try_acquire() else {
            tracing::debug!(sandbox = %shared.sandbox_id, "egress budget exhausted; connection reset");
            reset(stream);
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let stop = shared.stop.clone();
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = relay(stream, &shared) => {}
            }
            drop((permit, budget_permit));
        });
    }
}

async fn relay(mut inside: TcpStream, shared: &SandboxNetShared) {
    let Ok(original) = original_destination(&inside) else {
        reset(inside);
        return;
    };
    let target = match shared.route_tcp(original) {
        Some(target) => target,
        None => {
            reset(inside);
            return;
        }
    };
    let outside = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::debug!(sandbox = %shared.sandbox_id, %target, %err, "egress connect failed");
            reset(inside);
            return;
        }
        Err(_) => {
            reset(inside);
            return;
        }
    };
    let _ = inside.set_nodelay(true);
    let _ = outside.set_nodelay(true);
    let mut outside = outside;
    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
}

impl SandboxNetShared {
    /// Where an outbound TCP connection to `original` goes: the DNS forwarder's upstream for the
    /// sandbox's DNS address, the destination itself when the policy allows it, or nowhere.
    fn route_tcp(&self, original: SocketAddr) -> Option<SocketAddr> {
        if original.ip().is_loopback() {
            // Only a direct connection to the listener itself has a loopback original destination.
            return None;
        }
        if let Some(upstream) = self.dns_upstream(original) {
            return upstream;
        }
        match self.decide(original.ip()) {
            Verdict::Allow => Some(original),
            Verdict::Deny(reason) => {
                tracing::debug!(sandbox = %self.sandbox_id, dst = %original, ?reason, "egress denied");
                None
            }
        }
    }
}

/// Closes a connection with a reset, so the sandbox's side fails at once.
fn reset(stream: TcpStream) {
    // A zero linger makes close send a reset at once (it never blocks).
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// The destination the sandbox asked for, before the redirect (IPv4 conntrack).
fn original_destination(stream: &TcpStream) -> io::Result<SocketAddr> {
    let mut addr: libc::sockaddr_in = unsafe_zeroed();
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `addr`, a sockaddr_in we own.
    let ret = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(addr.sin_port))))
}

fn unsafe_zeroed() -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}
