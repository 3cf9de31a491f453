//! Masks secret values (configured secrets, the provider API key) in text the
//! gateway returns to agents or writes to logs.

use std::borrow::Cow;

/// Replacement for a masked value.
pub const MASK: &str = "********";
/// Values shorter than this are not masked (masking "a" would garble everything); they are reported at start.
pub const MIN_SECRET_LEN: usize = 6;

/// A set of exact secret values to hide.
#[derive(Debug, Clone, Default)]
pub struct SecretMasker {
    secrets: Vec<String>,
}

impl SecretMasker {
    /// Builds a masker; returns it with the number of values ignored for being too short.
    pub fn new(values: impl IntoIterator<Item = String>) -> (Self, usize) {
        let mut secrets = Vec::new();
        let mut too_short = 0;
        for value in values {
            if value.len() < MIN_SECRET_LEN {
                too_short += usize::from(!value.is_empty());
                continue;
            }
            if !secrets.contains(&value) {
                secrets.push(value);
            }
        }
        // Longest first, so a secret containing another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        (Self { secrets }, too_short)
    }

    /// The secret values, longest first (task pages mask the same set, byte-wise).
    pub fn values(&self) -> &[String] {
        &self.secrets
    }

    /// The text with every secret value replaced by [`MASK`].
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), MASK));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_exact_values_longest_first() {
        let (m, short) = SecretMasker::new(["abc".to_string(), "hunter22".into(), "hunter22-extra".into()]);
        assert_eq!(short, 1);
        assert_eq!(m.mask("pw=hunter22-extra and hunter22 abc"), format!("pw={MASK} and {MASK} abc"));
        assert!(matches!(m.mask("nothing here"), Cow::Borrowed(_)));
    }
}
