//! The egress rule check: one function, [`EgressPolicy::decide`], judges every
//! outbound TCP connection and UDP flow a sandbox opens, with E2B's network
//! semantics (`allowOut` wins over `denyOut`, `allow_internet_access: false`
//! denies everything not allowed) on top of ranges that are never reachable
//! unless an `allowOut` entry names them: private, shared, link-local,
//! multicast and reserved ranges, IPv4 and IPv6. The host's own addresses
//! (loopback and every interface address) are never reachable, whatever
//! `allowOut` says, except those the operator opened (then like a reserved
//! range). It also owns the one normalisation of addresses that every check
//! uses, here and in the gateway ([`normalise`], [`normalise_net`]):
//! IPv4-mapped, IPv4-compatible and NAT64 IPv6 forms are the IPv4 address
//! they carry.

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
                Some(net) => allow_out.extend(normalise_net(net)),
                None if looks_like_domain(entry.trim()) => return Err(RuleError::DomainNotSupported(entry.clone())),
                None => return Err(RuleError::BadAllow(entry.clone())),
            }
        }
        let mut deny_out = Vec::with_capacity(config.deny_out.len());
        for entry in &config.deny_out {
            deny_out.extend(normalise_net(parse_net(entry).ok_or_else(|| RuleError::BadDeny(entry.clone()))?));
        }
        Ok(EgressPolicy { allow_out, deny_out, internet: allow_internet_access })
    }

    /// The IPv4 sets of the namespace's kernel guard (`allow`, `deny`, CIDR text): what `decide`
    /// denies by address alone, so that the kernel refuses it at `connect()`. The host's own
    /// addresses are a set of their own, checked before these (see `netns`). `allowOut` is checked
    /// first (the relay then judges it fully); then `denyOut`, every address when the internet is
    /// off, and the reserved ranges with the host addresses the operator opened are refused.
    pub fn kernel_sets(&self, opened: &[IpAddr]) -> (Vec<String>, Vec<String>) {
        let v4 = |nets: &[IpNet]| -> Vec<String> {
            nets.iter().filter(|n| matches!(n, IpNet::V4(_))).map(|n| n.to_string()).collect()
        };
        let allow = v4(&self.allow_out);
        let mut deny = v4(&self.deny_out);
        if self.internet {
            deny.extend(BLOCKED_V4.iter().map(|(net, len)| format!("{net}/{len}")));
            deny.extend(opened.iter().filter_map(|ip| match normalise(*ip) {
                IpAddr::V4(v4) => Some(format!("{v4}/32")),
                IpAddr::V6(_) => None,
            }));
        } else {
            deny.push("0.0.0.0/0".to_owned());
        }
        (allow, deny)
    }

    /// The kernel sets of a sandbox with no rules (baked into every prepared namespace).
    pub fn default_kernel_sets(opened: &[IpAddr]) -> (Vec<String>, Vec<String>) {
        EgressPolicy { internet: true, ..Default::default() }.kernel_sets(opened)
    }

    /// Whether the sandbox may use the provider's DNS forwarder: not when it may reach nothing.
    pub fn dns_allowed(&self) -> bool {
        self.internet || !self.allow_out.is_empty()
    }

    /// Judges one destination. `host` says whether an address (already normalised) belongs to
    /// the host itself, and whether the operator opened it (asked only when it matters, so the
    /// caller can read the host's interfaces lazily).
    ///
    /// Order, on the normalised address (see [`normalise`]): loopback and the host's own
    /// addresses are denied, whatever `allowOut` says; then `allowOut` wins, then `denyOut`, then
    /// `allow_internet_access: false`, then the reserved ranges and the host addresses the
    /// operator opened (which only an `allowOut` entry reaches).
    pub fn decide(&self, dst: IpAddr, host: impl Fn(IpAddr) -> HostAddress) -> Verdict {
        let dst = normalise(dst);
        if dst.is_loopback() {
            return Verdict::Deny(DenyReason::HostAddress);
        }
        let opened = match host(dst) {
            HostAddress::Closed => return Verdict::Deny(DenyReason::HostAddress),
            HostAddress::Opened => true,
            HostAddress::No => false,
        };
        if self.allow_out.iter().any(|net| net.contains(&dst)) {
            return Verdict::Allow;
        }
        if self.deny_out.iter().any(|net| net.contains(&dst)) {
            return Verdict::Deny(DenyReason::DeniedByRule);
        }
        if !self.internet {
            return Verdict::Deny(DenyReason::InternetDisabled);
        }
        if opened || is_reserved(dst) {
            return Verdict::Deny(DenyReason::ReservedRange);
        }
        Verdict::Allow
    }
}

/// What [`EgressPolicy::decide`] asks about a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostAddress {
    /// Not one of the host's addresses.
    No,
    /// One of the host's addresses: never reachable.
    Closed,
    /// An address the operator opened (`--open-host-address`): reachable only through `allowOut`.
    Opened,
}

/// The IPv6 prefixes (/96) whose addresses carry an IPv4 address in their last 32 bits, and are
/// judged as it: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, deprecated but
/// still routed as IPv4 by dual-stack sockets) and NAT64 (`64:ff9b::a.b.c.d`, RFC 6052), which a
/// NAT64 gateway would carry to `a.b.c.d`.
const CARRIES_V4: [Ipv6Addr; 3] =
    [Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), Ipv6Addr::UNSPECIFIED, Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0)];

/// True for `::` and `::1`, which are IPv6's own unspecified and loopback addresses rather than
/// IPv4-compatible forms.
fn is_v6_special(v6: Ipv6Addr) -> bool {
    u128::from(v6) <= 1
}

/// The one normalisation of destination addresses: an IPv6 address of one of the
/// [`CARRIES_V4`] prefixes is the IPv4 address it carries; every other address is itself.
pub fn normalise(addr: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = addr else { return addr };
    if is_v6_special(v6) {
        return addr;
    }
    let bits = u128::from(v6);
    if CARRIES_V4.iter().any(|prefix| bits >> 32 == u128::from(*prefix) >> 32) {
        return IpAddr::V4(Ipv4Addr::from((bits & 0xffff_ffff) as u32));
    }
    addr
}

/// The same normalisation for a rule entry: the networks that match exactly the normalised
/// addresses of `net`. An IPv4 net is itself; an IPv6 net is kept (for the IPv6 addresses it
/// holds) plus, for each [`CARRIES_V4`] prefix it overlaps, the IPv4 addresses it carries there:
/// a net inside the prefix (`::ffff:10.0.0.0/104`) carries `10.0.0.0/8`; a net containing the
/// whole prefix (`::/0`, `64:ff9b::/96`) carries `0.0.0.0/0`.
pub fn normalise_net(net: IpNet) -> Vec<IpNet> {
    let IpNet::V6(v6) = net else { return vec![net] };
    let mut nets = vec![net];
    for prefix in CARRIES_V4 {
        let Ok(carrier) = ipnet::Ipv6Net::new(prefix, 96) else { continue };
        let carried = if carrier.contains(&v6) {
            // `::/127` and below are IPv6's own `::` and `::1`, not IPv4-compatible forms.
            if prefix == Ipv6Addr::UNSPECIFIED && v6.prefix_len() >= 127 && is_v6_special(v6.network()) {
                continue;
            }
            let addr = Ipv4Addr::from((u128::from(v6.network()) & 0xffff_ffff) as u32);
            ipnet::Ipv4Net::new(addr, v6.prefix_len() - 96).ok()
        } else if v6.contains(&carrier) {
            ipnet::Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 0).ok()
        } else {
            None
        };
        if let Some(carried) = carried.map(IpNet::V4)
            && !nets.contains(&carried)
        {
            nets.push(carried);
        }
    }
    nets
}

/// True for the ranges listed in [`BLOCKED_V4`] and [`BLOCKED_V6`].
pub fn is_reserved(addr: IpAddr) -> bool {
    match normalise(addr) {
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

    fn no_host(_: IpAddr) -> HostAddress {
        HostAddress::No
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
        let (allow, deny) = EgressPolicy::default_kernel_sets(&[]);
        assert!(allow.is_empty());
        assert_eq!(deny.len(), BLOCKED_V4.len());
        assert!(deny.contains(&"10.0.0.0/8".to_owned()) && deny.contains(&"169.254.0.0/16".to_owned()));
        let (allow, deny) = policy(&["10.1.2.3", "2001:db8::1"], &["8.8.8.0/24"], true).kernel_sets(&[]);
        assert_eq!(allow, ["10.1.2.3/32"], "IPv4 only: sandboxes have no IPv6 route");
        assert!(deny.contains(&"8.8.8.0/24".to_owned()) && deny.contains(&"10.0.0.0/8".to_owned()));
        let (_, deny) = policy(&[], &[], false).kernel_sets(&[]);
        assert_eq!(deny, ["0.0.0.0/0"], "internet off: everything not allowed");
        // Every address the sets refuse, decide refuses too (the guard never blocks an allowed one).
        let p = policy(&["10.1.2.3"], &["8.8.8.0/24"], true);
        for dst in ["10.1.2.4", "8.8.8.8", "169.254.169.254", "192.168.1.1"] {
            assert!(matches!(p.decide(ip(dst), no_host), Verdict::Deny(_)), "{dst}");
        }
        assert_eq!(p.decide(ip("10.1.2.3"), no_host), Verdict::Allow);
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
    fn host_addresses_are_closed_whatever_allow_out_says_unless_the_operator_opened_them() {
        let host = |a: IpAddr| match a {
            a if a == ip("198.18.7.1") || a == ip("10.0.0.5") => HostAddress::Closed,
            a if a == ip("198.18.7.3") => HostAddress::Opened,
            _ => HostAddress::No,
        };
        let spellings = |v4: &str| {
            vec![v4.to_owned(), format!("{v4}/32"), format!("::ffff:{v4}"), format!("::{v4}"), format!("64:ff9b::{v4}")]
        };
        for addr in ["198.18.7.1", "10.0.0.5", "127.0.0.1"] {
            let wide = ["0.0.0.0/0", "::/0", "::ffff:0:0/96", "64:ff9b::/96", "10.0.0.0/8", "198.18.0.0/15"];
            let mut allow: Vec<String> = spellings(addr);
            allow.extend(wide.iter().map(|s| s.to_string()));
            let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
            for p in [policy(&[], &[], true), policy(&allow, &[], true), policy(&allow, &[], false)] {
                for dst in spellings(addr).iter().filter_map(|s| s.parse::<IpAddr>().ok()) {
                    assert_eq!(p.decide(dst, host), Verdict::Deny(DenyReason::HostAddress), "{dst} {p:?}");
                }
            }
        }
        assert_eq!(policy(&[], &[], true).decide(ip("198.18.7.2"), host), Verdict::Allow);
        // An opened host address is a reserved range: allowOut (any spelling) reaches it.
        assert_eq!(policy(&[], &[], true).decide(ip("198.18.7.3"), host), Verdict::Deny(DenyReason::ReservedRange));
        for entry in spellings("198.18.7.3") {
            let p = policy(&[&entry], &[], true);
            assert_eq!(p.decide(ip("198.18.7.3"), host), Verdict::Allow, "{entry}");
            assert_eq!(p.decide(ip("::ffff:198.18.7.3"), host), Verdict::Allow, "{entry}");
        }
        let (_, deny) = EgressPolicy::default_kernel_sets(&[ip("198.18.7.3"), ip("::ffff:198.18.7.4")]);
        assert!(deny.contains(&"198.18.7.3/32".to_owned()) && deny.contains(&"198.18.7.4/32".to_owned()));
    }

    #[test]
    fn one_normalisation_for_mapped_compatible_and_nat64_forms() {
        for (form, v4) in [
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("::127.0.0.1", "127.0.0.1"),
            ("64:ff9b::a9fe:4d01", "169.254.77.1"),
            ("64:ff9b::7f00:1", "127.0.0.1"),
            ("::ffff:a9fe:a9fe", "169.254.169.254"),
            ("1.2.3.4", "1.2.3.4"),
        ] {
            assert_eq!(normalise(ip(form)), ip(v4), "{form}");
        }
        for own in ["::", "::1", "2001:db8::1", "::1:0:0:1", "64:ff9b:1::1"] {
            assert_eq!(normalise(ip(own)), ip(own), "{own}");
        }
        let nets = |s: &str| normalise_net(parse_net(s).unwrap());
        let parsed = |list: &[&str]| list.iter().map(|s| parse_net(s).unwrap()).collect::<Vec<_>>();
        assert_eq!(nets("::ffff:10.0.0.0/104"), parsed(&["::ffff:10.0.0.0/104", "10.0.0.0/8"]));
        assert_eq!(nets("64:ff9b::a9fe:4d01"), parsed(&["64:ff9b::a9fe:4d01/128", "169.254.77.1/32"]));
        assert_eq!(nets("::127.0.0.1"), parsed(&["::7f00:1/128", "127.0.0.1/32"]));
        assert_eq!(nets("::1"), parsed(&["::1/128"]));
        assert_eq!(nets("::/0"), parsed(&["::/0", "0.0.0.0/0"]));
        assert_eq!(nets("64:ff9b::/96"), parsed(&["64:ff9b::/96", "0.0.0.0/0"]));
        assert_eq!(nets("10.0.0.0/8"), parsed(&["10.0.0.0/8"]));
        // Rules in any form match the destination in any form.
        let p = policy(&[], &["::ffff:198.18.0.0/111"], true);
        assert_eq!(p.decide(ip("198.19.1.1"), no_host), Verdict::Deny(DenyReason::DeniedByRule));
        assert_eq!(p.decide(ip("64:ff9b::c613:101"), no_host), Verdict::Deny(DenyReason::DeniedByRule));
        let p = policy(&["64:ff9b::10.20.0.0/112"], &[], true);
        assert_eq!(p.decide(ip("10.20.3.4"), no_host), Verdict::Allow);
        assert_eq!(p.kernel_sets(&[]).0, ["10.20.0.0/16"]);
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
