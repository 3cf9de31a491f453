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

    /// [`SecretMasker::mask`] for text cut at a size cap (`clipped`): a secret the cut split in two
    /// leaves a prefix at the very end, which is masked too.
    pub fn mask_clipped(&self, text: &str, clipped: bool) -> String {
        let mut out = self.mask(text).into_owned();
        if !clipped {
            return out;
        }
        for secret in &self.secrets {
            let cut = (1..secret.len()).rev().find(|&k| secret.is_char_boundary(k) && out.ends_with(&secret[..k]));
            if let Some(k) = cut {
                out.truncate(out.len() - k);
                out.push_str(MASK);
                break;
            }
        }
        out
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
    fn a_secret_split_by_the_cap_is_masked_too() {
        let (m, _) = SecretMasker::new(["hunter22-secret".to_string()]);
        assert_eq!(m.mask_clipped("output hunter22-se", true), format!("output {MASK}"));
        assert_eq!(m.mask_clipped("output hunter22-se", false), "output hunter22-se");
        assert_eq!(m.mask_clipped("x hunter22-secret y hunter", true), format!("x {MASK} y {MASK}"));
        assert_eq!(m.mask_clipped("plain", true), "plain");
    }

    #[test]
    fn masks_exact_values_longest_first() {
        let (m, short) = SecretMasker::new(["abc".to_string(), "hunter22".into(), "hunter22-extra".into()]);
        assert_eq!(short, 1);
        assert_eq!(m.mask("pw=hunter22-extra and hunter22 abc"), format!("pw={MASK} and {MASK} abc"));
        assert!(matches!(m.mask("nothing here"), Cow::Borrowed(_)));
    }
}
