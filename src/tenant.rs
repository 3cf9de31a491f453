//! What a tenant name may be: shared by the configuration (static tokens) and OAuth (claims).

/// Tenant names: 1-64 of `[A-Za-z0-9_.-]` (they go into provider metadata and logs).
pub fn is_valid_tenant(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}
