//! The nf_tables rules of a sandbox namespace (see [`netns`](super::netns)
//! for what they do), written over netlink ([`netlink`](super::netlink)): the
//! few expressions they need, the table, and the updates of its `host` and
//! `rules` chains, each one nf_tables transaction (`BATCH_BEGIN`, messages,
//! `BATCH_END`), applied whole or not at all, in the calling thread's
//! namespace. The constants are those of `linux/netfilter/nf_tables.h` and
//! `linux/netfilter/nfnetlink.h` (kernel ABI, stable).

use std::io;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::netlink::{Msgs, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST, SockProtocol, exchange, open};

// nfnetlink / nf_tables
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFPROTO_IPV4: u8 = 2;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFTA_REJECT_TYPE: u16 = 1;
const NFTA_REJECT_ICMP_CODE: u16 = 2;
const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_L4PROTO: u32 = 16;
const NFT_CT_STATE: u32 = 0;
const NFT_REJECT_ICMP_UNREACH: u32 = 0;
const NFT_REJECT_TCP_RST: u32 = 1;
const ICMP_PORT_UNREACH: u8 = 3;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_ACCEPT: u32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_RETURN: i32 = -5;
/// `ct state established,related`: the bits of `IP_CT_ESTABLISHED` and `IP_CT_RELATED`.
const CT_ESTABLISHED_RELATED: u32 = 0x2 | 0x4;

/// A data attribute (`nft_data_attributes`): a value.
fn data(m: &mut Msgs, kind: u16, value: &[u8]) {
    m.nest(kind);
    m.attr(NFTA_DATA_VALUE, value);
    m.end();
}

/// One nf_tables rule: its expressions, in order.
struct Rule(Vec<Expr>);

enum Expr {
    /// Loads `len` bytes at `offset` of the network (1) or transport (2) header into register 1.
    Payload {
        base: u32,
        offset: u32,
        len: u32,
    },
    /// Register 1 = (register 1 & mask) ^ 0.
    Mask(Vec<u8>),
    Cmp {
        eq: bool,
        value: Vec<u8>,
    },
    Meta(u32),
    CtState,
    Verdict {
        code: i32,
        chain: Option<&'static str>,
    },
    Reject {
        tcp: bool,
    },
    /// Redirects to `port` of the local host.
    Redirect(u16),
}

impl Expr {
    fn put(&self, m: &mut Msgs) {
        let name = match self {
            Expr::Payload { .. } => "payload",
            Expr::Mask(_) => "bitwise",
            Expr::Cmp { .. } => "cmp",
            Expr::Meta(_) => "meta",
            Expr::CtState => "ct",
            Expr::Verdict { .. } | Expr::Redirect(_) => "immediate",
            Expr::Reject { .. } => "reject",
        };
        m.nest(NFTA_LIST_ELEM);
        m.string(NFTA_EXPR_NAME, name);
        m.nest(NFTA_EXPR_DATA);
        match self {
            Expr::Payload { base, offset, len } => {
                m.be32(NFTA_PAYLOAD_DREG, NFT_REG_1);
                m.be32(NFTA_PAYLOAD_BASE, *base);
                m.be32(NFTA_PAYLOAD_OFFSET, *offset);
                m.be32(NFTA_PAYLOAD_LEN, *len);
            }
            Expr::Mask(mask) => {
                m.be32(NFTA_BITWISE_SREG, NFT_REG_1);
                m.be32(NFTA_BITWISE_DREG, NFT_REG_1);
                m.be32(NFTA_BITWISE_LEN, mask.len() as u32);
                data(m, NFTA_BITWISE_MASK, mask);
                data(m, NFTA_BITWISE_XOR, &vec![0; mask.len()]);
            }
            Expr::Cmp { eq, value } => {
                m.be32(NFTA_CMP_SREG, NFT_REG_1);
                m.be32(NFTA_CMP_OP, if *eq { NFT_CMP_EQ } else { NFT_CMP_NEQ });
                data(m, NFTA_CMP_DATA, value);
            }
            Expr::Meta(key) => {
                m.be32(NFTA_META_KEY, *key);
                m.be32(NFTA_META_DREG, NFT_REG_1);
            }
            Expr::CtState => {
                m.be32(NFTA_CT_KEY, NFT_CT_STATE);
                m.be32(NFTA_CT_DREG, NFT_REG_1);
            }
            Expr::Verdict { code, chain } => {
                m.be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
                m.nest(NFTA_IMMEDIATE_DATA);
                m.nest(NFTA_DATA_VERDICT);
                m.be32(NFTA_VERDICT_CODE, *code as u32);
                if let Some(chain) = chain {
                    m.string(NFTA_VERDICT_CHAIN, chain);
                }
                m.end();
                m.end();
            }
            Expr::Reject { tcp } => {
                if *tcp {
                    m.be32(NFTA_REJECT_TYPE, NFT_REJECT_TCP_RST);
                } else {
                    m.be32(NFTA_REJECT_TYPE, NFT_REJECT_ICMP_UNREACH);
                    m.attr(NFTA_REJECT_ICMP_CODE, &[ICMP_PORT_UNREACH]);
                }
            }
            Expr::Redirect(port) => {
                m.be32(NFTA_IMMEDIATE_DREG, NFT_REG_1);
                data(m, NFTA_IMMEDIATE_DATA, &port.to_be_bytes());
            }
        }
        m.end();
        m.end();
        if let Expr::Redirect(_) = self {
            m.nest(NFTA_LIST_ELEM);
            m.string(NFTA_EXPR_NAME, "redir");
            m.nest(NFTA_EXPR_DATA);
            m.be32(NFTA_REDIR_REG_PROTO_MIN, NFT_REG_1);
            m.end();
            m.end();
        }
    }
}

/// `ip daddr NET` (nothing for `/0`, which matches every address).
fn daddr_in(net: Ipv4Net) -> Vec<Expr> {
    if net.prefix_len() == 0 {
        return Vec::new();
    }
    let mut exprs = vec![Expr::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset: 16, len: 4 }];
    if net.prefix_len() < 32 {
        exprs.push(Expr::Mask(net.netmask().octets().to_vec()));
    }
    exprs.push(Expr::Cmp { eq: true, value: net.network().octets().to_vec() });
    exprs
}

fn l4proto(proto: u8) -> [Expr; 2] {
    [Expr::Meta(NFT_META_L4PROTO), Expr::Cmp { eq: true, value: vec![proto] }]
}

fn verdict(code: i32) -> Expr {
    Expr::Verdict { code, chain: None }
}

/// The two rules refusing `net`: a TCP reset for TCP (so `connect()` fails with "connection
/// refused", as at a firewall), ICMP port unreachable for the rest.
fn refuse(net: Ipv4Net) -> [Rule; 2] {
    let mut tcp = daddr_in(net);
    tcp.extend(l4proto(libc::IPPROTO_TCP as u8));
    tcp.push(Expr::Reject { tcp: true });
    let mut other = daddr_in(net);
    other.push(Expr::Reject { tcp: false });
    [Rule(tcp), Rule(other)]
}

/// The table of every sandbox namespace.
pub const TABLE: &str = "sandbox_mcp";
/// Its regular chains: the host's addresses, and the sandbox's own rules.
const HOST_CHAIN: &str = "host";
const RULES_CHAIN: &str = "rules";

/// The rules of the `host` chain: refuse each of the host's addresses.
fn host_rules(host: &[Ipv4Net]) -> Vec<Rule> {
    host.iter().flat_map(|net| refuse(*net)).collect()
}

/// The rules of the `rules` chain: `allow` returns (to the end of the guard: accepted), then
/// `deny` is refused.
fn policy_rules(allow: &[Ipv4Net], deny: &[Ipv4Net]) -> Vec<Rule> {
    let mut rules: Vec<Rule> = allow
        .iter()
        .map(|net| {
            let mut exprs = daddr_in(*net);
            exprs.push(verdict(NFT_RETURN));
            Rule(exprs)
        })
        .collect();
    rules.extend(deny.iter().flat_map(|net| refuse(*net)));
    rules
}

fn nft_header() -> [u8; 4] {
    [NFPROTO_IPV4, 0, 0, 0]
}

fn nft_kind(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

fn add_rules(m: &mut Msgs, chain: &str, rules: Vec<Rule>) {
    for Rule(exprs) in rules {
        m.begin(nft_kind(NFT_MSG_NEWRULE), NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND, &nft_header());
        m.string(NFTA_RULE_TABLE, TABLE);
        m.string(NFTA_RULE_CHAIN, chain);
        m.nest(NFTA_RULE_EXPRESSIONS);
        for expr in &exprs {
            expr.put(m);
        }
        m.end();
        m.end();
    }
}

fn flush_chain(m: &mut Msgs, chain: &str) {
    m.begin(nft_kind(NFT_MSG_DELRULE), NLM_F_ACK, &nft_header());
    m.string(NFTA_RULE_TABLE, TABLE);
    m.string(NFTA_RULE_CHAIN, chain);
    m.end();
}

fn table_msg(m: &mut Msgs, kind: u16, flags: u16) {
    m.begin(nft_kind(kind), NLM_F_ACK | flags, &nft_header());
    m.string(NFTA_TABLE_NAME, TABLE);
    m.end();
}

/// A chain; with `hook`, a base chain on the output hook (`type`, priority), policy accept.
fn chain_msg(m: &mut Msgs, name: &str, hook: Option<(&str, i32)>) {
    m.begin(nft_kind(NFT_MSG_NEWCHAIN), NLM_F_ACK | NLM_F_CREATE, &nft_header());
    m.string(NFTA_CHAIN_TABLE, TABLE);
    m.string(NFTA_CHAIN_NAME, name);
    if let Some((kind, priority)) = hook {
        m.nest(NFTA_CHAIN_HOOK);
        m.be32(NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_OUT);
        m.be32(NFTA_HOOK_PRIORITY, priority as u32);
        m.end();
        m.be32(NFTA_CHAIN_POLICY, NF_ACCEPT);
        m.string(NFTA_CHAIN_TYPE, kind);
    }
    m.end();
}

/// What the guard lets through before its checks, and where the redirect sends TCP.
pub struct Fixed {
    /// The sandbox's DNS server (UDP port 53 to it is never refused).
    pub dns: Ipv4Addr,
    /// Port of the egress listener on the namespace's loopback.
    pub egress_port: u16,
}

/// Replaces the namespace's whole table in one transaction (see
/// [`netns`](super::netns) for what the chains do).
pub fn replace_table(fixed: &Fixed, host: &[Ipv4Net], allow: &[Ipv4Net], deny: &[Ipv4Net]) -> io::Result<()> {
    nft_transaction(table_msgs(fixed, host, allow, deny))
}

/// The messages of [`replace_table`].
fn table_msgs(fixed: &Fixed, host: &[Ipv4Net], allow: &[Ipv4Net], deny: &[Ipv4Net]) -> Msgs {
    let mut m = Msgs::default();
    // Created first so that deleting it cannot fail: the whole table is replaced atomically.
    table_msg(&mut m, NFT_MSG_NEWTABLE, NLM_F_CREATE);
    table_msg(&mut m, NFT_MSG_DELTABLE, 0);
    table_msg(&mut m, NFT_MSG_NEWTABLE, NLM_F_CREATE);
    chain_msg(&mut m, HOST_CHAIN, None);
    chain_msg(&mut m, RULES_CHAIN, None);
    chain_msg(&mut m, "guard", Some(("filter", -150)));
    chain_msg(&mut m, "egress", Some(("nat", -100)));
    add_rules(&mut m, HOST_CHAIN, host_rules(host));
    add_rules(&mut m, RULES_CHAIN, policy_rules(allow, deny));
    let mut lo = b"lo".to_vec();
    lo.resize(libc::IFNAMSIZ, 0);
    let not_lo = || vec![Expr::Meta(NFT_META_OIFNAME), Expr::Cmp { eq: true, value: lo.clone() }, verdict(NFT_RETURN)];
    let mut dns = daddr_in(Ipv4Net::from(fixed.dns));
    dns.extend(l4proto(libc::IPPROTO_UDP as u8));
    dns.extend([
        Expr::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2, len: 2 },
        Expr::Cmp { eq: true, value: 53u16.to_be_bytes().to_vec() },
        verdict(NFT_RETURN),
    ]);
    let guard = vec![
        Rule(not_lo()),
        // Packets of connections already judged (the rules apply to new connections and flows).
        Rule(vec![
            Expr::CtState,
            Expr::Mask(CT_ESTABLISHED_RELATED.to_ne_bytes().to_vec()),
            Expr::Cmp { eq: false, value: 0u32.to_ne_bytes().to_vec() },
            verdict(NFT_RETURN),
        ]),
        Rule(dns),
        Rule(vec![Expr::Verdict { code: NFT_JUMP, chain: Some(HOST_CHAIN) }]),
        Rule(vec![Expr::Verdict { code: NFT_JUMP, chain: Some(RULES_CHAIN) }]),
    ];
    add_rules(&mut m, "guard", guard);
    let mut redirect: Vec<Expr> = l4proto(libc::IPPROTO_TCP as u8).into();
    redirect.push(Expr::Redirect(fixed.egress_port));
    add_rules(&mut m, "egress", vec![Rule(not_lo()), Rule(redirect)]);
    m
}

/// Replaces the rules of the `host` chain (the host's addresses) in one transaction.
pub fn replace_host(host: &[Ipv4Net]) -> io::Result<()> {
    let mut m = Msgs::default();
    flush_chain(&mut m, HOST_CHAIN);
    add_rules(&mut m, HOST_CHAIN, host_rules(host));
    nft_transaction(m)
}

/// Replaces the rules of the `rules` chain (the sandbox's allow and deny) in one transaction.
pub fn replace_policy(allow: &[Ipv4Net], deny: &[Ipv4Net]) -> io::Result<()> {
    let mut m = Msgs::default();
    flush_chain(&mut m, RULES_CHAIN);
    add_rules(&mut m, RULES_CHAIN, policy_rules(allow, deny));
    nft_transaction(m)
}

/// Sends an nf_tables batch (`BATCH_BEGIN`, the messages, `BATCH_END`): one transaction. A
/// batch refused with `EAGAIN` (the kernel was loading an expression's module) is sent again.
fn nft_transaction(m: Msgs) -> io::Result<()> {
    let expected = m.count;
    let batch = |kind: u16, seq: u32| {
        let mut b = Vec::with_capacity(20);
        b.extend_from_slice(&20u32.to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
        b.extend_from_slice(&NFNL_SUBSYS_NFTABLES.to_be_bytes());
        b
    };
    let mut payload = batch(NFNL_MSG_BATCH_BEGIN, 0);
    payload.extend_from_slice(&m.buf);
    payload.extend(batch(NFNL_MSG_BATCH_END, expected + 1));
    let mut attempts = 0;
    loop {
        let fd = open(SockProtocol::NetlinkNetFilter)?;
        match exchange(&fd, &payload, expected) {
            Err(err) if err.raw_os_error() == Some(libc::EAGAIN) && attempts < 3 => attempts += 1,
            Err(err) => return Err(io::Error::new(err.kind(), format!("nf_tables rejected the sandbox rules: {err}"))),
            Ok(()) => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::netlink::NLA_F_NESTED;
    use super::*;

    /// Checks that the attributes in `buf` tile it exactly, nested ones recursively (`depth` of
    /// nesting left to check); returns how many attributes were seen.
    fn walk(buf: &[u8], depth: usize) -> usize {
        let (mut at, mut seen) = (0, 0);
        while at < buf.len() {
            let len = usize::from(u16::from_ne_bytes([buf[at], buf[at + 1]]));
            let kind = u16::from_ne_bytes([buf[at + 2], buf[at + 3]]);
            assert!(len >= 4 && at + len <= buf.len(), "attribute at {at}: length {len} of {}", buf.len());
            if kind & NLA_F_NESTED != 0 && depth > 0 {
                seen += walk(&buf[at + 4..at + len], depth - 1);
            }
            seen += 1;
            at += len.next_multiple_of(4);
        }
        assert_eq!(at, buf.len(), "attributes end where their parent does");
        seen
    }

    #[test]
    fn every_message_and_attribute_has_its_exact_length() {
        let net = |s: &str| s.parse::<Ipv4Net>().unwrap();
        let fixed = Fixed { dns: Ipv4Addr::new(169, 254, 0, 22), egress_port: 1 };
        let m =
            table_msgs(&fixed, &[net("192.0.2.2/32")], &[net("10.1.0.0/16")], &[net("0.0.0.0/0"), net("10.0.0.0/8")]);
        // 3 table, 4 chain, 2 host, 1 allow + 4 deny, 5 guard and 2 egress messages.
        assert_eq!(m.count, 21);
        let (mut at, mut messages) = (0, 0);
        while at < m.buf.len() {
            let len = u32::from_ne_bytes(m.buf[at..at + 4].try_into().unwrap()) as usize;
            let seq = u32::from_ne_bytes(m.buf[at + 8..at + 12].try_into().unwrap());
            messages += 1;
            assert_eq!(seq, messages, "messages are numbered in order");
            assert!(walk(&m.buf[at + 20..at + len], 8) > 0);
            at += len;
        }
        assert_eq!((at, messages), (m.buf.len(), m.count));
        // `/0` matches without loading the address; a /16 is masked; a /32 is compared whole.
        assert!(daddr_in(net("0.0.0.0/0")).is_empty());
        assert!(matches!(daddr_in(net("10.1.0.0/16"))[1], Expr::Mask(ref mask) if mask == &[255, 255, 0, 0]));
        assert_eq!(daddr_in(net("192.0.2.2/32")).len(), 2);
    }
}
