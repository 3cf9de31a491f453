//! The one secret masker of the crate: exact secret values (the provider API
//! key, `tasks.secrets`) replaced by [`MASK`] in everything the gateway
//! returns to agents or writes to logs — tool results and errors, task pages
//! (also when a page edge splits a secret), command lines shown by list_tasks.
//!
//! The rule is the supervisor's (`supervisor/supervisor.py`, `Masker`), byte
//! for byte: the same marker, the same minimum length, leftmost match with
//! the longest secret winning at a position. Both sides run the vectors of
//! `supervisor/testdata/mask_vectors.json` in their tests.

use std::borrow::Cow;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};

/// What a masked secret is replaced with (the supervisor's `MASK`).
pub const MASK: &str = "***";
/// Values shorter than this many bytes are not masked: masking "1" or "ab"
/// would mangle ordinary output while protecting nothing (the supervisor's
/// `MIN_SECRET_LEN`). Configured values that short are reported at start.
pub const MIN_SECRET_LEN: usize = 4;

/// Why a masker could not be built (a secret set too large for the matcher).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the secret masker ({0}); configure fewer or shorter tasks.secrets")]
pub struct MaskerError(#[from] aho_corasick::BuildError);

/// A set of exact secret values to hide. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Masker {
    inner: Option<Arc<Inner>>,
    too_short: usize,
}

struct Inner {
    /// Longest first, ties in byte order.
    secrets: Vec<String>,
    /// Leftmost-longest automaton over `secrets`.
    matcher: AhoCorasick,
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values themselves.
        write!(f, "Masker({} secrets)", self.values().len())
    }
}

impl Masker {
    /// A masker of `values`; empty values are ignored, values shorter than
    /// [`MIN_SECRET_LEN`] bytes are ignored and counted ([`Masker::too_short`]).
    pub fn new<I, S>(values: I) -> Result<Self, MaskerError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut secrets = Vec::new();
        let mut too_short = 0;
        for value in values {
            let value = value.as_ref();
            if value.len() < MIN_SECRET_LEN {
                too_short += usize::from(!value.is_empty());
            } else {
                secrets.push(value.to_owned());
            }
        }
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        if secrets.is_empty() {
            return Ok(Self { inner: None, too_short });
        }
        let matcher = AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&secrets)?;
        Ok(Self { inner: Some(Arc::new(Inner { secrets, matcher })), too_short })
    }

    /// How many non-empty values were ignored for being shorter than [`MIN_SECRET_LEN`].
    pub fn too_short(&self) -> usize {
        self.too_short
    }

    /// The secret values, longest first.
    pub fn values(&self) -> &[String] {
        self.inner.as_ref().map_or(&[], |inner| inner.secrets.as_slice())
    }

    /// Bytes of context needed on each side of a cut to see a secret it splits.
    pub fn context(&self) -> u64 {
        self.values().first().map_or(0, |s| s.len() as u64 - 1)
    }

    /// Non-overlapping matches (leftmost, longest at a position) in `data`.
    fn matches<'a>(&'a self, data: &'a [u8]) -> impl Iterator<Item = (usize, usize)> + 'a {
        self.inner.iter().flat_map(move |inner| inner.matcher.find_iter(data).map(|m| (m.start(), m.end())))
    }

    /// The text with every secret value replaced by [`MASK`] (borrowed when there is none).
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(inner) = &self.inner else { return Cow::Borrowed(text) };
        if !inner.matcher.is_match(text) {
            return Cow::Borrowed(text);
        }
        // A match of a UTF-8 value in UTF-8 text starts and ends on character boundaries.
        let mut out = String::with_capacity(text.len());
        inner.matcher.replace_all_with(text, &mut out, |_, _, out| {
            out.push_str(MASK);
            true
        });
        Cow::Owned(out)
    }

    /// [`Masker::mask`] for text cut at a size cap (`clipped`): a secret the cut split in two
    /// leaves a prefix at the very end, which is masked too.
    pub fn mask_clipped(&self, text: &str, clipped: bool) -> String {
        let mut out = self.mask(text).into_owned();
        if !clipped {
            return out;
        }
        for secret in self.values() {
            let cut = (1..secret.len()).rev().find(|&k| secret.is_char_boundary(k) && out.ends_with(&secret[..k]));
            if let Some(k) = cut {
                out.truncate(out.len() - k);
                out.push_str(MASK);
                break;
            }
        }
        out
    }

    /// Returns `window[start..end]` with every secret occurrence that overlaps it replaced by
    /// the mask: a secret cut by the range's edge leaves only a mask on each side that holds part
    /// of it (task pages, read with [`Masker::context`] bytes of context on each side).
    pub fn mask_range(&self, window: &[u8], start: usize, end: usize) -> Vec<u8> {
        let end = end.min(window.len());
        let start = start.min(end);
        let mut out = Vec::with_capacity(end - start);
        let mut pos = start;
        for (m_start, m_end) in self.matches(window) {
            if m_start >= end {
                break;
            }
            if m_end <= start {
                continue;
            }
            out.extend_from_slice(&window[pos..m_start.max(start)]);
            out.extend_from_slice(MASK.as_bytes());
            pos = m_end.min(end);
        }
        out.extend_from_slice(&window[pos..end]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One vector of `supervisor/testdata/mask_vectors.json` (also run by `test_supervisor.py`).
    #[derive(serde::Deserialize)]
    struct Vector {
        name: String,
        secrets: Vec<String>,
        input: String,
        output: String,
    }

    #[derive(serde::Deserialize)]
    struct Vectors {
        mask: String,
        min_secret_len: usize,
        vectors: Vec<Vector>,
    }

    fn vectors() -> Vectors {
        serde_json::from_str(include_str!("../supervisor/testdata/mask_vectors.json")).expect("valid vectors file")
    }

    #[test]
    fn shared_vectors_hold() {
        let file = vectors();
        assert_eq!(file.mask, MASK, "the vectors file states the shared marker");
        assert_eq!(file.min_secret_len, MIN_SECRET_LEN, "the vectors file states the shared minimum length");
        assert!(file.vectors.len() >= 10);
        for v in &file.vectors {
            let m = Masker::new(&v.secrets).unwrap();
            assert_eq!(m.mask(&v.input), v.output, "vector {:?}", v.name);
            // The byte-range form agrees on the whole text, and a split page masks what the whole does.
            let bytes = v.input.as_bytes();
            assert_eq!(m.mask_range(bytes, 0, bytes.len()), v.output.as_bytes(), "vector {:?} (range)", v.name);
        }
    }

    #[test]
    fn short_values_are_counted_and_ignored() {
        let m = Masker::new(["abc", "", "hunter22", "hunter22-extra", "hunter22"]).unwrap();
        assert_eq!(m.too_short(), 1);
        assert_eq!(m.values(), ["hunter22-extra", "hunter22"]);
        assert_eq!(m.mask("pw=hunter22-extra and hunter22 abc"), format!("pw={MASK} and {MASK} abc"));
        assert!(matches!(m.mask("nothing here"), Cow::Borrowed(_)));
        assert_eq!(format!("{m:?}"), "Masker(2 secrets)");
        assert!(matches!(Masker::default().mask("abc"), Cow::Borrowed("abc")));
    }

    #[test]
    fn a_secret_split_by_the_cap_is_masked_too() {
        let m = Masker::new(["hunter22-secret"]).unwrap();
        assert_eq!(m.mask_clipped("output hunter22-se", true), format!("output {MASK}"));
        assert_eq!(m.mask_clipped("output hunter22-se", false), "output hunter22-se");
        assert_eq!(m.mask_clipped("x hunter22-secret y hunter", true), format!("x {MASK} y {MASK}"));
        assert_eq!(m.mask_clipped("plain", true), "plain");
    }

    #[test]
    fn ranges_mask_secrets_cut_by_their_edges() {
        let m = Masker::new(["hunter2-secret"]).unwrap();
        let data = b"0123456789hunter2-secret tail";
        assert_eq!(m.mask_range(data, 0, 15), b"0123456789***");
        assert_eq!(m.mask_range(data, 15, 29), b"*** tail");
        assert_eq!(m.mask_range(data, 24, 29), b" tail");
        assert_eq!(m.mask_range(data, 5, 99), b"56789*** tail");
    }
}
