//! Sandbox ids, agent tags and access tokens, each drawn from a CSPRNG, and the check that an id
//! has a sandbox id's shape (so it is safe as a path component).

use rand::RngExt;

/// A new sandbox id: 20 lowercase alphanumerics from a CSPRNG.
pub fn new_sandbox_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..20).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

/// A new agent tag (see [`AGENT_TAG_FILE`]): 32 hex characters, unrelated to the sandbox id.
pub fn new_agent_tag() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new envd access token: 40 hex characters from a CSPRNG.
pub fn new_access_token() -> String {
    let bytes: [u8; 20] = rand::rng().random();
    hex::encode(bytes)
}

/// True if `id` has the shape of a sandbox id (so it is safe as a path component).
pub fn is_valid_sandbox_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_e2b_shape() {
        let a = new_sandbox_id();
        assert_eq!(a.len(), 20);
        assert!(is_valid_sandbox_id(&a));
        assert_ne!(a, new_sandbox_id());
        assert!(!is_valid_sandbox_id("../etc"));
        assert!(!is_valid_sandbox_id(""));
        assert_eq!(new_access_token().len(), 40);
    }
}
