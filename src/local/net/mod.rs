//! Sandbox networking in the local provider: every sandbox gets its own
//! network namespace, whose only way out is the provider. Outbound TCP is
//! redirected by an nftables rule inside the namespace (written over netlink,
//! [`nftables`]: no external program is run) to a listener the
//! provider owns there ([`tcp_egress`]); outbound UDP leaves through a TUN
//! device the provider reads ([`udp`]); both are judged by one function
//! ([`policy::EgressPolicy::decide`]) and re-originated from the host; the
//! host's own addresses ([`host_addrs`]) are refused in the kernel first. DNS
//! goes to the provider's upstream resolvers. Inbound traffic reaches a
//! sandbox only through the provider's `{port}-{sandboxID}.{domain}` routing
//! ([`inbound`]). Nothing is changed in the host's own network namespace.
//!
//! Namespaces are prepared ahead in a small pool ([`NetPool`]) so that `create`
//! pays only for a `setns`.

pub mod host_addrs;
pub mod inbound;
pub mod netlink;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod netns;
pub mod nftables;
pub mod policy;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod tcp_egress;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod udp;

use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, RwLock, Weak};

use tokio_util::sync::CancellationToken;

use self::host_addrs::HostAddrs;
use self::netns::{GATEWAY_ADDR, PreparedNetns};
use self::policy::{EgressPolicy, Verdict};

/// Network settings of the local provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// Upstream resolvers of the sandboxes' DNS forwarder (port 53). Default: the host's
    /// `/etc/resolv.conf` nameservers.
    pub dns_servers: Vec<IpAddr>,
    /// Namespaces kept prepared for the next creates.
    pub pool_size: usize,
    /// Domain reported to clients for `{port}-{sandboxID}.{domain}` hosts (E2B's `domain`).
    pub domain: Option<String>,
    /// Host addresses the operator opens to sandboxes (`--open-host-address`): judged like a
    /// reserved range (reachable only through a sandbox's `allowOut`) instead of never.
    pub open_host_addresses: Vec<IpAddr>,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig { dns_servers: host_resolvers(), pool_size: 2, domain: None, open_host_addresses: Vec::new() }
    }
}

/// The nameservers of the host's `/etc/resolv.conf`.
pub fn host_resolvers() -> Vec<IpAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse().ok())
        .collect()
}

/// Descriptors held open by egress relays (a spliced TCP connection holds two, a UDP flow one),
/// across every sandbox of the provider. Capped at an eighth of the process's descriptor limit,
/// read at each new connection, so that sandboxes opening many connections can exhaust neither the
/// provider's nor (when embedded) the gateway's descriptors: the listeners' caps take at most a
/// quarter each, and this leaves the rest for sandbox spawns, namespaces and provider calls.
#[derive(Default)]
pub struct EgressBudget {
    in_use: std::sync::atomic::AtomicUsize,
}

/// One unit of [`EgressBudget`]; returned on drop.
pub struct EgressPermit {
    budget: Arc<EgressBudget>,
}

impl EgressBudget {
    /// The cap for a descriptor limit.
    pub fn cap_for(fd_limit: u64) -> usize {
        usize::try_from(fd_limit / 8).unwrap_or(usize::MAX).max(16)
    }

    /// A permit for one more relay, or `None` when the provider-wide cap is reached.
    pub fn try_acquire(self: &Arc<Self>) -> Option<EgressPermit> {
        use std::sync::atomic::Ordering;
        let fd_limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        let cap = Self::cap_for(fd_limit);
        let mut in_use = self.in_use.load(Ordering::SeqCst);
        loop {
            if in_use >= cap {
                return None;
            }
            match self.in_use.compare_exchange(in_use, in_use + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(EgressPermit { budget: Arc::clone(self) }),
                Err(now) => in_use = now,
            }
        }
    }

    /// Relays open now.
    pub fn in_use(&self) -> usize {
        self.in_use.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for EgressPermit {
    fn drop(&mut self) {
        self.budget.in_use.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What the egress paths of one sandbox share.
pub struct SandboxNetShared {
    pub sandbox_id: String,
    policy: RwLock<EgressPolicy>,
    dns_servers: Vec<IpAddr>,
    /// The host's own addresses.
    host: Arc<HostAddrs>,
    /// The provider-wide egress budget.
    pub budget: Arc<EgressBudget>,
    /// Cancelled when the sandbox's network is torn down.
    pub stop: CancellationToken,
}

impl SandboxNetShared {
    /// Judges a destination with the sandbox's current rules.
    pub fn decide(&self, dst: IpAddr) -> Verdict {
        crate::sync::read(&self.policy).decide(dst, |addr| self.host.classify(addr))
    }

    /// For traffic to the sandbox's DNS address on port 53: `Some(Some(upstream))` when the
    /// sandbox may resolve names, `Some(None)` when it may not; `None` for any other destination.
    pub fn dns_upstream(&self, dst: SocketAddr) -> Option<Option<SocketAddr>> {
        if dst.ip() != IpAddr::V4(GATEWAY_ADDR) || dst.port() != 53 {
            return None;
        }
        let allowed = crate::sync::read(&self.policy).dns_allowed();
        Some(self.dns_servers.first().filter(|_| allowed).map(|ip| SocketAddr::new(*ip, 53)))
    }
}

/// A sandbox's live network: its namespace and the provider tasks serving it. Dropping it stops
/// the tasks and closes the provider's descriptors; the namespace then disappears with the
/// sandbox's last process.
pub struct SandboxNet {
    pub netns: Arc<OwnedFd>,
    pub shared: Arc<SandboxNetShared>,
}

impl SandboxNet {
    /// What [`PolicyUpdate::apply`] needs, taken so that no lock on the sandbox's network is held
    /// while the rules are written (a duplicate of the namespace descriptor, and the shared state).
    pub fn policy_update(&self) -> std::io::Result<PolicyUpdate> {
        Ok(PolicyUpdate { netns: self.netns.try_clone()?, shared: Arc::clone(&self.shared) })
    }
}

/// Replaces a sandbox's egress rules, from [`SandboxNet::policy_update`].
pub struct PolicyUpdate {
    netns: OwnedFd,
    shared: Arc<SandboxNetShared>,
}

impl PolicyUpdate {
    /// Replaces the sandbox's rules (already validated); new connections and flows use them. The
    /// kernel guard is updated first (in the namespace, on a blocking thread, not on an async
    /// worker): if that fails, nothing changes and the error is returned.
    pub async fn apply(self, policy: EgressPolicy) -> std::io::Result<()> {
        let (allow, deny) = policy.kernel_sets(self.shared.host.opened());
        let netns = self.netns;
        tokio::task::spawn_blocking(move || netns::set_guard(&netns, &allow, &deny))
            .await
            .map_err(|err| std::io::Error::other(format!("the guard update task failed: {err}")))??;
        *crate::sync::write(&self.shared.policy) = policy;
        Ok(())
    }
}

impl Drop for SandboxNet {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

/// What a sandbox's network starts from: a prepared namespace, or one re-adopted after a
/// provider restart.
struct Attached {
    netns: OwnedFd,
    tun: OwnedFd,
    listener: std::net::TcpListener,
    /// The host-address generation in its guard; `None`: unknown (re-adopted), rewrite the rules.
    host_generation: Option<u64>,
}

/// Starts the provider's tasks for a sandbox's namespace.
fn start(sandbox_id: &str, attached: Attached, policy: EgressPolicy, pool: &NetPool) -> std::io::Result<SandboxNet> {
    let listener = tokio::net::TcpListener::from_std(attached.listener)?;
    let netns = Arc::new(attached.netns);
    let host = &pool.host;
    {
        // Registered, and its host set brought up to date, under the lock the address watch
        // holds while it updates every namespace: no change can fall between the two.
        let mut live = crate::sync::lock(&pool.live);
        live.retain(|weak| weak.strong_count() > 0);
        live.push(Arc::downgrade(&netns));
        let snapshot = host.snapshot();
        match attached.host_generation {
            Some(generation) if generation == snapshot.generation => {}
            Some(_) => netns::set_host(&netns, &host.kernel_set(&snapshot))?,
            None => netns::reset_rules(&netns, &host.kernel_set(&snapshot), host.opened())?,
        }
    }
    // Prepared namespaces carry the default sets; a sandbox with rules gets its own.
    let (allow, deny) = policy.kernel_sets(host.opened());
    if (allow.clone(), deny.clone()) != EgressPolicy::default_kernel_sets(host.opened()) {
        netns::set_guard(&netns, &allow, &deny)?;
    }
    let shared = Arc::new(SandboxNetShared {
        sandbox_id: sandbox_id.to_owned(),
        policy: RwLock::new(policy),
        dns_servers: pool.cfg.dns_servers.clone(),
        host: Arc::clone(host),
        budget: Arc::clone(&pool.budget),
        stop: CancellationToken::new(),
    });
    tokio::spawn(tcp_egress::serve(listener, shared.clone()));
    tokio::spawn(udp::serve(attached.tun, shared.clone()));
    Ok(SandboxNet { netns, shared })
}

/// Pushes a change of the host's addresses into every live sandbox namespace.
fn push_host_set(live: &Mutex<Vec<Weak<OwnedFd>>>, host: &HostAddrs, snapshot: &host_addrs::Snapshot) {
    let set = host.kernel_set(snapshot);
    let mut live = crate::sync::lock(live);
    live.retain(|weak| weak.strong_count() > 0);
    for netns in live.iter().filter_map(Weak::upgrade) {
        if let Err(err) = netns::set_host(&netns, &set) {
            tracing::warn!(%err, "cannot update a sandbox's host-address guard; its relays still refuse them");
        }
    }
}

/// Prepared namespaces for the next creates, refilled in the background.
pub struct NetPool {
    cfg: NetConfig,
    budget: Arc<EgressBudget>,
    host: Arc<HostAddrs>,
    /// The namespaces of running sandboxes, for host-address updates.
    live: Arc<Mutex<Vec<Weak<OwnedFd>>>>,
    ready: Mutex<Vec<PreparedNetns>>,
    refilling: Mutex<bool>,
}

impl NetPool {
    /// A pool for `cfg`; reads the host's addresses and starts keeping them current.
    pub fn new(cfg: NetConfig) -> Arc<NetPool> {
        let host = HostAddrs::new(&cfg.open_host_addresses);
        let live: Arc<Mutex<Vec<Weak<OwnedFd>>>> = Arc::default();
        let watched = Arc::downgrade(&live);
        let watch = host_addrs::watch(&host, move |host, snapshot| {
            if let Some(live) = watched.upgrade() {
                push_host_set(&live, host, snapshot);
            }
        });
        if let Err(err) = watch {
            tracing::warn!(%err, "cannot watch the host's addresses; relays still check every connection");
        }
        Arc::new(NetPool {
            cfg,
            budget: Arc::default(),
            host,
            live,
            ready: Mutex::new(Vec::new()),
            refilling: Mutex::new(false),
        })
    }

    /// A prepared namespace: from the pool, or made now if the pool is empty (which also starts a
    /// refill). After a pooled one the caller refills ([`NetPool::refill`]) once its create no
    /// longer needs the CPU.
    pub async fn take(self: &Arc<Self>) -> std::io::Result<PreparedNetns> {
        let pooled = crate::sync::lock(&self.ready).pop();
        match pooled {
            Some(prepared) => Ok(prepared),
            None => {
                self.refill();
                let host = Arc::clone(&self.host);
                tokio::task::spawn_blocking(move || netns::prepare(&host)).await.map_err(std::io::Error::other)?
            }
        }
    }

    /// Fills the pool up to its size on a blocking thread (one refill at a time).
    pub fn refill(self: &Arc<Self>) {
        {
            let mut busy = crate::sync::lock(&self.refilling);
            if *busy || crate::sync::lock(&self.ready).len() >= self.cfg.pool_size {
                return;
            }
            *busy = true;
        }
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            loop {
                if crate::sync::lock(&pool.ready).len() >= pool.cfg.pool_size {
                    break;
                }
                match netns::prepare(&pool.host) {
                    Ok(prepared) => crate::sync::lock(&pool.ready).push(prepared),
                    Err(err) => {
                        tracing::warn!(%err, "cannot prepare a sandbox network namespace");
                        break;
                    }
                }
            }
            *crate::sync::lock(&pool.refilling) = false;
        });
    }

    /// Serves a new sandbox's prepared namespace.
    pub fn activate(
        &self,
        sandbox_id: &str,
        prepared: PreparedNetns,
        policy: EgressPolicy,
    ) -> std::io::Result<SandboxNet> {
        let PreparedNetns { netns, tun, listener, host_generation } = prepared;
        start(sandbox_id, Attached { netns, tun, listener, host_generation: Some(host_generation) }, policy, self)
    }

    /// Egress relays open now across every sandbox (for metrics and tests).
    pub fn egress_in_use(&self) -> usize {
        self.budget.in_use()
    }

    /// Serves the namespace of a sandbox that survived a provider restart.
    pub async fn readopt(&self, sandbox_id: &str, envd_pid: i32, policy: EgressPolicy) -> std::io::Result<SandboxNet> {
        let netns = netns::open_netns_of(envd_pid)?;
        let (netns, (tun, listener)) = tokio::task::spawn_blocking(move || {
            let attached = netns::reattach(&netns)?;
            Ok::<_, std::io::Error>((netns, attached))
        })
        .await
        .map_err(std::io::Error::other)??;
        start(sandbox_id, Attached { netns, tun, listener, host_generation: None }, policy, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_egress_budget_is_an_eighth_of_the_descriptor_limit_and_is_returned() {
        assert_eq!(EgressBudget::cap_for(1024), 128);
        assert_eq!(EgressBudget::cap_for(20), 16, "a floor for tiny limits");
        let budget = Arc::new(EgressBudget::default());
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        let cap = EgressBudget::cap_for(soft);
        let permits: Vec<EgressPermit> = (0..cap).map_while(|_| budget.try_acquire()).collect();
        assert_eq!(permits.len(), cap);
        assert!(budget.try_acquire().is_none(), "no permit past the cap");
        drop(permits);
        assert_eq!(budget.in_use(), 0);
        assert!(budget.try_acquire().is_some(), "permits come back on drop");
    }
}
