//! The egress rule check: one function, [`EgressPolicy::decide`], judges every
//! outbound TCP connection and UDP flow a sandbox opens, with E2B's network
//! semantics (`allowOut` wins over `denyOut`, `allow_internet_access: false`
//! denies everything not allowed) on top of ranges that are never reachable
//! unless an `allowOut` entry names them: the host's own addresses (loopback and
//! every interface address, judged at connect time), private, shared,
//! link-local, multicast and reserved ranges, IPv4 and IPv6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// IPv4 ranges no sandbox reaches unless `allowOut` names them.
const BLOCKED_V4: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
];

/// IPv6 ranges no sandbox reaches unless `allowOut` names them (IPv4-mapped and NAT64 addresses
/// are judged by the IPv4 address they carry).
const BLOCKED_V6: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::UNSPECIFIED, 128),
    (Ipv6Addr::LOCALHOST, 128),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
    (Ipv6Addr::new(0x0100, 0, 0, 0, 0, 0, 0, 0), 64),
];

/// The `network` part of a create request or of `PUT /sandboxes/{id}/network`, as stored in the
/// sandbox record (E2B field names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// `false`: sandbox URLs need the traffic access token.
    #[serde(default = "yes")]
    pub allow_public_traffic: bool,
}

fn yes() -> bool {
    true
}

/// Why a configuration was refused (becomes a 400 with this sentence).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    #[error(
        "allowOut entry '{0}' is a domain name: the local provider matches egress by IP address only; use a CIDR \
         block or an IP address"
    )]
    DomainNotSupported(String),
    #[error("denyOut entry '{0}' is not a CIDR block or an IP address (domain names are not supported for deny rules)")]
    BadDeny(String),
    #[error("allowOut entry '{0}' is not a CIDR block, an IP address or a domain name")]
    BadAllow(String),
    #[error("too many network rules ({0}); at most {MAX_RULES} allowOut and {MAX_RULES} denyOut entries")]
    TooMany(usize),
}

/// Most entries per list.
pub const MAX_RULES: usize = 512;

/// What [`EgressPolicy::decide`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny(DenyReason),
}

/// Why a destination was denied (logged at debug level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    HostAddress,
    DeniedByRule,
    InternetDisabled,
    ReservedRange,
}

/// A sandbox's parsed egress rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow_out: Vec<IpNet>,
    deny_out: Vec<IpNet>,
    internet: bool,
}

/// Parses one rule entry: a CIDR block or a bare IP address (a host route).
pub fn parse_net(entry: &str) -> Option<IpNet> {
    let entry = entry.trim();
    if let Ok(net) = entry.parse::<IpNet>() {
        return Some(net.trunc());
    }
    entry.parse::<IpAddr>().ok().map(IpNet::from)
}

fn looks_like_domain(entry: &str) -> bool {
    let name = entry.strip_prefix("*.").unwrap_or(entry);
    !name.is_empty()
        && name.len() <= 253
        && name.contains(|c: char| c.is_ascii_alphabetic())
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
        })
}

impl EgressPolicy {
    /// Builds the policy of a sandbox from its stored configuration.
    pub fn new(config: &NetworkConfig, allow_internet_access: bool) -> Result<EgressPolicy, RuleError> {
        let count = config.allow_out.len().max(config.deny_out.len());
        if count > MAX_RULES {
            return Err(RuleError::TooMany(count));
        }
        let mut allow_out = Vec::with_capacity(config.allow_out.len());
        for entry in &config.allow_out {
            match parse_net(entry) {
                Some(net) => allow_out.push(net),
                None if looks_like_domain(entry.trim()) => return Err(RuleError::DomainNotSupported(entry.clone())),
                None => return Err(RuleError::BadAllow(entry.clone())),
            }
        }
        let mut deny_out = Vec::with_capacity(config.deny_out.len());
        for entry in &config.deny_out {
            deny_out.push(parse_net(entry).ok_or_else(|| RuleError::BadDeny(entry.clone()))?);
        }
        Ok(EgressPolicy { allow_out, deny_out, internet: allow_internet_access })
    }

    /// The IPv4 sets of the namespace's kernel guard (`allow`, `deny`, CIDR text): what `decide`
    /// denies by address alone, so that the kernel refuses it at `connect()`. `allowOut` is checked
    /// first (the relay then judges it fully, host addresses included); then `denyOut`, every
    /// address when the internet is off, and the reserved ranges are refused.
    pub fn kernel_sets(&self) -> (Vec<String>, Vec<String>) {
        let v4 = |nets: &[IpNet]| -> Vec<String> {
            nets.iter().filter(|n| matches!(n, IpNet::V4(_))).map(|n| n.to_string()).collect()
        };
        let allow = v4(&self.allow_out);
        let mut deny = v4(&self.deny_out);
        if self.internet {
            deny.extend(BLOCKED_V4.iter().map(|(net, len)| format!("{net}/{len}")));
        } else {
            deny.push("0.0.0.0/0".to_owned());
        }
        (allow, deny)
    }

    /// The kernel sets of a sandbox with no rules (baked into every prepared namespace).
    pub fn default_kernel_sets() -> (Vec<String>, Vec<String>) {
        EgressPolicy { internet: true, ..Default::default() }.kernel_sets()
    }

    /// Whether the sandbox may use the provider's DNS forwarder: not when it may reach nothing.
    pub fn dns_allowed(&self) -> bool {
        self.internet || !self.allow_out.is_empty()
    }

    /// Judges one destination. `is_host_address` says whether an address belongs to the host
    /// itself (asked only when it matters, so the caller can read the host's interfaces lazily).
    ///
    /// Order: a host address is reachable only through an `allowOut` entry naming exactly that
    /// address (a bare IP or a /32, /128), never through a wider block; otherwise `allowOut` wins,
    /// then `denyOut`, then `allow_internet_access: false`, then the reserved ranges.
    pub fn decide(&self, dst: IpAddr, is_host_address: impl Fn(IpAddr) -> bool) -> Verdict {
        let dst = canonical(dst);
        let embedded = embedded_v4(dst);
        let judged = embedded.map(IpAddr::V4).unwrap_or(dst);
        if dst.is_loopback()
            || judged.is_loopback()
            || is_host_address(dst)
            || (judged != dst && is_host_address(judged))
        {
            let named = self.allow_out.iter().any(|net| net.prefix_len() == net.max_prefix_len() && net.addr() == dst);
            return if named { Verdict::Allow } else { Verdict::Deny(DenyReason::HostAddress) };
        }
        if self.allow_out.iter().any(|net| net.contains(&dst)) {
            return Verdict::Allow;
        }
        if self.deny_out.iter().any(|net| net.contains(&dst) || net.contains(&judged)) {
            return Verdict::Deny(DenyReason::DeniedByRule);
        }
        if !self.internet {
            return Verdict::Deny(DenyReason::InternetDisabled);
        }
        if is_reserved(dst) || is_reserved(judged) {
            return Verdict::Deny(DenyReason::ReservedRange);
        }
        Verdict::Allow
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are IPv4 addresses.
pub fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        v4 => v4,
    }
}

/// The IPv4 address carried by a NAT64 (`64:ff9b::/96`) address, which a NAT64 gateway would reach.
fn embedded_v4(addr: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = addr else { return None };
    let s = v6.segments();
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6].iter().all(|&x| x == 0) {
        let o = v6.octets();
        return Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    None
}

/// True for the ranges listed in [`BLOCKED_V4`] and [`BLOCKED_V6`].
pub fn is_reserved(addr: IpAddr) -> bool {
    match canonical(addr) {
        IpAddr::V4(v4) => BLOCKED_V4.iter().any(|&(net, len)| prefix_match(u32::from(v4), u32::from(net), len, 32)),
        IpAddr::V6(v6) => BLOCKED_V6.iter().any(|&(net, len)| prefix_match(u128::from(v6), u128::from(net), len, 128)),
    }
}

fn prefix_match<T>(addr: T, net: T, len: u8, bits: u8) -> bool
where
    T: Copy + std::ops::Shr<u32, Output = T> + PartialEq,
{
    if len == 0 {
        return true;
    }
    let shift = u32::from(bits - len);
    (addr >> shift) == (net >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn policy(allow: &[&str], deny: &[&str], internet: bool) -> EgressPolicy {
        let cfg = NetworkConfig {
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            allow_public_traffic: true,
        };
        EgressPolicy::new(&cfg, internet).unwrap()
    }

    fn no_host(_: IpAddr) -> bool {
        false
    }

    const RESERVED_SAMPLES: &[&str] = &[
        "0.0.0.0",
        "0.1.2.3",
        "10.0.0.1",
        "10.255.255.255",
        "100.64.0.1",
        "100.127.255.254",
        "127.0.0.1",
        "127.53.0.1",
        "169.254.169.254",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "224.0.0.251",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "::",
        "::1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "febf::1",
        "ff02::1",
        "ff05::2",
        "::ffff:127.0.0.1",
        "::ffff:10.1.2.3",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::7f00:1",
    ];

    const PUBLIC_SAMPLES: &[&str] = &[
        "198.18.0.1",
        "198.19.255.254",
        "1.1.1.1",
        "8.8.8.8",
        "100.63.255.255",
        "100.128.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.167.255.255",
        "192.169.0.0",
        "11.0.0.1",
        "126.255.255.255",
        "128.0.0.1",
        "169.253.255.255",
        "169.255.0.0",
        "223.255.255.255",
        "2001:4860:4860::8888",
        "2606:4700::1111",
        "::ffff:198.18.0.1",
        "64:ff9b::808:808",
    ];

    #[test]
    fn kernel_sets_refuse_what_decide_denies_by_address() {
        let (allow, deny) = EgressPolicy::default_kernel_sets();
        assert!(allow.is_empty());
        assert_eq!(deny.len(), BLOCKED_V4.len());
        assert!(deny.contains(&"10.0.0.0/8".to_owned()) && deny.contains(&"169.254.0.0/16".to_owned()));
        let (allow, deny) = policy(&["10.1.2.3", "2001:db8::1"], &["8.8.8.0/24"], true).kernel_sets();
        assert_eq!(allow, ["10.1.2.3/32"], "IPv4 only: sandboxes have no IPv6 route");
        assert!(deny.contains(&"8.8.8.0/24".to_owned()) && deny.contains(&"10.0.0.0/8".to_owned()));
        let (_, deny) = policy(&[], &[], false).kernel_sets();
        assert_eq!(deny, ["0.0.0.0/0"], "internet off: everything not allowed");
        // Every address the sets refuse, decide refuses too (the guard never blocks an allowed one).
        let p = policy(&["10.1.2.3"], &["8.8.8.0/24"], true);
        for dst in ["10.1.2.4", "8.8.8.8", "169.254.169.254", "192.168.1.1"] {
            assert!(matches!(p.decide(ip(dst), |_| false), Verdict::Deny(_)), "{dst}");
        }
        assert_eq!(p.decide(ip("10.1.2.3"), |_| false), Verdict::Allow);
    }

    #[test]
    fn default_policy_blocks_every_reserved_range_and_allows_public_addresses() {
        let p = policy(&[], &[], true);
        for s in RESERVED_SAMPLES {
            assert!(matches!(p.decide(ip(s), no_host), Verdict::Deny(_)), "{s} must be denied by default");
        }
        for s in PUBLIC_SAMPLES {
            assert_eq!(p.decide(ip(s), no_host), Verdict::Allow, "{s} must be allowed by default");
        }
    }

    #[test]
    fn range_edges_are_exact() {
        for (inside, outside) in [
            ("10.0.0.0", "9.255.255.255"),
            ("100.64.0.0", "100.63.255.255"),
            ("172.16.0.0", "172.15.255.255"),
            ("172.31.255.255", "172.32.0.0"),
            ("192.168.0.0", "192.167.255.255"),
            ("169.254.0.0", "169.253.255.255"),
            ("224.0.0.0", "223.255.255.255"),
            ("fc00::", "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
            ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fe00::"),
            ("fe80::", "fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
        ] {
            assert!(is_reserved(ip(inside)), "{inside}");
            assert!(!is_reserved(ip(outside)), "{outside}");
        }
    }

    #[test]
    fn host_addresses_need_an_allow_entry_naming_exactly_them() {
        let host = |a: IpAddr| a == ip("198.18.7.1") || a == ip("10.0.0.5");
        let p = policy(&[], &[], true);
        assert_eq!(p.decide(ip("198.18.7.1"), host), Verdict::Deny(DenyReason::HostAddress));
        assert_eq!(p.decide(ip("::ffff:198.18.7.1"), host), Verdict::Deny(DenyReason::HostAddress));
        assert_eq!(p.decide(ip("198.18.7.2"), host), Verdict::Allow);
        // A wide block does not open the host's own address inside it.
        let wide = policy(&["10.0.0.0/8", "198.18.0.0/15", "127.0.0.0/8"], &[], true);
        assert_eq!(wide.decide(ip("10.0.0.5"), host), Verdict::Deny(DenyReason::HostAddress));
        assert_eq!(wide.decide(ip("10.0.0.6"), host), Verdict::Allow);
        assert_eq!(wide.decide(ip("127.0.0.1"), no_host), Verdict::Deny(DenyReason::HostAddress));
        // Naming it exactly does.
        let exact = policy(&["10.0.0.5", "127.0.0.1/32"], &[], true);
        assert_eq!(exact.decide(ip("10.0.0.5"), host), Verdict::Allow);
        assert_eq!(exact.decide(ip("127.0.0.1"), no_host), Verdict::Allow);
        assert_eq!(exact.decide(ip("127.0.0.2"), no_host), Verdict::Deny(DenyReason::HostAddress));
    }

    #[test]
    fn allow_wins_over_deny_and_over_disabled_internet() {
        let p = policy(&["198.18.5.0/24", "10.9.8.7"], &["198.18.0.0/15", "0.0.0.0/0"], true);
        assert_eq!(p.decide(ip("198.18.5.9"), no_host), Verdict::Allow);
        assert_eq!(p.decide(ip("10.9.8.7"), no_host), Verdict::Allow);
        assert_eq!(p.decide(ip("198.18.6.1"), no_host), Verdict::Deny(DenyReason::DeniedByRule));
        assert_eq!(p.decide(ip("1.1.1.1"), no_host), Verdict::Deny(DenyReason::DeniedByRule));
        let off = policy(&["198.18.5.1"], &[], false);
        assert_eq!(off.decide(ip("198.18.5.1"), no_host), Verdict::Allow);
        assert_eq!(off.decide(ip("198.18.5.2"), no_host), Verdict::Deny(DenyReason::InternetDisabled));
        assert!(off.dns_allowed());
        assert!(!policy(&[], &[], false).dns_allowed());
    }

    #[test]
    fn allow_entries_open_reserved_ranges() {
        let p = policy(&["10.20.0.0/16", "fd00::/8"], &[], true);
        assert_eq!(p.decide(ip("10.20.3.4"), no_host), Verdict::Allow);
        assert_eq!(p.decide(ip("10.21.3.4"), no_host), Verdict::Deny(DenyReason::ReservedRange));
        assert_eq!(p.decide(ip("fd00::9"), no_host), Verdict::Allow);
    }

    #[test]
    fn deny_of_a_single_address_and_of_mapped_forms() {
        let p = policy(&[], &["198.18.0.9"], true);
        assert_eq!(p.decide(ip("198.18.0.9"), no_host), Verdict::Deny(DenyReason::DeniedByRule));
        assert_eq!(p.decide(ip("::ffff:198.18.0.9"), no_host), Verdict::Deny(DenyReason::DeniedByRule));
        assert_eq!(p.decide(ip("198.18.0.10"), no_host), Verdict::Allow);
    }

    #[test]
    fn entries_are_parsed_or_refused_with_a_sentence() {
        assert_eq!(parse_net("8.8.8.8"), Some("8.8.8.8/32".parse().unwrap()));
        assert_eq!(parse_net(" 10.1.2.3/8 "), Some("10.0.0.0/8".parse().unwrap()));
        assert_eq!(parse_net("::1"), Some("::1/128".parse().unwrap()));
        let cfg = |allow: &[&str], deny: &[&str]| NetworkConfig {
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            allow_public_traffic: true,
        };
        assert_eq!(
            EgressPolicy::new(&cfg(&["*.example.com"], &[]), true),
            Err(RuleError::DomainNotSupported("*.example.com".into()))
        );
        assert_eq!(
            EgressPolicy::new(&cfg(&["10.0.0.0/33"], &[]), true),
            Err(RuleError::BadAllow("10.0.0.0/33".into()))
        );
        assert_eq!(EgressPolicy::new(&cfg(&[], &["example.com"]), true), Err(RuleError::BadDeny("example.com".into())));
        let many: Vec<String> = (0..=MAX_RULES).map(|i| format!("198.18.{}.{}", i / 256, i % 256)).collect();
        let too_many = NetworkConfig { allow_out: many, ..Default::default() };
        assert!(matches!(EgressPolicy::new(&too_many, true), Err(RuleError::TooMany(_))));
    }
}
