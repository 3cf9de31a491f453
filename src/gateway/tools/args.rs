//! The tools' limits (argument sizes and ranges, how much of an answer is
//! kept) and the validators shared by the tool argument types. Every check
//! runs before any provider call and answers with a sentence an agent can act
//! on.

use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Longest `command` of `run_command`, bytes.
pub const MAX_COMMAND_BYTES: usize = 65_536;
/// Longest path or cwd, bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Most environment variables per call, and their total size.
pub const MAX_ENV_VARS: usize = 128;
pub const MAX_ENV_BYTES: usize = 65_536;
/// Most user metadata entries, and their sizes.
pub const MAX_METADATA_ENTRIES: usize = 32;
pub const MAX_METADATA_KEY_BYTES: usize = 64;
pub const MAX_METADATA_VALUE_BYTES: usize = 512;
/// Longest template name.
pub const MAX_TEMPLATE_BYTES: usize = 128;

/// Default and longest foreground timeout (`run_command`), seconds.
pub const RUN_DEFAULT_TIMEOUT_SECS: u64 = 60;
pub const RUN_MAX_TIMEOUT_SECS: u64 = 600;
/// Output kept per stream (`run_command`).
pub const RUN_OUTPUT_CAP_BYTES: usize = 64 * 1024;

/// Largest file `read_file` returns / `write_file` accepts, bytes (decoded).
pub const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// Deepest `list_files` recursion, and most entries returned.
pub const MAX_LIST_DEPTH: u32 = 10;
pub const MAX_LIST_ENTRIES: usize = 5000;
/// Bytes of file content `read_file` returns when no `length` is given: base64 of it stays under
/// 512 KiB, so the JSON-RPC message fits the 1 MiB limit of common clients (the official Python SDK).
pub const READ_DEFAULT_BYTES: u64 = 256 * 1024;
/// Largest ListDir answer read from envd for `list_files` (about 5000 entries with long names
/// need under 2 MiB); reading stops past it, so a huge tree cannot grow the gateway's memory.
pub const MAX_LIST_RESPONSE_BYTES: u64 = 4 * 1024 * 1024;

/// A refused argument: the sentence says which one and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidArgument(pub String);

/// Which sandbox user a command or file operation runs as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunAs {
    /// The unprivileged sandbox user `user` (home /home/user). The default.
    #[default]
    User,
    /// root inside the sandbox.
    Root,
}

impl RunAs {
    pub fn name(self) -> &'static str {
        match self {
            RunAs::User => "user",
            RunAs::Root => "root",
        }
    }
}

/// At most `max` characters of `text` (for quoting bad input back).
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// Sandbox ids: 1-128 of `[A-Za-z0-9_-]`.
pub fn validate_sandbox_id(id: &str) -> Result<(), InvalidArgument> {
    if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(InvalidArgument(format!(
            "invalid sandbox_id {:?}: expected the id returned by create_sandbox or list_sandboxes",
            clip(id, 80)
        )));
    }
    Ok(())
}

/// A path or cwd: non-empty, bounded, no NUL.
pub fn validate_path(what: &str, path: &str) -> Result<(), InvalidArgument> {
    if path.is_empty() {
        return Err(InvalidArgument(format!("{what} must not be empty")));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(InvalidArgument(format!("{what} is {} bytes long; the limit is {MAX_PATH_BYTES}", path.len())));
    }
    if path.contains('\0') {
        return Err(InvalidArgument(format!("{what} must not contain NUL characters")));
    }
    Ok(())
}

/// Environment variables: valid names, bounded count and size.
pub fn validate_envs(envs: &HashMap<String, String>) -> Result<(), InvalidArgument> {
    if envs.len() > MAX_ENV_VARS {
        return Err(InvalidArgument(format!("envs has {} variables; the limit is {MAX_ENV_VARS}", envs.len())));
    }
    let mut total = 0;
    for (name, value) in envs {
        let valid_name = !name.is_empty()
            && !name.as_bytes()[0].is_ascii_digit()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid_name {
            return Err(InvalidArgument(format!(
                "envs: {:?} is not a valid variable name (letters, digits and _, not starting with a digit)",
                clip(name, 64)
            )));
        }
        if value.contains('\0') {
            return Err(InvalidArgument(format!("envs: the value of {name} contains a NUL character")));
        }
        total += name.len() + value.len();
    }
    if total > MAX_ENV_BYTES {
        return Err(InvalidArgument(format!("envs total {total} bytes; the limit is {MAX_ENV_BYTES}")));
    }
    Ok(())
}

/// User metadata: bounded, and not using the gateway's reserved `sandbox_mcp_` keys.
pub fn validate_metadata(metadata: &HashMap<String, String>, reserved_prefix: &str) -> Result<(), InvalidArgument> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(InvalidArgument(format!(
            "metadata has {} entries; the limit is {MAX_METADATA_ENTRIES}",
            metadata.len()
        )));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES {
            return Err(InvalidArgument(format!(
                "metadata keys must be 1-{MAX_METADATA_KEY_BYTES} bytes; got {:?}",
                clip(key, 80)
            )));
        }
        if key.starts_with(reserved_prefix) {
            return Err(InvalidArgument(format!(
                "metadata key {key:?} is reserved (keys starting with {reserved_prefix:?} are set by the gateway)"
            )));
        }
        if value.len() > MAX_METADATA_VALUE_BYTES {
            return Err(InvalidArgument(format!(
                "metadata value of {key:?} is {} bytes; the limit is {MAX_METADATA_VALUE_BYTES}",
                value.len()
            )));
        }
    }
    Ok(())
}

/// Template names: 1-128 of `[A-Za-z0-9_.:/-]`.
pub fn validate_template(template: &str) -> Result<(), InvalidArgument> {
    let ok = !template.is_empty()
        && template.len() <= MAX_TEMPLATE_BYTES
        && template.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(InvalidArgument(format!("invalid template {:?}: use a template name such as \"base\"", clip(template, 80))))
    }
}

/// Destinations no sandbox may be allowed to reach through the gateway: loopback, link-local
/// (cloud metadata) and `0.0.0.0/8` (which Linux reaches as the local host), IPv4 and IPv6.
const NEVER_ALLOWED: [(std::net::IpAddr, u8); 5] = [
    (std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 0)), 8),
    (std::net::IpAddr::V4(std::net::Ipv4Addr::new(169, 254, 0, 0)), 16),
    (std::net::IpAddr::V4(std::net::Ipv4Addr::new(0, 0, 0, 0)), 8),
    (std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), 128),
    (std::net::IpAddr::V6(std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10),
];

/// One `allow_out` or `deny_out` entry (`name`): a CIDR block or an IP address; an `allow_out`
/// entry may not cover a [`NEVER_ALLOWED`] range in any spelling: it is judged after the
/// provider's own normalisation ([`normalise_net`](crate::local::net::policy::normalise_net)),
/// so `::ffff:127.0.0.1`, `::127.0.0.1` and `64:ff9b::a9fe:a9fe` are the IPv4 addresses they
/// carry.
pub fn validate_network_entry(name: &str, entry: &str) -> Result<(), InvalidArgument> {
    use crate::local::net::policy::{normalise_net, parse_net};
    let Some(net) = parse_net(entry) else {
        return Err(InvalidArgument(format!(
            "network.{name} entry {:?} is not a CIDR block (\"10.1.0.0/16\") or an IP address",
            clip(entry, 80)
        )));
    };
    let overlaps = |a: &ipnet::IpNet, b: &ipnet::IpNet| a.contains(&b.network()) || b.contains(&a.network());
    let forbidden = NEVER_ALLOWED.iter().filter_map(|(addr, len)| ipnet::IpNet::new(*addr, *len).ok());
    let covers = forbidden.into_iter().any(|f| normalise_net(net).iter().any(|n| overlaps(&f, n)));
    if name == "allow_out" && covers {
        return Err(InvalidArgument(format!(
            "network.allow_out entry {:?} covers loopback or link-local addresses, which sandboxes may never \
             reach through this server; name the private addresses you need instead",
            clip(entry, 80)
        )));
    }
    Ok(())
}

/// A number within `min..=max`, naming the argument when it is not.
pub fn validate_range(what: &str, value: u64, min: u64, max: u64) -> Result<(), InvalidArgument> {
    if value < min || value > max {
        return Err(InvalidArgument(format!("{what} must be between {min} and {max}; got {value}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validators_explain_what_is_wrong() {
        assert!(validate_path("path", "").unwrap_err().0.contains("empty"));
        assert!(validate_path("path", &"a".repeat(MAX_PATH_BYTES + 1)).unwrap_err().0.contains("limit"));
        assert!(validate_path("path", "/home/user/a.txt").is_ok());
        let bad: HashMap<String, String> = [("1X".to_string(), "v".to_string())].into();
        assert!(validate_envs(&bad).unwrap_err().0.contains("valid variable name"));
        let good: HashMap<String, String> = [("MY_VAR".to_string(), "v".to_string())].into();
        assert!(validate_envs(&good).is_ok());
        let reserved: HashMap<String, String> = [("sandbox_mcp_tenant".to_string(), "x".to_string())].into();
        assert!(validate_metadata(&reserved, "sandbox_mcp_").unwrap_err().0.contains("reserved"));
        assert!(validate_template("base").is_ok());
        assert!(validate_template("a b").is_err());
        assert!(validate_range("timeout", 0, 1, 600).unwrap_err().0.contains("between 1 and 600"));
        assert_eq!(clip("héllo", 2), "hé...");
    }

    #[test]
    fn allow_out_refuses_loopback_and_link_local_in_every_spelling() {
        for entry in [
            "127.0.0.1",
            "169.254.169.254/32",
            "0.0.0.0/0",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:7f00:1/128",
            "::127.0.0.1",
            "64:ff9b::a9fe:4d01",
            "64:ff9b::169.254.169.254",
            "::ffff:0:0/96",
            "64:ff9b::/96",
            "::/0",
        ] {
            let err = validate_network_entry("allow_out", entry).unwrap_err();
            assert!(err.0.contains("loopback or link-local"), "{entry}: {err}");
            assert!(validate_network_entry("deny_out", entry).is_ok(), "deny_out may name {entry}");
        }
        for entry in ["10.1.0.0/16", "198.18.0.1", "::ffff:10.1.2.3", "64:ff9b::808:808", "2001:db8::/32"] {
            assert!(validate_network_entry("allow_out", entry).is_ok(), "{entry}");
        }
        assert!(validate_network_entry("deny_out", "example.com").unwrap_err().0.contains("not a CIDR"));
    }
}
